"""`portable` as a child process on a recipe that lives in a test's folder (docs/recipes.md's example, the recipe
tests): the repository and that folder on PYTHONPATH, OMP_NUM_THREADS=1."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PORTABLE = ("-m", "reproduction.portable")


def recipe_env(cwd: Path, **extra: str) -> dict[str, str]:
    """The environment a child `portable` needs to import the recipe in `cwd` (plus `extra`)."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(REPO), str(cwd)]), **extra}


def run_portable(
    cwd: Path, *args: str, program: Sequence[str] = PORTABLE, new_session: bool = False, **env: str
) -> subprocess.CompletedProcess:
    """`python PROGRAM ARGS` in `cwd` (PROGRAM: `-m reproduction.portable`, or a test's `-c` seam), output captured."""
    return subprocess.run(
        [sys.executable, *program, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        start_new_session=new_session,
        env=recipe_env(cwd, **env),
    )
