"""The embedded default: MuJoCo Fetch tasks, scripted experts, data generation, policy eval.

    tasks.py       the two Fetch tasks, physics variants (id:variant)  env.py       FetchSim: observation, cameras
    experts.py     closed-loop scripted experts                        behaviours.py  modes: failures, harm, noise
    episode.py     one scripted episode as dataset frames              seeds.py     per-episode seeds (eval odd)
    generate.py    GenConfig / DataMix -> LeRobot v3.0 datasets        evaluate.py  EvalConfig -> EvalResult
    metrics.py     detours / stalls / drops read off trajectories      policies.py  ExpertPolicy, RandomPolicy
    workers.py     in-process, spawn pool or injected runner (Ray)     __main__.py  python -m reproduction.sim
    cameras.py     the rendered cameras, a policy's camera map -> them (no mujoco: configs import it)

Importing the package picks headless EGL rendering on Linux unless MUJOCO_GL is already set: mujoco
reads the variable once, at its first import, so it is set here, before any submodule can import
mujoco (elsewhere "egl" is an invalid value that mujoco's import refuses; its default is kept there).
"""

import os
import sys

if sys.platform.startswith("linux"):
    os.environ.setdefault("MUJOCO_GL", "egl")
