"""audit55 E3/E4/E6: RECAP's preflight (exit 4, before any stage runs) refuses camera maps the user wrote on data
without any camera (--no-cameras LIBERO data under the release config trained on placeholders only and claimed two
cameras), a policy.model.state_keys feature a policy dataset lacks (found only at the policy stage, after value and
advantages trained), and an eval.libero.image_size past the generator's 512."""

from __future__ import annotations

from pathlib import Path

import pytest

from reproduction.errors import ConfigError
from reproduction.recipes.recap.config import load_config
from tests.test_recap_preflight_audit54 import STAGES, _dataset, _messages, _problems

RELEASE_CAMS = "{base_0_rgb: observation.images.image, left_wrist_0_rgb: observation.images.wrist_image}"


def test_camera_maps_on_camera_free_data_are_refused_naming_datasets_keys_and_the_way_out(tmp_path):
    a, b = _dataset(tmp_path / "sft"), _dataset(tmp_path / "rollouts_train", note=True)  # two, not one twice
    sets = f"[{{path: {a}, type: sft}}, {{path: {b}, type: rollout}}]"
    got = _messages(
        _problems(
            tmp_path,
            sets,
            f"value.model.cameras={RELEASE_CAMS}",
            f"policy.model.cameras={RELEASE_CAMS}",
            "eval.tasks=[libero_10/0]",
        )
    )
    slots = "base_0_rgb = observation.images.image, left_wrist_0_rgb = observation.images.wrist_image"
    where = "datasets[0].path (sft), datasets[1].path (rollouts_train)"
    way = "generate the data with cameras (the LIBERO generator without --no-cameras), or set "
    assert got == [
        (
            f"value.model.cameras: names {slots}, but no dataset it reads has any image or video feature ({where}), "
            "so the model would train without any image",
            way + "value.model.cameras={base_0_rgb: observation.images.none} for no image",
        ),
        (
            f"policy.model.cameras: names {slots}, but no dataset it reads has any image or video feature ({where}), "
            "so the model would train without any image",
            way + "policy.model.cameras={} and eval.libero.cameras=false for no image",
        ),
    ]


def test_camera_free_data_keep_the_no_image_idioms_the_default_and_one_absent_camera(tmp_path):
    a = _dataset(tmp_path / "a")
    sets = f"[{{path: {a}, type: rollout}}]"
    # the demo tiers' idioms, and value's default camera (the documented absent camera on state-only data)
    assert _problems(tmp_path, sets, "value.model.cameras={base_0_rgb: observation.images.none}") == []
    assert _problems(tmp_path, sets) == []
    # a dataset with one of the two cameras: the other slot is the documented absent camera
    c = _dataset(tmp_path / "c", camera="observation.images.image")
    cams = f"[{{path: {c}, type: rollout}}]"
    assert (
        _problems(tmp_path, cams, f"value.model.cameras={RELEASE_CAMS}", f"policy.model.cameras={RELEASE_CAMS}") == []
    )
    # not refused for a stage the run skips
    assert _problems(tmp_path, sets, f"policy.model.cameras={RELEASE_CAMS}", stages=["returns", "value"]) == []


def test_a_policy_state_key_a_policy_dataset_lacks_is_refused_naming_dataset_key_and_features(tmp_path):
    a, b = _dataset(tmp_path / "a"), _dataset(tmp_path / "b", note=True)
    sets = f"[{{path: {a}, type: sft}}, {{path: {b}, type: rollout}}]"
    got = _messages(_problems(tmp_path, sets, "policy.model.state_keys=[observation.state, observation.object_state]"))
    assert got == [
        (
            f"policy.model.state_keys: datasets[{i}].path: dataset {d} has no 'observation.object_state' "
            "(its numeric features: action, is_success, observation.state)",
            "name features every policy: true dataset has in policy.model.state_keys, or set "
            f"datasets[{i}].policy=false",
        )
        for i, d in enumerate((a, b))
    ]
    # a dataset the policy does not read is not asked, nor is any when the run skips the policy stage
    off = f"[{{path: {a}, type: sft}}, {{path: {b}, type: rollout, policy: false}}]"
    assert len(_problems(tmp_path, off, "policy.model.state_keys=[observation.state, observation.object_state]")) == 1
    keys = "policy.model.state_keys=[observation.state, observation.object_state]"
    assert _problems(tmp_path, sets, keys, stages=["returns", "value", "advantages"]) == []
    assert _problems(tmp_path, sets, "policy.model.state_keys=[observation.state]", stages=STAGES) == []


@pytest.mark.parametrize("size", [7, 513, 4096])
def test_eval_libero_image_size_outside_the_generators_range_is_refused(size):
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"eval.libero.image_size={size}"])
    assert err.value.exit_code == 4 and err.value.field == "eval.libero.image_size"
    assert str(size) in err.value.message


@pytest.mark.parametrize("size", [8, 256, 512])
def test_eval_libero_image_size_within_the_generators_range_loads(size):
    assert load_config(None, [f"eval.libero.image_size={size}"]).eval.libero.image_size == size


def test_the_refusals_are_config_errors_of_exit_4(tmp_path: Path):
    a = _dataset(tmp_path / "a")
    probs = _problems(tmp_path, f"[{{path: {a}, type: rollout}}]", f"policy.model.cameras={RELEASE_CAMS}")
    assert [(type(p), p.exit_code, p.field) for p in probs] == [(ConfigError, 4, "policy.model.cameras")]
