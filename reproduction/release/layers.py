"""Read layer archives for restore: hash the compressed bytes and list the members in one pass.

Small layers (up to a memory budget) are decompressed once into memory and extracted from there;
bigger ones are streamed twice (list, then extract). Either way the archive's digest is computed
from the same read that lists its members, so verify and validate cost one decompression.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from reproduction.digests import sha256_file
from reproduction.errors import UnsafeArchiveError
from reproduction.release.extract import Written, extract_buffer, extract_stream
from reproduction.release.manifest import LayerEntry
from reproduction.release.tarscan import Member, StreamSource, iter_members, list_members
from reproduction.release.zstdio import CHUNK, open_decompressed, read_all, zstd_error


@dataclass(kw_only=True, slots=True)
class LoadedLayer:
    """A layer archive that has been read once."""

    entry: LayerEntry
    """The manifest's description of the layer."""
    digest: str
    """SHA-256 of the archive bytes as read."""
    members: list[Member]
    """Its members (empty when the digest did not match: never parse untrusted bytes)."""
    buf: bytearray | None = None
    """The decompressed tar, for layers small enough to keep in memory."""
    error: str = ""
    """Why the archive could not be decompressed (a corrupt stream with a matching digest)."""


def memory_budget() -> int:
    """Bytes of decompressed tar restore may hold in memory at once: a quarter of what is available."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 // 4
    except (OSError, ValueError, IndexError):
        pass
    return 1 << 30


def load_layer(bundle: Path, entry: LayerEntry, expected_sha: str, *, in_memory: bool) -> LoadedLayer:
    """Read `entry`'s archive once: digest, and (if it matches `expected_sha`) its member list.

    Never raises for corrupt bytes: a digest mismatch is returned for verify to report. A stream
    that fails to decompress although its digest matches raises UnsafeArchiveError (exit 6).
    """
    path = bundle / entry.archive
    hasher = hashlib.sha256()
    buf: bytearray | None = None
    members: list[Member] = []
    try:
        with open_decompressed(path, hasher=hasher) as stream:
            if in_memory:
                buf = read_all(stream, entry.tar_size)
            else:
                members = list(iter_members(StreamSource(stream), archive=entry.archive))
                while stream.read(CHUNK):
                    pass  # the digest must cover the whole file
    except (zstd_error(), UnsafeArchiveError, EOFError, ValueError) as exc:
        digest = sha256_file(path)
        if digest != expected_sha:
            return LoadedLayer(entry=entry, digest=digest, members=[])
        raise UnsafeArchiveError(f"{entry.archive}: cannot be read although its digest matches bundle.json ({exc})",
                                 archive=entry.archive, hint="the publisher packed a broken archive; ask for a re-pack") from None
    digest = hasher.hexdigest()
    if digest != expected_sha:
        return LoadedLayer(entry=entry, digest=digest, members=[])
    if buf is not None:
        members = list_members(buf, archive=entry.archive)
    return LoadedLayer(entry=entry, digest=digest, members=members, buf=buf)


def extract_layer(bundle: Path, layer: LoadedLayer, dest: Path, *, jobs: int,
                  on_bytes: Callable[[int], None] | None = None) -> Written:
    """Write a validated layer into `dest` (from memory, or by streaming the archive again).

    The second stream is hashed too and must give the same digest, so an archive replaced between
    the two reads is refused (UnsafeArchiveError) rather than extracted unvalidated.
    """
    if layer.buf is not None:
        written = extract_buffer(layer.buf, layer.members, dest, jobs=jobs, on_bytes=on_bytes)
        layer.buf = None  # free the memory as soon as it is written
        return written
    hasher = hashlib.sha256()
    with open_decompressed(bundle / layer.entry.archive, hasher=hasher) as stream:
        written = extract_stream(stream, layer.members, dest, archive=layer.entry.archive, on_bytes=on_bytes)
        while stream.read(CHUNK):
            pass
    if hasher.hexdigest() != layer.digest:
        raise UnsafeArchiveError(f"{layer.entry.archive}: changed while it was being restored", archive=layer.entry.archive,
                                 hint="make sure nothing else writes the bundle, then run restore again")
    return written


def in_memory_plan(entries: list[LayerEntry]) -> dict[str, bool]:
    """Which layers to decompress into memory: smallest first while they fit the budget together."""
    budget = memory_budget()
    plan: dict[str, bool] = {}
    for entry in sorted(entries, key=lambda e: e.tar_size or e.unpacked_size):
        size = max(entry.tar_size, entry.unpacked_size + 1024 * max(1, entry.members))
        plan[entry.archive] = size <= budget
        if plan[entry.archive]:
            budget -= size
    return plan


def tree_files(root: Path) -> set[str]:
    """Relative paths of the files and symlinks below `root` (no folders), `__pycache__` ignored."""
    out: set[str] = set()
    for dirpath, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__" or os.path.islink(os.path.join(dirpath, d))]
        rel = os.path.relpath(dirpath, root)
        out.update(n if rel == "." else f"{rel}/{n}" for n in names)
        out.update(d if rel == "." else f"{rel}/{d}" for d in dirs if os.path.islink(os.path.join(dirpath, d)))
    return out
