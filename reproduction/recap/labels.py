"""Stage 3's label extras: hold frames (forced positive) and label quality against known-harmful frames.

Hold labels (DEMO_LAB.md 4; not upstream's): in a successful episode, every frame from its first
success on is "holding the object at the goal". Their N-step advantage says little (the return
window is flat and V saturates), so thresholding them with the rest labels a random part of the
holding behaviour negative and teaches the policy to drift off the goal. With `hold_labels` stage 3
labels them positive and leaves them out of the threshold, so the top-q quantile is taken over the
frames where progress is still being made.

Label quality: with simulator data that marks harmful-but-recoverable frames (`sim.harm`: detours,
regrasps, hesitations inside successful episodes), a good labelling makes those frames positive far
less often than the clean frames of successful episodes. Held-out value Spearman did not tell good
value recipes from bad ones (DEMO_LAB.md 3); this measures what the policy will actually be taught.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def hold_frames(episode_index: np.ndarray, is_success: np.ndarray) -> np.ndarray:
    """bool per row: at or after its episode's first success, in an episode that ends in success.

    Rows must be sorted by (episode, frame). `is_success` is each frame's flag; an episode's outcome
    is its last row's flag (RLinf's rule), so an episode that touched the goal and left holds nothing.
    """
    ep = np.asarray(episode_index)
    ok = _flags(is_success)
    n = ep.size
    if n == 0:
        return np.zeros(0, bool)
    start = np.flatnonzero(np.r_[True, ep[1:] != ep[:-1]])
    end = np.r_[start[1:], n]
    # reached[t]: some frame of t's episode up to t succeeded (a cumulative OR restarted per episode).
    seen = np.cumsum(ok)
    before = np.repeat(np.r_[0, seen[start[1:] - 1]], end - start)
    reached = seen - before > 0
    ends_ok = np.repeat(ok[end - 1], end - start)
    return reached & ends_ok


def _flags(is_success: np.ndarray) -> np.ndarray:
    """Success flags as bool: bool, or 0/1 (as stage 1 and `frame_flags` read them: returns.success_flags).
    Raises ValueError for NaN or any other value, which bool() would count as a success."""
    v = np.asarray(is_success)
    if v.dtype == bool:
        return v
    if not ((v == 0) | (v == 1)).all():  # NaN is neither
        raise ValueError("is_success flags must be bool or 0/1; NaN and other values are no outcome")
    return v == 1


def label_quality(
    labels: np.ndarray,
    episode_index: np.ndarray,
    is_success: np.ndarray,
    harm: np.ndarray | None,
) -> dict[str, Any]:
    """Positive rates of a rollout set's labels by kind of frame (rows sorted by (episode, frame)).

    Kinds: `harm` (marked harmful), `clean` (frames of successful episodes before their first
    success and not harmful: the behaviour worth copying), `hold` (from the first success on, in
    successful episodes), `failed` (frames of failed episodes). Returns {"positive_rate": {kind:
    rate or None}, "frames": {kind: count}, "harm_minus_clean": rate difference or None}; without
    `harm` the harm kind is absent and clean includes every pre-success frame.
    """
    lab = np.asarray(labels, dtype=bool)
    ep = np.asarray(episode_index)
    ok = _flags(is_success)
    hold = hold_frames(ep, ok)
    n = ep.size
    start = np.flatnonzero(np.r_[True, ep[1:] != ep[:-1]]) if n else np.zeros(0, np.int64)
    end = np.r_[start[1:], n] if n else np.zeros(0, np.int64)
    succ_ep = np.repeat(ok[end - 1], end - start) if n else np.zeros(0, bool)
    kinds = {"failed": ~succ_ep, "hold": hold}
    bad = np.zeros(n, bool) if harm is None else np.asarray(harm, dtype=bool)
    if harm is not None:
        kinds["harm"] = bad
    kinds["clean"] = succ_ep & ~hold & ~bad

    def rate(mask: np.ndarray) -> float | None:
        return float(lab[mask].mean()) if mask.any() else None

    rates = {k: rate(m) for k, m in kinds.items()}
    rates["all"] = rate(np.ones(n, bool))
    out: dict[str, Any] = {
        "positive_rate": rates,
        "frames": {k: int(m.sum()) for k, m in kinds.items()},
        "harm_minus_clean": None,
    }
    if rates.get("harm") is not None and rates.get("clean") is not None:
        out["harm_minus_clean"] = rates["harm"] - rates["clean"]
    return out


def spearman(x: np.ndarray, y: np.ndarray) -> float | None:
    """Spearman rank correlation with tie-averaged ranks; None for fewer than 2 rows or a constant input."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if x.size < 2:
        return None
    rx, ry = _ranks(x), _ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    den = np.sqrt((rx * rx).sum() * (ry * ry).sum())
    return float((rx * ry).sum() / den) if den > 0 else None


def _ranks(a: np.ndarray) -> np.ndarray:
    """Average ranks (ties share the mean of their positions)."""
    uniq, inv, counts = np.unique(a, return_inverse=True, return_counts=True)
    start = np.cumsum(counts) - counts
    return (start + (counts - 1) / 2.0)[inv]


def frame_flags(ds: Any, episode_index: np.ndarray, frame_index: np.ndarray) -> tuple[np.ndarray | None, ...]:
    """(is_success, harm) of an opened dataset, aligned to the sorted (episode, frame) rows given;
    each None when the dataset has no such column (`is_success`, `sim.harm`).

    Raises DatasetError when the dataset's frames differ from the rows (another dataset version)."""
    from reproduction.errors import DatasetError
    from reproduction.recap.returns import sort_frames, success_flags

    wanted = [c for c in ("is_success", "sim.harm") if c in ds.info.features]
    if "is_success" not in wanted:
        return None, None
    t = ds.frame_table(["episode_index", "frame_index", *wanted])
    e, f = t.column("episode_index").to_numpy(), t.column("frame_index").to_numpy()
    order = sort_frames(e, f)
    order = np.arange(e.size) if order is None else order
    if not (np.array_equal(e[order], episode_index) and np.array_equal(f[order], frame_index)):
        raise DatasetError(f"{ds.root}: the dataset's frames differ from the stage-3 rows", path=ds.root)

    harm = None
    if "sim.harm" in wanted:
        harm = np.asarray(t.column("sim.harm").to_numpy(zero_copy_only=False), dtype=bool).reshape(-1)[order]
    return success_flags(t.column("is_success"), e, f, str(ds.root))[order], harm


def dataset_label_report(table: Any, is_success: np.ndarray | None, harm: np.ndarray | None, fold: np.ndarray) -> dict:
    """Label quality and value fit of one dataset's advantages sidecar (a pyarrow table sorted by
    (episode, frame) with `advantage`, `value_current`, `return`): label_quality by kind of frame
    (when the dataset records is_success), and the Spearman of V against the return per
    cross-fitting fold (each fold's frames are valued by the model that never saw them)."""
    labels = np.asarray(table.column("advantage").to_numpy(zero_copy_only=False), dtype=bool)
    values = table.column("value_current").to_numpy()
    returns = table.column("return").to_numpy()
    out: dict[str, Any] = {
        "value_spearman_per_fold": {
            str(int(k)): spearman(values[fold == k], returns[fold == k]) for k in np.unique(fold)
        },
        "value_spearman": spearman(values, returns),
    }
    if is_success is not None:
        out.update(label_quality(labels, table.column("episode_index").to_numpy(), is_success, harm))
    return out


def format_report(name: str, doc: dict[str, Any]) -> str:
    """One line a person reads: positive rates by kind and the per-fold Spearman."""
    rates = doc.get("positive_rate") or {}
    kinds = ", ".join(f"{k} {v:.2f}" for k, v in rates.items() if v is not None)
    folds = ", ".join(f"{v:.2f}" if v is not None else "-" for v in doc["value_spearman_per_fold"].values())
    return f"{name}: positive rate {kinds or '-'}; value spearman per fold {folds}"
