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
def bundle_lock(bundle: Path, *, what: str, wait_s: float = 0.0) -> Iterator[None]:
    """Hold the bundle's lock for the `with` body.

    Waits up to `wait_s` seconds for another holder (polling every 50 ms), then raises
    LockHeldError (exit 7) naming the holder. Creates `<bundle>/.portable/` if needed
    (WriteFailedError, exit 8, when the bundle folder is not writable).
    """
    state = state_dir(bundle, what=what)
    with folder_lock(bundle, state / LOCK_NAME, what=what, subject="this bundle", wait_s=wait_s):
        yield


@contextmanager
def folder_lock(
    folder: Path, path: Path, *, what: str, subject: str, wait_s: float = 0.0, lead: str = ""
) -> Iterator[None]:
    """Hold an exclusive flock on the file `path` (created, in an existing folder) for the `with` body.

    LockHeldError (exit 7) names `folder`, the holder's pid and command, and `subject` ("this bundle",
    "this run folder"), after `lead`, once `wait_s` seconds passed; WriteFailedError (exit 8) when the file
    cannot be created; UnsafeArchiveError (exit 6) when it is a symlink or not a regular file (O_CREAT
    alone would follow a link and truncate whatever it points to: audit F2).
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(errno.ELOOP, "not a regular file", str(path))
    except OSError as exc:
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
