"""Test helpers for the interrupt tests: a child in a session (and process group) of its own, as a terminal's job, the
processes it starts found through /proc and never left behind; and, for a child's own script (`child_env(TESTS)` puts
this module on its path), the seams that make a race with a worker's start certain and portable's one-line end of an
interrupt."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent


def child_env(*paths: Path, **extra: str) -> dict[str, str]:
    """The environment of a child Python: the repository (then `paths`) on PYTHONPATH, one OpenMP thread, `extra`."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(map(str, [REPO, *paths])), **extra}


def run_python(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -c CODE ARGS` in the repository with child_env(), its output captured as text."""
    argv = [sys.executable, "-c", code, *args]
    return subprocess.run(argv, env=child_env(), cwd=REPO, capture_output=True, text=True, timeout=timeout)


@contextmanager
def own_session(argv: list[str], **popen) -> Iterator[subprocess.Popen]:
    """`argv` started in a session (and process group) of its own, in text mode, with Popen's other arguments as
    given; on the way out, one still running has its whole group killed (SIGKILL) and is reaped."""
    proc = subprocess.Popen(argv, text=True, start_new_session=True, **popen)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def own_session_script(code: str, *args: str, **popen) -> AbstractContextManager[subprocess.Popen]:
    """own_session for `python -c CODE ARGS` in the repository with child_env(TESTS): CODE may import this module."""
    return own_session([sys.executable, "-c", code, *args], env=child_env(TESTS), cwd=REPO, **popen)


def _processes(keep: Callable[[int, Path], bool], width: int | None = None) -> list[tuple[int, str]]:
    """(pid, command line cut to `width`) of every process for which keep(pid, its /proc folder) holds; one that ends
    meanwhile is passed over."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if keep(int(entry.name), entry):
                    cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    found.append((int(entry.name), cmdline[:width]))
            except (OSError, ValueError, IndexError):
                continue
    return found


def in_session(sid: int, width: int | None = 120) -> list[tuple[int, str]]:
    """The processes in session `sid` (a child started by own_session, and all it started there), command lines cut
    to `width` characters (by default short enough for a failure's message)."""
    return _processes(lambda pid, _: os.getsid(pid) == sid, width)


def marked(mark: str) -> list[tuple[int, str]]:
    """The processes whose environment holds `mark` (a child's, and those that inherited it: its own session or not)."""
    return _processes(lambda _, entry: mark.encode() in (entry / "environ").read_bytes())


def children(pid: int) -> list[tuple[int, str]]:
    """The processes whose parent is `pid`."""
    return _processes(lambda _, entry: int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid)


def kill_all(found: list[tuple[int, str]]) -> None:
    """SIGKILL each of `found` (stopped ones too); one already gone is passed over."""
    for pid, _ in found:
        with suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def poll_until(done: Callable[[], object], within_s: float, every_s: float = 0.01) -> bool:
    """Calls `done` every `every_s` seconds until it returns something true (then True) or `within_s` have passed
    (then False)."""
    deadline = time.monotonic() + within_s
    while not done():
        if time.monotonic() >= deadline:
            return False
        time.sleep(every_s)
    return True


# -- for a child's script ------------------------------------------------------------------------------------------


def slowed(fn: Callable, seconds: float = 0.5) -> Callable:
    """`fn` that sleeps `seconds` before it returns (a step of a start made slow, as on a loaded machine); set on a
    class, a method too."""

    def later(*args, **kwargs):
        result = fn(*args, **kwargs)
        time.sleep(seconds)
        return result

    return later


def sigint_taking_thread(seconds: float = 300) -> None:
    """Starts a daemon thread that sleeps with SIGINT unblocked, as rich's refresh thread does: the kernel may hand it
    the group's Ctrl-C while the main thread blocks SIGINT."""
    threading.Thread(target=time.sleep, args=(seconds,), daemon=True).start()


@contextmanager
def one_line_interrupt() -> Iterator[None]:
    """As portable.main ends a KeyboardInterrupt: `error: interrupted` on stderr, exit 130, no traceback."""
    try:
        yield
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)
