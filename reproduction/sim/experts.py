"""Scripted experts for both Fetch tasks: closed-loop controllers over the true state.

Both are state machines re-evaluated every step from (gripper, cube, fingers, goal), so any
perturbation (a detour, a dropped cube, a pause) is recovered from by the same code that solves the
task. `target` replaces the goal the cube is brought to (a behaviour that carries to the wrong place
or only part of the way passes its own). Actions are (dx, dy, dz, gripper) in [-1, 1]; gripper +1 opens.

    PickAndPlace: above the cube (open) -> descend -> close -> carry the cube to the target -> hold
    Push:         behind the cube on the goal line (travel high when beside it) -> descend -> push -> hold
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GAIN = 20.0
"""Action per metre of error: the mocap moves 0.05 * action per step, so 10 halves the gap each step."""
HOVER = 0.05
"""Height above the cube at which the gripper lines up before descending."""
CLOSED_ON_CUBE = 0.07
"""Finger opening (sum of both) below which closed fingers around the cube count as a grasp."""
PUSH_BEHIND = 0.05
"""Distance of the gripper centre behind the cube centre where a push starts."""
PUSH_DONE = 0.025
"""Cube-to-target distance at which the pusher stops (success is 5 cm)."""
PUSH_TRAVEL = 0.06
"""Height above the table at which the pusher travels when it is not behind the cube."""


@dataclass(frozen=True, slots=True)
class Scene:
    """What a controller reads: positions in metres."""

    grip: np.ndarray
    cube: np.ndarray
    fingers: float
    """Sum of both finger joint positions (0 closed, about 0.1 fully open)."""
    goal: np.ndarray
    table_z: float
    """The cube's resting height."""

    @property
    def cube_in_hand(self) -> bool:
        rel = self.cube - self.grip
        return bool(np.linalg.norm(rel[:2]) < 0.02 and abs(rel[2]) < 0.02 and self.fingers < CLOSED_ON_CUBE)


def _move(delta: np.ndarray, gain: float = GAIN) -> np.ndarray:
    return np.clip(np.asarray(delta) * gain, -1.0, 1.0)


def pick_place_action(scene: Scene, target: np.ndarray | None = None) -> tuple[np.ndarray, str]:
    """(action, phase) of the PickAndPlace expert; phase in approach/descend/grasp/carry."""
    target = scene.goal if target is None else np.asarray(target)
    rel = scene.cube - scene.grip
    near = np.linalg.norm(rel[:2]) < 0.012 and abs(rel[2]) < 0.012
    if scene.cube_in_hand:
        return np.append(_move(target - scene.cube), -1.0), "carry"
    if near:
        return np.array([0.0, 0.0, 0.0, -1.0]), "grasp"
    if np.linalg.norm(rel[:2]) > 0.012:
        above = scene.cube + np.array([0.0, 0.0, HOVER])
        delta = above - scene.grip
        if np.linalg.norm(rel[:2]) > 0.03 and scene.grip[2] < scene.cube[2] + 0.02:
            delta[:2] *= 0.3  # low beside the cube: rise before sweeping sideways into it
        return np.append(_move(delta), 1.0), "approach"
    return np.append(_move(rel), 1.0), "descend"


def push_action(scene: Scene, target: np.ndarray | None = None) -> tuple[np.ndarray, str]:
    """(action, phase) of the Push expert; phase in approach/descend/push/hold. The gripper stays shut."""
    target = scene.goal if target is None else np.asarray(target)
    to_goal = target[:2] - scene.cube[:2]
    dist = float(np.linalg.norm(to_goal))
    if dist < PUSH_DONE:
        return np.array([0.0, 0.0, 0.0, -1.0]), "hold"
    u = to_goal / dist
    behind = scene.cube[:2] - u * PUSH_BEHIND
    rel = scene.grip[:2] - scene.cube[:2]
    along = float(rel @ u)
    off_line = rel - along * u
    push_z = scene.table_z - 0.005
    low = scene.grip[2] < push_z + 0.012
    is_behind = along < -0.03 and float(np.linalg.norm(off_line)) < 0.03
    if is_behind and low and float(np.linalg.norm(off_line)) < 0.015:
        # In contact behind the cube: forward along the goal line, steering back onto it; slower near the goal.
        speed = min(1.0, 0.3 + 6.0 * dist)
        xy = u * speed - off_line * GAIN * 1.5
        return np.array([*np.clip(xy, -1, 1), _move([push_z - scene.grip[2]])[0], -1.0]), "push"
    if np.linalg.norm(scene.grip[:2] - behind) < 0.012 or (is_behind and low):
        return np.append(_move(np.array([*(behind - scene.grip[:2]), push_z - scene.grip[2]])), -1.0), "descend"
    # Travel to the point behind the cube at travel height (rise first: a sweep at cube height would knock it).
    delta = np.array([*(behind - scene.grip[:2]), scene.table_z + PUSH_TRAVEL - scene.grip[2]])
    if scene.grip[2] < scene.table_z + PUSH_TRAVEL - 0.02:
        delta[:2] *= 0.2
    return np.append(_move(delta), -1.0), "approach"


def expert_action(lifts: bool, scene: Scene, target: np.ndarray | None = None) -> tuple[np.ndarray, str]:
    """The expert of a task (`lifts` True: PickAndPlace, False: Push)."""
    return pick_place_action(scene, target) if lifts else push_action(scene, target)
