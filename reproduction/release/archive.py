"""Write a folder as a reproducible `.tar.zst` layer: same tree in, same bytes out.

Members are sorted (after the layer's own folder, `./`, which carries its mode), every mtime is
FIXED_MTIME, owners are 0/0 with empty names, modes keep only permission bits (and a folder's sticky
bit), hard-linked files are stored as plain copies (restore refuses hard links), and absolute symlinks
into a packed layer become relative ones (restore refuses absolute links). The tar is PAX, compressed
by zstd with several threads (its output does not depend on the count).
"""

from __future__ import annotations

import os
import posixpath
import stat as stat_mod
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from reproduction.errors import InvalidInputError
from reproduction.release.spec import LayerSpec, excluded
from reproduction.release.tarscan import Member
from reproduction.release.zstdio import open_compressor

FIXED_MTIME = 1577836800  # 2020-01-01T00:00:00Z: a fixed, plausible date (0 upsets some tools)
LEVEL = 3


@dataclass(kw_only=True, slots=True)
class LayerContents:
    """What a layer archive holds, as restore will see it."""

    members: list[Member] = field(default_factory=list)
    """Members in archive order (names relative to the target)."""
    unpacked_size: int = 0
    """Sum of file sizes."""
    tar_size: int = 0
    """Size of the uncompressed tar stream."""
    newest_mtime: float = 0.0
    """Newest mtime among the packed source entries (what `created` is derived from)."""


def walk_tree(src: Path, exclude: tuple[str, ...]) -> list[tuple[str, os.stat_result]]:
    """Every path under `src` (relative, POSIX, sorted by bytes) with its lstat, minus excluded ones."""
    out: list[tuple[str, os.stat_result]] = []

    def listing(rel_dir: str) -> Iterator[os.DirEntry]:
        with os.scandir(os.path.join(src, rel_dir) if rel_dir else src) as it:
            entries = sorted(it, key=lambda e: e.name.encode("utf-8", "surrogateescape"))
        return iter(entries)

    # the same pre-order as a recursive walk, with an explicit stack: a tree ~1000 folders deep was a
    # RecursionError, exit 1 (audit48 F9)
    stack: list[tuple[str, Iterator[os.DirEntry]]] = [("", listing(""))]
    while stack:
        rel_dir, entries = stack[-1]
        entry = next(entries, None)
        if entry is None:
            stack.pop()
            continue
        rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
        if excluded(rel, exclude):
            continue
        st = entry.stat(follow_symlinks=False)
        out.append((rel, st))
        if stat_mod.S_ISDIR(st.st_mode):
            stack.append((rel, listing(rel)))
    return out


def relink(link: str, member_path: str, link_roots: dict[str, str], *, layer: str) -> str:
    """Link text as restore should see it: absolute links into a packed layer become relative.

    `member_path` is the bundle-relative path of the symlink; `link_roots` maps absolute source
    folders (and build prefixes) to bundle-relative targets. Raises InvalidInputError for an
    absolute link to anything else.
    """
    if not link.startswith("/"):
        return link
    for root in sorted(link_roots, key=len, reverse=True):
        if link == root or link.startswith(root.rstrip("/") + "/"):
            dest = link_roots[root] + link[len(root.rstrip("/")) :]
            return posixpath.relpath(dest, posixpath.dirname(member_path))
    raise InvalidInputError(
        f"layer {layer}: symlink {member_path!r} points to {link!r}, outside every packed layer",
        field="layer.source",
        hint="pack what it points to as a layer too, or exclude the link",
    )


def _tarinfo(rel: str, st: os.stat_result, *, kind: bytes, size: int = 0, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(rel)
    info.type, info.size, info.linkname = kind, size, linkname
    # Permission bits, and a folder's sticky bit: restore keeps it (extract.py), so a shared 0o1777 folder comes back
    # one, not a plain world-writable folder (audit63). Setuid/setgid are dropped, from folders as from files: restore
    # refuses a member that has them (safety.py), and a file's sticky bit means nothing on Linux (extract drops it).
    info.mode = st.st_mode & (0o1777 if kind == tarfile.DIRTYPE else 0o777)
    info.mtime, info.uid, info.gid, info.uname, info.gname = FIXED_MTIME, 0, 0, "", ""
    return info


def write_layer(layer: LayerSpec, out: Path, *, link_roots: dict[str, str], threads: int = 2) -> LayerContents:
    """Pack `layer.source` into `out` (.tar.zst, reproducible) and describe what it holds.

    Writes `out` directly: callers write to a temporary name and rename. Raises InvalidInputError
    for special files (devices, fifos, sockets) and absolute symlinks out of every layer.
    """
    contents = LayerContents()
    entries = walk_tree(layer.source, layer.exclude)
    with open_compressor(out, level=LEVEL, threads=threads) as zfh:
        counter = _CountingWriter(zfh)
        with tarfile.open(
            fileobj=counter, mode="w|", format=tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape"
        ) as tar:
            # The layer's own folder first, as `./`, so its mode travels too (a shared 0o1777 root came back 0o777 or
            # 0o755: audit63 A L9). Every restore since the first accepts a `./` folder member (safety.validate_layers)
            # and the index row '' (layers._row); one without extract._finish's root chmod ignores its mode, as it did
            # when pack wrote none, and a bundle without one restores as before.
            root = _tarinfo(".", os.stat(layer.source), kind=tarfile.DIRTYPE)
            tar.addfile(root)
            contents.members.append(
                Member(name="", raw_name=root.name, kind="dir", mode=root.mode, size=0, mtime=FIXED_MTIME)
            )
            for rel, st in entries:
                contents.newest_mtime = max(contents.newest_mtime, st.st_mtime)
                info = _member_info(layer, rel, st, link_roots)
                if info.type == tarfile.REGTYPE:
                    with open(layer.source / rel, "rb") as fh:
                        tar.addfile(info, fh)
                else:
                    tar.addfile(info)
                kind = {tarfile.REGTYPE: "file", tarfile.DIRTYPE: "dir", tarfile.SYMTYPE: "symlink"}[info.type]
                contents.members.append(
                    Member(
                        name=rel,
                        raw_name=rel,
                        kind=kind,
                        mode=info.mode,
                        size=info.size,
                        mtime=FIXED_MTIME,
                        linkname=info.linkname,
                    )
                )
                contents.unpacked_size += info.size
        contents.tar_size = counter.count
    return contents


def _member_info(layer: LayerSpec, rel: str, st: os.stat_result, link_roots: dict[str, str]) -> tarfile.TarInfo:
    if stat_mod.S_ISREG(st.st_mode):  # a plain member even for a sparse file: tarfile writes no sparse members (its
        # holes are read as zeros), and restore refuses GNU tar's (tarscan.SPARSE, audit63 A M3)
        return _tarinfo(rel, st, kind=tarfile.REGTYPE, size=st.st_size)
    if stat_mod.S_ISDIR(st.st_mode):
        return _tarinfo(rel, st, kind=tarfile.DIRTYPE)
    if stat_mod.S_ISLNK(st.st_mode):
        link = os.readlink(layer.source / rel)
        return _tarinfo(
            rel, st, kind=tarfile.SYMTYPE, linkname=relink(link, f"{layer.target}/{rel}", link_roots, layer=layer.name)
        )
    raise InvalidInputError(
        f"layer {layer.name}: {layer.source / rel} is a special file (device, fifo or socket)",
        path=layer.source / rel,
        field="layer.source",
        hint="exclude it in the spec (exclude = [...])",
    )


class _CountingWriter:
    """Counts the bytes tarfile writes (the uncompressed size restore preallocates)."""

    def __init__(self, fh) -> None:
        self._fh, self.count = fh, 0

    def write(self, data) -> int:
        self.count += len(data)
        self._fh.write(data)
        return len(data)
