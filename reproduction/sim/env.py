"""One Fetch environment with the project's observation: position-only state, goal, two free cameras.

The gymnasium-robotics env does the physics (mocap-driven arm, 20 substeps of 2 ms per step, no
termination); this wrapper adds headless rendering (EGL on Linux unless MUJOCO_GL is set: see the package, with
`offsamples = 0` and `shadowsize = 0`: PLATFORM.md measured 25 -> 1,300 frames/s from these two) through
two free `MjvCamera`s, since the model's own cameras are blocked or white: a fixed `agentview` of the
table and a `wrist` view that follows the gripper. Observations (one frame, unbatched)::

    observation.state          float32 [11]  STATE_NAMES: gripper xyz, finger widths, cube xyz, cube - gripper
    observation.goal           float32 [3]   the target position
    observation.images.<cam>   uint8 [H, W, 3] for each camera asked for (none with cameras=())

Velocities are left out on purpose (DEMO_LAB.md: a value model that sees velocities "sees" a detour
under way and labels it positive). Call `close()` (or use `with`) to free the GL context.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mujoco
import numpy as np

from reproduction.errors import SimError
from reproduction.sim.spaces import ACTION_DIM, STATE_NAMES
from reproduction.sim.tasks import TaskSpec, get_task

CAMERAS = ("agentview", "wrist")
"""The cameras the simulator can render, in feature order."""
STATE_DIM = len(STATE_NAMES)
"""The width of `observation.state` (STATE_NAMES, kept in spaces.py, which preflights import without mujoco)."""
STEP_SECONDS = 0.04
"""Simulated time per step (20 substeps of 2 ms): datasets are written at 25 fps."""
FPS = 25
EPISODE_STEPS = 50
"""Fetch tasks never terminate; every episode is exactly this long (gymnasium's TimeLimit)."""

AGENTVIEW = {"lookat": (1.30, 0.75, 0.55), "distance": 0.95, "azimuth": 180.0, "elevation": -30.0}
"""Fixed view from across the table towards the robot: the whole table, cube, target and arm."""
WRIST = {"offset": (0.0, 0.0, -0.05), "distance": 0.30, "azimuth": 180.0, "elevation": -35.0}
"""Follows the gripper: looks at a point 5 cm below it from 30 cm in front and above, so the fingers,
the cube between them and (when near) the target are in view rather than the gripper's housing."""


def _free_camera(lookat: Sequence[float], distance: float, azimuth: float, elevation: float) -> mujoco.MjvCamera:
    cam = mujoco.MjvCamera()
    cam.type = mujoco.mjtCamera.mjCAMERA_FREE
    cam.lookat[:] = lookat
    cam.distance, cam.azimuth, cam.elevation = distance, azimuth, elevation
    return cam


def _make_gym_env(env_id: str) -> Any:
    import contextlib
    import io

    import gymnasium as gym

    # Its import prints a notice about the Adroit envs' rewards (not used here) on stderr in every process.
    with contextlib.redirect_stderr(io.StringIO()):
        import gymnasium_robotics

    gym.register_envs(gymnasium_robotics)
    return gym.make(env_id, disable_env_checker=True).unwrapped


class FetchSim:
    """A Fetch task with the project's observation dict. Not thread-safe; one per process or thread.

    `cameras` picks which of CAMERAS are rendered into every observation (`()` for state only) at
    `image_size` x `image_size`; `render_frame` draws any camera at any size on demand (videos).
    `renderers` (size -> mujoco.Renderer) shares GL contexts between envs of the same task; whoever
    passes it closes them.
    """

    def __init__(
        self,
        task: str | TaskSpec,
        *,
        cameras: Sequence[str] = CAMERAS,
        image_size: int = 64,
        renderers: dict[int, mujoco.Renderer] | None = None,
    ) -> None:
        self.task = task if isinstance(task, TaskSpec) else get_task(task)
        unknown = [c for c in cameras if c not in CAMERAS]
        if unknown:
            raise SimError(f"unknown camera(s) {unknown}; known: {', '.join(CAMERAS)}", field="cameras")
        if not 8 <= int(image_size) <= 480:
            raise SimError(f"image_size {image_size} is outside 8..480", field="image_size")
        self.cameras = tuple(cameras)
        self.image_size = int(image_size)
        self._env = _make_gym_env(self.task.gym_id)
        self.model, self.data = self._env.model, self._env.data
        if self.task.physics is not None:  # a variant (FetchPush-v4:heavy): its masses and frictions, once
            self.task.physics.apply(self.model)
        # Fast headless rendering: no multisampling, no shadow map (set before any renderer exists).
        self.model.vis.quality.offsamples = 0
        self.model.vis.quality.shadowsize = 0
        # Renderers may be shared by envs of one task (evaluation batches): a scene is drawn from the
        # data's positions, so one GL context per size serves them all. The owner closes shared ones.
        self._owns_renderers = renderers is None
        self._renderers: dict[int, mujoco.Renderer] = {} if renderers is None else renderers
        self._agent_cam = _free_camera(**AGENTVIEW)
        self._wrist_cam = _free_camera((0.0, 0.0, 0.0), WRIST["distance"], WRIST["azimuth"], WRIST["elevation"])
        self._grip_site = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_SITE, "robot0:grip")
        self._obj_site = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_SITE, "object0")
        self._finger_qpos = [
            self.model.jnt_qposadr[mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_JOINT, name)]
            for name in ("robot0:r_gripper_finger_joint", "robot0:l_gripper_finger_joint")
        ]
        self.table_z = float(self._env.height_offset)
        """The cube's resting height on the table."""
        self.goal = np.zeros(3)
        self.steps = 0

    # -- lifecycle -------------------------------------------------------------------------------

    def reset(self, seed: int) -> dict[str, np.ndarray]:
        """Start an episode from reset seed `seed` (cube and goal positions follow from it alone)."""
        self._env.reset(seed=int(seed))
        self.goal = np.asarray(self._env.goal, dtype=np.float64).copy()
        self._env._render_callback()  # moves the target marker to the goal (the env does this only in render())
        self.steps = 0
        return self.observation()

    def step(self, action: np.ndarray) -> tuple[dict[str, np.ndarray], bool]:
        """Apply one action (4 floats, clipped to [-1, 1]); returns (observation, cube within 5 cm of goal)."""
        a = np.asarray(action, dtype=np.float64)
        if a.shape != (ACTION_DIM,):
            raise SimError(
                f"action has shape {tuple(a.shape)}, expected ({ACTION_DIM},) (dx, dy, dz, gripper)",
                field="action",
                expected=[ACTION_DIM],
                actual=list(a.shape),
                hint="a policy must return float actions of shape (B, H, 4)",
            )
        if not np.all(np.isfinite(a)):
            raise SimError(f"action {a.tolist()} is not finite", field="action")
        self._physics_step(a)
        self.steps += 1
        return self.observation(), self.is_success()

    def _physics_step(self, action: np.ndarray) -> None:
        """gymnasium-robotics' `step` without what it computes for its own observation and reward (a
        third of the step's time, all name lookups): clip, set the mocap and finger targets, 20
        substeps, the step callback. `test_lean_step_matches_gymnasium_step` pins the equivalence."""
        env = self._env
        action = np.clip(action, env.action_space.low, env.action_space.high)
        env._set_action(action)
        env._mujoco_step(action)
        env._step_callback()

    def close(self) -> None:
        """Free the renderers (GL contexts) and the env; idempotent."""
        if self._owns_renderers:
            for renderer in self._renderers.values():
                renderer.close()
        self._renderers = {}
        if self._env is not None:
            self._env.close()
            self._env = None

    def __enter__(self) -> FetchSim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- state -----------------------------------------------------------------------------------

    @property
    def grip_pos(self) -> np.ndarray:
        return self.data.site_xpos[self._grip_site].copy()

    @property
    def object_pos(self) -> np.ndarray:
        return self.data.site_xpos[self._obj_site].copy()

    @property
    def fingers(self) -> np.ndarray:
        return self.data.qpos[self._finger_qpos].copy()

    def is_success(self) -> bool:
        """The env's own rule: the cube within `distance_threshold` (5 cm) of the goal."""
        return bool(self.goal_distance() < self._env.distance_threshold)

    def goal_distance(self) -> float:
        """Metres from the cube to the goal (what `is_success` thresholds)."""
        return float(np.linalg.norm(self.object_pos - self.goal))

    def state(self) -> np.ndarray:
        grip, obj = self.grip_pos, self.object_pos
        return np.concatenate([grip, self.fingers, obj, obj - grip]).astype(np.float32)

    def observation(self) -> dict[str, np.ndarray]:
        obs = {"observation.state": self.state(), "observation.goal": self.goal.astype(np.float32)}
        for cam in self.cameras:
            obs[f"observation.images.{cam}"] = self.render_frame(cam, self.image_size)
        return obs

    # -- rendering -------------------------------------------------------------------------------

    def render_frame(self, camera: str, size: int) -> np.ndarray:
        """uint8 (size, size, 3) from `camera` ("agentview" or "wrist") at the current state."""
        renderer = self._renderers.get(size)
        if renderer is None:
            renderer = self._renderers[size] = mujoco.Renderer(self.model, size, size)
        if camera == "agentview":
            cam = self._agent_cam
        elif camera == "wrist":
            cam = self._wrist_cam
            cam.lookat[:] = self.grip_pos + np.asarray(WRIST["offset"])
        else:
            raise SimError(f"unknown camera {camera!r}; known: {', '.join(CAMERAS)}", field="camera")
        renderer.update_scene(self.data, camera=cam)
        return renderer.render()
