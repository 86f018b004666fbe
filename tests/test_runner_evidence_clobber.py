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


def both_evals(ctx: StageContext) -> StageOutput:
    """Two stages' evidence files, for a stage after them to clobber both."""
    evidence = ctx.run_dir / "evidence"
    evidence.mkdir(exist_ok=True)
    for name in ("eval_a.json", "eval_b.json"):
        (evidence / name).write_text(json.dumps({"by": name}))
    return StageOutput(files=[evidence / "eval_a.json", evidence / "eval_b.json"])


def clobber_both(ctx: StageContext) -> StageOutput:
    evidence = ctx.run_dir / "evidence"
    (evidence / "eval_a.json").write_text("{}")
    (evidence / "eval_b.json").unlink()
    (ctx.out_dir / "done.txt").write_text("x")
    return StageOutput(files=[ctx.out_dir / "done.txt"])


def test_every_clobbered_file_is_named_in_one_error(tmp_path):
    first = StageSpec(name="first", fn=f"{__name__}:both_evals", inputs=False)
    second = StageSpec(name="second", fn=f"{__name__}:clobber_both", needs=("first",), inputs=False)
    with pytest.raises(StageProtocolError) as err:
        run_recipe(Recipe(name="toy_two", stages=(first, second)), Cfg(), tmp_path / "run")
    assert str(err.value) == (
        f"stage second ({__name__}:clobber_both) overwrote evidence/eval_a.json, which is stage first's output; "
        "removed evidence/eval_b.json, which is stage first's output, without returning them"
    )
    assert err.value.hint.endswith("--restart-stage first then writes first's file again")


# -- the comparison an older run's eval stage recorded (TAKEN_OVER) ----------------------------------------------------


@dataclass(kw_only=True, slots=True)
class RefCfg:
    reference: str = ""


def old_eval(ctx: StageContext) -> StageOutput:
    """Eval as it was before compare became a stage: its evidence and, with a reference, the comparison."""
    evidence = ctx.run_dir / "evidence"
    evidence.mkdir(exist_ok=True)
    (evidence / "eval_policy_4.json").write_text("{}")
    (evidence / "comparison.json").write_text('{"verdict": "reproduced"}')
    return StageOutput(files=[evidence / "eval_policy_4.json", evidence / "comparison.json"])


def compare(ctx: StageContext) -> StageOutput:
    """As the built-in compare stages do: the comparison with a reference, none (the stale one removed) without."""
    comparison = ctx.run_dir / "evidence" / "comparison.json"
    record = ctx.out_dir / "compare.json"
    if ctx.config.reference:
        comparison.write_text('{"verdict": "differs"}')
        record.write_text("{}")
        return StageOutput(files=[record, comparison])
    comparison.unlink(missing_ok=True)
    record.write_text('{"verdict": null}')
    return StageOutput(files=[record])


@pytest.mark.parametrize("reference", ["", "ref.json"])
def test_compare_takes_over_the_comparison_an_older_run_recorded_as_evals(tmp_path, reference):
    """audit49 review F1: with no reference the compare stage removes the comparison eval recorded in a run made
    before compare was a stage; that was refused (exit 54, naming a hint no one could follow), and before the
    watch the next --resume was exit 52 (eval's outputs changed). Now it is taken over like a returned one."""
    run = tmp_path / "run"
    old = StageSpec(name="eval", fn=f"{__name__}:old_eval", inputs=False)
    run_recipe(Recipe(name="toy_cmp", stages=(old,)), RefCfg(reference=reference), run)
    ev = StageSpec(name="eval", fn=f"{__name__}:old_eval", inputs=False)  # skipped on resume: its key is unchanged
    cmp_stage = StageSpec(
        name="compare", fn=f"{__name__}:compare", needs=("eval",), config=("reference",), inputs=False
    )
    today = Recipe(name="toy_cmp", stages=(ev, cmp_stage))
    report = run_recipe(today, RefCfg(reference=reference), run, RunOptions(resume=True))
    assert [(s.name, s.action) for s in report.stages] == [("eval", "skipped"), ("compare", "ran")]
    stages = _stages(run)
    assert list(stages["eval"]["outputs"]) == ["../evidence/eval_policy_4.json"]  # the comparison is no longer eval's
    assert ("../evidence/comparison.json" in stages["compare"]["outputs"]) == bool(reference)
    assert (run / "evidence" / "comparison.json").exists() == bool(reference)
    again = run_recipe(today, RefCfg(reference=reference), run, RunOptions(resume=True))
    assert [s.action for s in again.stages] == ["skipped", "skipped"]
