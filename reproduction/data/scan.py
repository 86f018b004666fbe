"""Read a dataset's data parquets once each, in parallel, with errors that name the file.

`read_parquet(path, columns)` reads one file: a small file is read into memory in one system call
and parsed from there (on a 5,000-file LeRobot v2.1 dataset the per-file open, seek and read calls
cost more than the decoding); a large one (a v3.0 file, or a v2.1 file with images in it) is read
column chunk by column chunk, so only the asked-for columns leave the disk. `ordered_map` runs such
reads on a small thread pool (pyarrow decodes without the GIL) and yields them in file order,
holding at most a few files ahead, so memory follows the largest file, not the dataset.

A file pyarrow cannot read (truncated, zero bytes, corrupt pages) is a DatasetError (exit 40) naming
the file and what to do, never a raw ArrowInvalid/OSError; so is a missing (null) value in a key column
(`refuse_null_keys`), which numpy would otherwise cast to -9223372036854775808 and read as a real index.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from reproduction.errors import DatasetError, InputNotFoundError

SLURP_BYTES = 8 << 20
"""Files up to this size are read whole in one call, then parsed from memory."""
SCAN_THREADS = 4
"""Threads reading files: enough to overlap I/O with decoding, few enough for a shared machine."""

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class FileRead:
    """One data file's columns as read, with the stat taken from the open file."""

    path: Path
    table: pa.Table
    size: int
    mtime_ns: int


def parquet_error(path: Path, exc: BaseException) -> DatasetError:
    """The DatasetError for a data parquet pyarrow could not read (`exc` is its exception)."""
    size = _size(path)
    what = "is empty (0 bytes)" if size == 0 else f"is not a readable parquet file ({size} bytes): {exc}"
    return DatasetError(
        f"{path}: {what}",
        path=path,
        hint="the file is truncated or corrupt (an interrupted copy or download?): copy or fetch the dataset "
        "again, or restore this file from its source",
    )


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def read_parquet(path: Path, columns: Sequence[str] | None = None) -> FileRead:
    """`columns` (None: all) of one parquet file as a table, decoded on this thread.

    Raises InputNotFoundError when the file is gone and DatasetError when pyarrow cannot read it.
    """
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            st = os.fstat(fh.fileno())
            if st.st_size <= SLURP_BYTES:
                source: pa.NativeFile | str = pa.BufferReader(fh.read())
            else:
                source = str(path)
            pf = pq.ParquetFile(source, pre_buffer=True)
            cols = None if columns is None else list(columns)
            if cols is not None:  # pyarrow leaves out an asked-for column the file lacks, without a word
                _require_columns(path, cols, pf.schema_arrow.names)
            table = pf.read_row_groups(range(pf.num_row_groups), columns=cols, use_threads=False)
    except FileNotFoundError:
        raise InputNotFoundError(f"{path}: missing", path=path, hint="copy the dataset's data/ folder again") from None
    except (pa.ArrowException, OSError) as exc:
        raise parquet_error(path, exc) from None
    return FileRead(path=path, table=table, size=st.st_size, mtime_ns=st.st_mtime_ns)


def _require_columns(path: Path, columns: Sequence[str], names: Sequence[str]) -> None:
    missing = [c for c in columns if c not in set(names)]
    if missing:
        raise DatasetError(
            f"{path}: no column(s) {', '.join(missing)}",
            path=path,
            field=missing[0],
            hint="every data file of a dataset has the same columns: export or convert the dataset again "
            f"(this file has: {', '.join(names)})",
        )


def same_schema(first: FileRead, got: FileRead) -> None:
    """DatasetError (exit 40) naming `got` and each column whose type differs from `first`'s: files of one
    dataset are read as one table, and pyarrow's own refusal names neither file nor column."""
    if got.table.schema.equals(first.table.schema):
        return
    theirs = {f.name: f.type for f in first.table.schema}
    diffs = [
        f"{f.name} is {f.type} here, {theirs[f.name]} in {'/'.join(first.path.parts[-3:])}"
        for f in got.table.schema
        if f.name in theirs and f.type != theirs[f.name]
    ]
    order = [f.name for f in got.table.schema] != list(theirs)
    raise DatasetError(
        f"{got.path}: "
        + ("; ".join(diffs) if diffs else f"its columns differ from {first.path}'s")
        + (" (and the column order differs)" if diffs and order else ""),
        path=got.path,
        hint="every data file of a dataset has the same column types: export or convert the dataset again",
    )


def refuse_null_keys(table: pa.Table, files: Sequence[FileRead], columns: Sequence[str]) -> None:
    """DatasetError (exit 40) naming the file, the column, how many values it misses and its first null row, when
    one of the key `columns` (episode_index, frame_index, index, task_index, timestamp: lerobot writes them at
    every frame) of `table`, the rows of `files` concatenated in order, holds a null. Arrow counts nulls as it
    decodes, so a clean batch costs a lookup per column (per batch, not per file: on 5,000 small files the
    per-file lookups cost a tenth of a second); a null cast to int64 would be -9223372036854775808, a frame or
    episode that exists nowhere (audit50_D F2/F3)."""
    names = table.schema.names
    for name in columns:
        if name not in names or not table.column(name).null_count:
            continue
        col = table.column(name)
        first = int(np.flatnonzero(col.is_null().to_numpy())[0])
        ends = np.cumsum([got.table.num_rows for got in files])
        k = int(np.searchsorted(ends, first, side="right"))
        got = files[k]
        row = first - (int(ends[k - 1]) if k else 0)
        where = f"row {row} of this file"
        if name != "episode_index" and "episode_index" in names:
            episode = table.column("episode_index")[first].as_py()
            where += f", episode {episode}" if episode is not None else ""
        nulls = got.table.column(name).null_count
        raise DatasetError(
            f"{got.path}: {name} is missing (null) in {nulls} of {got.table.num_rows} rows, the first at {where}",
            path=got.path,
            field=name,
            hint="lerobot writes episode_index, frame_index, index, task_index and timestamp at every frame: the "
            "file was edited or written by a broken converter; restore it from its source or export the dataset "
            "again",
        )


def read_metadata(path: Path) -> pq.FileMetaData:
    """A parquet file's footer, with read_parquet's errors."""
    try:
        return pq.read_metadata(path)
    except FileNotFoundError:
        raise InputNotFoundError(f"{path}: missing", path=path, hint="copy the dataset's data/ folder again") from None
    except (pa.ArrowException, OSError) as exc:
        raise parquet_error(Path(path), exc) from None


def read_schema_names(path: Path) -> list[str]:
    """A parquet file's Arrow column names, with read_parquet's errors."""
    try:
        return list(pq.read_schema(path).names)
    except FileNotFoundError:
        raise InputNotFoundError(f"{path}: missing", path=path, hint="copy the dataset's data/ folder again") from None
    except (pa.ArrowException, OSError) as exc:
        raise parquet_error(Path(path), exc) from None


def ordered_map(fn: Callable[[T], R], items: Iterable[T], *, threads: int = SCAN_THREADS) -> Iterator[R]:
    """fn(item) for each item, computed on `threads` threads, yielded in item order.

    Many small items go to the threads in runs (up to 32 a task), so threads hand results over a
    few hundred times, not once per file: each hand-over waits for the GIL (up to its 5 ms switch
    interval while another thread runs Python), which on 5,000 files cost more than the reads.
    At most 2 * threads tasks are in flight or waiting, so a consumer that stops early (or raises)
    leaves little work behind; pending tasks are cancelled when the iterator is closed.
    """
    items = list(items)
    if threads <= 1 or len(items) <= 1:
        yield from map(fn, items)
        return
    per_task = max(1, min(32, len(items) // (threads * 8)))
    runs = [items[i : i + per_task] for i in range(0, len(items), per_task)]
    window = 2 * threads

    def run(batch: list[T]) -> list[R]:
        return [fn(item) for item in batch]

    with ThreadPoolExecutor(max_workers=min(threads, len(runs)), thread_name_prefix="scan") as pool:
        pending: deque[Future[list[R]]] = deque()
        try:
            for batch in runs:
                pending.append(pool.submit(run, batch))
                if len(pending) >= window:
                    yield from pending.popleft().result()
            while pending:
                yield from pending.popleft().result()
        finally:
            for fut in pending:
                fut.cancel()
