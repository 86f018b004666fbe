"""A mapping a --config file gives replaces the default's and an earlier file's, as a list does (audit58 E2: a file's
`value.model.cameras: {left_wrist_0_rgb: ...}` kept the default `base_0_rgb` too); sections still merge field by
field."""

from __future__ import annotations

from pathlib import Path

from reproduction.recipes.grpo.config import GrpoRunConfig
from reproduction.recipes.recap.config import RunConfig
from reproduction.run.config import load_config, to_plain

WRIST = {"left_wrist_0_rgb": "observation.images.wrist"}


def _file(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _load(files, schema=RunConfig, overrides=()):
    return to_plain(load_config(files, list(overrides), schema=schema))


def test_a_files_mapping_replaces_the_schema_default(tmp_path):
    assert _load([])["value"]["model"]["cameras"] == {"base_0_rgb": "observation.images.image"}  # the default
    one = _file(tmp_path, "a.yaml", "value:\n  model:\n    cameras: {left_wrist_0_rgb: observation.images.wrist}\n")
    assert _load([one])["value"]["model"]["cameras"] == WRIST  # was {base_0_rgb: ..image, left_wrist_0_rgb: ..}
    empty = _file(tmp_path, "e.yaml", "policy:\n  model:\n    cameras: {}\n")
    assert _load([one, empty])["value"]["model"]["cameras"] == WRIST  # a file names only the maps it gives


def test_a_later_files_mapping_replaces_an_earlier_files(tmp_path):
    one = _file(tmp_path, "a.yaml", "value:\n  model: {cameras: {base_0_rgb: observation.images.front}}\n")
    two = _file(tmp_path, "b.yaml", "value:\n  model: {cameras: {left_wrist_0_rgb: observation.images.wrist}}\n")
    assert _load([one, two])["value"]["model"]["cameras"] == WRIST
    assert _load([two, one])["value"]["model"]["cameras"] == {"base_0_rgb": "observation.images.front"}
    # the command line's dotted entry still adds to the file's map (audit58 E1's rule, unchanged)
    both = _load([one, two], overrides=["value.model.cameras.base_0_rgb=observation.images.front"])
    assert both["value"]["model"]["cameras"] == {**WRIST, "base_0_rgb": "observation.images.front"}


def test_grpo_sft_cameras_from_two_files(tmp_path):
    one = _file(tmp_path, "a.yaml", "sft:\n  model: {cameras: {agentview: observation.images.agentview}}\n")
    two = _file(tmp_path, "b.yaml", "sft:\n  model: {cameras: {wrist: observation.images.wrist}}\n")
    assert _load([one], GrpoRunConfig)["sft"]["model"]["cameras"] == {"agentview": "observation.images.agentview"}
    assert _load([one, two], GrpoRunConfig)["sft"]["model"]["cameras"] == {"wrist": "observation.images.wrist"}


def test_a_section_still_merges_field_by_field(tmp_path):
    one = _file(tmp_path, "a.yaml", "value:\n  model: {preset: tiny, folds: 2}\n  train: {max_steps: 7}\n")
    two = _file(tmp_path, "b.yaml", "value:\n  model: {folds: 3}\n")
    value = _load([one, two])["value"]
    assert (value["model"]["preset"], value["model"]["folds"], value["train"]["max_steps"]) == ("tiny", 3, 7)
    assert value["model"]["cameras"] == {"base_0_rgb": "observation.images.image"}  # a map no file names: kept
