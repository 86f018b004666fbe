"""audit64 segv: a Ctrl-C to `portable run`'s process group as the advantages stage's Ray value inference
(value.infer.workers=2) starts its workers lands inside `ray.init`, after Ray's native core worker started and before
Python holds it: `ray.shutdown` cannot stop it, and its C++ teardown at the process's exit (a libc atexit handler,
after Python's) crashed on the raylet and GCS the same Ctrl-C ended. The process died of SIGSEGV (-11) about 5 s after
its right `error: interrupted` lines, in 5 of 5 runs; now it exits 130 after Python's own exit (atexit hooks)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from policy_synth import tiny_value, write_small_rollout

from reproduction.portable import INTERRUPT_HINTS

REPO = Path(__file__).resolve().parent.parent
pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
    pytest.mark.usefixtures("terminal_sigint"),  # the Ctrl-C it sends must not be ignored (conftest)
]
TINY = tiny_value(workers=2)  # a tiny value model on CPU, two steps, inferred by two Ray workers


def _marked(mark: str) -> list[tuple[int, str]]:
    """The processes whose environment holds `mark` (the run's, and the Ray head and workers it started)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if mark.encode() in (entry / "environ").read_bytes():
                    found.append((int(entry.name), (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()))
            except OSError:
                pass
    return found


def _threads(pid: int) -> set[str]:
    """The names of process `pid`'s threads: Ray's core worker runs its IO in `worker.io`, started as it is created."""
    names = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            names.add((task / "comm").read_text().strip())
        except OSError:
            pass
    return names


def _advantages(run: Path) -> str | None:
    try:
        return json.loads((run / "run.json").read_text())["stages"].get("advantages", {}).get("status")
    except (OSError, ValueError, KeyError):
        return None


def test_ctrl_c_as_the_value_inference_ray_workers_start_exits_130_not_sigsegv(tmp_path):
    data, run, mark = write_small_rollout(tmp_path / "ds"), tmp_path / "run", uuid.uuid4().hex
    cmd = [sys.executable, "-m", "reproduction.portable", "-q", "run", "--output", str(run)]
    cmd += ["--stages", "returns,value,advantages", f"datasets=[{{path: {data}, type: rollout}}]", *TINY]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "AUDIT64_SEGV": mark}
    child = subprocess.Popen(
        cmd, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 240
        while child.poll() is None and time.monotonic() < deadline:
            if _advantages(run) == "running" and "worker.io" in _threads(child.pid):
                break
            time.sleep(0.01)
        assert child.poll() is None and time.monotonic() < deadline, "the Ray workers never started"
        os.killpg(child.pid, signal.SIGINT)  # Ctrl-C: the whole group, Ray's head and workers too
        _, err = child.communicate(timeout=120)
        deadline = time.monotonic() + 60
        while _marked(mark) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = _marked(mark)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        for pid, _ in _marked(mark):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    assert child.returncode == 130, err  # -11 (SIGSEGV) in Ray's C++ teardown before
    lines = err.splitlines()
    assert lines[-2:] == ["error: interrupted", f"hint: {INTERRUPT_HINTS['run']}"], err
    assert "Traceback" not in err and "Fatal Python error" not in err, err
    assert _advantages(run) == "interrupted"
    assert left == [], left
