"""The dataset fingerprint: one digest that changes whenever the frames a sidecar describes change.

    fingerprint = sha256("recap-dataset-fp/1"
                         + canonical info.json
                         + sorted (episode_index, length) of the episode index
                         + for each data file in path order: sha256 of its key columns
                           (episode_index, frame_index, index, task_index, is_success if present))

Re-compressing files or touching stats leaves it unchanged; refiltering, reordering or editing
episodes changes it. Per-file digests are cached by (path, size, mtime_ns) in
`$PORTABLE_CACHE_DIR` (default ~/.cache/recap-portable)/fingerprints/, so a second call on a
large dataset costs a stat per file. A cache that cannot be written is ignored.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow.parquet as pq

from reproduction.fsio import atomic_write_text

if TYPE_CHECKING:
    from reproduction.data.reader import Dataset

FP_VERSION = "recap-dataset-fp/1"
FP_COLUMNS = ("episode_index", "frame_index", "index", "task_index", "is_success")


def cache_dir() -> Path:
    # RECAP_PORTABLE_CACHE: the variable's old name, still honoured
    base = os.environ.get("PORTABLE_CACHE_DIR") or os.environ.get("RECAP_PORTABLE_CACHE")
    base = base or str(Path.home() / ".cache" / "recap-portable")
    return Path(base) / "fingerprints"


def file_key_digest(path: Path) -> str:
    """sha256 of the key columns of one data parquet (values as little-endian int64 / uint8)."""
    pf = pq.ParquetFile(path)
    cols = [c for c in FP_COLUMNS if c in pf.schema_arrow.names]
    h = hashlib.sha256()
    for batch in pf.iter_batches(columns=cols, batch_size=1 << 20):
        for name in cols:
            values = batch.column(name).to_numpy(zero_copy_only=False)
            dtype = "<u1" if values.dtype == np.bool_ else "<i8"
            h.update(name.encode())
            h.update(np.ascontiguousarray(values.astype(dtype)).tobytes())
    return h.hexdigest()


def _load_cache(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def dataset_fingerprint(ds: Dataset) -> str:
    """Hex fingerprint of `ds` (see the module docstring)."""
    root = ds.root.resolve()
    cache_path = cache_dir() / (hashlib.sha256(str(root).encode()).hexdigest()[:32] + ".json")
    cache = _load_cache(cache_path)
    fresh: dict[str, list] = {}
    h = hashlib.sha256(FP_VERSION.encode())
    h.update(json.dumps(ds.info.raw, sort_keys=True, separators=(",", ":")).encode())
    ep = ds.episodes
    idx = ep.column("episode_index").to_numpy().astype("<i8")
    lengths = ep.column("length").to_numpy().astype("<i8")
    order = np.argsort(idx, kind="stable")
    h.update(idx[order].tobytes())
    h.update(lengths[order].tobytes())
    for path in ds.data_files:
        st = path.stat()
        rel = str(path.relative_to(ds.root))
        stamp = [st.st_size, st.st_mtime_ns]
        entry = cache.get(rel)
        digest = entry[2] if entry and entry[:2] == stamp else file_key_digest(path)
        fresh[rel] = [*stamp, digest]
        h.update(rel.encode())
        h.update(digest.encode())
    if fresh != cache:
        try:
            atomic_write_text(cache_path, json.dumps(fresh))
        except OSError:
            pass  # a read-only home must not stop a read
    return h.hexdigest()
