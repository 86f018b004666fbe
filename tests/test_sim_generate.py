"""Dataset generation: LeRobot v3.0 layout, columns, mode mix, determinism across worker counts."""

from __future__ import annotations

import numpy as np
import pytest

from reproduction.data.reader import open_dataset
from reproduction.errors import InvalidInputError
from reproduction.sim.behaviours import Mode
from reproduction.sim.generate import MIXES, GenConfig, generate_dataset
from reproduction.sim.tasks import TASKS

BOTH = ("FetchPickAndPlace-v4", "FetchPush-v4")


def _cfg(**kw) -> GenConfig:
    base = dict(kind="rollout", tasks=BOTH, episodes_per_task=4, cameras=(), episode_steps=12, unit_episodes=2)
    base.update(kw)
    return GenConfig(**base)


def test_rollout_dataset_columns_tasks_and_outcomes(tmp_path):
    cfg = _cfg(modes={"good": 0.5, "give_up": 0.5})
    res = generate_dataset(cfg, tmp_path / "ds")
    ds = open_dataset(tmp_path / "ds")
    assert ds.info.codebase_version == "v3.0" and ds.info.fps == 25
    assert ds.num_episodes == 8 and ds.num_frames == 8 * 12 == res.frames
    assert sorted(ds.tasks.values()) == sorted(t.language for t in TASKS.values())
    feats = ds.info.features
    assert feats["observation.state"]["shape"] == [11] and feats["observation.state"]["names"][0] == "grip_x"
    assert feats["action"]["shape"] == [4] and feats["is_success"]["dtype"] == "bool"
    assert not ds.camera_keys
    table = ds.frame_table(["episode_index", "task_index", "is_success", "sim.mode", "sim.event", "sim.harm"])
    rows = ds.read_frames(np.arange(ds.num_frames), ["action", "observation.goal"])
    assert rows["action"].shape == (96, 4) and np.abs(rows["action"]).max() <= 1.0
    modes = table.column("sim.mode").to_numpy().reshape(8, 12)
    assert (modes == modes[:, :1]).all()
    assert sorted(modes[:, 0].tolist()) == [Mode.GOOD] * 4 + [Mode.GIVE_UP] * 4
    ep_task = table.column("task_index").to_numpy().reshape(8, 12)[:, 0]
    assert ep_task.tolist() == [0] * 4 + [1] * 4  # task-major episode order
    assert res.per_task["FetchPush-v4"]["episodes"] == 4 and set(res.per_mode) == {"good", "give_up"}
    assert all(res.success_events[k] <= res.events[k] for k in res.success_events)
    gave_up = table.column("sim.event").to_numpy() == 5
    assert gave_up.any() and not table.column("sim.harm").to_numpy()[gave_up].any()


def test_sft_is_all_expert_and_images_when_asked(tmp_path):
    res = generate_dataset(
        _cfg(kind="sft", tasks=("FetchPush-v4",), episodes_per_task=2, cameras=("agentview", "wrist"), image_size=16),
        tmp_path / "sft",
    )
    ds = open_dataset(tmp_path / "sft")
    assert sorted(ds.camera_keys) == ["observation.images.agentview", "observation.images.wrist"]
    imgs = ds.read_frames(np.arange(3), ["observation.images.wrist"])["observation.images.wrist"]
    assert imgs.shape == (3, 16, 16, 3) and imgs.dtype == np.uint8
    assert (ds.frame_table(["sim.mode"]).column("sim.mode").to_numpy() == Mode.EXPERT).all()
    assert res.per_mode == {"expert": {"episodes": 2, "success": res.per_mode["expert"]["success"]}}
    with pytest.raises(InvalidInputError):  # never overwrites silently
        generate_dataset(_cfg(kind="sft", tasks=("FetchPush-v4",), episodes_per_task=1), tmp_path / "sft")


@pytest.mark.slow
def test_same_dataset_for_one_or_two_workers(tmp_path):
    cfg = _cfg(cameras=("agentview",), image_size=16, episodes_per_task=3, unit_episodes=1)
    one = generate_dataset(cfg, tmp_path / "w1", workers=1)
    two = generate_dataset(cfg, tmp_path / "w2", workers=2)
    a, b = open_dataset(tmp_path / "w1"), open_dataset(tmp_path / "w2")
    assert a.fingerprint == b.fingerprint
    cols = ["episode_index", "frame_index", "is_success", "sim.mode", "sim.event", "sim.harm", "sim.reset_seed"]
    assert a.frame_table(cols).equals(b.frame_table(cols))
    keys = ["observation.state", "action", "observation.images.agentview"]
    fa, fb = a.read_frames(np.arange(a.num_frames), keys), b.read_frames(np.arange(b.num_frames), keys)
    for key in keys:
        np.testing.assert_array_equal(fa[key], fb[key])
    assert one.per_mode == two.per_mode and one.events == two.events


def test_mixes_match_demo_lab():
    sft, rollout = MIXES["mix1"].configs(tasks=("FetchPickAndPlace-v4",))
    assert sft.kind == "sft" and sft.episodes_per_task == 50 and rollout.episodes_per_task == 300
    assert rollout.modes == {"good": 0.2, "messy": 0.5, "give_up": 0.15, "short_carry": 0.15}
    sft2, rollout2 = MIXES["mix2"].configs(tasks=("FetchPickAndPlace-v4",))
    assert sft2.episodes_per_task == 20 and rollout2.episodes_per_task == 330
    assert rollout2.behaviour.detours == (1, 4)


def test_cli_unknown_task_is_one_error_line_and_writes_nothing(tmp_path, capsys):
    from reproduction.sim.__main__ import main

    code = main(["generate", "--out", str(tmp_path / "mix"), "--tasks", "FetchSlide-v1", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 45 and err[0].startswith("error: unknown simulator task 'FetchSlide-v1'")
    assert err[1].startswith("hint:") and len(err) == 2
    assert not (tmp_path / "mix").exists()
    assert main(["generate", "--out", str(tmp_path / "m2"), "--cameras", "head", "--no-progress"]) == 4
    assert not (tmp_path / "m2").exists()


def test_cli_eval_expert_json(capsys):
    import json

    from reproduction.sim.__main__ import main

    code = main(["eval", "--policy", "expert", "--episodes", "2", "--tasks", "push", "--json", "--no-progress"])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["tasks"]["FetchPush-v4"]["success_at_end"] == "2/2"


def test_unit_size_does_not_change_the_dataset(tmp_path):
    """Units (how many episodes one env runs in a row) follow the worker count: they must not matter."""
    a = generate_dataset(_cfg(tasks=("FetchPickAndPlace-v4",), unit_episodes=1), tmp_path / "a")
    b = generate_dataset(_cfg(tasks=("FetchPickAndPlace-v4",), unit_episodes=4), tmp_path / "b")
    da, db = open_dataset(a.path), open_dataset(b.path)
    assert da.fingerprint == db.fingerprint
    keys = ["observation.state", "action"]
    ra, rb = da.read_frames(np.arange(da.num_frames), keys), db.read_frames(np.arange(db.num_frames), keys)
    for key in keys:
        np.testing.assert_array_equal(ra[key], rb[key])
