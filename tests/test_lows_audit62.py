"""audit62 L1-L5: docs/grpo.md's exit code for a resume without quick.yaml, `portable demo --help`'s default folders,
the hint of two datasets sharing a folder name, is_success missing from some data files only (named, not "the
dataset has none"), and a 0-frame episode in the episode table (refused as such, not as a header that disagrees)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from reproduction.data.reader import open_dataset
from reproduction.data.writer import EpisodeData, write_dataset
from reproduction.errors import DatasetError

REPO = Path(__file__).resolve().parent.parent


def _v21(root: Path, episodes: int = 3) -> Path:
    n = 4
    feats = {
        "observation.state": {"dtype": "float32", "shape": [2]},
        "action": {"dtype": "float32", "shape": [2]},
        "is_success": {"dtype": "bool", "shape": [1]},
    }
    frames = {
        "observation.state": np.zeros((n, 2), np.float32),
        "action": np.zeros((n, 2), np.float32),
        "is_success": np.zeros(n, bool),
    }
    eps = [EpisodeData(episode_index=e, task="pick", frames=frames) for e in range(episodes)]
    return write_dataset(root, eps, fps=10, features=feats, version="v2.1")


def _portable(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "reproduction.portable", *args], cwd=REPO, capture_output=True, text=True, timeout=300
    )


def test_l1_grpo_docs_give_the_exit_code_a_resume_without_quick_yaml_gets():
    text = (REPO / "docs" / "grpo.md").read_text()
    assert "leave quick.yaml out and --target-step 8 is refused (exit 2)" not in text
    assert "with exit 52, since without quick.yaml" in text and "stage sft: its inputs changed since it ran" in text


def test_l2_demo_help_names_every_default_folder():
    out = _portable("demo", "--help").stdout
    flat = " ".join(out.split()).replace("demo- libero", "demo-libero")  # argparse wraps at a hyphen
    for folder in ("./runs/demo,", "./runs/demo-quick", "./runs/demo-grpo,", "./runs/demo-grpo-quick"):
        assert folder in flat, folder
    assert "./runs/demo-libero," in flat and "./runs/demo-libero-quick" in flat


def test_l3_two_datasets_of_one_folder_name_say_why_and_how_to_fix_it(tmp_path):
    from reproduction.recipes.recap.config import load_config
    from reproduction.recipes.recap.recipe import preflight

    a, b = _v21(tmp_path / "a" / "train"), _v21(tmp_path / "b" / "train")
    config = load_config(None, [f"datasets=[{{path: {a}}}, {{path: {b}}}]"])
    (p,) = [p for p in preflight(config, tmp_path / "run", {}, ["returns"]) if p.field == "datasets[1]"]
    assert p.exit_code == 4
    assert p.message == (
        "datasets[1].path: folder name 'train' is also datasets[0]'s; the run keys each dataset's sidecars, values "
        "and metrics by its folder name"
    )
    assert p.hint == "rename or copy one of the two dataset folders (e.g. b_train) and point its path at the new name"


def test_l4_is_success_missing_from_the_first_data_file_only_names_that_file(tmp_path):
    from reproduction.recap.returns import ReturnsConfig, compute_returns

    root = _v21(tmp_path / "ds")
    first = sorted((root / "data").rglob("*.parquet"))[0]
    pq.write_table(pq.read_table(first).drop_columns(["is_success"]), first)
    with pytest.raises(DatasetError) as err:
        compute_returns([open_dataset(root)], tmp_path / "out", ReturnsConfig(dataset_type="rollout"))
    assert err.value.exit_code == 40 and err.value.path == first
    assert err.value.message == (
        f"{first}: no column is_success, which 2 of the dataset's 3 data files have (e.g. "
        "data/chunk-000/episode_000001.parquet); 1 lacks it"
    )
    assert "there is none" not in err.value.message
    # from no file at all: still the dataset-wide message with the README snippet's hint
    for f in sorted((root / "data").rglob("*.parquet"))[1:]:
        pq.write_table(pq.read_table(f).drop_columns(["is_success"]), f)
    with pytest.raises(DatasetError, match="rollout data needs an is_success column, and there is none"):
        compute_returns([open_dataset(root)], tmp_path / "out2", ReturnsConfig(dataset_type="rollout"))


def _add_empty_episode(root: Path, index: int) -> None:
    with (root / "meta" / "episodes.jsonl").open("a") as f:
        f.write(json.dumps({"episode_index": index, "tasks": ["pick"], "length": 0}) + "\n")
    info = json.loads((root / "meta" / "info.json").read_text())
    info["total_episodes"] += 1
    (root / "meta" / "info.json").write_text(json.dumps(info))


def test_l5_a_0_frame_episode_is_refused_as_such(tmp_path):
    root = _v21(tmp_path / "ds")
    _add_empty_episode(root, 3)
    ds = open_dataset(root)
    ids, frames = np.array([0, 1, 2]), np.array([4, 4, 4])
    with pytest.raises(DatasetError) as err:
        ds.check_counts(ids, frames)
    assert err.value.exit_code == 40
    assert err.value.message == (
        f"{root / 'meta'}: the episode table lists 1 episode(s) of length 0 (3): an episode needs at least one frame "
        "(lerobot does not write an empty one)"
    )
    assert "disagrees" not in err.value.message and "copied in part" not in err.value.hint
    # beside a real disagreement it is listed with it, under the header message
    with pytest.raises(DatasetError) as err:
        ds.check_counts(ids, np.array([4, 4, 3]))
    assert "the dataset's header disagrees with its data files" in err.value.message
    assert "1 episode(s) of length 0 (3)" in err.value.message
