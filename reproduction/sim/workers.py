"""Run independent work units in this process, in a spawn pool, or through an injected `run_tasks`.

The simulator may not import `train/` (ARCHITECTURE.md), so Ray placement comes in from the caller as
a `Runner`: any callable `(fn, payloads) -> results in payload order`, e.g.
`functools.partial(launcher.run_tasks, spec=..., ray_address=...)`. Without one, units run in this
process (workers=1) or in a `spawn` multiprocessing pool (a fresh interpreter per worker: no EGL
context crosses a fork), each worker with OMP_NUM_THREADS=1. This module imports nothing heavy at
the top so that a spawned worker sets its environment before numpy or mujoco load.

A spawned worker ends when the process that started it is gone (`watch_parent`): a SIGTERM'd or SIGKILL'd driver
skipped the pool's shutdown, and its workers then waited forever on the pool's queue, re-parented to PID 1 with
1-2 GB each (audit55 E1).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

Runner = Callable[[Callable[[Any], Any], Sequence[Any]], list[Any]]
"""(fn, payloads) -> [fn(p) for p in payloads], possibly elsewhere; fn is a module-level function."""

WORKER_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


PR_SET_PDEATHSIG = 1
"""prctl(2) option: the signal the kernel sends this process when the thread that created it exits."""
PARENT_POLL_S = 1.0
"""How often a worker without prctl (not Linux) checks that its parent is still there."""


def watch_parent(parent: int) -> None:
    """Guarantee this process ends (exit 1, or SIGKILL from the kernel on Linux) once process `parent` is gone.

    On Linux the kernel sends SIGKILL at the parent's death (PR_SET_PDEATHSIG); the parent may already have died
    before that was set, so the parent pid is checked after it. Elsewhere a daemon thread polls os.getppid() every
    PARENT_POLL_S. Call it first thing in a worker, with the pid of the process that started it (taken there)."""
    import sys

    armed = False
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            import signal

            libc = ctypes.CDLL(None, use_errno=True)
            armed = libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
        except (OSError, AttributeError):
            armed = False
    if os.getppid() != parent:  # died before the watch was set: no signal will come
        os._exit(1)
    if armed:
        return
    import threading
    import time

    def poll() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=poll, name="watch-parent", daemon=True).start()


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Inside, SIGTERM raises KeyboardInterrupt (as in `portable`, whose run/guards.py is out of sim's reach), so the
    generators' command lines clean up after `timeout`'s or a scheduler's kill as after Ctrl-C: the pool is shut
    down and the set being written leaves no staging folder (audit55 E1, E2). After that first interrupt, later
    SIGINT/SIGTERM are held, not raised, so the staging folder's removal runs whole (a second SIGTERM landed in
    write_dataset's rmtree and left the folder: audit56); the first held prints one line, the one after
    HELD_SIGNALS quits at once with exit 130: `portable`'s rule, one copy in reproduction/interrupts.py. The previous
    handlers are put back after; off the main thread nothing is installed."""
    import signal
    import threading

    from reproduction.interrupts import answer_held, held_note

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    state = {"stopping": False, "held": 0}

    def interrupt(signum: int, frame: Any) -> None:
        if not state["stopping"]:
            state["stopping"] = True
            raise KeyboardInterrupt("SIGTERM" if signum == signal.SIGTERM else "SIGINT")
        state["held"] += 1
        answer_held(state["held"], held_note("removing what this run was writing", "leaving it behind"))

    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    signal.signal(signal.SIGTERM, interrupt)
    if previous[signal.SIGINT] is signal.default_int_handler:  # SIG_IGN (a background job) stays ignored
        signal.signal(signal.SIGINT, interrupt)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


def _init_worker(parent: int | None = None, started: Any = None) -> None:
    global _STARTED
    for key, value in WORKER_ENV.items():
        os.environ[key] = value
    _STARTED = started
    if parent is not None:
        watch_parent(parent)


_STARTED: Any = None
"""In a pool worker of run_units: the shared array in which the worker that starts unit i writes its pid at i."""


def _run_unit(fn: Callable[[Any], Any], i: int, payload: Any) -> Any:
    """A pool worker's body for unit i: notes which process holds it (so a worker's death names its unit), runs it."""
    if _STARTED is not None:
        _STARTED[i] = os.getpid()
    return fn(payload)


def _watch_every_worker(pool: Any) -> None:
    """Make a ProcessPoolExecutor's manager thread watch every worker it started, so the death of any one breaks the
    pool at once. From Python 3.11 a spawn pool starts a worker per submit *after* waking its manager thread, which
    may already be waiting again on the sentinels of the workers started before: the last worker's death then went
    unseen until some other worker returned a result. With one unit per worker (the evaluation's groups) a `kill -9`
    of that worker was reported only when the other worker had finished its whole share: 17 s after the kill in a
    small `portable eval`, the whole evaluation in a long one (audit64 kev). One more wake-up, after every submit,
    makes the manager take the sentinels afresh; under the pool's shutdown lock, as submit sends its own (the manager
    closes the wake-up pipe under it). The attributes are CPython's; without them nothing is done."""
    wakeup = getattr(pool, "_executor_manager_thread_wakeup", None)
    lock = getattr(pool, "_shutdown_lock", None)
    if wakeup is not None and lock is not None:
        with lock:
            wakeup.wakeup()


def _units_of_the_dead(pool: Any, futures: list[Any], started: Any) -> list[int]:
    """The units a broken pool's dead worker held: started by a process that exited on its own (not by the SIGTERM
    the pool's manager sends the others once it sees the death) and not finished. After the manager thread ends (it
    joins every worker), so the exit codes are final. [] when unknown (CPython's attributes missing, a slow manager)."""
    import signal

    manager = getattr(pool, "_executor_manager_thread", None)
    if manager is not None:
        manager.join(timeout=10)
    processes = dict(getattr(pool, "_processes", None) or {})
    dead = {pid for pid, proc in processes.items() if proc.exitcode not in (None, -signal.SIGTERM)}
    return [
        i
        for i, future in enumerate(futures)
        if started[i] in dead and (not future.done() or future.cancelled() or future.exception() is not None)
    ]


@contextlib.contextmanager
def _sigint_blocked() -> Iterator[None]:
    """SIGINT blocked in this thread inside: a process started here inherits the blocked mask across exec, so a
    spawn worker never takes the SIGINT that Ctrl-C sends the whole process group. Its interpreter raised
    KeyboardInterrupt wherever it was, and one still importing (spawn_main) or waiting for its next unit printed a
    traceback under the driver's one-line `error: interrupted` (audit64 kev). The driver stops its workers itself
    (run_units' finally), and a SIGINT that came while blocked is delivered here when the block ends, not lost.

    The mask is this thread's only: another thread that does not block SIGINT (rich's progress refresh thread, in a
    terminal) takes the signal, and Python then ran its handler in the main thread in the middle of a start. A
    worker forked but not yet sent its preparation data lived on (SIGINT blocked) and printed an EOFError traceback;
    one started but not yet registered by the pool was never stopped, and the driver hung for ever at exit joining
    it (review64 K M1, M2). So in the main thread the Python handlers of SIGINT and SIGTERM (a SIGTERM raises
    KeyboardInterrupt under `portable`: run/guards.interrupts_noted, sigterm_as_interrupt) only note the signal
    inside; at the end the previous handlers (and mask) are put back and called with what was noted, as Python
    would have, once every start is done and its process known to the caller. Off the main thread (no Python
    handler runs there) only the mask is set."""
    import signal
    import threading

    if not hasattr(signal, "pthread_sigmask"):  # not POSIX
        yield
        return
    # The first spawn starts multiprocessing's resource tracker, which blocks SIGINT for its own start and then
    # *unblocks* it (not restores it): inside the block, every process started after it took SIGINT again. So the
    # tracker is started first, out of the block (a rollout's EnvWorkers start no pool that would have started it).
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    noted: list[tuple[int, Any]] = []
    handlers: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():

        def note(signum: int, frame: Any) -> None:
            noted.append((signum, frame))

        for signum in (signal.SIGINT, signal.SIGTERM):
            handler = signal.getsignal(signum)
            if callable(handler):  # SIG_DFL and SIG_IGN (a background job's SIGINT) act in C: left as they are
                handlers[signum] = handler
                signal.signal(signum, note)
    try:
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            yield
        finally:
            # A SIGINT pending while blocked in every thread is taken as the mask returns: still by `note`.
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        _deliver(noted, handlers)


def _deliver(noted: list[tuple[int, Any]], handlers: dict[int, Any]) -> None:
    """Call each signal's handler with what `_sigint_blocked` noted, in arrival order. The first that raises (the
    KeyboardInterrupt of an interrupt) propagates; the later ones are still handed over while it is being handled,
    as they would have come during the caller's cleanup (under `portable` they are held and counted), and what they
    raise is dropped: the first interrupt already stops the command."""
    for k, (signum, frame) in enumerate(noted):
        try:
            handlers[signum](signum, frame)
        except BaseException:
            for later, later_frame in noted[k + 1 :]:
                try:
                    handlers[later](later, later_frame)
                except BaseException:  # noqa: BLE001 - a second interrupt adds nothing to the first
                    pass
            raise


def _groups(payloads: list[Any], workers: int) -> list[list[Any]]:
    """Contiguous, near-equal groups: one per worker (a Ray task each), order kept when flattened."""
    n = max(1, min(workers, len(payloads)))
    bounds = [round(i * len(payloads) / n) for i in range(n + 1)]
    return [payloads[a:b] for a, b in zip(bounds, bounds[1:])]


def run_group(group: dict[str, Any]) -> list[Any]:
    """A runner's task body: `fn` over a group of payloads, in one worker process."""
    _init_worker()
    return [group["fn"](payload) for payload in group["payloads"]]


def run_units(
    fn: Callable[[Any], Any],
    payloads: Sequence[Any],
    *,
    workers: int,
    runner: Runner | None = None,
    killed_hint: str | None = None,
) -> Iterator[Any]:
    """Yield fn(payload) for each payload, in payload order, as soon as each is ready.

    With `runner`, the payloads are cut into `workers` contiguous groups, one runner task each (so a
    Ray launcher places exactly `workers` workers), and the results come back when all are done;
    otherwise workers=1 runs here and workers>1 in a spawn pool, streaming results in order. A pool worker that
    dies is a WorkerFailedError (exit 51) with `killed_hint`, which the caller builds (errors.killed_worker_hint)
    naming how its command continues and the key it reads the worker count from; None: a plain rerun.
    """
    if runner is not None:
        groups = _groups(list(payloads), workers)
        for results in runner(run_group, [{"fn": fn, "payloads": g} for g in groups]):
            yield from results
        return
    if workers <= 1 or len(payloads) <= 1:
        for payload in payloads:
            yield fn(payload)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    from reproduction.errors import WorkerFailedError, killed_worker_hint

    ctx = multiprocessing.get_context("spawn")
    started = ctx.Array("q", len(payloads), lock=False)  # unit i -> the pid of the worker that started it (0: none)
    # PR_SET_PDEATHSIG fires when the creating *thread* exits: the pool starts its workers from this thread (submit)
    # and they are shut down before this generator returns, so the thread outlives them.
    pool = ProcessPoolExecutor(
        max_workers=min(workers, len(payloads)),
        mp_context=ctx,
        initializer=_init_worker,
        initargs=(os.getpid(), started),
    )
    futures: list[Any] = []
    finished = False

    def died(exc: BaseException, unfinished: int) -> WorkerFailedError:
        held = _units_of_the_dead(pool, futures, started)
        # The unit the dead worker held when that is known (it wrote its pid at the unit's start); else the first
        # unit whose result is missing (every unfinished unit fails with the pool, whichever worker held it).
        if len(held) == 1:
            what = f"simulator worker died while running unit {held[0]}"
        elif held:  # several killed at once (a group kill -9, the OOM killer)
            what = f"simulator workers died while running units {', '.join(map(str, held))}"
        else:
            what = f"simulator worker died before unit {unfinished} finished"
        return WorkerFailedError(
            f"{what} ({exc})",
            rank=held[0] if len(held) == 1 else unfinished,
            hint=killed_hint or killed_worker_hint(resume=False),
        )

    try:
        with _sigint_blocked():  # the workers start (in submit) with it blocked, and keep it so
            for i, payload in enumerate(payloads):
                try:
                    futures.append(pool.submit(_run_unit, fn, i, payload))
                except BrokenProcessPool as exc:  # a worker died while the units were being handed out
                    raise died(exc, len(futures)) from None
        _watch_every_worker(pool)
        for i, future in enumerate(futures):
            try:
                yield future.result()
            except BrokenProcessPool as exc:
                raise died(exc, i) from None
        finished = True
    finally:
        if not finished:
            # Stopped early (an interrupt, SIGTERM, an error, the caller's break): the results are not wanted, and
            # waiting for the running units kept a killed job alive for minutes of rendering (audit55 E1).
            for proc in list((getattr(pool, "_processes", None) or {}).values()):
                proc.terminate()
        pool.shutdown(wait=True, cancel_futures=True)
