"""audit51 H1-H7: the LIBERO path refuses bad input with one line and its exit code before any env, stage or
folder (a bad MUJOCO_GL, seeds out of numpy's range, unknown cameras, negative counts, LIBERO missing, Ctrl-C).
Validation only: no env is built (a MUJOCO_GL case runs a child, as mujoco reads the variable once per process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from reproduction.errors import ConfigError, SimError
from reproduction.sim.libero import available
from reproduction.sim.libero import generate as gen

REPO = Path(__file__).resolve().parents[1]
needs_libero = pytest.mark.skipif(not available(), reason="needs the [libero] extra")


def _child(code_or_args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp_path), **env}
    return subprocess.run(
        [sys.executable, *code_or_args], capture_output=True, text=True, env=full, cwd=tmp_path, timeout=120
    )


@needs_libero
def test_an_unknown_mujoco_gl_is_exit_46_in_one_line_before_the_generator_writes(tmp_path):
    out = tmp_path / "gen"
    args = ["-m", "reproduction.sim.libero.generate", "--out", str(out), "--sft", "1", "--rollouts", "0"]
    res = _child([*args, "--eval", "0", "--no-cameras"], tmp_path, MUJOCO_GL="bogus")
    assert res.returncode == 46, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if not ln.startswith("[info]")]
    assert lines == [
        "error: MUJOCO_GL=bogus is not a value mujoco takes (egl, osmesa, glx, glfw; disable: none)",
        "hint: unset MUJOCO_GL (EGL is the default) or set it to the backend `portable check` names "
        "(its libero.render row)",
    ]
    assert not out.exists()


@needs_libero
def test_grpo_preflight_refuses_an_unknown_mujoco_gl_before_any_stage(tmp_path):
    code = (
        "from reproduction.recipes.grpo.preflight import _tasks_problems\n"
        "ps = _tasks_problems((('rl.tasks', ['libero_10/0']), ('eval.tasks', ['libero_10/0'])))\n"
        "print([(p.exit_code, p.message) for p in ps])\n"
    )
    res = _child(["-c", code], tmp_path, MUJOCO_GL="bogus")
    assert res.returncode == 0, res.stderr
    said = "MUJOCO_GL=bogus is not a value mujoco takes (egl, osmesa, glx, glfw; disable: none)"
    assert res.stdout.strip() == f"[(46, {said!r})]"


def test_libero_missing_for_rl_and_eval_tasks_is_one_problem_exit_10_with_the_install_hint(monkeypatch):
    import reproduction.sim.libero as libero
    from reproduction.errors import PortableError
    from reproduction.recipes.grpo.preflight import _tasks_problems
    from reproduction.run.preflight import raise_problems

    monkeypatch.setattr(libero, "available", lambda: False)
    problems = _tasks_problems((("rl.tasks", ["libero_10/0"]), ("eval.tasks", ["libero_10/0", "libero_10/1"])))
    with pytest.raises(PortableError) as err:
        raise_problems(problems)
    assert err.value.exit_code == 10
    assert err.value.message == (
        "rl.tasks and eval.tasks name LIBERO tasks (libero_10/0, libero_10/1) but LIBERO is not installed"
    )
    assert err.value.hint.startswith("pip install -e '.[libero]'")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("rl.seed=-1", "rl.seed=-1 is outside 0..4294967295"),
        ("rl.seed=4294967296", "rl.seed=4294967296 is outside 0..4294967295"),
        ("eval.seed=-1", "eval.seed=-1 is outside 0..4294967245"),
        ("eval.seed=4294967295", "eval.seed=4294967295 is outside 0..4294967245"),
    ],
)
def test_grpo_seeds_out_of_range_are_refused_at_config_load(tmp_path, override, message):
    from reproduction.recipes.grpo.config import GrpoRunConfig
    from reproduction.run.config import load_config

    configs = [REPO / "bundle" / "grpo" / "config.yaml", REPO / "bundle" / "grpo" / "libero.yaml"]
    with pytest.raises(ConfigError) as err:
        load_config(configs, [override], bundle=tmp_path, run_dir=tmp_path / "run", schema=GrpoRunConfig)
    assert err.value.exit_code == 4 and err.value.message == f"command line: {message}"  # audit58 D6
    assert err.value.field == override.split("=")[0]


def test_generator_seeds_outside_0_to_2_32_are_refused_before_any_env(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(gen, "_build_sim", lambda *a: pytest.fail("an env was built"))
    for seed in (-5, 2**32):
        with pytest.raises(ConfigError, match=rf"^seed {seed} is outside 0\.\.4294967295"):
            gen.LiberoGenConfig(task="libero_10/0", seed=seed)
        assert gen.main(["--out", str(tmp_path / "o"), "--seed", str(seed)]) == 4
        err = capsys.readouterr().err
        assert err.startswith(f"error: --seed {seed} is outside 0..4294967295 (2**32-1)\nhint: ")
    assert gen.LiberoGenConfig(task="libero_10/0", seed=2**32 - 1).seed == 2**32 - 1
    assert not (tmp_path / "o").exists()


def test_generator_negative_counts_and_unread_bad_modes_are_refused(tmp_path, capsys):
    out = str(tmp_path / "o")
    assert gen.main(["--out", out, "--sft", "-1", "--rollouts", "0", "--eval", "0"]) == 4
    assert capsys.readouterr().err.splitlines()[0] == "error: --sft -1 must be >= 0 (0 skips that set)"
    assert gen.main(["--out", out, "--sft", "1", "--rollouts", "0", "--eval", "0", "--modes", "expert=1,foo=1"]) == 4
    assert capsys.readouterr().err.splitlines()[0] == "error: unknown LIBERO generation mode 'foo'"
    assert not (tmp_path / "o").exists()


def test_unknown_libero_cameras_are_refused_naming_the_valid_ones(tmp_path, capsys, monkeypatch):
    from reproduction.sim.__main__ import main

    monkeypatch.setattr(gen, "generate_libero_data", lambda *a, **k: pytest.fail("generation started"))
    for value, bad in (("nosuchcam", "'nosuchcam'"), ("agentview,nosuchcam", "'nosuchcam'"), ("nonne", "'nonne'")):
        assert main(["generate", "--out", str(tmp_path / "o"), "--tasks", "libero_10/0", "--cameras", value]) == 4
        assert capsys.readouterr().err.splitlines() == [
            f"error: --cameras: {bad} is not a LIBERO camera",
            "hint: valid: agentview, wrist (a LIBERO env renders both), or none (state only)",
        ]
    assert not (tmp_path / "o").exists()


def test_ctrl_c_in_the_generator_is_one_line_exit_130_and_leaves_no_folder(tmp_path, capsys, monkeypatch):
    out = tmp_path / "o"

    def interrupted(root, **kw):
        Path(root).mkdir()
        raise KeyboardInterrupt

    monkeypatch.setattr(gen, "generate_libero_data", interrupted)
    assert gen.main(["--out", str(out)]) == 130
    assert capsys.readouterr().err == "error: interrupted\n"
    assert not out.exists()


def test_libero_sim_reset_refuses_a_non_integer_init_state():
    from types import SimpleNamespace

    from reproduction.sim.libero.env import LiberoSim

    sim = object.__new__(LiberoSim)
    sim.init_states = np.zeros((50, 3))
    sim.task = SimpleNamespace(task_id="libero_10/0")
    with pytest.raises(SimError, match=r"^init state 3\.5 is not an integer index$") as err:
        sim.reset(3.5)
    assert err.value.exit_code == 45
