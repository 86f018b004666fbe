"""Evaluate a policy in the simulator: N held-out episodes per task, batched, in parallel, deterministic.

Episodes are cut into fixed batches of `batch_size` consecutive episodes of one task; a batch's B
envs step in lockstep and the policy gets (B, ...) observations, returns (B, H, 4) chunks, and the
first `execute_steps` actions of each chunk run open-loop before it is asked again. Batches, not
workers, are the unit of randomness: each batch starts with `policy.reset(seed=batch_seed)` when the
policy accepts it, so the result is the same for 1 or N workers. Reset seeds are the odd "eval" seeds
(disjoint from every generated episode's). Workers build their own policy from the picklable zero-arg
`policy_factory`; batches run in this process, in a spawn pool, or through an injected `runner`
(e.g. `functools.partial(reproduction.train.launcher.run_tasks, spec=..., ray_address=...)`).

    result = evaluate(ExpertPolicy, EvalConfig(tasks=("FetchPush-v4",), episodes_per_task=50), out_dir)
    result.to_dict()["tasks"]["FetchPush-v4"]["success_at_end"]   # "50/50"
"""

from __future__ import annotations

import inspect
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from reproduction.errors import ConfigError, SimError
from reproduction.fsio import annotate
from reproduction.sim.cameras import CAMERA_NAMES
from reproduction.sim.tasks import get_task
from reproduction.sim.workers import Runner, run_units
from reproduction.ui import UiOptions, progress


@dataclass(kw_only=True, slots=True)
class EvalConfig:
    """How a policy is evaluated."""

    tasks: tuple[str, ...] = ("FetchPickAndPlace-v4",)
    episodes_per_task: int = 50
    seed: int = 0
    """Evaluation seed: episode i of a task always starts from the same held-out state for one seed."""
    execute_steps: int = 2
    """Actions of each chunk executed open-loop before the policy is asked again."""
    videos: int = 2
    """MP4s of the first `videos` episodes of each task (0: none)."""
    workers: int = 1
    batch_size: int = 25
    """Episodes stepped together (the policy's B); fixed so results do not depend on `workers`."""
    cameras: tuple[str, ...] = ()
    """Cameras rendered into the policy's observations (match the training data); () for state only."""
    image_size: int = 64
    video_size: int = 128
    episode_steps: int = 50

    def __post_init__(self) -> None:
        if not self.tasks:
            raise ConfigError("tasks is empty", field="tasks")
        for task in self.tasks:
            get_task(task)
        for name in ("episodes_per_task", "execute_steps", "workers", "batch_size", "episode_steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} {getattr(self, name)} must be >= 1", field=name)
        if self.videos < 0:
            raise ConfigError(f"videos {self.videos} must be >= 0", field="videos")
        unknown = [c for c in self.cameras if c not in CAMERA_NAMES]
        if unknown:
            raise ConfigError(f"unknown camera(s) {unknown}; known: {', '.join(CAMERA_NAMES)}", field="cameras")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tasks"], d["cameras"] = list(self.tasks), list(self.cameras)
        return d


@dataclass(kw_only=True, slots=True)
class TaskResult:
    """One task's outcome over its episodes."""

    task: str
    episodes: int
    success_once: int
    success_at_end: int
    episode_metrics: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        m = self.episode_metrics
        firsts = [e["first_success_step"] for e in m if e["first_success_step"] is not None]
        mean = lambda key: round(float(np.mean([e[key] for e in m])), 4) if m else 0.0  # noqa: E731
        return {
            "episodes": self.episodes,
            "success_once": f"{self.success_once}/{self.episodes}",
            "success_at_end": f"{self.success_at_end}/{self.episodes}",
            "success_once_rate": round(self.success_once / self.episodes, 4),
            "success_at_end_rate": round(self.success_at_end / self.episodes, 4),
            "mean_first_success_step": round(float(np.mean(firsts)), 3) if firsts else None,
            "detours_per_episode": mean("detours"),
            "stalls_per_episode": mean("stalls"),
            "drops_per_episode": mean("drops"),
        }


@dataclass(kw_only=True, slots=True)
class EvalResult:
    """Per-task counts and mechanism metrics, the reset seeds used, and the videos written."""

    config: EvalConfig
    tasks: dict[str, TaskResult]
    reset_seeds: dict[str, list[int]]
    videos: list[Path]
    seconds: float

    @property
    def episodes(self) -> int:
        return sum(t.episodes for t in self.tasks.values())

    @property
    def success_at_end_rate(self) -> float:
        return sum(t.success_at_end for t in self.tasks.values()) / max(self.episodes, 1)

    @property
    def success_once_rate(self) -> float:
        return sum(t.success_once for t in self.tasks.values()) / max(self.episodes, 1)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict for the evaluation evidence."""
        return {
            "config": self.config.to_dict(),
            "episodes": self.episodes,
            "success_once_rate": round(self.success_once_rate, 4),
            "success_at_end_rate": round(self.success_at_end_rate, 4),
            "tasks": {name: t.summary() for name, t in self.tasks.items()},
            "per_episode": {name: t.episode_metrics for name, t in self.tasks.items()},
            "reset_seeds": self.reset_seeds,
            "videos": [str(p) for p in self.videos],
            "seconds": round(self.seconds, 3),
            "episodes_per_s": round(self.episodes / max(self.seconds, 1e-9), 3),
        }


def export_shape(meta: dict[str, Any]) -> Any:
    """The PolicyShape (sim/spaces.py) of a policy export from its policy.json (`meta`): state and action widths from
    its normalisation stats (None where it records none: a hand-made export says nothing of them), its state_keys
    and state_dims."""
    from reproduction.sim.spaces import PolicyShape

    stats = meta.get("stats") or {}
    dims = meta.get("state_dims")
    return PolicyShape(
        state_width=len(stats["state_mean"]) if stats.get("state_mean") else None,
        action_dim=len(stats["action_mean"]) if stats.get("action_mean") else None,
        state_keys=tuple(meta.get("state_keys") or ()),
        state_dims=tuple(dims) if dims is not None else None,
    )


def check_export_for_fetch(meta: dict[str, Any], *, name: str, tasks: Sequence[str]) -> None:
    """Return when a policy export (its policy.json, `meta`) can run on the Fetch `tasks`; else a one-line
    ConfigError (exit 4, field eval.tasks) before any env is built. An export that fits LIBERO (its widths,
    LIBERO's camera keys or its object state) is named as trained for LIBERO, with the tasks it was trained on:
    without this the camera check spoke first, naming camera keys where the mistake is the task list (audit51 H7).
    Any other misfit (a state or action width neither world has, e.g. real-robot data) is stated as it is, with
    what Fetch and LIBERO take, not as LIBERO's (audit62 M1); its state width was first found inside the policy
    call, a bare ValueError, exit 1 (audit62 H1). A fitting export passes (its cameras are then camera_names'
    to check)."""
    from reproduction.sim.cameras import LIBERO_IMAGE_KEYS
    from reproduction.sim.libero.protocol import OBJECT_STATE_KEY
    from reproduction.sim.spaces import fetch_world, libero_world, misfits

    shape = export_shape(meta)
    wrong = misfits(fetch_world(), shape)
    cams = [k for k in dict(meta.get("cameras") or {}).values() if k in LIBERO_IMAGE_KEYS]
    libero_signs = ([f"LIBERO's cameras {', '.join(cams)}"] if cams else []) + (
        [f"LIBERO's {OBJECT_STATE_KEY}"] if OBJECT_STATE_KEY in shape.state_keys else []
    )
    if not wrong and not libero_signs:
        return
    fits_libero = not misfits(libero_world(cameras=not shape.state_keys or bool(cams)), shape)
    if fits_libero and (libero_signs or shape.action_dim is not None):
        fetch_action = fetch_world().action_dim
        odd_action = shape.action_dim not in (None, fetch_action)
        signs = [f"{shape.action_dim}-dim action (Fetch takes {fetch_action})"] if odd_action else []
        trained = meta.get("tasks") or []
        on = f" on {', '.join(map(repr, trained[:3]))}{' ...' if len(trained) > 3 else ''}" if trained else ""
        raise ConfigError(
            f"{name} was trained for LIBERO{on} ({'; '.join(signs + libero_signs)}), but eval.tasks names Fetch "
            f"tasks ({', '.join(tasks)})",
            field="eval.tasks",
            hint="evaluate it on the LIBERO task it was trained on (e.g. eval.tasks=[libero_10/0]; docs/libero.md), "
            "or give a Fetch-trained export for Fetch tasks",
        )
    libero = libero_world()
    also = f" (LIBERO takes a {libero.action_dim}-dim action and observes {libero.describe()})"
    raise ConfigError(
        f"{name} cannot run on the Fetch tasks of eval.tasks ({', '.join(tasks)}): it was trained on "
        f"{'; '.join(wrong + libero_signs)}{also}",
        field="eval.tasks",
        hint="evaluate it in a world whose state and action match its training data; a policy trained on data "
        "neither simulator gives trains without eval and compare (portable run --stages "
        "returns,value,advantages,policy)",
    )


def _batches(config: EvalConfig, policy_factory: Callable[[], Any]) -> list[dict[str, Any]]:
    from reproduction.sim.seeds import reset_seed

    out = []
    for task in config.tasks:
        env_id = get_task(task).env_id
        for start in range(0, config.episodes_per_task, config.batch_size):
            idx = list(range(start, min(start + config.batch_size, config.episodes_per_task)))
            out.append(
                {
                    "task": env_id,
                    "indices": idx,
                    "reset_seeds": [reset_seed(config.seed, "eval", env_id, i) for i in idx],
                    "batch_seed": reset_seed(config.seed, "eval", env_id, 1_000_000 + start),
                    "config": config,
                    "factory": policy_factory,
                }
            )
    return out


def reset_policy(policy: Any, seed: int) -> None:
    """`policy.reset(seed=seed)`, or `reset()` when it takes no seed (an export's GuidedPolicy), or nothing."""
    reset = getattr(policy, "reset", None)
    if reset is None:
        return
    try:
        params = inspect.signature(reset).parameters
    except (TypeError, ValueError):
        params = {}
    if "seed" in params or any(p.kind == p.VAR_KEYWORD for p in params.values()):
        reset(seed=seed)
    else:
        reset()


def _check_actions(actions: Any, batch: int, payload: dict[str, Any] | None = None, step: int = 0) -> np.ndarray:
    """The policy's (B, H, 4) chunk as float32; SimError for a wrong shape or a non-finite value, naming the
    task, episode, reset seed and step (actions already executed in the episode) where it happened, from the
    batch's `payload`."""
    a = np.asarray(actions, dtype=np.float32)
    if a.ndim != 3 or a.shape[0] != batch or a.shape[2] != 4 or a.shape[1] < 1:
        raise SimError(
            f"policy returned actions of shape {tuple(a.shape)}, expected ({batch}, H, 4) with H >= 1",
            field="action",
            expected=[batch, "H", 4],
            actual=list(a.shape),
            hint="a Policy maps a batch of B observations to (B, H, 4) action chunks",
        )
    if not np.all(np.isfinite(a)):
        rows = [int(i) for i in np.flatnonzero(~np.isfinite(a).all(axis=(1, 2)))]
        where, fields = "", {}
        if payload is not None:
            episodes = [payload["indices"][i] for i in rows]
            seeds = [payload["reset_seeds"][i] for i in rows]
            more = f" (and {len(rows) - 1} more in its batch)" if len(rows) > 1 else ""
            where = f" in {payload['task']} episode {episodes[0]} (reset seed {seeds[0]}){more}"
            where += f" at step {step} ({step} actions executed)"
            fields = {"task": payload["task"], "episodes": episodes, "reset_seeds": seeds, "step": step}
        raise SimError(
            f"policy returned non-finite actions (NaN or inf){where}",
            field="action",
            hint="check the policy's output for NaN/inf: for a trained export, its weights and its normalisation "
            "stats (a zero or NaN std, a diverged training run's checkpoint); for a scripted policy, a division by "
            "zero. `FetchSim(task).reset(reset_seed)` replays the episode's start",
            **fields,
        )
    return a


def _encode_mp4(frames: np.ndarray, fps: int) -> bytes:
    from reproduction.data.video import VideoEncoder

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "episode.mp4"
        enc = VideoEncoder(path, fps=fps, width=frames.shape[2], height=frames.shape[1])
        enc.write(frames)
        enc.close()
        return path.read_bytes()


class EnvPool:
    """FetchSims kept across batches in one worker (creating one costs about as much as 10 steps); each
    task's envs share one renderer per image size. Every episode starts with `reset(seed)`, so reuse
    never changes a trajectory (`test_env_reuse_does_not_change_episodes` pins it). Sims are kept per
    (task, cameras, image size), everything that shapes what they return, so batches of evaluations
    with different configs (`evaluate_many`) each get envs built from their own config."""

    def __init__(self, config: EvalConfig) -> None:
        self.config = config
        self._sims: dict[tuple[str, tuple[str, ...], int], list[Any]] = {}
        self._renderers: dict[str, dict[int, Any]] = {}

    def get(self, task: str, n: int, config: EvalConfig | None = None) -> list[Any]:
        """`n` sims of `task` rendering `config`'s cameras at its image size (the pool's config by default)."""
        from reproduction.sim.env import FetchSim

        config = config or self.config
        cameras, size = tuple(config.cameras), int(config.image_size)
        sims = self._sims.setdefault((task, cameras, size), [])
        renderers = self._renderers.setdefault(task, {})  # size -> mujoco.Renderer
        while len(sims) < n:
            sims.append(FetchSim(task, cameras=cameras, image_size=size, renderers=renderers))
        return sims[:n]

    def close(self) -> None:
        for sims in self._sims.values():
            for sim in sims:
                sim.close()
        for renderers in self._renderers.values():
            for renderer in renderers.values():
                renderer.close()
        self._sims, self._renderers = {}, {}


class PolicyCache:
    """Policies built in one worker, one per factory (factories are frozen dataclasses, classes or
    partials: hashable). A policy with `reset` is built once and reset with each batch's seed (the
    Policy protocol: reset returns it to its start state); one without `reset` is built per batch.
    Building a VLM policy (model, weights, tokenizer) costs more than stepping a batch of envs."""

    def __init__(self) -> None:
        self._built: dict[Any, Any] = {}

    def get(self, factory: Callable[[], Any], seed: int) -> Any:
        try:
            policy = self._built.get(factory)
        except TypeError:  # an unhashable factory: no reuse
            policy = None
        if policy is None:
            policy = factory()
            if getattr(policy, "reset", None) is not None:
                try:
                    self._built[factory] = policy
                except TypeError:
                    pass
        reset_policy(policy, seed)
        return policy


def eval_group(group: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """Worker body: a group of batches with one EnvPool and one PolicyCache; per batch, the episodes'
    metrics (+ mp4 bytes). The batches may belong to several evaluations (`evaluate_many`), each
    stepped in envs built from its own config."""
    pool = EnvPool(group["batches"][0]["config"])
    policies = PolicyCache()
    try:
        return [run_batch(payload, pool, policies) for payload in group["batches"]]
    finally:
        pool.close()


def run_batch(payload: dict[str, Any], pool: EnvPool, policies: PolicyCache | None = None) -> list[dict[str, Any]]:
    """One batch of episodes in lockstep, the policy reset with the batch seed; per-episode metrics (+ mp4 bytes)."""
    from reproduction.sim.env import FPS
    from reproduction.sim.metrics import episode_metrics

    config: EvalConfig = payload["config"]
    policy = (policies or PolicyCache()).get(payload["factory"], payload["batch_seed"])
    spec = get_task(payload["task"])
    sims = pool.get(spec.env_id, len(payload["indices"]), config)
    obs = [sim.reset(seed) for sim, seed in zip(sims, payload["reset_seeds"])]
    n = len(sims)
    track = {k: [[] for _ in range(n)] for k in ("grip", "cube", "fingers")}
    recorded = [i for i, idx in enumerate(payload["indices"]) if idx < config.videos]
    video = {i: [] for i in recorded}

    def record() -> None:
        for i, sim in enumerate(sims):
            track["grip"][i].append(sim.grip_pos)
            track["cube"][i].append(sim.object_pos)
            track["fingers"][i].append(float(sim.fingers.sum()))
        for i in recorded:
            views = [sims[i].render_frame(cam, config.video_size) for cam in CAMERA_NAMES]
            video[i].append(np.concatenate(views, axis=1))

    record()
    step, chunk, used = 0, None, 0
    while step < config.episode_steps:
        if chunk is None or used >= min(config.execute_steps, chunk.shape[1]):
            batch = {k: np.stack([o[k] for o in obs]) for k in obs[0]}
            batch["task"] = [spec.language] * n
            chunk, used = _check_actions(policy(batch), n, payload, step), 0
        obs = [sim.step(chunk[i, used])[0] for i, sim in enumerate(sims)]
        used += 1
        step += 1
        record()
    out = []
    for i, sim in enumerate(sims):
        metrics = episode_metrics(
            np.asarray(track["grip"][i]),
            np.asarray(track["cube"][i]),
            np.asarray(track["fingers"][i]),
            sim.goal,
            lifts=spec.lifts,
            table_z=sim.table_z,
        )
        metrics["success_at_end"] = sim.is_success()  # the env's own rule on the final state
        metrics["episode"] = payload["indices"][i]
        metrics["reset_seed"] = payload["reset_seeds"][i]
        if i in video:
            metrics["mp4"] = _encode_mp4(np.stack(video[i]), FPS)
        out.append(metrics)
    return out


def _run(
    payloads: list[dict[str, Any]], workers: int, runner: Runner | None, killed_hint: str | None = None
) -> Iterator[list[dict[str, Any]]]:
    """Each batch's episodes, in batch order: in this process with one EnvPool, or in one group of
    consecutive batches per worker (each with its own EnvPool) in a spawn pool or through `runner`."""
    if workers <= 1 and runner is None:
        pool, policies = EnvPool(payloads[0]["config"]), PolicyCache()
        try:
            for payload in payloads:
                yield run_batch(payload, pool, policies)
        finally:
            pool.close()
        return
    k = max(1, min(workers, len(payloads)))
    bounds = [round(i * len(payloads) / k) for i in range(k + 1)]
    groups = [{"batches": payloads[a:b]} for a, b in zip(bounds, bounds[1:])]
    for results in run_units(eval_group, groups, workers=workers, runner=runner, killed_hint=killed_hint):
        yield from results


@dataclass(kw_only=True)
class EvalJob:
    """One evaluation of `evaluate_many`: a policy factory, its config, and where its videos go."""

    factory: Callable[[], Any]
    config: EvalConfig
    out_dir: Path | str | None = None


def evaluate(
    policy_factory: Callable[[], Any],
    config: EvalConfig,
    out_dir: Path | str | None = None,
    *,
    ui: UiOptions | None = None,
    runner: Runner | None = None,
    killed_hint: str | None = None,
) -> EvalResult:
    """Evaluate the policy `policy_factory()` builds; videos go to `out_dir/videos/` (none without out_dir).

    Raises ConfigError for a bad config and SimError when the policy returns a wrong-shaped or
    non-finite batch. The result is identical for any `config.workers` and any `runner`. `killed_hint`: the
    hint under a killed worker (run_units).
    """
    job = EvalJob(factory=policy_factory, config=config, out_dir=out_dir)
    return evaluate_many([job], ui=ui, runner=runner, killed_hint=killed_hint)[0]


def evaluate_many(
    jobs: list[EvalJob],
    *,
    ui: UiOptions | None = None,
    runner: Runner | None = None,
    looks: Sequence[int] | None = None,
    go_on: Callable[[int, list[EvalResult]], bool] | None = None,
    killed_hint: str | None = None,
) -> list[EvalResult]:
    """Several evaluations through ONE set of workers (`jobs[0].config.workers` of them): their
    batches are concatenated and cut into one contiguous group per worker, so worker start-up
    (a fresh interpreter importing mujoco and torch) and env creation are paid once, not per
    policy. Each result is identical to `evaluate` of that job alone, for any worker count; its
    `seconds` is the wall time from the start until its last batch came back (the jobs share workers).

    `looks` (a sequential evaluation): episodes per task at each look, rising, each a whole number of
    batches (a multiple of every job's batch_size) except the last, which is every job's
    episodes_per_task. Look k runs episodes [looks[k-1], looks[k]) of every task of every job, as the
    very batches (indices, reset seeds, batch seeds) the evaluation without looks runs, so the first n
    episodes of a stopped evaluation are exactly the first n of the full one. After each look but the
    last, `go_on(look, results so far)` (look 0-based) says whether to go on; the results returned are
    those of the last look run. Each look starts its own workers when `workers` > 1. `killed_hint`: the hint under
    a killed worker (run_units: the caller's command and its key for the worker count)."""
    if not jobs:
        return []
    ends = _check_looks(jobs, looks)
    workers = jobs[0].config.workers
    start = time.perf_counter()
    per_job = [_batches(job.config, job.factory) for job in jobs]
    states = [_Collect(job.config) for job in jobs]
    total = sum(len(job.config.tasks) * job.config.episodes_per_task for job in jobs)
    with progress(ui) as bar:
        task_bar = bar.task("evaluate", total=total)
        for look, (lo, hi) in enumerate(zip([0, *ends], ends)):
            span = [[p for p in batches if lo <= p["indices"][0] < hi] for batches in per_job]
            payloads = [p for batch in span for p in batch]
            owner = [j for j, batch in enumerate(span) for _ in batch]
            for j, payload, episodes in zip(owner, payloads, _run(payloads, workers, runner, killed_hint)):
                states[j].add(payload, episodes, jobs[j].out_dir)
                task_bar.advance(len(episodes))
                if states[j].done() and not states[j].seconds:  # wall time until its last batch came back
                    states[j].seconds = time.perf_counter() - start
            if look < len(ends) - 1 and go_on is not None:
                now = time.perf_counter() - start
                if not go_on(look, [st.result(st.seconds or now) for st in states]):
                    break
    return [st.result(st.seconds or time.perf_counter() - start) for st in states]


def _check_looks(jobs: list[EvalJob], looks: Sequence[int] | None) -> list[int]:
    """The looks' ends (episodes per task); one look past every episode when `looks` is None. ConfigError
    for looks that would cut a batch (its episodes would then differ from the evaluation without looks)."""
    if looks is None:
        return [max(job.config.episodes_per_task for job in jobs)]
    ends = [int(n) for n in looks]
    wrong = [
        (n, job.config.batch_size)
        for job in jobs
        for n in ends[:-1]
        if n % job.config.batch_size or not 0 < n < job.config.episodes_per_task
    ]
    if not ends or any(b <= a for a, b in zip(ends, ends[1:])) or wrong:
        raise ConfigError(
            f"looks {ends} must rise in whole batches of episodes to episodes_per_task",
            field="looks",
            hint=f"e.g. {wrong[0][0]} is not inside and a multiple of batch_size {wrong[0][1]}" if wrong else None,
        )
    bad = [job.config.episodes_per_task for job in jobs if job.config.episodes_per_task != ends[-1]]
    if bad:
        raise ConfigError(f"the last look {ends[-1]} must be episodes_per_task ({bad[0]})", field="looks")
    return ends


class _Collect:
    """One job's results as its batches come back."""

    def __init__(self, config: EvalConfig) -> None:
        self.config = config
        self.tasks = {
            get_task(t).env_id: TaskResult(task=get_task(t).env_id, episodes=0, success_once=0, success_at_end=0)
            for t in config.tasks
        }
        self.videos: list[Path] = []
        self.seeds: dict[str, list[int]] = {name: [] for name in self.tasks}
        self.seconds = 0.0

    def done(self) -> bool:
        return sum(t.episodes for t in self.tasks.values()) >= len(self.tasks) * self.config.episodes_per_task

    def add(self, payload: dict[str, Any], episodes: list[dict[str, Any]], out_dir: Path | str | None) -> None:
        result = self.tasks[payload["task"]]
        for ep in episodes:
            mp4 = ep.pop("mp4", None)
            if mp4 is not None and out_dir is not None:
                path = Path(out_dir) / "videos" / f"{get_task(payload['task']).short}_{ep['episode']:03d}.mp4"
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(f".{path.name}.{os.getpid()}")
                try:
                    tmp.write_bytes(mp4)
                    os.replace(tmp, path)
                except OSError as exc:  # a full disk: no half-written video left, the path and size named
                    tmp.unlink(missing_ok=True)
                    raise annotate(exc, path, need=len(mp4)) from None
                self.videos.append(path)
            result.episodes += 1
            result.success_once += int(ep["success_once"])
            result.success_at_end += int(ep["success_at_end"])
            result.episode_metrics.append(ep)
            self.seeds[payload["task"]].append(ep["reset_seed"])

    def result(self, seconds: float) -> EvalResult:
        return EvalResult(
            config=self.config, tasks=self.tasks, reset_seeds=self.seeds, videos=self.videos, seconds=seconds
        )
