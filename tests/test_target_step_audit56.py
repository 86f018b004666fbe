"""audit56 K1: a `--target-step M` refused because only checkpoints above M are left (keep_last kept only newer ones,
exit 50) had already stored M in run.json's `target_step`, so a later plain `--resume` inherited M and was refused
the same way. A refused resume now leaves run.json's bytes as they were; after an earlier stage of the same
invocation trained, the refused stage's record and `target_step` as the invocation found them (review R2).

The stage trains the real loop (tests/train_tiny, in process, a checkpoint every 3 steps, keep_last 1)."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import train_tiny

from reproduction.errors import CheckpointError, ResumeRefusedError
from reproduction.recipe import Recipe, StageContext, StageOutput, StageSpec
from reproduction.run.record import make_recorder
from reproduction.run.runner import RunOptions, read_state, run_recipe
from reproduction.train import checkpoint
from reproduction.train.api import train


@dataclass(kw_only=True)
class Train:
    steps: int = 6


@dataclass(kw_only=True)
class Cfg:
    train: Train = field(default_factory=Train)


def tiny(ctx: StageContext) -> StageOutput:
    """Trains to --target-step (else train.steps); fails after training while <run>/../fail exists (removed then)."""
    config = train_tiny.config(
        world_size=1,
        launcher="inprocess",
        eval_interval=0,
        max_steps=ctx.target_step or ctx.config.train.steps,
        save_interval=3,
        keep_last=1,
    )
    task = functools.partial(train_tiny.make_task, dropout=0.0)
    result = train(task, config, out_dir=ctx.out_dir, resume=ctx.resume)
    fail = ctx.run_dir.parent / "fail"
    if fail.is_file():
        fail.unlink()
        raise RuntimeError(f"failed after step {result.step}")
    return StageOutput(files=sorted(p for p in (ctx.out_dir / "export").rglob("*") if p.is_file()), step=result.step)


RECIPE = Recipe(
    name="audit56",
    stages=(StageSpec(name="train", fn=f"{__name__}:tiny", config=("train",), training="train.steps", inputs=False),),
)


def _opts(**kw) -> RunOptions:
    return RunOptions(recorder=make_recorder(None), **kw)


def _failed_at_6(tmp_path: Path, **kw) -> Path:
    """A run whose train stage trained 6 steps (only step_6 kept) and then failed: `failed`, to be continued."""
    run = tmp_path / "run"
    (tmp_path / "fail").write_text("")
    with pytest.raises(RuntimeError, match="failed after step 6"):
        run_recipe(RECIPE, Cfg(), run, _opts(**kw))
    assert read_state(run)["stages"]["train"]["status"] == "failed"
    assert checkpoint.complete_steps(run / "train" / "checkpoints") == [6]
    return run


@pytest.mark.parametrize("first", [{}, {"target_step": 6}], ids=["no-target", "target-6"])
def test_a_refused_target_step_leaves_run_json_as_it_was_and_a_plain_resume_as_before(tmp_path, first):
    run = _failed_at_6(tmp_path, **first)
    before = (run / "run.json").read_bytes()
    assert json.loads(before).get("target_step") == ({"step": 6, "stages": ["train"]} if first else None)
    with pytest.raises(ResumeRefusedError) as err:
        run_recipe(RECIPE, Cfg(), run, _opts(resume=True, target_step=4))
    assert isinstance(err.value, CheckpointError) and err.value.exit_code == 50
    assert "holds only step_6, above this run's max_steps 4" in err.value.message
    assert "--target-step 6" in err.value.hint
    assert (run / "run.json").read_bytes() == before  # 4 not stored for a plain --resume to inherit
    assert checkpoint.complete_steps(run / "train" / "checkpoints") == [6]  # nothing removed either
    report = run_recipe(RECIPE, Cfg(), run, _opts(resume=True))  # as it would have before the refused call
    assert [(s.name, s.action) for s in report.stages] == [("train", "continued")]
    state = read_state(run)
    assert (state["stages"]["train"]["status"], state["stages"]["train"]["step"]) == ("complete", 6)
    assert "target_step" not in state


def test_a_failure_after_training_to_the_target_still_keeps_it_for_a_plain_resume(tmp_path):
    """Only a refusal puts run.json back: a --target-step that failed after it trained is still inherited."""
    run = _failed_at_6(tmp_path)
    (tmp_path / "fail").write_text("")
    with pytest.raises(RuntimeError, match="failed after step 9"):
        run_recipe(RECIPE, Cfg(), run, _opts(resume=True, target_step=9))
    assert read_state(run)["target_step"] == {"step": 9, "stages": ["train"]}
    run_recipe(RECIPE, Cfg(), run, _opts(resume=True))
    assert read_state(run)["stages"]["train"]["step"] == 9


# audit56 review R2, R5: a refusal in the second training stage of an invocation whose first stage trained; and the
# report.html a refused stage removed.


@dataclass(kw_only=True)
class First:
    steps: int = 2


@dataclass(kw_only=True)
class TwoCfg:
    first: First = field(default_factory=First)
    second: Train = field(default_factory=Train)


def tiny_two(ctx: StageContext) -> StageOutput:
    """`tiny` for the stage its folder names (first.steps, second.steps); only `second` fails while ../fail exists."""
    steps = getattr(ctx.config, ctx.out_dir.name).steps
    config = train_tiny.config(
        world_size=1,
        launcher="inprocess",
        eval_interval=0,
        max_steps=ctx.target_step or steps,
        save_interval=3,
        keep_last=1,
    )
    result = train(functools.partial(train_tiny.make_task, dropout=0.0), config, out_dir=ctx.out_dir, resume=ctx.resume)
    fail = ctx.run_dir.parent / "fail"
    if ctx.name == "second" and fail.is_file():
        fail.unlink()
        raise RuntimeError(f"failed after step {result.step}")
    return StageOutput(files=sorted(p for p in (ctx.out_dir / "export").rglob("*") if p.is_file()), step=result.step)


def report_two(run_dir: Path) -> Path:
    """The recipe's report: one line per stage record (status, step)."""
    stages = read_state(run_dir)["stages"]
    out = run_dir / "report.html"
    out.write_text("".join(f"<p>{n} {r['status']} {r.get('step')}</p>\n" for n, r in sorted(stages.items())))
    return out


TWO = Recipe(
    name="audit56-two",
    stages=tuple(
        StageSpec(name=n, fn=f"{__name__}:tiny_two", config=(n,), training=f"{n}.steps", inputs=False)
        for n in ("first", "second")
    ),
    report=f"{__name__}:report_two",
)


def _second_failed_at_6(tmp_path: Path) -> Path:
    """first complete at step 2; second trained 6 steps (only step_6 kept) and failed."""
    run = tmp_path / "run"
    (tmp_path / "fail").write_text("")
    with pytest.raises(RuntimeError, match="failed after step 6"):
        run_recipe(TWO, TwoCfg(), run, _opts())
    stages = read_state(run)["stages"]
    assert [(stages[n]["status"], stages[n].get("step")) for n in ("first", "second")] == [
        ("complete", 2),
        ("failed", None),
    ]
    assert checkpoint.complete_steps(run / "second" / "checkpoints") == [6]
    return run


def test_a_refusal_after_an_earlier_stage_trained_keeps_that_stage_but_not_the_target_step(tmp_path):
    """first trains 2 -> 4 in the refused invocation (kept: it is real); second's refusal must not leave
    target_step {4, [first, second]}, which a plain --resume inherited and was refused on again (review R2)."""
    run = _second_failed_at_6(tmp_path)
    second = read_state(run)["stages"]["second"]
    with pytest.raises(ResumeRefusedError) as err:
        run_recipe(TWO, TwoCfg(), run, _opts(resume=True, target_step=4))
    assert err.value.exit_code == 50 and "holds only step_6, above this run's max_steps 4" in err.value.message
    state = read_state(run)
    assert "target_step" not in state  # as the invocation found it: none
    assert (state["stages"]["first"]["status"], state["stages"]["first"]["step"]) == ("complete", 4)
    assert state["stages"]["second"] == second  # the refused stage's record as it was
    report = run_recipe(TWO, TwoCfg(), run, _opts(resume=True))  # as before the refused call: second to its 6 steps
    assert [(s.name, s.action) for s in report.stages] == [("first", "skipped"), ("second", "continued")]
    state = read_state(run)
    assert [(state["stages"][n]["status"], state["stages"][n]["step"]) for n in ("first", "second")] == [
        ("complete", 4),
        ("complete", 6),
    ]
    assert "target_step" not in state


def test_a_refused_resume_leaves_report_html(tmp_path):
    """The refused stage is the first this invocation runs, so it removed report.html (out of date once it trains);
    the refusal puts it back with run.json (review R5)."""
    run = _second_failed_at_6(tmp_path)
    report_two(run)  # written by hand, as `python -m <recipe>.report RUN` does
    html, before = (run / "report.html").read_bytes(), (run / "run.json").read_bytes()
    with pytest.raises(ResumeRefusedError):
        run_recipe(TWO, TwoCfg(), run, _opts(resume=True, target_step=4, stages=["second"]))
    assert (run / "report.html").read_bytes() == html
    assert (run / "run.json").read_bytes() == before
    run_recipe(TWO, TwoCfg(), run, _opts(resume=True))
    assert (run / "report.html").read_text() == "<p>first complete 2</p>\n<p>second complete 6</p>\n"
