"""audit63 M2: RECAP's `policy.model.cameras` naming a camera the eval world cannot render (Fetch data whose camera
is observation.images.front) trained returns, value, advantages and the policy and was refused only by the eval
stage; its hint (map the slot to observation.images.agentview) was then refused by preflight, whose hint (set it back
to front) was the value that failed at eval. Now preflight refuses the map (exit 4, field policy.model.cameras,
before any stage runs) whenever eval is selected, naming the key, the camera, the world and what it renders, with a
way out that passes when followed; the eval stage's hint says the data must hold the camera. Tiny datasets from the
project's writer; `portable run` for the exit code and what is (not) written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from reproduction.data.writer import EpisodeData, write_dataset
from reproduction.errors import ConfigError
from reproduction.recipes.recap.config import load_config

REPO = Path(__file__).resolve().parent.parent
ALL = ["returns", "value", "advantages", "policy", "eval", "compare"]
FETCH_RENDERS = "observation.images.agentview, observation.images.wrist"
WITHOUT_EVAL = (
    "train the policy without eval and compare: portable run ... --stages returns,value,advantages,policy "
    "(nothing was started or written)"
)


def _dataset(root: Path, *cameras: str, state: int = 11, goal: int = 3, action: int = 4) -> Path:
    n = 6
    feats = {
        "observation.state": {"dtype": "float32", "shape": [state]},
        "action": {"dtype": "float32", "shape": [action]},
        "is_success": {"dtype": "bool", "shape": [1]},
    }
    rng = np.random.default_rng(0)
    frames = {
        "observation.state": rng.normal(size=(n, state)).astype(np.float32),
        "action": rng.uniform(-1, 1, size=(n, action)).astype(np.float32),
        "is_success": np.array([False] * (n - 1) + [True]),
    }
    if goal:
        feats["observation.goal"] = {"dtype": "float32", "shape": [goal]}
        frames["observation.goal"] = rng.normal(size=(n, goal)).astype(np.float32)
    for cam in cameras:
        feats[cam] = {"dtype": "image", "shape": [16, 16, 3]}
        frames[cam] = rng.integers(0, 255, size=(n, 16, 16, 3), dtype=np.uint8)
    eps = [EpisodeData(episode_index=e, task="push", frames=frames) for e in range(2)]
    return write_dataset(root, eps, fps=10, features=feats)


def _problems(tmp_path: Path, path: Path, *overrides: str, stages=ALL) -> list:
    from reproduction.recipes.recap.recipe import preflight

    config = load_config(None, [f"datasets=[{{path: {path}, type: rollout}}]", *overrides])
    return [p for p in preflight(config, tmp_path / "run", {}, stages) if "cameras" in str(p.field)]


CAM = "value.model.cameras={base_0_rgb: observation.images.front}"


def test_a_policy_camera_fetch_does_not_render_is_refused_in_preflight(tmp_path):
    d = _dataset(tmp_path / "front", "observation.images.front")
    (p,) = _problems(tmp_path, d, CAM, "policy.model.cameras={base_0_rgb: observation.images.front}")
    assert isinstance(p, ConfigError) and p.exit_code == 4 and p.field == "policy.model.cameras"
    assert p.message == (
        "policy.model.cameras: base_0_rgb = observation.images.front is not a camera Fetch renders (it renders "
        f"{FETCH_RENDERS}), so the Fetch tasks of eval.tasks (FetchPickAndPlace-v4) could not run the policy"
    )
    assert p.hint == (
        "train on data holding a camera Fetch renders (the policy datasets hold: observation.images.front), or "
        + WITHOUT_EVAL
    )
    # the way out: the same map with eval left out passes
    assert (
        _problems(tmp_path, d, CAM, "policy.model.cameras={base_0_rgb: observation.images.front}", stages=ALL[:4]) == []
    )


def test_the_hint_maps_the_slot_to_a_camera_the_data_have_and_fetch_renders(tmp_path):
    d = _dataset(tmp_path / "two", "observation.images.front", "observation.images.wrist")
    two = "policy.model.cameras={base_0_rgb: observation.images.front, left_wrist_0_rgb: observation.images.fish}"
    (p,) = _problems(tmp_path, d, CAM, two)
    assert p.message.startswith(
        "policy.model.cameras: base_0_rgb = observation.images.front, left_wrist_0_rgb = observation.images.fish are "
        f"not cameras Fetch renders (it renders {FETCH_RENDERS})"
    )
    fix = "policy.model.cameras={base_0_rgb: observation.images.wrist}"
    assert p.hint == f"set {fix} (cameras the data have and Fetch renders), or " + WITHOUT_EVAL
    assert _problems(tmp_path, d, CAM, fix) == []  # followed: accepted


def test_the_preflight_hint_for_a_camera_the_data_lack_no_longer_points_back_at_the_refused_map(tmp_path):
    """The other half of the circle: agentview on front-only data ("no dataset has") said `set front`."""
    d = _dataset(tmp_path / "front", "observation.images.front")
    (p,) = _problems(tmp_path, d, CAM, "policy.model.cameras={base_0_rgb: observation.images.agentview}")
    assert p.message.startswith("policy.model.cameras: no dataset has base_0_rgb = observation.images.agentview")
    assert p.hint == (
        "set policy.model.cameras={} for no image (the eval stage's Fetch renders none of the datasets' cameras), "
        "or map base_0_rgb to observation.images.front and " + WITHOUT_EVAL
    )
    assert _problems(tmp_path, d, CAM, "policy.model.cameras={}") == []
    # without eval the old hint (the data's camera) stands, and is accepted
    (q,) = _problems(
        tmp_path, d, CAM, "policy.model.cameras={base_0_rgb: observation.images.agentview}", stages=ALL[:4]
    )
    assert q.hint.startswith("set policy.model.cameras={base_0_rgb: observation.images.front} (a feature the")
    # with a camera Fetch renders in the data, that one is named (a typo: both checks speak, with one way out)
    both = _dataset(tmp_path / "both", "observation.images.front", "observation.images.agentview")
    r, s = _problems(tmp_path, both, CAM, "policy.model.cameras={base_0_rgb: observation.images.agentvew}")
    assert r.hint.startswith(
        "set policy.model.cameras={base_0_rgb: observation.images.agentview} (a feature the datasets have and Fetch "
        "renders)"
    )
    assert s.message.startswith("policy.model.cameras: base_0_rgb = observation.images.agentvew is not a camera Fetch")
    assert s.hint.startswith("set policy.model.cameras={base_0_rgb: observation.images.agentview} (cameras the data")
    assert _problems(tmp_path, both, CAM, "policy.model.cameras={base_0_rgb: observation.images.agentview}") == []


def test_libero_world_cameras(tmp_path):
    """LIBERO renders RLinf/openpi's two keys, none with eval.libero.cameras false (no LIBERO install needed)."""
    d = _dataset(
        tmp_path / "lib", "observation.images.image", "observation.images.agentview", state=8, goal=0, action=7
    )
    lib = ["eval.tasks=[libero_10/0]", "value.model.cameras={base_0_rgb: observation.images.image}"]
    (p,) = _problems(tmp_path, d, *lib, "policy.model.cameras={base_0_rgb: observation.images.agentview}")
    assert p.message == (
        "policy.model.cameras: base_0_rgb = observation.images.agentview is not a camera LIBERO renders (it renders "
        "observation.images.image, observation.images.wrist_image), so the LIBERO tasks of eval.tasks (libero_10/0) "
        "could not run the policy"
    )
    assert p.hint.startswith("set policy.model.cameras={base_0_rgb: observation.images.image} (cameras the data")
    assert _problems(tmp_path, d, *lib, "policy.model.cameras={base_0_rgb: observation.images.image}") == []
    off = [*lib, "eval.libero.cameras=false", "policy.model.cameras={base_0_rgb: observation.images.image}"]
    (q,) = _problems(tmp_path, d, *off)
    assert q.message.startswith(
        "policy.model.cameras: base_0_rgb = observation.images.image is not a camera LIBERO renders (it renders "
        "none: eval.libero.cameras is false)"
    )
    assert q.hint == (
        "set eval.libero.cameras=true (LIBERO then renders observation.images.image, observation.images.wrist_image)"
        ", or set policy.model.cameras={} for a policy without images, or " + WITHOUT_EVAL
    )
    assert _problems(tmp_path, d, *off, "eval.libero.cameras=true") == []
    assert _problems(tmp_path, d, *off, "policy.model.cameras={}") == []


def _config(tmp_path: Path, data: Path, policy_camera: str) -> Path:
    tiny = {"max_steps": 2, "global_batch": 4, "micro_batch": 4, "launcher": "inprocess", "device": "cpu"}
    tiny |= {"save_interval": 2, "log_interval": 1}
    cfg = {
        "datasets": [{"path": str(data), "type": "rollout"}],
        "value": {
            "model": {"preset": "tiny", "cameras": {"base_0_rgb": "observation.images.front"}, "augment": False}
            | {"state_keys": ["observation.state", "observation.goal"], "folds": 2, "eval_max_samples": 8},
            "train": tiny,
            "infer": {"batch_size": 8, "workers": 1, "device": "cpu"},
        },
        "advantages": {"lookahead": 2},
        "policy": {
            "modes": ["recap"],
            "model": {"preset": "tiny", "chunk": 2, "execute_steps": 1, "num_steps": 1, "image_size": 16}
            | {"cameras": {"base_0_rgb": policy_camera}},
            "train": tiny,
        },
        "eval": {"tasks": ["FetchPush-v4"], "episodes_per_task": 1, "guidance_scales": [1.0], "workers": 1},
    }
    path = tmp_path / f"run_{policy_camera.rsplit('.', 1)[-1]}.yaml"
    path.write_text(json.dumps(cfg))  # JSON is YAML
    return path


def _run(tmp_path: Path, out: Path, config: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "reproduction.portable", "run", "--output", str(out), "--config", str(config), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=400,
        env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "HOME": str(tmp_path)},
    )


def _nothing_ran(out: Path) -> None:
    record = out / "run.json"
    if record.exists():
        stages = json.loads(record.read_text()).get("stages") or {}
        assert not [s for s, v in stages.items() if (v or {}).get("status") == "complete"], stages
    for stage in ALL:
        folder = out / stage
        assert not folder.exists() or not any(folder.iterdir()), f"{stage} has outputs"


def test_portable_run_refuses_it_with_exit_4_before_any_stage_and_the_hint_works(tmp_path):
    data = _dataset(tmp_path / "front", "observation.images.front")
    config = _config(tmp_path, data, "observation.images.front")
    out = tmp_path / "run"
    proc = _run(tmp_path, out, config)
    assert proc.returncode == 4, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0] == (
        "error: policy.model.cameras: base_0_rgb = observation.images.front is not a camera Fetch renders (it renders "
        f"{FETCH_RENDERS}), so the Fetch tasks of eval.tasks (FetchPush-v4) could not run the policy"
    )
    assert lines[1].startswith("hint: train on data holding a camera Fetch renders")
    assert "--stages returns,value,advantages,policy" in lines[1]
    assert "Traceback" not in proc.stderr
    _nothing_ran(out)
    # the hint followed: the same config, trained without eval, runs every stage it names
    done = _run(tmp_path, out, config, "--stages", "returns,value,advantages,policy")
    assert done.returncode == 0, done.stderr
    stages = json.loads((out / "run.json").read_text())["stages"]
    assert {s: stages[s]["status"] for s in ALL[:4]} == dict.fromkeys(ALL[:4], "complete")
    # the other half of the circle, through the CLI: a camera the data lack names no refused map
    lacking = _run(tmp_path, tmp_path / "run2", _config(tmp_path, data, "observation.images.agentview"))
    assert lacking.returncode == 4, lacking.stderr
    assert "set policy.model.cameras={} for no image" in lacking.stderr
    assert "{base_0_rgb: observation.images.front}" not in lacking.stderr
    _nothing_ran(tmp_path / "run2")


# -- the eval stage: an export trained elsewhere on a camera Fetch does not render ---------------------------------


def test_the_eval_stage_hint_says_the_data_must_hold_the_camera(tmp_path, monkeypatch):
    from reproduction.recap.policy.config import EXPORT_FORMAT, EXPORT_META
    from reproduction.recipes.recap.policy import evaluate_exports
    from reproduction.sim import evaluate as fetch_eval

    export = tmp_path / "export"
    export.mkdir()
    meta = {
        "format_version": EXPORT_FORMAT,
        "mode": "recap",
        "preset": "tiny",
        "cameras": {"base_0_rgb": "observation.images.front"},
        "tasks": ["push"],
        "stats": {"state_mean": [0.0] * 14, "action_mean": [0.0] * 4},
    }
    (export / EXPORT_META).write_text(json.dumps(meta))

    def never(*a, **k):
        raise AssertionError("an evaluation started")

    monkeypatch.setattr(fetch_eval, "evaluate_many", never)
    cfg = load_config(overrides=["eval.tasks=[FetchPush-v4]", "eval.episodes_per_task=2", "policy.modes=[recap]"])
    with pytest.raises(ConfigError) as err:
        evaluate_exports(cfg, {"recap": (export, 2)}, tmp_path / "eval", tmp_path)
    assert err.value.exit_code == 4
    assert err.value.message == (
        f"the recap policy export {export} (policy.json cameras): 'observation.images.front' is not a camera the "
        f"simulator renders (valid: {FETCH_RENDERS})"
    )
    assert err.value.hint == (
        f"a policy reads the cameras it was trained on: train it on data that hold one of {FETCH_RENDERS}, with "
        "policy.model.cameras mapping its slots to them, or leave eval out (portable run ... --stages "
        "returns,value,advantages,policy)"
    )
    assert "map each slot" not in err.value.hint
