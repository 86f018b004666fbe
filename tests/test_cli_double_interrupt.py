"""audit51 K3: Ctrl-C twice. Once the CLI has answered the first interrupt, a second SIGINT or a SIGTERM is held
(one `note:` line), not raised into the cleanup that follows (the run's record, Ray's shutdown, the interpreter's
exit): the process exits 130 after the cleanup ran whole. A second Ctrl-C that landed in Ray's teardown made the
process die of SIGSEGV (-11) instead. The third held signal quits at once, also with 130."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from reproduction import portable

# `portable verify` as the program (main() with sys.argv, as the console script calls it) runs a fake command: it
# says `ready`, waits for the interrupt, and its cleanup (a `finally`) then takes 1 s. With `ray`, a fake Ray module
# is imported whose shutdown (which the CLI calls before it exits 130) takes 1 s, like Ray's own teardown. With `exit`,
# an atexit hook registered after the CLI's import (as Ray's and multiprocessing's are) takes 1 s; with `hang` it
# takes 30 s; with `last`, one registered before the import (so it runs after the CLI's last hook) says whether
# SIGINT is ignored by then. With `swallow`, the command catches the first interrupt and goes on working for 30 s.
_SCRIPT = """
import atexit, signal, sys, time, types
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (a background shell ignores it)
mode = sys.argv[1]

def slowly(what, seconds=1.0):
    print(what + " start", file=sys.stderr, flush=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.02)
    print(what + " done", file=sys.stderr, flush=True)

if mode == "last":
    atexit.register(lambda: slowly("exit: SIGINT " + str(signal.getsignal(signal.SIGINT) == signal.SIG_IGN)))
from reproduction import portable

if mode == "ray":
    sys.modules["ray"] = types.SimpleNamespace(shutdown=lambda: slowly("ray shutdown"))

if mode in ("exit", "hang"):  # registered before main: runs at the exit, before the CLI's last hook (LIFO)
    atexit.register(lambda: slowly("exit hook", 30.0 if mode == "hang" else 1.0))

def command(args):
    try:
        print("ready", file=sys.stderr, flush=True)
        try:
            time.sleep(60)
        except KeyboardInterrupt:
            if mode != "swallow":
                raise
            print("carrying on", file=sys.stderr, flush=True)
        if mode == "swallow":
            slowly("work", 30.0)
    finally:
        if mode == "cleanup":
            slowly("cleanup")

portable.cmd_verify = command
sys.argv = ["portable", "verify", "/x"]
sys.exit(portable.main())
"""

_NOTE = (
    "note: already stopping (cleaning up after the interrupt); interrupt 2 more times to quit at once, leaving the "
    "cleanup undone"
)


def _run(tmp_path: Path, mode: str, signals: list[signal.Signals], after: str) -> tuple[int, list[str]]:
    """Run the script; SIGINT once it is `ready`, then `signals` 0.2 s apart once stderr shows `after`."""
    script = tmp_path / "double.py"
    script.write_text(_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(Path(portable.__file__).parents[1])}
    child = subprocess.Popen(
        [sys.executable, str(script), mode], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    lines: list[str] = []
    try:
        for line in child.stderr:
            lines.append(line.rstrip("\n"))
            if lines[-1] == "ready":
                child.send_signal(signal.SIGINT)
            if lines[-1] == after:
                for signum in signals:
                    time.sleep(0.2)
                    child.send_signal(signum)
        return child.wait(timeout=60), lines
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


@pytest.mark.parametrize("mode", ["cleanup", "ray", "exit", "last"])
def test_a_second_sigint_and_a_sigterm_during_the_cleanup_are_held_and_the_exit_is_130(tmp_path, mode):
    """The second Ctrl-C and a SIGTERM arrive while the command's cleanup runs (`cleanup`), while the CLI shuts
    Ray down after `error: interrupted` (`ray`), during an atexit hook (`exit`: still held, audit52 R2) or after
    the CLI's last atexit hook (`last`: ignored from there, as CPython's finalization would put their default action
    back: -2 before): neither raises nor kills, the cleanup finishes, the code is 130."""
    what = {"cleanup": "cleanup", "ray": "ray shutdown", "exit": "exit hook", "last": "exit: SIGINT True"}[mode]
    code, lines = _run(tmp_path, mode, [signal.SIGINT, signal.SIGTERM], after=f"{what} start")
    assert code == 130, lines
    assert f"{what} done" in lines, lines
    assert lines.count(_NOTE) == (mode != "last"), lines  # ignored at the very end: nothing left to tell
    assert "error: interrupted" in lines and not any(
        "Traceback" in line or "KeyboardInterrupt" in line for line in lines
    )


@pytest.mark.parametrize("mode", ["cleanup", "hang"])
def test_the_third_held_signal_quits_at_once_with_130(tmp_path, mode):
    """A cleanup that hangs can still be stopped, also in an atexit hook (`hang`: 30 s; audit52 R2, where every
    signal was ignored from the first hook on): after two held signals (interrupts.HELD_SIGNALS), the third ends the
    process at once (os._exit), with one line and exit 130; the cleanup is left undone."""
    what = {"cleanup": "cleanup", "hang": "exit hook"}[mode]
    t0 = time.monotonic()
    code, lines = _run(tmp_path, mode, [signal.SIGINT, signal.SIGTERM, signal.SIGINT], after=f"{what} start")
    assert code == 130, lines
    assert lines[-1] == "error: interrupted again: quitting without finishing the cleanup", lines
    assert f"{what} done" not in lines and lines.count(_NOTE) == 1, lines
    assert time.monotonic() - t0 < 20, lines


def test_a_second_ctrl_c_stops_a_command_that_swallowed_the_first(tmp_path):
    """A command (or a library in it) that catches the first KeyboardInterrupt and carries on is not stopping: the
    second Ctrl-C raises and ends it with 130 at once, with no `already stopping` note (audit52 R5: it was held and
    the command worked on, exit 0)."""
    t0 = time.monotonic()
    code, lines = _run(tmp_path, "swallow", [signal.SIGINT], after="carrying on")
    assert code == 130, lines
    assert "work done" not in lines and _NOTE not in lines and "error: interrupted" in lines, lines
    assert time.monotonic() - t0 < 20, lines


def test_main_called_with_argv_puts_its_caller_s_handlers_back_after_an_interrupt(monkeypatch, capsys):
    """Only the program holds signals until its exit and shuts Ray down: a caller passing argv (a test, an
    embedding) gets its own handlers back, a later SIGINT raises again, and its Ray session is left up."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:

        def command(args):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)

        shut: list[bool] = []
        monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(shutdown=lambda: shut.append(True)))
        monkeypatch.setattr(portable, "cmd_verify", command)
        assert portable.main(["verify", "/x"]) == 130
        assert shut == []  # the caller's Ray session is the caller's (audit52 R7)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def test_a_sigterm_that_ray_init_turned_into_sys_exit_still_counts_as_the_first_interrupt():
    """The SIGTERM Ray's driver handler answers during ray.init (sys.exit, audit51 K1) is raised through the CLI's
    own handler, so it is noted as the first interrupt and a second signal after it is held, not raised."""
    from reproduction.run import guards
    from reproduction.train import ray_connect

    def rays(signum, frame):  # Ray 2.60's driver handler (ray/_private/worker.py)
        sys.exit(signum)

    def init(**kwargs):
        signal.signal(signal.SIGTERM, rays)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler runs at the next bytecode; never finished

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    arrived: list[KeyboardInterrupt] = []
    try:
        with guards.interrupts_noted(arrived):
            try:
                ray_connect.start_local(cpus=1, init=init)
            except KeyboardInterrupt as exc:
                assert str(exc) == "SIGTERM"
                try:  # while the interrupt is being handled (the command's cleanup)
                    os.kill(os.getpid(), signal.SIGINT)  # held: nothing is raised
                    time.sleep(0.2)
                except KeyboardInterrupt:
                    pytest.fail("the second signal was raised, not held")
        assert [str(exc) for exc in arrived] == ["SIGTERM"]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back: no hold_after
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def test_the_run_s_sigterm_handler_holds_only_while_its_interrupt_is_handled():
    """Inside `portable run`'s walk (guards.sigterm_as_interrupt under interrupts_noted) a SIGTERM is noted as the
    command's interrupt; a second one while it is handled (the stage's record) is held; once the interrupt was caught
    and the walk carries on, the next SIGTERM raises again (audit52 R5). The state is the guard's own (audit52 R4)."""
    from reproduction.run import guards

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    arrived: list[KeyboardInterrupt] = []
    try:
        with guards.interrupts_noted(arrived), guards.sigterm_as_interrupt():
            for _ in range(2):
                try:
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(5)
                except KeyboardInterrupt:
                    os.kill(os.getpid(), signal.SIGTERM)  # held: nothing is raised
                    time.sleep(0.2)
        assert [str(exc) for exc in arrived] == ["SIGTERM", "SIGTERM"]
        assert not hasattr(guards, "_STOP")
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
