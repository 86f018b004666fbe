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


def dataset_shape(config: Any, ds: Any) -> Any:
    """The PolicyShape (sim/spaces.py) the policy stage would train on from dataset `ds`, read off its
    meta/info.json features; None when a feature it reads is missing or of an unreadable shape (other checks name
    those)."""
    from reproduction.recipes.recap.recipe import _width
    from reproduction.sim.spaces import GOAL_KEY, STATE_KEY, PolicyShape

    model, feats = config.policy.model, ds.info.features
    keys = list(model.state_keys) or [STATE_KEY] + ([GOAL_KEY] if GOAL_KEY in feats else [])
    if any(k not in feats for k in [*keys, "action"]):
        return None
    widths = {k: _width(feats[k].get("shape") or [1]) for k in keys}
    action = _width(feats["action"].get("shape") or [1])
    if None in widths.values() or action is None:
        return None
    dims = tuple(model.state_dims) if model.state_dims is not None else None
    return PolicyShape(
        state_width=len(dims) if dims is not None else sum(w or 0 for w in widths.values()),
        action_dim=action,
        state_keys=tuple(model.state_keys),
        state_dims=dims,
        built_from={k: w or 0 for k, w in widths.items()},
    )


def eval_world_problems(config: Any, read: list[tuple[str, Any, Any]], stages: list[str] | None) -> list[Any]:
    """One ConfigError (exit 4, field eval.tasks) for the first `policy: true` dataset whose state or action the
    world of eval.tasks cannot give the policy (`read`: (datasets[i].path, entry, opened dataset)); none when the
    eval stage is not selected. Datasets of different widths are feature_problems' to name; one is enough here."""
    from reproduction.errors import ConfigError
    from reproduction.recipes.recap.config import is_libero_task
    from reproduction.sim.spaces import fetch_world, libero_world, misfits

    if "eval" not in (stages or []):
        return []
    tasks = list(config.eval.tasks)
    libero = any(is_libero_task(t) for t in tasks)
    world = libero_world(cameras=bool(config.eval.libero.cameras)) if libero else fetch_world()
    other = fetch_world() if libero else libero_world(cameras=False)
    for where, entry, ds in read:
        shape = dataset_shape(config, ds) if entry.policy else None
        wrong = misfits(world, shape) if shape is not None else []
        if not wrong:
            continue
        if not misfits(other, shape):
            instead = "eval.tasks=[FetchPickAndPlace-v4]" if libero else "eval.tasks=[libero_10/0]; docs/libero.md"
            way = f"evaluate it in {other.name}, whose widths the data have ({instead}), or"
        else:
            way = "evaluate in a world whose state and action the data match, or"
        return [
            ConfigError(
                f"eval.tasks: {where} ({ds.name}) would train the policy on {'; and on '.join(wrong)}, so the "
                f"{world.name} tasks of eval.tasks ({', '.join(tasks)}) could not run it",
                field="eval.tasks",
                hint=f"{way} train the policy without eval and compare: portable run ... {ONLY_TRAIN} "
                "(nothing was started or written)",
            )
        ]
    return []
