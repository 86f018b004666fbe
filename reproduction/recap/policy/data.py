"""Policy training data: datasets opened once with their advantage labels, action chunks, samples and batches.

`open_policy_input` opens one dataset and, when the mode conditions on advantages, joins the stage-3
sidecar (`advantages_{tag}.parquet`, fingerprint checked) by (episode_index, frame_index): a frame
without a label is an error, never a default. `build_arrays` turns the opened inputs into flat numpy
arrays (one row per training frame) the workers read from the stage folder:

    state      float32 (N, S)    observation.state ++ observation.goal (raw; normalised by the model's stats), or
                                 the features `state_keys` names, concatenated, then the components `state_dims`
    chunk      int64   (N, H)    rows of `action` holding a_t .. a_{t+H-1}; past the episode end the last
                                 action repeats (LeRobot's edge padding, as upstream)
    action     float32 (M, A)    every frame's action (M >= N: filtered frames still give chunk targets)
    label      bool    (N,)      advantage label; sft frames True; with `hold_labels` also True from the first
                                 success frame on in successful episodes (DEMO_LAB 4)
    task_id    int64   (N,)      index into `tasks`
    source, row, episode, frame  where the frame came from (images are read by (source, row))

Modes: `recap` and `bc` keep every frame; `filtered_bc` keeps the frames of successful episodes
(an episode's outcome is its last row's `is_success`; an sft set without the column counts as all
successes). A rollout set must have `is_success` in every mode (DatasetError otherwise).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from reproduction.errors import DatasetError
from reproduction.recap.finite import refuse_non_finite
from reproduction.recap.sources import DATASET_TYPES, DatasetSource  # noqa: F401 (DATASET_TYPES re-exported)

STATE_KEY, GOAL_KEY, ACTION_KEY = "observation.state", "observation.goal", "action"


@dataclass(kw_only=True, slots=True)
class PolicySource(DatasetSource):
    """One dataset the policy stage trains on (sft: always labelled positive; rollout: labels from the advantage
    sidecar, needs is_success)."""

    WHAT: ClassVar[str] = "policy dataset entry"
    type: str = "rollout"
    """sft or rollout."""
    advantages: str | None = None
    """Folder holding the advantage sidecar (a run's advantages/ folder); None = the dataset's meta/."""


@dataclass(kw_only=True)
class PolicyInput:
    """One opened dataset: its frames' key columns and (when conditioning) its labels, row-aligned."""

    source: PolicySource
    dataset: Any
    """reproduction.data.reader.Dataset (opened once by the caller)."""
    episode: np.ndarray
    frame: np.ndarray
    task_index: np.ndarray
    state: np.ndarray
    """float32 (n, S): observation.state ++ observation.goal."""
    action: np.ndarray
    is_success: np.ndarray | None
    labels: np.ndarray | None
    """Advantage label per row (None when not read)."""
    fingerprint: str

    def __len__(self) -> int:
        return int(self.episode.size)


def open_policy_input(
    source: PolicySource,
    *,
    need_labels: bool,
    dataset: Any = None,
    state_keys: Sequence[str] = (),
    state_dims: Sequence[int] | None = None,
) -> PolicyInput:
    """Open `source` (or use the already opened `dataset`) and read what the policy needs. The state is
    observation.state ++ observation.goal (when the dataset has it), or with `state_keys` those features
    concatenated, then the components `state_dims` (e.g. LIBERO's privileged observation.object_state on CPU).

    Raises DatasetError (exit 40) when a rollout set has no `is_success`, a needed column is
    missing, a state component it reads or the action is NaN or inf (naming the feature and the first episode and
    frame), or a frame has no advantage label; FingerprintMismatchError (41) when the sidecar was
    computed from another version of the dataset; InputNotFoundError when the sidecar is missing.
    """
    from reproduction.data.reader import column_to_numpy, open_dataset
    from reproduction.recap.returns import NO_SUCCESS_HINT, success_flags

    ds = dataset if dataset is not None else open_dataset(source.path)
    names = set(ds.info.features)
    if source.type == "rollout" and "is_success" not in ds.key_columns:
        raise DatasetError(
            f"{source.path}: rollout dataset {source.name!r} has no is_success column",
            path=source.path,
            field="is_success",
            hint=NO_SUCCESS_HINT,
        )
    keys = list(state_keys) or [STATE_KEY] + ([GOAL_KEY] if GOAL_KEY in names else [])
    missing = [k for k in keys if k not in names]
    if missing:
        raise DatasetError(
            f"{source.path}: the policy's state feature {missing[0]!r} is not in the dataset",
            path=source.path,
            field="state_keys",
            hint=f"features: {', '.join(ds.info.features)}",
        )
    cols = ["episode_index", "frame_index", "task_index", *keys, ACTION_KEY]
    if "is_success" in ds.key_columns:
        cols.append("is_success")
    table = ds.frame_table(cols)
    feats = ds.info.features
    parts = [column_to_numpy(table.column(k), feats.get(k)).astype(np.float32) for k in keys]
    parts = [p.reshape(len(p), -1) for p in parts]
    state = np.concatenate(parts, axis=1)
    owner = np.repeat(np.arange(len(parts)), [p.shape[1] for p in parts])  # the feature of each component
    if state_dims is not None:
        if max(state_dims) >= state.shape[1]:
            raise DatasetError(
                f"{source.path}: state_dims {list(state_dims)} index past the state's {state.shape[1]} components",
                path=source.path,
                field="state_dims",
            )
        state, owner = np.ascontiguousarray(state[:, list(state_dims)]), owner[list(state_dims)]
    action = column_to_numpy(table.column(ACTION_KEY), feats.get(ACTION_KEY)).astype(np.float32)
    action = action.reshape(len(action), -1)
    # Every frame is checked, kept or not (filtered_bc's dropped frames still give chunk targets): one NaN or inf
    # made the stats NaN, every loss NaN and every step skipped, with exit 0 (audit60_E E1).
    refuse_non_finite(
        ds,
        state,
        owner,
        keys,
        what="the policy's state feature",
        hint="fix or drop those frames in the dataset, or read other components with the policy model's "
        "state_keys / state_dims",
    )
    refuse_non_finite(
        ds,
        action,
        np.zeros(action.shape[1], np.int64),
        [ACTION_KEY],
        what="the policy's action feature",
        hint="fix or drop those frames in the dataset: the policy learns every frame's action",
    )
    episode = table.column("episode_index").to_numpy().astype(np.int64)
    frame = table.column("frame_index").to_numpy().astype(np.int64)
    out = PolicyInput(
        source=source,
        dataset=ds,
        episode=episode,
        frame=frame,
        task_index=table.column("task_index").to_numpy().astype(np.int64),
        state=state,
        action=action,
        is_success=success_flags(table.column("is_success"), episode, frame, str(source.path))
        if "is_success" in cols
        else None,
        labels=None,
        fingerprint=ds.fingerprint,
    )
    if need_labels:
        out.labels = read_labels(source, ds, out.episode, out.frame)
    return out


def read_labels(source: PolicySource, ds: Any, episode: np.ndarray, frame: np.ndarray) -> np.ndarray:
    """Each row's `advantage` from the sidecar, joined by (episode, frame); a missing key is an error."""
    from reproduction.recap.sidecars import read_sidecar

    table, _ = read_sidecar(
        Path(source.advantages) if source.advantages else Path(source.path),
        "advantages",
        source.tag,
        expect_fingerprint=ds.fingerprint,
        dataset_name=ds.name,
        columns=["episode_index", "frame_index", "advantage"],
    )
    a_ep = table.column("episode_index").to_numpy().astype(np.int64)
    a_fr = table.column("frame_index").to_numpy().astype(np.int64)
    a_lab = table.column("advantage").to_numpy(zero_copy_only=False).astype(bool)
    width = int(max(frame.max(initial=0), a_fr.max(initial=0))) + 1
    a_key = a_ep * width + a_fr
    order = np.argsort(a_key, kind="stable")
    key = episode * width + frame
    pos = np.searchsorted(a_key[order], key).clip(0, max(order.size - 1, 0))
    found = (a_key[order][pos] == key) if order.size else np.zeros(key.shape, bool)
    if not found.all():
        bad = int(np.flatnonzero(~found)[0])
        raise DatasetError(
            f"{source.path}: episode {episode[bad]} frame {frame[bad]} has no advantage label in the sidecar "
            f"(tag {source.tag!r}; {int((~found).sum())} frames unlabelled)",
            path=source.path,
            hint="recompute stage 3 for this dataset version (`portable run --restart-stage advantages`)",
        )
    return a_lab[order][pos]


@dataclass(kw_only=True)
class PolicyArrays:
    """The flat training arrays (module docstring); saved as one .npz in the stage folder."""

    state: np.ndarray
    chunk: np.ndarray
    action: np.ndarray
    label: np.ndarray
    task_id: np.ndarray
    source: np.ndarray
    row: np.ndarray
    episode: np.ndarray
    frame: np.ndarray
    tasks: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.state.shape[0])

    def save(self, path: Path) -> None:
        arrays = {k: getattr(self, k) for k in ("state", "chunk", "action", "label", "task_id", "source", "row")}
        arrays.update(episode=self.episode, frame=self.frame, tasks=np.array(self.tasks, dtype=object))
        tmp = Path(path).with_name(f".{Path(path).name}.tmp.npz")
        np.savez(tmp, **arrays)
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> PolicyArrays:
        with np.load(path, allow_pickle=True) as z:
            data = {k: z[k] for k in z.files}
        tasks = [str(t) for t in data.pop("tasks").tolist()]
        return cls(**data, tasks=tasks)


def build_arrays(
    inputs: Sequence[PolicyInput], *, mode: str, chunk: int, hold_labels: bool = False
) -> tuple[PolicyArrays, dict[str, Any]]:
    """Flat arrays over all inputs (module docstring) and a summary (frames, episodes, positives, successes)."""
    tasks: list[str] = []
    parts: list[dict[str, np.ndarray]] = []
    offset = 0
    summary: dict[str, Any] = {"datasets": {}}
    for d, inp in enumerate(inputs):
        order = np.lexsort((inp.frame, inp.episode))
        ep, st = inp.episode[order], inp.state[order]
        starts = np.flatnonzero(np.r_[True, ep[1:] != ep[:-1]])
        ends = np.r_[starts[1:], ep.size]
        row_end = np.repeat(ends, ends - starts)
        pos = np.arange(ep.size)
        chunk_rows = np.minimum(pos[:, None] + np.arange(chunk)[None, :], row_end[:, None] - 1) + offset
        success_ep = _episode_success(inp, order, starts, ends)
        row_success = np.repeat(success_ep, ends - starts)
        if inp.source.type == "sft":
            label = np.ones(ep.size, bool)
        elif inp.labels is not None:
            label = inp.labels[order].copy()
            if hold_labels and inp.is_success is not None:
                label |= _held(inp.is_success[order], row_success, starts, ends)
        else:
            label = np.zeros(ep.size, bool)
        keep = row_success if mode == "filtered_bc" else np.ones(ep.size, bool)
        local_tasks = inp.dataset.tasks
        task_names = [local_tasks.get(int(t), "perform the task") for t in inp.task_index[order]]
        ids = []
        for name in task_names:
            if name not in tasks:
                tasks.append(name)
            ids.append(tasks.index(name))
        parts.append(
            dict(
                state=st[keep],
                chunk=chunk_rows[keep],
                action=inp.action[order],
                label=label[keep],
                task_id=np.asarray(ids, dtype=np.int64)[keep],
                source=np.full(int(keep.sum()), d, dtype=np.int64),
                row=order[keep].astype(np.int64),
                episode=ep[keep],
                frame=inp.frame[order][keep],
            )
        )
        offset += ep.size
        summary["datasets"][inp.source.name] = {
            "type": inp.source.type,
            "frames": int(ep.size),
            "episodes": int(starts.size),
            "successful_episodes": int(success_ep.sum()),
            "frames_kept": int(keep.sum()),
            "positive_fraction": float(label[keep].mean()) if keep.any() else 0.0,
        }
    if not parts or sum(len(p["state"]) for p in parts) == 0:
        raise DatasetError(
            f"policy stage ({mode}): no training frames"
            + (" (no successful episode in any dataset)" if mode == "filtered_bc" else ""),
            hint="check the datasets, their is_success column and the mode",
        )
    cat = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    arrays = PolicyArrays(**cat, tasks=tasks)
    summary["frames"] = len(arrays)
    summary["positive_fraction"] = float(arrays.label.mean())
    return arrays, summary


def _episode_success(inp: PolicyInput, order: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    if inp.is_success is None:  # only sft sets get here (rollout sets without it were refused)
        return np.ones(starts.size, bool)
    return inp.is_success[order][ends - 1]


def _held(success: np.ndarray, row_success: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """True from the first success frame on, in episodes whose last frame succeeds."""
    seen = np.zeros(success.size, bool)
    for s, e in zip(starts.tolist(), ends.tolist()):
        if not row_success[s]:
            continue
        hits = np.flatnonzero(success[s:e])
        if hits.size:
            seen[s + int(hits[0]) : e] = True
    return seen


def state_stats(arrays: PolicyArrays) -> dict[str, list[float]]:
    """Mean/std of state and action over the training frames (std floored at 1e-2)."""
    acts = arrays.action[np.unique(arrays.chunk)]
    return {
        "state_mean": arrays.state.mean(0).astype(np.float64).tolist(),
        "state_std": np.maximum(arrays.state.std(0), 1e-2).astype(np.float64).tolist(),
        "action_mean": acts.mean(0).astype(np.float64).tolist(),
        "action_std": np.maximum(acts.std(0), 1e-2).astype(np.float64).tolist(),
    }
