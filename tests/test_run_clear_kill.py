"""kill -9 where the runner clears a stage it redoes (`--restart-stage`: the stage's folder and its evidence/ files
are removed before it runs again) and where it writes the report after redone stages: the next `--resume` must finish
with what an uninterrupted run holds (audit50 A F1: every --resume refused with exit 52, the `complete` record naming
removed files; F3: the report the killed invocation meant to replace stood for every later --resume).

The seam is the test's: `portable` runs in a child whose runner functions are wrapped to SIGKILL the process group at
the chosen moment, as `kill -9` from outside would."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from recipe_cli import PORTABLE, run_portable

RECIPE = """
import json, os, signal, time
from dataclasses import dataclass, field
from pathlib import Path

from reproduction.fsio import atomic_write_text
from reproduction.recipe import Recipe, StageContext, StageOutput, StageSpec


@dataclass(kw_only=True)
class Train:
    steps: int = 4


@dataclass(kw_only=True)
class Cfg:
    train: Train = field(default_factory=Train)


def train(ctx: StageContext) -> StageOutput:
    checkpoint = ctx.out_dir / "checkpoint.json"
    step, w = 0, 0.0
    if ctx.resume and checkpoint.is_file():
        state = json.loads(checkpoint.read_text())
        step, w = state["step"], state["w"]
    while step < (ctx.target_step or ctx.config.train.steps):
        w, step = w + 0.5 * (10 - w), step + 1
        atomic_write_text(ctx.out_dir / f"ckpt_{step}.json", json.dumps({"step": step, "w": w}))
        atomic_write_text(checkpoint, json.dumps({"step": step, "w": w}))
    weights = ctx.out_dir / "weights.json"
    atomic_write_text(weights, json.dumps({"w": w}))
    return StageOutput(files=[weights, checkpoint], summary={"w": w}, step=step)


def score(ctx: StageContext) -> StageOutput:
    w = json.loads((ctx.run_dir / "train" / "weights.json").read_text())["w"]
    out = ctx.run_dir / "evidence" / "eval_score.json"
    atomic_write_text(out, json.dumps({"score": w}))
    return StageOutput(files=[out], summary={"score": w})


def report(run_dir: Path) -> Path:
    if os.environ.get("KILL_IN_REPORT"):
        os.killpg(os.getpgrp(), signal.SIGKILL)
    out = run_dir / "report.html"
    atomic_write_text(out, "<p>" + (run_dir / "evidence" / "eval_score.json").read_text() + "</p>")
    return out


RECIPE = Recipe(
    name="clearing",
    config_schema="clearing:Cfg",
    report="clearing:report",
    stages=(
        StageSpec(name="train", fn="clearing:train", config=("train",), training="train.steps",
                  outputs=("weights.json", "checkpoint.json", "ckpt_*.json"), inputs=False),
        StageSpec(name="score", fn="clearing:score", needs=("train",), inputs=False),
    ),
)
"""

# Runs `portable ARGV` with runner._remove_recorded_elsewhere (the evidence/ files of a restarted stage) or the
# removal of a stage's folder (whatever the runner calls for it) made to kill the process group once done / once
# one file of the folder is gone.
SEAM = """
import os, signal, sys
import reproduction.run.runner as runner

point = os.environ["KILL_AT"]


def die():
    sys.stdout.flush(); sys.stderr.flush()
    os.killpg(os.getpgrp(), signal.SIGKILL)


if point == "after_evidence_removed":
    original = runner._remove_recorded_elsewhere

    def wrapped(*a, **k):
        original(*a, **k)
        die()

    runner._remove_recorded_elsewhere = wrapped
elif point == "half_cleared":
    def half(path, *a, **k):
        files = sorted(p for p in __import__("pathlib").Path(path).rglob("*") if p.is_file())
        if files:
            os.unlink(files[0])
        die()

    for name in ("remove_tree", "shutil"):
        if name == "remove_tree" and hasattr(runner, "remove_tree"):
            runner.remove_tree = half
        elif name == "shutil" and hasattr(runner, "shutil"):
            runner.shutil.rmtree = half
from reproduction.portable import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "clearing.py").write_text(textwrap.dedent(RECIPE))
    (tmp_path / "c.yaml").write_text("recipe: clearing:RECIPE\ntrain: {steps: 4}\n")
    return tmp_path


def portable(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    # the seam kills its own process group, not pytest's
    program = ("-c", SEAM) if "KILL_AT" in env else PORTABLE
    return run_portable(cwd, *args, program=program, new_session=True, **env)


def outputs(run: Path) -> dict[str, bytes]:
    """The bytes of the run's recorded outputs and report, by path."""
    state = json.loads((run / "run.json").read_text())
    found = {
        os.path.normpath(f"{name}/{rel}"): (run / name / rel).read_bytes()
        for name, rec in state["stages"].items()
        for rel in rec["outputs"]
    }
    return {**found, "report.html": (run / "report.html").read_bytes()}


@pytest.mark.parametrize("point", ["after_evidence_removed", "half_cleared"])
@pytest.mark.parametrize("stage", ["train", "score"])
def test_a_restart_stage_killed_while_it_clears_the_stage_resumes_to_the_uninterrupted_bytes(folder, point, stage):
    run = ["run", "--config", "c.yaml", "--output"]
    assert portable(folder, *run, "runs/whole").returncode == 0
    assert portable(folder, *run, "runs/k").returncode == 0
    killed = portable(folder, *run, "runs/k", "--restart-stage", stage, KILL_AT=point)
    assert killed.returncode == -9, killed.stderr
    state = json.loads((folder / "runs/k/run.json").read_text())
    assert state["stages"].get(stage, {}).get("status") != "complete", "a complete record of a half-cleared stage"

    resumed = portable(folder, *run, "runs/k", "--resume", "--json")
    assert resumed.returncode == 0, resumed.stderr
    # redone afresh; after train, score is skipped: train's outputs came out the same bits
    assert {s["stage"]: s["action"] for s in json.loads(resumed.stdout)["stages"]}[stage] == "ran"
    assert outputs(folder / "runs/k") == outputs(folder / "runs/whole")
    assert not any(p.name.endswith(".portable-tmp") for p in (folder / "runs/k").rglob("*"))
    again = portable(folder, *run, "runs/k", "--resume", "--json")
    assert [s["action"] for s in json.loads(again.stdout)["stages"]] == ["skipped", "skipped"], again.stderr


def test_a_report_killed_after_stages_were_redone_is_written_by_the_next_resume(folder):
    run = ["run", "--config", "c.yaml", "--output"]
    # the uninterrupted sequence: 4 steps; train on to 6 alone (score stale); --resume redoes score
    assert portable(folder, *run, "runs/whole").returncode == 0
    assert portable(folder, *run, "runs/whole", "--target-step", "6", "--stages", "train").returncode == 0
    assert portable(folder, *run, "runs/whole", "--resume").returncode == 0
    # the same, the last step killed in the report, after score was redone and recorded
    assert portable(folder, *run, "runs/k").returncode == 0
    assert portable(folder, *run, "runs/k", "--target-step", "6", "--stages", "train").returncode == 0
    stale = (folder / "runs/k/report.html").read_bytes()
    killed = portable(folder, *run, "runs/k", "--resume", KILL_IN_REPORT="1")
    assert killed.returncode == -9, killed.stderr
    assert json.loads((folder / "runs/k/run.json").read_text())["stages"]["score"]["status"] == "complete"
    assert not (folder / "runs/k/report.html").exists(), "the report of the stale score still stands"

    resumed = portable(folder, *run, "runs/k", "--resume", "--json")
    assert [s["action"] for s in json.loads(resumed.stdout)["stages"]] == ["skipped", "skipped"], resumed.stderr
    assert outputs(folder / "runs/k") == outputs(folder / "runs/whole")
    assert (folder / "runs/k/report.html").read_bytes() != stale
