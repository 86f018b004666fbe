"""audit60 L7, L2, L6: a SIGTERM to the whole process group while a stage's workers run on the local Ray is exit 130
and the stage `interrupted` (the same signal stopped that Ray's GCS and raylet, and the watchdog called it exit 58 "lost
the Ray cluster"); the driver's Ray logs no INFO line (`-q` showed "Started a local Ray instance.") and wraps no worker
line in ANSI colour when its output is no terminal."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("ray")

from interruptkit import REPO, TESTS, child_env, in_session, kill_all, own_session, poll_until  # noqa: E402
from test_run_runner import ToyConfig  # noqa: E402

from reproduction.errors import PortableError, RayUnavailableError, render_error  # noqa: E402
from reproduction.recipe import Recipe, StageContext, StageOutput, StageSpec  # noqa: E402
from reproduction.run.runner import RunOptions, run_recipe  # noqa: E402
from reproduction.train import launcher, ray_connect  # noqa: E402


def _refusing(host: str, port: int, timeout: float) -> None:
    raise ConnectionRefusedError(111, "Connection refused")


def test_a_loss_while_the_main_thread_unwinds_an_interrupt_ends_as_that_interrupt():
    watch = launcher.ClusterWatch(
        "127.0.0.1:6379", address="127.0.0.1:6379", what="w", every_s=0.05, lost_after_s=60.0, connect=_refusing
    )
    watch.interrupt = KeyboardInterrupt("SIGTERM")  # as _placed sets it: the GCS went down with the same signal
    ended: list[BaseException] = []
    t0 = time.monotonic()
    with launcher._watchdog(watch, grace_s=0.1, end=ended.append):
        while not ended and time.monotonic() - t0 < 10:
            time.sleep(0.02)
    assert ended == [watch.interrupt]  # not the RayUnavailableError, and within the shorter bound, not 60 s
    assert time.monotonic() - t0 < launcher.INTERRUPTED_LOST_AFTER_S + 2


def test_the_end_of_an_interrupted_run_records_the_interrupt_and_exits_130(capsys):
    seen: list[BaseException] = []
    codes: list[int] = []
    interrupt = KeyboardInterrupt("SIGTERM")
    with ray_connect.on_cluster_lost(seen.append):
        launcher._end_process(interrupt, exit=codes.append)
    assert seen == [interrupt] and codes == [130]
    assert capsys.readouterr().err == f"error: interrupted\nhint: {launcher.INTERRUPTED_HINT}\n"
    error = RayUnavailableError("lost the Ray cluster at 127.0.0.1:1 while w ran", address="127.0.0.1:1")
    launcher._end_process(error, exit=codes.append)
    assert codes == [130, 58]


def test_the_local_ray_logs_no_info_line_and_no_colour_on_a_pipe(monkeypatch):
    calls: list[dict] = []
    monkeypatch.delenv("RAY_COLOR_PREFIX", raising=False)
    monkeypatch.delenv("NO_COLOR", raising=False)
    ray_connect.start_local(cpus=1, init=lambda **kw: calls.append(kw))  # pytest's streams are no terminal
    assert calls[0]["logging_level"] == logging.WARNING
    assert os.environ["RAY_COLOR_PREFIX"] == "0"


class _Tty:
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("env", "tty", "expected"),
    [
        ({}, True, None),
        ({"NO_COLOR": "1"}, True, "0"),
        ({"TERM": "dumb"}, True, "0"),
        ({}, False, "0"),
        ({"RAY_COLOR_PREFIX": "1"}, False, "1"),  # the user's choice is kept
    ],
)
def test_ray_colours_worker_prefixes_only_on_a_terminal(monkeypatch, env, tty, expected):
    for key in ("RAY_COLOR_PREFIX", "NO_COLOR", "TERM"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    if tty:
        monkeypatch.setattr(sys, "stdout", _Tty())
        monkeypatch.setattr(sys, "stderr", _Tty())
    ray_connect.plain_log_prefix()
    assert os.environ.get("RAY_COLOR_PREFIX") == expected


# --- a real group SIGTERM against a local Ray ---------------------------------------------------------------------


def sleeping_stage(ctx: StageContext) -> StageOutput:
    """A stage whose one Ray task sleeps on a local Ray the launcher starts (in this process group)."""
    from reproduction.train.device import resolve

    launcher.run_tasks(time.sleep, [300], spec=resolve("cpu"), ray_address=None, on_poll=_started)
    raise AssertionError("the task returned")


TOLD: list[bool] = []


def _started() -> None:
    if not TOLD:
        TOLD.append(True)
        print("POLLING", flush=True)


def _driver(run_dir: str) -> None:
    """As portable.main runs `run`: its interrupt guard, exit 130 for an interrupt, an error rendered."""
    from reproduction.run.guards import interrupts_noted

    recipe = Recipe(name="toy", stages=(StageSpec(name="ray", fn=f"{__name__}:sleeping_stage"),))
    try:
        with interrupts_noted([]):
            run_recipe(recipe, ToyConfig(), Path(run_dir), RunOptions(inputs={}))
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr, flush=True)
        ray_connect.shutdown_for_exit()
        os._exit(130)
    except PortableError as exc:
        sys.exit(render_error(exc))


@contextmanager
def driving(run: Path, *, before: str = "") -> Iterator[subprocess.Popen]:
    """_driver(run) in a fresh Python after the code `before`, in a session (and process group) of its own, its output
    piped; entered a second after its Ray task polls. On the way out every process left in that session (the driver's,
    the Ray head's and workers it started, stopped ones too) is killed."""
    code = before + f"import sys; sys.path[:0] = {[str(REPO), str(TESTS)]!r}; import test_ray_signals_audit60 as t; "
    code += f"t._driver({str(run)!r})"
    argv = [sys.executable, "-c", code]
    with own_session(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env(TESTS)) as driver:
        try:
            line = driver.stdout.readline()
            assert line.strip() == "POLLING", driver.stderr.read()
            time.sleep(1)
            yield driver
        finally:
            kill_all(in_session(driver.pid))


def _hung(driver: subprocess.Popen) -> str:
    """What a driver that did not exit in time was doing (a rare hang in a full CI run left nothing to read): its
    threads' Python stacks (faulthandler on SIGUSR1) and the processes left in its session; the driver is killed."""
    left = in_session(driver.pid)
    os.kill(driver.pid, signal.SIGUSR1)
    time.sleep(2)
    driver.kill()
    _, err = driver.communicate()
    return f"the driver did not exit within 45 s; its session: {left}\n{err[-6000:]}"


@pytest.mark.slow
def test_a_group_sigterm_during_a_local_ray_stage_is_exit_130_and_the_stage_interrupted(tmp_path):
    run = tmp_path / "run"
    faults = "import faulthandler, signal; faulthandler.register(signal.SIGUSR1, all_threads=True); "  # see _hung
    with driving(run, before=faults) as driver:  # its own group, signalled whole as `timeout`, `kill -- -PGID`, Slurm
        os.killpg(driver.pid, signal.SIGTERM)
        t0 = time.monotonic()
        try:
            _, err = driver.communicate(timeout=45)
        except subprocess.TimeoutExpired:
            pytest.fail(_hung(driver))
        took = time.monotonic() - t0
        assert driver.returncode == 130, f"exit {driver.returncode} after {took:.1f} s: {err[-1500:]}"
        assert "error: interrupted" in err and "lost the Ray cluster" not in err
        rec = json.loads((run / "run.json").read_text())["stages"]["ray"]
        assert rec["status"] == "interrupted" and rec["error"].startswith("KeyboardInterrupt")
        # a Ray worker still starting when the group's SIGTERM came is in its own process group, so the signal
        # missed it; it exits when it finds its raylet gone, which took over 15 s under a loaded suite (audit64 sig)
        poll_until(lambda: not in_session(driver.pid), 60, every_s=0.2)
        assert in_session(driver.pid) == []  # no Ray process outlives the run
