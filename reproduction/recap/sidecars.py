"""Sidecar files bound to a dataset version: RLinf's names and columns plus a fingerprint.

    <out>/<dataset name>/                  default: the run folder (the bundle's data stays read-only)
      returns_{tag}.parquet                stage 1 (no tag -> returns.parquet)
      advantages_{tag}.parquet             stage 3 (no tag -> advantages.parquet)
      stats.json                           {"return": {...}, "reward": {...}} (RLinf keeps these in meta/stats.json)
      mixture_config.yaml                  stage 3 / relabel
    <dataset>/meta/                        the same files, with `in_dataset=True` (RLinf interop)

Each parquet carries, in its key-value metadata under `recap_portable` (pyarrow shows it as the
schema's metadata too), a JSON document:
{"format": 1, "kind", "tag", "dataset", "dataset_fingerprint", "params", ...}. Reading with
`expect_fingerprint` refuses (FingerprintMismatchError, exit 41) a sidecar computed from another
version of the dataset or stored under another tag, naming both values.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from reproduction.config_fields import check_name
from reproduction.errors import DatasetError, FingerprintMismatchError, InputNotFoundError
from reproduction.fsio import annotate, atomic_write_text

META_KEY = b"recap_portable"
FORMAT = 1
MIXTURE_CONFIG = "mixture_config.yaml"
ROW_GROUP_ROWS = 1 << 20
"""Sidecar chunks are gathered into row groups of at least this many rows (one per chunk beyond)."""


def sidecar_name(kind: str, tag: str | None) -> str:
    """RLinf's file name: `returns_{tag}.parquet`, or `returns.parquet` without a tag (None). Always one path
    component: a tag that is not a plain name (`x/../..`, NUL, '') raises ConfigError (exit 4) naming it, so no
    caller, config-checked or not, writes or reads outside the sidecar's folder (audit52 W3)."""
    if tag is None:
        return f"{kind}.parquet"
    check_name(tag, f"{kind}.tag", optional=False)
    return f"{kind}_{tag}.parquet"


def sidecar_dir(location: Path, dataset_name: str | None = None) -> Path:
    """Where a dataset's sidecars are: `<dataset>/meta` for a dataset root, `<location>/<dataset_name>`
    when that folder exists, else `location` itself (a folder holding one dataset's sidecars)."""
    location = Path(location)
    if (location / "meta" / "info.json").is_file():
        return location / "meta"
    if dataset_name and (location / dataset_name).is_dir():
        return location / dataset_name
    return location


def write_sidecar(
    path: Path, table: pa.Table | Iterable[pa.Table], meta: dict[str, Any] | Callable[[], dict[str, Any]]
) -> Path:
    """Write `table` (or chunks of one, streamed: same schema each) with `meta` (plus the format
    number) to `path` atomically: nothing appears at `path` unless every chunk was written.

    `meta` may be a function called after the last chunk (for figures known only then); its
    document goes to the file's key-value metadata only, where `sidecar_meta` reads it. Chunks are
    gathered into row groups of at least ROW_GROUP_ROWS rows (a reader pays per row group).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    writer = None
    pending: list[pa.Table] = []  # small chunks wait here, to be written as one large row group
    try:
        for part in [table] if isinstance(table, pa.Table) else table:
            if writer is None:
                schema = part.schema.remove_metadata()
                writer = pq.ParquetWriter(tmp, schema, **writer_options(schema))
            pending.append(part.replace_schema_metadata(None))
            if sum(t.num_rows for t in pending) >= ROW_GROUP_ROWS:
                _write_group(writer, pending)
                pending = []
        if pending:
            _write_group(writer, pending)
        if writer is None:
            raise DatasetError(f"{path}: nothing to write (no chunks)", path=path)
        doc = meta() if callable(meta) else meta
        writer.add_key_value_metadata({META_KEY.decode(): json.dumps({"format": FORMAT, **doc})})
        writer.close()
        writer = None
        os.replace(tmp, path)
    except OSError as exc:  # pyarrow's ENOSPC names no file: name the sidecar and what it held so far
        written = sum(t.nbytes for t in pending) + (tmp.stat().st_size if tmp.exists() else 0)
        raise annotate(exc, path, need=written or None)
    finally:
        if writer is not None:
            writer.close()
        if tmp.exists():
            tmp.unlink()
    return path


def writer_options(schema: pa.Schema) -> dict[str, Any]:
    """Parquet settings for a sidecar of `schema` (whose columns are plain numbers, booleans and strings).

    No Arrow schema is stored: every such type reads back as itself from parquet's own types, and a
    dictionary-encoded string column (`repeat_strings`) goes to dictionary pages as it is, without
    hashing every row, and reads back as plain strings, like a sidecar RLinf writes. Dictionary pages
    only for columns that repeat (keys, labels, names): on a million distinct floats the encoder
    builds a dictionary, overflows and falls back, which doubled the write time of stage 3's sidecar.
    Statistics only for numbers and booleans: min/max over a million strings costs more than the
    whole key column and no reader filters on them. LZ4 (parquet's LZ4_RAW): stage 3's sidecar of
    1M frames, mostly distinct floats, is 24.9 MB with it and 24.0 MB with zstd, written in 143 ms
    instead of 215 ms.
    """
    plain_types = (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean, pa.types.is_string)
    for f in schema:
        plain = f.type.value_type if pa.types.is_dictionary(f.type) else f.type
        if not any(is_type(plain) for is_type in plain_types):  # a caller's bug, not bad input
            raise TypeError(f"sidecar column {f.name!r} is {f.type}: it would not read back as itself")
    names = [f.name for f in schema]
    strings = [f.name for f in schema if pa.types.is_dictionary(f.type) or pa.types.is_string(f.type)]
    return {
        "compression": "lz4",
        "use_dictionary": [f.name for f in schema if not pa.types.is_floating(f.type)],
        "write_statistics": [n for n in names if n not in strings],
        "store_schema": False,
    }


def _write_group(writer: pq.ParquetWriter, parts: list[pa.Table]) -> None:
    """Write `parts` as one row group (pyarrow writes each write_table call as its own)."""
    table = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
    writer.write_table(table, row_group_size=max(table.num_rows, 1))


def sidecar_meta(path: Path) -> dict[str, Any]:
    """The `recap_portable` document of a sidecar ({} for one RLinf wrote)."""
    raw = (pq.ParquetFile(path).metadata.metadata or {}).get(META_KEY)
    return json.loads(raw) if raw else {}


def _available(folder: Path, kind: str) -> str:
    found = sorted(p.name for p in folder.glob(f"{kind}*.parquet")) if folder.is_dir() else []
    return ", ".join(found) or "none"


def read_sidecar(
    location: Path,
    kind: str,
    tag: str | None,
    *,
    expect_fingerprint: str | None,
    dataset_name: str | None = None,
    columns: list[str] | None = None,
    allow_unfingerprinted: bool = False,
) -> tuple[pa.Table, dict[str, Any]]:
    """Read `<kind>_{tag}.parquet` from a dataset root or a run folder; check fingerprint and tag.

    Raises InputNotFoundError (listing the sidecars present) when missing, FingerprintMismatchError
    when the stored dataset fingerprint or tag differ from what the caller expects, or when the
    file has no fingerprint (an RLinf-written file) unless `allow_unfingerprinted`.
    """
    folder = sidecar_dir(Path(location), dataset_name)
    path = folder / sidecar_name(kind, tag)
    if not path.is_file():
        raise InputNotFoundError(
            f"{path}: no {kind} sidecar for tag {tag!r} (present: {_available(folder, kind)})",
            path=path,
            hint=f"run the {kind} stage first (`portable run --stages {kind}`, with {kind}.tag {tag!r}), "
            "or name the tag it was written with",
        )
    meta = sidecar_meta(path)
    if meta.get("tag", tag) != tag:
        raise FingerprintMismatchError(
            f"{path}: written for tag {meta.get('tag')!r}, asked for tag {tag!r}",
            path=path,
            expected=tag,
            actual=meta.get("tag"),
        )
    stored = meta.get("dataset_fingerprint")
    if expect_fingerprint is not None:
        if stored is None and not allow_unfingerprinted:
            raise FingerprintMismatchError(
                f"{path}: has no dataset fingerprint (written by another tool); expected dataset {expect_fingerprint}",
                path=path,
                expected=expect_fingerprint,
                actual=None,
                hint="recompute it with this tool, or allow unfingerprinted sidecars explicitly",
            )
        if stored is not None and stored != expect_fingerprint:
            raise FingerprintMismatchError(
                f"{path}: computed from dataset fingerprint {stored}, but the dataset now has fingerprint "
                f"{expect_fingerprint}",
                path=path,
                expected=expect_fingerprint,
                actual=stored,
                hint="the dataset changed since (refiltered or edited): recompute this sidecar",
            )
    try:
        table = pq.ParquetFile(path).read(columns=columns)  # not read_table: pyarrow.dataset costs 0.3 s to import
    except (pa.ArrowInvalid, OSError) as exc:
        raise DatasetError(f"{path}: unreadable parquet ({exc})", path=path) from None
    return table, meta


def read_returns(location: Path, tag: str | None, **checks: Any) -> pa.Table:
    """The stage-1 returns table (episode_index, frame_index, return, reward, prompt), checked by `read_sidecar`
    (same keyword arguments: expect_fingerprint, dataset_name, columns, allow_unfingerprinted). Other sidecars
    (advantages_{tag}.parquet: stage 4) are read with `read_sidecar` itself."""
    return read_sidecar(location, "returns", tag, **checks)[0]


def update_stats_json(path: Path, stats: dict[str, Any]) -> None:
    """Read-modify-write `stats.json`, setting only the given keys (RLinf's `return`/`reward`)."""
    doc: dict[str, Any] = {}
    if path.is_file():
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise DatasetError(f"{path}: not JSON ({exc})", path=path) from None
    doc.update(stats)
    atomic_write_text(path, json.dumps(doc, indent=4))


def read_mixture_config(folder: Path) -> dict[str, Any]:
    """`mixture_config.yaml` in `folder` as a dict ({} when absent)."""
    import yaml

    path = Path(folder) / MIXTURE_CONFIG
    if not path.is_file():
        return {}
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise DatasetError(f"{path}: not YAML ({exc})", path=path) from None


def write_mixture_config(
    folder: Path,
    *,
    return_range: tuple[float, float],
    datasets: list[dict[str, Any]],
    tag: str | None,
    threshold: float,
    positive_quantile: float,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Read-modify-write `mixture_config.yaml` as RLinf does: global range, datasets, tags[tag]."""
    import yaml

    doc = read_mixture_config(folder)
    doc["global_return_min"], doc["global_return_max"] = float(return_range[0]), float(return_range[1])
    doc["datasets"] = datasets
    entry = {"unified_threshold": float(threshold), "positive_quantile": float(positive_quantile), **(extra or {})}
    if tag:
        doc.setdefault("tags", {})[tag] = entry
    else:
        doc.update(entry)
    path = Path(folder) / MIXTURE_CONFIG
    atomic_write_text(path, yaml.safe_dump(doc, sort_keys=False))
    return path
