"""The run folder's writers lock (`<run>/.writers`, reproduction/run/guards.py; audit51 K2): Ray workers live in
their own process groups and outlived a `kill -9 -PGID` of `portable run` by ~2 s, committing a checkpoint into the
run after its lock was gone. Each worker writing into a run holds the file shared for its life; whoever takes the
run's lock waits (bounded) until no earlier holder is left. Fast: holders are plain subprocesses, workers are
called in-process (no Ray cluster)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_run_guards import _run, done  # noqa: F401  (the toy recipe's finished run folder)

from reproduction.errors import PortableError
from reproduction.run.runner import read_state

HOLD = (
    "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
    "fcntl.flock(fd, fcntl.LOCK_SH); print('held', flush=True); time.sleep(60)"
)
PROBE = (
    "import fcntl, os, sys\n"
    "fd = os.open(sys.argv[1], os.O_RDWR)\n"
    "try:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n    print('free')\n"
    "except BlockingIOError:\n    print('held')\n"
)


def _holder(path: Path) -> subprocess.Popen:
    """A process holding `path` shared (what a worker of an earlier invocation does), started and holding."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "held\n"
    return proc


def _probe(path: Path) -> str:
    """'held' when another process holds `path`'s flock (checked from a fresh process, LOCK_EX|LOCK_NB), else 'free'."""
    return subprocess.run([sys.executable, "-c", PROBE, str(path)], capture_output=True, text=True, check=True).stdout


def _kill_after(proc: subprocess.Popen, seconds: float) -> threading.Thread:
    def kill() -> None:
        time.sleep(seconds)
        proc.kill()
        proc.wait()

    thread = threading.Thread(target=kill)
    thread.start()
    return thread


def test_the_wait_blocks_until_the_last_holder_exits(tmp_path):
    from reproduction.run.guards import wait_for_writers

    path = tmp_path / ".writers"
    holder = _holder(path)
    killer = _kill_after(holder, 0.5)
    start = time.monotonic()
    wait_for_writers(path, wait_s=20)
    waited = time.monotonic() - start
    killer.join()
    assert 0.45 <= waited < 5, waited
    assert _probe(path) == "free\n"  # returns holding nothing


def test_the_wait_without_a_holder_returns_at_once_and_creates_nothing(tmp_path):
    from reproduction.run.guards import wait_for_writers

    start = time.monotonic()
    wait_for_writers(tmp_path / ".writers", wait_s=20)  # no worker ever ran: no file
    assert not (tmp_path / ".writers").exists()
    (tmp_path / ".writers").write_bytes(b"")
    wait_for_writers(tmp_path / ".writers", wait_s=20)  # a file, nobody holding it
    assert time.monotonic() - start < 0.5


def test_a_holder_that_stays_past_the_bound_is_exit_7_naming_the_file(tmp_path, capsys):
    from reproduction.run.guards import wait_for_writers

    path = tmp_path / ".writers"
    holder = _holder(path)
    try:
        with pytest.raises(PortableError) as info:
            wait_for_writers(path, wait_s=0.3)
    finally:
        holder.kill()
        holder.wait()
    assert info.value.exit_code == 7
    assert str(info.value) == f"busy: worker processes of an earlier invocation still hold {path} after 0.3 s"
    assert info.value.hint == f"see them with `fuser -v {path}`; wait for them to exit or kill them, then run again"
    assert capsys.readouterr().err == ""  # the waiting line comes only after a second


def test_the_worker_side_holds_the_lock_shared_while_its_body_runs(tmp_path):
    from reproduction.run.guards import hold_writers

    path = tmp_path / ".writers"
    with hold_writers(path):
        assert _probe(path) == "held\n"
        with hold_writers(path):  # shared: a second worker holds it beside the first
            assert _probe(path) == "held\n"
    assert _probe(path) == "free\n"
    with hold_writers(None):  # outside a run: nothing held, nothing created
        pass
    with hold_writers(tmp_path / "elsewhere" / ".writers"):  # a node that does not see the run folder
        assert not (tmp_path / "elsewhere").exists()


def _probing(path: str) -> str:
    return _probe(Path(path))


def test_ray_task_and_training_rank_bodies_hold_the_runs_writers_lock(tmp_path, monkeypatch):
    from reproduction.train import launcher

    path = tmp_path / ".writers"
    outcome = launcher._task_body(_probing, str(path), path)  # run_tasks' body: fn(payload) under the lock
    assert outcome.unwrap() == "held\n"
    assert _probe(path) == "free\n"

    monkeypatch.setattr(launcher, "_worker_body", lambda payload, **kw: _probe(payload.writers_lock))
    payload = SimpleNamespace(spec=SimpleNamespace(kind="cpu"), config=SimpleNamespace(world_size=1), writers_lock=path)
    assert launcher._ray_worker(payload, 0).unwrap() == "held\n"  # a training rank under Ray
    assert _probe(path) == "free\n"


def test_the_run_lock_names_the_writers_file_the_launchers_hand_their_workers(tmp_path, monkeypatch):
    from reproduction.run.guards import run_lock, run_writers
    from reproduction.train import api, launcher
    from reproduction.train.config import TrainConfig

    seen = []

    def run_ray(payload, **kw):
        seen.append(payload.writers_lock)
        raise KeyboardInterrupt  # nothing to train: the payload is what is checked

    monkeypatch.setattr(launcher, "run_ray", run_ray)
    config = TrainConfig(max_steps=1, global_batch=2, micro_batch=2, launcher="ray")
    assert run_writers() is None
    with run_lock(tmp_path):
        assert run_writers() == tmp_path / ".writers"
        with pytest.raises(KeyboardInterrupt):
            api.train(lambda rank, world: None, config, out_dir=tmp_path / "m", resume=False)
    assert run_writers() is None
    assert seen == [tmp_path / ".writers"]


def test_a_resume_waits_for_a_worker_of_an_earlier_invocation_before_touching_the_run(done, capsys):  # noqa: F811
    """A planted holder of `<run>/.writers` (a Ray rank a killed run left behind): `--resume` with a stage redone
    takes the run lock, then neither reads, clears nor writes anything of the run until the holder is gone."""
    state = (done / "run.json").read_bytes()
    label = {p.name: p.stat().st_mtime_ns for p in (done / "label").iterdir()}
    holder = _holder(done / ".writers")
    result: list = []
    start = time.monotonic()
    walk = threading.Thread(target=lambda: result.append(_run(done, restart=["label"])))
    walk.start()
    time.sleep(1.5)
    assert walk.is_alive()
    assert (done / "run.json").read_bytes() == state
    assert {p.name: p.stat().st_mtime_ns for p in (done / "label").iterdir()} == label
    holder.kill()
    holder.wait()
    walk.join(30)
    assert time.monotonic() - start >= 1.5
    assert result == [[("count", "skipped"), ("label", "ran")]]
    assert read_state(done)["stages"]["label"]["status"] == "complete"
    err = capsys.readouterr().err
    assert f"waiting for the workers of an earlier invocation to exit ({done / '.writers'})\n" in err


def test_the_cli_gives_up_after_the_bound_with_exit_7(done, capsys, monkeypatch):  # noqa: F811
    from reproduction.portable import main
    from reproduction.run import guards

    monkeypatch.setattr(guards, "WRITERS_WAIT_S", 0.3)
    state = (done / "run.json").read_bytes()
    holder = _holder(done / ".writers")
    try:
        code = main(["-q", "run", "--output", str(done), "--resume"])
    finally:
        holder.kill()
        holder.wait()
    assert code == 7
    path = done / ".writers"
    assert capsys.readouterr().err.splitlines()[:2] == [
        f"error: busy: worker processes of an earlier invocation still hold {path} after 0.3 s",
        f"hint: see them with `fuser -v {path}`; wait for them to exit or kill them, then run again",
    ]
    assert (done / "run.json").read_bytes() == state
