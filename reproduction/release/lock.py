"""One writer per bundle: an exclusive `fcntl.flock` on `<bundle>/.portable/lock`.

flock locks die with their process (kill -9 included), so a stale lock never needs cleaning up.
The holder writes its pid and command into the lock file so a refused process can name it; that note is
informational only: where it cannot be written (a full disk, a quota, a read-only file) the lock still holds.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from reproduction.errors import LockHeldError, UnsafeArchiveError, os_error
from reproduction.release.manifest import STATE_DIR

LOCK_NAME = "lock"
STATE_HINT = "remove it (the bundle's state folder is the tool's own, never a link) and run the command again"


def state_dir(bundle: Path, *, what: str) -> Path:
    """`<bundle>/.portable`, created if missing, checked without following a link.

    A bundle folder is untrusted input: a `.portable` shipped as a symlink would make every state
    write and delete (lock, receipt, staging, trash) land wherever it points (audit F1). Raises
    UnsafeArchiveError (exit 6) naming it when it is a symlink or not a folder; WriteFailedError
    (exit 8) when it cannot be created.
    """
    state = Path(bundle) / STATE_DIR
    try:
        Path(bundle).mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(state, 0o755)
        except FileExistsError:
            pass
        st = os.lstat(state)
    except OSError as exc:
        raise os_error(
            exc,
            f"the lock file {state / LOCK_NAME}",
            hint=f"{what} needs write access to the bundle folder; copy the bundle somewhere writable",
        ) from None
    if not stat.S_ISDIR(st.st_mode):
        kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a folder"
        raise UnsafeArchiveError(
            f"{state} is {kind}: refusing to {what} through it",
            member=STATE_DIR,
            hint=f"{state}: {STATE_HINT}",
        )
    return state


_STATE_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(slots=True)
class StateFolder:
    """The bundle's `.portable`, opened once without following a link (`open_state`): every later write and removal
    in it goes through `fd` (an O_PATH folder fd), so a `.portable` swapped for a symlink while a command runs is never
    followed out of the bundle (audit65 H1); `check` tells whether the bundle's `.portable` is still this folder."""

    bundle: Path
    fd: int
    ident: tuple[int, int]
    """(st_dev, st_ino) of the folder opened."""

    @property
    def path(self) -> Path:
        return Path(self.bundle) / STATE_DIR

    def check(self, *, what: str = "restore") -> None:
        """UnsafeArchiveError (exit 6) naming `.portable` when the bundle's `.portable` is no longer the folder opened
        (a symlink, a file or another folder put in its place, or gone)."""
        try:
            st = os.lstat(self.path)
        except OSError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode) and (st.st_dev, st.st_ino) == self.ident:
            return
        now = (
            "is gone"
            if st is None
            else "is now a symlink"
            if stat.S_ISLNK(st.st_mode)
            else "is now another folder"
            if stat.S_ISDIR(st.st_mode)
            else "is now not a folder"
        )
        raise UnsafeArchiveError(
            f"the bundle's state folder {STATE_DIR} was replaced while {what} ran ({self.path} {now}): refusing to "
            f"{what} through it",
            member=STATE_DIR,
            hint=f"remove {self.path} (the bundle's state folder is the tool's own, never a link; the next {what} "
            f"makes it afresh) and run the command again; nothing outside the bundle was changed",
        )

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def open_state(bundle: Path, *, what: str) -> StateFolder:
    """`state_dir`, then its fd opened without following a link (a link put there between the two is exit 6 too)."""
    state = state_dir(bundle, what=what)
    try:
        fd = os.open(state, _STATE_FLAGS)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafeArchiveError(
                f"{state} is a symlink or not a folder: refusing to {what} through it",
                member=STATE_DIR,
                hint=f"{state}: {STATE_HINT}",
            ) from None
        raise os_error(exc, f"the bundle's state folder {state}", op="read") from None
    st = os.fstat(fd)
    return StateFolder(bundle=Path(bundle), fd=fd, ident=(st.st_dev, st.st_ino))


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
    except OSError:
        return ""
    return f" ({text})" if text else ""


def _note(fd: int, text: str) -> None:
    """Replace the lock file's holder note with `text` ("" clears it), best effort.

    The flock is what excludes other writers; the note only lets a refused process name the holder (`_holder`
    reads it, and an empty or short note just names no one). A note that cannot be written (ENOSPC, EDQUOT,
    EROFS, ...) must not fail the command: on a full disk every restore, even of an unchanged bundle, failed
    with exit 8 here (audit58 A4).
    """
    try:
        os.ftruncate(fd, 0)
        if text:
            os.pwrite(fd, text.encode(), 0)
    except OSError:
        pass


def lock_file_error(exc: OSError, path: Path, *, what: str, folder: Path) -> Exception:
    """The error for a lock file that could not be opened (`exc`): UnsafeArchiveError (exit 6) when it is a symlink
    or not a regular file (ELOOP from O_NOFOLLOW, ENXIO from O_NONBLOCK on a FIFO), else WriteFailedError and its
    kin (os_error: exit 8 for a refused or full disk) naming `folder`, which `what` needs write access to."""
    if exc.errno in (errno.ELOOP, errno.ENXIO):
        return UnsafeArchiveError(
            f"the lock file {path} is a symlink or not a regular file: refusing to {what}",
            member=str(path),
            hint=f"{path}: remove it (a lock file is the tool's own, never a link) and run the command again",
        )
    return os_error(
        exc,
        f"the lock file {path}",
        hint=f"{what} needs write access to {folder}; copy it somewhere writable",
    )


@contextmanager
def bundle_lock(bundle: Path, *, what: str, wait_s: float = 0.0) -> Iterator[StateFolder]:
    """Hold the bundle's lock for the `with` body, which gets the state folder opened (`StateFolder`: the one whose
    lock file is held; use its fd for every write in it).

    Waits up to `wait_s` seconds for another holder (polling every 50 ms), then raises
    LockHeldError (exit 7) naming the holder. Creates `<bundle>/.portable/` if needed
    (WriteFailedError, exit 8, when the bundle folder is not writable). The lock file is opened in the state folder's
    fd, so a `.portable` swapped for a link after its check never has a file outside the bundle locked or truncated.
    """
    state = open_state(bundle, what=what)
    try:
        with folder_lock(
            bundle, state.path / LOCK_NAME, what=what, subject="this bundle", wait_s=wait_s, dir_fd=state.fd
        ):
            yield state
    finally:
        state.close()


@contextmanager
def folder_lock(
    folder: Path,
    path: Path,
    *,
    what: str,
    subject: str,
    wait_s: float = 0.0,
    lead: str = "",
    dir_fd: int | None = None,
) -> Iterator[None]:
    """Hold an exclusive flock on the file `path` (created, in an existing folder) for the `with` body.

    LockHeldError (exit 7) names `folder`, the holder's pid and command, and `subject` ("this bundle",
    "this run folder"), after `lead`, once `wait_s` seconds passed; WriteFailedError (exit 8) when the file
    cannot be created; UnsafeArchiveError (exit 6) when it is a symlink or not a regular file (O_CREAT
    alone would follow a link and truncate whatever it points to: audit F2). With `dir_fd` (the fd of `path`'s folder)
    the file is opened by its name in that folder, never through a link put in the folder's place.
    """
    try:
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(path if dir_fd is None else path.name, flags, 0o644, dir_fd=dir_fd)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(errno.ELOOP, "not a regular file", str(path))
    except OSError as exc:
        if dir_fd is not None and exc.errno is not None and exc.filename == path.name:  # the *at call's bare name
            exc = type(exc)(exc.errno, exc.strerror, str(path))  # named in full, as by path (review65 S M2)
        raise lock_file_error(exc, path, what=what, folder=folder) from None
    try:
        deadline = time.monotonic() + max(0.0, wait_s)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockHeldError(
                        f"{folder}: {lead}another portable process{_holder(fd)} is working on {subject}; "
                        f"refusing to {what} at the same time",
                        path=path,
                        hint="wait for it to finish and run the command again",
                    ) from None
                time.sleep(0.05)
        _note(fd, f"pid {os.getpid()}: {what}")
        try:
            yield
        finally:
            _note(fd, "")
    finally:
        os.close(fd)  # closing releases the flock
