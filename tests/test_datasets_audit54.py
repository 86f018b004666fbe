"""audit54 D6 (one dataset listed twice), D2 (codebase_version advice) and D5 (what a relative dataset path is
relative to): RECAP's and GRPO's preflight functions on tests/fixtures/run_v1_recap's tiny dataset, info_from_dict,
and the config docs. Nothing trains."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from reproduction.data.duplicates import duplicate_dataset_problems
from reproduction.data.info import info_from_dict
from reproduction.errors import ConfigError, UnsupportedFormatError
from reproduction.recipes.recap.config import load_config as load_recap

REPO = Path(__file__).resolve().parent.parent
ROLLOUTS = REPO / "tests" / "fixtures" / "run_v1_recap" / "data" / "rollouts"
HINT = (
    "list each dataset once (its frames would count twice, and the value stage's cross-fitting would train on the "
    "episodes it holds out); raise its `weight` to count it more"
)


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PORTABLE_CACHE_DIR", str(tmp_path / "cache"))


def _same(tmp_path: Path, second: Path) -> list:
    from reproduction.recipes.recap.recipe import preflight

    config = load_recap(None, [f"datasets=[{{path: {ROLLOUTS}}}, {{path: {second}}}]"])
    return [p for p in preflight(config, tmp_path / "run", {}, ["returns", "value"]) if "same dataset" in str(p)]


def test_recap_preflight_refuses_one_folder_listed_twice_through_a_link(tmp_path):
    link = tmp_path / "rollouts_link"
    link.symlink_to(ROLLOUTS)
    (problem,) = _same(tmp_path, link)
    assert isinstance(problem, ConfigError) and problem.exit_code == 4
    assert problem.message == (
        f"datasets[0].path ({ROLLOUTS}) and datasets[1].path ({link}) are the same dataset: the same folder "
        f"{ROLLOUTS} once links are resolved"
    )
    assert problem.hint == HINT


def test_recap_preflight_refuses_a_byte_identical_copy_and_passes_an_edited_one(tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(ROLLOUTS, copy)
    (problem,) = _same(tmp_path, copy)
    assert problem.exit_code == 4 and problem.message == (
        f"datasets[0].path ({ROLLOUTS}) and datasets[1].path ({copy}) are the same dataset: byte-identical copies "
        "(the same content fingerprint)"
    )
    # same info.json, same key columns, one other byte changed: another dataset (the content counts, not the keys)
    stats = json.loads((copy / "meta" / "stats.json").read_text())
    (copy / "meta" / "stats.json").write_text(json.dumps(stats, indent=1))
    assert _same(tmp_path, copy) == []


def test_grpo_sft_datasets_listed_twice_are_refused_by_resolved_folder(tmp_path):
    from reproduction.recipes.grpo.config import GrpoRunConfig
    from reproduction.recipes.grpo.preflight import preflight
    from reproduction.run.config import load_config

    link = tmp_path / "demos_link"
    link.symlink_to(ROLLOUTS)
    over = [f"sft.datasets=[{{path: {ROLLOUTS}}}, {{path: {link}}}]"]
    cfg = load_config([REPO / "bundle/grpo/config.yaml"], over, bundle=tmp_path, run_dir=tmp_path, schema=GrpoRunConfig)
    problems = [p for p in preflight(cfg, tmp_path / "run", {}, ["sft"]) if "same dataset" in str(p)]
    assert [(p.exit_code, p.message) for p in problems] == [
        (
            4,
            f"sft.datasets[0].path ({ROLLOUTS}) and sft.datasets[1].path ({link}) are the same dataset: the same "
            f"folder {ROLLOUTS} once links are resolved",
        )
    ]


def test_distinct_datasets_and_placeholders_pass(tmp_path):
    entries = [SimpleNamespace(path=str(ROLLOUTS)), SimpleNamespace(path="/path/to/x"), SimpleNamespace(path="/a/b")]
    assert duplicate_dataset_problems(entries, {}) == []


INFO = {"fps": 10, "features": {"observation.state": {"dtype": "float32", "shape": [3]}}}


@pytest.mark.parametrize("version", ["v3.1", "v4.0", "4"])
def test_a_newer_codebase_version_says_so_and_how_to_write_one_this_tool_reads(version):
    with pytest.raises(UnsupportedFormatError) as err:
        info_from_dict({**INFO, "codebase_version": version})
    assert err.value.exit_code == 4
    assert err.value.message == (
        f"info.json: codebase_version {version!r} was written by a newer lerobot than this tool reads "
        "(it reads v2.1, v3.0)"
    )
    assert err.value.hint == (
        "write or export the dataset as v3.0 (or v2.1) with the lerobot version that made it, or upgrade recap-portable"
    )


def test_a_missing_or_misspelt_or_older_codebase_version_gets_its_own_advice():
    with pytest.raises(UnsupportedFormatError) as err:
        info_from_dict(dict(INFO))
    assert err.value.message == (
        "info.json: the codebase_version field is missing, so the layout is unknown (this tool reads v2.1, v3.0)"
    )
    assert "None" not in err.value.message
    with pytest.raises(UnsupportedFormatError) as err:
        info_from_dict({**INFO, "codebase_version": "3.0"})
    assert err.value.hint == 'lerobot spells it "v3.0": set codebase_version to that'
    with pytest.raises(UnsupportedFormatError) as err:
        info_from_dict({**INFO, "codebase_version": "v2.0"})
    assert err.value.message == "info.json: codebase_version 'v2.0' is not supported (supported: v2.1, v3.0)"
    assert err.value.hint == "convert the dataset to v3.0 with lerobot's converters (v2.0 -> v2.1 -> v3.0)"


def test_the_config_docs_say_what_a_relative_dataset_path_is_relative_to():
    from reproduction.recipes.recap.config import DatasetConfig

    doc = (REPO / "docs" / "config.md").read_text()
    assert "relative path is read from the current folder" in " ".join(doc.split())
    assert DatasetConfig.__doc__ is not None
