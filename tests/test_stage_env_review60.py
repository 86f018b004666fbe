"""A stage's environment changes end with it, except the variables the project's own modules set once per process
(runner.PROCESS_ENV): those stay, so a later stage of a full run sees what it sees run alone (review60 R1)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from reproduction.run.runner import PROCESS_ENV, stage_process_state
from reproduction.train.ray_connect import WORKER_ENV

ROOT = Path(__file__).resolve().parents[1] / "reproduction"


def test_process_env_lists_every_variable_the_project_sets_once_per_process():
    named = set(WORKER_ENV)
    for path in ROOT.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        named |= set(re.findall(r'os\.environ\.setdefault\(\s*"([A-Z_]+)"', text))
        named |= set(re.findall(r'os\.environ\["([A-Z_]+)"\]\s*=(?!=)', text))
        if "os.environ.setdefault(var," in text:  # sim/libero/_runtime.py's cache folders, set in a loop
            named |= set(re.findall(r'\(\s*"([A-Z_]+)",\s*"[a-z_]+"\s*\)', text))
    assert {
        "MUJOCO_GL",
        "RAY_AUTH_MODE",
        "LIBERO_CONFIG_PATH",
        "NUMBA_CACHE_DIR",
        "RAY_COLOR_PREFIX",
    } <= named  # the scan finds them
    assert named <= set(PROCESS_ENV), sorted(named - set(PROCESS_ENV))


def test_a_project_default_a_stage_added_stays_and_everything_else_is_put_back(monkeypatch, tmp_path):
    monkeypatch.delenv("MUJOCO_GL", raising=False)
    monkeypatch.delenv("LAB60_VAR", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    cwd = os.getcwd()
    with stage_process_state():
        os.environ.setdefault("MUJOCO_GL", "egl")  # as reproduction/sim/__init__.py does at its first import
        os.environ["LAB60_VAR"] = "set by the stage"
        os.environ["OMP_NUM_THREADS"] = "7"
        os.chdir(tmp_path)
    assert os.environ.get("MUJOCO_GL") == "egl"
    assert "LAB60_VAR" not in os.environ
    assert os.environ["OMP_NUM_THREADS"] == "1"
    assert os.getcwd() == cwd


def test_an_oserror_without_a_filename_ends_its_line_with_the_reason_not_a_colon():
    from reproduction.run.stage_keys import _unreadable_input

    exc = _unreadable_input("data", OSError(5, "Input/output error"), None, {})
    assert exc.message == "opened input 'data' cannot be fingerprinted: Input/output error"
    named = _unreadable_input("data", FileNotFoundError(2, "No such file or directory", "/x/y"), None, {"data": "/x/y"})
    assert (
        named.message
        == "opened input 'data' cannot be fingerprinted: No such file or directory: '/x/y' (config key data)"
    )
