"""The simulator's env, tasks, seeds and bad-input errors (fast)."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from reproduction.errors import ConfigError, SimError
from reproduction.sim.env import STATE_DIM, FetchSim
from reproduction.sim.seeds import episode_rng, reset_seed
from reproduction.sim.tasks import TASKS, get_task

SIM_DIR = Path(__file__).resolve().parent.parent / "reproduction" / "sim"


def test_unknown_task_is_a_one_line_sim_error_with_exit_code_in_range():
    with pytest.raises(SimError) as err:
        FetchSim("FetchSlide-v9", cameras=())
    assert 40 <= err.value.exit_code <= 59
    assert "\n" not in str(err.value) and "FetchSlide-v9" in str(err.value)
    assert "FetchPickAndPlace-v4" in err.value.hint


def test_tasks_resolve_by_id_short_name_and_language():
    for spec in TASKS.values():
        assert get_task(spec.short) is spec and get_task(spec.language) is spec and get_task(spec.env_id) is spec


@pytest.mark.parametrize("bad", [np.zeros(3), np.zeros(5), np.zeros((1, 4)), np.array([0, 0, np.nan, 0])])
def test_bad_action_is_a_one_line_sim_error(bad):
    with FetchSim("FetchPush-v4", cameras=()) as sim:
        sim.reset(0)
        with pytest.raises(SimError) as err:
            sim.step(bad)
    assert "\n" not in str(err.value) and err.value.exit_code == SimError.exit_code


def test_observation_layout_and_images():
    with FetchSim("FetchPickAndPlace-v4", cameras=("agentview", "wrist"), image_size=32) as sim:
        obs = sim.reset(3)
        assert obs["observation.state"].shape == (STATE_DIM,) and obs["observation.state"].dtype == np.float32
        assert obs["observation.goal"].shape == (3,)
        for cam in ("agentview", "wrist"):
            img = obs[f"observation.images.{cam}"]
            assert img.shape == (32, 32, 3) and img.dtype == np.uint8
            assert img.std() > 5  # a scene, not a blank (the model's own cameras render white/blocked)
        state = obs["observation.state"]
        np.testing.assert_allclose(state[8:11], state[5:8] - state[0:3], atol=1e-6)
        obs2, ok = sim.step(np.array([0.0, 0.0, 1.0, 0.0]))
        assert obs2["observation.state"][2] > state[2] and isinstance(ok, bool)
        # the wrist camera follows the gripper: after moving, its view changes
        assert not np.array_equal(obs2["observation.images.wrist"], obs["observation.images.wrist"])


def test_state_only_and_bad_camera():
    with FetchSim("FetchPush-v4", cameras=()) as sim:
        assert set(sim.reset(0)) == {"observation.state", "observation.goal"}
    with pytest.raises(SimError):
        FetchSim("FetchPush-v4", cameras=("head",))


def test_reset_is_deterministic_per_seed():
    with FetchSim("FetchPickAndPlace-v4", cameras=()) as sim:
        a = sim.reset(11)
        sim.step(np.ones(4))
        b = sim.reset(11)
        c = sim.reset(12)
    np.testing.assert_array_equal(a["observation.state"], b["observation.state"])
    np.testing.assert_array_equal(a["observation.goal"], b["observation.goal"])
    assert not np.array_equal(a["observation.goal"], c["observation.goal"])


def test_eval_seeds_are_disjoint_from_generation_seeds():
    gen = {
        reset_seed(s, split, t, i) for s in (0, 1) for split in ("sft", "rollout") for t in TASKS for i in range(500)
    }
    ev = {reset_seed(s, "eval", t, i) for s in (0, 1) for t in TASKS for i in range(500)}
    assert not gen & ev
    assert all(x % 2 == 1 for x in ev) and all(x % 2 == 0 for x in gen)
    assert len(gen) > 3900  # distinct per (seed, split, task, index)
    assert reset_seed(0, "eval", "FetchPush-v4", 3) == reset_seed(0, "eval", "FetchPush-v4", 3)
    r1, r2 = episode_rng(0, "rollout", "FetchPush-v4", 5), episode_rng(0, "rollout", "FetchPush-v4", 5)
    assert r1.random() == r2.random()


def test_sim_imports_neither_recap_nor_train():
    for path in SIM_DIR.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert not name.startswith(("reproduction.recap", "reproduction.train", "reproduction.run")), (
                    f"{path.name} imports {name}"
                )


def test_config_errors_name_the_field():
    from reproduction.sim.evaluate import EvalConfig
    from reproduction.sim.generate import GenConfig

    with pytest.raises(ConfigError) as err:
        GenConfig(kind="rollout", modes={"sloppy": 1.0})
    assert err.value.field == "modes"
    with pytest.raises(ConfigError):
        GenConfig(kind="demo")
    with pytest.raises(SimError):
        GenConfig(tasks=("FetchReach-v9",))
    with pytest.raises(ConfigError) as err:
        EvalConfig(execute_steps=0)
    assert err.value.field == "execute_steps"
    with pytest.raises(SimError):
        EvalConfig(tasks=("nope",))


def test_lean_step_matches_gymnasium_step():
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1, 1, size=(15, 4))
    for task in TASKS:
        with FetchSim(task, cameras=()) as ours:
            ours.reset(5)
            for a in actions:
                ours.step(a)
            lean = ours.data.qpos.copy()
            ours.reset(5)
            for a in actions:
                ours._env.step(a)  # the library's own step
            np.testing.assert_array_equal(lean, ours.data.qpos)
