"""Run one scripted episode and return its frames as the dataset stores them (all steps kept)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from reproduction.sim.behaviours import HARMFUL, Behaviour, BehaviourConfig, Event, Mode, draw_plan
from reproduction.sim.env import EPISODE_STEPS, FetchSim
from reproduction.sim.experts import Scene


def scene_of(sim: FetchSim) -> Scene:
    """The expert's view of the simulator's true state."""
    return Scene(
        grip=sim.grip_pos, cube=sim.object_pos, fingers=float(sim.fingers.sum()), goal=sim.goal, table_z=sim.table_z
    )


@dataclass(kw_only=True, slots=True)
class EpisodeOutcome:
    """Per-episode facts the generator reports (the frames hold the same, per step)."""

    success: bool
    """The cube at the goal after the last step (the episode's `is_success`)."""
    first_success: int | None
    """First step (1-based: after that many actions) at which the cube was at the goal."""
    harm_frames: int
    events: dict[str, int]
    """Event name -> number of distinct occurrences (runs of frames)."""


def run_scripted(
    sim: FetchSim,
    *,
    reset_seed: int,
    mode: Mode,
    config: BehaviourConfig,
    rng: np.random.Generator,
    steps: int = EPISODE_STEPS,
) -> tuple[dict[str, np.ndarray], EpisodeOutcome]:
    """One episode of behaviour `mode` from `reset_seed`; frames are (observation before, action, success after)."""
    obs = sim.reset(reset_seed)
    behaviour = Behaviour(draw_plan(mode, config, rng), lifts=sim.task.lifts, rng=rng)
    keys = list(obs)
    frames: dict[str, list] = {k: [] for k in keys}
    actions, success, events = [], [], []
    for t in range(steps):
        for k in keys:
            frames[k].append(obs[k])
        action, event = behaviour.act(scene_of(sim), t)
        obs, ok = sim.step(action)
        actions.append(action.astype(np.float32))
        success.append(ok)
        events.append(int(event))
    ev = np.asarray(events, dtype=np.int64)
    harm = np.isin(ev, [int(e) for e in HARMFUL])
    out = {k: np.stack(v) for k, v in frames.items()}
    out.update(
        {
            "action": np.stack(actions),
            "is_success": np.asarray(success, dtype=bool),
            "sim.mode": np.full(steps, int(mode), dtype=np.int64),
            "sim.event": ev,
            "sim.harm": harm,
            "sim.reset_seed": np.full(steps, reset_seed, dtype=np.int64),
        }
    )
    starts = ev[np.r_[True, ev[1:] != ev[:-1]]]

    counts = {Event(e).name.lower(): int((starts == e).sum()) for e in np.unique(starts) if e != Event.NOMINAL}
    first = int(np.argmax(success)) + 1 if any(success) else None
    return out, EpisodeOutcome(
        success=bool(success[-1]), first_success=first, harm_frames=int(harm.sum()), events=counts
    )
