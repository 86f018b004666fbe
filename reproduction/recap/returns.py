"""Stage 1: per-frame rewards and discounted returns, vectorised over all episodes at once.

Reward rule (RECAP.md section 1), per episode of L frames ordered by frame_index:
r_t = -1 for t < L-1; r_{L-1} = 0 on success, else `failure_reward`. G_t = sum_j gamma^(j-t) r_j.
`sft` datasets count every episode as a success; `rollout` datasets need an `is_success` column
and use its value at the episode's last frame. Episodes are found by episode_index (ids need not
be contiguous, rows need not be sorted); duplicate (episode, frame) pairs are refused.

    python -m reproduction.recap.returns --dataset PATH [--dataset PATH ...] --out DIR \\
        [--tag T] [--gamma 1.0] [--failure-reward -300] [--type sft|rollout] [--in-dataset]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from reproduction.errors import ConfigError, DatasetError, PortableError

DATASET_TYPES = ("sft", "rollout")


@dataclass(kw_only=True, slots=True)
class ReturnsConfig:
    """Stage-1 parameters (RLinf's recap_compute_returns.yaml)."""

    gamma: float = 1.0
    """Discount in (0, 1]."""
    failure_reward: float = -300.0
    """Reward of a failed episode's last frame."""
    dataset_type: str = "sft"
    """"sft" (all episodes succeed) or "rollout" (is_success decides)."""
    tag: str | None = None
    """Sidecar tag: returns_{tag}.parquet."""

    def __post_init__(self) -> None:
        if not (0.0 < self.gamma <= 1.0):
            raise ConfigError(f"gamma {self.gamma} is outside (0, 1]", field="gamma")
        if self.dataset_type not in DATASET_TYPES:
            raise ConfigError(f"type {self.dataset_type!r} is not one of {', '.join(DATASET_TYPES)}", field="type")
        if not np.isfinite(self.failure_reward):
            raise ConfigError(f"failure_reward {self.failure_reward} is not a finite number", field="failure_reward")


# -- vectorised math ------------------------------------------------------------------------------


def sort_frames(episode_index: np.ndarray, frame_index: np.ndarray) -> np.ndarray:
    """Permutation sorting rows by (episode, frame); raises DatasetError on a duplicate pair."""
    de = np.diff(episode_index)
    if bool(np.all((de > 0) | ((de == 0) & (np.diff(frame_index) > 0)))):
        return np.arange(episode_index.size)  # already sorted with no duplicates: the usual case, O(n)
    order = np.lexsort((frame_index, episode_index))
    ep, fr = episode_index[order], frame_index[order]
    dup = np.nonzero((ep[1:] == ep[:-1]) & (fr[1:] == fr[:-1]))[0]
    if dup.size:
        raise DatasetError(f"episode {int(ep[dup[0]])} frame {int(fr[dup[0]])} appears more than once",
                           field="frame_index", hint="the data parquets hold duplicated rows; deduplicate the dataset")
    return order


def episode_ends(sorted_episode_index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For rows sorted by episode: (start, end) of each row's episode (end exclusive), per row."""
    n = sorted_episode_index.size
    change = np.nonzero(sorted_episode_index[1:] != sorted_episode_index[:-1])[0] + 1
    starts = np.concatenate([[0], change]).astype(np.int64)
    ends = np.concatenate([change, [n]]).astype(np.int64)
    lengths = ends - starts
    return np.repeat(starts, lengths), np.repeat(ends, lengths)


def discounted_reverse_cumsum(values: np.ndarray, row_end: np.ndarray, gamma: float) -> np.ndarray:
    """out[t] = sum_{j=t}^{row_end[t]-1} gamma^(j-t) values[j], in float64, for all rows at once.

    gamma == 1 is a segmented reverse cumulative sum. Otherwise a log-depth doubling scan: after
    the pass with stride s every row holds the sum over its next 2s rows; every multiplier is
    gamma^s <= 1, so nothing overflows or loses the tail however long the episode.
    """
    v = np.asarray(values, dtype=np.float64)
    n = v.size
    if n == 0:
        return v.copy()
    if gamma == 1.0:
        csum = np.concatenate([[0.0], np.cumsum(v)])
        return csum[row_end] - csum[:-1]
    out = v.copy()
    idx = np.arange(n, dtype=np.int64)
    span = int((row_end - idx).max())
    s = 1
    while s < span:
        take = np.nonzero(idx + s < row_end)[0]
        shifted = out[take + s]
        out[take] += (gamma ** s) * shifted
        s *= 2
    return out


def episode_rewards(row_end: np.ndarray, success_at_end: np.ndarray, failure_reward: float) -> np.ndarray:
    """Rewards for sorted rows: -1, and 0 / failure_reward on each episode's last row."""
    rewards = np.full(row_end.size, -1.0, dtype=np.float64)
    last = np.unique(row_end) - 1 if row_end.size else row_end
    rewards[last] = np.where(success_at_end[last], 0.0, failure_reward)
    return rewards


def compute_returns_table(frames: pa.Table, config: ReturnsConfig, *, tasks: dict[int, str] | None = None,
                          source: str = "dataset") -> pa.Table:
    """RLinf's returns table for one dataset's key columns, sorted by (episode, frame).

    `frames` needs episode_index and frame_index, plus is_success for rollout data and task_index
    (or task) for the prompt. Output: episode_index, frame_index int64; return, reward float32;
    prompt string. Raises DatasetError for rollout data without is_success.
    """
    names = set(frames.column_names)
    if config.dataset_type == "rollout" and "is_success" not in names:
        raise DatasetError(f"{source}: rollout data needs an is_success column, and there is none",
                           field="is_success", hint="pass --type sft if every episode is a successful demonstration")
    ep = frames.column("episode_index").to_numpy().astype(np.int64, copy=False)
    fr = frames.column("frame_index").to_numpy().astype(np.int64, copy=False)
    order = sort_frames(ep, fr)
    if np.array_equal(order, np.arange(order.size)):
        order = None  # already sorted: skip every gather below
    else:
        ep, fr = ep[order], fr[order]
    _, row_end = episode_ends(ep)
    if config.dataset_type == "sft":
        success = np.ones(ep.size, dtype=bool)
    else:
        col = frames.column("is_success")
        if col.null_count:
            raise DatasetError(f"{source}: is_success has {col.null_count} missing values", field="is_success")
        success = col.to_numpy(zero_copy_only=False).astype(bool)
        success = success if order is None else success[order]
    rewards = episode_rewards(row_end, success, config.failure_reward)
    returns = discounted_reverse_cumsum(rewards, row_end, config.gamma)
    return pa.table({"episode_index": pa.array(ep, pa.int64()), "frame_index": pa.array(fr, pa.int64()),
                     "return": pa.array(returns.astype(np.float32)), "reward": pa.array(rewards.astype(np.float32)),
                     "prompt": _prompts(frames, order, tasks)})


def _prompts(frames: pa.Table, order: np.ndarray | None, tasks: dict[int, str] | None) -> pa.Array:
    """RLinf's prompt: the `task` column, else tasks[task_index], else "perform the task"."""
    if "task" in frames.column_names:
        col = frames.column("task").combine_chunks()
        return (col if order is None else col.take(pa.array(order))).cast(pa.string())
    if "task_index" in frames.column_names and tasks:
        ti = frames.column("task_index").to_numpy()
        ti = ti if order is None else ti[order]
        keys = np.array(sorted(tasks), dtype=np.int64)
        lut = np.full(int(max(keys.max(), ti.max(initial=0))) + 1, -1, dtype=np.int64)
        lut[keys] = np.arange(keys.size)
        pos = lut[np.clip(ti, 0, None)]
        bad = (ti < 0) | (pos < 0)
        if bad.any():
            raise DatasetError(f"task_index {int(ti[bad][0])} is not in the dataset's task list", field="task_index")
        return pa.array([tasks[int(k)] for k in keys], pa.string()).take(pa.array(pos))
    return pa.array(np.full(frames.num_rows, "perform the task", dtype=object), pa.string())


def column_stats(values: np.ndarray) -> dict[str, float]:
    """RLinf's stats.json entry: mean, std (population, float64), min, max."""
    v = np.asarray(values, dtype=np.float64)
    return {"mean": float(v.mean()), "std": float(v.std()), "min": float(v.min()), "max": float(v.max())}


# -- the stage --------------------------------------------------------------------------------------


@dataclass(kw_only=True, slots=True)
class ReturnsResult:
    """What stage 1 wrote for one dataset."""

    dataset: Path
    sidecar: Path
    fingerprint: str
    num_frames: int
    num_episodes: int
    stats: dict[str, dict[str, float]]


def compute_returns(datasets: Sequence[Path], out: Path | None, config: ReturnsConfig, *,
                    types: Sequence[str] | None = None, in_dataset: bool = False) -> list[ReturnsResult]:
    """Write `returns_{tag}.parquet` (+ stats.json) for each dataset; returns what was written.

    Sidecars go to `<out>/<dataset folder name>/`, or into `<dataset>/meta/` with `in_dataset`
    (RLinf interop; the data parquets and info.json are never touched). `types` gives a per-dataset
    sft/rollout type (default: config.dataset_type for all). Each file is written atomically; a
    failing dataset raises before its files are replaced.
    """
    from reproduction.data.reader import open_dataset
    from reproduction.recap.sidecars import sidecar_name, update_stats_json, write_sidecar

    if out is None and not in_dataset:
        raise ConfigError("returns: no output folder given", field="out", hint="pass --out DIR (or --in-dataset)")
    names = [Path(d).resolve().name for d in datasets]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ConfigError(f"two datasets share the folder name {dup!r}; their sidecars would collide in {out}",
                          field="dataset", hint="rename one of the dataset folders")
    results = []
    for i, path in enumerate(datasets):
        cfg = ReturnsConfig(**{**asdict(config), "dataset_type": types[i] if types else config.dataset_type})
        ds = open_dataset(path)
        cols = [c for c in ("episode_index", "frame_index", "task_index", "is_success") if c in ds.key_columns]
        table = compute_returns_table(ds.frame_table(cols), cfg, tasks=ds.tasks, source=str(ds.root))
        stats = {"return": column_stats(table.column("return").to_numpy()),
                 "reward": column_stats(table.column("reward").to_numpy())}
        folder = ds.root / "meta" if in_dataset else Path(out) / ds.name
        meta = {"kind": "returns", "tag": cfg.tag, "dataset": ds.name, "dataset_path": str(ds.root),
                "dataset_fingerprint": ds.fingerprint, "params": asdict(cfg), "stats": stats,
                "num_frames": table.num_rows, "num_episodes": ds.num_episodes}
        sidecar = write_sidecar(folder / sidecar_name("returns", cfg.tag), table, meta)
        update_stats_json(folder / "stats.json", stats)
        results.append(ReturnsResult(dataset=ds.root, sidecar=sidecar, fingerprint=ds.fingerprint,
                                     num_frames=table.num_rows, num_episodes=ds.num_episodes, stats=stats))
    return results


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m reproduction.recap.returns", description=__doc__.splitlines()[0])
    p.add_argument("--dataset", action="append", required=True, metavar="PATH", help="LeRobot dataset root (repeatable)")
    p.add_argument("--out", default=None, metavar="DIR", help="output folder (sidecars go to DIR/<dataset name>/)")
    p.add_argument("--in-dataset", action="store_true", help="write into <dataset>/meta/ instead (RLinf interop)")
    p.add_argument("--tag", default=None)
    p.add_argument("--gamma", type=float, default=1.0)
    p.add_argument("--failure-reward", type=float, default=-300.0)
    p.add_argument("--type", action="append", choices=DATASET_TYPES, default=None,
                   help="sft or rollout; once for all datasets or once per --dataset (default sft)")
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        types = args.type or ["sft"]
        if len(types) not in (1, len(args.dataset)):
            raise ConfigError(f"{len(types)} --type values for {len(args.dataset)} datasets", field="type",
                              hint="give --type once, or once per --dataset")
        types = types * len(args.dataset) if len(types) == 1 else types
        config = ReturnsConfig(gamma=args.gamma, failure_reward=args.failure_reward, dataset_type=types[0], tag=args.tag)
        results = compute_returns([Path(d) for d in args.dataset], Path(args.out) if args.out else None, config,
                                  types=types, in_dataset=args.in_dataset)
    except PortableError as exc:
        return render_error(exc)
    for r in results:
        print(f"{r.dataset.name}: {r.num_frames} frames, {r.num_episodes} episodes, return "
              f"[{r.stats['return']['min']:g}, {r.stats['return']['max']:g}] -> {r.sidecar}", file=sys.stderr)
    if args.json:
        print(json.dumps([{"dataset": str(r.dataset), "sidecar": str(r.sidecar), "fingerprint": r.fingerprint,
                           "num_frames": r.num_frames, "stats": r.stats} for r in results], indent=1))
    return 0


def render_error(exc: PortableError) -> int:
    """The CLI's rendering of a library error: `error:` / `hint:` on stderr, the error's exit code."""
    print(f"error: {exc.message}", file=sys.stderr)
    if exc.hint:
        print(f"hint: {exc.hint}", file=sys.stderr)
    return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
