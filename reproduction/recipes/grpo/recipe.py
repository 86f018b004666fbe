"""The GRPO recipe as data: sft -> rl -> eval -> compare, walked by reproduction/run/runner.py.

`recipe: grpo` in a run config names this value (reproduction/recipes/grpo/__init__.py exports it as RECIPE); its
config schema is `GrpoRunConfig` (config.py). Which config fields leave a stage's key alone is declared on the
fields (`same_outputs()`, config.py and reproduction/train/config.py), not here.
"""

from __future__ import annotations

from typing import Any

from reproduction.recap.policy import TRAINING_MODULES
from reproduction.recipe import Recipe, StageSpec

_STAGES = "reproduction.recipes.grpo.stages"


def no_ray(config: Any) -> bool:
    """StageSpec.uses_ray of a stage that never runs workers on Ray (eval: its workers are a process pool;
    compare), so a dead --ray-address does not stop it."""
    return False


def sft_uses_ray(config: Any) -> bool:
    """Whether the sft stage trains on Ray: BC with `sft.train.launcher: ray` (a pinned sft.export is only copied).
    Its StageSpec.uses_ray and what stages.py's sft_stage hands ctx.ray_for."""
    return not config.sft.export and config.sft.train.launcher == "ray"


def rl_uses_ray(config: Any) -> bool:
    """Whether the rl stage trains on Ray (its StageSpec.uses_ray and what stages.py's rl_stage hands ctx.ray_for)."""
    return config.rl.launcher == "ray"


GRPO = Recipe(
    name="grpo",
    open_inputs=f"{_STAGES}:open_inputs",
    preflight="reproduction.recipes.grpo.preflight:preflight",
    config_schema="reproduction.recipes.grpo.config:GrpoRunConfig",
    evaluate="reproduction.recipes.grpo.eval_cmd:cmd_eval",
    headline="reproduction.run.compare_cmd:run_results_lines",  # rates, intervals, verdict
    report="reproduction.recipes.grpo.report:write_run_report",  # plots/ and report.html after `portable run`
    stages=(
        StageSpec(
            name="sft",
            fn=f"{_STAGES}:sft_stage",
            config=("sft",),
            outputs=("policy_setup.json", "export/**/*"),
            training="sft.train.max_steps",
            target=False,  # --target-step N is rl's step ("resume from 60, train to 80"); --stages sft names it
            weights=("sft.model",),
            code=TRAINING_MODULES,
            uses_ray=sft_uses_ray,
        ),
        StageSpec(
            name="rl",
            fn=f"{_STAGES}:rl_stage",
            needs=("sft",),
            config=("rl", "eval.seed"),
            outputs=("grpo_setup.json", "export/**/*", "evidence/eval_rl_*.json"),
            training="rl.steps",
            code=(
                "reproduction.recipes.grpo.task",
                "reproduction.recipes.grpo.train",
                "reproduction.recipes.grpo.rollout",
                "reproduction.recipes.grpo.envs",
                "reproduction.recipes.grpo.sde",
                "reproduction.recipes.grpo.objective",
            ),
            uses_ray=rl_uses_ray,
        ),
        StageSpec(
            name="eval",
            fn=f"{_STAGES}:eval_stage",
            needs=("sft", "rl"),
            config=("eval",),  # eval.workers and eval.reference are declared same_outputs() (config.py)
            inputs=False,
            outputs=("**/*.json",),
            code=("reproduction.sim.evaluate", "reproduction.recap.policy.export", "reproduction.recipes.grpo.stages"),
            uses_ray=no_ray,
        ),
        StageSpec(
            name="compare",
            fn=f"{_STAGES}:compare_stage",
            needs=("eval",),
            config=("eval.reference",),
            files=("eval.reference",),
            inputs=False,
            outputs=("compare.json",),
            code=("reproduction.run.evidence", "reproduction.run.comparison", "reproduction.run.stats"),
            redo_on_change=True,  # a new reference recompares (a second), never re-evaluates
            uses_ray=no_ray,
        ),
    ),
)
