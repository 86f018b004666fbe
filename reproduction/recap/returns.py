"""Stage 1: per-frame rewards and discounted returns, vectorised over all episodes at once.

Reward rule (RECAP.md section 1), per episode of L frames ordered by frame_index:
r_t = -1 for t < L-1; r_{L-1} = 0 on success, else `failure_reward`. G_t = sum_j gamma^(j-t) r_j.
`sft` datasets count every episode as a success; `rollout` datasets need an `is_success` column
(bool or 0/1; NaN and other values are refused: `success_flags`) and use its value at the episode's
last frame. Episodes are found by episode_index (ids need not be contiguous, rows need not be sorted);
duplicate (episode, frame) pairs are refused. Datasets whose data files hold disjoint, increasing
episode ranges (lerobot's v2.1 and v3.0 layouts) are processed in batches of whole files (about
STREAM_ROWS rows, one sidecar row group each), each file read once on a small thread pool, the
dataset fingerprint digested from that same read; memory follows the batch, not the dataset.

Run through `portable run --stages returns` (reproduction/recipes/recap/recipe.py calls `compute_returns`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from reproduction.errors import ConfigError, DatasetError

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
        check_returns_values(self)
        if self.dataset_type not in DATASET_TYPES:
            raise ConfigError(f"type {self.dataset_type!r} is not one of {', '.join(DATASET_TYPES)}", field="type")


def check_returns_values(cfg: Any, key: str = "") -> None:
    """ReturnsConfig's rules on `cfg` (anything with `gamma` and `failure_reward`); the ConfigError names each
    field as `key.field` (`returns.gamma` when a run config's section is checked). ReturnsConfig.__post_init__
    calls it with no key."""

    def k(name: str) -> str:
        return f"{key}.{name}" if key else name

    if not (0.0 < cfg.gamma <= 1.0):  # also refuses nan
        raise ConfigError(
            f"{k('gamma')}={cfg.gamma} is outside (0, 1]", field=k("gamma"), hint=f"set {k('gamma')} in (0, 1]"
        )
    if not np.isfinite(cfg.failure_reward):
        raise ConfigError(
            f"{k('failure_reward')}={cfg.failure_reward} is not a finite number",
            field=k("failure_reward"),
            hint=f"set {k('failure_reward')} to a finite number (docs/config.md)",
        )
    # The sidecar's return/reward columns are float32: a reward finite in float64 but beyond float32's range
    # (-1e39) would be written as -inf and train the value model on NaN targets (audit56 G1).
    if not _finite32(cfg.failure_reward):
        raise ConfigError(
            f"{k('failure_reward')}={cfg.failure_reward} is not a finite number in float32, the returns sidecar's "
            f"dtype (its range is +-{FLOAT32_MAX_TEXT})",
            field=k("failure_reward"),
            hint=f"set {k('failure_reward')} within +-{FLOAT32_MAX_TEXT} (RLinf's default: -300)",
        )


FLOAT32_MAX_TEXT = str(np.finfo(np.float32).max)
"""3.4028235e+38: the largest magnitude the float32 return/reward columns hold."""


def _finite32(x: float) -> bool:
    """x is finite once rounded to float32 (the sidecar's dtype); nan and inf are not."""
    with np.errstate(over="ignore"):
        return bool(np.isfinite(np.float32(x)))


# -- vectorised math ------------------------------------------------------------------------------


def sort_frames(episode_index: np.ndarray, frame_index: np.ndarray) -> np.ndarray | None:
    """Permutation sorting rows by (episode, frame), or None when they already are (the usual case).

    Raises DatasetError on a duplicate (episode, frame) pair.
    """
    return sorted_bounds(episode_index, frame_index)[0]


def sorted_bounds(
    episode_index: np.ndarray, frame_index: np.ndarray
) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    """(order or None, starts, ends): sort_frames plus episode_bounds of the sorted rows, in one pass
    over already-sorted input (the usual case). Raises DatasetError on a duplicate pair."""
    starts, ends = episode_bounds(episode_index)
    if _is_sorted(episode_index, frame_index, starts):
        return None, starts, ends
    order = np.lexsort((frame_index, episode_index))
    ep, fr = episode_index[order], frame_index[order]
    dup = np.nonzero((ep[1:] == ep[:-1]) & (fr[1:] == fr[:-1]))[0]
    if dup.size:
        raise DatasetError(
            f"episode {int(ep[dup[0]])} frame {int(fr[dup[0]])} appears more than once",
            field="frame_index",
            hint="the data parquets hold duplicated rows; deduplicate the dataset",
        )
    return (order, *episode_bounds(ep))


def _is_sorted(ep: np.ndarray, fr: np.ndarray, starts: np.ndarray) -> bool:
    """Rows strictly increasing in (episode, frame), given the starts of ep's runs of equal values:
    the episode rises at every run start, and the frame rises everywhere else."""
    if ep.size < 2:
        return True
    change = starts[1:]
    if change.size and not bool((ep[change] > ep[change - 1]).all()):
        return False
    back = np.flatnonzero(fr[1:] <= fr[:-1]) + 1  # frame did not rise: allowed only at a run start
    if back.size > change.size:
        return False
    pos = np.searchsorted(change, back)
    return bool((pos < change.size).all() and (change[np.minimum(pos, max(change.size - 1, 0))] == back).all())


def episode_bounds(sorted_episode_index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For rows sorted by episode: (starts, ends) of each episode as int64 arrays (end exclusive).

    On unsorted rows: the runs of equal episode_index."""
    n = sorted_episode_index.size
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    change = np.flatnonzero(sorted_episode_index[1:] != sorted_episode_index[:-1]) + 1
    starts = np.empty(change.size + 1, np.int64)
    starts[0], starts[1:] = 0, change
    ends = np.empty(change.size + 1, np.int64)
    ends[:-1], ends[-1] = change, n
    return starts, ends


def episode_ends(sorted_episode_index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For rows sorted by episode: (start, end) of each row's episode (end exclusive), per row."""
    starts, ends = episode_bounds(sorted_episode_index)
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
        out[take] += (gamma**s) * shifted
        s *= 2
    return out


def episode_returns(
    starts: np.ndarray, ends: np.ndarray, success: np.ndarray, failure_reward: float, gamma: float
) -> tuple[np.ndarray, np.ndarray]:
    """(returns, rewards) as float32 per row for sorted rows, from per-episode bounds and success.

    The reward rule (-1, then 0 or failure_reward on the last frame) makes the return closed-form:
    with m = end - 1 - t frames left and r_last the last reward,
    G_t = r_last - m when gamma == 1, else gamma^m r_last - (1 - gamma^m) / (1 - gamma).
    Computed in float64 and rounded once; every factor is <= 1, so long episodes stay exact.
    """
    n = int(ends[-1]) if ends.size else 0
    lengths = ends - starts
    last = np.where(np.asarray(success, dtype=bool), 0.0, float(failure_reward))
    rewards = np.full(n, -1.0, dtype=np.float32)
    rewards[ends - 1] = last
    if gamma == 1.0:
        first = last - (ends - 1)  # G_t = first + t: r_last - (end - 1) + t
        # Integers below 2^24 are exact in float32, so the sum can skip float64 and still be bit-equal.
        exact32 = float(failure_reward).is_integer() and abs(failure_reward) + n < 2**24
        dtype = np.float32 if exact32 else np.float64
        returns = np.repeat(first.astype(dtype), lengths)
        returns += np.arange(n, dtype=dtype)
        return _float32_returns(returns, failure_reward), rewards
    pos = np.arange(n, dtype=np.float64)
    m = np.repeat((ends - 1).astype(np.float64), lengths)
    m -= pos
    gm = np.power(gamma, m, out=m)
    returns = gm * np.repeat(last + 1.0 / (1.0 - gamma), lengths)
    returns -= 1.0 / (1.0 - gamma)
    return _float32_returns(returns, failure_reward), rewards


def _float32_returns(returns: np.ndarray, failure_reward: float) -> np.ndarray:
    """`returns` as float32, or ConfigError when one does not fit (it would be written as -inf): a return is
    failure_reward less one per frame left, so only a failure_reward near float32's limit can get there."""
    with np.errstate(over="ignore"):
        out = returns.astype(np.float32, copy=False)
    if out.size and not (np.isfinite(out.min()) and np.isfinite(out.max())):
        lo = float(np.min(returns))
        raise ConfigError(
            f"returns.failure_reward={failure_reward}: the smallest return, {lo:.7g}, is beyond float32's range "
            f"(+-{FLOAT32_MAX_TEXT}), the returns sidecar's dtype",
            field="returns.failure_reward",
            hint="set returns.failure_reward closer to 0 (RLinf's default: -300)",
        )
    return out


def compute_returns_table(
    frames: pa.Table,
    config: ReturnsConfig,
    *,
    tasks: dict[int, str] | None = None,
    source: str = "dataset",
    row_file: Callable[[int], Any] | None = None,
) -> pa.Table:
    """RLinf's returns table for one dataset's key columns, sorted by (episode, frame).

    `frames` needs episode_index and frame_index, plus is_success for rollout data and task_index
    (or task) for the prompt. Output: episode_index, frame_index int64; return, reward float32;
    prompt string (dictionary-encoded when it comes from task_index). Raises DatasetError for
    rollout data without is_success, a missing key, a duplicated frame, or an episode whose frames are not
    0..length-1 (`check_frame_runs`; `row_file` maps a row of `frames` to the data file it came from, to name it).
    """
    names = set(frames.column_names)
    if config.dataset_type == "rollout" and "is_success" not in names:
        raise DatasetError(
            f"{source}: rollout data needs an is_success column, and there is none",
            field="is_success",
            hint=NO_SUCCESS_HINT,
        )
    ep = _int64(frames, "episode_index", source)
    fr = _int64(frames, "frame_index", source)
    order, starts, ends = sorted_bounds(ep, fr)
    check_frame_runs(ep, fr, order, starts, ends, source=source, row_file=row_file)
    flags = None if config.dataset_type == "sft" else success_flags(frames.column("is_success"), ep, fr, source)
    if order is not None:
        ep, fr = ep[order], fr[order]
    if flags is None:
        success = np.ones(ends.size, dtype=bool)
    else:
        last_rows = ends - 1 if order is None else order[ends - 1]  # only each episode's last frame matters
        success = flags[last_rows]
    returns, rewards = episode_returns(starts, ends, success, config.failure_reward, config.gamma)
    return pa.table(
        {
            "episode_index": pa.array(ep, pa.int64()),
            "frame_index": pa.array(fr, pa.int64()),
            "return": pa.array(returns),
            "reward": pa.array(rewards),
            "prompt": _prompts(frames, order, tasks, source),
        }
    )


def check_frame_runs(
    ep: np.ndarray,
    fr: np.ndarray,
    order: np.ndarray | None,
    starts: np.ndarray,
    ends: np.ndarray,
    *,
    source: str,
    row_file: Callable[[int], Any] | None = None,
) -> None:
    """DatasetError (exit 40) naming the file, episode and frame when an episode's frame_index values are not
    0..length-1. lerobot numbers an episode's frames so (frame_index = position, timestamp = frame_index / fps)
    and finds video frames by it, so the video path refuses such a dataset; returns count frames by position,
    so a gap would be read as consecutive frames (RLinf does). `ep`/`fr` are the rows in `frames`' order, `order`
    sorts them (None: already sorted), `starts`/`ends` bound the sorted episodes. Sorted frames of an episode
    rise strictly (duplicates are refused before), so checking each episode's first and last frame suffices."""
    if not starts.size:
        return
    sfr = fr if order is None else fr[order]
    bad = np.flatnonzero((sfr[starts] != 0) | (sfr[ends - 1] != ends - 1 - starts))
    if not bad.size:
        return
    s, e = int(starts[bad[0]]), int(ends[bad[0]])
    seg = sfr[s:e]
    if seg[0] != 0:
        k, what = s, f"starts at frame {int(seg[0])}, not 0"
    else:
        j = int(np.flatnonzero(np.diff(seg) != 1)[0])
        k, what = s + j + 1, f"has no frame {int(seg[j]) + 1} (frame {int(seg[j])} is followed by {int(seg[j + 1])})"
    row = k if order is None else int(order[k])
    where = row_file(row) if row_file is not None else source
    raise DatasetError(
        f"{where}: episode {int(ep[row])} {what}; an episode's frame_index runs 0..length-1 ({e - s} frames), "
        f"{bad.size} episode(s) differ",
        field="frame_index",
        hint="frames were deleted or frame_index was edited: export or copy the dataset again (returns count "
        "frames by position, and video frames are found by frame_index)",
    )


NO_SUCCESS_HINT = (
    'add an is_success column, each frame\'s outcome (README.md, "Rollout datasets: is_success", derives it from '
    "next.reward in a few lines), or set the dataset's type: sft (datasets[].type) if every episode is a successful "
    "demonstration: sft counts every episode as a success, failed ones too"
)
"""The hint of a rollout dataset with no is_success column."""

_FLAG_HINT = (
    "every frame of a rollout dataset says whether its episode succeeded (true/1 or false/0; the last frame is the "
    "outcome): fix is_success, or set the dataset's type to sft if every episode is a successful demonstration "
    "(datasets[].type)"
)


def success_flags(
    column: pa.ChunkedArray | pa.Array,
    episode_index: np.ndarray,
    frame_index: np.ndarray,
    source: str = "dataset",
) -> np.ndarray:
    """`is_success` per row as bool, in the column's row order: bool, or 0/1 as integers or floats, also as
    one-element lists (a shape [1] feature). `episode_index`/`frame_index` are the rows' keys, in the same
    order, to name the first bad frame. Raises DatasetError (exit 40) for missing values,
    NaN (a float column's missing value: RLinf's bool() counts it a success), any value other than 0 and 1
    (0.5 is no outcome), or another type.
    """
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    nulls = arr.null_count
    if not nulls and (
        pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type) or pa.types.is_fixed_size_list(arr.type)
    ):
        import pyarrow.compute as pc

        sizes = pc.list_value_length(arr).to_numpy(zero_copy_only=False)
        if (sizes != 1).any():
            k = _first(np.flatnonzero(sizes != 1), episode_index, frame_index)
            raise DatasetError(
                f"{source}: is_success holds {int(sizes[k])} values at episode {int(episode_index[k])} frame "
                f"{int(frame_index[k])}; one per frame expected",
                field="is_success",
                hint=_FLAG_HINT,
            )
        arr = pc.list_flatten(arr)
        nulls = arr.null_count
    if nulls:
        raise DatasetError(f"{source}: is_success has {nulls} missing values", field="is_success", hint=_FLAG_HINT)
    if pa.types.is_boolean(arr.type):
        return arr.to_numpy(zero_copy_only=False)
    if not (pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type)):
        raise DatasetError(
            f"{source}: is_success is {arr.type}; bool or 0/1 expected", field="is_success", hint=_FLAG_HINT
        )
    values = arr.to_numpy(zero_copy_only=False)
    nan = np.isnan(values) if pa.types.is_floating(arr.type) else np.zeros(values.size, bool)
    if nan.any():
        k = _first(np.flatnonzero(nan), episode_index, frame_index)
        raise DatasetError(
            f"{source}: is_success has {int(nan.sum())} NaN values (the first at episode {int(episode_index[k])} "
            f"frame {int(frame_index[k])})",
            field="is_success",
            hint=_FLAG_HINT,
        )
    other = (values != 0) & (values != 1)
    if other.any():
        k = _first(np.flatnonzero(other), episode_index, frame_index)
        raise DatasetError(
            f"{source}: is_success has {int(other.sum())} values other than 0 and 1 (the first: {values[k]} at "
            f"episode {int(episode_index[k])} frame {int(frame_index[k])})",
            field="is_success",
            hint=_FLAG_HINT,
        )
    return values == 1


def _first(rows: np.ndarray, ep: np.ndarray, fr: np.ndarray) -> int:
    """The row among `rows` with the smallest (episode, frame)."""
    return int(rows[np.lexsort((fr[rows], ep[rows]))[0]])


def _int64(frames: pa.Table, name: str, source: str) -> np.ndarray:
    """A key column as int64 numpy (zero-copy when it already is one chunk of int64). DatasetError (exit 40) for
    a missing value, which the cast would turn into -9223372036854775808, an index that exists nowhere (the
    reader refuses it per file first; this guards tables given directly)."""
    column = frames.column(name)
    if column.null_count:
        row = int(np.flatnonzero(column.is_null().to_numpy())[0])
        raise DatasetError(
            f"{source}: {name} is missing (null) in {column.null_count} of {len(column)} rows, the first at row {row}",
            field=name,
            hint="every frame has an episode_index, frame_index and task_index: restore the data from its source "
            "or export the dataset again",
        )
    return column.to_numpy().astype(np.int64, copy=False)


def _prompts(
    frames: pa.Table, order: np.ndarray | None, tasks: dict[int, str] | None, source: str = "dataset"
) -> pa.Array | pa.DictionaryArray:
    """RLinf's prompt: the `task` column, else tasks[task_index], else "perform the task"."""
    n = frames.num_rows
    if "task" in frames.column_names:
        col = frames.column("task").combine_chunks()
        return (col if order is None else col.take(pa.array(order))).cast(pa.string())
    if "task_index" in frames.column_names and tasks:
        ti = _int64(frames, "task_index", source)
        ti = ti if order is None else ti[order]
        keys = np.array(sorted(tasks), dtype=np.int64)
        lo, hi = (int(ti.min()), int(ti.max())) if n else (0, 0)
        if lo < 0 or hi > keys[-1] or hi < 0:
            bad = lo if lo < 0 else hi
            raise DatasetError(
                f"{source}: task_index {bad} is not in the dataset's task list", field="task_index", hint=_TASKS_HINT
            )
        if keys[0] == 0 and keys.size == keys[-1] + 1:
            pos = ti  # ids 0..K-1 (the usual case): task_index is already the position
        else:
            lut = np.full(int(keys[-1]) + 1, -1, dtype=np.int64)
            lut[keys] = np.arange(keys.size, dtype=np.int64)
            pos = lut[ti]  # a small lookup table: cache-resident gather
            if (pos < 0).any():
                raise DatasetError(
                    f"{source}: task_index {int(ti[pos < 0][0])} is not in the dataset's task list",
                    field="task_index",
                    hint=_TASKS_HINT,
                )
        return repeat_strings([tasks[int(k)] for k in keys], pos)
    return repeat_strings(["perform the task"], np.zeros(n, np.int64))


_TASKS_HINT = "the dataset's meta/tasks file lacks a task its frames name: copy or export the dataset's meta/ again"


def repeat_strings(names: list[str], codes: np.ndarray) -> pa.DictionaryArray:
    """`names[codes]` as a dictionary-encoded string column (int32 codes): a column of a few distinct
    values costs its codes, not a million copies, and `write_sidecar` writes it as parquet dictionary
    pages without hashing every row (it reads back as plain strings)."""
    return pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int32, copy=False)), pa.array(names, pa.string()))


def column_stats(values: np.ndarray) -> dict[str, float]:
    """RLinf's stats.json entry: mean, std (population, float64), min, max. ConfigError on a non-finite
    entry (stats.json must stay strict JSON, and stage 2 would train on it): a sum of finite float32 returns
    can still overflow float64 only in theory, so this is the last guard, naming the entry."""
    v = np.asarray(values, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):  # refused below, by name
        stats = {"mean": float(v.mean()), "std": float(v.std()), "min": float(v.min()), "max": float(v.max())}
    bad = [k for k, x in stats.items() if not np.isfinite(x)]
    if bad:
        raise ConfigError(
            f"returns: stats.json entry {bad[0]} would be {stats[bad[0]]}, not a finite number",
            field="returns.failure_reward",
            hint="set returns.failure_reward closer to 0 (RLinf's default: -300)",
        )
    return stats


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


def compute_returns(
    datasets: Sequence[Any],
    out: Path | None,
    config: ReturnsConfig,
    *,
    types: Sequence[str] | None = None,
    in_dataset: bool = False,
) -> list[ReturnsResult]:
    """Write `returns_{tag}.parquet` (+ stats.json) for each dataset; returns what was written.

    Sidecars go to `<out>/<dataset folder name>/`, or into `<dataset>/meta/` with `in_dataset`
    (RLinf interop; the data parquets and info.json are never touched). `types` gives a per-dataset
    sft/rollout type (default: config.dataset_type for all). `datasets` are opened datasets
    (reproduction.data.reader.Dataset, as the runner passes them: read once, fingerprint included)
    or dataset roots. Each file is written atomically; a failing dataset raises before its files are
    replaced.
    """
    from reproduction.data.reader import open_dataset
    from reproduction.recap.sidecars import sidecar_name, update_stats_json, write_sidecar

    if out is None and not in_dataset:
        raise ConfigError("returns: no output folder given", field="out", hint="pass out=<folder> (or in_dataset=True)")
    opened = [d if hasattr(d, "fingerprint") else open_dataset(d) for d in datasets]
    names = [d.name for d in opened]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ConfigError(
            f"two datasets share the folder name {dup!r}; their sidecars would collide in {out}",
            field="dataset",
            hint="rename one of the dataset folders",
        )
    results = []
    for i, ds in enumerate(opened):
        cfg = ReturnsConfig(**{**asdict(config), "dataset_type": types[i] if types else config.dataset_type})
        if cfg.dataset_type == "rollout" and hasattr(ds, "check_key_column"):
            ds.check_key_column("is_success")  # missing from some files only: they are named (audit62 L4)
        cols = [c for c in ("episode_index", "frame_index", "task_index", "is_success") if c in ds.key_columns]
        kept: dict[str, list[np.ndarray]] = {"return": [], "reward": []}
        episodes: list[tuple[np.ndarray, np.ndarray]] = []  # (ids, frames) per chunk: no episode spans two

        def tables(frames: Iterable[pa.Table]) -> Iterator[pa.Table]:
            offset = 0  # dataset row of each table's first row: the tables are whole files, in order
            for t in frames:
                row_file = functools.partial(_file_of_row, ds, offset)
                table = compute_returns_table(t, cfg, tasks=ds.tasks, source=str(ds.root), row_file=row_file)
                offset += t.num_rows
                for name, parts in kept.items():
                    parts.append(table.column(name).to_numpy())  # float32: 8 bytes a frame kept for the stats
                episodes.append(episode_counts(table.column("episode_index").to_numpy()))
                yield table

        @functools.cache  # called by the writer after the last chunk, then read again below
        def meta() -> dict[str, Any]:
            # before the sidecar is renamed into place: a dataset whose header disagrees with its data gets none
            ids, frames = episode_counts(np.zeros(0, np.int64))
            if episodes:
                ids, frames = (np.concatenate(parts) for parts in zip(*episodes))
            ds.check_counts(ids, frames)
            stats = {name: column_stats(np.concatenate(parts)) for name, parts in kept.items()}
            return {
                "kind": "returns",
                "tag": cfg.tag,
                "dataset": ds.name,
                "dataset_path": str(ds.root),
                "dataset_fingerprint": ds.fingerprint,
                "params": asdict(cfg),
                "stats": stats,
                "num_frames": int(sum(p.size for p in kept["return"])),
                "num_episodes": ds.num_episodes,
            }

        folder = ds.root / "meta" if in_dataset else Path(out) / ds.name
        target = folder / sidecar_name("returns", cfg.tag)
        try:  # the usual layouts: each data file read once, whole files at a time
            sidecar = write_sidecar(target, tables(streamed_frames(ds, cols)), meta)
        except FilesInterleaveError:  # an episode spans files: read everything, sort once
            meta.cache_clear()
            kept = {"return": [], "reward": []}
            episodes.clear()
            sidecar = write_sidecar(target, tables([ds.frame_table(cols)]), meta)
        doc = meta()
        update_stats_json(folder / "stats.json", doc["stats"])
        results.append(
            ReturnsResult(
                dataset=ds.root,
                sidecar=sidecar,
                fingerprint=ds.fingerprint,
                num_frames=doc["num_frames"],
                num_episodes=ds.num_episodes,
                stats=doc["stats"],
            )
        )
    return results


def _file_of_row(ds: Any, offset: int, row: int) -> Any:
    """The data file of row `row` of a table whose first row is dataset row `offset` (error messages only)."""
    return ds.file_of_row(offset + row) if hasattr(ds, "file_of_row") else ds.root


def episode_counts(episode_index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(episode ids, frames of each) of a column sorted by episode."""
    if not episode_index.size:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    starts = np.concatenate([[0], np.flatnonzero(episode_index[1:] != episode_index[:-1]) + 1])
    return episode_index[starts].astype(np.int64), np.diff(np.append(starts, episode_index.size)).astype(np.int64)


STREAM_ROWS = 1 << 20
"""Stage 1 computes (and writes, one row group each) whole data files in batches of about this many rows."""


class FilesInterleaveError(Exception):
    """A data file holds an episode at or below one of the previous file's: rows must be sorted whole."""


def streamed_frames(ds: Any, columns: list[str]) -> Iterator[pa.Table]:
    """The dataset's `columns` in batches of whole data files (about STREAM_ROWS rows each), each
    file read once (`Dataset.iter_file_batches`). Valid when each file's episode_index range lies
    strictly above the previous file's (lerobot's v2.1 and v3.0 layouts): then each batch sorted is
    the next part of the sorted whole. Raises FilesInterleaveError as soon as that fails."""
    prev = None
    for table, rows in ds.iter_file_batches(columns, min_rows=STREAM_ROWS):
        nonempty = rows > 0
        if nonempty.any():
            ep = table.column("episode_index").to_numpy()
            starts = (np.cumsum(rows) - rows)[nonempty]
            lo, hi = np.minimum.reduceat(ep, starts), np.maximum.reduceat(ep, starts)
            if (lo[1:] <= hi[:-1]).any() or (prev is not None and lo[0] <= prev):
                raise FilesInterleaveError(str(ds.root))
            prev = hi[-1]
        yield table
