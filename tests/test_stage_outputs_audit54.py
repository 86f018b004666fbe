"""An outputs glob reaching into the run's shared evidence/ (`../evidence/*.json`, the form docs/recipes.md gives)
records only what the stage returned or wrote during this call (audit54 A5): an earlier step's evidence, kept as
history beside the new, and a failed attempt's leftover were recorded as the stage's outputs, so a --restart-stage
deleted the history and the leftover became the stage's pinned output."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import pytest

from reproduction.recipe import Recipe, StageContext, StageOutput, StageSpec
from reproduction.run.runner import RunOptions, run_recipe


@dataclass(kw_only=True, slots=True)
class Train:
    steps: int = 2


@dataclass(kw_only=True, slots=True)
class Cfg:
    train: Train = field(default_factory=Train)


def train(ctx: StageContext) -> StageOutput:
    step = ctx.target_step or ctx.config.train.steps
    out = ctx.out_dir / "weights.txt"
    out.write_text(f"{step}\n")
    return StageOutput(files=[out], step=step)


def _atomic(path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def evalx(ctx: StageContext) -> StageOutput:
    step = int(ctx.upstream["train"].step)
    evidence = ctx.run_dir / "evidence"
    evidence.mkdir(exist_ok=True)
    mode = os.environ.get("A5_MODE", "")
    if mode == "plant":
        (evidence / "planted.json").write_text("{}")
        raise RuntimeError("left a file in evidence and raised")
    ev = evidence / f"eval_{step}.json"
    _atomic(ev, json.dumps({"step": step, "mode": mode}))
    if mode == "die_after_evidence":
        raise RuntimeError("wrote its evidence, then died")
    out = ctx.out_dir / "eval.json"
    out.write_text(json.dumps({"step": step}))
    return StageOutput(files=[out] if mode == "glob_only" else [out, ev], summary={"step": step})


RECIPE = Recipe(
    name="audit54a5",
    stages=(
        StageSpec(name="train", fn=f"{__name__}:train", config=("train",), inputs=False, training="train.steps"),
        StageSpec(
            name="evalx",
            fn=f"{__name__}:evalx",
            needs=("train",),
            inputs=False,
            outputs=("eval.json", "../evidence/*.json"),
        ),
    ),
)


def recorded(run) -> list[str]:
    return sorted(json.loads((run / "run.json").read_text())["stages"]["evalx"]["outputs"])


def test_an_earlier_steps_evidence_stays_unrecorded_history_and_a_restart_keeps_it(tmp_path):
    run = tmp_path / "run"
    run_recipe(RECIPE, Cfg(), run, RunOptions())
    assert recorded(run) == ["../evidence/eval_2.json", "eval.json"]
    report = run_recipe(RECIPE, Cfg(), run, RunOptions(resume=True, target_step=3))
    assert [s.action for s in report.stages] == ["continued", "ran"]
    assert recorded(run) == ["../evidence/eval_3.json", "eval.json"]  # eval_2.json was recorded too
    run_recipe(RECIPE, Cfg(), run, RunOptions(resume=True, restart=["evalx"]))
    assert recorded(run) == ["../evidence/eval_3.json", "eval.json"]
    assert sorted(os.listdir(run / "evidence")) == ["eval_2.json", "eval_3.json"]  # the restart deleted eval_2.json


def test_a_failed_attempts_leftover_in_evidence_is_left_unrecorded(tmp_path, monkeypatch):
    run = tmp_path / "run"
    monkeypatch.setenv("A5_MODE", "plant")
    with pytest.raises(RuntimeError, match="left a file in evidence"):
        run_recipe(RECIPE, Cfg(), run, RunOptions())
    monkeypatch.delenv("A5_MODE")
    report = run_recipe(RECIPE, Cfg(), run, RunOptions(resume=True))
    assert [s.action for s in report.stages] == ["skipped", "ran"]
    assert recorded(run) == ["../evidence/eval_2.json", "eval.json"]  # planted.json was recorded as evalx's
    assert (run / "evidence" / "planted.json").read_text() == "{}"  # left, as the docs say
    lineage = (run / "lineage" / "evalx.intoto.json").read_text() if (run / "lineage").is_dir() else ""
    assert "planted.json" not in lineage


def test_a_file_the_stage_rewrote_under_an_existing_name_is_recorded_though_not_returned(tmp_path, monkeypatch):
    """Like a kill after the evidence was written: the rerun writes the same name again; only the glob finds it."""
    run = tmp_path / "run"
    monkeypatch.setenv("A5_MODE", "die_after_evidence")
    with pytest.raises(RuntimeError, match="wrote its evidence"):
        run_recipe(RECIPE, Cfg(), run, RunOptions())
    monkeypatch.setenv("A5_MODE", "glob_only")
    run_recipe(RECIPE, Cfg(), run, RunOptions(resume=True))
    outputs = json.loads((run / "run.json").read_text())["stages"]["evalx"]["outputs"]
    assert sorted(outputs) == ["../evidence/eval_2.json", "eval.json"]
    assert json.loads((run / "evidence" / "eval_2.json").read_text()) == {"step": 2, "mode": "glob_only"}
    assert outputs["../evidence/eval_2.json"][0] == (run / "evidence" / "eval_2.json").stat().st_size


def test_a_glob_into_another_stages_folder_is_still_refused(tmp_path):
    from reproduction.errors import StageProtocolError

    bad = Recipe(
        name="audit54a5",
        stages=(
            RECIPE.stages[0],
            StageSpec(name="evalx", fn=f"{__name__}:evalx", needs=("train",), inputs=False, outputs=("../train/*",)),
        ),
    )
    with pytest.raises(StageProtocolError, match="outside its folder"):
        run_recipe(bad, Cfg(), tmp_path / "run", RunOptions())


def test_without_a_before_listing_only_returned_evidence_is_taken(tmp_path):
    from reproduction.run.stage_outputs import OutputsWatch, collect_outputs

    stage, evidence = tmp_path / "evalx", tmp_path / "evidence"
    stage.mkdir()
    evidence.mkdir()
    (evidence / "old.json").write_text("{}")
    watch = OutputsWatch.watch(tmp_path, {"stages": {}}, "evalx")
    (evidence / "new.json").write_text("[]")
    (evidence / "mine.json").write_text("1")
    spec = RECIPE.stages[1]
    assert sorted(collect_outputs(spec, stage, [evidence / "mine.json"])) == ["../evidence/mine.json"]
    got = collect_outputs(spec, stage, [evidence / "mine.json"], before=watch)
    assert sorted(got) == ["../evidence/mine.json", "../evidence/new.json"]
