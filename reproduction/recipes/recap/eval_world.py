"""RECAP's preflight of the evaluation world: the policy datasets' state and action against what eval.tasks' world
observes and takes, from meta/info.json alone, before any stage trains (audit62 H1, M1).

A policy trained on a 5-value state (or a 6-dim action) was found to misfit Fetch only at the eval stage, after
value and policy had trained: exit 1 "internal error" for the state, a LIBERO hint for the action. The widths are
the ones the policy stage trains on (policy.model.state_keys, or observation.state ++ observation.goal where the
dataset has it; state_dims) and the ones the world gives (sim/spaces.py: the export's rule in that world).
"""

from __future__ import annotations

from typing import Any

ONLY_TRAIN = "--stages returns,value,advantages,policy"
"""The stages of a run that trains the policy without evaluating it (eval and compare left out)."""


def eval_world_problems(config: Any, read: list[tuple[str, Any, Any]], stages: list[str] | None) -> list[Any]:
    """One ConfigError (exit 4, field eval.tasks) for the first `policy: true` dataset whose state or action the
    world of eval.tasks cannot give the policy (`read`: (datasets[i].path, entry, opened dataset)); none when the
    eval stage is not selected. Datasets of different widths are feature_problems' to name; one is enough here."""
    from reproduction.recipes.recap.config import is_libero_task
    from reproduction.sim.spaces import dataset_shape, fetch_world, libero_world, world_problem

    if "eval" not in (stages or []):
        return []
    tasks = list(config.eval.tasks)
    libero = any(is_libero_task(t) for t in tasks)
    world = libero_world(cameras=bool(config.eval.libero.cameras)) if libero else fetch_world()
    other = fetch_world() if libero else libero_world(cameras=False)
    model = config.policy.model
    for where, entry, ds in read:
        if not entry.policy:
            continue
        shape = dataset_shape(ds.info.features, state_keys=model.state_keys, state_dims=model.state_dims)
        problem = world_problem(shape, world, other, where=f"{where} ({ds.name})", key="eval.tasks", tasks=tasks)
        if problem is not None:
            problem.hint += f" train the policy without eval and compare: portable run ... {ONLY_TRAIN} " + (
                "(nothing was started or written)"
            )
            return [problem]
    return []
