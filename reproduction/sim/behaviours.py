"""Behaviour modes: the expert plus systematic failures and harmful-but-recoverable detours, with noise.

Every episode draws a `Plan` from its own RNG (so it is the same whichever worker runs it); a
`Behaviour` executes the plan step by step around the closed-loop expert. Modes (`sim.mode`):

    expert       the expert, no noise (sft demonstrations)
    good         the expert with Gaussian noise on dx, dy, dz
    messy        detours (full speed away from the current target for 4-8 steps), regrasps (the gripper
                 opens 2-3 steps mid-carry; for Push: backs off 2-3 steps), hesitations (3-6 still
                 steps); the expert recovers, so most succeed: the harm that filtering keeps
    give_up      zero actions from a random step on
    short_carry  brings the cube only 30-60% of the way, then holds
    drop         releases the cube (Push: lifts off) after 30-70% of the carry, then stays
    wrong_place  brings the cube 10-16 cm off the goal
    pause        1-2 long pauses of 8-15 steps

Frames inside a detour, regrasp, hesitation or pause have `sim.harm` True; `sim.event` says which.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np

from reproduction.errors import ConfigError
from reproduction.sim.experts import Scene, expert_action


class Mode(IntEnum):
    """Behaviour mode of an episode (the `sim.mode` column)."""

    EXPERT = 0
    GOOD = 1
    MESSY = 2
    GIVE_UP = 3
    SHORT_CARRY = 4
    DROP = 5
    WRONG_PLACE = 6
    PAUSE = 7


class Event(IntEnum):
    """What a frame's action is doing (the `sim.event` column)."""

    NOMINAL = 0
    DETOUR = 1
    REGRASP = 2
    HESITATE = 3
    PAUSE = 4
    GAVE_UP = 5
    RELEASED = 6


HARMFUL = frozenset({Event.DETOUR, Event.REGRASP, Event.HESITATE, Event.PAUSE})
MODE_NAMES = {m.name.lower(): m for m in Mode}


def mode_of(name: str) -> Mode:
    """Mode by its lower-case name; ConfigError naming the known ones otherwise."""
    try:
        return MODE_NAMES[name]
    except KeyError:
        raise ConfigError(
            f"unknown behaviour mode {name!r}; known: {', '.join(MODE_NAMES)}", field="modes", actual=name
        ) from None


@dataclass(kw_only=True, slots=True, frozen=True)
class BehaviourConfig:
    """The knobs of the modes (DEMO_LAB.md's mix1 by default)."""

    good_noise: float = 0.1
    """Std of the Gaussian noise on dx, dy, dz in `good` episodes."""
    messy_noise: float = 0.05
    """Std of the noise in `messy` and failure episodes."""
    detours: tuple[int, int] = (0, 3)
    """Inclusive range of detours per messy episode."""
    detour_steps: tuple[int, int] = (4, 8)
    """Inclusive range of a detour's length in steps."""
    regrasps: tuple[int, int] = (0, 2)
    """Inclusive range of regrasps (Push: back-offs) per messy episode."""
    hesitations: tuple[int, int] = (0, 2)
    """Inclusive range of hesitations per messy episode."""
    hesitation_steps: tuple[int, int] = (3, 6)
    """Inclusive range of a hesitation's length."""
    event_window: tuple[int, int] = (2, 30)
    """Steps in which detours, hesitations and pauses start (late ones leave no time to recover)."""
    short_fraction: tuple[float, float] = (0.3, 0.6)
    """Fraction of the way a short carry goes."""
    drop_fraction: tuple[float, float] = (0.3, 0.7)
    """Fraction of the carry after which `drop` lets go."""
    wrong_offset: tuple[float, float] = (0.10, 0.16)
    """Distance from the goal of a wrong place (metres)."""
    pauses: tuple[int, int] = (1, 2)
    pause_steps: tuple[int, int] = (8, 15)
    give_up_window: tuple[int, int] = (2, 12)
    """Steps at which a give-up starts: before the expert's usual success (about step 14), since one
    that starts after it leaves the cube at the goal and the episode succeeds anyway."""

    def __post_init__(self) -> None:
        for name in ("detours", "detour_steps", "regrasps", "hesitations", "hesitation_steps", "pauses", "pause_steps"):
            lo, hi = getattr(self, name)
            if not 0 <= lo <= hi:
                raise ConfigError(f"{name} {(lo, hi)} is not a range 0 <= lo <= hi", field=name)
        if self.good_noise < 0 or self.messy_noise < 0:
            raise ConfigError("noise std must be >= 0", field="good_noise")


@dataclass(kw_only=True, slots=True)
class Plan:
    """One episode's drawn behaviour: when each event starts and what the failure mode does."""

    mode: Mode
    noise: float = 0.0
    timed: dict[int, tuple[Event, int]] = field(default_factory=dict)
    """Start step -> (event, length) for detours, hesitations and pauses."""
    regrasps: list[int] = field(default_factory=list)
    """Earliest steps of regrasps (they fire when the cube is being carried)."""
    regrasp_steps: list[int] = field(default_factory=list)
    give_up_at: int | None = None
    fraction: float = 1.0
    """short_carry / drop: the fraction of the way."""
    wrong_dir: np.ndarray | None = None
    wrong_offset: float = 0.0


def _rint(rng: np.random.Generator, lo_hi: tuple[int, int]) -> int:
    return int(rng.integers(lo_hi[0], lo_hi[1] + 1))


def draw_plan(mode: Mode, cfg: BehaviourConfig, rng: np.random.Generator) -> Plan:
    """The plan of one episode of `mode`, drawn from `rng` only."""
    plan = Plan(mode=mode, noise={Mode.EXPERT: 0.0, Mode.GOOD: cfg.good_noise}.get(mode, cfg.messy_noise))
    lo, hi = cfg.event_window

    def place(event: Event, count: int, lengths: tuple[int, int]) -> None:
        for _ in range(count):
            for _attempt in range(20):  # events do not overlap: retry a few start steps
                start, length = int(rng.integers(lo, hi + 1)), _rint(rng, lengths)
                busy = any(s <= start + length and start <= s + n for s, (_, n) in plan.timed.items())
                if not busy:
                    plan.timed[start] = (event, length)
                    break

    if mode == Mode.MESSY:
        place(Event.DETOUR, _rint(rng, cfg.detours), cfg.detour_steps)
        place(Event.HESITATE, _rint(rng, cfg.hesitations), cfg.hesitation_steps)
        n = _rint(rng, cfg.regrasps)
        plan.regrasps = sorted(int(rng.integers(lo, hi + 1)) for _ in range(n))
        plan.regrasp_steps = [int(rng.integers(2, 4)) for _ in range(n)]
    elif mode == Mode.PAUSE:
        place(Event.PAUSE, _rint(rng, cfg.pauses), cfg.pause_steps)
    elif mode == Mode.GIVE_UP:
        plan.give_up_at = _rint(rng, cfg.give_up_window)
    elif mode == Mode.SHORT_CARRY:
        plan.fraction = float(rng.uniform(*cfg.short_fraction))
    elif mode == Mode.DROP:
        plan.fraction = float(rng.uniform(*cfg.drop_fraction))
    elif mode == Mode.WRONG_PLACE:
        angle = float(rng.uniform(0, 2 * np.pi))
        plan.wrong_dir = np.array([np.cos(angle), np.sin(angle), 0.0])
        plan.wrong_offset = float(rng.uniform(*cfg.wrong_offset))
    return plan


REGRASP_WAIT = 12
"""A regrasp fires at the first carrying step within this many steps of its drawn step, else never
(one that fires in the last steps leaves no time to recover and would turn harm into failure)."""
TABLE_XY = ((1.05, 1.55), (0.45, 1.05))
"""Where a wrong place may be (the table top the goals are drawn from, with margin)."""


class Behaviour:
    """Executes a Plan around the expert; `act(scene, step)` -> (action, event). One per episode."""

    def __init__(self, plan: Plan, *, lifts: bool, rng: np.random.Generator) -> None:
        self.plan, self.lifts, self.rng = plan, lifts, rng
        self._active: tuple[Event, int] | None = None  # (event, steps left)
        self._detour_dir: np.ndarray | None = None
        self._start_cube: np.ndarray | None = None
        self._released = False
        self._regrasp_i = 0

    def _target(self, scene: Scene) -> np.ndarray:
        plan = self.plan
        if self._start_cube is None:
            self._start_cube = scene.cube.copy()
        if plan.mode == Mode.SHORT_CARRY:
            return self._start_cube + plan.fraction * (scene.goal - self._start_cube)
        if plan.mode == Mode.WRONG_PLACE and plan.wrong_dir is not None:
            t = scene.goal + plan.wrong_dir * plan.wrong_offset
            t[0] = np.clip(t[0], *TABLE_XY[0])
            t[1] = np.clip(t[1], *TABLE_XY[1])
            return t
        return scene.goal

    def _carried_fraction(self, scene: Scene) -> float:
        start = self._start_cube if self._start_cube is not None else scene.cube
        total = float(np.linalg.norm(scene.goal - start))
        return 1.0 if total < 1e-6 else 1.0 - float(np.linalg.norm(scene.goal - scene.cube)) / total

    def _start_event(self, event: Event, length: int, scene: Scene, expert: np.ndarray) -> None:
        self._active = (event, length)
        if event == Event.DETOUR:
            away = -expert[:3]
            norm = float(np.linalg.norm(away))
            away = away / norm if norm > 1e-6 else self.rng.normal(size=3)
            side = self.rng.normal(size=3) * 0.5
            d = away + side
            self._detour_dir = d / max(float(np.linalg.norm(d)), 1e-6)

    def _event_action(self, scene: Scene, expert: np.ndarray) -> tuple[np.ndarray, Event]:
        event, left = self._active  # type: ignore[misc]
        self._active = (event, left - 1) if left > 1 else None
        grip_cmd = expert[3]
        if event == Event.DETOUR:
            d = self._detour_dir.copy()  # type: ignore[union-attr]
            if scene.grip[2] < scene.table_z + 0.04:
                d[2] = max(d[2], 0.0)  # never drive into the table
            scale = 1.0 / max(float(np.abs(d).max()), 1e-6)  # full speed: the largest component at 1
            return np.append(d * scale, grip_cmd), event
        if event == Event.REGRASP:
            if self.lifts:
                return np.array([0.0, 0.0, 0.0, 1.0]), event
            back = -expert[:3] if np.linalg.norm(expert[:3]) > 1e-6 else np.zeros(3)
            back[2] = 0.3
            return np.append(np.clip(back, -1, 1), grip_cmd), event
        return np.array([0.0, 0.0, 0.0, grip_cmd]), event  # hesitate / pause: hold still, keep the grip

    def act(self, scene: Scene, step: int) -> tuple[np.ndarray, Event]:
        """The action at `step` and the event it belongs to (noise included, clipped to [-1, 1])."""
        plan = self.plan
        target = self._target(scene)
        expert, phase = expert_action(self.lifts, scene, target)
        if plan.give_up_at is not None and step >= plan.give_up_at:
            return np.zeros(4), Event.GAVE_UP
        if self._released:
            action, event = (
                np.array([0.0, 0.0, 0.3 if not self.lifts else 0.0, 1.0 if self.lifts else -1.0]),
                Event.RELEASED,
            )
            return self._noisy(action), event
        if self._active is None and step in plan.timed:
            self._start_event(*plan.timed[step], scene, expert)
        carrying = phase in ("carry", "push")
        while self._regrasp_i < len(plan.regrasps) and step > plan.regrasps[self._regrasp_i] + REGRASP_WAIT:
            self._regrasp_i += 1  # expired: the cube was not being carried in time
        if (
            self._active is None
            and carrying
            and self._regrasp_i < len(plan.regrasps)
            and plan.regrasps[self._regrasp_i] <= step <= plan.regrasps[self._regrasp_i] + REGRASP_WAIT
        ):
            self._active = (Event.REGRASP, plan.regrasp_steps[self._regrasp_i])
            self._regrasp_i += 1
        if self._active is not None:
            action, event = self._event_action(scene, expert)
            return self._noisy(action), event
        if plan.mode == Mode.DROP and carrying and self._carried_fraction(scene) >= plan.fraction:
            self._released = True
            return self.act(scene, step)
        return self._noisy(expert), Event.NOMINAL

    def _noisy(self, action: np.ndarray) -> np.ndarray:
        if self.plan.noise > 0:
            action = action.copy()
            action[:3] += self.rng.normal(0.0, self.plan.noise, size=3)
        return np.clip(action, -1.0, 1.0)
