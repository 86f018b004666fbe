"""A flag is spelt in full or refused: argparse's prefix matching took `--input` (and `--i`) for `--inputs-moved`,
the opt-in that vouches for data at new paths, and `--resum` for `--resume`, silently (audit55 H1)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _portable(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, str(REPO / "reproduction" / "portable.py"), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
    )


@pytest.mark.parametrize(
    "args,flag",
    [
        (["run", "bundle", "--output", "out", "--input"], "--input"),
        (["run", "bundle", "--output", "out", "--i"], "--i"),
        (["run", "bundle", "--output", "out", "--resum"], "--resum"),
        (["compare", "a.json", "b.json", "--marg", "0.1"], "--marg"),
        (["weights", "pin", "owner/name", "--manifes", "m.json"], "--manifes"),
    ],
)
def test_an_abbreviated_flag_is_refused_and_nothing_is_written(tmp_path, args, flag):
    out = _portable(*args, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert f"unrecognized arguments: {flag}" in out.stderr.splitlines()[-1]
    assert list(tmp_path.iterdir()) == []


def test_the_sim_cli_refuses_an_abbreviated_flag_too(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "reproduction.sim", "generate", "--ou", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 2 and "--ou" in out.stderr.splitlines()[-1]
    assert not (tmp_path / "x").exists()
