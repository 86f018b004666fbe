"""LIBERO's evaluation protocol: each task's first N fixed init states in order, upstream's step limit, chunks.

    evaluate_libero(task_ids, episodes_per_task, policy, chunk=5) -> LiberoEvalResult

As RLinf evaluates (`evaluations/libero/libero_10_openpi_pi05_eval.yaml`: `ignore_terminations: True`,
`max_episode_steps: 520`, `num_action_chunks: 5`; `rlinf/envs/libero/libero_env.py` `_record_metrics`): an
episode runs its suite's full step limit after the settle steps; success_once = LIBERO's check_success() held
after any step, success_at_end = it holds after the last step. `stop_on_success=True` instead ends an episode at
its first success (openpi's example script; cheaper on CPU) and then success_at_end is recorded as None
(data generation only: `evidence_counts` refuses such a result).

Policy protocol (batched like the Fetch simulator's, B = 1): `policy(batch) -> (1, H, 7)` (or (H, 7) or (7,)),
batch = the observation with a leading batch axis and `task` a one-element list. The first min(chunk, H) actions
of each chunk are executed. Optional hooks: `policy.reset(seed=...)` (or `reset()`) before each episode, and
`policy.bind(sim)` once per env for privileged scripted experts. One env per task per worker is built once and
reused for its init states (`workers` > 1: spawn processes, init states dealt round-robin). A progress bar shows
episodes done, steps/s and an ETA (per episode in one process; per worker share with `workers` > 1).

`check_policy_features` refuses, before any env is built, a policy whose features LIBERO does not provide (a
Fetch-trained policy's state and 4-dim action); `LazyPolicy` builds a policy from a picklable factory in the
process that runs it (spawn workers), forwarding `reset` and `bind`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from reproduction.errors import SimError
from reproduction.sim.cameras import LIBERO_IMAGE_KEYS
from reproduction.sim.evaluate import reset_policy
from reproduction.sim.libero.env import ACTION_DIM, SETTLE_STEPS, LiberoSim
from reproduction.sim.libero.tasks import LiberoTask, resolve_tasks
from reproduction.sim.workers import run_units
from reproduction.ui import UiOptions, progress

Policy = Callable[[dict], np.ndarray]

STATE_DIM = 8
"""observation.state: eef pos (3), eef axis-angle (3), gripper finger qpos (2) (env.py, RLinf's layout)."""
STATE_KEY, OBJECT_STATE_KEY = "observation.state", "observation.object_state"
"""The state features LIBERO's observation holds (the object state only in no-camera mode: env.py)."""
IMAGE_KEYS = LIBERO_IMAGE_KEYS
"""The camera features a rendering env provides (cameras=True)."""


def check_policy_features(
    *,
    state_dim: int,
    action_dim: int,
    image_keys: tuple[str, ...] | list[str] = (),
    cameras: bool = True,
    name: str = "the policy",
    state_keys: tuple[str, ...] | list[str] = (),
) -> None:
    """SimError (exit 45) naming every feature a policy expects that LIBERO does not provide: its state width
    (LIBERO's observation.state is 8 values; a Fetch policy reads state + goal), its action width (7; Fetch's 4)
    and its camera keys (upstream's two, and only when the env renders). A policy whose export names
    `state_keys` reads those features instead: each must be one LIBERO gives (observation.object_state only
    without cameras), and the width is then checked at the first step. Called before any env is built."""
    wrong = []
    if state_keys:
        offered = (STATE_KEY,) + (() if cameras else (OBJECT_STATE_KEY,))
        lacking = [k for k in state_keys if k not in offered]
        if lacking:
            have = ", ".join(offered) + ("" if not cameras else "; object state only with eval.libero.cameras false")
            wrong.append(f"state features {', '.join(lacking)} (LIBERO gives {have})")
    elif state_dim != STATE_DIM:
        wrong.append(f"state {state_dim} values (LIBERO gives {STATE_DIM})")
    if action_dim != ACTION_DIM:
        wrong.append(f"action {action_dim} dims (LIBERO takes {ACTION_DIM})")
    missing = [k for k in image_keys if not cameras or k not in IMAGE_KEYS]
    if missing:
        have = ", ".join(IMAGE_KEYS) if cameras else "none: eval.libero.cameras is false"
        wrong.append(f"cameras {', '.join(missing)} (LIBERO gives {have})")
    if wrong:
        raise SimError(
            f"feature mismatch: {name} expects " + "; ".join(wrong),
            field="features",
            hint="evaluate on LIBERO a policy trained on LIBERO data (upstream's layout); a Fetch policy fits "
            "Fetch tasks only",
        )


def check_export_features(meta: dict[str, Any], *, cameras: bool, name: str) -> None:
    """check_policy_features of a policy export, from its policy.json (`meta`, export.read_export's): its state and
    action widths from the normalisation stats, its camera keys, its state_keys."""
    check_policy_features(
        state_dim=len(meta["stats"]["state_mean"]),
        action_dim=len(meta["stats"]["action_mean"]),
        image_keys=list(dict(meta.get("cameras") or {}).values()),
        cameras=cameras,
        name=name,
        state_keys=meta.get("state_keys") or (),
    )


class LazyPolicy:
    """A policy built from a picklable zero-argument `factory` on its first use, in the process that uses it, so
    spawn workers each build their own copy (a loaded model is not shipped between processes). Forwards
    `reset(seed=...)` when the built policy has one."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self.factory = factory
        self._policy: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"factory": self.factory, "_policy": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.factory, self._policy = state["factory"], None

    @property
    def policy(self) -> Any:
        if self._policy is None:
            self._policy = self.factory()
        return self._policy

    def reset(self, seed: int = 0) -> None:
        reset_policy(self.policy, seed)

    def bind(self, sim: LiberoSim) -> None:
        """Forwarded to a privileged scripted expert (the only policies that bind)."""
        if hasattr(self.policy, "bind"):
            self.policy.bind(sim)

    def __call__(self, batch: dict[str, Any]) -> Any:
        return self.policy(batch)


@dataclass(frozen=True, slots=True)
class EpisodeOutcome:
    task_id: str
    init_index: int
    success_once: bool
    success_at_end: bool | None
    """None when the episode stopped at its first success (stop_on_success)."""
    steps: int
    """Policy steps executed (settle steps not counted)."""
    first_success_step: int | None
    """1-based step after which check_success() first held."""
    actions: list[list[float]] = field(default_factory=list, repr=False)
    """The executed actions, kept only with record_actions=True (for replay/parity)."""


@dataclass(slots=True)
class LiberoEvalResult:
    episodes: list[EpisodeOutcome]
    chunk: int
    settle_steps: int
    cameras: bool
    seconds: float = 0.0
    steps: int = 0

    def per_task(self) -> dict[str, dict[str, int]]:
        """{task_id: {episodes, success_once, success_at_end}} (counts; success_at_end counts True only)."""
        out: dict[str, dict[str, int]] = {}
        for e in self.episodes:
            row = out.setdefault(e.task_id, {"episodes": 0, "success_once": 0, "success_at_end": 0})
            row["episodes"] += 1
            row["success_once"] += int(e.success_once)
            row["success_at_end"] += int(bool(e.success_at_end))
        return out

    def per_init_state(self) -> dict[str, list[dict[str, Any]]]:
        """{task_id: [{init_index, success_once, success_at_end, steps}, ...]} in init-state order."""
        out: dict[str, list[dict[str, Any]]] = {}
        for e in self.episodes:
            out.setdefault(e.task_id, []).append(
                {k: getattr(e, k) for k in ("init_index", "success_once", "success_at_end", "steps")}
            )
        return out

    def evidence_counts(self) -> dict[str, Any]:
        """The counts evaluation evidence takes (reproduction/run/evidence.py): per-task counts, and per task each
        init state's outcome (`init_state` pairs episodes in a comparison, as `reset_seed` does for Fetch).

        SimError when an episode stopped at its first success (`stop_on_success=True`): its success_at_end (at the
        suite's step limit) was never measured, and counting it False would report every success as a failure
        at the end (audit46 eval F5). Episodes run to the limit (the protocol's default) are counted as they are.
        """
        unmeasured = [e for e in self.episodes if e.success_at_end is None]
        if unmeasured:
            e = unmeasured[0]
            raise SimError(
                f"success_at_end was not measured for {len(unmeasured)} of {len(self.episodes)} episodes (first: "
                f"{e.task_id} init state {e.init_index}): they stopped at their first success (stop_on_success)",
                field="success_at_end",
                hint="evaluation evidence needs every episode run to its step limit: evaluate with "
                "stop_on_success=False (the protocol's default)",
            )
        per_episode: dict[str, list[dict[str, Any]]] = {}
        for e in self.episodes:
            per_episode.setdefault(e.task_id, []).append(
                {
                    "episode": e.init_index,
                    "init_state": e.init_index,
                    "success_once": bool(e.success_once),
                    "success_at_end": bool(e.success_at_end),
                }
            )
        return {"tasks": self.per_task(), "per_episode": per_episode}

    def to_dict(self) -> dict[str, Any]:
        return {
            "protocol": "libero",
            "chunk": self.chunk,
            "settle_steps": self.settle_steps,
            "cameras": self.cameras,
            "per_task": self.per_task(),
            "per_init_state": self.per_init_state(),
            "steps": self.steps,
            "seconds": round(self.seconds, 3),
        }


def _batch(obs: dict[str, Any]) -> dict[str, Any]:
    return {k: ([v] if k == "task" else np.asarray(v)[None]) for k, v in obs.items()}


def _chunk_of(out: Any) -> np.ndarray:
    a = np.asarray(out, dtype=np.float64)
    if a.ndim == 3:
        if a.shape[0] != 1:
            raise SimError(f"policy returned a batch of {a.shape[0]} chunks for 1 observation", actual=a.shape)
        a = a[0]
    elif a.ndim == 1:
        a = a[None]
    if a.ndim != 2 or a.shape[-1] != ACTION_DIM or a.shape[0] == 0:
        raise SimError(
            f"policy returned actions of shape {np.shape(out)}, expected (1, H, {ACTION_DIM})",
            hint="a LIBERO policy acts in 7 dims (a Fetch policy's 4 do not fit)",
            actual=np.shape(out),
        )
    return a


def run_episode(
    sim: LiberoSim,
    policy: Policy,
    init_index: int,
    *,
    chunk: int,
    max_steps: int,
    stop_on_success: bool = False,
    record_actions: bool = False,
    seed: int = 0,
) -> EpisodeOutcome:
    """One episode from init state `init_index` on an already built env."""
    reset_policy(policy, seed)
    obs = sim.reset(init_index, seed=seed)  # robosuite's reset noise: without it the actions depend on the history
    steps, first, success, actions = 0, None, False, []
    while steps < max_steps:
        for action in _chunk_of(policy(_batch(obs)))[:chunk]:
            obs, success = sim.step(action)
            steps += 1
            if record_actions:
                actions.append([float(x) for x in action])
            if success and first is None:
                first = steps
            if steps >= max_steps or (success and stop_on_success):
                break
        if success and stop_on_success:
            break
    return EpisodeOutcome(
        task_id=sim.task.task_id,
        init_index=int(init_index),
        success_once=first is not None,
        success_at_end=None if stop_on_success and success else bool(success),
        steps=steps,
        first_success_step=first,
        actions=actions,
    )


def _run_unit(unit: dict[str, Any], on_episode: Callable[[EpisodeOutcome], None] | None = None) -> list[EpisodeOutcome]:
    """One worker's share: for each task, one env built once and reset to each of its init states in turn;
    `on_episode` (in-process only: it does not pickle) hears of each episode as it ends."""
    policy, make_sim, out = unit["policy"], unit["make_sim"], []
    for task, indices in unit["work"]:
        if not indices:
            continue
        sim = make_sim(task, **unit["sim_kwargs"])
        try:
            if hasattr(policy, "bind"):
                policy.bind(sim)
            for i in indices:
                out.append(
                    run_episode(
                        sim,
                        policy,
                        i,
                        max_steps=unit["max_steps"] or task.max_steps,
                        **unit["ep"],
                        seed=unit["seed"] + i,
                    )
                )
                if on_episode is not None:
                    on_episode(out[-1])
        finally:
            sim.close()
    return out


def evaluate_libero(
    task_ids: list[str] | str,
    episodes_per_task: int,
    policy: Policy,
    *,
    chunk: int = 5,
    cameras: bool = True,
    image_size: int = 256,
    settle_steps: int = SETTLE_STEPS,
    max_steps: int | None = None,
    stop_on_success: bool = False,
    record_actions: bool = False,
    cache_dir: Path | None = None,
    workers: int = 1,
    make_sim: Callable[..., LiberoSim] = LiberoSim,
    seed: int = 0,
    ui: UiOptions | None = None,
    killed_hint: str | None = None,
) -> LiberoEvalResult:
    """Run the protocol; every argument is checked before any env is built.

    `workers` > 1 deals each task's init states round-robin (init i to worker i % workers, as RLinf deals them to
    its envs) to spawn processes; each builds one env per task and reuses it; `policy` and `make_sim` must then
    pickle (a bound expert or a lambda does not). Episodes come back in (task, init state) order whatever the
    worker count, and an episode's numbers do not depend on it (its seed is `seed + init index`).
    `max_steps` overrides the suite's limit (tests and reduced runs only). `make_sim` is the seam a test swaps.
    `ui` styles the progress bar (episodes, steps/s, ETA; none when quiet or not a terminal). `killed_hint`: the
    hint under a killed worker (run_units: the caller's command and its key for the worker count).
    Raises SimError for a bad task id, episodes_per_task outside 1..the task's init-state count, a bad chunk or
    worker count, an unpicklable policy with workers > 1, or a policy output of the wrong shape.
    """
    if chunk < 1:
        raise SimError(f"chunk must be >= 1, got {chunk}", hint="RLinf's openpi evals execute 5 actions per chunk")
    if workers < 1:
        raise SimError(f"workers must be >= 1, got {workers}", hint="each worker holds one env (1.5-2.6 GB)")
    tasks: list[LiberoTask] = resolve_tasks(task_ids, cache_dir=cache_dir)
    for t in tasks:
        if not 1 <= episodes_per_task <= t.n_init_states:
            raise SimError(
                f"episodes_per_task {episodes_per_task} out of range for {t.task_id}: "
                f"it has {t.n_init_states} init states (the protocol runs the first N, in order)",
                hint=f"use 1..{t.n_init_states}",
            )
    workers = min(workers, episodes_per_task)
    if workers > 1:
        import pickle

        try:
            pickle.dumps((policy, make_sim))
        except Exception as exc:  # pickle raises several types (PicklingError, AttributeError, TypeError)
            raise SimError(
                f"workers={workers} needs a picklable policy and make_sim ({exc})",
                hint="pass a module-level class instance (not a lambda or a bound expert), or use workers=1",
            ) from None
    units = [
        {
            "policy": policy,
            "make_sim": make_sim,
            "work": [(t, list(range(w, episodes_per_task, workers))) for t in tasks],
            "sim_kwargs": dict(cameras=cameras, image_size=image_size, settle_steps=settle_steps, cache_dir=cache_dir),
            "ep": dict(chunk=chunk, stop_on_success=stop_on_success, record_actions=record_actions),
            "max_steps": max_steps,
            "seed": seed,
        }
        for w in range(workers)
    ]
    t0 = time.perf_counter()
    total = len(tasks) * episodes_per_task
    episodes: list[EpisodeOutcome] = []
    with progress(ui) as bar:
        task_bar = bar.task("evaluate LIBERO", total=total)
        task_bar.show(rate="? steps/s", eta="-:--:--")

        def advance(done: list[EpisodeOutcome]) -> None:
            episodes.extend(done)
            task_bar.advance(len(done))
            elapsed = time.perf_counter() - t0
            steps = sum(e.steps for e in episodes)
            left = elapsed / len(episodes) * (total - len(episodes)) if episodes else 0.0
            task_bar.show(
                rate=f"{steps / max(elapsed, 1e-9):.1f} steps/s",
                eta=time.strftime("%H:%M:%S", time.gmtime(left)),
            )

        if workers == 1:  # in this process: the bar moves per episode (env creation shows as a slow first one)
            _run_unit(units[0], on_episode=lambda e: advance([e]))
        else:  # spawn workers report a whole share at once
            for eps in run_units(_run_unit, units, workers=workers, killed_hint=killed_hint):
                advance(eps)
    order = {t.task_id: k for k, t in enumerate(tasks)}
    episodes.sort(key=lambda e: (order[e.task_id], e.init_index))
    return LiberoEvalResult(
        episodes=episodes,
        chunk=chunk,
        settle_steps=settle_steps,
        cameras=cameras,
        seconds=time.perf_counter() - t0,
        steps=sum(e.steps for e in episodes),
    )


def episode_dicts(result: LiberoEvalResult) -> list[dict[str, Any]]:
    """Every episode as a plain dict (actions included when recorded)."""
    return [asdict(e) for e in result.episodes]
