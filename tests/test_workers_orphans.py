"""Spawn workers end with their driver, and the LIBERO generator's command line answers SIGTERM like Ctrl-C
(audit55 E1, E2, E5)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of `pid`, or None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_bytes().rpartition(b")")[2].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return fields[0].decode(), int(fields[1])


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            st = _stat(int(entry.name))
            if st is not None and st[1] == pid:
                out.append(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    st = _stat(pid)
    return st is not None and st[0] not in ("Z", "X")  # a zombie left for a non-reaping PID 1 has ended


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def _wait_for(cond, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_spawn_workers_end_with_their_driver(how: signal.Signals) -> None:
    # The workers sleep far longer than the test: only their parent's death can end them in time.
    code = textwrap.dedent(
        """
        import sys, time
        from reproduction.sim.workers import run_units
        print("started", flush=True)
        for r in run_units(time.sleep, [300, 300, 300, 300], workers=2):
            pass
        """
    )
    driver = subprocess.Popen([sys.executable, "-c", code], env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    workers: list[int] = []
    try:
        assert driver.stdout.readline() == b"started\n"

        def spawned() -> bool:
            workers[:] = [p for p in _children(driver.pid) if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]
            return len(workers) >= 2

        assert _wait_for(spawned, 30), "the pool's workers did not start"
        time.sleep(1.0)  # past the initializer: the parent watch is set
        driver.send_signal(how)
        driver.wait(timeout=30)
        assert _wait_for(lambda: not any(_alive(p) for p in workers), 10), (
            f"workers {[p for p in workers if _alive(p)]} outlived their driver ({how.name})"
        )
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        _kill_all(workers)


def test_watch_parent_exits_when_the_parent_is_already_gone() -> None:
    from reproduction.sim.workers import watch_parent

    code = "import os; from reproduction.sim import workers; workers.watch_parent(os.getppid() + 10**7); print('on')"
    proc = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (1, b"")
    watch_parent(os.getppid())  # the live parent: returns, this process keeps running


POLLED_CHILD = """
import os, sys, time
sys.platform = "darwin"  # no prctl: the polling thread watches
from reproduction.sim.workers import watch_parent
watch_parent(os.getppid())
print("watching", flush=True)
time.sleep(300)
"""


def test_without_prctl_a_thread_polls_for_the_parent() -> None:
    code = (
        "import subprocess, sys; c = subprocess.Popen([sys.executable, '-c', sys.argv[1]]); print(c.pid, flush=True);"
        " c.wait()"
    )
    driver = subprocess.Popen([sys.executable, "-c", code, POLLED_CHILD], env=_env(), stdout=subprocess.PIPE)
    child = None
    try:
        child = int(driver.stdout.readline())
        assert driver.stdout.readline() == b"watching\n"  # the child's, on the stdout it inherited
        driver.kill()
        driver.wait()
        assert _wait_for(lambda: not _alive(child), 10), "the watched child outlived its parent"
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        if child is not None:
            _kill_all([child])


GEN_STUB = """
import sys, time
from pathlib import Path
import reproduction.sim.libero.generate as gen
from reproduction.data.writer import write_dataset

def stand_in(root, **kw):
    root = Path(root)
    root.mkdir(exist_ok=True)
    def episodes():  # iterated once the staging folder exists
        print("writing", flush=True)
        time.sleep(300)
        yield from ()
    write_dataset(root / "rollouts_train", episodes(), fps=10,
                  features={"observation.state": {"dtype": "float32", "shape": [3]},
                            "action": {"dtype": "float32", "shape": [3]}}, tasks=["t"])

gen.generate_libero_data = stand_in
sys.exit(gen.main(sys.argv[1:]))
"""


def test_generator_sigterm_is_an_interrupt_and_leaves_no_staging(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-c", GEN_STUB, "--out", str(out), "--no-progress"],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        line = proc.stdout.readline()
        assert line == b"writing\n", proc.stderr.read().decode()
        assert [p.name for p in out.iterdir()] == [f".rollouts_train.partial-{proc.pid}"]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130
    assert err.decode().strip().splitlines()[-1] == "error: interrupted"
    assert not out.exists()  # created by the call and left empty: removed, its staging folder first


def test_rerun_names_the_sets_to_skip_and_a_killed_runs_staging(tmp_path: Path, monkeypatch) -> None:
    import reproduction.sim.libero.generate as gen
    from reproduction.errors import InvalidInputError

    (tmp_path / "rollouts_train").mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    staging = tmp_path / f".rollouts_eval.partial-{dead.pid}"
    staging.mkdir()
    monkeypatch.setattr("reproduction.sim.libero._runtime.check_render_backend", lambda: None)
    with pytest.raises(InvalidInputError) as err:
        gen.generate_libero_data(tmp_path, task="libero_spatial/0", sft=0, rollouts=2, eval_rollouts=1)
    assert str(err.value.args[0]) == f"{tmp_path / 'rollouts_train'}: already exists"
    assert err.value.hint == (
        f"choose a new folder, or set --rollouts 0 to write only the others; a killed run left {staging}: it can be"
        " removed"
    )


def test_generator_takes_a_task_by_its_language(tmp_path: Path, monkeypatch) -> None:
    import reproduction.sim.libero.generate as gen
    import reproduction.sim.libero.tasks as tasks

    language = "pick up the black bowl between the plate and the ramekin and place it on the plate"
    asked = []

    def resolve(specs, libero=None, cache_dir=None):
        asked.append(list(specs))
        return [SimpleNamespace(task_id="libero_spatial/0")]

    made = []
    monkeypatch.setattr(tasks, "resolve_tasks", resolve)
    monkeypatch.setattr("reproduction.sim.libero._runtime.check_render_backend", lambda: None)
    monkeypatch.setattr(gen, "generate_libero_dataset", lambda cfg, out, **kw: made.append((cfg.kind, cfg.task)))
    gen.generate_libero_data(tmp_path, task=f"libero_spatial/{language}", sft=0, rollouts=1, eval_rollouts=1)
    assert asked == [[f"libero_spatial/{language}"]]
    assert made == [("rollout", "libero_spatial/0"), ("eval", "libero_spatial/0")]


def test_a_pool_stopped_early_does_not_wait_for_its_running_units() -> None:
    from reproduction.sim.workers import run_units

    units = run_units(time.sleep, [0, 60, 60], workers=2)
    assert next(units) is None
    start = time.monotonic()
    units.close()  # what an interrupt in the caller's loop does: the running 60 s unit is not waited for
    assert time.monotonic() - start < 15


FETCH_STUB = """
import sys, time
import reproduction.sim.generate as fetch_gen
from reproduction.sim.__main__ import main

def stand_in(*args, **kw):
    print("generating", flush=True)
    time.sleep(300)

fetch_gen.generate_mix = stand_in
sys.exit(main(sys.argv[1:]))
"""


def test_fetch_generator_sigterm_is_an_interrupt(tmp_path: Path) -> None:
    args = ["generate", "--out", str(tmp_path / "out"), "--tasks", "FetchPickAndPlace-v4", "--no-progress"]
    proc = subprocess.Popen(
        [sys.executable, "-c", FETCH_STUB, *args], env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert proc.stdout.readline() == b"generating\n", proc.stderr.read().decode()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (proc.returncode, err) == (130, b"error: interrupted\n")
