"""The dataset fingerprint: one digest that changes whenever the frames a sidecar describes change.

    fingerprint = sha256("recap-dataset-fp/1"
                         + canonical info.json
                         + sorted (episode_index, length) of the episode index
                         + for each data file in path order: sha256 of its key columns
                           (episode_index, frame_index, index, task_index, is_success if present))

Re-compressing files or touching stats leaves it unchanged; refiltering, reordering or editing
episodes changes it. A file's digest covers its rows in slices of 2^20 (for each slice, each
column's name then its values). Per-file digests are cached by (path, size, mtime_ns) in
`$PORTABLE_CACHE_DIR` (default ~/.cache/recap-portable)/fingerprints/, so a second call on a
large dataset costs a stat per file; a reader that already read the key columns (stage 1's one
pass) hands its digests in (`known`) and no file is read again. Files the cache misses are read on
a small thread pool. A cache that cannot be written is ignored.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from reproduction.data.scan import ordered_map, read_parquet, read_schema_names, same_schema
from reproduction.fsio import atomic_write_text

if TYPE_CHECKING:
    from reproduction.data.reader import Dataset

FP_VERSION = "recap-dataset-fp/1"
FP_COLUMNS = ("episode_index", "frame_index", "index", "task_index", "is_success")


def cache_dir() -> Path:
    """<cache root>/fingerprints, absolute (settings.cache_root_or_default: PORTABLE_CACHE_DIR with `~` expanded,
    else ~/.cache/recap-portable; a relative value is ConfigError, exit 4), never under the current folder."""
    from reproduction.settings import cache_root_or_default

    return cache_root_or_default() / "fingerprints"


DIGEST_ROWS = 1 << 20
"""Rows per hashed slice (the format's definition; the slices are not the file's row groups)."""


def table_key_digest(table: pa.Table) -> str:
    """sha256 of a data file's key columns (those of FP_COLUMNS present), values as little-endian
    int64 (bool as uint8), in slices of DIGEST_ROWS rows."""
    arrays = [(name.encode(), _le_values(table.column(name))) for name in FP_COLUMNS if name in table.column_names]
    h = hashlib.sha256()
    n = table.num_rows
    for lo in range(0, n, DIGEST_ROWS):
        for name, values in arrays:
            h.update(name)
            h.update(values[lo : lo + DIGEST_ROWS] if n > DIGEST_ROWS else values)  # the buffer, no copy
    return h.hexdigest()


def batch_key_digests(table: pa.Table, file_rows: np.ndarray) -> list[str]:
    """table_key_digest of each file in a batch of whole files (`file_rows` rows each, in order),
    from the batch's arrays: a few array slices and hash updates a file, not a pyarrow call."""
    arrays = [(name.encode(), _le_values(table.column(name))) for name in FP_COLUMNS if name in table.column_names]
    out = []
    start = 0
    for n in file_rows.tolist():
        h = hashlib.sha256()
        for lo in range(start, start + n, DIGEST_ROWS):
            hi = min(lo + DIGEST_ROWS, start + n)
            for name, values in arrays:
                h.update(name)
                h.update(values[lo:hi])
        out.append(h.hexdigest())
        start += n
    return out


def _le_values(col: pa.ChunkedArray) -> np.ndarray:
    """A key column as little-endian int64 (bool: uint8 0/1); a missing value hashes as the dtype's max."""
    if col.num_chunks == 1 and not col.null_count and sys.byteorder == "little":
        arr = col.chunk(0)  # the fast path (every file of a dataset): straight from the Arrow buffer
        if pa.types.is_int64(arr.type):
            return np.frombuffer(arr.buffers()[1], dtype=np.int64, count=len(arr), offset=arr.offset * 8)
        if pa.types.is_boolean(arr.type):
            bits = np.frombuffer(arr.buffers()[1], dtype=np.uint8)
            return np.unpackbits(bits, bitorder="little", count=arr.offset + len(arr))[arr.offset :]
    nulls = None
    if col.null_count:  # rare (stage 1 refuses it later): pyarrow.compute costs 0.2 s to import
        import pyarrow.compute as pc

        nulls = col.is_null().to_numpy(zero_copy_only=False)
        col = pc.fill_null(col, False if pa.types.is_boolean(col.type) else 0)
    values = col.to_numpy()
    with np.errstate(invalid="ignore"):  # a float flag's NaN (stage 1 refuses it) casts without a warning line
        values = values.astype("<u1" if values.dtype == np.bool_ else "<i8", copy=False)
    if nulls is not None:
        values = np.where(nulls, np.iinfo(values.dtype).max, values).astype(values.dtype)
    return np.ascontiguousarray(values)


def digest_columns(names: list[str] | tuple[str, ...]) -> list[str]:
    """The FP_COLUMNS among a data file's column `names`, in digest order."""
    return [c for c in FP_COLUMNS if c in names]


def file_key_digest(path: Path) -> str:
    """sha256 of the key columns of one data parquet (see table_key_digest)."""
    return table_key_digest(read_parquet(path, digest_columns(read_schema_names(path))).table)


def _load_cache(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def dataset_fingerprint(ds: Dataset, known: dict[Path, tuple[int, int, str]] | None = None) -> str:
    """Hex fingerprint of `ds` (see the module docstring). `known` maps data files to (size,
    mtime_ns, digest) already computed by the caller from the same read."""
    root = ds.root.resolve()
    cache_path = cache_dir() / (hashlib.sha256(str(root).encode()).hexdigest()[:32] + ".json")
    cache = _load_cache(cache_path)
    known = known or {}
    prefix = len(str(ds.root)) + 1
    rels = {path: str(path)[prefix:] for path in ds.data_files}  # data_files are root / "data" / ...
    fresh: dict[str, list] = {}
    missing: list[Path] = []
    for path in ds.data_files:
        rel = rels[path]
        if path in known:
            fresh[rel] = list(known[path])
            continue
        st = path.stat()
        entry = cache.get(rel)
        if entry and entry[:2] == [st.st_size, st.st_mtime_ns]:
            fresh[rel] = entry
        else:
            missing.append(path)
    cols = digest_columns(list(ds.key_columns))
    group: list = []

    def flush() -> None:  # digest a run of files from one concatenated table: no pyarrow call per file
        table = pa.concat_tables([g.table for g in group]) if len(group) > 1 else group[0].table
        rows = np.array([g.table.num_rows for g in group], dtype=np.int64)
        for got, digest in zip(group, batch_key_digests(table.combine_chunks(), rows)):
            fresh[rels[got.path]] = [got.size, got.mtime_ns, digest]
        group.clear()

    held, first = 0, None
    for got in ordered_map(lambda path: read_parquet(path, cols), missing):
        first = first or got
        same_schema(first, got)
        group.append(got)
        held += got.table.num_rows
        if held >= DIGEST_ROWS:
            flush()
            held = 0
    if group:
        flush()
    h = hashlib.sha256(FP_VERSION.encode())
    h.update(json.dumps(ds.info.raw, sort_keys=True, separators=(",", ":")).encode())
    ep = ds.episodes
    idx = ep.column("episode_index").to_numpy().astype("<i8")
    lengths = ep.column("length").to_numpy().astype("<i8")
    order = np.argsort(idx, kind="stable")
    h.update(idx[order].tobytes())
    h.update(lengths[order].tobytes())
    for path in ds.data_files:
        rel = rels[path]
        h.update(rel.encode())
        h.update(fresh[rel][2].encode())
    if fresh != cache:
        try:
            atomic_write_text(cache_path, json.dumps(fresh))
        except OSError:
            pass  # a read-only home must not stop a read
    return h.hexdigest()
