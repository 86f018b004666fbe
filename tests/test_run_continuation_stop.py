"""Stops late in a continuation and in the write that completes a stage (audit47 kill F1, F5).

F1: Ctrl-C / SIGTERM after a `--target-step` continuation rewrote a complete stage's outputs (its export) put the
old `complete` record back over the new files; every later `--resume` then refused the stage (exit 52, "its outputs
changed after it completed") and only `--restart-stage` (training from 0) got out. F5: a signal inside the final
run.json write left the stage `running`. A toy training stage through the CLI, in-process; no torch."""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from reproduction.recipe import Recipe, StageContext, StageOutput, StageSpec

STOP = {"after_write": False}


@dataclass(kw_only=True)
class Policy:
    steps: int = 4


@dataclass(kw_only=True)
class ToyConfig:
    RUN: str = ""
    policy: Policy = field(default_factory=Policy)


def policy_stage(ctx: StageContext) -> StageOutput:
    start = 0
    model = ctx.out_dir / "model.json"
    if ctx.resume and model.is_file():
        start = json.loads(model.read_text())["step"]
    step = ctx.target_step or ctx.config.policy.steps
    model.write_text(json.dumps({"step": step, "from": start}))  # the export, rewritten by a continuation
    if STOP["after_write"]:
        raise KeyboardInterrupt("SIGTERM")
    return StageOutput(files=[model], summary={}, step=step, resumed_from=start or None)


def eval_stage(ctx: StageContext) -> StageOutput:
    step = json.loads((ctx.run_dir / "policy" / "model.json").read_text())["step"]
    out = ctx.out_dir / "rates.json"
    out.write_text(json.dumps({"step": step}))
    return StageOutput(files=[out], summary={"step": step})


def evaluate(args, run_dir, state, ui) -> int:
    return 0


RECIPE = Recipe(
    name="toy",
    config_schema=f"{__name__}:ToyConfig",
    evaluate=f"{__name__}:evaluate",
    stages=(
        StageSpec(name="policy", fn=f"{__name__}:policy_stage", config=("policy",), training="policy.steps"),
        StageSpec(name="eval", fn=f"{__name__}:eval_stage", needs=("policy",)),
    ),
)


@pytest.fixture(autouse=True)
def python_sigint_handler():
    """A test run launched in the background inherits SIGINT ignored: answer it as a terminal would."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)
    STOP["after_write"] = False


@pytest.fixture
def cli(tmp_path, capsys):
    (tmp_path / "run.yaml").write_text(f"recipe: {__name__}:RECIPE\n")

    def portable(run: Path, *args: str) -> tuple[int, str]:
        from reproduction.portable import main

        capsys.readouterr()
        code = main(["run", "--config", str(tmp_path / "run.yaml"), "--output", str(run), "--no-progress", *args])
        return code, capsys.readouterr().err

    return portable


def _record(run: Path, stage: str = "policy") -> dict:
    return json.loads((run / "run.json").read_text())["stages"][stage]


def test_an_interrupted_continuation_that_rewrote_its_export_resumes(tmp_path, cli):
    run = tmp_path / "run"
    assert cli(run)[0] == 0 and _record(run)["step"] == 4
    STOP["after_write"] = True
    code, err = cli(run, "--resume", "--target-step", "6")
    assert code == 130 and "error: interrupted" in err, err
    rec = _record(run)
    assert rec["status"] == "interrupted" and rec["error"] == "KeyboardInterrupt: SIGTERM", rec
    STOP["after_write"] = False
    code, err = cli(run, "--resume", "--target-step", "6")
    assert code == 0, err
    assert _record(run)["status"] == "complete" and _record(run)["step"] == 6
    assert json.loads((run / "eval" / "rates.json").read_text()) == {"step": 6}


def test_an_interrupted_continuation_that_changed_nothing_keeps_the_complete_record(tmp_path, cli, monkeypatch):
    run = tmp_path / "run"
    assert cli(run)[0] == 0
    before = _record(run)

    def stopped_early(ctx: StageContext) -> StageOutput:
        raise KeyboardInterrupt

    monkeypatch.setattr(__import__(__name__, fromlist=["x"]), "policy_stage", stopped_early)
    code, err = cli(run, "--resume", "--target-step", "6")
    assert code == 130, err
    assert _record(run) == before
    monkeypatch.undo()
    code, err = cli(run, "--resume")  # the stopped --target-step 6 is continued to 6 (audit54 review RV2)
    assert code == 0, err
    assert _record(run)["status"] == "complete" and _record(run)["step"] == 6


def test_a_signal_inside_the_write_that_completes_a_stage_is_answered_after_it(tmp_path, cli, monkeypatch):
    import reproduction.fsio as fsio

    run = tmp_path / "run"
    original = fsio.atomic_write_bytes

    def signalled(path, data):
        if Path(path).name == "run.json" and b'"complete"' in data and b'"eval"' not in data:
            os.kill(os.getpid(), signal.SIGINT)  # arrives inside the write of policy's complete record
        return original(path, data)

    monkeypatch.setattr(fsio, "atomic_write_bytes", signalled)
    code, err = cli(run)
    assert code == 130 and "error: interrupted" in err, err
    assert _record(run)["status"] == "complete"  # the write finished; the run stopped after it
    assert "eval" not in json.loads((run / "run.json").read_text())["stages"]
    monkeypatch.setattr(fsio, "atomic_write_bytes", original)
    assert cli(run, "--resume")[0] == 0 and _record(run, "eval")["status"] == "complete"


def test_eval_removes_the_temp_file_a_killed_eval_left(tmp_path, cli, capsys):
    """audit47 kill F4: a SIGKILLed `portable eval --checkpoint` left evidence/.eval_checkpoint_4.json.<pid>....
    through any number of eval reruns; only the next `portable run` removed it. eval removes it too, under the lock."""
    import subprocess
    import sys

    from reproduction.portable import main

    run = tmp_path / "run"
    assert cli(run)[0] == 0
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True).stdout)
    (run / "evidence").mkdir(exist_ok=True)
    left = run / "evidence" / f".eval_checkpoint_4.json.{dead}.abcd_123.portable-tmp"
    left.write_text("{")
    capsys.readouterr()
    assert main(["eval", "--checkpoint", "4", "--output", str(run), "--no-progress"]) == 0
    assert not left.exists()
    assert (
        "removed 1 temp file(s) that a killed write left: evidence/.eval_checkpoint_4.json."
        f"{dead}.abcd_123.portable-tmp" in capsys.readouterr().err
    )
