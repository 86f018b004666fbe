"""What keeps a run folder honest while a run works in it: its lock, no links out, SIGTERM as an interrupt, and
interrupts held over the write that completes a stage.

<run>/.lock     an flock held by the `portable run` working in the folder (pid and command inside)
<run>/.writers  a shared flock held by every worker process (Ray training ranks, inference tasks) writing into the
                folder, for its whole life; whoever takes `.lock` then waits (bounded) for an exclusive flock on it,
                so no worker of an earlier, killed invocation still writes there (audit51 K2;
                the worker side is reproduction/writers_lock.py)
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import errno
import fcntl
import os
import stat
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from reproduction.errors import LockHeldError, PortableError, RunStateError, os_error
from reproduction.interrupts import answer_held, held_note
from reproduction.writers_lock import NO_FLOCK, WRITERS_WAIT_S, open_writers, writers_file

RUN_JSON = "run.json"

LOCK_FILE = ".lock"
"""The run folder's lock file (an flock held while a `portable run` works in it; release/lock.py)."""

WRITERS_SAY_AFTER_S = 1.0
"""A wait longer than this says one line on stderr naming the writers file."""

RUN_FOLDERS = ("evidence", "lineage", "eval_checkpoint", "plots")
"""Entries of a run folder besides the stage folders that the run and `portable eval` write into."""


@contextlib.contextmanager
def run_lock(run_dir: Path, what: str = "run", *, ui: Any = None) -> Any:
    """The run folder's lock (context manager): LockHeldError (exit 7, "busy", naming the holder's pid) while
    another `portable run` or `portable eval` works in `run_dir`; taken before run.json is read. Once taken, waits
    (wait_for_writers, its note on stderr unless `ui` (reproduction.ui.UiOptions) is quiet) until no worker process
    of an earlier invocation still holds `<run>/.writers`, so on entry this process is the folder's only writer. The
    workers it starts hold that file because their callers pass it (StageContext.writers_lock), not through state
    kept here."""
    from reproduction import ui as ui_mod
    from reproduction.release.lock import folder_lock

    with folder_lock(run_dir, Path(run_dir) / LOCK_FILE, what=what, subject="this run folder", lead="busy: "):
        wait_for_writers(writers_file(run_dir), what=what, say=lambda line: ui_mod.say(line, options=ui))
        yield


def wait_for_writers(
    path: Path,
    *,
    wait_s: float | None = None,
    poll_s: float = 0.1,
    what: str = "run",
    say: Callable[[str], None] | None = None,
) -> None:
    """Returns once no process holds the writers file `path`: at once when none does (or it does not exist), else
    when the last holder exits, checked every `poll_s` s; after WRITERS_SAY_AFTER_S `say` (None: print to stderr)
    gets one line saying what it waits for. LockHeldError (exit 7) naming `path` when holders remain after `wait_s` s
    (None: WRITERS_WAIT_S); UnsafeArchiveError (exit 6) when `path` is a symlink or not a regular file, and
    WriteFailedError (exit 8) when it cannot be opened, as release/lock.py folder_lock refuses a bad `.lock`
    (refusing to `what`). Holds nothing on return. Skipped where the filesystem has no flock."""
    fd = _open_checked(path, what)
    if fd is None:
        return
    wait_s = WRITERS_WAIT_S if wait_s is None else wait_s
    try:
        start = time.monotonic()
        said = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return  # closing the fd below lets it go: this invocation's workers take it shared
            except BlockingIOError:
                pass
            except OSError as exc:
                if exc.errno in NO_FLOCK:
                    return
                raise os_error(exc, f"the run's writers lock {path}") from None
            waited = time.monotonic() - start
            if waited >= wait_s:
                raise LockHeldError(
                    f"busy: worker processes of an earlier invocation still hold {path} after {wait_s:g} s",
                    path=path,
                    hint=f"see them with `fuser -v {path}`; wait for them to exit or kill them, then run again",
                )
            if not said and waited >= WRITERS_SAY_AFTER_S:
                line = f"waiting for the workers of an earlier invocation to exit ({path})"
                (say or (lambda text: print(text, file=sys.stderr, flush=True)))(line)
                said = True
            time.sleep(poll_s)
    finally:
        os.close(fd)


def _open_checked(path: Path, what: str) -> int | None:
    """An fd on the writers file `path`, None when there is none to wait for (never created: workers create it; no
    flock here); refuses a link / non-regular file (exit 6) or an unopenable one (exit 8) as folder_lock does."""
    try:
        fd = open_writers(path, create=False)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(errno.ELOOP, "not a regular file", str(path))
    except FileNotFoundError:  # no worker ever wrote into this run (the workers create it): none can hold it
        return None
    except OSError as exc:
        if exc.errno in NO_FLOCK:
            return None
        from reproduction.release.lock import lock_file_error

        raise lock_file_error(exc, path, what=what, folder=Path(path).parent) from None
    return fd


def refuse_links(run_dir: Path, stages: Sequence[str]) -> None:
    """RunStateError (exit 55) naming the first stage folder, evidence/ (or another folder the run writes, or
    run.json) that is a symbolic link: the run reads, clears and writes only real entries inside its folder, so
    nothing is read or written through a link into another place. Checked before anything is read."""
    names = (*stages, *RUN_FOLDERS, RUN_JSON, "report.html")
    try:  # one listing of the folder, not a stat per name (the runner checks this on every call)
        with os.scandir(run_dir) as entries:
            links = [e.name for e in entries if e.name in names and e.is_symlink()]
    except (FileNotFoundError, NotADirectoryError):
        return
    if links:
        name = min(links, key=names.index)
        path = Path(run_dir) / name
        raise RunStateError(
            f"{path} is a symbolic link (to {os.readlink(path)}); a run only reads and writes real folders "
            f"inside {run_dir}",
            path=path,
            hint=f"replace the link with a copy of what it points to (or remove it to redo {name}), then run again",
        )


@contextlib.contextmanager
def sigterm_as_interrupt() -> Any:
    """SIGTERM raises KeyboardInterrupt in the walk (like Ctrl-C), so the stage it stops is recorded
    `interrupted`; the handler installed before (Ray's driver installs one, a test runner may) is put back
    after. A no-op off the main thread, where Python cannot install handlers."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # Not installing when another handler is there left that handler to answer the SIGTERM mid-walk: in a
    # process where Ray had installed one, a SIGTERM then ended the whole process, stage record `running`.
    previous = signal.getsignal(signal.SIGTERM)

    stop = _stop_of(previous)  # the CLI's guard (interrupts_noted) this walk runs in, if any

    def interrupt(signum: int, frame: Any) -> None:
        if stop is not None and stop.stopping():  # the CLI is already stopping: this one is held, not raised
            stop.hold(signum, frame)
            return
        if stop is not None:
            stop.held = 0
            stop.arrived.append(KeyboardInterrupt("SIGTERM"))
            raise stop.arrived[-1]
        raise KeyboardInterrupt("SIGTERM")

    signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


@contextlib.contextmanager
def deferred_interrupts() -> Any:
    """Inside, SIGINT and SIGTERM are held, not raised: the first that arrived is answered by its handler (a
    KeyboardInterrupt) once the block is done. For a write that must happen whole or not at all: run.json's record
    of a stage that completed (a Ctrl-C inside it left the stage recorded `running`, audit47 kill F5). A no-op off
    the main thread and for a signal whose handler is no Python function (SIG_DFL, SIG_IGN)."""
    import signal
    import threading

    previous: dict[int, Any] = {}
    arrived: list[int] = []
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            handler = signal.getsignal(signum)
            if callable(handler):
                previous[signum] = handler
                signal.signal(signum, lambda signum, frame: arrived.append(signum))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if arrived:
        previous[arrived[0]](arrived[0], None)


@dataclasses.dataclass
class StopState:
    """One interrupts_noted call's signal state: the interrupts raised so far and how many signals were held since.
    Reached through the handlers that call installs (their `stop` attribute: sigterm_as_interrupt finds it on the
    handler it replaces), not through a module global, so it ends with the call (audit52 R4)."""

    arrived: list[KeyboardInterrupt]
    held: int = 0

    def stopping(self) -> bool:
        """Whether the command is cleaning up after one of its interrupts: an interrupt was raised and a
        KeyboardInterrupt (or an error a library raised in its place) is propagating or being handled here. A
        first interrupt a library swallowed, the command carrying on, is no stop: the next Ctrl-C raises again
        (audit52 R5)."""
        return bool(self.arrived) and interrupt_in_chain(sys.exc_info()[1]) is not None

    def hold(self, signum: int, frame: Any) -> None:
        """A SIGINT or SIGTERM that arrived while the command stops: not raised (a second KeyboardInterrupt landed in
        Ray's teardown or the interpreter's exit and the process died of SIGSEGV or SIGINT, not 130: audit51 K3). The
        first one held prints one line; the one after interrupts.HELD_SIGNALS quits at once with exit 130 (the rule
        sim/workers.py shares)."""
        self.held += 1
        answer_held(self.held, held_note("cleaning up after the interrupt", "leaving the cleanup undone"))


def _stop_of(handler: Any) -> StopState | None:
    """The interrupts_noted state behind an installed signal handler, or None (another handler)."""
    stop = getattr(handler, "stop", None)
    return stop if isinstance(stop, StopState) else None


def hold_interrupts(stop: StopState) -> None:
    """From now until the process exits, SIGINT and SIGTERM are held (`stop.hold`), not raised: for a command that
    has answered an interrupt and only cleans up and exits (portable.main). They stay held through the
    interpreter's atexit hooks, so a hook that hangs is still ended by the third (audit52 R2), and are ignored only
    after the last hook (_ignore_at_exit): CPython's finalization puts a Python handler back to the default action,
    and a second Ctrl-C there ended the process with SIGINT (-2), not 130 (audit51 K3). A SIGINT handler that is no
    Python function (SIG_IGN in a background job) is left as it is. A no-op off the main thread."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return

    def held(signum: int, frame: Any) -> None:
        stop.hold(signum, frame)

    held.stop = stop  # type: ignore[attr-defined]
    held.holds = True  # type: ignore[attr-defined]
    signal.signal(signal.SIGTERM, held)
    if callable(signal.getsignal(signal.SIGINT)):
        signal.signal(signal.SIGINT, held)


def _ignore_at_exit() -> None:
    """The last atexit hook (registered when this module is first imported, before Ray or multiprocessing register
    theirs: atexit runs the last registered first): held signals are ignored from here to the end of the process."""
    import signal

    for signum in (signal.SIGINT, signal.SIGTERM):
        if getattr(signal.getsignal(signum), "holds", False):
            signal.signal(signum, signal.SIG_IGN)


atexit.register(_ignore_at_exit)


@contextlib.contextmanager
def interrupts_noted(arrived: list[KeyboardInterrupt], *, hold_after: bool = False) -> Any:
    """Every command's guard (portable.main): SIGTERM raises KeyboardInterrupt like Ctrl-C (so `pack` removes its
    `<out>.partial/` and every command exits 130 with one line: audit47 F7), and each KeyboardInterrupt a SIGINT or
    SIGTERM raises is appended to `arrived` as it passes. A library can swallow the interrupt and raise something
    else in its place (transformers' lazy import turned one into ModuleNotFoundError: audit47 F8); `arrived` lets
    the CLI still call that an interrupt. While the command stops after one of its interrupts (the interrupt
    propagates or is being handled: StopState.stopping), later SIGINT/SIGTERM (here and in sigterm_as_interrupt) are
    held, not raised, so the cleanup it started (the stage's record, Ray's shutdown) runs whole (audit51 K3); the
    third held one quits at once (interrupts.HELD_SIGNALS). A SIGINT handler that is no Python function (SIG_IGN in a
    background job) is left as it is; the handlers installed before are put back after, except with `hold_after`
    when the command ends by an interrupt (a KeyboardInterrupt, or another error after one: what portable.main
    answers with exit 130): then they stay held (hold_interrupts) for the exit that follows. A no-op off the main
    thread."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield arrived
        return
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    stop = StopState(arrived)

    def noted(handler: Any, signum: int, frame: Any) -> None:
        if stop.stopping():
            stop.hold(signum, frame)
            return
        stop.held = 0  # a new stop: the signals held during an earlier one (a swallowed interrupt) do not count
        try:
            handler(signum, frame)
        except KeyboardInterrupt as exc:
            arrived.append(exc)
            raise

    def on_sigterm(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt("SIGTERM")

    def sigterm(signum: int, frame: Any) -> None:
        noted(on_sigterm, signum, frame)

    sigterm.stop = stop  # type: ignore[attr-defined]  # how sigterm_as_interrupt finds this call's state
    signal.signal(signal.SIGTERM, sigterm)
    if callable(previous[signal.SIGINT]):
        before = previous[signal.SIGINT]

        def sigint(signum: int, frame: Any) -> None:
            noted(before, signum, frame)

        sigint.stop = stop  # type: ignore[attr-defined]
        signal.signal(signal.SIGINT, sigint)
    ending: BaseException | None = None
    try:
        yield arrived
    except BaseException as exc:
        ending = exc
        raise
    finally:
        interrupted = ending is not None and (
            interrupt_in_chain(ending) is not None or (bool(arrived) and isinstance(ending, Exception))
        )
        if hold_after and interrupted and not isinstance(ending, PortableError):
            hold_interrupts(stop)
        else:
            for signum, handler in previous.items():
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


def forget_unhandled_interrupt() -> None:
    """Clear CPython's note that a KeyboardInterrupt went unhandled, once the CLI has answered it (exit 130).

    A KeyboardInterrupt that ends an evaluation a C extension started with PyRun_String (Cython modules do, while
    they import: ray, mujoco) makes CPython note it as unhandled, however the caller above handles it; started as
    `python -m reproduction.portable`, the interpreter then kills itself with SIGINT at exit, so a caller saw -2,
    not 130 (audit50 F6: 3 of 20 SIGTERMs 4 s into a run). Every PyRun_* evaluation clears the note before it
    runs, so an empty one does; it is not reachable otherwise. Called only after the CLI caught the interrupt."""
    import ctypes

    ctypes.pythonapi.PyRun_SimpleString(b"pass")


def interrupt_in_chain(exc: BaseException) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt in `exc`'s __cause__ / __context__ chain (an exception raised while an interrupt was
    being handled, or wrapping one), or None."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        item = todo.pop()
        if item is None or id(item) in seen:
            continue
        if isinstance(item, KeyboardInterrupt):
            return item
        seen.add(id(item))
        todo += [item.__context__, item.__cause__]
    return None
