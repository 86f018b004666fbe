"""Generate LeRobot v3.0 datasets of scripted Fetch episodes: sft (expert demos) or rollout (a mix of modes).

Each episode is fixed by (config seed, kind, task, index) alone (see `seeds`), and the modes are
assigned by exact counts from the mix's fractions, then shuffled by the config seed: the dataset is
byte-for-byte the same for any number of workers. Episodes are generated in units of a few episodes
in parallel and streamed, in order, into `reproduction.data.writer.write_dataset` (which builds the
dataset in a sibling folder and renames it into place). Columns per frame::

    observation.state float32[11], observation.goal float32[3], observation.images.{agentview,wrist} (optional),
    action float32[4], is_success bool (after the action; the last row is the episode's outcome),
    sim.mode int64 (Mode), sim.event int64 (Event), sim.harm bool, sim.reset_seed int64

    result = generate_dataset(GenConfig(kind="rollout", tasks=("FetchPickAndPlace-v4",)), out, workers=2)
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from reproduction.errors import ConfigError, InvalidInputError
from reproduction.sim.behaviours import BehaviourConfig, Mode, mode_of
from reproduction.sim.cameras import CAMERA_NAMES
from reproduction.sim.tasks import get_task, task_id
from reproduction.sim.workers import Runner, run_units
from reproduction.ui import Progress, UiOptions, progress

KINDS = ("sft", "rollout")

MIX1_MODES = {"good": 0.20, "messy": 0.50, "give_up": 0.15, "short_carry": 0.15}
MIX2_MODES = {"good": 0.10, "messy": 0.65, "give_up": 0.125, "short_carry": 0.125}


@dataclass(kw_only=True, slots=True)
class GenConfig:
    """What one generated dataset holds."""

    kind: str = "rollout"
    """"sft" (expert demonstrations only) or "rollout" (episodes drawn from `modes`)."""
    tasks: tuple[str, ...] = ("FetchPickAndPlace-v4",)
    """Simulator tasks (env ids, or `<id>:<variant>` for a physics variant: reproduction/sim/tasks.py); each gets
    `episodes_per_task` episodes."""
    episodes_per_task: int = 300
    modes: dict[str, float] = field(default_factory=lambda: dict(MIX1_MODES))
    """Rollout mode -> fraction (normalised); ignored for sft. Names: see behaviours.Mode."""
    behaviour: BehaviourConfig = field(default_factory=BehaviourConfig)
    seed: int = 0
    cameras: tuple[str, ...] = CAMERA_NAMES
    """Cameras rendered into the dataset; () for state-only data."""
    image_size: int = 64
    image_storage: str = "png"
    """"png" (bytes in the parquet) or "video" (mp4 files)."""
    episode_steps: int = 50
    unit_episodes: int = 0
    """Episodes per work unit; 0 picks about four units per worker (at most 25 episodes each)."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"kind {self.kind!r} is not one of {', '.join(KINDS)}", field="kind")
        if not self.tasks:
            raise ConfigError("tasks is empty", field="tasks")
        for task in self.tasks:
            get_task(task)
        if self.episodes_per_task < 1:
            raise ConfigError(f"episodes_per_task {self.episodes_per_task} < 1", field="episodes_per_task")
        if self.kind == "rollout":
            if not self.modes or any(v < 0 for v in self.modes.values()) or sum(self.modes.values()) <= 0:
                raise ConfigError(f"modes {self.modes} need non-negative fractions with a positive sum", field="modes")
            for name in self.modes:
                mode_of(name)
        unknown = [c for c in self.cameras if c not in CAMERA_NAMES]
        if unknown:
            raise ConfigError(f"unknown camera(s) {unknown}; known: {', '.join(CAMERA_NAMES)}", field="cameras")
        if not 8 <= self.image_size <= 480:
            raise ConfigError(f"image_size {self.image_size} is outside 8..480", field="image_size")
        if self.image_storage not in ("png", "video"):
            raise ConfigError(f"image_storage {self.image_storage!r} is not png or video", field="image_storage")
        if not 1 <= self.episode_steps <= 1000:
            raise ConfigError(f"episode_steps {self.episode_steps} is outside 1..1000", field="episode_steps")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tasks"], d["cameras"] = list(self.tasks), list(self.cameras)
        return d


@dataclass(kw_only=True, slots=True)
class DataMix:
    """A demo data mix: how many expert demos and rollouts per task, and the rollouts' modes."""

    sft_episodes: int = 50
    rollout_episodes: int = 300
    rollout_modes: dict[str, float] = field(default_factory=lambda: dict(MIX1_MODES))
    behaviour: BehaviourConfig = field(default_factory=BehaviourConfig)

    def configs(self, *, tasks: tuple[str, ...], seed: int = 0, **common: Any) -> tuple[GenConfig, GenConfig]:
        """(sft config, rollout config) for `tasks`; `common` sets cameras, image_size, image_storage..."""
        sft = GenConfig(kind="sft", tasks=tasks, episodes_per_task=self.sft_episodes, seed=seed, **common)
        rollout = GenConfig(
            kind="rollout",
            tasks=tasks,
            episodes_per_task=self.rollout_episodes,
            modes=dict(self.rollout_modes),
            behaviour=self.behaviour,
            seed=seed,
            **common,
        )
        return sft, rollout


MIXES: dict[str, DataMix] = {
    # DEMO_LAB.md mix1: 50 demos + 300 rollouts (20% good, 50% messy, 15% give up, 15% short carry).
    "mix1": DataMix(),
    # mix2: 20 demos + 330 rollouts, messier (1-4 detours of 4-8 steps, no regrasps or hesitations).
    "mix2": DataMix(
        sft_episodes=20,
        rollout_episodes=330,
        rollout_modes=dict(MIX2_MODES),
        behaviour=BehaviourConfig(detours=(1, 4), regrasps=(0, 0), hesitations=(0, 0)),
    ),
}


@dataclass(kw_only=True, slots=True)
class GenResult:
    """What `generate_dataset` wrote and measured."""

    path: Path
    episodes: int
    frames: int
    seconds: float
    per_task: dict[str, dict[str, int]]
    """Task -> {"episodes", "success"}."""
    per_mode: dict[str, dict[str, int]]
    """Mode name -> {"episodes", "success"}."""
    events: dict[str, int]
    """Event name -> occurrences over the dataset."""
    success_events: dict[str, int]
    """Event name -> occurrences inside successful episodes (the harm filtering keeps)."""
    harm_frames: int
    config: dict[str, Any]

    @property
    def episodes_per_s(self) -> float:
        return self.episodes / max(self.seconds, 1e-9)

    @property
    def success_rate(self) -> float:
        return sum(v["success"] for v in self.per_task.values()) / max(self.episodes, 1)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "episodes": self.episodes,
            "frames": self.frames,
            "seconds": round(self.seconds, 3),
            "episodes_per_s": round(self.episodes_per_s, 3),
            "success_rate": round(self.success_rate, 4),
            "per_task": self.per_task,
            "per_mode": self.per_mode,
            "events": self.events,
            "success_events": self.success_events,
            "harm_frames": self.harm_frames,
            "config": self.config,
        }


def mode_counts(fractions: dict[str, float], n: int) -> dict[Mode, int]:
    """Exact counts summing to n from fractions (largest remainder, ties by the mix's order)."""
    total = sum(fractions.values())
    raw = {mode_of(k): n * v / total for k, v in fractions.items()}
    counts = {m: int(np.floor(r)) for m, r in raw.items()}
    left = n - sum(counts.values())
    for m in sorted(raw, key=lambda m: -(raw[m] - counts[m]))[:left]:
        counts[m] += 1
    return counts


def episode_modes(config: GenConfig, task: str) -> list[Mode]:
    """The mode of each episode of `task`, in episode order (shuffled by the seed, independent of workers)."""
    n = config.episodes_per_task
    if config.kind == "sft":
        return [Mode.EXPERT] * n
    modes = [m for m, c in mode_counts(config.modes, n).items() for _ in range(c)]
    rng = np.random.default_rng([config.seed & 0xFFFFFFFF, 7, task_id(task)])
    return [modes[i] for i in rng.permutation(n)]


def _units(config: GenConfig, workers: int) -> list[dict[str, Any]]:
    per_unit = config.unit_episodes or max(1, min(25, -(-config.episodes_per_task // max(4 * workers, 1))))
    units = []
    for t, task in enumerate(config.tasks):
        env_id = get_task(task).env_id
        modes = episode_modes(config, env_id)
        for start in range(0, config.episodes_per_task, per_unit):
            idx = list(range(start, min(start + per_unit, config.episodes_per_task)))
            units.append(
                {
                    "task": env_id,
                    "indices": idx,
                    "first_episode": t * config.episodes_per_task,
                    "modes": [int(modes[i]) for i in idx],
                    "config": config,
                }
            )
    return units


def generate_unit(unit: dict[str, Any]) -> list[dict[str, Any]]:
    """Worker body: the episodes of one unit as {"episode_index", "task", "frames", "outcome"} dicts."""
    from reproduction.sim.env import FetchSim
    from reproduction.sim.episode import run_scripted
    from reproduction.sim.seeds import episode_rng, reset_seed

    config: GenConfig = unit["config"]
    out = []
    with FetchSim(unit["task"], cameras=config.cameras, image_size=config.image_size) as sim:
        for index, mode in zip(unit["indices"], unit["modes"]):
            frames, outcome = run_scripted(
                sim,
                reset_seed=reset_seed(config.seed, config.kind, unit["task"], index),
                mode=Mode(mode),
                config=config.behaviour,
                rng=episode_rng(config.seed, config.kind, unit["task"], index),
                steps=config.episode_steps,
            )
            out.append(
                {
                    "episode_index": unit["first_episode"] + index,
                    "task": sim.task.language,
                    "env_id": unit["task"],
                    "mode": Mode(mode).name.lower(),
                    "frames": frames,
                    "outcome": outcome,
                }
            )
    return out


def features(config: GenConfig) -> dict[str, dict[str, Any]]:
    """The dataset's non-default features (names included so readers can label the state)."""
    from reproduction.sim.spaces import GOAL_NAMES, STATE_NAMES

    feats: dict[str, dict[str, Any]] = {
        "observation.state": {"dtype": "float32", "shape": [len(STATE_NAMES)], "names": list(STATE_NAMES)},
        "observation.goal": {"dtype": "float32", "shape": [len(GOAL_NAMES)], "names": list(GOAL_NAMES)},
    }
    for cam in config.cameras:
        feats[f"observation.images.{cam}"] = {
            "dtype": "image" if config.image_storage == "png" else "video",
            "shape": [config.image_size, config.image_size, 3],
            "names": ["height", "width", "channel"],
        }
    feats.update(
        {
            "action": {"dtype": "float32", "shape": [4], "names": ["dx", "dy", "dz", "gripper"]},
            "is_success": {"dtype": "bool", "shape": [1], "names": None},
            "sim.mode": {"dtype": "int64", "shape": [1], "names": None},
            "sim.event": {"dtype": "int64", "shape": [1], "names": None},
            "sim.harm": {"dtype": "bool", "shape": [1], "names": None},
            "sim.reset_seed": {"dtype": "int64", "shape": [1], "names": None},
        }
    )
    return feats


def generate_dataset(
    config: GenConfig,
    out_dir: Path | str,
    *,
    workers: int = 1,
    ui: UiOptions | None = None,
    runner: Runner | None = None,
    overwrite: bool = False,
    killed_hint: str | None = None,
) -> GenResult:
    """Generate `config`'s episodes and write them as a LeRobot v3.0 dataset at `out_dir`.

    `workers` > 1 runs units in a spawn pool (or through `runner`, e.g. Ray's run_tasks). The result is
    the same for any `workers`. Raises ConfigError/SimError for bad config (nothing written) and
    InvalidInputError if `out_dir` exists (unless `overwrite`); on failure `out_dir` is untouched. A pool worker
    that dies is a WorkerFailedError (exit 51) with `killed_hint` (errors.killed_worker_hint: the caller's command
    and the flag or key it reads the worker count from; None: a plain rerun).
    """
    from reproduction.data.writer import EpisodeData, write_dataset
    from reproduction.sim.env import FPS

    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise InvalidInputError(f"{out_dir}: already exists", path=out_dir, hint="choose a new folder")
    units = _units(config, max(1, workers))
    total = config.episodes_per_task * len(config.tasks)
    per_task: dict[str, Counter] = {}
    per_mode: dict[str, Counter] = {}
    events: Counter = Counter()
    success_events: Counter = Counter()
    harm = 0
    start = time.perf_counter()

    def stream(bar: Progress) -> Any:
        nonlocal harm
        task = bar.task(f"generate {config.kind}", total=total)
        for episodes in run_units(generate_unit, units, workers=workers, runner=runner, killed_hint=killed_hint):
            for ep in episodes:
                outcome = ep["outcome"]
                for table, key in ((per_task, ep["env_id"]), (per_mode, ep["mode"])):
                    c = table.setdefault(key, Counter())
                    c["episodes"] += 1
                    c["success"] += int(outcome.success)
                events.update(outcome.events)
                if outcome.success:
                    success_events.update(outcome.events)
                harm += outcome.harm_frames
                task.advance(1)
                yield EpisodeData(episode_index=ep["episode_index"], task=ep["task"], frames=ep["frames"])
            elapsed = time.perf_counter() - start
            done = sum(c["episodes"] for c in per_task.values())
            task.show(rate=f"{done / max(elapsed, 1e-9):.1f} ep/s")

    with progress(ui) as bar:
        write_dataset(
            out_dir,
            stream(bar),
            fps=FPS,
            features=features(config),
            tasks=list(dict.fromkeys(get_task(t).language for t in config.tasks)),
            robot_type="fetch",
            image_storage=config.image_storage,
            overwrite=overwrite,
        )
    return GenResult(
        path=out_dir,
        episodes=total,
        frames=total * config.episode_steps,
        seconds=time.perf_counter() - start,
        per_task={k: dict(v) for k, v in per_task.items()},
        per_mode={k: dict(v) for k, v in per_mode.items()},
        events=dict(events),
        success_events=dict(success_events),
        harm_frames=harm,
        config=config.to_dict(),
    )


def generate_mix(
    mix: DataMix | str,
    root: Path | str,
    *,
    tasks: tuple[str, ...] = ("FetchPickAndPlace-v4",),
    seed: int = 0,
    workers: int = 1,
    ui: UiOptions | None = None,
    runner: Runner | None = None,
    killed_hint: str | None = None,
    **common: Any,
) -> dict[str, GenResult]:
    """Write `root/sft` and `root/rollout` for a mix (a DataMix or a name in MIXES); returns both results.
    `killed_hint`: the hint under a killed pool worker (generate_dataset)."""
    if isinstance(mix, str):
        if mix not in MIXES:
            raise ConfigError(f"unknown data mix {mix!r}; known: {', '.join(MIXES)}", field="mix")
        mix = MIXES[mix]
    root = Path(root)
    sft, rollout = mix.configs(tasks=tasks, seed=seed, **common)  # both validated before anything is written
    for cfg in (sft, rollout):
        if (root / cfg.kind).exists():
            raise InvalidInputError(
                f"{root / cfg.kind}: already exists", path=root / cfg.kind, hint="choose a new folder"
            )
    return {
        cfg.kind: generate_dataset(cfg, root / cfg.kind, workers=workers, ui=ui, runner=runner, killed_hint=killed_hint)
        for cfg in (sft, rollout)
    }
