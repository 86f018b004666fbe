"""Write validated tar members into a fresh staging folder, fast (raw os calls, no tarfile).

Only members that reproduction/release/safety.py accepted reach here, and the destination is a
private staging folder; still, as a second line of defence every path is opened component by
component from its folder's fd with O_NOFOLLOW (`DirFds`) and files with O_EXCL, so no member is
ever written through a symlink, whatever validation missed. Data goes from the decompressor's
window straight to os.write, and each header is checked against the validated list, so an archive
swapped between the two reads (list, then extract) is refused.

Modes: as tar does for a user other than root, every mode restore sets is the archive's with the
process umask applied: a file gets `mode & 0o777 & ~umask`, a folder `mode & 0o1777 & ~umask` (the
sticky bit kept, so a shared 0o1777 folder never becomes a plain world-writable one), so an archive
cannot make a world-writable file or folder under umask 022 (audit45 F7), and exec bits the umask
allows stay. Owner bits are added: a file is always readable by its owner (u+r), because restore reads
back what it wrote (relocation, the source-tree comparison, `--deep`); a mode-000 member made every
later restore of its bundle fail (audit56 A1). A folder, the target's own included, always gets u+rwx
(`folder_mode`), because restore stats and reads what lies below it, renames relocated files into it
and swaps and removes old trees: a folder packed without owner r/x (mode 0000 or 0644) made every
later restore by a user other than root re-extract its runtime target or call its files locally
edited (audit63 A L1). Setuid/setgid members never get here (safety.py refuses them). The receipt and
the no-change check look at size, mtime and the setuid/setgid bits; `--deep` compares folder modes
with a fresh extraction's, made by the same rules.
"""

from __future__ import annotations

import errno
import hashlib
import os
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from reproduction.errors import PortableError, UnsafeArchiveError, os_error
from reproduction.release.tarscan import Member, StreamSource, iter_members, stream_bound

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


DISAGREE_HINT = (
    "run restore again; if it fails the same way, the bundle's member index does not describe its archive (a "
    "publisher's tool wrote it wrong, or it was tampered with): do not use this bundle, ask its publisher to re-pack it"
)
"""The hint when the streamed archive is not what its member index lists: a restore cannot tell a concurrent change
from an index that never matched (audit59 A2: "run restore again" alone looped for ever)."""


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


def write_failed(exc: OSError, what: str) -> PortableError:
    """A clear one-line error for a failed write into staging (through the one OSError mapping)."""
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # a symlink or file where a folder must be: never followed
        return UnsafeArchiveError(
            f"cannot write {what}: a path component is a symlink or a file, not a folder ({exc.filename or exc})",
            archive=None,
            member=exc.filename,
            hint="do not use this bundle; ask its publisher to re-pack it with `portable pack`",
        )
    return os_error(
        exc,
        what,
        hint="free some space (or raise the limit, or fix the permissions) and run `portable restore` again; "
        "the previous state is kept",
    )


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_OPEN_DIRS = 64  # per extracting thread; several layers extract at once under one fd limit


_PATH_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_parent(root: Path, rel: str) -> tuple[int, str]:
    """(O_PATH fd of the folder holding `rel` below `root`, the last component of `rel`), reached from `root` one
    folder at a time without following a link, each folder on the way closed: any depth, and search permission is
    all a folder needs (review64 R M1, L1). The caller closes the fd. Raises OSError naming the full path of the
    folder that failed (ELOOP or ENOTDIR below `root`: a symlink or a file in place of a folder)."""
    head, _, base = rel.rpartition("/")
    here = root
    try:
        fd = os.open(here, _PATH_FLAGS)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(here)) from None
    try:
        for part in head.split("/") if head else ():
            here = here / part
            try:
                inner = os.open(part, _PATH_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise OSError(exc.errno, exc.strerror, str(here)) from None
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd, base


def open_below(root: Path, rel: str, *, flags: int = _DIR_FLAGS) -> int:
    """An fd of the folder `rel` below `root` (opened with `flags`, O_NOFOLLOW and O_DIRECTORY added), every folder on
    the way reached from `root` without following a link (`open_parent`); `rel` itself a symlink or a file is ELOOP or
    ENOTDIR too. The caller closes it. Raises OSError naming the full path that failed."""
    parent, base = open_parent(root, rel)
    try:
        return os.open(base, flags | os.O_NOFOLLOW | os.O_DIRECTORY, dir_fd=parent)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(Path(root) / rel)) from None
    finally:
        os.close(parent)


class DirFds:
    """Folder fds below one root, each opened from its parent's fd with O_NOFOLLOW (openat-style).

    Every member is created relative to its folder's fd, and every folder is reached component by
    component without following a link, so no name in an archive is ever resolved through a
    symlink: a validation gap cannot become a write outside the root (ELOOP/ENOTDIR instead).
    `root_fd` (owned from then on) is the root's fd already opened, e.g. by `open_below` from a folder above it:
    `root` as a path would follow a link in a folder above it.
    """

    def __init__(self, root: str, *, root_fd: int | None = None) -> None:
        self.fds: dict[str, int] = {"": os.open(root, _DIR_FLAGS) if root_fd is None else root_fd}

    def fd(self, rel: str) -> int:
        """The fd of folder `rel` ('' is the root), opening missing components without following links."""
        fd = self.fds.get(rel)
        if fd is not None:
            return fd
        if len(self.fds) > _MAX_OPEN_DIRS:
            self._trim()
        parts = rel.split("/")
        depth = len(parts) - 1
        while depth and "/".join(parts[:depth]) not in self.fds:
            depth -= 1
        fd = self.fds["/".join(parts[:depth])]
        for i in range(depth, len(parts)):
            fd = os.open(parts[i], _DIR_FLAGS, dir_fd=fd)
            self.fds["/".join(parts[: i + 1])] = fd
        return fd

    def parent(self, rel: str) -> tuple[int, str]:
        """(fd of the folder holding `rel`, the last component of `rel`)."""
        head, _, base = rel.rpartition("/")
        return self.fd(head), base

    def _trim(self) -> None:
        root = self.fds.pop("")
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {"": root}

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}


def _open_new(dirs: DirFds, rel: str, mode: int) -> int:
    dir_fd, base = dirs.parent(rel)
    try:
        return os.open(base, _FLAGS, mode, dir_fd=dir_fd)
    except FileExistsError:  # a later overlay layer replaces an earlier layer's file
        os.unlink(base, dir_fd=dir_fd)
        return os.open(base, _FLAGS, mode, dir_fd=dir_fd)


def _write_file(dirs: DirFds, m: Member, source: StreamSource, umask: int, hasher=None) -> None:
    """Write one file straight from the decompressor's window (no copy), then its mtime; created with
    the archive's mode less the umask, plus u+r (the module doc), never chmod-ed past it."""
    fd = _open_new(dirs, m.name, m.mode & 0o777 & ~umask | 0o400)
    try:
        while source.left:  # read_data hands out what the window holds, up to the member's end
            view = source.read_data(1 << 30)
            if hasher is not None:
                hasher.update(view)
            done = 0
            while done < len(view):
                done += os.write(fd, view[done:])
        os.utime(fd, ns=(m.mtime * 1_000_000_000, m.mtime * 1_000_000_000))
    finally:
        os.close(fd)


def _make_dirs(dirs: DirFds, members: list[Member], root: Path | None = None) -> None:
    """Every folder the members need, each created once, parents first (never through a link). An error names the
    folder's path below `root` (the *at call named only its last component: "the disk is full at lib", review65 S)."""
    needed: set[str] = set()
    for m in members:
        head = m.name if m.kind == "dir" else m.name.rpartition("/")[0]
        while head and head not in needed:  # a folder already needed brought its parents with it
            needed.add(head)
            head = head.rpartition("/")[0]
    for rel in sorted(needed, key=lambda d: (d.count("/"), d)):
        try:
            dir_fd, base = dirs.parent(rel)
            try:
                os.mkdir(base, 0o755, dir_fd=dir_fd)
            except FileExistsError:
                pass
        except OSError as exc:
            if root is not None and exc.errno is not None and not os.path.isabs(os.fsdecode(exc.filename or "")):
                raise type(exc)(exc.errno, exc.strerror, str(Path(root) / rel)) from None
            raise


def _finish(dirs: DirFds, members: list[Member], written: Written, umask: int) -> None:
    """Symlinks, then folder modes less the umask, sticky bit kept (last and deepest first, so a read-only
    folder blocks nothing); a folder whose mode is what `_make_dirs` gave it (0o755 less the umask) is left."""
    for m in members:
        if m.kind == "symlink":
            dir_fd, base = dirs.parent(m.name)
            try:
                os.unlink(base, dir_fd=dir_fd)
            except FileNotFoundError:
                pass
            os.symlink(m.linkname, base, dir_fd=dir_fd)
            written.links[m.name] = m.linkname
    made = 0o755 & ~umask
    modes = [m for m in members if m.kind == "dir" and m.name and folder_mode(m.mode, umask) != made]
    for m in sorted(modes, key=lambda m: -m.name.count("/")):
        os.fchmod(dirs.fd(m.name), folder_mode(m.mode, umask))
    for m in members:  # the target itself, when the archive lists it as `./` (pack does since audit63 A L9), last
        if m.name == "" and m.kind == "dir":
            os.fchmod(dirs.fd(""), folder_mode(m.mode, umask))


def folder_mode(mode: int, umask: int) -> int:
    """The mode restore gives a folder member: the archive's less the umask, sticky bit kept, plus u+rwx (the module
    doc: restore stats, reads, relocates and removes what lies below its folders)."""
    return mode & 0o1777 & ~umask | 0o700


def member_count_error(archive: str, declared: int, name: str) -> UnsafeArchiveError:
    """The one refusal of a layer holding more members than the `members` bundle.json declares (audit45 F3)."""
    return UnsafeArchiveError(
        f"{archive}: holds more than the {declared} members bundle.json declares (member {declared + 1}: "
        f"{name!r}); nothing was extracted",
        archive=archive,
        member=name,
        hint="do not use this bundle; ask its publisher to re-pack it with `portable pack`",
    )


def _differs(listed: Member | None, got: Member) -> str:
    """What the member index lists where the archive holds `got`: its name, or, for the same name, the field that
    differs with both values (audit62 L6: the same name printed twice did not say what to look at)."""
    if listed is None:
        return "no further member"
    if listed.name != got.name:
        a, b = listed.raw_name, got.raw_name
        if unicodedata.normalize("NFC", a) == unicodedata.normalize("NFC", b):  # repr shows both alike (audit63 A L8)
            return (
                f"{a!r}, the same name in another Unicode normalisation: {ascii(a)} ({_form(a)}) in the index, "
                f"{ascii(b)} ({_form(b)}) in the archive"
            )
        return repr(a)
    for name, show in (
        ("kind", str),
        ("mode", lambda v: f"{v:o}"),
        ("size", lambda v: f"{v} bytes"),
        ("linkname", repr),
    ):
        a, b = getattr(listed, name), getattr(got, name)
        if a != b:
            label = "link text" if name == "linkname" else name
            return f"the same name, but its {label} is {show(a)} in the index and {show(b)} in the archive"
    return repr(listed.raw_name)


def _form(name: str) -> str:
    for form in ("NFC", "NFD"):
        if unicodedata.is_normalized(form, name):
            return form
    return "neither NFC nor NFD"


def extract_stream(
    stream: IO[bytes],
    expected: list[Member],
    dest: Path,
    *,
    archive: str,
    tar_size: int = 0,
    members: int = 0,
    digests: bool = False,
    on_bytes: Callable[[int], None] | None = None,
    dest_fd: int | None = None,
) -> Written:
    """Stream the tar in `stream` into `dest`, refusing any member that differs from `expected`.

    One thread writes: writer threads were measured here and did not help (file creation is kernel
    time that serialises in ext4) while they took CPU from the hashing that overlaps extraction.
    `digests` also records the sha256 of every file written (cheap for small source layers).
    `tar_size` bounds the decompressed stream (not declared, 0: tarscan.stream_bound of `expected`),
    a declared `members` (0: not declared) and `expected` bound the member count, and at most
    MAX_TRAILER bytes may follow the end-of-archive block: past any is UnsafeArchiveError, raised
    while streaming. `dest_fd` (the caller's, left open): `dest` already made and opened (restore's staging folder,
    reached from the state folder's fd: audit65 H1), written through it, never looked up by path.
    """
    umask, written = _UMASK, Written()
    bound = "that its listed members allow (bundle.json declares no tar_size)" if not tar_size else ""
    limit = tar_size or stream_bound(sum(m.size for m in expected), len(expected))
    source = StreamSource(stream, archive=archive, limit=limit, bound=bound)
    dirs: DirFds | None = None
    current: str | None = None  # the member being written: an OSError of a write by dir_fd names its bare name
    try:
        if dest_fd is None:
            os.makedirs(dest, exist_ok=True)
            dirs = DirFds(str(dest))
        else:
            dirs = DirFds(str(dest), root_fd=os.dup(dest_fd))
        _make_dirs(dirs, expected, Path(dest))
        seen, most = 0, min(len(expected), members or len(expected))
        for m in iter_members(source, archive=archive):
            current = m.name
            if seen >= most or m.key() != expected[seen].key():
                if members and seen == members:
                    raise member_count_error(archive, members, m.raw_name)
                raise UnsafeArchiveError(
                    f"{archive}: member {m.raw_name!r} is not what its member index lists next "
                    f"({_differs(expected[seen] if seen < len(expected) else None, m)}): the "
                    "index and the archive disagree, or the archive changed since it was validated",
                    archive=archive,
                    member=m.raw_name,
                    hint=DISAGREE_HINT,
                )
            seen += 1
            if m.kind == "file":
                hasher = hashlib.sha256() if digests else None
                _write_file(dirs, m, source, umask, hasher)
                if hasher is not None:
                    written.digests[m.name] = hasher.hexdigest()
                written.files[m.name] = [m.size, m.mtime * 1_000_000_000]
                if on_bytes is not None:
                    on_bytes(m.size)
        source.drain()
        if seen != len(expected):
            raise UnsafeArchiveError(
                f"{archive}: ended after {seen} of the {len(expected)} members its member index lists",
                archive=archive,
                hint=DISAGREE_HINT,
            )
        _finish(dirs, expected, written, umask)
    except OSError as exc:
        if current and exc.filename is not None and not os.path.isabs(os.fsdecode(exc.filename)):
            exc.filename = str(Path(dest) / current)  # the member's path, on the disk that is full (audit63 A L6)
        raise write_failed(exc, f"the staging folder {dest}") from None
    finally:
        if dirs is not None:
            dirs.close()
    return written
