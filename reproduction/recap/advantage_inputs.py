"""Stage-3 inputs per dataset: in memory (DatasetArrays) or streamed from the returns sidecar.

Both give `chunks()`: DatasetArrays of whole episodes, sorted by (episode, frame), in order. Stage 3
reads each dataset's chunks twice (continuous advantages for the threshold, then labels and the
sidecar), so a 10M-frame dataset holds only its aligned values and its advantages (8 bytes a frame
each) plus one chunk at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from reproduction.errors import DatasetError
from reproduction.recap.returns import episode_bounds, episode_ends, sort_frames

CHUNK_ROWS = 1 << 20
"""Rows read from a returns sidecar per batch (a chunk ends at the last whole episode in it)."""
RETURNS_COLUMNS = ["episode_index", "frame_index", "return", "reward", "prompt"]


@dataclass(kw_only=True, slots=True)
class DatasetArrays:
    """One dataset's sorted per-frame inputs to stage 3 (or one chunk of whole episodes of them)."""

    name: str
    dataset_type: str
    episode_index: np.ndarray
    frame_index: np.ndarray
    returns: np.ndarray
    rewards: np.ndarray
    values: np.ndarray
    prompts: np.ndarray
    fingerprints: dict[str, str | None] = field(default_factory=dict)
    returns_gamma: float | None = None
    prompt_codes: tuple[np.ndarray, np.ndarray] | None = None
    """(distinct prompts, int code per row) when known, so `prompts` need not be hashed again."""
    hold: np.ndarray | None = None
    """bool per row: a hold frame (recap/labels.py hold_frames), used when hold labels are on; None = none."""

    @property
    def row_end(self) -> np.ndarray:
        """The exclusive end of each row's episode, per row."""
        return episode_ends(self.episode_index)[1]

    @property
    def episode_end(self) -> np.ndarray:
        """The exclusive end of each episode, in order (what nstep_advantages needs; per episode)."""
        return episode_bounds(self.episode_index)[1]

    @property
    def num_rows(self) -> int:
        return int(self.episode_index.size)

    def chunks(self) -> Iterator[DatasetArrays]:
        """The whole dataset as one chunk."""
        yield self


@dataclass(kw_only=True, slots=True)
class SidecarInputs:
    """One dataset's stage-3 inputs read from its returns sidecar chunk by chunk; `values` are the
    per-frame values already aligned to the sidecar's rows (see `aligned_values`)."""

    name: str
    dataset_type: str
    sidecar: Path
    values: np.ndarray
    fingerprints: dict[str, str | None] = field(default_factory=dict)
    returns_gamma: float | None = None
    chunk_rows: int = CHUNK_ROWS
    hold: np.ndarray | None = None
    """bool per sidecar row: a hold frame (aligned like `values`); None = none."""

    @property
    def num_rows(self) -> int:
        return int(self.values.size)

    def chunks(self) -> Iterator[DatasetArrays]:
        """DatasetArrays of whole episodes, in sidecar order, about `chunk_rows` rows each."""
        offset = 0
        pf = pq.ParquetFile(self.sidecar, read_dictionary=["prompt"])  # prompts as codes, as stored
        for t in episode_aligned_tables(pf, RETURNS_COLUMNS, self.chunk_rows):
            n = t.num_rows
            names, codes = dictionary_codes(t.column("prompt"))
            yield DatasetArrays(
                name=self.name,
                dataset_type=self.dataset_type,
                episode_index=_numpy(t, "episode_index", np.int64),
                frame_index=_numpy(t, "frame_index", np.int64),
                returns=_numpy(t, "return", np.float64),
                rewards=_numpy(t, "reward", np.float64),
                values=self.values[offset : offset + n],
                prompts=names[codes],
                fingerprints=self.fingerprints,
                returns_gamma=self.returns_gamma,
                prompt_codes=(names, codes),
                hold=None if self.hold is None else self.hold[offset : offset + n],
            )
            offset += n


def episode_aligned_tables(pf: pq.ParquetFile, columns: list[str], rows: int) -> Iterator[pa.Table]:
    """Tables of about `rows` rows from a parquet sorted by episode, each ending at an episode end
    (an episode longer than `rows` comes whole, in a bigger table)."""
    if pf.metadata.num_rows == 0:
        yield pf.schema_arrow.empty_table().select(columns)  # one empty chunk: an empty sidecar stays valid
        return
    carry: pa.Table | None = None
    for batch in pf.iter_batches(batch_size=rows, columns=columns):
        t = pa.Table.from_batches([batch])
        if carry is not None and carry.num_rows:
            t = pa.concat_tables([carry, t]).combine_chunks()
        ep = t.column("episode_index").to_numpy()
        change = np.flatnonzero(ep[1:] != ep[:-1])
        cut = int(change[-1]) + 1 if change.size else 0  # rows before the last (maybe unfinished) episode
        if cut:
            yield t.slice(0, cut)
        carry = t.slice(cut)
    if carry is not None and carry.num_rows:
        yield carry


def aligned_values(sidecar: Path, values: pa.Table | Path, *, source: str) -> np.ndarray:
    """Per-frame values ordered like the (sorted) returns sidecar's rows, matched by (episode, frame).

    `values` holds episode_index, frame_index, value in any row order (a table or a parquet path).
    Raises DatasetError naming the first frame that is missing from, or extra in, the values, or the first
    non-finite value (`refuse_non_finite`).
    """
    if isinstance(values, pa.Table):
        ve, vf = _numpy(values, "episode_index", np.int64), _numpy(values, "frame_index", np.int64)
        v = _numpy(values, "value", np.float64)
    else:  # one column at a time: the parquet's chunks and their numpy copy never all coexist
        ve, vf, v = (
            _numpy(pq.ParquetFile(values).read(columns=[c]), c, t)
            for c, t in (("episode_index", np.int64), ("frame_index", np.int64), ("value", np.float64))
        )
    order = sort_frames(ve, vf)
    if order is not None:
        ve, vf, v = ve[order], vf[order], v[order]
        del order
    refuse_non_finite(
        v,
        ve,
        vf,
        what=f"{source}: the values ({'a table' if isinstance(values, pa.Table) else values})",
        hint=VALUES_HINT,
    )
    total = pq.ParquetFile(sidecar).metadata.num_rows
    offset = 0
    for t in episode_aligned_tables(pq.ParquetFile(sidecar), ["episode_index", "frame_index"], CHUNK_ROWS):
        re_, rf = t.column("episode_index").to_numpy(), t.column("frame_index").to_numpy()
        n = re_.size
        got_e, got_f = ve[offset : offset + n], vf[offset : offset + n]
        if got_e.size != n or not (np.array_equal(got_e, re_) and np.array_equal(got_f, rf)):
            _mismatch(re_, rf, got_e, got_f, source=source, counts=(ve.size, total))
        offset += n
    if offset != ve.size:
        _mismatch(
            np.zeros(0, np.int64),
            np.zeros(0, np.int64),
            ve[offset:],
            vf[offset:],
            source=source,
            counts=(ve.size, total),
        )
    return v


VALUES_HINT = (
    "the value model gave NaN or inf (did its training diverge?), or the values file was edited: "
    "train the value model again (`portable run --resume --restart-stage value`); one such value would make the "
    "advantage threshold NaN and label every frame negative"
)
"""The hint of a non-finite per-frame value."""


def refuse_non_finite(x: np.ndarray, ep: np.ndarray, fr: np.ndarray, *, what: str, hint: str) -> None:
    """DatasetError (exit 40): `what` holds N non-finite values (NaN or inf) of `x.size`, naming the first by
    (episode, frame). `ep`/`fr` are the rows' keys. One np.isfinite pass; RLinf does not check (its threshold
    turns NaN too, audit50_D F1)."""
    finite = np.isfinite(x)
    if finite.all():
        return
    bad = np.flatnonzero(~finite)
    k = int(bad[np.lexsort((fr[bad], ep[bad]))[0]])
    raise DatasetError(
        f"{what} holds {bad.size} non-finite value(s) (NaN or inf) of {x.size}, the first at episode {int(ep[k])} "
        f"frame {int(fr[k])} ({x[k]})",
        hint=hint,
    )


def _mismatch(
    re_: np.ndarray, rf: np.ndarray, ve: np.ndarray, vf: np.ndarray, *, source: str, counts: tuple[int, int]
) -> None:
    """Raise for the first position where sorted sidecar keys and sorted value keys differ."""
    m = min(re_.size, ve.size)
    diff = np.flatnonzero((re_[:m] != ve[:m]) | (rf[:m] != vf[:m]))
    i = int(diff[0]) if diff.size else m
    frame = (int(re_[i]), int(rf[i])) if i < re_.size else None
    value = (int(ve[i]), int(vf[i])) if i < ve.size else None
    if frame is not None and (value is None or frame < value):
        what = f"frame {frame} has no value"
    else:
        what = f"value for unknown frame {value}"
    raise DatasetError(
        f"{source}: values do not match the returns sidecar: {what} ({counts[0]} values, {counts[1]} frames)",
        hint="rerun value inference on this dataset version",
    )


def load_dataset_arrays(
    dataset: Any, returns_location: Path, values: pa.Table | Path, *, dataset_type: str, returns_tag: str | None
) -> SidecarInputs:
    """Open a dataset, check its returns sidecar (fingerprint) and align `values` to it; the sidecar's
    other columns are read later, chunk by chunk. `dataset` is an opened Dataset or a dataset root."""
    from reproduction.data.reader import open_dataset
    from reproduction.digests import sha256_file
    from reproduction.recap.sidecars import read_sidecar, sidecar_dir, sidecar_name

    ds = dataset if hasattr(dataset, "fingerprint") else open_dataset(dataset)
    _, meta = read_sidecar(
        returns_location, "returns", returns_tag, expect_fingerprint=ds.fingerprint, dataset_name=ds.name, columns=[]
    )
    path = sidecar_dir(returns_location, ds.name) / sidecar_name("returns", returns_tag)
    return SidecarInputs(
        name=ds.name,
        dataset_type=dataset_type,
        sidecar=path,
        values=aligned_values(path, values, source=str(ds.root)),
        fingerprints={"dataset": ds.fingerprint, "returns": sha256_file(path)},
        returns_gamma=(meta.get("params") or {}).get("gamma"),
    )


def dictionary_codes(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct values as an object array, int64 code per row) of a string column, read as a
    dictionary column or encoded here."""
    if not pa.types.is_dictionary(column.type):
        enc = column.combine_chunks().dictionary_encode()
        return np.asarray(enc.dictionary.to_pylist(), dtype=object), enc.indices.to_numpy(zero_copy_only=False)
    chunks = (
        pa.chunked_array(column.chunks, column.type).unify_dictionaries().chunks
        if column.num_chunks > 1
        else column.chunks
    )
    if not chunks:
        return np.zeros(0, dtype=object), np.zeros(0, np.int64)
    names = np.asarray(chunks[0].dictionary.to_pylist(), dtype=object)
    codes = np.concatenate([c.indices.to_numpy(zero_copy_only=False).astype(np.int64, copy=False) for c in chunks])
    return names, codes


def strings(column: pa.ChunkedArray) -> np.ndarray:
    """A string column as an object array sharing one Python str per distinct value."""
    enc = column.combine_chunks().dictionary_encode()
    return np.asarray(enc.dictionary.to_pylist(), dtype=object)[enc.indices.to_numpy(zero_copy_only=False)]


def _numpy(table: pa.Table, name: str, dtype: type) -> np.ndarray:
    """A column as numpy of `dtype` (zero-copy for one chunk of that type)."""
    col = table.column(name)
    arr = col.chunk(0).to_numpy(zero_copy_only=False) if col.num_chunks == 1 else col.to_numpy()
    return arr.astype(dtype, copy=False)
