"""The worker side of a run folder's writers lock (`<run>/.writers`, audit51 K2): each worker process writing into
the run holds the file shared for its life; the holder of the run's lock (reproduction/run/guards.py run_lock,
wait_for_writers) waits until no earlier holder is left. Here, not in run/, so the trainer and launcher (train/) hold
it without importing the run machinery, and recipes name it through StageContext.writers_lock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import sys
import time
from pathlib import Path
from typing import Any

WRITERS_FILE = ".writers"
"""The run folder's writers lock: shared by each worker process writing into the folder, taken exclusively (and let go
at once) by the holder of the run's lock before it touches the run: Ray workers live in their own process groups, so a
`kill -9 -PGID` of `portable run` left them writing (a whole checkpoint commit) for ~2 s after the kill (audit51 K2)."""

WRITERS_WAIT_S = 60.0
"""How long the run lock's holder waits for the workers of an earlier invocation to exit before it gives up (exit 7),
and how long a worker waits for a shared hold before it goes on holding nothing."""

NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)
"""flock is not supported on this filesystem (some NFS / FUSE mounts): the writers lock, a second guard behind the run
lock, is skipped there silently rather than refusing every run and every worker."""


def writers_file(run_dir: Path | str) -> Path:
    """`<run_dir>/.writers` as an absolute path: it is handed to Ray workers, which run in another cwd (or node)."""
    return Path(os.path.abspath(run_dir)) / WRITERS_FILE


def open_writers(path: Path, *, create: bool) -> int:
    """An fd on the writers file `path`; OSError as os.open raises it (ELOOP for a symbolic link)."""
    # O_CLOEXEC: an exec'd helper does not keep the lock; forked children (data loaders) share it and die with it.
    # O_NOFOLLOW: a planted link does not make the flock land on (or create) a file elsewhere.
    # O_NONBLOCK: a FIFO planted there does not block the open (the driver refuses it as not a regular file).
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | (os.O_CREAT if create else 0)
    return os.open(path, flags, 0o644)


@contextlib.contextmanager
def hold_writers(path: Path | None, *, wait_s: float | None = None, poll_s: float = 0.05) -> Any:
    """Holds a shared flock on the run's writers file `path` for the `with` body (a worker process writing into the
    run: the kernel lets it go when the process dies, kill -9 included), so the next holder of the run lock waits for
    it (run/guards.py wait_for_writers). Never raises for the lock itself: holds nothing when `path` is None, cannot
    be opened (not seen from this node, read-only, a link or not a regular file, no flock), or is held exclusively by
    someone else for `wait_s` s (None: WRITERS_WAIT_S; one line on stderr says so)."""
    if path is None:
        yield
        return
    # The writers lock is a second guard behind the run lock, and the driver's wait_for_writers is the one place that
    # refuses a bad writers file (exit 6 / 8, before any worker starts). A worker that cannot open it — a node that
    # does not see the run, or sees it read-only (an inference task writes nothing there), a file planted meanwhile —
    # goes on holding nothing: failing it would report a bug (exit 51) for what is not one (audit52 review R3).
    try:
        fd = open_writers(Path(path), create=True)
    except OSError:
        yield
        return
    try:
        _share(fd, Path(path), WRITERS_WAIT_S if wait_s is None else wait_s, poll_s)
        yield
    finally:
        os.close(fd)


def _share(fd: int, path: Path, wait_s: float, poll_s: float) -> None:
    # Bounded (audit52 review R9): the driver holds the file exclusively only for an instant (wait_for_writers), so
    # an exclusive hold past the driver's own bound is someone else's (a `flock` a user runs to look, a forked child
    # that inherited the driver's fd). Waiting on would hang every rank before it starts, with no word; failing would
    # let an onlooker break the run. Going on unheld only weakens the second guard while that holder stays, and the
    # next run lock's holder cannot get its exclusive lock past that holder either (it waits, then exit 7).
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                print(
                    f"note: {path} held exclusively by another process for {wait_s:g} s; "
                    "this worker goes on without the writers lock",
                    file=sys.stderr,
                    flush=True,
                )
                return
            time.sleep(poll_s)
        except OSError:  # no flock here (NO_FLOCK) or another failure of the second guard: hold nothing
            return
