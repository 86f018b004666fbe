"""Value-SFT samples: dataset frames + returns-sidecar targets, weighted mixtures, per-sample augmentation.

One sample is one frame: the cameras the config maps to model slots (uint8 from the data plane's
reader, resized/padded to the model's square and scaled to [-1, 1]), the task prompt (RECAP.md 2.1
template), and the target y = ReturnRange.to_value(G) from the returns sidecar, which must carry
this dataset's fingerprint. Targets are joined by (episode_index, frame_index), never by position.

Mixtures (several train datasets): a fixed table maps sample i to (dataset, row). Dataset d gets a
share p_d (w_d * N_d normalised if `balance_weights`, else w_d), the table is long enough that
every dataset gets at least all its rows (length = max_d ceil(N_d / p_d)), and each dataset's slots
are filled by cycling seeded permutations of its rows. So every row is drawn every epoch and the
trainer's per-epoch shuffle does the rest: no with-replacement map frozen in a persistent worker
(upstream's bug, RECAP.md 7 item 5), and the mapping is a pure function of (seed, datasets).

Augmentation (`augment_sample`) draws per sample from the trainer's RNG, which is derived from
(seed, epoch, position); upstream drew one set of parameters per batch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from reproduction.errors import DatasetError
from reproduction.recap.finite import refuse_non_finite
from reproduction.recap.normalize import ReturnRange
from reproduction.recap.tokenizer import MAX_TOKEN_LEN, encode_prompts, format_prompt
from reproduction.recap.value.config import DATASET_TYPES, ValueSource  # noqa: F401 (re-exported)
from reproduction.recap.value.mixture import mixture_counts


@dataclass(kw_only=True, slots=True)
class SourceFrames:
    """One dataset's frames the stage uses, with their targets (raw returns) and prompts."""

    source: ValueSource
    rows: np.ndarray
    """Dataset rows (positions in the reader's frame_table)."""
    episode: np.ndarray
    frame: np.ndarray
    returns: np.ndarray
    """Raw return G of each row (float64)."""
    prompt_id: np.ndarray
    """Index into `prompts` per row."""
    prompts: list[str]
    """Formatted prompts (`Task: ... .`)."""
    fingerprint: str
    """The dataset fingerprint the sidecar was checked against."""
    state: np.ndarray | None = None
    """float32 (n, S): the state token's input per row (state_keys concatenated, state_dims kept); None = none."""

    def __len__(self) -> int:
        return int(self.rows.size)


def read_state(ds: Any, keys: Sequence[str], dims: Sequence[int] | None, rows: np.ndarray | None = None) -> np.ndarray:
    """float32 (n, S): the features `keys` concatenated per frame (all frames in the reader's order,
    or `rows`), then the components `dims`. DatasetError names a missing feature, a bad index, or the first
    frame whose kept components hold a NaN or inf (feature, episode, frame)."""
    from reproduction.data.reader import column_to_numpy

    missing = [k for k in keys if k not in ds.info.features]
    if missing:
        raise DatasetError(
            f"{ds.root}: the value model's state feature {missing[0]!r} is not in the dataset",
            path=ds.root,
            field="state_keys",
            hint=f"features: {', '.join(ds.info.features)}",
        )
    if rows is None:
        table = ds.frame_table(list(keys))
        cols = [
            column_to_numpy(table.column(k), ds.info.features.get(k), name=k, file_of_row=ds.file_of_row) for k in keys
        ]
    else:
        got = ds.read_frames(rows, list(keys))
        cols = [got[k] for k in keys]
    parts = [np.asarray(c, dtype=np.float32).reshape(len(c), -1) for c in cols]
    state = np.concatenate(parts, axis=1) if parts else np.zeros((0, 0), np.float32)
    owner = np.repeat(np.arange(len(parts)), [p.shape[1] for p in parts])  # the feature of each component
    if dims is not None:
        if max(dims) >= state.shape[1]:
            raise DatasetError(
                f"{ds.root}: state_dims {list(dims)} index past the state's {state.shape[1]} components",
                path=ds.root,
                field="state_dims",
            )
        state, owner = state[:, list(dims)], owner[list(dims)]
    refuse_non_finite(
        ds,
        state,
        owner,
        list(keys),
        rows=rows,
        what="the value model's state feature",
        hint="fix or drop those frames in the dataset, or leave the feature out of value.model.state_keys "
        "(state_dims picks components)",
    )
    return np.ascontiguousarray(state)


def check_state_finite(datasets: Sequence[Any], state_keys: Sequence[str], state_dims: Sequence[int] | None) -> None:
    """read_state over every frame of each opened dataset, kept for its checks only (DatasetError on a missing feature
    or a NaN or inf): the value stage runs it on the datasets it does not train on but the advantages stage scores
    (`value: false`), so bad data is refused before training, not after (audit60_E E2)."""
    if not state_keys:
        return
    for ds in datasets:
        read_state(ds, state_keys, state_dims)


def load_source(
    source: ValueSource,
    *,
    episodes: np.ndarray | None = None,
    state_keys: Sequence[str] = (),
    state_dims: Sequence[int] | None = None,
    dataset: Any = None,
) -> SourceFrames:
    """Join the dataset's frame table with its returns sidecar (fingerprint checked); `dataset` is the source's
    already opened dataset (reproduction.data.reader.Dataset; None = open `source.path`).

    `episodes` keeps only those episode ids (cross-fitting); `state_keys` (and `state_dims`) read
    the state token's input per frame (read_state). Raises FingerprintMismatchError when
    the sidecar was computed from another version of the dataset, DatasetError when a frame has no
    return (naming the episode and frame), InputNotFoundError when the sidecar is missing.
    """
    from reproduction.data.reader import open_dataset
    from reproduction.recap.sidecars import read_returns

    ds = dataset if dataset is not None else open_dataset(source.path)
    columns = [c for c in ("episode_index", "frame_index", "task_index") if c in ds.key_columns]
    table = ds.frame_table(columns)
    ep = table.column("episode_index").to_numpy().astype(np.int64)
    fr = table.column("frame_index").to_numpy().astype(np.int64)
    rets = read_returns(
        Path(source.returns) if source.returns else Path(source.path),
        source.tag,
        expect_fingerprint=ds.fingerprint,
        dataset_name=ds.name,
        columns=["episode_index", "frame_index", "return", "prompt"],
    )
    r_ep = rets.column("episode_index").to_numpy().astype(np.int64)
    r_fr = rets.column("frame_index").to_numpy().astype(np.int64)
    width = int(max(fr.max(initial=0), r_fr.max(initial=0))) + 1
    r_key = r_ep * width + r_fr
    order = np.argsort(r_key, kind="stable")
    key = ep * width + fr
    pos = np.searchsorted(r_key[order], key).clip(0, max(order.size - 1, 0))
    found = (order.size > 0) & (r_key[order][pos] == key) if order.size else np.zeros(key.shape, bool)
    if not found.all():
        bad = int(np.flatnonzero(~found)[0])
        raise DatasetError(
            f"{source.path}: episode {ep[bad]} frame {fr[bad]} has no return in the returns sidecar "
            f"(tag {source.tag!r})",
            path=source.path,
            hint="recompute stage 1 for this dataset (`portable run --restart-stage returns`)",
        )
    returns = rets.column("return").to_numpy().astype(np.float64)[order][pos]
    if "task_index" in columns and ds.tasks:
        ti = table.column("task_index").to_numpy().astype(np.int64)
        names = sorted(ds.tasks)
        prompts = [format_prompt(ds.tasks[k]) for k in names]
        prompt_id = np.searchsorted(np.array(names, dtype=np.int64), ti).clip(0, len(names) - 1)
        unknown = np.array(names, dtype=np.int64)[prompt_id] != ti
        if unknown.any():
            raise DatasetError(
                f"{source.path}: task_index {int(ti[unknown][0])} is not in the dataset's task list",
                path=source.path,
                field="task_index",
                hint="the dataset's meta/tasks file is incomplete",
            )
    else:
        raw = rets.column("prompt").to_pylist()
        prompts = sorted({format_prompt(p or "perform the task") for p in raw})
        lookup = {p: i for i, p in enumerate(prompts)}
        prompt_id = np.array([lookup[format_prompt(raw[i] or "perform the task")] for i in order[pos]], dtype=np.int64)
    keep = np.isin(ep, episodes) if episodes is not None else np.ones(ep.size, bool)
    rows = np.flatnonzero(keep).astype(np.int64)
    state = read_state(ds, state_keys, state_dims)[keep] if state_keys else None
    return SourceFrames(
        source=source,
        rows=rows,
        episode=ep[keep],
        frame=fr[keep],
        returns=returns[keep],
        prompt_id=prompt_id[keep],
        prompts=prompts,
        fingerprint=ds.fingerprint,
        state=state,
    )


def state_stats(frames: Sequence[SourceFrames]) -> tuple[list[float], list[float]]:
    """(mean, std) per state component over the frames' rows (std floored at 1e-2, as the policy's)."""
    states = [f.state for f in frames if f.state is not None and len(f)]
    if not states:
        return [], []
    x = np.concatenate(states).astype(np.float64)
    return x.mean(0).tolist(), np.maximum(x.std(0), 1e-2).tolist()


def return_range_of(frames: Sequence[SourceFrames]) -> ReturnRange:
    """min of mins / max of maxes of the training datasets' returns (upstream's default range)."""
    values = [f.returns for f in frames if len(f)]
    if not values:
        raise DatasetError(
            "value stage: the training datasets hold no frames", hint="check the dataset paths and folds"
        )
    return ReturnRange(return_min=float(min(v.min() for v in values)), return_max=float(max(v.max() for v in values)))


def mixture_table(
    sizes: Sequence[int], weights: Sequence[float], *, balance_weights: bool = True, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """(dataset id, index within it) per mixture sample; see the module docstring for the rule."""
    sizes = np.asarray(sizes, dtype=np.int64)
    counts = mixture_counts(sizes, weights, balance_weights=balance_weights)
    ids, idx = [], []
    for d, (n, c) in enumerate(zip(sizes.tolist(), counts.tolist())):
        rng = np.random.default_rng([seed, d, 0x31C])
        reps = -(-c // n)
        cycle = np.concatenate([rng.permutation(n) for _ in range(reps)])[:c]
        ids.append(np.full(c, d, dtype=np.int64))
        idx.append(cycle.astype(np.int64))
    return np.concatenate(ids), np.concatenate(idx)


class ValueFrames:
    """Map-style dataset of value samples over one or more `SourceFrames` (a mixture if several).

    `sample = frames[i]` -> {"images": {slot: float32 (3,S,S) in [-1,1]}, "prompt", "target" (value
    space), "episode_index", "frame_index", "source", and "state" (float32 (S,)) when the frames
    carry one}; slots whose dataset key is absent are missing
    from "images". Datasets are opened lazily in the process that reads (Ray workers), not pickled.
    """

    def __init__(
        self,
        frames: Sequence[SourceFrames],
        *,
        cameras: Mapping[str, str],
        image_size: int,
        return_range: ReturnRange,
        balance_weights: bool = True,
        seed: int = 0,
    ) -> None:
        self.frames = list(frames)
        self.cameras = dict(cameras)
        self.image_size = int(image_size)
        self.return_range = return_range
        if len(self.frames) == 1:
            self.table = (np.zeros(len(self.frames[0]), np.int64), np.arange(len(self.frames[0]), dtype=np.int64))
        else:
            self.table = mixture_table(
                [len(f) for f in self.frames],
                [f.source.weight for f in self.frames],
                balance_weights=balance_weights,
                seed=seed,
            )
        self._datasets: dict[int, Any] = {}

    def __len__(self) -> int:
        return int(self.table[0].size)

    def _dataset(self, d: int) -> Any:
        if d not in self._datasets:
            from reproduction.data.reader import open_dataset

            self._datasets[d] = open_dataset(self.frames[d].source.path)
        return self._datasets[d]

    def __getitem__(self, i: int) -> dict[str, Any]:
        d, j = int(self.table[0][i]), int(self.table[1][i])
        src = self.frames[d]
        ds = self._dataset(d)
        present = {slot: key for slot, key in self.cameras.items() if key in ds.camera_keys}
        raw = ds.read_frames([int(src.rows[j])], list(present.values())) if present else {}
        images = {slot: to_pixels(raw[key][0], self.image_size) for slot, key in present.items()}
        target = float(self.return_range.to_value(src.returns[j]))
        extra = {"state": torch.from_numpy(src.state[j].copy())} if src.state is not None else {}
        return {
            **extra,
            "images": images,
            "prompt": src.prompts[int(src.prompt_id[j])],
            "target": target,
            "episode_index": int(src.episode[j]),
            "frame_index": int(src.frame[j]),
            "source": d,
        }


def to_pixels(image: np.ndarray, size: int) -> torch.Tensor:
    """uint8 (H, W, 3) -> float32 (3, size, size) in [-1, 1]: aspect-preserving resize, then zero-pad
    (pad value -1 = black) to a square, as upstream's resize_with_pad."""
    x = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1).float() / 127.5 - 1.0
    h, w = x.shape[1:]
    if (h, w) != (size, size):
        scale = size / max(h, w)
        nh, nw = max(1, round(h * scale)), max(1, round(w * scale))
        x = F.interpolate(x[None], size=(nh, nw), mode="bilinear", align_corners=False, antialias=True)[0]
        pad_h, pad_w = size - nh, size - nw
        x = F.pad(x, (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2), value=-1.0)
    return x.clamp(-1.0, 1.0)


def augment_sample(sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """RECAP.md 2.1 augmentation drawn per sample: non-wrist cameras get a random 95% crop resized
    back and a rotation in +-5 degrees; every camera gets brightness x[0.7,1.3], contrast x[0.6,1.4]
    and saturation x[0.5,1.5]. Returns a new sample; the input is not modified."""
    out = dict(sample)
    out["images"] = {}
    for slot in sorted(sample["images"]):
        x = sample["images"][slot]
        if "wrist" not in slot:
            x = _crop_rotate(x, scale=0.95, shift=rng.uniform(-0.05, 0.05, size=2), degrees=rng.uniform(-5.0, 5.0))
        b, c, s = rng.uniform(0.7, 1.3), rng.uniform(0.6, 1.4), rng.uniform(0.5, 1.5)
        out["images"][slot] = _color(x, brightness=b, contrast=c, saturation=s)
    return out


def _crop_rotate(x: torch.Tensor, *, scale: float, shift: np.ndarray, degrees: float) -> torch.Tensor:
    """Sample a `scale`-sized window (offset by `shift`, in half-image units) rotated by `degrees`."""
    t = math.radians(degrees)
    theta = torch.tensor(
        [
            [scale * math.cos(t), -scale * math.sin(t), float(shift[0])],
            [scale * math.sin(t), scale * math.cos(t), float(shift[1])],
        ],
        dtype=torch.float32,
    )
    grid = F.affine_grid(theta[None], [1, *x.shape], align_corners=False)
    return F.grid_sample(x[None], grid, mode="bilinear", padding_mode="border", align_corners=False)[0]


def _color(x: torch.Tensor, *, brightness: float, contrast: float, saturation: float) -> torch.Tensor:
    y = (x + 1.0) / 2.0 * brightness
    y = y.clamp(0, 1)
    gray = 0.299 * y[0] + 0.587 * y[1] + 0.114 * y[2]
    y = ((y - gray.mean()) * contrast + gray.mean()).clamp(0, 1)
    gray = (0.299 * y[0] + 0.587 * y[1] + 0.114 * y[2])[None]
    y = (gray + (y - gray) * saturation).clamp(0, 1)
    return y * 2.0 - 1.0


@dataclass(kw_only=True)
class ValueCollator:
    """Samples -> batch: images and masks per model slot (absent -> zeros, mask False), prompts
    tokenized and padded to the batch's longest, targets and ids as tensors, "state" (B, S) when
    the samples carry one."""

    tokenizer: Any
    slots: tuple[str, ...]
    image_size: int
    max_token_len: int = MAX_TOKEN_LEN
    _zeros: torch.Tensor | None = field(default=None, repr=False)

    def __call__(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        if self._zeros is None:
            self._zeros = torch.zeros(3, self.image_size, self.image_size)
        images, masks = {}, {}
        for slot in self.slots:
            got = [s["images"].get(slot) for s in samples]
            masks[slot] = torch.tensor([g is not None for g in got], dtype=torch.bool)
            images[slot] = torch.stack([g if g is not None else self._zeros for g in got])
        ids, att = encode_prompts(self.tokenizer, [s["prompt"] for s in samples], max_len=self.max_token_len)
        extra = {"state": torch.stack([s["state"] for s in samples])} if "state" in samples[0] else {}
        return {
            **extra,
            "images": images,
            "image_masks": masks,
            "input_ids": ids,
            "attention_mask": att,
            "target": torch.tensor([s["target"] for s in samples], dtype=torch.float32),
            "episode_index": torch.tensor([s["episode_index"] for s in samples], dtype=torch.int64),
            "frame_index": torch.tensor([s["frame_index"] for s in samples], dtype=torch.int64),
            "source": torch.tensor([s["source"] for s in samples], dtype=torch.int64),
        }
