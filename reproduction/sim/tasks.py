"""The simulator's tasks: gymnasium-robotics env ids, their language strings and short names."""

from __future__ import annotations

from dataclasses import dataclass

from reproduction.errors import SimError


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """One Fetch task as datasets and policies see it."""

    env_id: str
    """gymnasium-robotics id, also the task's name in configs (e.g. "FetchPickAndPlace-v4")."""
    language: str
    """The task string written to the dataset (`task` / task_index) and given to the policy."""
    short: str
    """A file-name-safe short name (videos, logs)."""
    lifts: bool
    """True when the gripper grasps and carries the object (PickAndPlace); False for pushing."""


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
"""Every task the simulator knows, by env id."""

TASK_IDS: dict[str, int] = {name: i for i, name in enumerate(TASKS)}
"""A stable small integer per task (seed derivation)."""


def get_task(name: str) -> TaskSpec:
    """The TaskSpec of `name` (an env id, its short name or its language string); SimError otherwise."""
    for spec in TASKS.values():
        if name in (spec.env_id, spec.short, spec.language):
            return spec
    raise SimError(
        f"unknown simulator task {name!r}; known: {', '.join(TASKS)}",
        field="task",
        actual=name,
        hint=f"use one of {', '.join(TASKS)}",
    )
