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
from interruptkit import child_env, kill_all, marked, own_session, poll_until
from policy_synth import tiny_value, write_small_rollout

from reproduction.portable import INTERRUPT_HINTS

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
    pytest.mark.usefixtures("terminal_sigint"),  # the Ctrl-C it sends must not be ignored (conftest)
]
TINY = tiny_value(workers=2)  # a tiny value model on CPU, two steps, inferred by two Ray workers


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
    env = child_env(AUDIT64_SEGV=mark)  # the mark: the run's processes, and the Ray head and workers it starts
    with own_session(cmd, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as child:
        try:
            deadline = time.monotonic() + 240
            while child.poll() is None and time.monotonic() < deadline:
                if _advantages(run) == "running" and "worker.io" in _threads(child.pid):
                    break
                time.sleep(0.01)
            assert child.poll() is None and time.monotonic() < deadline, "the Ray workers never started"
            os.killpg(child.pid, signal.SIGINT)  # Ctrl-C: the whole group, Ray's head and workers too
            _, err = child.communicate(timeout=120)
            poll_until(lambda: not marked(mark), 60, every_s=0.5)
            left = marked(mark)
        finally:
            kill_all(marked(mark))
    assert child.returncode == 130, err  # -11 (SIGSEGV) in Ray's C++ teardown before
    lines = err.splitlines()
    assert lines[-2:] == ["error: interrupted", f"hint: {INTERRUPT_HINTS['run']}"], err
    assert "Traceback" not in err and "Fatal Python error" not in err, err
    assert _advantages(run) == "interrupted"
    assert left == [], left
