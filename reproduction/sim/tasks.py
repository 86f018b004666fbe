"""The simulator's tasks: gymnasium-robotics env ids, their language strings and short names, and physics variants.

A task name is a gymnasium-robotics id (`FetchPush-v4`), or that id, a colon and a physics variant
(`FetchPush-v4:slippery`): the same task (observation, action space, language, expert) in a simulator whose MuJoCo
model is changed once after the env is made (VARIANTS: object mass, object and table friction). A variant stands
in for "another world" (a real robot) in co-training experiments (docs/grpo.md). Its name is the task's name
everywhere a task name goes (generation, evaluation, rl.tasks / eval.tasks, evidence), and its episode i starts
from its base task's episode i (the same reset seed: seeds.py keys on the base id), so the two are paired by
reset seed and only the physics differs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from reproduction.errors import ConfigError, SimError
from reproduction.sim.libero.tasks import SUITES

VARIANT_SEP = ":"
"""Separates a task's gymnasium id from its physics variant (`FetchPush-v4:heavy`); no Fetch id holds one."""


@dataclass(frozen=True, slots=True)
class Physics:
    """A physics variant: factors on the MuJoCo model's values, applied once to a fresh model (deterministic)."""

    name: str
    """The suffix after VARIANT_SEP."""
    about: str
    """One line: what changed, for listings and docs."""
    object_mass: float = 1.0
    """Factor on the cube's mass and inertia (object0; 2 kg in gymnasium-robotics' model)."""
    object_friction: float = 1.0
    """Factor on the cube geom's sliding friction (1.0 in the model)."""
    table_friction: float = 1.0
    """Factor on the table geom's sliding friction (1.0). MuJoCo takes the larger of two geoms' friction for a
    contact, so lowering the cube-table friction takes both factors."""

    def apply(self, model: Any) -> None:
        """Scale `model`'s values in place (call once, on a model no env step has used yet)."""
        import mujoco

        body = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, "object0")
        table = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, "table0")
        model.body_mass[body] *= self.object_mass
        model.body_inertia[body] *= self.object_mass
        for geom in range(model.ngeom):
            owner = int(model.geom_bodyid[geom])
            factor = self.object_friction if owner == body else self.table_friction if owner == table else 1.0
            model.geom_friction[geom, 0] *= factor


VARIANTS: dict[str, Physics] = {
    v.name: v
    for v in (
        # The co-training demonstration's "real" world (bench/grpo_cotrain.py): the push expert still solves it
        # (40/40), a BC policy cloned from normal-friction demos overshoots more (docs/grpo.md has the numbers).
        Physics(
            name="slippery",
            about="cube and table sliding friction halved (1.0 -> 0.5)",
            object_friction=0.5,
            table_friction=0.5,
        ),
        Physics(name="heavy", about="the cube 5x heavier (2 -> 10 kg)", object_mass=5.0),
        Physics(name="rough", about="the cube's sliding friction 3x (1.0 -> 3.0)", object_friction=3.0),
    )
}
"""Every physics variant, by the name a task name gives after VARIANT_SEP."""


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """One Fetch task as datasets and policies see it."""

    env_id: str
    """The task's name in configs, datasets' per-task counts and evidence: the gymnasium-robotics id (e.g.
    "FetchPickAndPlace-v4"), or a variant's `<id>:<variant>`."""
    language: str
    """The task string written to the dataset (`task` / task_index) and given to the policy (a variant's is its
    base task's: the policy is not told which physics it acts in)."""
    short: str
    """A file-name-safe short name (videos, logs)."""
    lifts: bool
    """True when the gripper grasps and carries the object (PickAndPlace); False for pushing."""
    physics: Physics | None = None
    """The variant's physics (None: the model as gymnasium-robotics ships it)."""

    @property
    def gym_id(self) -> str:
        """The gymnasium-robotics id the env is made from (the name without its variant)."""
        return self.env_id.partition(VARIANT_SEP)[0]


TASKS: dict[str, TaskSpec] = {
    spec.env_id: spec
    for spec in (
        TaskSpec(
            env_id="FetchPickAndPlace-v4",
            language="pick up the cube and place it at the target",
            short="pick_place",
            lifts=True,
        ),
        TaskSpec(env_id="FetchPush-v4", language="push the cube to the target", short="push", lifts=False),
    )
}
"""Every base task the simulator knows, by env id (each also runs in every variant of VARIANTS)."""

TASK_IDS: dict[str, int] = {name: i for i, name in enumerate(TASKS)}
"""A stable small integer per base task (seed derivation; a variant uses its base task's)."""


def get_task(name: str) -> TaskSpec:
    """The TaskSpec of `name`: an env id, its short name or its language string, optionally followed by
    `:<variant>`. SimError for an unknown task; ConfigError naming the task for an unknown variant."""
    base, sep, variant = name.partition(VARIANT_SEP)
    for spec in TASKS.values():
        if base in (spec.env_id, spec.short, spec.language):
            break
    else:
        raise SimError(
            f"unknown simulator task {name!r}; known: {', '.join(TASKS)}, or a LIBERO task <suite>/<index> "
            f"(suites: {', '.join(SUITES)})",
            field="task",
            actual=name,
            hint=_unknown_task_hint(name),
        )
    if not sep:
        return spec
    physics = VARIANTS.get(variant)
    if physics is None:
        raise ConfigError(
            f"task {name!r}: unknown physics variant {variant!r}; known: {', '.join(VARIANTS)}",
            field="task",
            actual=name,
            hint=f"use {spec.env_id}:<variant> with one of {', '.join(VARIANTS)}",
        )
    return replace(
        spec, env_id=f"{spec.env_id}{VARIANT_SEP}{variant}", short=f"{spec.short}_{variant}", physics=physics
    )


def _unknown_task_hint(name: str) -> str:
    # a typo of a LIBERO id (libero10/0) lands here, since only a known suite routes an id to LIBERO: point at
    # the LIBERO form and its generator rather than only at the Fetch ids (audit51 H7)
    if "/" in name or name.lower().startswith("libero"):
        return (
            f"a LIBERO task id is <suite>/<index> with a suite of {', '.join(SUITES)} (e.g. libero_10/0); "
            "LIBERO data: python -m reproduction.sim.libero.generate --out DIR --task libero_10/0 (docs/libero.md)"
        )
    return f"use one of {', '.join(TASKS)}, optionally with a physics variant (FetchPush-v4:slippery)"


def task_id(name: str) -> int:
    """The seed-derivation integer of task `name` (a variant's is its base task's: the same reset states)."""
    return TASK_IDS[get_task(name).gym_id]
