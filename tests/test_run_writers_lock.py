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
    from reproduction.writers_lock import hold_writers

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


def test_the_launchers_hand_their_workers_the_writers_file_passed_to_them_and_nothing_else(tmp_path, monkeypatch):
    """audit52 review R4: no ambient state; inside a run lock, a train() not handed `writers_lock=` holds nothing,
    and a relative one reaches the workers absolute (they run in another cwd)."""
    from reproduction.run import guards
    from reproduction.train import api, launcher
    from reproduction.train.config import TrainConfig

    seen = []

    def run_ray(payload, **kw):
        seen.append(payload.writers_lock)
        raise KeyboardInterrupt  # nothing to train: the payload is what is checked

    monkeypatch.setattr(launcher, "run_ray", run_ray)
    monkeypatch.chdir(tmp_path)
    config = TrainConfig(max_steps=1, global_batch=2, micro_batch=2, launcher="ray")
    assert not hasattr(guards, "run_writers") and not hasattr(guards, "_run_writers")
    (tmp_path / "run").mkdir()
    with guards.run_lock(Path("run")):
        for lock in (None, Path("run") / ".writers"):
            with pytest.raises(KeyboardInterrupt):
                api.train(lambda rank, world: None, config, out_dir=tmp_path / "m", resume=False, writers_lock=lock)
    assert seen == [None, tmp_path / "run" / ".writers"]


def test_stage_context_names_the_runs_writers_file_absolute(tmp_path, monkeypatch):
    from reproduction.recipe import StageContext

    monkeypatch.chdir(tmp_path)
    ctx = StageContext(name="s", config=None, out_dir=Path("run/s"), run_dir=Path("run"), inputs={}, upstream={})
    from reproduction.writers_lock import writers_file

    assert ctx.writers_lock == tmp_path / "run" / ".writers" == writers_file("run")


def test_every_trainer_and_task_launch_of_a_stage_passes_the_writers_lock():
    """audit52 review R4: with no ambient default, a train() / run_tasks() call that forgets `writers_lock=`
    leaves its workers unguarded without anyone noticing; every call in the package passes it."""
    import ast

    root = Path(__file__).resolve().parents[1] / "reproduction"
    calls = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                # by name: a method `.train(...)` is torch's train mode, not the trainer
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                name = None if name == "train" and isinstance(node.func, ast.Attribute) else name
                if name in (
                    "train",
                    "run_trainer",
                    "run_tasks",
                    "train_value",
                    "infer_values",
                    "train_policy",
                    "train_grpo",
                    "infer_dataset_ray",
                    "_infer_beside_ray",
                ):
                    passed = any(k.arg == "writers_lock" for k in node.keywords)
                    calls.append((str(path.relative_to(root)), node.lineno, name, passed))
    missing = [c for c in calls if not c[3]]
    assert len(calls) >= 11, calls
    assert missing == [], missing


def test_a_bad_writers_file_is_refused_by_the_driver_as_a_bad_lock_file_and_held_nothing_by_workers(tmp_path):
    """audit52 review R3: a link, a FIFO (not opened blocking) or a directory planted as `<run>/.writers`: the driver
    refuses it as folder_lock refuses a bad `.lock` (exit 6 / exit 8); a worker goes on holding nothing."""
    import os

    from reproduction.run.guards import wait_for_writers
    from reproduction.train import launcher
    from reproduction.writers_lock import hold_writers

    link, fifo, folder = (tmp_path / n / ".writers" for n in ("link", "fifo", "folder"))
    for path in (link, fifo, folder):
        path.parent.mkdir()
    (tmp_path / "target").write_bytes(b"")
    os.symlink(tmp_path / "target", link)
    os.mkfifo(fifo)
    folder.mkdir()
    for path in (link, fifo):
        with pytest.raises(PortableError) as info:
            wait_for_writers(path, what="run")
        assert info.value.exit_code == 6
        assert str(info.value) == f"the lock file {path} is a symlink or not a regular file: refusing to run"
        assert (
            info.value.hint
            == f"{path}: remove it (a lock file is the tool's own, never a link) and run the command again"
        )
    with pytest.raises(PortableError) as info:
        wait_for_writers(folder, what="eval")
    assert info.value.exit_code == 8
    assert info.value.hint == f"eval needs write access to {folder.parent}; copy it somewhere writable"
    for path in (link, fifo, folder):
        with hold_writers(path):
            pass
        assert launcher._task_body(lambda p: "ran", None, path).unwrap() == "ran"  # not a bug (exit 51)
    assert (tmp_path / "target").read_bytes() == b""


def test_a_worker_that_may_not_open_the_writers_file_holds_nothing_and_runs(tmp_path, monkeypatch):
    """audit52 review R3: a node that sees the run read-only or owned by another user (EROFS, EACCES; faked here:
    the tests may run as root) runs its task, as before the writers lock."""
    import errno

    from reproduction import writers_lock
    from reproduction.train import launcher

    for code in (errno.EACCES, errno.EROFS, errno.EISDIR):

        def refuse(path, *, create, code=code):
            raise OSError(code, "refused", str(path))

        monkeypatch.setattr(writers_lock, "open_writers", refuse)
        assert launcher._task_body(lambda p: "ran", None, tmp_path / ".writers").unwrap() == "ran"


EXCLUSIVE = HOLD.replace("LOCK_SH", "LOCK_EX")


def test_a_worker_waits_for_an_exclusive_holder_only_for_the_bound_then_goes_on_holding_nothing(tmp_path, capsys):
    """audit52 review R9: an exclusive holder other than the driver's momentary one (a `flock` someone runs to look)
    no longer hangs every worker before it starts."""
    from reproduction.writers_lock import hold_writers

    path = tmp_path / ".writers"
    holder = subprocess.Popen([sys.executable, "-c", EXCLUSIVE, str(path)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"
    ran = []
    try:
        start = time.monotonic()
        with hold_writers(path, wait_s=0.3):
            ran.append(time.monotonic() - start)
    finally:
        holder.kill()
        holder.wait()
    assert 0.3 <= ran[0] < 3, ran
    assert capsys.readouterr().err == (
        f"note: {path} held exclusively by another process for 0.3 s; this worker goes on without the writers lock\n"
    )
    with hold_writers(path, wait_s=0.3):  # the holder gone: held shared again
        assert _probe(path) == "held\n"


def test_the_waiting_line_honours_quiet(tmp_path, monkeypatch, capsys):
    """audit52 review R6: `-q` shows only errors and results; the run lock's note on waiting follows it."""
    from reproduction.run import guards
    from reproduction.ui import UiOptions

    monkeypatch.setattr(guards, "WRITERS_SAY_AFTER_S", 0.05)
    for quiet in (True, False):
        holder = _holder(tmp_path / ".writers")
        killer = _kill_after(holder, 0.4)
        with guards.run_lock(tmp_path, ui=UiOptions(quiet=quiet)):
            pass
        killer.join()
        line = f"waiting for the workers of an earlier invocation to exit ({tmp_path / '.writers'})\n"
        assert capsys.readouterr().err == ("" if quiet else line)


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
    monkeypatch.setattr(guards, "WRITERS_SAY_AFTER_S", 0.05)  # -q: no waiting line all the same (audit52 review R6)
    state = (done / "run.json").read_bytes()
    holder = _holder(done / ".writers")
    try:
        code = main(["-q", "run", "--output", str(done), "--resume"])
    finally:
        holder.kill()
        holder.wait()
    assert code == 7
    path = done / ".writers"
    err = capsys.readouterr().err
    assert "waiting for" not in err
    assert err.splitlines()[:2] == [
        f"error: busy: worker processes of an earlier invocation still hold {path} after 0.3 s",
        f"hint: see them with `fuser -v {path}`; wait for them to exit or kill them, then run again",
    ]
    assert (done / "run.json").read_bytes() == state
