"""Mechanism metrics read off a trajectory's positions: detours, stalls, drops, time to first success.

A policy's episodes carry no annotation, so harmful behaviour is detected from what the gripper and
the cube did. The detector is checked against the generator's own `sim.event` labels in the tests.

- progress measure d_t: PickAndPlace, gripper-to-cube distance while the cube is not in hand, else
  cube-to-goal distance (steps where the grasp starts or ends are not counted); Push, gripper-to-cube
  (3-D) plus cube-to-goal distance.
- detour: a run of >= DETOUR_MIN_STEPS steps each increasing d by more than AWAY_M.
- stall: a run of >= STALL_MIN_STEPS steps with the gripper moving less than STILL_M, before success.
- drop (PickAndPlace): the cube was lifted in hand, then lies on the table away from the goal.
"""

from __future__ import annotations

import numpy as np

AWAY_M = 0.015
"""Increase of the progress measure per step that counts as moving away (max speed is 5 cm/step)."""
DETOUR_MIN_STEPS = 3
STILL_M = 0.003
STALL_MIN_STEPS = 3
SUCCESS_M = 0.05


def _runs(mask: np.ndarray, min_len: int) -> int:
    """Number of maximal runs of True at least `min_len` long."""
    count, run = 0, 0
    for v in np.asarray(mask, dtype=bool).tolist() + [False]:
        if v:
            run += 1
        else:
            count += run >= min_len
            run = 0
    return int(count)


def in_hand(grip: np.ndarray, cube: np.ndarray, fingers: np.ndarray) -> np.ndarray:
    rel = cube - grip
    return (np.linalg.norm(rel[:, :2], axis=1) < 0.02) & (np.abs(rel[:, 2]) < 0.02) & (fingers < 0.07)


def episode_metrics(
    grip: np.ndarray, cube: np.ndarray, fingers: np.ndarray, goal: np.ndarray, *, lifts: bool, table_z: float
) -> dict[str, float | int | None]:
    """Metrics of one episode from per-step positions (T+1 rows: the reset state, then after each step)."""
    to_goal = np.linalg.norm(cube - goal, axis=1)
    success = to_goal < SUCCESS_M
    if lifts:
        held = in_hand(grip, cube, fingers)
        d = np.where(held, to_goal, np.linalg.norm(grip - cube, axis=1) + 1.0)
        switch = held[1:] != held[:-1]
    else:
        d = np.linalg.norm(grip - cube, axis=1) + to_goal
        switch = np.zeros(len(d) - 1, dtype=bool)
    away = (np.diff(d) > AWAY_M) & ~switch
    moved = np.linalg.norm(np.diff(grip, axis=0), axis=1)
    first = int(np.argmax(success[1:])) + 1 if success[1:].any() else None
    before = np.arange(1, len(d)) <= (first if first is not None else len(d))
    drops = 0
    if lifts:
        lifted = held & (cube[:, 2] > table_z + 0.02)
        on_table = (cube[:, 2] < table_z + 0.005) & ~success & ~held
        was_lifted = False
        for t in range(len(d)):
            if lifted[t]:
                was_lifted = True
            elif was_lifted and on_table[t]:
                drops += 1
                was_lifted = False
    return {
        "success_once": bool(success[1:].any()),
        "success_at_end": bool(success[-1]),
        "first_success_step": first,
        "detours": _runs(away, DETOUR_MIN_STEPS),
        "stalls": _runs((moved < STILL_M) & before & ~success[1:], STALL_MIN_STEPS),
        "drops": drops,
    }
