"""Shared pytest setup: one BLAS/OpenMP thread per process, and the repo root importable."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("PORTABLE_NO_PROGRESS", "1")
if sys.platform.startswith("linux"):
    # Headless rendering for every test: mujoco reads MUJOCO_GL once, at its first import, and a test
    # module that imports mujoco (through gymnasium) before reproduction.sim would otherwise get GLFW.
    os.environ.setdefault("MUJOCO_GL", "egl")

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
