"""Read layer archives for restore: hash the compressed bytes and list the members in one pass.

Each archive is streamed twice: once to hash it and list its members (verify + validate, nothing
written), once to extract. Decompressing into memory instead was measured slower here: page
faults on a buffer of the tar's size cost more than a second zstd pass through a 4 MiB window.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from reproduction.digests import sha256_file
from reproduction.errors import UnsafeArchiveError
from reproduction.release.extract import Written, extract_stream
from reproduction.release.manifest import LayerEntry
from reproduction.release.tarscan import Member, StreamSource, iter_members
from reproduction.release.zstdio import open_decompressed, zstd_error


@dataclass(kw_only=True, slots=True)
class LoadedLayer:
    """A layer archive that has been read once."""

    entry: LayerEntry
    """The manifest's description of the layer."""
    digest: str
    """SHA-256 of the archive bytes as read."""
    members: list[Member]
    """Its members (empty when the digest did not match: never trust unverified bytes)."""


def load_layer(bundle: Path, entry: LayerEntry, expected_sha: str) -> LoadedLayer:
    """Read `entry`'s archive once: its digest and (if that matches `expected_sha`) its member list.

    A digest mismatch is returned (verify reports it with the other problems). A stream that fails
    to decompress although its digest matches raises UnsafeArchiveError (exit 6).
    """
    path = bundle / entry.archive
    hasher = hashlib.sha256()
    try:
        with open_decompressed(path, hasher=hasher) as stream:
            source = StreamSource(stream)
            members = list(iter_members(source, archive=entry.archive))
            source.drain()  # the digest must cover the whole file
    except (zstd_error(), UnsafeArchiveError, EOFError, ValueError) as exc:
        digest = sha256_file(path)
        if digest != expected_sha:
            return LoadedLayer(entry=entry, digest=digest, members=[])
        raise UnsafeArchiveError(f"{entry.archive}: cannot be read although its digest matches bundle.json ({exc})",
                                 archive=entry.archive, hint="the publisher packed a broken archive; ask for a re-pack") from None
    digest = hasher.hexdigest()
    return LoadedLayer(entry=entry, digest=digest, members=members if digest == expected_sha else [])


def extract_layer(bundle: Path, layer: LoadedLayer, dest: Path, *, on_bytes: Callable[[int], None] | None = None) -> Written:
    """Write a validated layer into `dest` by streaming its archive again.

    The second read is hashed too and must give the same digest (and the same members), so an
    archive replaced between the two reads is refused (UnsafeArchiveError), never half-trusted.
    """
    hasher = hashlib.sha256()
    with open_decompressed(bundle / layer.entry.archive, hasher=hasher) as stream:
        written = extract_stream(stream, layer.members, dest, archive=layer.entry.archive, on_bytes=on_bytes)
    if hasher.hexdigest() != layer.digest:
        raise UnsafeArchiveError(f"{layer.entry.archive}: changed while it was being restored", archive=layer.entry.archive,
                                 hint="make sure nothing else writes the bundle, then run restore again")
    return written


def tree_files(root: Path) -> set[str]:
    """Relative paths of the files and symlinks below `root` (no folders), `__pycache__` ignored."""
    out: set[str] = set()
    for dirpath, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__" or os.path.islink(os.path.join(dirpath, d))]
        rel = os.path.relpath(dirpath, root)
        out.update(n if rel == "." else f"{rel}/{n}" for n in names)
        out.update(d if rel == "." else f"{rel}/{d}" for d in dirs if os.path.islink(os.path.join(dirpath, d)))
    return out
