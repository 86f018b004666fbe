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
    # the CLI's error shape (audit60 L4): `error: ...` then `hint: see \`portable COMMAND --help\``
    error, hint = out.stderr.splitlines()[-2:]
    assert f"error: unrecognized arguments: {flag}" in error and hint.startswith(f"hint: see `portable {args[0]}")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "module", [["reproduction.sim", "generate"], ["reproduction.sim.libero.generate", "--task", "libero_10/0"]]
)
def test_the_sim_clis_refuse_an_abbreviated_flag_too(tmp_path, module):
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-m", *module, "--out", str(tmp_path / "x"), "--work", "2"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 2 and "unrecognized arguments: --work" in out.stderr.splitlines()[-1]
    assert not (tmp_path / "x").exists()
