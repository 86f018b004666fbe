"""SHA-256 of files and trees with hashlib, in parallel threads (hashlib releases the GIL), and of JSON-ready values
in their one canonical form (what stage keys, config digests and outputs digests are made of).

Never shell out to `sha256sum`: it is ~7x slower than hashlib with SHA-NI on these machines.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

CHUNK = 1 << 20
_HEX = frozenset("0123456789abcdef")


def is_sha256(value: object) -> bool:
    """Whether `value` is a hex SHA-256 as this project writes it: a str of 64 lowercase hex digits."""
    return isinstance(value, str) and len(value) == 64 and _HEX.issuperset(value)


def sha256_file(path: Path, *, on_bytes: Callable[[int], None] | None = None) -> str:
    """Hex SHA-256 of a file's bytes, read in 1 MiB chunks; `on_bytes(n)` reports progress."""
    with open(path, "rb", buffering=0) as fh:
        return sha256_open(fh, on_bytes=on_bytes)


def sha256_open(fh: BinaryIO, *, on_bytes: Callable[[int], None] | None = None) -> str:
    """Hex SHA-256 of the rest of the unbuffered file `fh` (see `sha256_file`)."""
    h = hashlib.sha256()
    # a small file gets a small buffer: zero-filling 1 MiB costs more than hashing a 20 KiB source file
    buf = bytearray(min(CHUNK, os.fstat(fh.fileno()).st_size + 1))
    view = memoryview(buf)
    while True:
        n = fh.readinto(buf)
        if not n:
            break
        h.update(view[:n])
        if on_bytes is not None:
            on_bytes(n)
    return h.hexdigest()


def canonical_json(obj: object) -> str:
    """`obj` as compact JSON with sorted keys (non-JSON values by str): equal values give equal text, so the runner's
    keys and the digests lineage --verify recomputes from run.json agree byte for byte."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def json_sha256(obj: object) -> str:
    """Hex SHA-256 of `canonical_json(obj)`."""
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()


def default_jobs() -> int:
    return max(2, min(16, (os.cpu_count() or 2)))


def sha256_files(
    paths: Iterable[Path], *, jobs: int | None = None, on_bytes: Callable[[int], None] | None = None
) -> dict[Path, str]:
    """Hash many files concurrently; returns {path: hexdigest}. Raises the first OSError met."""
    paths = list(paths)
    with ThreadPoolExecutor(max_workers=jobs or default_jobs()) as pool:
        digests = pool.map(lambda p: sha256_file(p, on_bytes=on_bytes), paths)
        return dict(zip(paths, digests))
