"""audit64 sig: a group SIGTERM whose local Ray GCS accepts connections but answers nothing (stopped, starved, stuck in
its own SIGTERM shutdown) is still exit 130 and the stage `interrupted`, within launcher.INTERRUPTED_CLEANUP_S. The
watchdog's TCP probe found that GCS alive, so nothing bounded the placement group's removal on the way out: it blocked
until Ray's own timeout (30 s and more), whose GetTimeoutError then replaced the interrupt (the stage recorded `failed`,
and the test driver hung in Ray's excepthook, which reports the error to that same GCS)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time

import pytest

ray = pytest.importorskip("ray")

from interruptkit import in_session, poll_until  # noqa: E402
from test_ray_signals_audit60 import driving  # noqa: E402

from reproduction.train import launcher, ray_connect  # noqa: E402
from reproduction.train.device import resolve  # noqa: E402

pytestmark = pytest.mark.usefixtures("terminal_sigint")  # the Ctrl-C its tests send must not be ignored


def _answering(host: str, port: int, timeout: float) -> None:
    """A GCS port that accepts every connection (the kernel completes the handshake for a stopped process too)."""


def test_an_interrupt_whose_ray_cleanup_hangs_on_a_gcs_that_still_accepts_ends_as_that_interrupt():
    watch = launcher.ClusterWatch(
        "127.0.0.1:6379", address="127.0.0.1:6379", what="w", every_s=0.05, lost_after_s=0.2, connect=_answering
    )
    ended: list[BaseException] = []
    t0 = time.monotonic()
    with launcher._watchdog(watch, grace_s=0.1, cleanup_s=0.5, end=ended.append):
        watch.interrupt = KeyboardInterrupt("SIGTERM")  # as _placed sets it; its cleanup then blocks in Ray
        while not ended and time.monotonic() - t0 < 10:
            time.sleep(0.02)
    assert ended == [watch.interrupt] and not watch.lost  # the interrupt (exit 130), not a loss nobody found
    assert 0.5 <= time.monotonic() - t0 < 3 and watch.claimed_by == "watchdog"


def test_without_an_interrupt_a_gcs_that_accepts_is_never_cut_short():
    watch = launcher.ClusterWatch(
        "127.0.0.1:6379", address="a", what="w", every_s=0.05, lost_after_s=0.2, connect=_answering
    )
    ended: list[BaseException] = []
    with launcher._watchdog(watch, grace_s=0.1, cleanup_s=0.2, end=ended.append):
        time.sleep(0.8)
    assert ended == [] and not watch.claimed


def _placed_with(monkeypatch, removed: list[str]) -> None:
    """_placed on a fake Ray: started here (so shut down on the way out), a placement group whose removal times out."""

    def remove(pg: object) -> None:
        removed.append("remove")
        raise ray.exceptions.GetTimeoutError("There was timeout in removing the placement group of id 72c1")

    monkeypatch.setattr(launcher, "_connect", lambda *a, **k: True)
    monkeypatch.setattr(launcher, "_watch", lambda *a, **k: None)
    monkeypatch.setattr(launcher, "_placement_group", lambda *a, **k: object())
    monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": True}])
    monkeypatch.setattr(ray.util, "remove_placement_group", remove)
    monkeypatch.setattr(ray, "shutdown", lambda: removed.append("shutdown"))


def test_a_ray_error_on_the_way_out_of_an_interrupt_does_not_replace_it(monkeypatch):
    removed: list[str] = []
    _placed_with(monkeypatch, removed)
    with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
        with launcher._placed(None, resolve("cpu"), workers=1, cpus_per_worker=1.0, start_timeout_s=1.0):
            raise KeyboardInterrupt("SIGTERM")
    assert removed == ["remove", "shutdown"]  # the local Ray is still shut down after the removal failed


def test_a_ray_error_on_the_way_out_of_a_normal_end_is_still_raised(monkeypatch):
    _placed_with(monkeypatch, [])
    with pytest.raises(ray.exceptions.GetTimeoutError):
        with launcher._placed(None, resolve("cpu"), workers=1, cpus_per_worker=1.0, start_timeout_s=1.0):
            pass


def _gcs_of(sid: int) -> list[int]:
    return [pid for pid, cmdline in in_session(sid, width=None) if "gcs_server" in cmdline]


@pytest.mark.slow
def test_a_group_sigterm_while_the_local_gcs_accepts_but_never_answers_is_exit_130_in_bound(tmp_path):
    run = tmp_path / "run"
    with driving(run) as driver:
        gcs = _gcs_of(driver.pid)
        assert len(gcs) == 1, in_session(driver.pid)
        os.kill(gcs[0], signal.SIGSTOP)  # its port still accepts; no request gets an answer (the SIGTERM waits)
        os.killpg(driver.pid, signal.SIGTERM)
        t0 = time.monotonic()
        timer = threading.Timer(45, lambda: driver.kill())  # before the fix: no exit until the test's own bound
        timer.start()
        try:
            _, err = driver.communicate(timeout=60)
        finally:
            timer.cancel()
        took = time.monotonic() - t0
        assert driver.returncode == 130, f"exit {driver.returncode} after {took:.1f} s: {err[-1500:]}"
        assert took < launcher.INTERRUPTED_CLEANUP_S + 10, took
        assert "error: interrupted" in err and "lost the Ray cluster" not in err
        rec = json.loads((run / "run.json").read_text())["stages"]["ray"]
        assert rec["status"] == "interrupted" and rec["error"].startswith("KeyboardInterrupt"), rec


SLOW_SHUTDOWN = """
import sys, time
import ray
real = ray.shutdown


def slow_shutdown(*args, **kwargs):  # a loaded machine with many actors: a healthy shutdown that takes 15 s
    print("SHUTDOWN-START", file=sys.stderr, flush=True)
    time.sleep(15)
    real(*args, **kwargs)


ray.shutdown = slow_shutdown
"""


@pytest.mark.slow
def test_an_interrupt_whose_ray_shutdown_outlasts_the_bound_leaves_no_ray_process(tmp_path):
    """review64 K L1: after an interrupt, a local Ray's shutdown still running at INTERRUPTED_CLEANUP_S was cut off by
    the watchdog's os._exit(130) before ray.shutdown ran, and the raylet's dashboard and runtime-env agents outlived
    the run by about 90 s. The watchdog now kills the processes of the local Ray this process started before it
    exits."""
    run = tmp_path / "run"
    with driving(run, before=SLOW_SHUTDOWN) as driver:
        os.kill(driver.pid, signal.SIGINT)  # Ctrl-C to the driver alone: its local Ray is healthy, only slow to stop
        t0 = time.monotonic()
        try:
            _, err = driver.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"no exit within 60 s: {in_session(driver.pid)}")
        took = time.monotonic() - t0
        assert driver.returncode == 130, f"exit {driver.returncode} after {took:.1f} s: {err[-1500:]}"
        assert took < launcher.INTERRUPTED_CLEANUP_S + 5, took
        assert "SHUTDOWN-START" in err and "error: interrupted" in err, err[-1500:]
        rec = json.loads((run / "run.json").read_text())["stages"]["ray"]
        assert rec["status"] == "interrupted" and rec["error"].startswith("KeyboardInterrupt"), rec
        poll_until(lambda: not in_session(driver.pid), 5, every_s=0.2)
        assert in_session(driver.pid) == []  # the agents were still there 40 s later


def test_kill_local_leaves_a_joined_cluster_alone(monkeypatch):
    """Only a head this process started: a driver that joined a cluster has a connect-only node (head False)."""
    killed: list[int] = []

    class Process:
        pid = 4242

        def poll(self) -> None:
            return None

    class Info:
        process = Process()

    class Node:
        head = False
        all_processes = {"raylet": [Info()]}

    monkeypatch.setattr(ray._private.worker, "_global_node", Node())
    monkeypatch.setattr(os, "kill", lambda pid, sig: killed.append(pid))
    ray_connect.kill_local()
    assert killed == []
    Node.head = True
    monkeypatch.setattr(ray_connect, "_descendants", lambda roots: {4243})
    ray_connect.kill_local()
    assert sorted(killed) == [4242, 4243]
