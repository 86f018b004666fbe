"""The embedded default: MuJoCo Fetch tasks, scripted experts, data generation, policy eval.

Importing the package picks headless EGL rendering unless MUJOCO_GL is already set: mujoco reads the
variable once, at its first import, so it is set here, before any submodule can import mujoco.
"""

import os

os.environ.setdefault("MUJOCO_GL", "egl")
