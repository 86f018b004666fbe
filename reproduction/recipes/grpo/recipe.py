"""The GRPO recipe as data: sft -> rl -> eval -> compare, walked by reproduction/run/runner.py.

`recipe: grpo` in a run config names this value (reproduction/recipes/grpo/__init__.py re-exports it); its
config schema is `GrpoRunConfig` (config.py), named in `extra["config_schema"]` for the loader.
"""

from __future__ import annotations

from reproduction.run.recipe import Recipe, StageSpec

_STAGES = "reproduction.recipes.grpo.stages"
_SFT_FREE = tuple(
    f"sft.train.{k}"
    for k in (
        "micro_batch",
        "world_size",
        "launcher",
        "device",
        "eval_interval",
        "save_interval",
        "keep_last",
        "log_interval",
        "cpus_per_worker",
        "cpu_threads",
        "start_timeout_s",
        "collective_timeout_s",
    )
)
"""SFT trainer knobs that do not change what it computes (the trainer's resume rule)."""
_RL_FREE = tuple(
    f"rl.{k}"
    for k in (
        "eval_every",
        "eval_episodes",
        "save_every",
        "launcher",
        "device",
        "cpu_threads",
        "micro_init_states",
        "rollout_workers",
    )
)

GRPO = Recipe(
    name="grpo",
    open_inputs=f"{_STAGES}:open_inputs",
    preflight="reproduction.recipes.grpo.preflight:preflight",
    stages=(
        StageSpec(
            name="sft",
            fn=f"{_STAGES}:sft_stage",
            config=("sft",),
            key_exempt=_SFT_FREE,
            outputs=("policy_setup.json", "export/**/*"),
            training="sft.train.max_steps",
            weights=("sft.model",),
            files=(),
            code=(
                "reproduction.recap.policy.task",
                "reproduction.recap.policy.model",
                "reproduction.recap.policy.data",
            ),
        ),
        StageSpec(
            name="rl",
            fn=f"{_STAGES}:rl_stage",
            needs=("sft",),
            config=("rl", "eval.seed"),
            key_exempt=_RL_FREE,
            outputs=("grpo_setup.json", "export/**/*", "evidence/eval_rl_*.json"),
            training="rl.steps",
            code=(
                "reproduction.recipes.grpo.task",
                "reproduction.recipes.grpo.train",
                "reproduction.recipes.grpo.rollout",
                "reproduction.recipes.grpo.sde",
                "reproduction.recipes.grpo.objective",
            ),
        ),
        StageSpec(
            name="eval",
            fn=f"{_STAGES}:eval_stage",
            needs=("sft", "rl"),
            config=("eval",),
            key_exempt=("eval.workers", "eval.reference"),
            inputs=False,
            outputs=("**/*.json",),
            code=("reproduction.sim.evaluate", "reproduction.recap.policy.export", "reproduction.recipes.grpo.stages"),
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
            redo_on_change=True,
        ),
    ),
    extra={"config_schema": "reproduction.recipes.grpo.config:GrpoRunConfig"},
)
