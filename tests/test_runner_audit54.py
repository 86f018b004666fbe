"""audit54 A2, A4, A6 on a toy recipe, in process.

A2: a stage redone (`--restart-stage`) that then fails kept its earlier `succeeded` lineage statement, so `portable
lineage` showed it succeeded and `--verify` reported its files lost (exit 11). A4: a stage that wrote none of its
declared outputs was exit 50 (checkpoint incomplete) with no hint. A6: a `--target-step` killed partway was finished
by a plain `--resume` at whatever step its checkpoint had."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from reproduction.errors import RunStateError, StageProtocolError
from reproduction.fsio import atomic_write_text
from reproduction.recipe import Recipe, StageContext, StageOutput, StageSpec
from reproduction.run import runner
from reproduction.run.lineage_check import verify_lineage
from reproduction.run.record import make_recorder
from reproduction.run.runner import RunOptions, read_state, run_recipe


@dataclass(kw_only=True)
class Train:
    steps: int = 3


@dataclass(kw_only=True)
class Cfg:
    train: Train = field(default_factory=Train)


def train(ctx: StageContext) -> StageOutput:
    """One checkpoint per step; stops with an error after the step <run>/../die_at names (removed as it stops)."""
    die = ctx.run_dir.parent / "die_at"
    step, w = 0, 1.0
    if ctx.resume:
        done = sorted(int(p.stem.split("_")[1]) for p in ctx.out_dir.glob("ckpt_*.json"))
        if done:
            step, w = done[-1], json.loads((ctx.out_dir / f"ckpt_{done[-1]}.json").read_text())["w"]
    target = ctx.target_step or ctx.config.train.steps
    while step < target:
        w, step = w * 1.1 + 0.01 * step, step + 1
        atomic_write_text(ctx.out_dir / f"ckpt_{step}.json", json.dumps({"w": w}))
        if die.is_file() and int(die.read_text()) == step:
            die.unlink()
            raise RuntimeError(f"stopped after step {step}")
    weights = ctx.out_dir / "weights.json"
    atomic_write_text(weights, json.dumps({"w": w, "step": step}))
    return StageOutput(files=[weights], summary={"w": w}, step=step)


def evalx(ctx: StageContext) -> StageOutput:
    if (ctx.run_dir.parent / "fail_eval").is_file():
        raise RuntimeError("evalx failed")
    w = json.loads((ctx.run_dir / "train" / "weights.json").read_text())["w"]
    out = ctx.out_dir / "eval.json"
    atomic_write_text(out, json.dumps({"score": round(w, 6)}))
    return StageOutput(files=[out], summary={"score": round(w, 6)})


def nothing(ctx: StageContext) -> StageOutput:
    return StageOutput(files=[])


RECIPE = Recipe(
    name="audit54",
    stages=(
        StageSpec(
            name="train",
            fn=f"{__name__}:train",
            config=("train",),
            training="train.steps",
            outputs=("weights.json",),
            inputs=False,
        ),
        StageSpec(name="evalx", fn=f"{__name__}:evalx", needs=("train",), outputs=("eval.json",), inputs=False),
    ),
)
NO_OUTPUT = Recipe(
    name="nooutput",
    stages=(StageSpec(name="g", fn=f"{__name__}:nothing", outputs=("weights.json",), inputs=False),),
)


def _opts(**kw) -> RunOptions:
    return RunOptions(recorder=make_recorder(None), **kw)


def _statement(run: Path, stage: str) -> Path:
    return run / "lineage" / f"{stage}.intoto.json"


# -- A2 -------------------------------------------------------------------------------------------------------------


def test_a_restarted_stage_that_fails_has_no_statement_and_resume_writes_it_again(tmp_path):
    run = tmp_path / "run"
    run_recipe(RECIPE, Cfg(), run, _opts())
    assert _statement(run, "evalx").is_file()
    (tmp_path / "fail_eval").write_text("")
    with pytest.raises(RuntimeError, match="evalx failed"):
        run_recipe(RECIPE, Cfg(), run, _opts(restart=["evalx"]))
    assert read_state(run)["stages"]["evalx"]["status"] == "failed"
    assert not _statement(run, "evalx").exists()  # as a fresh run whose evalx failed
    assert _statement(run, "train").is_file()  # the stage not redone keeps its own
    report = verify_lineage(run)
    assert (report.exit_code, report.problems) == (0, [])
    (tmp_path / "fail_eval").unlink()
    run_recipe(RECIPE, Cfg(), run, _opts(resume=True))
    assert read_state(run)["stages"]["evalx"]["status"] == "complete"
    assert json.loads(_statement(run, "evalx").read_text())["subject"][0]["name"] == "evalx/eval.json"
    report = verify_lineage(run)
    assert (report.exit_code, report.problems) == (0, [])


def test_a_kill_after_the_statement_is_cleared_leaves_a_run_resume_mends(tmp_path, monkeypatch):
    """Killed between removing the statement and writing the record without the stage: the stage is still
    `complete` with its files, so --resume skips it and writes its statement again from run.json."""
    run = tmp_path / "run"
    run_recipe(RECIPE, Cfg(), run, _opts())
    before = _statement(run, "evalx").read_bytes()
    write = runner._write_state

    def killed(run_dir, state):
        if "evalx" not in state["stages"]:  # the record popped by _clear_stage, about to be written
            raise KeyboardInterrupt
        write(run_dir, state)

    monkeypatch.setattr(runner, "_write_state", killed)
    with pytest.raises(KeyboardInterrupt):
        run_recipe(RECIPE, Cfg(), run, _opts(restart=["evalx"]))
    monkeypatch.setattr(runner, "_write_state", write)
    assert not _statement(run, "evalx").exists()
    assert read_state(run)["stages"]["evalx"]["status"] == "complete"
    report = run_recipe(RECIPE, Cfg(), run, _opts(resume=True))
    assert {s.name: s.action for s in report.stages} == {"train": "skipped", "evalx": "skipped"}
    assert json.loads(_statement(run, "evalx").read_bytes())["subject"] == json.loads(before)["subject"]
    assert verify_lineage(run).exit_code == 0


# -- A4 -------------------------------------------------------------------------------------------------------------


def test_a_stage_that_writes_none_of_its_outputs_is_a_protocol_error(tmp_path):
    run = tmp_path / "run"
    with pytest.raises(StageProtocolError) as err:
        run_recipe(NO_OUTPUT, Cfg(), run, _opts())
    assert err.value.exit_code == 54
    assert str(err.value) == (
        f"stage g ({__name__}:nothing) wrote no outputs: it returned no files, and nothing in {run / 'g'} "
        "matches its StageSpec.outputs ['weights.json']"
    )
    assert err.value.hint == (
        "write the stage's outputs into ctx.out_dir and return them in StageOutput(files=[...]), "
        "or fix StageSpec.outputs to name the files it writes"
    )
    rec = read_state(run)["stages"]["g"]
    assert rec["status"] == "failed" and rec["error"].startswith("StageProtocolError: stage g (")


# -- A6 -------------------------------------------------------------------------------------------------------------


KILLED = "--resume: training {} to --target-step {}, as the killed run asked (pass --target-step to ask for another)\n"


def _uninterrupted(root: Path, target: int) -> Path:
    """steps=3 complete, then --target-step `target`, not stopped."""
    run = root / "whole"
    run_recipe(RECIPE, Cfg(), run, _opts())
    run_recipe(RECIPE, Cfg(), run, _opts(target_step=target))
    return run


def _killed(root: Path, monkeypatch, target: int, at: int) -> Path:
    """steps=3 complete, then --target-step `target` killed -9 after step `at` (no record of the stop written)."""
    run = root / "run"
    run_recipe(RECIPE, Cfg(), run, _opts())
    (root / "die_at").write_text(str(at))
    monkeypatch.setattr(runner, "_record_stop", lambda *a, **k: None)  # kill -9: the `running` record stays
    with pytest.raises(RuntimeError, match=f"stopped after step {at}"):
        run_recipe(RECIPE, Cfg(), run, _opts(target_step=target))
    monkeypatch.undo()
    assert read_state(run)["stages"]["train"]["status"] == "running"
    return run


def test_a_plain_resume_of_a_killed_target_step_continues_to_that_target(tmp_path, monkeypatch, capsys):
    run = _killed(tmp_path, monkeypatch, target=6, at=4)
    state = read_state(run)
    assert state["target_step"] == {"step": 6, "stages": ["train", "evalx"]}
    assert "target_step" not in state["stages"]["train"]  # run-level since R2
    capsys.readouterr()
    report = run_recipe(RECIPE, Cfg(), run, _opts(resume=True))
    state = read_state(run)
    rec = state["stages"]["train"]
    assert (rec["status"], rec["step"]) == ("complete", 6) and "target_step" not in rec
    assert "target_step" not in state  # completed: a later plain --resume asks for nothing
    assert capsys.readouterr().err.count(KILLED.format("train", 6)) == 1
    assert {s.name: s.action for s in report.stages} == {"train": "continued", "evalx": "ran"}
    whole = _uninterrupted(tmp_path, 6)
    for rel in ("train/weights.json", "evalx/eval.json"):
        assert (run / rel).read_bytes() == (whole / rel).read_bytes(), rel
    assert verify_lineage(run).exit_code == 0


def test_a_failed_target_step_is_continued_to_it_and_an_explicit_target_wins(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    (tmp_path / "die_at").write_text("2")
    with pytest.raises(RuntimeError, match="stopped after step 2"):
        run_recipe(RECIPE, Cfg(), run, _opts(target_step=5))
    state = read_state(run)
    assert (state["stages"]["train"]["status"], state["target_step"]["step"]) == ("failed", 5)
    (tmp_path / "die_at").write_text("4")  # stopped again on the way: the target is kept across stops
    with pytest.raises(RuntimeError, match="stopped after step 4"):
        run_recipe(RECIPE, Cfg(), run, _opts(resume=True))
    assert "--resume: training train to --target-step 5, as the failed run asked" in capsys.readouterr().err
    assert read_state(run)["target_step"] == {"step": 5, "stages": ["train", "evalx"]}
    run_recipe(RECIPE, Cfg(), run, _opts(resume=True, target_step=7))  # this invocation's --target-step wins
    assert "as the" not in capsys.readouterr().err
    state = read_state(run)
    assert (state["stages"]["train"]["status"], state["stages"]["train"]["step"]) == ("complete", 7)
    assert "target_step" not in state


def test_a_running_record_written_before_target_step_was_kept_still_reads(tmp_path, monkeypatch):
    """run.json of a stage killed before the runner kept any `target_step`: read as before (the config's count);
    one from A6's runner (the stage record's `target_step`, no run-level one) is continued to it."""
    run = _killed(tmp_path, monkeypatch, target=6, at=4)
    doc = json.loads((run / "run.json").read_text())
    doc.pop("target_step")
    (run / "run.json").write_text(json.dumps(doc))
    run_recipe(RECIPE, Cfg(), run, _opts(resume=True))
    assert read_state(run)["stages"]["train"]["step"] == 4  # the checkpoint's step, as the record asked for nothing
    a6 = _killed(tmp_path / "a6", monkeypatch, target=6, at=4)
    doc = json.loads((a6 / "run.json").read_text())
    doc["stages"]["train"]["target_step"] = doc.pop("target_step")["step"]
    (a6 / "run.json").write_text(json.dumps(doc))
    run_recipe(RECIPE, Cfg(), a6, _opts(resume=True))
    assert read_state(a6)["stages"]["train"]["step"] == 6
    doc = json.loads((run / "run.json").read_text())
    doc["stages"]["train"]["target_step"] = "6"
    (run / "run.json").write_text(json.dumps(doc))
    with pytest.raises(RunStateError, match=r"stages\.train\.target_step is a string, expected a step number >= 1"):
        read_state(run)
    for bad in (6, {"step": 0, "stages": ["train"]}, {"step": 6, "stages": "train"}, {"step": 6}):
        doc["stages"]["train"].pop("target_step", None)
        doc["target_step"] = bad
        (run / "run.json").write_text(json.dumps(doc))
        with pytest.raises(RunStateError, match=r"run\.json: target_step is .*, expected \{\"step\": a step number"):
            read_state(run)


# -- R2: the later training stages of a plain --resume ----------------------------------------------------------------


@dataclass(kw_only=True)
class Cfg2:
    train: Train = field(default_factory=Train)
    train2: Train = field(default_factory=Train)


def train2(ctx: StageContext) -> StageOutput:
    """Trains on from train's weights, one checkpoint per step (its bytes depend on both stages' step counts)."""
    step, w = 0, json.loads((ctx.run_dir / "train" / "weights.json").read_text())["w"]
    if ctx.resume:
        done = sorted(int(p.stem.split("_")[1]) for p in ctx.out_dir.glob("ckpt_*.json"))
        if done:
            step, w = done[-1], json.loads((ctx.out_dir / f"ckpt_{done[-1]}.json").read_text())["w"]
    while step < (ctx.target_step or ctx.config.train2.steps):
        w, step = w * 0.9 + 0.1 * step, step + 1
        atomic_write_text(ctx.out_dir / f"ckpt_{step}.json", json.dumps({"w": w}))
    weights = ctx.out_dir / "weights.json"
    atomic_write_text(weights, json.dumps({"w": w, "step": step}))
    return StageOutput(files=[weights], summary={"w": w}, step=step)


TWO = Recipe(
    name="audit54two",
    stages=(
        RECIPE.stages[0],
        StageSpec(
            name="train2",
            fn=f"{__name__}:train2",
            needs=("train",),
            config=("train2",),
            training="train2.steps",
            outputs=("weights.json",),
            inputs=False,
        ),
    ),
)


def _same_as_uninterrupted(root: Path, run: Path, **kw) -> None:
    whole = root / "whole"
    run_recipe(TWO, Cfg2(), whole, _opts(target_step=6, **kw))
    assert "target_step" not in read_state(whole)  # an invocation that completed leaves none
    for rel in ("train/weights.json", "train2/weights.json"):
        assert (run / rel).read_bytes() == (whole / rel).read_bytes(), rel
    steps = {n: r["step"] for n, r in read_state(run)["stages"].items()}
    assert steps == {n: r["step"] for n, r in read_state(whole)["stages"].items()}
    return steps


def test_a_plain_resume_trains_every_stage_the_killed_target_step_selected_to_it(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    (tmp_path / "die_at").write_text("4")
    monkeypatch.setattr(runner, "_record_stop", lambda *a, **k: None)  # kill -9 inside train
    with pytest.raises(RuntimeError, match="stopped after step 4"):
        run_recipe(TWO, Cfg2(), run, _opts(target_step=6))
    monkeypatch.undo()
    assert read_state(run)["target_step"] == {"step": 6, "stages": ["train", "train2"]}
    capsys.readouterr()
    report = run_recipe(TWO, Cfg2(), run, _opts(resume=True))
    assert {s.name: s.action for s in report.stages} == {"train": "continued", "train2": "ran"}
    err = capsys.readouterr().err
    assert err.count("as the killed run asked") == 1 and KILLED.format("train, train2", 6) in err  # once, both named
    assert _same_as_uninterrupted(tmp_path, run) == {"train": 6, "train2": 6}
    assert "target_step" not in read_state(run)
    run_recipe(TWO, Cfg2(), run, _opts(resume=True))  # completed: nothing resurrected, both skipped
    assert {n: r["step"] for n, r in read_state(run)["stages"].items()} == {"train": 6, "train2": 6}


def test_the_line_names_a_stage_at_or_above_the_target_that_is_redone_after_one_that_trains(
    tmp_path, monkeypatch, capsys
):
    """audit54 review3 RW1: train2 at 10 steps (its count), --target-step 6 killed in train; the plain --resume
    redoes train2 afresh to 6 (its upstream changed), as the uninterrupted invocation would, and the line names it."""
    run = tmp_path / "run"
    cfg = Cfg2(train2=Train(steps=10))
    run_recipe(TWO, cfg, run, _opts())
    (tmp_path / "die_at").write_text("4")
    monkeypatch.setattr(runner, "_record_stop", lambda *a, **k: None)  # kill -9 inside train
    with pytest.raises(RuntimeError, match="stopped after step 4"):
        run_recipe(TWO, cfg, run, _opts(target_step=6, resume=True))
    monkeypatch.undo()
    capsys.readouterr()
    report = run_recipe(TWO, cfg, run, _opts(resume=True))
    assert {s.name: s.action for s in report.stages} == {"train": "continued", "train2": "ran"}
    assert KILLED.format("train, train2", 6) in capsys.readouterr().err
    assert {n: r["step"] for n, r in read_state(run)["stages"].items()} == {"train": 6, "train2": 6}


def test_a_kill_between_the_stages_resumes_the_second_to_the_target(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    real = runner.decide

    def killed_before_train2(spec, *a, **k):
        if spec.name == "train2":
            raise RuntimeError("killed before train2 started")
        return real(spec, *a, **k)

    monkeypatch.setattr(runner, "decide", killed_before_train2)
    with pytest.raises(RuntimeError, match="killed before train2"):
        run_recipe(TWO, Cfg2(), run, _opts(target_step=6))
    monkeypatch.undo()
    state = read_state(run)
    assert "train2" not in state["stages"] and state["stages"]["train"]["step"] == 6
    capsys.readouterr()
    run_recipe(TWO, Cfg2(), run, _opts(resume=True))
    assert KILLED.format("train2", 6) in capsys.readouterr().err  # train, at 6 already, is skipped (RV2 b)
    assert _same_as_uninterrupted(tmp_path, run) == {"train": 6, "train2": 6}


def test_only_the_stages_the_killed_invocation_selected_inherit_its_target(tmp_path, monkeypatch):
    """`--stages train --target-step 6` killed, then a plain --resume of every stage: train to 6, train2 (which the
    killed invocation did not select) to its config count, as the uninterrupted invocation then a --resume do."""
    run = tmp_path / "run"
    (tmp_path / "die_at").write_text("4")
    monkeypatch.setattr(runner, "_record_stop", lambda *a, **k: None)
    with pytest.raises(RuntimeError):
        run_recipe(TWO, Cfg2(), run, _opts(target_step=6, stages=["train"]))
    monkeypatch.undo()
    assert read_state(run)["target_step"] == {"step": 6, "stages": ["train"]}
    run_recipe(TWO, Cfg2(), run, _opts(resume=True))
    whole = tmp_path / "whole"
    run_recipe(TWO, Cfg2(), whole, _opts(target_step=6, stages=["train"]))
    run_recipe(TWO, Cfg2(), whole, _opts(resume=True))
    for rel in ("train/weights.json", "train2/weights.json"):
        assert (run / rel).read_bytes() == (whole / rel).read_bytes(), rel
    assert {n: r["step"] for n, r in read_state(run)["stages"].items()} == {"train": 6, "train2": 3}
    assert "target_step" not in read_state(run)


# -- review RV2, RV3: complete stages below an inherited target; the line names what this invocation trains -----------


def test_a_failed_continuation_of_a_complete_stage_is_continued_to_its_target(tmp_path, capsys):
    """`--resume --target-step 6` on a run complete at 3 fails at step 4 before its outputs change (the record stays
    `complete`): a plain --resume trains it on to 6, bytes as the uninterrupted invocation's, then clears the field."""
    run = tmp_path / "run"
    run_recipe(RECIPE, Cfg(), run, _opts())
    (tmp_path / "die_at").write_text("4")
    with pytest.raises(RuntimeError, match="stopped after step 4"):
        run_recipe(RECIPE, Cfg(), run, _opts(target_step=6, resume=True))
    state = read_state(run)
    assert (state["stages"]["train"]["status"], state["stages"]["train"]["step"]) == ("complete", 3)
    assert state["target_step"] == {"step": 6, "stages": ["train", "evalx"]}
    capsys.readouterr()
    report = run_recipe(RECIPE, Cfg(), run, _opts(resume=True))
    assert {s.name: s.action for s in report.stages} == {"train": "continued", "evalx": "ran"}
    assert capsys.readouterr().err == KILLED.format("train", 6).replace("killed", "stopped")
    state = read_state(run)
    assert state["stages"]["train"]["step"] == 6 and "target_step" not in state
    whole = _uninterrupted(tmp_path, 6)
    for rel in ("train/weights.json", "evalx/eval.json"):
        assert (run / rel).read_bytes() == (whole / rel).read_bytes(), rel
    assert verify_lineage(run).exit_code == 0


def _independent() -> Recipe:
    other = StageSpec(
        name="other",
        fn=f"{__name__}:train",
        config=("train2",),
        training="train2.steps",
        outputs=("weights.json",),
        inputs=False,
    )
    return Recipe(name="indep", stages=(RECIPE.stages[0], other))


def test_a_complete_stage_not_downstream_of_the_killed_one_is_trained_to_the_target(tmp_path, monkeypatch, capsys):
    """Two independent training stages complete at 3; `--resume --target-step 6` killed in the first: the plain
    --resume trains both to 6 (the second was skipped at 3 and the target dropped), as the uninterrupted one does."""
    recipe, run, whole = _independent(), tmp_path / "run", tmp_path / "whole"
    run_recipe(recipe, Cfg2(), run, _opts())
    (tmp_path / "die_at").write_text("4")
    monkeypatch.setattr(runner, "_record_stop", lambda *a, **k: None)
    with pytest.raises(RuntimeError, match="stopped after step 4"):
        run_recipe(recipe, Cfg2(), run, _opts(target_step=6, resume=True))
    monkeypatch.undo()
    capsys.readouterr()
    report = run_recipe(recipe, Cfg2(), run, _opts(resume=True))
    assert {s.name: s.action for s in report.stages} == {"train": "continued", "other": "continued"}
    assert capsys.readouterr().err == KILLED.format("train, other", 6)
    run_recipe(recipe, Cfg2(), whole, _opts())
    run_recipe(recipe, Cfg2(), whole, _opts(target_step=6, resume=True))
    for rel in ("train/weights.json", "other/weights.json"):
        assert (run / rel).read_bytes() == (whole / rel).read_bytes(), rel
    assert {n: r["step"] for n, r in read_state(run)["stages"].items()} == {"train": 6, "other": 6}
    assert "target_step" not in read_state(run)


def test_the_inherited_target_line_names_only_the_stages_this_resume_trains(tmp_path, monkeypatch, capsys):
    """`--target-step 6` killed in train, then `--resume --stages train`: the line names train alone (train2 is not
    selected now and keeps the target in run.json for a later --resume)."""
    run = tmp_path / "run"
    (tmp_path / "die_at").write_text("4")
    monkeypatch.setattr(runner, "_record_stop", lambda *a, **k: None)
    with pytest.raises(RuntimeError):
        run_recipe(TWO, Cfg2(), run, _opts(target_step=6))
    monkeypatch.undo()
    capsys.readouterr()
    run_recipe(TWO, Cfg2(), run, _opts(resume=True, stages=["train"]))
    assert capsys.readouterr().err == KILLED.format("train", 6)
    assert read_state(run)["target_step"] == {"step": 6, "stages": ["train2"]}
    run_recipe(TWO, Cfg2(), run, _opts(resume=True))
    assert capsys.readouterr().err == KILLED.format("train2", 6)
    assert _same_as_uninterrupted(tmp_path, run) == {"train": 6, "train2": 6}
    assert "target_step" not in read_state(run)
