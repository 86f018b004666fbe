"""RECAP's preflight refuses, from the datasets' meta/info.json features alone and before any stage runs (exit 4),
what used to fail after stages had run or train a wrong model without a word (audit54 D1, D3, D4): state features of
different widths across the datasets one model reads, a non-numeric state feature, and a camera key no dataset has
while the datasets do have cameras. Tiny datasets from the project's writer; the preflight function itself, plus one
`portable run` for the exit code and the one-line error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from reproduction.data.writer import EpisodeData, write_dataset
from reproduction.errors import ConfigError
from reproduction.recipes.recap.config import load_config

REPO = Path(__file__).resolve().parent.parent
STAGES = ["returns", "value", "advantages", "policy"]
FIT = [f"{s}.train.{k}=4" for s in ("value", "policy") for k in ("global_batch", "micro_batch")]
"""Batches the 8-frame datasets below can fill (the defaults, 32 and 64, are refused in preflight: audit65_E M1)."""


def _dataset(root: Path, *, state: int = 3, action: int = 2, camera: str | None = None, note: bool = False) -> Path:
    n = 4
    feats = {
        "observation.state": {"dtype": "float32", "shape": [state]},
        "action": {"dtype": "float32", "shape": [action]},
        "is_success": {"dtype": "bool", "shape": [1]},
    }
    frames = {
        "observation.state": np.zeros((n, state), np.float32),
        "action": np.zeros((n, action), np.float32),
        "is_success": np.zeros(n, bool),
    }
    if camera:
        feats[camera] = {"dtype": "image", "shape": [8, 8, 3]}
        frames[camera] = np.zeros((n, 8, 8, 3), np.uint8)
    if note:
        feats["note"] = {"dtype": "string", "shape": [1]}
        frames["note"] = np.array([f"s{i}" for i in range(n)], dtype=object)
    eps = [EpisodeData(episode_index=e, task="pick", frames=frames) for e in range(2)]
    return write_dataset(root, eps, fps=10, features=feats)


def _problems(tmp_path: Path, datasets: str, *overrides: str, stages=STAGES) -> list:
    from reproduction.recipes.recap.recipe import preflight

    config = load_config(None, [f"datasets={datasets}", *FIT, *overrides])
    return [p for p in preflight(config, tmp_path / "run", {}, stages) if "min_free_gb" not in str(p.field or "")]


def _messages(problems: list) -> list[tuple[str, str | None]]:
    assert all(isinstance(p, ConfigError) and p.exit_code == 4 for p in problems), problems
    return [(p.message, p.hint) for p in problems]


def test_value_state_keys_of_different_widths_are_refused_naming_both_datasets(tmp_path):
    a, b = _dataset(tmp_path / "a10", state=3), _dataset(tmp_path / "b30", state=5)
    sets = f"[{{path: {a}, type: rollout}}, {{path: {b}, type: rollout, value: false}}]"  # b only scored
    msgs = _messages(_problems(tmp_path, sets, "value.model.state_keys=[observation.state]", stages=["value"]))
    assert msgs == [
        (
            "value.model.state_keys: observation.state is shape [3] in datasets[0].path (a10) but shape [5] in "
            "datasets[1].path (b30); one model reads both datasets, so its inputs must have one width",
            "name features of one width in every dataset in value.model.state_keys, or drop the odd dataset "
            "(a dataset with value: false is still scored by the value model)",
        )
    ]
    # without state_keys the two datasets are fine for the value stage (as before)
    assert _problems(tmp_path, sets, stages=["value", "advantages"]) == []


def test_policy_default_state_and_action_of_different_widths_are_refused(tmp_path):
    a, b = _dataset(tmp_path / "a10", state=3, action=2), _dataset(tmp_path / "b30", state=5, action=7)
    sets = f"[{{path: {a}, type: rollout}}, {{path: {b}, type: rollout}}]"
    msgs = [m for m, _ in _messages(_problems(tmp_path, sets))]
    assert msgs == [
        "the policy's default state: observation.state is shape [3] in datasets[0].path (a10) but shape [5] in "
        "datasets[1].path (b30); one model reads both datasets, so its inputs must have one width",
        "the policy's action: action is shape [2] in datasets[0].path (a10) but shape [7] in datasets[1].path (b30); "
        "one model reads both datasets, so its inputs must have one width",
    ]
    # b30 not trained on by the policy: nothing to refuse; the policy stage not run: nothing either
    sets_off = f"[{{path: {a}, type: rollout}}, {{path: {b}, type: rollout, policy: false}}]"
    assert _problems(tmp_path, sets_off) == []
    assert _problems(tmp_path, sets, stages=["returns", "value", "advantages"]) == []


def test_a_string_state_feature_is_refused_for_value_and_policy(tmp_path):
    s = _dataset(tmp_path / "strf", note=True)
    sets = f"[{{path: {s}, type: rollout}}]"
    keys = "[observation.state, note]"
    msgs = _messages(_problems(tmp_path, sets, f"value.model.state_keys={keys}", f"policy.model.state_keys={keys}"))
    assert msgs == [
        (
            f"datasets[0].path: dataset {s}: feature 'note' is dtype 'string'; value.model.state_keys takes numeric "
            "features (float, int, bool)",
            "drop note from value.model.state_keys",
        ),
        (
            f"datasets[0].path: dataset {s}: feature 'note' is dtype 'string'; policy.model.state_keys takes numeric "
            "features (float, int, bool)",
            "drop note from policy.model.state_keys",
        ),
    ]
    # numeric extras (bool, int64) stay accepted
    assert _problems(tmp_path, sets, "value.model.state_keys=[observation.state, is_success, task_index]") == []


def test_a_camera_key_no_dataset_has_is_refused_when_the_datasets_have_cameras(tmp_path):
    a = _dataset(tmp_path / "a10", camera="observation.images.front")
    bare = _dataset(tmp_path / "bare")
    sets = f"[{{path: {a}, type: rollout}}, {{path: {bare}, type: rollout}}]"
    # the default value camera (LIBERO's observation.images.image) and a typo in the policy's
    msgs = _messages(_problems(tmp_path, sets, "policy.model.cameras={base_0_rgb: observation.images.frnt}"))
    assert msgs == [
        (
            "value.model.cameras: no dataset has base_0_rgb = observation.images.image (the datasets' image/video "
            "features: observation.images.front), so the model would train without any image",
            "set value.model.cameras={base_0_rgb: observation.images.front} (a feature the datasets have), or "
            "value.model.cameras={base_0_rgb: observation.images.none} for no image",
        ),
        (
            "policy.model.cameras: no dataset has base_0_rgb = observation.images.frnt (the datasets' image/video "
            "features: observation.images.front), so the model would train without any image",
            "set policy.model.cameras={base_0_rgb: observation.images.front} (a feature the datasets have), or "
            "policy.model.cameras={} for no image",
        ),
    ]
    # two slots that both miss: one line naming both
    two = "value.model.cameras={base_0_rgb: observation.images.frnt, left_wrist_0_rgb: observation.images.wrist}"
    (problem,) = _problems(tmp_path, sets, two, stages=["value"])
    assert problem.message.startswith(
        "value.model.cameras: no dataset has base_0_rgb = observation.images.frnt, left_wrist_0_rgb = "
        "observation.images.wrist (the datasets'"
    )
    # a slot no dataset has beside one that is read: the absent camera, as upstream's wrist slot on one-camera data
    one = "value.model.cameras={base_0_rgb: observation.images.front, left_wrist_0_rgb: observation.images.wrist}"
    assert _problems(tmp_path, sets, one) == []
    # a key one dataset has (the other lacks it: an absent camera there), and the demo's deliberate no-image key
    ok = "value.model.cameras={base_0_rgb: observation.images.front}"
    assert _problems(tmp_path, sets, ok) == []
    assert _problems(tmp_path, sets, "value.model.cameras={base_0_rgb: observation.images.none}") == []
    # state-only datasets (no image feature anywhere): the model has no image either way, the default is kept
    assert _problems(tmp_path, f"[{{path: {bare}, type: rollout}}]") == []


def test_portable_run_stops_before_any_stage_with_exit_4(tmp_path):
    a, b = _dataset(tmp_path / "a10", state=3), _dataset(tmp_path / "b30", state=5)
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "reproduction.portable", "run", "--output", str(out), "--stages", "returns,value"]
        + [f"datasets=[{{path: {a}, type: rollout}}, {{path: {b}, type: rollout}}]"]
        + ["value.model.state_keys=[observation.state]", "value.model.cameras={base_0_rgb: observation.images.none}"]
        + FIT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "HOME": str(tmp_path)},
    )
    assert proc.returncode == 4, proc.stderr
    assert proc.stderr.splitlines()[0] == (
        "error: value.model.state_keys: observation.state is shape [3] in datasets[0].path (a10) but shape [5] in "
        "datasets[1].path (b30); one model reads both datasets, so its inputs must have one width"
    )
    assert not (out / "returns").exists()


def _extra(root: Path, *, state: int, extra: int) -> Path:
    """A dataset with observation.state of width `state` and a float feature `extra` of width `extra`."""
    n = 4
    frames = {
        "observation.state": np.zeros((n, state), np.float32),
        "extra": np.zeros((n, extra), np.float32),
        "action": np.zeros((n, 2), np.float32),
        "is_success": np.zeros(n, bool),
    }
    feats = {k: {"dtype": str(v.dtype), "shape": list(v.shape[1:]) or [1]} for k, v in frames.items()}
    eps = [EpisodeData(episode_index=e, task="pick", frames=frames) for e in range(2)]
    return write_dataset(root, eps, fps=10, features=feats)


def test_a_state_dims_index_past_the_state_width_is_refused_for_value_and_policy(tmp_path):
    # audit54 RV4: used to pass preflight and stop the value/policy stage only after the stages before it ran
    a, b = _dataset(tmp_path / "a10", state=8), _dataset(tmp_path / "b30", state=3)
    sets = f"[{{path: {a}, type: rollout}}, {{path: {b}, type: rollout}}]"
    dims = [f"{s}.model.state_keys=[observation.state]" for s in ("value", "policy")]
    dims += [f"{s}.model.state_dims=[0,7]" for s in ("value", "policy")]
    msgs = _messages(_problems(tmp_path, sets, *dims))
    assert msgs == [
        (
            f"{s}.model.state_dims: index 7 of [0, 7] is past the 3 components of observation.state (shape [3], "
            "width 3) in datasets[1].path (b30)",
            f"keep {s}.model.state_dims below 3, or add the feature holding component 7 to {s}.model.state_keys",
        )
        for s in ("value", "policy")
    ]
    # indices within every dataset's width: accepted although the widths differ past the picked components
    ok = [d.replace("[0,7]", "[0,2]") for d in dims]
    assert _problems(tmp_path, sets, *ok) == []
    # the value stage not run, the policy's dataset in range: nothing to refuse
    sets_off = f"[{{path: {a}, type: rollout}}, {{path: {b}, type: rollout, policy: false}}]"
    assert _problems(tmp_path, sets_off, *dims, stages=["returns", "policy"]) == []


def test_state_dims_landing_on_different_features_across_datasets_are_refused(tmp_path):
    # index 3 is extra[0] where observation.state has width 3 but observation.state[3] where it has width 5
    a, b = _extra(tmp_path / "a10", state=3, extra=4), _extra(tmp_path / "b30", state=5, extra=2)
    sets = f"[{{path: {a}, type: rollout}}, {{path: {b}, type: rollout}}]"
    keys = "value.model.state_keys=[observation.state, extra]"
    (msg,) = _messages(_problems(tmp_path, sets, keys, "value.model.state_dims=[0,3]", stages=["value"]))
    assert msg[0] == (
        "value.model.state_keys: observation.state is shape [3] in datasets[0].path (a10) but shape [5] in "
        "datasets[1].path (b30); one model reads both datasets, so its inputs must have one width"
    )
    # picks inside the first feature of both: the same components, accepted
    assert _problems(tmp_path, sets, keys, "value.model.state_dims=[0,2]", stages=["value"]) == []
    # the picks' features of one width, the last feature's width differing: accepted
    c = _extra(tmp_path / "c20", state=3, extra=6)
    sets_c = f"[{{path: {a}, type: rollout}}, {{path: {c}, type: rollout}}]"
    assert _problems(tmp_path, sets_c, keys, "value.model.state_dims=[0,3,6]", stages=["value"]) == []


def test_portable_run_refuses_an_out_of_range_state_dims_with_exit_4(tmp_path):
    a = _dataset(tmp_path / "a10", state=3)
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "reproduction.portable", "run", "--output", str(out), "--stages", "returns,value"]
        + [f"datasets=[{{path: {a}, type: rollout}}]", "value.model.state_keys=[observation.state]"]
        + ["value.model.state_dims=[0,7]", "value.model.cameras={base_0_rgb: observation.images.none}"]
        + FIT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "HOME": str(tmp_path)},
    )
    assert proc.returncode == 4, proc.stderr
    assert proc.stderr.splitlines()[:2] == [
        "error: value.model.state_dims: index 7 of [0, 7] is past the 3 components of observation.state (shape [3], "
        "width 3) in datasets[0].path (a10)",
        "hint: keep value.model.state_dims below 3, or add the feature holding component 7 to value.model.state_keys",
    ]
    assert not (out / "returns").exists()
