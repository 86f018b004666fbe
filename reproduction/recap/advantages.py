"""Stage 3 math: N-step advantages from per-frame values, thresholds and labels, RLinf's sidecar.

For rows sorted by (episode, frame), t a row, E its episode's end (exclusive), N the lookahead:
    k = min(N, E - t); pad = t + N >= E; V_next = 0 if pad else V[t + N]
    gamma == 1:  R = G_t if pad else G_t - G_{t+N}          (sidecar returns)
    otherwise:   R = sum_{j<k} gamma^j r_{t+j}              (sidecar rewards)
    A = rr.scale_rewards(R) + g * V_next - V_t,  g = gamma^k (1 if not discount_next_value)
V is in value space; `rr` is the ReturnRange stored with the value checkpoint (the export folder's
value_head.json; never recomputed). Inputs stream from the returns sidecar in chunks of whole
episodes (advantage_inputs.py); only the aligned values and the advantages are held whole.
Labels: A >= tau, tau = percentile(A, (1 - positive_quantile) * 100) over all datasets (global) or
per task (`threshold_scope="per_task"`); sft datasets are labelled positive (their A still count).
With `hold_labels`, an input's hold frames (`hold`, recap/labels.py) are labelled positive and left
out of the percentile.

Run through `portable run --stages advantages` (reproduction/recipes/recap/recipe.py). N is
`advantages.lookahead` (>= 1; 0 is refused, never replaced by a default); value inference extends
its shards by the same N. `relabel` re-thresholds or recomputes existing sidecars (a function).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from reproduction.errors import ConfigError, DatasetError
from reproduction.recap.advantage_config import THRESHOLD_SCOPES, AdvantageConfig  # noqa: F401 (re-exported)
from reproduction.recap.advantage_inputs import (  # noqa: F401 (load_dataset_arrays re-exported)
    VALUES_HINT,
    DatasetArrays,
    SidecarInputs,
    load_dataset_arrays,
    refuse_non_finite,
)
from reproduction.recap.normalize import ReturnRange
from reproduction.recap.returns import discounted_reverse_cumsum, repeat_strings, sort_frames
from reproduction.value_export import EXPORT_FORMAT, HEAD_NAME, ValueHead, read_value_head

VALUE_HEAD_NAME = HEAD_NAME
"""The value export's metadata file (reproduction/value_export.py)."""
VALUE_HEAD_FORMAT = EXPORT_FORMAT
"""Its format_version."""


def nstep_advantages(
    row_end: np.ndarray | None,
    returns: np.ndarray,
    rewards: np.ndarray,
    values: np.ndarray,
    *,
    lookahead: int,
    gamma: float,
    discount_next_value: bool,
    return_range: ReturnRange,
    use_return_shortcut: bool = True,
    episode_end: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """The N-step advantage of every row (rows sorted by episode, frame; see the module docstring).

    `row_end[t]` is the exclusive end of row t's episode; or pass `episode_end`, the exclusive end
    of each episode in order (then `row_end` may be None: it is built only where gamma != 1 needs it).
    Returns float64 arrays advantage_continuous, value_next, reward_sum, reward_sum_raw and int64
    num_valid_rewards.
    """
    N = lookahead
    v = np.asarray(values, dtype=np.float64)
    n = v.size
    ends = _episode_ends_of(row_end) if episode_end is None else np.asarray(episode_end, dtype=np.int64)
    # Work per episode, not per row: only the last N rows of each episode are special (padded).
    padded, padded_end = _last_rows(ends, N)  # t + N >= end: V(t+N) is past the episode (padded with 0)
    # Each full-size output is allocated once and written once (at 1M rows, fresh 8 MB arrays and
    # extra passes cost more than the arithmetic).
    k = np.full(n, N, dtype=np.int64)  # frames in the window: N, fewer only on padded rows
    k[padded] = padded_end - padded
    v_next = _ahead(v, N, padded)
    if gamma == 1.0 and use_return_shortcut:
        r_raw = _return_differences(np.asarray(returns, dtype=np.float64), N, padded)
    else:
        if row_end is None:
            row_end = np.repeat(ends, np.diff(ends, prepend=0))
        r_raw = window_sums(np.asarray(rewards, dtype=np.float64), k, gamma, row_end)
    r_norm = return_range.scale_rewards(r_raw)
    if gamma == 1.0 or not discount_next_value:
        adv = np.add(r_norm, v_next)  # g = 1
    else:
        adv = np.array([gamma**j for j in range(N + 1)])[k]  # gamma^k from a table
        adv *= v_next
        np.add(r_norm, adv, out=adv)
    adv -= v
    return {
        "advantage_continuous": adv,
        "value_next": v_next,
        "reward_sum": r_norm,
        "reward_sum_raw": r_raw,
        "num_valid_rewards": k,
    }


def _episode_ends_of(row_end: np.ndarray) -> np.ndarray:
    """The exclusive end of each episode, in order, from the per-row ends (sorted rows)."""
    n = row_end.size
    if n == 0:
        return np.zeros(0, np.int64)
    return row_end[np.append(np.flatnonzero(row_end[1:] != row_end[:-1]), n - 1)].astype(np.int64)


def _last_rows(ends: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """(sorted indices of the last `count` rows of every episode (all rows of shorter ones), the
    end of each one's episode), from the per-episode ends: work per episode only."""
    if ends.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    starts = np.concatenate([[0], ends[:-1]])
    first = np.maximum(ends - count, starts)
    sizes = ends - first
    rows = np.repeat(first - (np.cumsum(sizes) - sizes), sizes) + np.arange(int(sizes.sum()), dtype=np.int64)
    return rows, np.repeat(ends, sizes)


def _ahead(x: np.ndarray, n_ahead: int, padded: np.ndarray) -> np.ndarray:
    """x[t + n_ahead] per row, 0 at the `padded` rows (where t + n_ahead is past t's episode):
    a shifted copy plus a small scatter, not a gather."""
    out = np.empty_like(x)
    m = max(x.size - n_ahead, 0)
    out[:m] = x[n_ahead:]
    out[m:] = 0.0  # always padded rows: past the last episode's end
    out[padded] = 0.0
    return out


def _return_differences(g: np.ndarray, n_ahead: int, padded: np.ndarray) -> np.ndarray:
    """G_t - G_{t+n_ahead} per row, G_t itself at the `padded` rows: one subtraction pass into the
    output, then the padded rows (past the episode's end) overwritten."""
    out = np.empty_like(g)
    m = max(g.size - n_ahead, 0)
    np.subtract(g[:m], g[n_ahead:], out=out[:m])
    out[m:] = g[m:]  # always padded rows: past the last episode's end
    out[padded] = g[padded]
    return out


WINDOW_ADDS_MAX = 64
"""Up to this N the window sum is N shifted adds (the loop's own order); beyond, a log-depth scan."""


def window_sums(rewards: np.ndarray, k: np.ndarray, gamma: float, row_end: np.ndarray) -> np.ndarray:
    """R_t = sum_{j < k_t} gamma^j r_{t+j} for every row; k_t = min(N, frames to the episode's end).

    For N <= WINDOW_ADDS_MAX: term j is added in order j = 0, 1, ... with gamma ** j, the exact
    arithmetic of a per-frame loop. Beyond: discounted tails, D_t - gamma^k D_{t+k} (stable: every
    factor <= 1).
    """
    n = rewards.size
    lookahead = int(k.max(initial=0))
    if lookahead > WINDOW_ADDS_MAX:
        d = discounted_reverse_cumsum(rewards, row_end, gamma)
        idx = np.arange(n, dtype=np.int64)
        inside = idx + k < row_end  # the window stops before the episode's end
        d_after = np.where(inside, d[np.minimum(idx + k, max(n - 1, 0))] if n else d, 0.0)
        return d - np.power(gamma, k) * d_after
    out = rewards.copy()
    for j in range(1, lookahead):
        term = rewards[j:] * (gamma**j)
        term[k[: n - j] <= j] = 0.0  # r_{t+j} lies past t's episode
        out[: n - j] += term
    return out


def quantile_threshold(advantages: np.ndarray, positive_quantile: float) -> float:
    """tau such that about `positive_quantile` of the frames have A >= tau: numpy's linear percentile
    at (1 - positive_quantile) * 100, bit for bit (see exact_percentile)."""
    if advantages.size == 0:
        raise DatasetError("no advantages to threshold (all datasets are empty)")
    return exact_percentile(advantages, (1.0 - positive_quantile) * 100.0)


EXACT_PERCENTILE_MIN = 65_536
"""Below this many values exact_percentile is plain np.percentile (the bracket would not pay off)."""


def exact_percentile(a: np.ndarray, q: float, *, sample: int = 16_384) -> float:
    """np.percentile(a, q) (linear method), without partitioning all of `a`.

    The two order statistics it interpolates are bracketed by a strided sample of about `sample`
    values; only the values inside the bracket are partitioned. Falls back to np.percentile for
    small arrays, NaNs, or a bracket that misses (then the result is the same, only slower).
    """
    a = np.asarray(a, dtype=np.float64)
    n = a.size
    if n < EXACT_PERCENTILE_MIN:
        return float(np.percentile(a, q))
    quantile = np.true_divide(q, 100)
    virtual = (n - 1) * quantile  # numpy's linear method, computed the same way
    lo = int(np.floor(virtual))
    picks = np.sort(a[:: max(n // sample, 1)])
    m = picks.size
    margin = int(4 * np.sqrt(m * quantile * (1 - quantile))) + 2  # many binomial sigmas of slack
    j = int(quantile * (m - 1))
    low = picks[j - margin] if j - margin >= 0 else -np.inf
    high = picks[j + margin] if j + margin < m else np.inf
    if np.isnan(a.max()):
        return float(np.percentile(a, q))  # numpy's answer is nan; let it say so
    keep = a >= low
    below = n - int(np.count_nonzero(keep))
    keep &= a <= high
    inside = a[keep]
    hi = min(lo + 1, n - 1)
    if not (below <= lo and hi < below + inside.size):
        return float(np.percentile(a, q))
    # One kth, then the next order statistic is the smallest value after it: partitioning for two
    # kths at once costs several times more.
    inside.partition(lo - below)
    v_lo = inside[lo - below]
    v_hi = inside[lo - below + 1 :].min() if hi > lo else v_lo
    t = virtual - np.floor(virtual)
    diff = np.subtract(v_hi, v_lo)
    return float(v_hi - diff * (1 - t) if t >= 0.5 else v_lo + diff * t)  # numpy's _lerp


def thresholds_by_task(
    advantages: np.ndarray, task_keys: np.ndarray | None, positive_quantile: float, scope: str
) -> tuple[np.ndarray, dict[str, float]]:
    """Per-row threshold and the table of thresholds ({"*": tau} when global, {task: tau} per task)."""
    if scope == "global" or task_keys is None:
        return _thresholds(advantages, None, None, positive_quantile, "global")
    uniq, inv = factorize(task_keys)
    return _thresholds(advantages, inv, uniq, positive_quantile, scope)


def _thresholds(
    advantages: np.ndarray, codes: np.ndarray | None, names: np.ndarray | None, positive_quantile: float, scope: str
) -> tuple[np.ndarray, dict[str, float]]:
    """thresholds_by_task with the task keys given as codes into `names`; tables keyed by name, sorted."""
    if scope == "global" or codes is None:
        tau = quantile_threshold(advantages, positive_quantile)
        return np.broadcast_to(np.float64(tau), advantages.shape), {"*": tau}  # a read-only view, no 8 MB fill
    taus = np.full(len(names), np.nan)
    for i in np.unique(codes):
        taus[i] = quantile_threshold(advantages[codes == i], positive_quantile)
    present = sorted((str(names[i]), float(taus[i])) for i in np.unique(codes))
    return taus[codes], dict(present)


def factorize(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(keys, return_inverse=True) for string keys, hashed by pyarrow instead of sorting
    a million Python strings: (sorted unique keys as an object array, int64 code per row)."""
    if keys.dtype != object:
        return np.unique(keys, return_inverse=True)
    enc = pa.array(keys, pa.string()).dictionary_encode()
    names = np.asarray(enc.dictionary.to_pylist(), dtype=object)
    order = np.argsort(names)
    rank = np.empty(order.size, np.int64)
    rank[order] = np.arange(order.size)
    return names[order], rank[enc.indices.to_numpy(zero_copy_only=False)]


def label(advantages: np.ndarray, row_threshold: np.ndarray, dataset_type: str) -> np.ndarray:
    """A >= tau, except sft datasets which are all positive (RLinf's rule, kept in relabel too)."""
    if dataset_type == "sft":
        return np.ones(advantages.size, dtype=bool)
    return advantages >= row_threshold


def positive_fractions(labels: np.ndarray, tasks: np.ndarray) -> dict[str, Any]:
    """{"all": fraction, "per_task": {task: fraction}} of positive labels."""
    uniq, inv = factorize(tasks) if labels.size else (np.zeros(0, object), np.zeros(0, np.int64))
    return _fractions(labels, inv, uniq)


def _fractions(labels: np.ndarray, codes: np.ndarray, names: np.ndarray) -> dict[str, Any]:
    """positive_fractions with the tasks given as codes into `names`; per_task sorted by name."""
    out: dict[str, Any] = {"all": float(labels.mean()) if labels.size else 0.0, "per_task": {}}
    if labels.size:
        pos = np.bincount(codes, weights=labels.astype(np.float64), minlength=len(names))
        cnt = np.bincount(codes, minlength=len(names))
        out["per_task"] = dict(sorted((str(names[i]), float(pos[i] / cnt[i])) for i in np.flatnonzero(cnt)))
    return out


# -- value checkpoint metadata ------------------------------------------------------------------------


def load_return_range(source: ReturnRange | ValueHead | Path | str) -> tuple[ReturnRange, str | None]:
    """(ReturnRange, value-checkpoint fingerprint) from a ReturnRange, a read ValueHead, or a value
    export folder (read with the one torch-free reader, reproduction/value_export.py)."""
    if isinstance(source, ReturnRange):
        return source, None
    head = source if isinstance(source, ValueHead) else read_value_head(Path(source))
    return head.return_range, head.fingerprint


# -- thresholds, labels and sidecars --------------------------------------------------------------------


@dataclass(kw_only=True, slots=True)
class AdvantageReport:
    """What stage 3 (or relabel) wrote, with the figures a person checks."""

    thresholds: dict[str, float]
    positive_fraction: dict[str, dict[str, Any]]
    sidecars: list[Path]

    def to_dict(self) -> dict[str, Any]:
        return {
            "thresholds": self.thresholds,
            "positive_fraction": self.positive_fraction,
            "sidecars": [str(p) for p in self.sidecars],
        }


KEEP_ROWS = 1 << 21
"""Up to this many rows (all datasets together) stage 3 keeps its first pass's inputs and results for
the second (about 150 bytes a row) instead of reading and computing them again; beyond, it streams
twice so memory stays bounded (bench/memory_10m.py)."""

Results = Callable[[Any], Iterator[tuple[DatasetArrays, dict[str, np.ndarray]]]]
"""results(d) -> (chunk, nstep outputs) for each chunk of dataset input d, the same on every call."""


def label_and_write(
    inputs: Sequence[DatasetArrays | SidecarInputs],
    results: Results,
    *,
    config: AdvantageConfig,
    return_range: ReturnRange,
    value_fingerprint: str | None,
    out_dirs: Sequence[Path],
) -> AdvantageReport:
    """Threshold all datasets together, label, and write advantages_{tag}.parquet + mixture_config.yaml.

    Two passes over each input's chunks: continuous advantages and task keys first (held whole,
    8 + 4 bytes a frame), then labels and the sidecar, written chunk by chunk. Inputs of up to
    KEEP_ROWS rows in all are read and computed once, their chunks kept between the passes.
    """
    from reproduction.recap.sidecars import sidecar_name, write_mixture_config, write_sidecar

    parts, keys, holds, names, sizes, mixture = [], [], [], {}, [], []
    kept: dict[int, list[tuple[DatasetArrays, dict[str, np.ndarray]]]] = {}
    budget = KEEP_ROWS
    for i, d in enumerate(inputs):
        lo, hi, n = np.inf, -np.inf, 0
        keep = d.num_rows <= budget  # small enough to hold: the second pass reuses the first's chunks
        if keep:
            kept[i], budget = [], budget - d.num_rows
        for chunk, r in results(d):
            if keep:
                kept[i].append((chunk, r))
            parts.append(r["advantage_continuous"])
            keys.append(_codes(chunk, names))
            holds.append(_hold(chunk, config))
            n += chunk.num_rows
            if chunk.num_rows:
                lo, hi = min(lo, float(chunk.returns.min())), max(hi, float(chunk.returns.max()))
        sizes.append(n)
        if n:
            mixture.append({"name": d.name, "weight": 1.0, "return_min": lo, "return_max": hi})
    all_a = np.concatenate(parts) if len(parts) != 1 else parts[0]
    all_k = np.concatenate(keys) if len(keys) != 1 else keys[0]
    all_h = np.concatenate(holds) if holds else np.zeros(0, bool)
    del parts, keys, holds
    task_names = np.array(sorted(names, key=names.get), dtype=object)
    row_tau, taus = _held_out_thresholds(all_a, all_k, all_h, task_names, config)
    bounds = np.cumsum([0] + sizes)
    fractions, written = {}, []
    for i, d in enumerate(inputs):
        rows = slice(bounds[i], bounds[i + 1])
        labels = label(all_a[rows], row_tau[rows], d.dataset_type) | all_h[rows]
        fractions[d.name] = _fractions(labels, all_k[rows], task_names)
        meta = {
            "kind": "advantages",
            "tag": config.tag,
            "dataset": d.name,
            "dataset_type": d.dataset_type,
            "dataset_fingerprint": d.fingerprints.get("dataset"),
            "returns_fingerprint": d.fingerprints.get("returns"),
            "value_checkpoint_fingerprint": value_fingerprint,
            "return_range": return_range.to_dict(),
            "params": asdict(config),
            "thresholds": taus,
            "positive_fraction": fractions[d.name],
            "hold_frames": int(all_h[rows].sum()),
        }
        tables = _advantage_tables(iter(kept.pop(i)) if i in kept else results(d), row_tau[rows], config)
        written.append(write_sidecar(Path(out_dirs[i]) / sidecar_name("advantages", config.tag), tables, meta))
        write_mixture_config(
            Path(out_dirs[i]),
            return_range=(return_range.return_min, return_range.return_max),
            datasets=mixture,
            tag=config.tag,
            threshold=taus.get("*", float("nan")),
            positive_quantile=config.positive_quantile,
            extra=None if config.threshold_scope == "global" else {"per_task_thresholds": taus},
        )
    return AdvantageReport(thresholds=taus, positive_fraction=fractions, sidecars=written)


def _hold(chunk: DatasetArrays, config: AdvantageConfig) -> np.ndarray:
    """The chunk's hold frames when hold labels are on (all False when off or not given)."""
    if not config.hold_labels or chunk.hold is None:
        return np.zeros(chunk.num_rows, bool)
    return np.asarray(chunk.hold, dtype=bool)


def _held_out_thresholds(
    advantages: np.ndarray, codes: np.ndarray, hold: np.ndarray, names: np.ndarray, config: AdvantageConfig
) -> tuple[np.ndarray, dict[str, float]]:
    """_thresholds over the frames that are not hold frames; every row gets its task's threshold."""
    if not hold.any():
        return _thresholds(advantages, codes, names, config.positive_quantile, config.threshold_scope)
    rest = ~hold
    if not rest.any():
        raise DatasetError("hold labels: every frame is a hold frame, nothing is left to threshold")
    _, taus = _thresholds(advantages[rest], codes[rest], names, config.positive_quantile, config.threshold_scope)
    if config.threshold_scope == "global":
        return np.broadcast_to(np.float64(taus["*"]), advantages.shape), taus
    # A task whose every frame holds has no threshold: its frames are all positive anyway.
    table = np.array([taus.get(str(name), np.inf) for name in names], dtype=np.float64)
    return table[codes], taus


def _advantage_tables(
    chunks: Iterator[tuple[DatasetArrays, dict[str, np.ndarray]]], row_tau: np.ndarray, config: AdvantageConfig
) -> Iterator[pa.Table]:
    """RLinf's advantages table, one per chunk, labelled against the rows' thresholds (hold frames positive)."""
    offset = 0
    for d, r in chunks:
        n = d.num_rows
        labels = label(r["advantage_continuous"], row_tau[offset : offset + n], d.dataset_type) | _hold(d, config)
        offset += n
        yield pa.table(
            {
                "episode_index": pa.array(d.episode_index, pa.int64()),
                "frame_index": pa.array(d.frame_index, pa.int64()),
                "advantage_continuous": pa.array(r["advantage_continuous"]),
                "return": pa.array(d.returns),
                "value_current": pa.array(d.values),
                "value_next": pa.array(r["value_next"]),
                "reward_sum": pa.array(r["reward_sum"]),
                "reward_sum_raw": pa.array(r["reward_sum_raw"]),
                "num_valid_rewards": pa.array(r["num_valid_rewards"]),
                "dataset_name": repeat_strings([d.name], np.zeros(n, np.int64)),
                "advantage": pa.array(labels),
            }
        )


def _codes(chunk: DatasetArrays, names: dict[str, int]) -> np.ndarray:
    """int32 task codes for the chunk's prompts, numbering new task strings into `names` as they appear."""
    uniq, inv = chunk.prompt_codes if chunk.prompt_codes is not None else factorize(chunk.prompts)
    ids = np.array([names.setdefault(str(u), len(names)) for u in uniq], dtype=np.int32)
    return ids[inv] if ids.size else np.zeros(0, np.int32)


def compute_advantages(
    inputs: Sequence[DatasetArrays | SidecarInputs],
    config: AdvantageConfig,
    return_range: ReturnRange | Path | str,
    *,
    out_dirs: Sequence[Path],
) -> AdvantageReport:
    """Stage 3 from given per-frame values: advantages, thresholds, labels, sidecars.

    `inputs` are in memory (DatasetArrays) or streamed from the returns sidecar (SidecarInputs,
    from `load_dataset_arrays`). `return_range` is the ReturnRange from the value checkpoint (or
    the checkpoint folder holding it); `out_dirs[i]` receives dataset i's files. The gamma == 1
    shortcut through returns is used only when the returns sidecar was itself computed with gamma 1.
    """
    rr, value_fp = load_return_range(return_range)

    def results(d: DatasetArrays | SidecarInputs) -> Iterator[tuple[DatasetArrays, dict[str, np.ndarray]]]:
        if isinstance(d, DatasetArrays):  # SidecarInputs' values were checked as they were aligned
            refuse_non_finite(d.values, d.episode_index, d.frame_index, what=f"{d.name}: the values", hint=VALUES_HINT)
        for c in d.chunks():
            yield (
                c,
                nstep_advantages(
                    None,
                    c.returns,
                    c.rewards,
                    c.values,
                    lookahead=config.lookahead,
                    gamma=config.gamma,
                    discount_next_value=config.discount_next_value,
                    return_range=rr,
                    use_return_shortcut=c.returns_gamma in (None, 1.0),
                    episode_end=c.episode_end,
                ),
            )

    return label_and_write(
        inputs, results, config=config, return_range=rr, value_fingerprint=value_fp, out_dirs=out_dirs
    )


def _dataset_prompts(ds: Any, episode_index: np.ndarray, frame_index: np.ndarray) -> np.ndarray:
    """Task strings for sorted (episode, frame) rows, from the dataset's own task_index column."""
    t = ds.frame_table(["episode_index", "frame_index", "task_index"])
    e, f = t.column("episode_index").to_numpy(), t.column("frame_index").to_numpy()
    order = sort_frames(e, f)
    if order is None:
        order = slice(None)
    if not (np.array_equal(e[order], episode_index) and np.array_equal(f[order], frame_index)):
        raise DatasetError(f"{ds.root}: the advantages sidecar's frames differ from the dataset's")
    names = np.asarray(
        [ds.tasks.get(int(i), "perform the task") for i in range(max(ds.tasks, default=-1) + 1)] or [""], dtype=object
    )
    return names[t.column("task_index").to_numpy()[order]]


def relabel(
    datasets: Sequence[Path],
    source: Path,
    *,
    source_tag: str | None,
    config: AdvantageConfig,
    recompute: bool,
    out: Path | None,
    in_dataset: bool = False,
    types: Sequence[str] | None = None,
    returns_location: Path | None = None,
) -> AdvantageReport:
    """Re-threshold (or, with `recompute`, recompute from stored values) existing advantage sidecars.

    Reads `advantages_{source_tag}.parquet` of each dataset under `source` (fingerprint-checked
    against the dataset), keeps the sft-positive rule (type from the sidecar unless `types` says),
    and writes `advantages_{config.tag}` to `out/<name>/` (or `<dataset>/meta/`). Recompute uses
    the stored value_current and return range plus the returns sidecar's rewards (from
    `returns_location`, default `source`); no model, and no data parquet is ever rewritten.
    """
    from reproduction.data.reader import open_dataset
    from reproduction.recap.sidecars import read_sidecar

    if not in_dataset and out is None:
        raise ConfigError("relabel: no output folder given", field="out", hint="pass out=<folder> (or in_dataset=True)")
    if (
        config.tag == source_tag
        and not in_dataset
        and out is not None
        and Path(out).resolve() == Path(source).resolve()
    ):
        raise ConfigError(
            f"relabel would overwrite its source tag {source_tag!r}",
            field="new_tag",
            hint="give the new labels a tag (config.tag) other than source_tag, or another out folder",
        )
    inputs, results, value_fps, ranges, out_dirs = [], [], set(), set(), []
    for i, path in enumerate(datasets):
        ds = open_dataset(path)
        table, meta = read_sidecar(
            source, "advantages", source_tag, expect_fingerprint=ds.fingerprint, dataset_name=ds.name
        )
        dtype = types[i] if types else meta.get("dataset_type", "rollout")
        rr_doc = meta.get("return_range")
        if rr_doc is None:
            raise DatasetError(
                f"{ds.name}: the source advantages sidecar stores no return range",
                hint="recompute stage 3 with this tool first",
            )
        ranges.add((rr_doc["return_min"], rr_doc["return_max"]))
        value_fps.add(meta.get("value_checkpoint_fingerprint"))
        ep, fr = table.column("episode_index").to_numpy(), table.column("frame_index").to_numpy()
        d = DatasetArrays(
            name=ds.name,
            dataset_type=dtype,
            episode_index=ep,
            frame_index=fr,
            returns=table.column("return").to_numpy().astype(np.float64),
            rewards=np.zeros(ep.size),
            values=table.column("value_current").to_numpy(),
            prompts=_dataset_prompts(ds, ep, fr),
            fingerprints={"dataset": ds.fingerprint},
        )
        kept = "value_current" if recompute else "advantage_continuous"  # what the threshold is taken from
        refuse_non_finite(
            table.column(kept).to_numpy(),
            ep,
            fr,
            what=f"{ds.name}: the source advantages sidecar's {kept}",
            hint="the sidecar was edited or written by a run whose value model diverged: compute stage 3 again",
        )
        if recompute:
            rtable, rmeta = read_sidecar(
                returns_location or source,
                "returns",
                config.returns_tag,
                expect_fingerprint=ds.fingerprint,
                dataset_name=ds.name,
            )
            if not (
                np.array_equal(rtable.column("episode_index").to_numpy(), ep)
                and np.array_equal(rtable.column("frame_index").to_numpy(), fr)
            ):
                raise DatasetError(f"{ds.name}: returns and advantages sidecars cover different frames")
            d.rewards = rtable.column("reward").to_numpy().astype(np.float64)
            d.returns = rtable.column("return").to_numpy().astype(np.float64)
            d.returns_gamma = (rmeta.get("params") or {}).get("gamma")
            results.append(
                nstep_advantages(
                    None,
                    d.returns,
                    d.rewards,
                    d.values,
                    lookahead=config.lookahead,
                    gamma=config.gamma,
                    discount_next_value=config.discount_next_value,
                    return_range=ReturnRange.from_dict(rr_doc),
                    use_return_shortcut=d.returns_gamma in (None, 1.0),
                    episode_end=d.episode_end,
                )
            )
        else:
            results.append(
                {
                    c: table.column(c).to_numpy()
                    for c in ("advantage_continuous", "value_next", "reward_sum", "reward_sum_raw", "num_valid_rewards")
                }
            )
        inputs.append(d)
        out_dirs.append(ds.root / "meta" if in_dataset else Path(out) / ds.name)
    if len(ranges) != 1:
        raise DatasetError(
            f"source sidecars were computed with different return ranges: {sorted(ranges)}",
            hint="relabel datasets of one stage-3 run together",
        )
    rr = ReturnRange.from_dict(rr_doc)  # all datasets share it (checked above)
    by_input = {id(d): r for d, r in zip(inputs, results)}  # relabel holds each dataset in memory: one chunk
    return label_and_write(
        inputs,
        lambda d: iter([(d, by_input[id(d)])]),
        config=config,
        return_range=rr,
        value_fingerprint=next(iter(value_fps)) if len(value_fps) == 1 else None,
        out_dirs=out_dirs,
    )
