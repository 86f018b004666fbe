"""Scripted pick-and-place experts on privileged poses (LIBERO_LAB.md's, 20/20 clean on both tasks below).

They read body/site poses from the MuJoCo state, so they are bound to one `LiberoSim` (`bind(sim)`, which the
protocol calls once per env) and reset per episode; as policies they take the batch dict and return a (1, 1, 7)
chunk. OSC_POSE deltas: position gain 15 per metre clipped to +-1 (the controller moves <= 5 cm per step), an
orientation hold toward the gripper's initial top-down orientation, gripper -1 open / +1 close. Phases per
subtask: 0 above grasp, 1 descend, 2 close, 3 lift, 4 carry over the goal, 5 lower, 6 open, 7 retreat.
`noise`, `detour` and `drop_at` are the failure/detour injections LIBERO_LAB.md measured (mixed outcomes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from reproduction.errors import SimError

_NEXT_TIMEOUT = 60


def _rot_err(r_goal: np.ndarray, r_cur: np.ndarray) -> np.ndarray:
    """World-frame axis-angle from r_cur to r_goal (robosuite's OSC applies delta rotations on the left)."""
    # Not at module level: importing this module (PLANS, at config validation) must not load mujoco's OpenGL
    # backend outside _runtime's guard, where a bad MUJOCO_GL is a one-line RenderUnavailableError (audit51 H5).
    import mujoco

    q = np.zeros(4)
    mujoco.mju_mat2Quat(q, (r_goal @ r_cur.T).ravel())
    v = np.zeros(3)
    mujoco.mju_quat2Vel(v, q, 1.0)
    return v


def body_pos(env: Any, name: str) -> np.ndarray:
    return np.array(env.sim.data.body_xpos[env.env.obj_body_id[name]])


def site_pos(env: Any, name: str) -> np.ndarray:
    return np.array(env.sim.data.get_site_xpos(name))


def spatial_bowl_to_plate(env: Any) -> list[dict]:
    """libero_spatial/0: the black bowl between the plate and the ramekin onto the plate (grasp the near rim)."""
    return [
        dict(
            obj="akita_black_bowl_1",
            grasp_off=np.array([0.0, -0.045, 0.035]),
            hover=0.10,
            carry_z=body_pos(env, "plate_1")[2] + 0.135,
            place=lambda e: body_pos(e, "plate_1") + [0, 0, 0.015],
        )
    ]


def libero10_soup_and_sauce(env: Any) -> list[dict]:
    """libero_10/0: the alphabet soup, then the tomato sauce, into the basket (point-in-box goal region)."""

    def place(e: Any) -> np.ndarray:
        return site_pos(e, "basket_1_contain_region") + [0, 0, 0.02]

    return [
        dict(obj=o, grasp_off=np.array([0.0, 0.0, 0.01]), hover=0.10, carry_z=0.73, place=place)
        for o in ("alphabet_soup_1", "tomato_sauce_1")
    ]


PLANS: dict[str, Callable[[Any], list[dict]]] = {
    "libero_spatial/0": spatial_bowl_to_plate,
    "libero_10/0": libero10_soup_and_sauce,
}


class PickPlaceExpert:
    """A Policy (batch -> (1, 1, 7)) for the tasks in PLANS; `bind(sim)` before the first episode."""

    def __init__(
        self,
        gain: float = 15.0,
        noise: float = 0.0,
        detour: np.ndarray | None = None,
        drop_at: int | None = None,
        seed: int = 0,
    ) -> None:
        self.gain, self.noise, self.detour, self.drop_at, self.seed = gain, noise, detour, drop_at, seed
        self.lsim: Any = None
        self.rng = np.random.default_rng(seed)

    def bind(self, lsim: Any) -> None:
        task_id = lsim.task.task_id
        if task_id not in PLANS:
            raise SimError(f"no scripted expert for {task_id}", hint=f"experts exist for {', '.join(PLANS)}")
        self.lsim = lsim
        env = lsim.env
        self.sid = env.sim.model.site_name2id(env.env.robots[0].controller.eef_name)
        self.reset()

    def reset(self, seed: int | None = None) -> None:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.r0, self.k, self.phase, self.tp, self.grasp_eef, self.subtasks = None, 0, 0, 0, None, None
        self.harming = False
        """The last action carried an injected detour (the carry target offset sideways)."""

    def __call__(self, batch: dict) -> np.ndarray:
        return self.act()[None, None, :].astype(np.float32)

    def act(self) -> np.ndarray:
        env = self.lsim.env
        if self.subtasks is None:  # plans read poses: build them after the settle steps, at the first action
            self.subtasks = PLANS[self.lsim.task.task_id](env)
        d = env.sim.data
        eef = np.array(d.site_xpos[self.sid])
        rot = np.array(d.site_xmat[self.sid]).reshape(3, 3)
        if self.r0 is None:
            self.r0 = rot.copy()
        a = np.zeros(7)
        a[6] = -1.0
        self.harming = False
        if self.k >= len(self.subtasks):
            return a
        st = self.subtasks[self.k]
        o = body_pos(env, st["obj"])
        goal = st["place"](env)
        g = o + st["grasp_off"]
        p, grip = self.phase, 1.0
        if p == 0:
            tgt, grip = g + [0, 0, st["hover"]], -1.0
        elif p == 1:
            tgt, grip = g.copy(), -1.0
        elif p == 2:
            tgt = g.copy()
        elif p == 3:
            tgt = self.grasp_eef.copy()
            tgt[2] = max(eef[2], st["carry_z"]) if self.tp > 3 else eef[2] + 0.03
        elif p == 4:
            tgt = eef + (goal - o) * [1, 1, 0]
            tgt[2] = st["carry_z"]
            if self.detour is not None and self.tp < 30:
                tgt = tgt + self.detour
                self.harming = True  # the detour: harmful but recoverable (the generator's sim.harm)
        elif p == 5:
            tgt = eef + (goal - o)
        elif p == 6:
            tgt, grip = eef.copy(), -1.0
        else:
            tgt, grip = eef.copy(), -1.0
            tgt[2] = st["carry_z"]
        err = tgt - eef
        a[:3] = np.clip(err * self.gain, -1, 1)
        a[3:6] = np.clip(_rot_err(self.r0, rot) * 2.0, -0.5, 0.5)
        a[6] = grip
        if self.noise:
            a[:6] += self.rng.normal(0, self.noise, 6)
        self.tp += 1
        n = np.linalg.norm(err)
        nxt = {
            0: n < 0.01,
            1: n < 0.005,
            2: self.tp >= 12,
            3: eef[2] > st["carry_z"] - 0.02,
            4: np.linalg.norm(err[:2]) < 0.006 and (self.detour is None or self.tp >= 30),
            5: n < 0.006,
            6: self.tp >= 8,
            7: n < 0.02,
        }[p]
        if p in (0, 1, 3, 4, 5, 7) and self.tp > _NEXT_TIMEOUT:
            nxt = True
        if self.drop_at is not None and p == 4 and self.tp == self.drop_at:
            self.phase, self.tp = 6, 0  # failure injection: open mid-carry
            return np.clip(a, -1, 1)
        if nxt:
            if p == 2:
                self.grasp_eef = eef.copy()
            self.phase, self.tp = p + 1, 0
            if self.phase == 8:
                self.k, self.phase = self.k + 1, 0
        return np.clip(a, -1, 1)
