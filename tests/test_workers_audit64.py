"""audit64 kev: a `kill -9` of one worker of a spawn pool (run_units: the eval stage's and `portable eval`'s
evaluation, the data generators) was reported only once another worker returned a result. From Python 3.11 the pool
starts a worker per submit after waking its manager thread, which may already wait again on the workers started
before, without the new one's sentinel; with one unit per worker (the evaluation's groups) the death went unseen
until the other worker had finished its whole share (17 s in a small `portable eval --checkpoint` on a loaded
machine, the whole evaluation in a long one), and the error then named the wrong unit. run_units now wakes the
manager after its last submit. A slow worker start (as on a loaded machine) makes the race certain here."""

from __future__ import annotations

import multiprocessing.context
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from interruptkit import children, in_session, own_session_script, poll_until, run_python, slowed

from reproduction.errors import WorkerFailedError
from reproduction.sim.workers import run_units

SLOW = "__import__('time').sleep(20)"
DIE = "__import__('os').kill(__import__('os').getpid(), 9)"
pytestmark = pytest.mark.usefixtures("terminal_sigint")  # the Ctrl-C its tests send must not be ignored


def test_a_killed_worker_is_reported_at_once_when_the_other_works_on(monkeypatch):
    start = multiprocessing.context.SpawnProcess.start
    monkeypatch.setattr(multiprocessing.context.SpawnProcess, "start", slowed(start))  # registered later, as under load
    t0 = time.monotonic()
    with pytest.raises(WorkerFailedError) as caught:
        list(run_units(eval, [SLOW, DIE], workers=2, killed_hint="continue"))
    took = time.monotonic() - t0
    err = caught.value
    assert err.exit_code == 51 and str(err).startswith("simulator worker died while running unit 1 "), str(err)
    assert err.hint == "continue"
    assert took < 10, f"the death was seen after {took:.1f} s (the other worker's unit takes 20 s)"


MASKS = """
import signal
from reproduction.sim.workers import run_units
SIGBLK = "[l for l in open('/proc/self/status') if l.startswith('SigBlk:')][0].split()[1]"
mask = lambda: signal.pthread_sigmask(signal.SIG_BLOCK, set())
before = mask()
print(*run_units(eval, [SIGBLK] * 3, workers=2), signal.SIGINT in before, before == mask())
"""


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads /proc")
def test_pool_workers_start_with_sigint_blocked_and_the_driver_gets_it_back():
    """Ctrl-C reaches the whole process group: a worker still starting (or waiting for its next unit) raised
    KeyboardInterrupt and printed a traceback under the driver's one-line `error: interrupted`. The workers now start
    with SIGINT blocked (the driver stops them); the driver's own mask is as before once the pool is up. In a fresh
    interpreter, where the pool also starts multiprocessing's resource tracker (which unblocks SIGINT after its own
    start)."""
    out = run_python(MASKS)
    assert out.returncode == 0, out.stderr
    *masks, blocked_before, same_after = out.stdout.split()
    assert len(masks) == 3 and all(int(m, 16) & (1 << (signal.SIGINT - 1)) for m in masks), masks
    assert (blocked_before, same_after) == ("False", "True")


DRIVER = """
from interruptkit import one_line_interrupt
from reproduction.sim.workers import run_units
with one_line_interrupt():
    list(run_units(eval, ["__import__('time').sleep(30)"] * 4, workers=2))
"""


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the workers in /proc")
def test_ctrl_c_to_the_group_while_the_workers_start_is_one_line():
    with own_session_script(DRIVER, stderr=subprocess.PIPE) as proc:
        poll_until(lambda: len(children(proc.pid)) >= 3, 60)  # the tracker and two workers
        time.sleep(0.05)  # the workers' interpreters are starting (spawn_main imports)
        os.killpg(proc.pid, signal.SIGINT)  # as Ctrl-C: to every process of the group, the starting workers too
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip() == "error: interrupted", err


def test_a_worker_killed_while_the_units_are_handed_out_is_the_one_line_error(monkeypatch, tmp_path):
    """audit64 k2: a pool that broke during run_units' submits (its first worker killed before the second submit)
    raised the pool's raw BrokenProcessPool, a traceback; it is the same WorkerFailedError (exit 51, the caller's
    hint) as a death seen while waiting for a result, naming the unit the dead worker held."""
    from concurrent.futures import ProcessPoolExecutor

    began = tmp_path / "began"
    unit = f"open({str(began)!r}, 'w').close() or __import__('time').sleep(20)"
    submit = ProcessPoolExecutor.submit

    def kill_first_worker_then_submit(self, *args, **kwargs):
        if self._processes:  # the second submit: the first worker is running unit 0
            deadline = time.monotonic() + 60
            while not began.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            os.kill(next(iter(self._processes)), signal.SIGKILL)
            while not self._broken and time.monotonic() < deadline:
                time.sleep(0.01)
        return submit(self, *args, **kwargs)

    monkeypatch.setattr(ProcessPoolExecutor, "submit", kill_first_worker_then_submit)
    with pytest.raises(WorkerFailedError) as caught:
        list(run_units(eval, [unit] * 3, workers=2, killed_hint="continue"))
    err = caught.value
    assert err.exit_code == 51 and err.hint == "continue"
    assert str(err).startswith("simulator worker died while running unit 0 "), str(err)


def test_the_error_names_the_unit_the_dead_worker_held_not_the_first_unfinished():
    """audit64 k2: the error named the first unit whose result was missing ("unit 0" while unit 0's worker worked on
    and unit 1's was killed); it names the unit the dead worker held: it writes its pid at a unit's start."""
    with pytest.raises(WorkerFailedError) as caught:
        list(run_units(eval, ["__import__('time').sleep(3)", "0", DIE, "1"], workers=2, killed_hint="continue"))
    err = caught.value
    assert err.exit_code == 51 and str(err).startswith("simulator worker died while running unit 2 "), str(err)


RACE = """
import multiprocessing.context, multiprocessing.util, sys
from interruptkit import one_line_interrupt, sigint_taking_thread, slowed
from reproduction.sim.workers import run_units, sigterm_as_interrupt

sigint_taking_thread()  # as rich's refresh thread: SIGINT unblocked
if sys.argv[1] == "registered":  # a worker started, not yet in the pool's _processes (as under load)
    multiprocessing.context.SpawnProcess.start = slowed(multiprocessing.context.SpawnProcess.start)
else:  # a worker forked, its preparation data not yet written
    multiprocessing.util.spawnv_passfds = slowed(multiprocessing.util.spawnv_passfds)
with one_line_interrupt(), sigterm_as_interrupt():
    list(run_units(eval, ["__import__('time').sleep(60)"] * 2, workers=2))
"""


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the workers in /proc")
@pytest.mark.parametrize(
    ("where", "how"),
    [("launching", "group-SIGINT"), ("registered", "group-SIGINT"), ("registered", "driver-SIGTERM")],
)
def test_an_interrupt_another_thread_takes_while_the_workers_start_is_one_line_and_leaves_nothing(where, how):
    """review64 K M1, M2: SIGINT was blocked only in the thread that starts the workers. In a terminal rich's refresh
    thread takes the group's Ctrl-C, and Python ran the handler in the main thread in the middle of a start: a worker
    forked but not yet sent its preparation data lived on (SIGINT blocked) and printed an EOFError traceback; one
    started but not yet registered by the pool was never stopped and the driver hung for ever at exit, joining it
    (a SIGTERM to the driver alone, raised as KeyboardInterrupt, too). The interrupt now waits for the starts."""
    hung = False
    with own_session_script(RACE, where, stderr=subprocess.PIPE) as proc:
        poll_until(lambda: len(children(proc.pid)) >= 2, 60)  # the tracker and the first worker
        time.sleep(0.1)  # inside the slowed start
        if how == "group-SIGINT":
            os.killpg(proc.pid, signal.SIGINT)  # as Ctrl-C: every process of the group
        else:
            os.kill(proc.pid, signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            hung = True
            os.killpg(proc.pid, signal.SIGKILL)
            _, err = proc.communicate(timeout=30)
    assert not hung, f"the driver did not exit within 30 s of the interrupt: {err}"
    assert proc.returncode == 130, err
    assert err.strip() == "error: interrupted", err
    poll_until(lambda: not in_session(proc.pid), 10, every_s=0.1)
    assert in_session(proc.pid) == []


BLOCK = """
import os, signal, threading, time
from reproduction.run.guards import interrupts_noted
from reproduction.sim.workers import _sigint_blocked

threading.Thread(target=time.sleep, args=(60,), daemon=True).start()  # takes the SIGINT the main thread blocks
arrived = []
reached = "nothing"
with interrupts_noted(arrived):
    try:
        with _sigint_blocked():
            os.kill(os.getpid(), signal.SIG{sig})
            for _ in range(50):
                time.sleep(0.01)  # Python runs a pending handler between these
            reached = "the block's end"
    except KeyboardInterrupt as exc:
        handlers = [signal.getsignal(s).__name__ for s in (signal.SIGINT, signal.SIGTERM)]
        blocked = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, set())
        print(reached, repr(exc), len(arrived), *handlers, blocked)
"""


@pytest.mark.parametrize("sig", ["INT", "TERM"])
def test_an_interrupt_inside_the_block_is_raised_at_its_end_through_the_previous_handler(sig):
    """The interrupt is neither raised mid-block nor lost: the handlers before the block (portable's guard, which
    notes each interrupt) get it at the block's end, and are back in place with the mask."""
    out = run_python(BLOCK.replace("{sig}", sig), timeout=60)
    assert out.returncode == 0, out.stderr
    raised = "KeyboardInterrupt('SIGTERM')" if sig == "TERM" else "KeyboardInterrupt()"
    assert out.stdout.split("\n")[0] == f"the block's end {raised} 1 sigint sigterm False", out.stdout
