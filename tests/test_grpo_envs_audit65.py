"""A GRPO rollout driver killed by SIGKILL (the OOM killer, `kill -9 PID`) while its workers' answers are unread: the
orphaned workers end quietly (audit65 K: they printed a ConnectionResetError / BrokenPipeError traceback from
envs._serve, which a kill sweep grepping for tracebacks flags)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import os, signal, time
from reproduction.recipes.grpo.envs import EnvWorkers
w = EnvWorkers("FetchPush-v4", 2, 2)
for c in w.conns:
    c.send(("success", None))  # the command goes out; its answers are never read
time.sleep(2)  # the workers have answered
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_workers_of_a_killed_driver_end_without_a_traceback() -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    # run() returns once every holder of stderr (the workers too) has closed it: the workers' exit is awaited.
    p = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=180, env=env, cwd=ROOT)
    assert p.returncode == -9
    assert "Traceback" not in p.stderr, p.stderr
    assert "Error" not in p.stderr, p.stderr
