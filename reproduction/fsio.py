"""Contained, atomic file writes shared by every package: temp file, fsync, `os.replace`."""

from __future__ import annotations

import errno
import os
import re
import secrets
import stat
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` via a process-unique temp file in the same folder, fsync, `os.replace`.

    Readers see the old file or the whole new one, never a part; on failure the temp file is removed
    and the old file (if any) is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # The writer's pid in the name: a SIGKILL skips the `finally` below, and remove_orphaned_temps then knows whose
    # leftover it is (TEMP_NAME).
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=TEMP_SUFFIX, dir=path.parent)
    except OSError as exc:  # a read-only folder: the error names `path`, not the temp name it tried (audit47 F14)
        raise _as_target(exc, path, None) from None
    try:
        # mkstemp creates 0600; give the file the mode a plain open() would (or the old file's).
        try:
            mode = os.stat(path).st_mode & 0o7777
        except FileNotFoundError:
            mode = 0o666 & ~_umask()
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        raise annotate(_as_target(exc, path, tmp), path, need=len(data))
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write_at(dir_fd: int, name: str, data: bytes, *, shown: Path) -> None:
    """`atomic_write_bytes` of the file `name` in the folder fd `dir_fd` (O_PATH is enough): the temp file is created,
    and renamed over `name`, in that folder by fd, never through a link put in the folder's place (or at `name`'s
    temp). `shown` is the file's path in errors (OSError naming it; the temp file is removed, the old file kept)."""
    tmp = f".{name}.{os.getpid()}.{secrets.token_hex(4)}{TEMP_SUFFIX}"  # TEMP_NAME: remove_orphaned_temps knows it
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    except OSError as exc:
        raise type(exc)(exc.errno, exc.strerror, str(shown)) from None
    done = False
    try:
        try:
            mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
            mode = stat.S_IMODE(mode) if stat.S_ISREG(mode) else 0o666 & ~_umask()
        except FileNotFoundError:
            mode = 0o666 & ~_umask()
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fd = -1
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        done = True
    except OSError as exc:
        raise annotate(type(exc)(exc.errno, exc.strerror, str(shown)), shown, need=len(data)) from None
    finally:
        if fd >= 0:
            os.close(fd)
        if not done:
            try:
                os.unlink(tmp, dir_fd=dir_fd)
            except OSError:
                pass


def _as_target(exc: OSError, path: Path, tmp: str | None) -> OSError:
    """`exc` naming the file being written (`path`) where the OS named the temp file beside it (mkstemp's try, the
    rename): the temp name is this module's detail, and the user looks for the file they asked for."""
    if exc.filename is None or tmp is None or str(exc.filename) == tmp or TEMP_SUFFIX in str(exc.filename):
        if exc.filename2 is not None:  # a rename's error names both; a second name cannot be unset (None prints)
            return type(exc)(exc.errno, exc.strerror, str(path))
        exc.filename = str(path)
    return exc


_REGULAR_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def open_regular(path: str | os.PathLike[str], *, dir_fd: int | None = None) -> BinaryIO | None:
    """`path` (relative to `dir_fd` when given) opened for unbuffered reading when it is a regular file, else None (a
    FIFO, a device, a folder); the caller closes it. A link as the last component is never followed (OSError ELOOP)
    and a FIFO never waited on: a file swapped for a link to /dev/zero or for a FIFO cannot hang or mislead a reader."""
    fd = os.open(path, _REGULAR_FLAGS, dir_fd=dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return open(fd, "rb", buffering=0)


def annotate(exc: OSError, path: Path | str, *, need: int | None = None) -> OSError:
    """Name `path` in `exc` when the OS did not (a write() that hit ENOSPC names no file) and keep the
    bytes the write needed (`need_bytes`), so `errors.os_error` says where and how much; returns `exc`."""
    if exc.filename is None:
        exc.filename = str(path)
    if need is not None and getattr(exc, "need_bytes", None) is None:
        exc.need_bytes = need
    return exc


@contextmanager
def naming(path: str | os.PathLike[str]) -> Iterator[None]:
    """Re-raise an OSError of the `with` body that names no file, or only a bare name (an *at call by `dir_fd`: "the
    disk is full at staging"), as one naming the full `path` (the entry the body makes or opens), so that
    `errors.os_error` names a path the user can find and adds the free-space note of its filesystem (the inode note
    of a full tmpfs included: review65 S M2). An error already naming an absolute path is left as it is."""
    try:
        yield
    except OSError as exc:
        if exc.errno is not None and (exc.filename is None or not os.path.isabs(os.fsdecode(exc.filename))):
            named = type(exc)(exc.errno, exc.strerror, os.fspath(path))
            if getattr(exc, "need_bytes", None) is not None:
                named.need_bytes = exc.need_bytes
            raise named from None
        raise


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def atomic_write_text(path: Path, text: str) -> None:
    """`atomic_write_bytes` for UTF-8 text."""
    atomic_write_bytes(path, text.encode("utf-8"))


def free_bytes(path: Path) -> int:
    """Bytes free to this user on the filesystem that holds `path` (or its nearest existing parent)."""
    import shutil

    return shutil.disk_usage(_existing(path)).free


def out_of_inodes(path: Path) -> bool:
    """Whether the filesystem that holds `path` (or its nearest existing parent) has no file slot (inode) left for
    this user: a full disk with bytes still free (tmpfs nr_inodes, an ext4 of many small files)."""
    st = os.statvfs(_existing(path))
    return st.f_files > 0 and st.f_favail == 0


def _existing(path: Path) -> Path:
    probe = Path(path).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe


def fsync_dir(path: Path) -> None:
    """Make a rename inside `path` durable (best effort on filesystems that refuse O_DIRECTORY fsync)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def user_path_argument(flag: str, text: str, *, hydra_hint: bool = False) -> Path:
    """The path the user gave as `flag`, normalised as every `portable` command's (`user_path`: `~` expanded,
    absolute, resolved). Guarantees an empty `text` is never the current folder: UsageError (exit 2) naming
    `flag`, as for an unset `--out "$OUT"` (audit47 F2); the data-generation CLIs call this too (audit53 V15), so
    one rule holds wherever a path is typed. A link loop, a link to nothing or a name too long is exit 3. Here,
    not in portable.py, so that `sim` reaches it without loading the CLI's imports (docs/architecture.md)."""
    if text == "":
        from reproduction.errors import UsageError

        raise UsageError(
            f"{flag} is empty: an empty path would mean the current folder",
            hint=f"give {flag} a path (an unset shell variable expands to nothing; use . for this folder)",
        )
    return user_path(text, what=flag, hydra_hint=hydra_hint)


def expand_home(raw: str) -> tuple[str, str | None]:
    """`raw` with a leading `~` or `~name` expanded as the shell expands it, and the user `~name` names when this
    machine knows no such user (None otherwise). The one place a user-given path or setting has `~` expanded
    (audit60 review S1: PORTABLE_CACHE_DIR=~nosuch/x was exit 1 "internal error" from pathlib's expanduser).

    os.path.expanduser, not Path.expanduser: it leaves `~name` for an unknown user as it was, as bash does, so a file
    literally named `~foo` can be meant (review S2), and it never expands `./~foo` (pathlib drops the `./` first).
    Raises nothing; what an unknown user means (a literal name, an error) is the caller's to decide."""
    expanded = os.path.expanduser(raw)
    if raw.startswith("~") and expanded == raw:
        return raw, raw[1:].split("/", 1)[0]
    return expanded, None


def user_path(text: str | os.PathLike[str], *, what: str = "path", hydra_hint: bool = False) -> Path:
    """A path the user typed, made absolute and resolved once (`~` expanded, symlinks followed, `..` folded).

    The CLI calls this for every path argument before anything uses it, so every path derived from it
    (a run's stage folders, exports, evidence) is absolute too and `relative_to` between them cannot
    mix a relative and an absolute path. A path that does not exist yet is resolved as far as it goes.
    Raises InputNotFoundError (exit 3), naming `what` and the path, for a symbolic-link loop, for a
    symbolic link to nothing (a dangling link is a mistyped path more often than a place to create) and for a
    name too long to look up (ENAMETOOLONG: the argument is wrong, nothing failed to write).
    `~name` for a user this machine does not know stays literal, as in bash, when `~name` exists in the current
    folder; otherwise it is exit 3 saying neither exists (audit60 D1, review S2); `hydra_hint` adds the hint for
    Hydra's `~key` deletion syntax (only where an override may stand: `run`'s BUNDLE).
    """
    from reproduction.errors import InputNotFoundError

    raw = os.fspath(text)
    expanded, unknown_user = expand_home(raw)
    path = Path(expanded)
    if unknown_user is not None and not os.path.lexists("~" + unknown_user):
        raise _unknown_home(raw, unknown_user, what, hydra_hint=hydra_hint)
    try:
        resolved = path.resolve()
        dangling = path.is_symlink() and not path.exists()
    except RuntimeError:  # Python < 3.13: RuntimeError "Symlink loop"; 3.13: OSError ELOOP
        raise _link_loop(raw, what) from None
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:  # a lookup error of the argument, not a failed write (audit47 F10)
            raise InputNotFoundError(
                f"{what} {raw} cannot be looked up: a name in it is longer than this filesystem allows",
                path=raw,
                errno=exc.errno,
                hint=f"pass a shorter {what} (each name at most 255 bytes)",
            ) from None
        if exc.errno == errno.ELOOP:
            raise _link_loop(raw, what) from None
        from reproduction.errors import os_error

        raise os_error(exc, f"{what} {raw}", op="read") from None
    if dangling:
        raise InputNotFoundError(
            f"{what} {raw} is a symbolic link to {os.readlink(path)}, which does not exist",
            path=raw,
            hint=f"point the link at a real file or folder, or pass another {what}",
        )
    return resolved


def _unknown_home(raw: str, user: str, what: str, *, hydra_hint: bool) -> Exception:
    """user_path's error for a path argument starting with `~name` where no user `name` exists and no file `~name`
    either (exit 3). With `hydra_hint`, a bare `~key.path` or `~key` (no `/`) is most likely Hydra's deletion syntax
    typed as a config override, so the hint says that form is not supported and what to write instead
    (docs/config.md)."""
    from reproduction.errors import InputNotFoundError

    hint = f"write {what} without ~{user} (~/ is your home folder), or as an absolute path"
    if hydra_hint and "/" not in raw:
        hint = (
            f"Hydra's ~key (delete) and +key=value (add) overrides are not supported: leave a key out for its default, "
            f"or write {raw[1:]}=null where the key may be null (docs/config.md); for a path, {hint}"
        )
    return InputNotFoundError(
        f"{what} {raw}: no user {user!r} on this machine for ~{user} to expand to, and no ~{user} in "
        f"{os.getcwd()} either",
        path=raw,
        hint=hint,
    )


def _link_loop(raw: str, what: str) -> Exception:
    """user_path's error for a path argument that is a symbolic-link loop (exit 3)."""
    from reproduction.errors import InputNotFoundError

    return InputNotFoundError(
        f"{what} {raw} is a symbolic-link loop (it never reaches a file or folder)",
        path=raw,
        hint=f"point the link at a real file or folder, or pass another {what}",
    )


def nearest_existing(path: str | os.PathLike[str]) -> Path:
    """`path` made absolute, or its nearest parent that exists (the root when none does): where a write to `path`
    would first meet the filesystem, so a file there means a folder can never be created on the way."""
    probe = Path(path).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe


def refuse_file_for_folder(path: str | os.PathLike[str], *, hint: str) -> None:
    """InputNotFoundError (exit 3, as every command given a file where a folder is needed) when `path`, or the
    nearest part of it that exists, is a file: a folder could never be created there. Called before any work
    (a Hub request, a download) so the mistake is named first, not as a write failure at the end."""
    from reproduction.errors import InputNotFoundError

    given = Path(path)
    probe = nearest_existing(given)
    if probe.exists() and not probe.is_dir():
        inside = "" if probe == given.absolute() else f"cannot create {given}: "
        raise InputNotFoundError(f"{inside}{probe if inside else given} is a file, not a folder", path=given, hint=hint)


def refuse_unwritable(path: str | os.PathLike[str], what: str, *, hint: str) -> None:
    """WriteFailedError (exit 8, `errors.os_error`: "cannot write `what`: <reason> (`path`)" with `hint`) when no file
    can be created in folder `path`, or, while it does not exist, in its nearest existing parent (where it would be
    created; nothing is created here). A probe file is made and removed at once. Called before long work whose
    results go to `path` (an evaluation, a Hub request), so a read-only output is named first, not after the work
    (audit47 F17)."""
    from reproduction.errors import os_error

    folder = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(
            prefix=f".write-probe.{os.getpid()}.", suffix=TEMP_SUFFIX, dir=nearest_existing(folder)
        )
    except OSError as exc:  # named as the folder asked for, not the probe's temp name
        exc.filename, exc.filename2 = str(folder), None
        raise os_error(exc, what, hint=hint) from None
    os.close(fd)
    try:
        os.unlink(tmp)
    except OSError:  # a leftover the next run's remove_orphaned_temps takes (its name is a temp file's)
        pass


def make_output_folder(
    path: str | os.PathLike[str],
    *,
    command: str,
    flag: str = "--output",
    exist_ok: bool = True,
    shown: str | os.PathLike[str] | None = None,
) -> Path:
    """`path` created with its parents (an existing folder kept when `exist_ok`), returned. A folder the user cannot
    create (permission denied, a read-only filesystem, a full disk) is a WriteFailedError (exit 8, as a read-only
    run folder's lock file) naming the folder and the parent that refused it, with the hint to choose a writable
    `flag` or make that parent writable, never the bare OSError the CLI could only answer with "--debug" (audit51
    I1). `shown` is the folder the user named when `path` is a staging folder beside it (pack's `OUT.partial`). The
    one place `run`, `demo` and `pack` create the folder they were told to write to."""
    from reproduction.errors import os_error

    folder = Path(path)
    named = Path(shown) if shown is not None else folder
    try:
        folder.mkdir(parents=True, exist_ok=exist_ok)
    except OSError as exc:
        parent = nearest_existing(folder.parent)
        hint = None
        if errno_denied(exc):
            hint = f"{command} needs write access to {parent}; choose a writable {flag} (or make {parent} writable)"
        exc.filename, exc.filename2 = str(named), None
        raise os_error(exc, f"the {flag} folder", hint=hint) from None
    return folder


def errno_denied(exc: OSError) -> bool:
    """True when `exc` says the filesystem refused the write itself (permission, an immutable or read-only folder),
    not that it ran out of room."""
    from reproduction.errors import errno_of

    return errno_of(exc) in (errno.EACCES, errno.EPERM, errno.EROFS)


TEMP_SUFFIX = ".portable-tmp"
"""The suffix of atomic_write_bytes' temp files: its own, so that no name a user or a recipe picks (`x.tmp`) is
taken for one."""
TEMP_NAME = re.compile(r"\..+\.(\d{1,7})\.[a-z0-9_]{8}" + re.escape(TEMP_SUFFIX))
"""atomic_write_bytes' temp file: `.<name>.<writer pid>.<mkstemp's 8 random characters>.portable-tmp` (a pid has at
most 7 digits: Linux's PID_MAX_LIMIT is 4194304)."""
PID_MAX = 1 << 22
"""Linux's PID_MAX_LIMIT: no process has a larger pid."""


def remove_orphaned_temps(root: Path, keep: Iterable[Path] = ()) -> list[Path]:
    """Remove the temp files atomic_write_bytes left anywhere under `root` (links not followed) whose writer is
    gone, and return them: a SIGKILL in the middle of a write leaves one, and nothing else would ever remove it.
    A live process's (a run's lingering worker, or this one's) is left alone, and so is every path in `keep` (the
    run's recorded outputs: a file a stage wrote and returned is its own, whatever its name)."""
    kept = {os.path.normpath(os.path.abspath(p)) for p in keep}
    removed = []
    for top, _dirs, files in os.walk(root):
        for name in files:
            found = TEMP_NAME.fullmatch(name)
            path = os.path.join(top, name)
            if found and not pid_alive(int(found.group(1))) and os.path.normpath(os.path.abspath(path)) not in kept:
                os.unlink(path)
                removed.append(Path(path))
    return removed


def remove_orphaned_temps_at(dir_fd: int) -> list[str]:
    """`remove_orphaned_temps` of the one folder `dir_fd` (a folder fd, O_PATH is enough; not its subfolders): the
    temp files atomic_write_bytes and atomic_write_at left there whose writer is gone, unlinked by name in that folder
    (never through a link put in its place), and returned. One that cannot be removed is left for the next call."""
    fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        with os.scandir(fd) as it:
            names = [e.name for e in it if e.is_file(follow_symlinks=False)]
    finally:
        os.close(fd)
    removed = []
    for name in names:
        found = TEMP_NAME.fullmatch(name)
        if found and not pid_alive(int(found.group(1))):
            try:
                os.unlink(name, dir_fd=dir_fd)
            except OSError:
                continue
            removed.append(name)
    return removed


def remove_orphaned_staging(folder: Path, stem: str, *, name: str = "{stem}.{pid}.partial") -> list[Path]:
    """Remove the `folder/<stem>.<pid>.partial` staging folders (or those `name` spells with `{stem}` and `{pid}`)
    whose process is gone (a SIGKILL skips the `finally` that removes its own) and return them; a live process's
    (another run's, or this one's) is left alone. Removed with `remove_tree` (any depth, links never followed); one
    that still cannot be removed is left for the next call."""
    import glob

    head, _, tail = name.format(stem=stem, pid="\0").partition("\0")
    removed = []
    for path in Path(folder).glob(glob.escape(head) + "*" + glob.escape(tail)):
        pid = path.name[len(head) : len(path.name) - len(tail)]
        if pid.isdigit() and not pid_alive(int(pid)):
            try:
                remove_tree(path)
            except OSError:
                continue
            removed.append(path)
    return removed


def pid_alive(pid: int) -> bool:
    """Whether `pid` is a running process. A zombie is not: a process killed with its parent (a SIGKILL to a run's
    process group) stays one until init reaps it, which took longer than a `--resume` right after the kill. A number no
    pid can be (a name that only looks like a temp file's or a staging folder's) counts as alive: left alone."""
    if not 0 < pid <= PID_MAX:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rpartition(b")")[2].split()[:1]  # the field after "(comm)", which may hold ")"
    except FileNotFoundError:  # Linux: it went away meanwhile; without /proc, kill(pid, 0) is all there is
        return not os.path.isdir("/proc/self")
    except OSError:
        return True
    return state != [b"Z"]


def remove_tree(path: str | os.PathLike[str], *, dir_fd: int | None = None, shown: str | None = None) -> None:
    """Remove `path` whatever it is, never following a link: a symlink or file is unlinked, a folder
    removed with everything below it. A read-only folder inside (a layer may ship one, mode 0555) would
    make a plain rmtree fail forever, so a failed removal adds write permission to the folder holding
    the entry and retries once. Raises OSError, naming the entry, when something still cannot be removed
    (what was removed before stays removed); absent is fine.

    No recursion, so any depth is removed: shutil.rmtree recursed once a folder and raised RecursionError on a
    ~1000-deep staging leftover, which then failed every later restore (audit48 F9). Each folder is opened
    relative to its parent (O_NOFOLLOW: a link swapped in for a folder is unlinked, never entered), and at most
    `_OPEN_FOLDERS` are held open: a deeper parent is closed and reopened through its child's `..`, checked to
    be the same folder by device and inode (OSError when something moved it meanwhile).

    With `dir_fd` (a folder fd, O_PATH is enough), `path` is one name in that folder, reached by fd: a link put in
    place of the folder holding it (or of a folder above) is never followed (audit65 H1); `shown` is its path in
    errors (default `path`)."""
    path = os.fspath(path)
    if dir_fd is None:
        _remove_tree(path, None, path)
        return
    try:
        _remove_tree(path, dir_fd, shown or path)
    except OSError as exc:
        if exc.filename is None or not os.path.isabs(os.fsdecode(exc.filename)):  # the top named by its bare name
            raise type(exc)(exc.errno, exc.strerror, shown or path) from None
        raise


def _remove_tree(path: str, dir_fd: int | None, shown: str) -> None:
    try:
        st = os.lstat(path, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path, dir_fd=dir_fd)
        return
    top = _Folder(
        _retry_chmod(lambda: os.open(path, _DIR_FLAGS, dir_fd=dir_fd), lambda: _chmod_folder(path, dir_fd)), shown
    )
    stack = [top]
    try:
        _empty_files(stack)
        while len(stack) > 1 or top.dirs:
            folder = stack[-1]
            if folder.dirs:
                _descend(stack, folder.dirs.pop())
                continue
            stack.pop()  # `folder` holds nothing now: remove it from its parent
            try:
                if stack[-1].fd is None:
                    _reopen(stack, folder)
            finally:
                os.close(folder.fd)
            _remove_entry(stack, folder.name, os.rmdir)
    finally:
        for folder in stack:
            if folder.fd is not None:
                os.close(folder.fd)
    parent = "." if dir_fd is not None else os.path.dirname(path) or "."
    _retry_chmod(lambda: os.rmdir(path, dir_fd=dir_fd), lambda: _chmod_folder(parent, dir_fd))


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_FOLDERS = 32
"""remove_tree's bound on open folder descriptors (well below the usual limit of 1024 a process)."""


class _Folder:
    """One open folder of remove_tree's walk: its descriptor (None while closed to bound the open ones), its name
    in its parent (the top: its path), the subfolders still to remove, and its (st_dev, st_ino) once closed."""

    __slots__ = ("fd", "name", "dirs", "ident", "chmodded")

    def __init__(self, fd: int, name: str) -> None:
        self.fd: int | None = fd
        self.name = name
        self.dirs: list[str] = []
        self.ident: tuple[int, int] | None = None
        self.chmodded = False


def _empty_files(stack: list[_Folder]) -> None:
    """Unlink everything in the innermost folder of `stack` that is not a folder; note its subfolders."""
    folder = stack[-1]
    with os.scandir(folder.fd) as it:
        entries = list(it)  # listed first, as shutil.rmtree does: unlinking while reading a folder may skip entries
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            folder.dirs.append(entry.name)
            continue
        try:
            os.unlink(entry.name, dir_fd=folder.fd)
        except IsADirectoryError:  # a folder that took its place meanwhile
            folder.dirs.append(entry.name)
        except OSError as exc:
            _remove_again(stack, entry.name, os.unlink, exc)


def _descend(stack: list[_Folder], name: str) -> None:
    """Open subfolder `name` of the innermost folder, push it and unlink its files; a link or file found in its
    place meanwhile is unlinked instead, never entered."""
    parent = stack[-1]

    def chmod() -> None:  # a folder without read or search permission (mode 0000, 0300) cannot be opened
        _ensure_writable(parent)  # and its parent may lack search permission to even stat it (mode 0400, 0600)
        st = os.stat(name, dir_fd=parent.fd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            os.chmod(name, st.st_mode | _OWNER_RWX, dir_fd=parent.fd)

    try:
        fd = _retry_chmod(lambda: os.open(name, _DIR_FLAGS, dir_fd=parent.fd), chmod)
    except FileNotFoundError:
        return
    except OSError as exc:
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise _named(exc, stack, name) from None
        try:
            os.unlink(name, dir_fd=parent.fd)
        except OSError as again:
            _remove_again(stack, name, os.unlink, again)
        return
    stack.append(_Folder(fd, name))
    if len(stack) > _OPEN_FOLDERS:  # close the farthest open parent; _reopen opens it again on the way back
        far = stack[-1 - _OPEN_FOLDERS]
        if far.fd is not None:
            st = os.fstat(far.fd)
            far.ident = (st.st_dev, st.st_ino)
            os.close(far.fd)
            far.fd = None
    _empty_files(stack)


def _reopen(stack: list[_Folder], child: _Folder) -> None:
    """Reopen the innermost folder of `stack` (closed) through its open `child`'s `..`, refusing a different folder
    (one moved meanwhile)."""
    parent = stack[-1]
    fd = os.open("..", _DIR_FLAGS, dir_fd=child.fd)
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != parent.ident:
        os.close(fd)
        raise OSError(errno.ESTALE, "the folder was moved while it was being removed", _where(stack, child.name))
    parent.fd = fd


def _remove_entry(stack: list[_Folder], name: str, remove) -> None:
    """`remove(name)` (os.unlink or os.rmdir) in the innermost folder of `stack`; see _remove_again."""
    try:
        remove(name, dir_fd=stack[-1].fd)
    except OSError as exc:
        _remove_again(stack, name, remove, exc)


def _remove_again(stack: list[_Folder], name: str, remove, exc: OSError) -> None:
    """After `remove(name)` failed with `exc`: absent is fine; a permission error is retried once after giving the
    innermost folder of `stack` write permission; OSError naming the entry's path otherwise."""
    if isinstance(exc, FileNotFoundError):
        return
    if isinstance(exc, PermissionError):
        folder = stack[-1]
        try:
            _ensure_writable(folder)
        except OSError:
            pass  # not this user's folder: the retry below fails as the first try did, and that error is raised
        try:
            remove(name, dir_fd=folder.fd)
            return
        except FileNotFoundError:
            return
        except OSError as again:
            exc = again
    raise _named(exc, stack, name) from None


_OWNER_RWX = stat.S_IRUSR | stat.S_IWUSR | stat.S_IXUSR


def _ensure_writable(folder: _Folder) -> None:
    """Give open `folder` read, write and search permission for its owner (once: a second failure is final)."""
    if not folder.chmodded:
        folder.chmodded = True
        os.fchmod(folder.fd, os.fstat(folder.fd).st_mode | _OWNER_RWX)


def _chmod_folder(path: str, dir_fd: int | None = None) -> None:
    """Give folder `path` (in `dir_fd` when given) read, write and search permission for its owner; a link there is
    left alone."""
    st = os.lstat(path, dir_fd=dir_fd)
    if stat.S_ISDIR(st.st_mode):
        os.chmod(path, st.st_mode | _OWNER_RWX, dir_fd=dir_fd)


def _retry_chmod(op, chmod):
    """`op()`, and when it fails with a permission error, `chmod()` (its errors ignored) and `op()` once more."""
    try:
        return op()
    except PermissionError:
        pass
    try:
        chmod()
    except OSError:
        pass
    return op()  # outside the `except`: its error is the one shown, without the first one as its context


def _where(stack: list[_Folder], name: str) -> str:
    """The path of entry `name` in the innermost folder of `stack` (for an error message)."""
    return os.path.join(*(f.name for f in stack), name)


def _named(exc: OSError, stack: list[_Folder], name: str) -> OSError:
    """`exc` naming the full path of `name` (the OS named it relative to its folder's descriptor, or not at all)."""
    exc.filename = _where(stack, name)  # fd-relative calls name one file: no second name to clear
    return exc
