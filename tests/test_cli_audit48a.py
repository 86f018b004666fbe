"""Findings of audit47's CLI pass fixed at stop 48a: a run.json that is a folder (exit 3, named), ..."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "reproduction.portable", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=cwd)


def _one_error(proc: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    first = proc.stderr.splitlines()[0]
    assert first.startswith("error: "), proc.stderr
    return first


def test_a_run_json_that_is_a_folder_is_exit_3_naming_it(tmp_path):
    run = tmp_path / "run"
    (run / "run.json").mkdir(parents=True)
    proc = _cli("run", "--output", str(run), "--resume", "--stages", "returns")
    assert proc.returncode == 3, proc.stderr
    first = _one_error(proc)
    assert str(run / "run.json") in first and "is a folder, not a file" in first
    assert (run / "run.json").is_dir() and sorted(p.name for p in run.iterdir()) == ["run.json"]
