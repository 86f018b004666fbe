"""A mapping given whole on the command line replaces the node, as a list does (audit58 E1): `policy.model.cameras={}`
was merged into the --config file's cameras (and the schema's default), so it did nothing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from reproduction import portable
from reproduction.data.writer import EpisodeData, write_dataset
from reproduction.errors import ConfigError
from reproduction.recipes.grpo.config import GrpoRunConfig
from reproduction.recipes.grpo.recipe import GRPO
from reproduction.recipes.recap.config import RunConfig
from reproduction.recipes.recap.recipe import POLICY_STAGES, RECAP
from reproduction.run.config import load_config, to_plain
from reproduction.run.stage_keys import key_parts

FRONT = {"base_0_rgb": "observation.images.front"}
WRIST = {"left_wrist_0_rgb": "observation.images.wrist"}
WRIST_FLOW = "{left_wrist_0_rgb: observation.images.wrist}"


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return path


@pytest.fixture
def cfg(tmp_path):
    return _config(
        tmp_path,
        "value:\n  model: {cameras: {base_0_rgb: observation.images.front}}\n"
        "policy:\n  model: {cameras: {base_0_rgb: observation.images.front}}\n",
    )


def _cameras(files, overrides, schema=RunConfig):
    return to_plain(load_config(files, overrides, schema=schema))


@pytest.mark.parametrize(
    ("overrides", "policy", "value"),
    [
        (["policy.model.cameras={}"], {}, FRONT),
        (["policy.model.cameras={left_wrist_0_rgb: observation.images.wrist}"], WRIST, FRONT),
        (["value.model.cameras={left_wrist_0_rgb: observation.images.wrist}"], FRONT, WRIST),
        (["policy.model.cameras.left_wrist_0_rgb=observation.images.wrist"], {**FRONT, **WRIST}, FRONT),
        # in order: a later whole map drops an earlier entry, a later entry adds to an earlier whole map
        (["policy.model.cameras.x=y", f"policy.model.cameras={WRIST_FLOW}"], WRIST, FRONT),
        (["policy.model.cameras={}", "policy.model.cameras.left_wrist_0_rgb=observation.images.wrist"], WRIST, FRONT),
        # a section given as a mapping keeps its other fields; the mapping it names is replaced
        (["policy.model={cameras: {}}"], {}, FRONT),
        (["policy={model: {cameras: {left_wrist_0_rgb: observation.images.wrist}}}"], WRIST, FRONT),
    ],
)
def test_a_whole_mapping_replaces_the_files(cfg, overrides, policy, value):
    plain = _cameras([cfg], overrides)
    assert plain["policy"]["model"]["cameras"] == policy
    assert plain["value"]["model"]["cameras"] == value


def test_a_section_given_as_a_mapping_keeps_the_fields_it_does_not_name(tmp_path):
    path = _config(tmp_path, "policy:\n  model: {cameras: {a: b}, chunk: 7}\n")
    model = _cameras([path], ["policy.model={cameras: {}}"])["policy"]["model"]
    assert model["cameras"] == {} and model["chunk"] == 7


def test_a_whole_mapping_replaces_the_schema_default():
    cameras = _cameras([], ["value.model.cameras={left_wrist_0_rgb: observation.images.wrist}"])["value"]["model"]
    assert cameras["cameras"] == WRIST  # the default's base_0_rgb = observation.images.image was kept


def test_an_empty_value_map_is_refused_not_ignored(cfg):
    # the value model needs a camera slot: `={}` now reaches its rule (it was silently the file's map)
    with pytest.raises(ConfigError, match=r"value.model.cameras=\{\} maps no model slot"):
        _cameras([cfg], ["value.model.cameras={}"])


def test_grpo_sft_cameras_are_replaced_too(tmp_path):
    path = _config(tmp_path, "sft:\n  model: {cameras: {agentview: observation.images.agentview}}\n")
    assert _cameras([path], ["sft.model.cameras={}"], GrpoRunConfig)["sft"]["model"]["cameras"] == {}
    assert _cameras([path], ["sft.model.cameras={wrist: observation.images.wrist}"], GrpoRunConfig)["sft"]["model"][
        "cameras"
    ] == {"wrist": "observation.images.wrist"}
    both = _cameras([path], ["sft.model.cameras.wrist=observation.images.wrist"], GrpoRunConfig)
    assert both["sft"]["model"]["cameras"] == {
        "agentview": "observation.images.agentview",
        "wrist": "observation.images.wrist",
    }


def _config_key(recipe, stage: str, plain: dict) -> dict:
    spec = next(s for s in (*recipe.stages, *POLICY_STAGES) if s.name == stage)
    return key_parts(spec, plain, {}, {n: "x" for n in spec.needs})["config"]


def test_the_stage_keys_follow_the_replaced_map(cfg, tmp_path):
    before = _cameras([cfg], [])
    after = _cameras([cfg], ["policy.model.cameras={}", "value.model.cameras={a: observation.images.wrist}"])
    assert _config_key(RECAP, "policy", after)["policy"]["model"]["cameras"] == {}
    assert _config_key(RECAP, "policy", before) != _config_key(RECAP, "policy", after)
    assert _config_key(RECAP, "value", after)["value.model"]["cameras"] == {"a": "observation.images.wrist"}
    grpo = _config(tmp_path, "sft:\n  model: {cameras: {agentview: observation.images.agentview}}\n")
    g_before = _cameras([grpo], [], GrpoRunConfig)
    g_after = _cameras([grpo], ["sft.model.cameras={}"], GrpoRunConfig)
    assert _config_key(GRPO, "sft", g_after)["sft"]["model"]["cameras"] == {}
    assert _config_key(GRPO, "sft", g_before) != _config_key(GRPO, "sft", g_after)


def test_an_override_error_still_names_the_key_and_the_file(cfg, tmp_path):
    with pytest.raises(ConfigError) as err:
        _cameras([cfg], ["policy.model.cameras={b: {c: 1}}"])
    assert err.value.message == (
        "command line: config key `policy.model.cameras.b`: Cannot convert 'dict' to string: '{'c': 1}'"
    )
    with pytest.raises(ConfigError) as err:
        _cameras([cfg], ["policy.model.camras={}"])
    assert err.value.message.startswith("command line: unknown config key `policy.model.camras`")
    with pytest.raises(ConfigError) as err:  # the map the rule refuses is the command line's, not the file's
        _cameras([cfg], ["value.model.cameras={}"])
    assert err.value.message.startswith("command line: value.model.cameras={} maps no model slot")
    bad = _config(tmp_path, "policy:\n  model: {cameras: {b: {c: 1}}}\n")
    with pytest.raises(ConfigError) as err:  # a file's bad map still names the file
        _cameras([bad], ["value.model.cameras={a: observation.images.wrist}"])
    assert err.value.message.startswith(f"{bad}: config key `policy.model.cameras.b`")


def _rollout(root: Path) -> Path:
    eps = [
        EpisodeData(
            episode_index=e,
            task="t",
            frames={"observation.state": np.zeros((n, 2), np.float32), "is_success": np.full(n, e == 0)},
        )
        for e, n in enumerate([3, 4])
    ]
    features = {"observation.state": {"dtype": "float32", "shape": [2]}, "is_success": {"dtype": "bool", "shape": [1]}}
    return write_dataset(root, eps, fps=10, features=features, version="v2.1")


def test_print_config_and_run_json_record_the_replaced_map(cfg, tmp_path, capsys):
    data = _rollout(tmp_path / "ds")
    args = ["--config", str(cfg), f"datasets=[{{path: {data}, type: rollout}}]", "policy.model.cameras={}"]
    args += ["value.model.cameras={left_wrist_0_rgb: observation.images.wrist}"]
    capsys.readouterr()
    assert portable.main(["run", "--output", str(tmp_path / "p"), "--print-config", *args]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["policy"]["model"]["cameras"] == {} and printed["value"]["model"]["cameras"] == WRIST
    out = tmp_path / "run"
    assert portable.main(["run", "--output", str(out), "--stages", "returns", "--no-progress", *args]) == 0
    recorded = json.loads((out / "run.json").read_text())["config"]
    assert recorded["policy"]["model"]["cameras"] == {} and recorded["value"]["model"]["cameras"] == WRIST
