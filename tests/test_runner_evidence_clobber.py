"""A stage that rewrites or removes another stage's recorded file in the run's shared evidence/ without returning it
(an out-of-tree recipe's second eval stage writing the first's evidence name): it exited 0 and left the first
stage complete with a sha256 its file no longer has. The runner stats the other stages' evidence files around each
stage and fails the run as for a returned one (exit 54). A stage adding an evidence file of its own still runs."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from reproduction.errors import StageKeyChangedError, StageProtocolError
from reproduction.recipe import Recipe, StageContext, StageOutput, StageSpec
from reproduction.run.runner import RunOptions, run_recipe
from reproduction.run.stage_outputs import verify_outputs


@dataclass(kw_only=True, slots=True)
class Cfg:
    mode: str = "overwrite"


def first_eval(ctx: StageContext) -> StageOutput:
    shared = ctx.run_dir / "evidence" / "eval_first.json"
    shared.parent.mkdir(exist_ok=True)
    shared.write_text(json.dumps({"by": "first"}))
    return StageOutput(files=[shared])


def second_eval(ctx: StageContext) -> StageOutput:
    """Writes its own evidence file, and does to the first stage's what `mode` says, returning only its own."""
    evidence = ctx.run_dir / "evidence"
    own = evidence / "eval_second.json"
    own.write_text(json.dumps({"by": "second"}))
    theirs = evidence / "eval_first.json"
    mode = ctx.config.mode
    if mode == "overwrite":
        theirs.write_text(json.dumps({"by": "second, a longer text"}))
    elif mode == "same_size":  # other bytes, same length: the size alone does not tell
        theirs.write_text(json.dumps({"by": "tsrif"}))
    elif mode == "remove":
        theirs.unlink()
    elif mode == "same_bytes":  # rewritten with the bytes it had (a new mtime): the record still holds
        theirs.write_text(theirs.read_text())
        st = theirs.stat()
        os.utime(theirs, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    return StageOutput(files=[own])


def recipe() -> Recipe:
    first = StageSpec(name="first", fn=f"{__name__}:first_eval", config=("mode",), inputs=False)
    second = StageSpec(name="second", fn=f"{__name__}:second_eval", config=("mode",), needs=("first",), inputs=False)
    return Recipe(name="toy_evals", stages=(first, second))


def _stages(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())["stages"]


@pytest.mark.parametrize(
    ("mode", "done"), [("overwrite", "overwrote"), ("same_size", "overwrote"), ("remove", "removed")]
)
def test_a_stage_clobbering_another_stages_evidence_without_returning_it_is_exit_54(tmp_path, mode, done):
    run = tmp_path / "run"
    with pytest.raises(StageProtocolError) as err:
        run_recipe(recipe(), Cfg(mode=mode), run)
    message = str(err.value)
    assert err.value.exit_code == 54
    assert message == (
        f"stage second ({__name__}:second_eval) {done} evidence/eval_first.json, which is stage first's output, "
        "without returning it"
    )
    assert err.value.hint.startswith("write the stage's evidence under a name of its own")
    assert "--restart-stage first" in err.value.hint
    stages = _stages(run)
    assert stages["second"]["status"] == "failed"  # recorded as for a returned file: no outputs, the error kept
    assert "outputs" not in stages["second"]
    assert stages["second"]["error"] == f"StageProtocolError: {message}"
    # first's record is not taken for true: its file no longer matches, and --resume says so
    assert verify_outputs(run / "first", stages["first"]["outputs"]) != []
    with pytest.raises(StageKeyChangedError) as resumed:
        run_recipe(recipe(), Cfg(mode=mode), run, RunOptions(resume=True))
    assert resumed.value.exit_code == 52 and "stage first: its outputs changed after it completed" in str(resumed.value)


@pytest.mark.parametrize("mode", ["own_only", "same_bytes"])
def test_a_stage_adding_its_own_evidence_file_beside_another_stages_runs(tmp_path, mode):
    run = tmp_path / "run"
    report = run_recipe(recipe(), Cfg(mode=mode), run)
    assert [s.action for s in report.stages] == ["ran", "ran"]
    stages = _stages(run)
    assert list(stages["first"]["outputs"]) == ["../evidence/eval_first.json"]
    assert list(stages["second"]["outputs"]) == ["../evidence/eval_second.json"]
    assert verify_outputs(run / "first", stages["first"]["outputs"]) == []
    resumed = run_recipe(recipe(), Cfg(mode=mode), run, RunOptions(resume=True))
    assert [s.action for s in resumed.stages] == ["skipped", "skipped"]
