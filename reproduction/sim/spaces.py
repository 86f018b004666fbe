"""What each evaluation world observes and takes, without importing a simulator (no mujoco: preflights import it).

    fetch_world()                  the Fetch simulator: observation.state (STATE_NAMES) + observation.goal, 4-dim action
    libero_world(cameras=...)      LIBERO: observation.state (8), observation.object_state without cameras, 7-dim action
    dataset_shape(info features)   the PolicyShape a policy trained on a dataset has (its meta/info.json alone)
    misfits(world, PolicyShape)    what a policy's state and action need that the world does not give, one phrase each
    world_problem(...)             the preflights' ConfigError for a dataset a world cannot serve

A policy's state is built at evaluation as the export builds it (recap/policy/export.py `_state`): its state_keys
concatenated, or observation.state ++ observation.goal where the observation has a goal, then its state_dims
picked. RECAP's and GRPO's preflights read the widths from the datasets' meta/info.json (before anything trains),
the Fetch eval stage from an export's policy.json (audit62 H1, M1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

STATE_NAMES = [
    "grip_x",
    "grip_y",
    "grip_z",
    "finger_r",
    "finger_l",
    "cube_x",
    "cube_y",
    "cube_z",
    "cube_rel_x",
    "cube_rel_y",
    "cube_rel_z",
]
"""The named entries of the Fetch simulator's `observation.state` (env.py's FetchSim.state())."""
GOAL_NAMES = ["goal_x", "goal_y", "goal_z"]
"""The entries of the Fetch simulator's `observation.goal`: the target position."""
ACTION_DIM = 4
"""Fetch: (dx, dy, dz, gripper), each in [-1, 1]; dx..dz move the gripper target by up to 5 cm."""
STATE_KEY, GOAL_KEY = "observation.state", "observation.goal"


@dataclass(frozen=True, slots=True)
class World:
    """An evaluation world: the state features its observation holds ({key: width}, None where the width depends
    on the task), and the action width it takes."""

    name: str
    gives: dict[str, int | None]
    action_dim: int

    def describe(self) -> str:
        """E.g. "observation.state 11 + observation.goal 3"."""
        return " + ".join(f"{k} {'(per task)' if w is None else w}" for k, w in self.gives.items())

    def keys_for(self, state_keys: Sequence[str]) -> list[str]:
        """The features the policy's state concatenates in this world (the export's rule)."""
        return list(state_keys) or [STATE_KEY] + ([GOAL_KEY] if GOAL_KEY in self.gives else [])


def fetch_world() -> World:
    return World(name="Fetch", gives={STATE_KEY: len(STATE_NAMES), GOAL_KEY: len(GOAL_NAMES)}, action_dim=ACTION_DIM)


def libero_world(*, cameras: bool = True) -> World:
    """LIBERO's env (sim/libero/env.py): its robot state, and the privileged object state only without cameras."""
    from reproduction.sim.libero.env import ACTION_DIM as LIBERO_ACTION_DIM
    from reproduction.sim.libero.protocol import OBJECT_STATE_KEY, STATE_DIM

    gives: dict[str, int | None] = {STATE_KEY: STATE_DIM}
    if not cameras:
        gives[OBJECT_STATE_KEY] = None
    return World(name="LIBERO", gives=gives, action_dim=LIBERO_ACTION_DIM)


@dataclass(frozen=True, slots=True)
class PolicyShape:
    """What a policy was trained on: its state width (after state_dims), the features it was built from
    ({key: width}, empty when unknown, e.g. an export), its state_keys/state_dims settings, its action width
    (None: unknown)."""

    state_width: int | None
    action_dim: int | None
    state_keys: tuple[str, ...] = ()
    state_dims: tuple[int, ...] | None = None
    built_from: dict[str, int] = field(default_factory=dict)

    def describe_state(self) -> str:
        """E.g. "5 values (observation.state 5)"."""
        parts = " + ".join(f"{k} {w}" for k, w in self.built_from.items())
        picked = f", state_dims picks {len(self.state_dims)}" if self.state_dims is not None else ""
        return f"{self.state_width} values" + (f" ({parts}{picked})" if parts else "")


def dataset_shape(
    features: dict[str, Any], *, state_keys: Sequence[str] = (), state_dims: Sequence[int] | None = None
) -> PolicyShape | None:
    """The PolicyShape a policy trained on a dataset of meta/info.json `features` has (its state_keys, or
    observation.state ++ observation.goal where the dataset has a goal; state_dims picked), None when a feature it
    reads is missing or of an unreadable shape (other checks name those)."""
    from reproduction.data.info import feature_width

    keys = list(state_keys) or [STATE_KEY] + ([GOAL_KEY] if GOAL_KEY in features else [])
    if any(k not in features for k in [*keys, "action"]):
        return None
    widths = {k: feature_width(features[k].get("shape") or [1]) for k in keys}
    action = feature_width(features["action"].get("shape") or [1])
    if None in widths.values() or action is None:
        return None
    dims = tuple(state_dims) if state_dims is not None else None
    return PolicyShape(
        state_width=len(dims) if dims is not None else sum(w or 0 for w in widths.values()),
        action_dim=action,
        state_keys=tuple(state_keys),
        state_dims=dims,
        built_from={k: w or 0 for k, w in widths.items()},
    )


def misfits(world: World, policy: PolicyShape) -> list[str]:
    """One phrase per way `policy` cannot run in `world` (empty: it can, as far as widths tell): a state feature
    the world does not observe, a state width other than the world's, a state_dims index past the world's state,
    an action width other than the world's. A width the world leaves to its task (LIBERO's object state) is
    checked when the policy runs."""
    out = []
    keys = world.keys_for(policy.state_keys)
    lacking = [k for k in keys if k not in world.gives]
    widths = [world.gives.get(k) for k in keys]
    if lacking:
        out.append(
            f"state feature {', '.join(lacking)}, which {world.name} does not observe (it gives {world.describe()})"
        )
    elif policy.state_width is not None and None not in widths:
        total = sum(w or 0 for w in widths)
        given = f"{total} ({' + '.join(f'{k} {w}' for k, w in zip(keys, widths))})"
        if policy.state_dims is not None:
            if max(policy.state_dims) >= total:
                out.append(
                    f"state_dims index {max(policy.state_dims)}, past the {given} state values {world.name} gives"
                )
        elif policy.state_width != total:
            out.append(f"a state of {policy.describe_state()} where {world.name} gives {given}")
    if policy.action_dim is not None and policy.action_dim != world.action_dim:
        out.append(f"a {policy.action_dim}-dim action where {world.name} takes {world.action_dim}")
    return out


def world_problem(
    shape: PolicyShape | None,
    world: World,
    other: World,
    *,
    where: str,
    key: str,
    tasks: list[str],
    instead: str | None = None,
) -> Any:
    """The ConfigError (exit 4, field `key`) for a dataset (`where`) of PolicyShape `shape` whose state or action
    `world` (the world of `key`'s `tasks`) cannot give the policy, or None; its hint names `other` world where the
    data fit it (`instead`: how to switch to it, when setting `key` alone is not enough), and ends in "or" for the
    caller's way out. RECAP's and GRPO's preflights use it."""
    from reproduction.errors import ConfigError

    wrong = misfits(world, shape) if shape is not None else []
    if not wrong:
        return None
    if not misfits(other, shape):
        if instead is None:
            instead = (
                f"{key}=[FetchPickAndPlace-v4]" if other.name == "Fetch" else f"{key}=[libero_10/0]; docs/libero.md"
            )
        way = f"use {other.name} tasks, whose widths the data have ({instead}), or"
    else:
        way = "use tasks of a world whose state and action the data match, or"
    return ConfigError(
        f"{key}: {where} would train the policy on {'; and on '.join(wrong)}, so the {world.name} tasks of {key} "
        f"({', '.join(tasks)}) could not run it",
        field=key,
        hint=way,
    )
