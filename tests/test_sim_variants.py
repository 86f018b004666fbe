"""Physics variants of the Fetch tasks (`FetchPush-v4:slippery`): model values, determinism, errors, data, eval."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest

from reproduction.errors import ConfigError, SimError
from reproduction.sim.env import FetchSim
from reproduction.sim.experts import Scene, push_action
from reproduction.sim.seeds import reset_seed
from reproduction.sim.tasks import VARIANTS, get_task

VARIANT = "FetchPush-v4:slippery"


def _values(sim: FetchSim) -> dict[str, float]:
    """The cube's mass and the cube's and table's sliding friction, read back from the live MuJoCo model."""
    m = sim.model
    body = {n: mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_BODY, n) for n in ("object0", "table0")}
    geom = {n: int(np.flatnonzero(m.geom_bodyid == b)[0]) for n, b in body.items()}
    return {
        "mass": float(m.body_mass[body["object0"]]),
        "cube_friction": float(m.geom_friction[geom["object0"], 0]),
        "table_friction": float(m.geom_friction[geom["table0"], 0]),
    }


def _expert_episode(sim: FetchSim, seed: int, steps: int = 50) -> tuple[np.ndarray, bool]:
    obs = sim.reset(seed)
    states = [obs["observation.state"]]
    for _ in range(steps):
        s = obs["observation.state"].astype(np.float64)
        scene = Scene(grip=s[0:3], fingers=float(s[3] + s[4]), cube=s[5:8], goal=sim.goal, table_z=sim.table_z)
        obs, _ = sim.step(push_action(scene)[0])
        states.append(obs["observation.state"])
    return np.stack(states), sim.is_success()


def test_variant_physics_is_read_back_from_the_model_and_the_base_is_untouched():
    with FetchSim("FetchPush-v4", cameras=()) as base, FetchSim(VARIANT, cameras=()) as slip:
        with FetchSim("FetchPush-v4:heavy", cameras=()) as heavy, FetchSim("push:rough", cameras=()) as rough:
            assert _values(base) == {"mass": 2.0, "cube_friction": 1.0, "table_friction": 1.0}
            assert _values(slip) == {"mass": 2.0, "cube_friction": 0.5, "table_friction": 0.5}
            assert _values(heavy) == {"mass": 10.0, "cube_friction": 1.0, "table_friction": 1.0}
            assert _values(rough) == {"mass": 2.0, "cube_friction": 3.0, "table_friction": 1.0}
            # the same task otherwise: observation, action space, language, reset states
            assert slip.task.language == base.task.language and slip.task.lifts == base.task.lifts
            assert slip.task.env_id == VARIANT and slip.task.short == "push_slippery"
            assert slip._env.action_space.shape == base._env.action_space.shape
            a, b = slip.reset(7), base.reset(7)
            assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert set(VARIANTS) == {"slippery", "heavy", "rough"}


def test_same_seed_same_episode_and_the_physics_changes_it():
    with FetchSim(VARIANT, cameras=()) as one, FetchSim(VARIANT, cameras=()) as two:
        first, ok_first = _expert_episode(one, 11)
        _expert_episode(one, 12)  # a reused env: the episode does not depend on what it ran before
        again, ok_again = _expert_episode(one, 11)
        other, _ = _expert_episode(two, 11)
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(first, other)
    assert ok_first == ok_again
    with FetchSim("FetchPush-v4", cameras=()) as base:
        normal, _ = _expert_episode(base, 11)
    np.testing.assert_array_equal(normal[0], first[0])  # the same start ...
    assert not np.array_equal(normal, first)  # ... and other physics


@pytest.mark.parametrize("name", ["FetchPush-v4:icy", "push:", "FetchPush-v4:slippery:heavy"])
def test_unknown_variant_is_a_one_line_config_error_naming_the_task(name):
    from reproduction.sim.evaluate import EvalConfig
    from reproduction.sim.generate import GenConfig

    for make in (lambda: get_task(name), lambda: GenConfig(tasks=(name,)), lambda: EvalConfig(tasks=(name,))):
        with pytest.raises(ConfigError) as err:
            make()
        assert "\n" not in str(err.value) and repr(name) in str(err.value)
        assert "slippery" in err.value.hint and err.value.field == "task"
    with pytest.raises(SimError, match="unknown simulator task 'FetchSlide-v1:slippery'"):
        get_task("FetchSlide-v1:slippery")


def test_variant_seeds_are_the_base_task_seeds():
    for split in ("sft", "rollout", "eval"):
        assert reset_seed(3, split, VARIANT, 5) == reset_seed(3, split, "FetchPush-v4", 5)


def test_generate_and_evaluate_in_the_variant(tmp_path):
    from reproduction.data.reader import open_dataset
    from reproduction.sim.evaluate import EvalConfig, evaluate
    from reproduction.sim.generate import GenConfig, generate_dataset
    from reproduction.sim.policies import ExpertPolicy

    cfg = GenConfig(kind="sft", tasks=(VARIANT,), episodes_per_task=2, cameras=(), seed=1)
    result = generate_dataset(cfg, tmp_path / "real")
    assert result.per_task == {VARIANT: {"episodes": 2, "success": 2}}
    ds = open_dataset(tmp_path / "real")
    assert ds.num_episodes == 2 and list(ds.tasks.values()) == [get_task("FetchPush-v4").language]
    seeds = sorted(set(ds.frame_table(["sim.reset_seed"]).column("sim.reset_seed").to_pylist()))
    assert seeds == sorted(reset_seed(1, "sft", "FetchPush-v4", i) for i in range(2))
    # both worlds in one dataset: one task string (the policy is not told the world), each world's counts
    both = generate_dataset(
        GenConfig(kind="sft", tasks=("FetchPush-v4", VARIANT), episodes_per_task=1, cameras=()), tmp_path / "both"
    )
    assert set(both.per_task) == {"FetchPush-v4", VARIANT} and len(open_dataset(tmp_path / "both").tasks) == 1
    # the evaluation names the variant; its episodes start where the base task's do
    ev = evaluate(ExpertPolicy, EvalConfig(tasks=("FetchPush-v4", VARIANT), episodes_per_task=2, execute_steps=1))
    assert set(ev.tasks) == {"FetchPush-v4", VARIANT}
    assert ev.reset_seeds[VARIANT] == ev.reset_seeds["FetchPush-v4"]
    assert ev.tasks[VARIANT].success_at_end == 2


def test_grpo_takes_a_variant_where_it_takes_a_task():
    from reproduction.recipes.grpo.envs import init_reset, make_sims, task_language
    from reproduction.recipes.grpo.preflight import task_problems

    assert task_problems("rl.tasks", ["FetchPush-v4", VARIANT]) == []
    (problem,) = task_problems("eval.tasks", ["FetchPush-v4:icy"])
    assert isinstance(problem, ConfigError) and str(problem).startswith("eval.tasks: task 'FetchPush-v4:icy'")
    assert task_language(VARIANT) == task_language("FetchPush-v4")
    assert init_reset(0, VARIANT, 3) == init_reset(0, "FetchPush-v4", 3)
    (sim,) = make_sims(VARIANT, 1)
    try:
        assert sim.task.env_id == VARIANT and _values(sim)["cube_friction"] == 0.5
    finally:
        sim.close()
