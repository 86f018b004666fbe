"""Write validated tar members into a fresh staging folder, fast (raw os calls, no tarfile).

Only members that reproduction/release/safety.py accepted reach here, and the destination is a
private staging folder, so the writer can be simple; it still opens with O_NOFOLLOW|O_EXCL as a
second line of defence. Data goes from the decompressor's window straight to os.write, and each
header is checked against the validated list, so an archive swapped between the two reads (list,
then extract) is refused.
"""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from reproduction.errors import UnsafeArchiveError, WriteFailedError
from reproduction.release.tarscan import Member, StreamSource, iter_members

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_SPACE_ERRORS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _umask()  # read once: os.umask is process-wide, so reading it from threads would race


@dataclass(kw_only=True, slots=True)
class Written:
    """What an extraction created, for the receipt (paths relative to the layer target)."""

    files: dict[str, list[int]] = field(default_factory=dict)
    """path -> [size, mtime_ns] exactly as written."""
    links: dict[str, str] = field(default_factory=dict)
    """path -> symlink text."""
    digests: dict[str, str] = field(default_factory=dict)
    """path -> sha256 of what was written (only when asked for: source layers, for `restore --deep`)."""


def write_failed(exc: OSError, what: str) -> WriteFailedError:
    """A clear one-line error for a failed write (disk full, file too large, read-only)."""
    reason = {
        errno.ENOSPC: "the disk is full",
        errno.EFBIG: "a file is larger than allowed (file size limit)",
        errno.EDQUOT: "the disk quota is exceeded",
        errno.EROFS: "the filesystem is read-only",
    }.get(exc.errno, exc.strerror)
    return WriteFailedError(
        f"cannot write {what}: {reason} ({exc.filename or exc})",
        path=exc.filename,
        hint="free some space (or raise the limit) and run `portable restore` again; the previous state is kept",
    )


def _open_new(path: str, mode: int) -> int:
    try:
        return os.open(path, _FLAGS, mode)
    except FileExistsError:  # a later overlay layer replaces an earlier layer's file
        os.unlink(path)
        return os.open(path, _FLAGS, mode)


def _write_file(root: str, m: Member, source: StreamSource, umask: int, hasher=None) -> None:
    """Write one file straight from the decompressor's window (no copy), then its mode and mtime."""
    mode = m.mode & 0o777
    fd = _open_new(f"{root}/{m.name}", mode)
    try:
        while True:
            view = source.read_data(1 << 30)
            if not view:
                break
            if hasher is not None:
                hasher.update(view)
            done = 0
            while done < len(view):
                done += os.write(fd, view[done:])
        if mode & ~umask != mode:
            os.fchmod(fd, mode)
        os.utime(fd, ns=(m.mtime * 1_000_000_000, m.mtime * 1_000_000_000))
    finally:
        os.close(fd)


def _make_dirs(root: str, members: list[Member]) -> None:
    """Every folder the members need, each created once, parents first."""
    dirs: set[str] = set()
    for m in members:
        parts = m.name.split("/")
        for depth in range(1, len(parts) + (m.kind == "dir")):
            dirs.add("/".join(parts[:depth]))
    dirs.discard("")
    for rel in sorted(dirs, key=lambda d: (d.count("/"), d)):
        try:
            os.mkdir(f"{root}/{rel}", 0o755)
        except FileExistsError:
            pass


def _finish(root: str, members: list[Member], written: Written) -> None:
    """Symlinks, then folder modes (last, so a read-only folder does not block its own contents)."""
    for m in members:
        if m.kind == "symlink":
            path = f"{root}/{m.name}"
            if os.path.lexists(path):
                os.unlink(path)
            os.symlink(m.linkname, path)
            written.links[m.name] = m.linkname
    for m in members:
        if m.kind == "dir" and m.name and (m.mode & 0o777) != 0o755:
            os.chmod(f"{root}/{m.name}", m.mode & 0o777)


def extract_stream(
    stream: IO[bytes],
    expected: list[Member],
    dest: Path,
    *,
    archive: str,
    digests: bool = False,
    on_bytes: Callable[[int], None] | None = None,
) -> Written:
    """Stream the tar in `stream` into `dest`, refusing any member that differs from `expected`.

    One thread writes: writer threads were measured here and did not help (file creation is kernel
    time that serialises in ext4) while they took CPU from the hashing that overlaps extraction.
    `digests` also records the sha256 of every file written (cheap for small source layers).
    """
    root, umask, written = str(dest), _UMASK, Written()
    source = StreamSource(stream)
    try:
        os.makedirs(root, exist_ok=True)
        _make_dirs(root, expected)
        seen = 0
        for m in iter_members(source, archive=archive):
            if seen >= len(expected) or m.key() != expected[seen].key():
                raise UnsafeArchiveError(
                    f"{archive}: member {m.raw_name!r} changed since it was validated",
                    archive=archive,
                    member=m.raw_name,
                    hint="the archive changed during restore; run restore again",
                )
            seen += 1
            if m.kind == "file":
                hasher = hashlib.sha256() if digests else None
                _write_file(root, m, source, umask, hasher)
                if hasher is not None:
                    written.digests[m.name] = hasher.hexdigest()
                written.files[m.name] = [m.size, m.mtime * 1_000_000_000]
                if on_bytes is not None:
                    on_bytes(m.size)
        source.drain()
        if seen != len(expected):
            raise UnsafeArchiveError(
                f"{archive}: ended after {seen} of {len(expected)} members",
                archive=archive,
                hint="the archive changed during restore; run restore again",
            )
        _finish(root, expected, written)
    except OSError as exc:
        if exc.errno in _SPACE_ERRORS:
            raise write_failed(exc, str(dest)) from None
        raise
    return written
