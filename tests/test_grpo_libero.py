"""GRPO on LIBERO (bundle/grpo/libero.yaml over config.yaml): a LIBERO task id in rl.tasks / eval.tasks, as RECAP's
eval config names them, is the one change; the config rules that need no LIBERO; and tiny runs through `portable
run` (LIBERO-10 task 0, 2 rl steps of B = 2 x G = 2, eval on 2 init states): on privileged state, and reading
LIBERO's agentview camera at 32 px."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reproduction.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent
CONFIGS = [REPO / "bundle" / "grpo" / "config.yaml", REPO / "bundle" / "grpo" / "libero.yaml"]
TINY = [
    "sft.train.max_steps=20",
    "sft.train.global_batch=64",
    "sft.train.micro_batch=64",
    "rl.steps=2",
    "rl.init_states=2",
    "rl.micro_init_states=2",
    "rl.group_size=2",
    "rl.updates_per_rollout=1",
    "rl.eval_every=2",
    "rl.save_every=2",
    "rl.eval_episodes=2",
    "rl.max_steps=20",
    "rl.rollout_workers=1",
    "eval.episodes_per_task=2",
    "eval.max_steps=20",
    "eval.workers=1",
]


def _load(overrides: list[str], tmp_path: Path):
    from reproduction.recipes.grpo.config import GrpoRunConfig
    from reproduction.run.config import load_config

    return load_config(CONFIGS, overrides, bundle=tmp_path, run_dir=tmp_path / "run", schema=GrpoRunConfig)


def _run_all_stages(bundle: Path, run: Path, overrides: list[str], *, timeout: int) -> dict[str, str]:
    """`portable run BUNDLE --config config.yaml --config libero.yaml --output RUN OVERRIDES` in a subprocess (cwd:
    the run's parent); asserts it ran sft, rl, eval and compare and returns the environment it ran with."""
    configs = [a for c in CONFIGS for a in ("--config", str(c))]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "reproduction.portable", "run", str(bundle), *configs, "--output", str(run), "--json"]
        + overrides,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=run.parent,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    stages = {s["stage"]: s["action"] for s in json.loads(proc.stdout)["stages"]}
    assert stages == dict.fromkeys(("sft", "rl", "eval", "compare"), "ran")
    return env


def test_the_libero_config_loads_and_its_rules_need_no_libero(tmp_path):
    config = _load([], tmp_path)
    assert config.rl.tasks == ["libero_10/0"] and config.eval.tasks == ["libero_10/0"]
    assert config.sft.model.state_keys == ["observation.state", "observation.object_state"]
    for overrides, words in [
        (["rl.tasks=[libero_10/0,FetchPush-v4]"], "rl.tasks mixes LIBERO tasks"),
        (["rl.tasks=[libero_99/0]"], "unknown LIBERO suite"),
        (["rl.tasks=[libero_10/12]"], "out of range"),
        (["eval.tasks=[FetchPush-v4]"], "of different simulators"),
        (["eval.episodes_per_task=51"], "outside 1..50"),
        (["rl.eval_episodes=60"], "past LIBERO's 50 init states"),
        (["rl.tasks=[FetchPush-v4]", "eval.tasks=[FetchPush-v4]", "rl.max_steps=20", "eval.max_steps=null"], "50"),
    ]:
        with pytest.raises(ConfigError) as err:
            _load(overrides, tmp_path)
        assert words in err.value.message, (overrides, err.value.message)


def test_rl_init_states_map_onto_liberos_fixed_init_states():
    from reproduction.recipes.grpo.envs import episode_steps, init_reset

    keys = [init_reset(0, "libero_10/0", i) for i in (0, 1, 49, 50, 51)]
    assert [k[0] for k in keys] == [0, 1, 49, 0, 1]  # init state i % 50
    assert keys[0][1] != keys[3][1]  # the same init state revisited draws other arm noise
    assert init_reset(0, "libero_10/0", 7) == init_reset(0, "libero_10/0", 7) != init_reset(1, "libero_10/0", 7)
    assert isinstance(init_reset(0, "FetchPush-v4", 0), int) and init_reset(0, "FetchPush-v4", 0) % 2 == 0
    assert (
        episode_steps("libero_10/0", None),
        episode_steps("libero_10/0", 20),
        episode_steps("FetchPush-v4", None),
    ) == (
        520,
        20,
        50,
    )


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_tiny_grpo_run_on_libero_through_portable_run(tmp_path):
    from reproduction.sim.libero import INSTALL_HINT, available

    if not available():
        pytest.skip(f"LIBERO is not installed (the libero extra: {INSTALL_HINT})")
    from reproduction.sim.libero.generate import LiberoGenConfig, close_envs, generate_libero_dataset

    bundle = tmp_path / "bundle"  # ${BUNDLE}: libero.yaml reads ${BUNDLE}/data/libero10_task0/sft
    try:  # one scripted-expert demonstration, no cameras (as the RECAP demo's LIBERO tier generates them)
        generate_libero_dataset(
            LiberoGenConfig(kind="sft", episodes=1, cameras=False, max_steps=340),
            bundle / "data" / "libero10_task0" / "sft",
        )
    finally:
        close_envs()
    run = tmp_path / "run"
    env = _run_all_stages(bundle, run, TINY, timeout=500)
    state = json.loads((run / "run.json").read_text())
    assert state["recipe"] == "grpo" and state["stages"]["rl"]["step"] == 2
    policy = json.loads((run / "sft" / "export" / "policy.json").read_text())
    assert len(policy["stats"]["state_mean"]) == 26 and len(policy["stats"]["action_mean"]) == 7
    doc = json.loads((run / "evidence" / "eval_grpo_2.json").read_text())
    assert doc["settings"]["simulator"] == "libero" and doc["settings"]["libero"]["cameras"] is False
    task = doc["tasks"]["libero_10/0"]
    assert task["episodes"] == 2 and task["outcomes"]["init_states"] == [0, 1]
    assert doc["baselines"][0]["policy"]["label"] == "sft"
    live = json.loads((run / "rl" / "evidence" / "eval_rl_2.json").read_text())
    assert live["tasks"]["libero_10/0"]["episodes"] == 2
    metrics = [json.loads(line) for line in (run / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if m["split"] == "train"] == [1, 2]
    verify = subprocess.run(
        [sys.executable, "-m", "reproduction.portable", "lineage", str(run), "--verify"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert verify.returncode == 0, verify.stderr


def test_liberos_cameras_load_and_other_cameras_or_object_state_beside_them_are_refused(tmp_path):
    """A LIBERO run reads LIBERO's camera keys (RLinf/openpi's observation.images.image and .wrist_image; pi05 with
    them); a Fetch camera key, or the privileged object state beside cameras (a rendering LIBERO env observes none),
    is one line naming the field before anything runs (exit 4)."""
    ok = ["sft.model.cameras={base_0_rgb: observation.images.image}", "sft.model.state_keys=[observation.state]"]
    ok.append("sft.model.state_dims=null")
    config = _load(ok, tmp_path)
    assert config.sft.model.cameras == {"base_0_rgb": "observation.images.image"}
    assert _load([*ok, "sft.model.preset=pi05"], tmp_path).sft.model.render_size == 224
    with pytest.raises(ConfigError) as err:
        _load(["sft.model.cameras={base_0_rgb: observation.images.agentview}", *ok[1:]], tmp_path)
    assert "'observation.images.agentview' is not a camera the simulator renders" in err.value.message
    assert "observation.images.image, observation.images.wrist_image" in err.value.message
    assert err.value.exit_code == 4 and err.value.field == "sft.model.cameras" and "\n" not in err.value.message
    with pytest.raises(ConfigError) as err:  # libero.yaml's privileged state keys, with a camera
        _load(ok[:1], tmp_path)
    assert "observes no observation.object_state" in err.value.message and err.value.field == "sft.model.state_keys"
    assert err.value.hint and "sft.model.state_keys=[observation.state]" in err.value.hint
    with pytest.raises(ConfigError) as err:
        _load(["sft.model.preset=pi05"], tmp_path)
    assert "sft.model.preset='pi05' reads cameras" in err.value.message


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_tiny_grpo_run_on_libero_with_a_camera_through_portable_run(tmp_path, request):
    """LIBERO-10 task 0 with tiny reading agentview at 32 px: a scripted demonstration rendered at 32 px, sft, 2 rl
    steps (B = 2 x G = 2, 12-step episodes) whose rollouts render the camera, the live and the final evaluation
    rendering it too; the evidence says which camera at which size."""
    from reproduction.sim.libero import INSTALL_HINT, available

    if not available():
        pytest.skip(f"LIBERO is not installed (the libero extra: {INSTALL_HINT})")
    bundle = tmp_path / "bundle"
    data = bundle / "data" / "libero10_task0" / "sft"
    # one scripted-expert demonstration rendered at 32 px (conftest's libero_sft_32: generated once a session and
    # shared with tests/test_libero_release.py, ~300 rendered steps each file used to render alone)
    request.getfixturevalue("libero_sft_32")(data)
    info = json.loads((data / "meta" / "info.json").read_text())
    assert info["features"]["observation.images.image"]["shape"][:2] == [32, 32]
    run = tmp_path / "run"
    camera = [
        "sft.model.cameras={base_0_rgb: observation.images.image}",
        "sft.model.image_size=32",
        "sft.model.state_keys=[observation.state]",
        "sft.model.state_dims=null",
    ]
    short = [o for o in TINY if not o.startswith(("rl.max_steps", "eval.max_steps"))] + [
        "rl.max_steps=12",
        "eval.max_steps=12",
    ]
    _run_all_stages(bundle, run, short + camera, timeout=800)
    policy = json.loads((run / "sft" / "export" / "policy.json").read_text())
    assert policy["cameras"] == {"base_0_rgb": "observation.images.image"}
    assert len(policy["stats"]["state_mean"]) == 8 and len(policy["stats"]["action_mean"]) == 7
    assert json.loads((run / "run.json").read_text())["stages"]["rl"]["step"] == 2
    for doc in (
        json.loads((run / "evidence" / "eval_grpo_2.json").read_text()),
        json.loads((run / "rl" / "evidence" / "eval_rl_2.json").read_text()),
    ):
        libero = doc["settings"]["libero"]
        assert libero["cameras"] == {"base_0_rgb": "observation.images.image"} and libero["image_size"] == 32
        assert doc["tasks"]["libero_10/0"]["episodes"] == 2
    metrics = [json.loads(line) for line in (run / "rl" / "metrics.jsonl").read_text().splitlines()]
    train = [m for m in metrics if m["split"] == "train"]
    assert [m["step"] for m in train] == [1, 2] and all(m["metrics"]["ratio_mean"] > 0 for m in train)


def test_preflight_names_the_extra_when_libero_is_missing(monkeypatch):
    import reproduction.sim.libero as libero
    from reproduction.recipes.grpo.preflight import task_problems

    monkeypatch.setattr(libero, "available", lambda: False)
    (problem,) = task_problems("rl.tasks", ["libero_10/0"])
    assert problem.exit_code == 10 and "LIBERO is not installed" in problem.message
    assert "[libero]" in problem.hint
    assert task_problems("eval.tasks", ["FetchPush-v4"]) == []
