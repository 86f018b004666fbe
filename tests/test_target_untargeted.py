"""`StageSpec.target=False`: a training stage that only initialises a later one (GRPO's sft) is left to its step
count by a `--target-step N` that names no --stages, so "train on to step N" continues the later stage instead of
retraining the first and redoing the later one from step 0 (audit55 H3); named in --stages it is trained to N."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from reproduction.recipe import Recipe, StageContext, StageOutput, StageSpec
from reproduction.run.runner import RunOptions, read_state, run_recipe


@dataclass
class Steps:
    steps: int = 3


@dataclass
class TwoConfig:
    init: Steps = field(default_factory=Steps)
    rl: Steps = field(default_factory=lambda: Steps(steps=2))


def _trained(ctx: StageContext, section: str) -> StageOutput:
    """Trains to --target-step or its count, from the step its model file holds (a continuation keeps it)."""
    model = ctx.out_dir / "model.txt"
    start = int(model.read_text().split()[0]) if model.is_file() else 0
    step = ctx.target_step or getattr(ctx.config, section).steps
    upstream = (ctx.run_dir / "init" / "model.txt").read_text().strip() if section == "rl" else "-"
    model.write_text(f"{step} from {start} on init {upstream}\n")
    return StageOutput(files=[model], summary={}, step=step, resumed_from=start or None)


def init_stage(ctx: StageContext) -> StageOutput:
    return _trained(ctx, "init")


def rl_stage(ctx: StageContext) -> StageOutput:
    return _trained(ctx, "rl")


def _recipe(target: bool) -> Recipe:
    init = StageSpec(name="init", fn=f"{__name__}:init_stage", config=("init",), training="init.steps", target=target)
    rl = StageSpec(name="rl", fn=f"{__name__}:rl_stage", needs=("init",), config=("rl",), training="rl.steps")
    return Recipe(name="two", stages=(init, rl))


def _run(run, recipe, **kw) -> list[tuple[str, str]]:
    return [(s.name, s.action) for s in run_recipe(recipe, TwoConfig(), run, RunOptions(inputs={}, **kw)).stages]


def test_a_bare_target_step_continues_the_later_stage_and_leaves_the_untargeted_one(tmp_path):
    run = tmp_path / "run"
    recipe = _recipe(target=False)
    assert _run(run, recipe) == [("init", "ran"), ("rl", "ran")]
    assert _run(run, recipe, resume=True, target_step=8) == [("init", "skipped"), ("rl", "continued")]
    assert (run / "init" / "model.txt").read_text() == "3 from 0 on init -\n"
    assert (run / "rl" / "model.txt").read_text() == "8 from 2 on init 3 from 0 on init -\n"
    state = read_state(run)
    assert (state["stages"]["init"]["step"], state["stages"]["rl"]["step"]) == (3, 8)
    # named in --stages, it is trained to N like any other (and rl, whose upstream changed, afresh to N)
    assert _run(run, recipe, resume=True, target_step=9, stages=["init", "rl"]) == [
        ("init", "continued"),
        ("rl", "ran"),
    ]
    assert (run / "init" / "model.txt").read_text() == "9 from 3 on init -\n"


def test_without_the_declaration_every_training_stage_is_trained_to_n(tmp_path):
    """The default (target=True), as before: the first stage continued to N, the second redone afresh to N."""
    run = tmp_path / "run"
    recipe = _recipe(target=True)
    _run(run, recipe)
    assert _run(run, recipe, resume=True, target_step=8) == [("init", "continued"), ("rl", "ran")]
    assert (run / "init" / "model.txt").read_text() == "8 from 3 on init -\n"


def test_a_killed_bare_target_step_is_inherited_by_the_later_stage_only(tmp_path, monkeypatch):
    """run.json's `target_step.stages` leaves the untargeted stage out, so a plain --resume of a killed invocation
    trains rl to N and leaves init at its count."""
    run = tmp_path / "run"
    recipe = _recipe(target=False)
    _run(run, recipe)

    def killed(ctx: StageContext) -> StageOutput:
        raise KeyboardInterrupt

    monkeypatch.setattr(f"{__name__}.rl_stage", killed)
    with pytest.raises(KeyboardInterrupt):
        _run(run, recipe, resume=True, target_step=8)
    assert read_state(run)["target_step"] == {"step": 8, "stages": ["rl"]}
    monkeypatch.undo()
    assert _run(run, recipe, resume=True) == [("init", "skipped"), ("rl", "continued")]
    assert (run / "rl" / "model.txt").read_text().startswith("8 from 2")
    assert read_state(run)["stages"]["init"]["step"] == 3
