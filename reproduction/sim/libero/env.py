"""One LIBERO task's env, built once, reset to a fixed init state, observed in upstream's layout.

Follows RLinf's wrapper (`rlinf/envs/libero/libero_env.py`, `rlinf/envs/libero/utils.py`): after each reset to an
init state, `settle_steps` no-op actions (zeros, gripper -1 = open; RLinf's 15 with `reset_gripper_open`) let the
objects fall onto the table (init states hold them ~7 cm up: LIBERO_LAB.md). The env is built once with
`hard_reset=False` (LIBERO's default reset rebuilds and recompiles the model: 3-4.5 CPU-s) and each episode is
`reset()` + `set_init_state()`. Observation (one frame, unbatched)::

    observation.images.image         uint8 [H, W, 3]  agentview, rotated 180 deg (img[::-1, ::-1]) as RLinf/openpi
    observation.images.wrist_image   uint8 [H, W, 3]  robot0_eye_in_hand, rotated 180 deg the same way
    observation.state                float32 [8]      eef pos (3), eef axis-angle (3), gripper finger qpos (2)
    observation.object_state         float32 [K]      LIBERO's privileged `object-state` (no-camera mode only)
    task                             str              the task's language string

Action: float [7] OSC_POSE delta (dx, dy, dz, droll, dpitch, dyaw in [-1, 1], gripper -1 open / +1 close).
Success is LIBERO's own BDDL goal check, `env.check_success()`. Call `close()` (or use `with`) to free it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from reproduction.errors import SimError
from reproduction.sim.cameras import LIBERO_IMAGE_KEYS
from reproduction.sim.libero._runtime import import_libero, rendering
from reproduction.sim.libero.tasks import LiberoTask, make_suite

ACTION_DIM = 7
STATE_DIM = 8
STATE_NAMES = ["eef_x", "eef_y", "eef_z", "eef_ax", "eef_ay", "eef_az", "finger_l", "finger_r"]
SETTLE_STEPS = 15
"""RLinf's wait after reset (`LiberoEnv.reset`: 15 zero actions, gripper open); openpi's example script waits 10."""
FPS = 20
"""LIBERO's control rate (25 substeps of 2 ms)."""
NOOP = np.array([0, 0, 0, 0, 0, 0, -1.0])
CAMERAS = ("agentview", "robot0_eye_in_hand")
IMAGE_KEYS = LIBERO_IMAGE_KEYS


def quat2axisangle(quat: np.ndarray) -> np.ndarray:
    """(x, y, z, w) quaternion -> axis-angle, robosuite's formula as RLinf copies it, without mutating `quat`."""
    x, y, z, w = (float(v) for v in quat)
    w = min(1.0, max(-1.0, w))
    den = math.sqrt(1.0 - w * w)
    if math.isclose(den, 0.0):
        return np.zeros(3)
    return np.array([x, y, z]) * 2.0 * math.acos(w) / den


def check_action(action: Any) -> np.ndarray:
    """A (7,) finite float action, else SimError naming the shape or the value."""
    a = np.asarray(action, dtype=np.float64)
    if a.shape != (ACTION_DIM,):
        raise SimError(
            f"LIBERO action has shape {a.shape}, expected ({ACTION_DIM},): "
            "dx dy dz droll dpitch dyaw gripper (-1 open, +1 close)",
            hint="a policy trained on another simulator (Fetch acts in 4 dims) cannot act in LIBERO",
            expected=(ACTION_DIM,),
            actual=a.shape,
        )
    if not np.all(np.isfinite(a)):
        raise SimError(f"LIBERO action is not finite: {a.tolist()}", hint="check the policy's output")
    return a


class LiberoSim:
    """One task's env. Build cost 5-12 s and 1.5-2.6 GB (LIBERO_LAB.md): build once, `reset(i)` per episode."""

    def __init__(
        self,
        task: LiberoTask,
        *,
        cameras: bool = True,
        image_size: int = 256,
        settle_steps: int = SETTLE_STEPS,
        cache_dir: Path | None = None,
        seed: int = 0,
    ) -> None:
        libero = import_libero(cache_dir)
        self.task, self.cameras, self.settle_steps = task, cameras, settle_steps
        suite = make_suite(libero, task.suite)
        self.init_states = np.asarray(suite.get_task_init_states(task.index))
        common = dict(bddl_file_name=task.bddl_path, hard_reset=False)
        if cameras:
            with rendering(f"render camera images for {task.task_id}"):
                self.env = libero["OffScreenRenderEnv"](
                    **common, camera_heights=image_size, camera_widths=image_size, camera_names=list(CAMERAS)
                )
                self.env.seed(seed)
                self.env.reset()
        else:
            self.env = libero["ControlEnv"](
                **common, has_renderer=False, has_offscreen_renderer=False, use_camera_obs=False
            )
            self.env.seed(seed)
            self.env.reset()
        self._raw: dict[str, Any] = {}
        self.steps = 0

    # -- episode ---------------------------------------------------------------------------------

    def reset(self, init_index: int, seed: int | None = None) -> dict[str, Any]:
        """Set init state `init_index` (checked against the task's count), settle, return the observation.

        `seed` re-seeds the env first (LIBERO's `env.seed`: numpy's global RNG). robosuite's reset draws the arm's
        initialization noise from that RNG, and the OSC controller keeps the noisy joints as its nullspace target
        after `set_init_state` has overwritten the pose, so without a seed an episode depends on how many resets
        this process has run before it (the actions differ in the last digits, not the outcome)."""
        n = len(self.init_states)
        if isinstance(init_index, bool) or not isinstance(init_index, (int, np.integer)):  # int() truncated 3.5 (H7)
            raise SimError(f"init state {init_index!r} is not an integer index", hint=f"pass an int in 0..{n - 1}")
        if not 0 <= int(init_index) < n:
            raise SimError(
                f"init state {init_index} out of range for {self.task.task_id}: it has init states 0..{n - 1}",
                hint=f"episodes_per_task is at most {n} (the first N init states, in order)",
            )
        if seed is not None:
            self.env.seed(int(seed))
        self.env.reset()
        for robot in self.env.env.robots:  # a soft reset keeps the gripper's integrated command; a rebuild zeroes it
            if getattr(robot, "gripper", None) is not None and hasattr(robot.gripper, "current_action"):
                robot.gripper.current_action = np.zeros_like(robot.gripper.current_action)
        self._raw = self.env.set_init_state(self.init_states[int(init_index)])
        for _ in range(self.settle_steps):
            self._raw, _, _, _ = self.env.step(NOOP)
        self.steps = 0
        return self.observation()

    def step(self, action: Any) -> tuple[dict[str, Any], bool]:
        """One control step; returns (observation, LIBERO's check_success() after it)."""
        self._raw, _, _, _ = self.env.step(check_action(action))
        self.steps += 1
        return self.observation(), self.is_success()

    def is_success(self) -> bool:
        return bool(self.env.check_success())

    # -- observation -----------------------------------------------------------------------------

    def state(self) -> np.ndarray:
        r = self._raw
        return np.concatenate(
            [r["robot0_eef_pos"], quat2axisangle(r["robot0_eef_quat"]), r["robot0_gripper_qpos"]]
        ).astype(np.float32)

    def observation(self) -> dict[str, Any]:
        obs: dict[str, Any] = {"observation.state": self.state(), "task": self.task.language}
        if self.cameras:
            for key, cam in zip(IMAGE_KEYS, CAMERAS):
                # OpenGL images come bottom-up; RLinf/openpi rotate 180 deg (not a vertical flip) before training.
                obs[key] = np.ascontiguousarray(self._raw[f"{cam}_image"][::-1, ::-1])
        else:
            obs["observation.object_state"] = np.asarray(self._raw["object-state"], dtype=np.float32)
        return obs

    @property
    def raw(self) -> dict[str, Any]:
        """The last raw LIBERO observation dict (privileged poses included)."""
        return self._raw

    @property
    def sim(self) -> Any:
        """robosuite's MjSim (privileged: for scripted experts and tests only)."""
        return self.env.sim

    # -- lifetime --------------------------------------------------------------------------------

    def close(self) -> None:
        env, self.env = getattr(self, "env", None), None
        if env is not None:
            env.close()

    def __enter__(self) -> LiberoSim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
