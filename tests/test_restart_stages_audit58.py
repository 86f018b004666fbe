"""`--restart-stage NAME` with a `--stages` that leaves NAME out (audit58 B5).

`--restart-stage right --stages prep` redid nothing and exited 0, and `--stages prep,train` redid train but not
right, silently. Now exit 2 naming both flags, before anything is written; a --restart-stage among --stages, or
without --stages, is taken as before, and an unknown name is still the runner's exit 4 listing the stages.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "c.yaml"
    config.write_text("datasets:\n  - {path: " + str(tmp_path / "no-dataset") + ", type: rollout}\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PORTABLE_NO_PROGRESS": "1"}
    cmd = [sys.executable, str(REPO / "reproduction" / "portable.py"), "run", "--config", str(config)]
    return subprocess.run(
        [*cmd, "--output", str(tmp_path / "out"), *args], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.mark.parametrize(
    ("stages", "restart", "named"),
    [("returns", ["value"], "value"), ("returns,policy", ["value"], "value"), ("eval", ["value", "eval"], "value")],
)
def test_a_restart_stage_left_out_by_stages_is_exit_2_naming_both(tmp_path, stages, restart, named):
    flags = [a for name in restart for a in ("--restart-stage", name)]
    done = _run(tmp_path, "--stages", stages, *flags)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"error: --restart-stage {named} names a stage that --stages {stages!r} leaves out: it would not be redone",
        f"hint: add {named} to --stages, or leave --stages out to run every stage",
    ]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "args", [["--stages", "returns,value", "--restart-stage", "value"], ["--restart-stage", "value"]]
)
def test_a_restart_stage_among_stages_goes_on_to_the_next_check(tmp_path, args):
    done = _run(tmp_path, *args)
    assert done.returncode == 3, done.stderr  # the missing dataset, checked after the flags
    assert done.stderr.startswith("error: datasets[0].path: dataset ")


def test_an_unknown_restart_stage_is_still_the_runners_exit_4(tmp_path):
    done = _run(tmp_path, "--stages", "returns", "--restart-stage", "nope")
    assert done.returncode == 4
    assert done.stderr.splitlines()[0] == "error: no stage 'nope' in recipe recap"
