"""LIBERO data generation without LIBERO (runs in CI): config checks, mode counts, sft filtering and renumbering,
the camera-free metadata, the progress bar and the CLI routes, with a fake env and expert behind the generator's
seams (`_build_sim`, `expert_for`). The real env is tested in tests/test_libero_generate.py (slow, the extra)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from reproduction.errors import ConfigError, InvalidInputError, SimError
from reproduction.sim.libero import generate as gen


class _FakeSim:
    """LiberoSim's surface: success after 3 steps from even init states, never from odd ones."""

    task = SimpleNamespace(language="pick up the black bowl", task_id="libero_spatial/0")

    def __init__(self):
        self.t, self.init, self.resets, self.closed = 0, 0, [], False

    def _obs(self):
        return {
            "observation.state": np.full(8, self.t, np.float32),
            "observation.object_state": np.full(5, self.init, np.float32),
            "task": self.task.language,
        }

    def reset(self, init_index, seed=None):
        self.t, self.init = 0, init_index
        self.resets.append((init_index, seed))
        return self._obs()

    def step(self, action):
        self.t += 1
        return self._obs(), self.init % 2 == 0 and self.t >= 3

    def close(self):
        self.closed = True


class _FakeExpert:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def bind(self, sim):
        pass

    def act(self):
        return self.rng.uniform(-1, 1, 7)


@pytest.fixture
def fake(monkeypatch):
    sims = []

    def build(config, cache_dir):
        sims.append(_FakeSim())
        return sims[-1]

    monkeypatch.setattr(gen, "_build_sim", build)
    monkeypatch.setattr(gen, "expert_for", lambda mode, rng, seed: (_FakeExpert(seed), {}))
    yield sims
    gen.close_envs()


def test_bad_configs_are_refused_before_any_env(fake, tmp_path):
    with pytest.raises(SimError, match="no scripted expert for 'libero_goal/0'") as err:
        gen.LiberoGenConfig(task="libero_goal/0")
    assert err.value.exit_code == 45
    with pytest.raises(SimError, match="unknown LIBERO suite"):
        gen.LiberoGenConfig(task="libero_99/0")
    with pytest.raises(ConfigError, match="kind 'demo'"):
        gen.LiberoGenConfig(kind="demo")
    with pytest.raises(ConfigError, match="unknown LIBERO generation mode 'wobble'"):
        gen.LiberoGenConfig(modes={"wobble": 1.0})
    with pytest.raises(ConfigError, match="episodes 0 < 1"):
        gen.LiberoGenConfig(episodes=0)
    (tmp_path / "rollouts_eval").mkdir()
    with pytest.raises(InvalidInputError, match="rollouts_eval: already exists"):
        gen.generate_libero_data(tmp_path, task="libero_spatial/0", sft=1, rollouts=1, eval_rollouts=1)
    assert fake == [] and not (tmp_path / "sft").exists()


def test_modes_are_exact_counts_shuffled_by_the_seed():
    cfg = gen.LiberoGenConfig(task="libero_10/0", episodes=10, seed=3)
    modes = gen.episode_modes(cfg)
    assert sorted(m.name for m in modes) == sorted(["EXPERT"] * 3 + ["DETOUR"] * 2 + ["NOISE"] * 3 + ["DROP"] * 2)
    assert modes == gen.episode_modes(gen.LiberoGenConfig(task="libero_10/0", episodes=10, seed=3))
    assert gen.episode_modes(gen.LiberoGenConfig(kind="sft", episodes=4)) == [gen.LiberoMode.EXPERT] * 4
    assert [cfg.init_state(i) for i in (0, 32, 33)] == [17, 49, 0]


def test_sft_keeps_successes_renumbered_and_says_it_has_no_images(fake, tmp_path):
    from reproduction.data.reader import open_dataset

    res = gen.generate_libero_data(
        tmp_path, task="libero_spatial/0", sft=4, rollouts=3, eval_rollouts=0, cameras=False, max_steps=6
    )
    assert len(fake) == 1 and fake[0].closed  # one env for both sets, closed at the end
    sft, roll = res["sft"], res["rollout"]
    assert (sft.episodes_run, sft.episodes_written, sft.frames) == (4, 2, 6)  # init 0 and 2 succeed at step 3
    ds = open_dataset(tmp_path / "sft")
    assert ds.num_episodes == 2 and sorted(ds.episodes.column("episode_index").to_pylist()) == [0, 1]
    frames = ds.read_frames(np.arange(6), ["sim.init_state", "is_success"])
    assert frames["sim.init_state"].tolist() == [0, 0, 0, 2, 2, 2]
    assert frames["is_success"].tolist() == [False, False, True] * 2
    assert roll.episodes_written == 3 and [r[0] for r in fake[0].resets[4:]] == [17, 18, 19]
    info = json.loads((tmp_path / "rollouts_train" / "meta" / "info.json").read_text())
    assert info["generation"]["cameras"] is False and info["generation"]["observation"].startswith("no images")
    assert info["features"]["observation.object_state"]["shape"] == [5]
    assert info["features"]["action"] == {"dtype": "float32", "shape": [7], "names": gen.ACTION_NAMES}
    assert info["codebase_version"] == "v2.1" and info["robot_type"] == "panda"


def test_an_sft_set_with_no_success_is_one_error_and_nothing_written(fake, tmp_path):
    cfg = gen.LiberoGenConfig(kind="sft", task="libero_spatial/0", episodes=1, init_offset=1, max_steps=4)
    with pytest.raises(SimError, match="no successful episode among 1"):
        gen.generate_libero_dataset(cfg, tmp_path / "sft")
    assert not (tmp_path / "sft").exists()


def test_progress_bar_moves_per_episode_with_rate_successes_and_eta(fake, tmp_path, recorded_progress):
    seen = recorded_progress(gen)
    cfg = gen.LiberoGenConfig(kind="rollout", task="libero_spatial/0", episodes=3, init_offset=0, max_steps=5)
    gen.generate_libero_dataset(cfg, tmp_path / "r")
    assert seen[0] == ("task", "generate LIBERO rollout (libero_spatial/0)", 3)
    assert [s for s in seen if s[0] == "advance"] == [("advance", 1)] * 3
    last = [s[1] for s in seen if s[0] == "show"][-1]
    assert last["rate"].endswith("steps/s, 2/3 ok") and last["eta"] == "00:00:00"


def test_the_sim_cli_routes_libero_ids_and_refuses_a_mix(fake, tmp_path, capsys):
    from reproduction.sim.__main__ import main

    code = main(["generate", "--tasks", "libero_10/0", "FetchPush-v4", "--out", str(tmp_path / "x"), "--no-progress"])
    assert code == 4 and "LIBERO generation takes one LIBERO task" in capsys.readouterr().err
    code = main(
        ["generate", "--tasks", "libero_spatial/0", "--out", str(tmp_path / "d"), "--sft", "2", "--rollouts", "0"]
        + ["--eval", "1", "--max-steps", "4", "--no-progress", "--json"]
    )
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"sft", "eval"} and doc["eval"]["config"]["cameras"] is False  # --cameras none (default)
    assert (tmp_path / "d" / "sft").is_dir() and (tmp_path / "d" / "rollouts_eval").is_dir()
    assert gen.main(["--out", str(tmp_path / "e"), "--task", "libero_goal/1", "--no-progress"]) == 45


def test_run_to_limit_keeps_stepping_after_the_first_success(fake, tmp_path):
    from reproduction.data.reader import open_dataset

    cfg = gen.LiberoGenConfig(
        kind="sft", task="libero_spatial/0", episodes=1, init_offset=0, max_steps=5, stop_on_success=False
    )
    res = gen.generate_libero_dataset(cfg, tmp_path / "sft")
    assert (res.episodes_written, res.frames) == (1, 5)
    got = open_dataset(tmp_path / "sft").read_frames(np.arange(5), ["is_success"])["is_success"]
    assert got.tolist() == [False, False, True, True, True]
