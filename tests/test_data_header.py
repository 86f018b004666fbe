"""A dataset whose header or files disagree with each other (found by an outside audit on datasets lerobot 0.4.4
wrote, then damaged): a data file lacking a column the others have, a column of another type in one file, an
info.json of another shape, an episode table without its columns, and a header whose counts are not the data's.
Each is a DatasetError (exit 40) naming the file and what differs; before, some were exit 1 (an ArrowInvalid of a
dozen schema lines, a KeyError, an int() ValueError) and the rest were read without a word, where lerobot and
RLinf would read other frames (they take the length from total_frames and episode bounds from the table)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reproduction.data.reader import open_dataset
from reproduction.data.writer import EpisodeData, write_dataset
from reproduction.errors import DatasetError
from reproduction.recap.returns import ReturnsConfig, compute_returns

REPO = Path(__file__).resolve().parent.parent
FEATURES = {"observation.state": {"dtype": "float32", "shape": [2]}, "is_success": {"dtype": "bool", "shape": [1]}}
LENGTHS = [6, 4, 5]


def _dataset(root: Path, version: str) -> Path:
    eps = [
        EpisodeData(
            episode_index=e,
            task=f"task {e % 2}",
            frames={"observation.state": np.full((n, 2), e, np.float32), "is_success": np.full(n, e != 1)},
        )
        for e, n in enumerate(LENGTHS)
    ]
    return write_dataset(root, eps, fps=10, features=FEATURES, version=version)


def _data_files(root: Path) -> list[Path]:
    return sorted((root / "data").glob("*/*.parquet"))


def _rewrite(path: Path, edit) -> None:
    pq.write_table(edit(pq.read_table(path)), path)


def _returns(root: Path, out: Path) -> None:
    compute_returns([open_dataset(root)], out, ReturnsConfig(), types=["rollout"])


def test_a_data_file_without_a_column_the_others_have_is_named(tmp_path):
    root = _dataset(tmp_path / "ds", "v2.1")
    second = _data_files(root)[1]
    _rewrite(second, lambda t: t.drop_columns(["is_success"]))
    with pytest.raises(DatasetError) as err:
        _returns(root, tmp_path / "out")
    assert err.value.exit_code == 40
    assert str(err.value) == f"{second}: no column(s) is_success"
    assert "every data file of a dataset has the same columns" in err.value.hint
    assert not (tmp_path / "out" / "ds" / "returns.parquet").exists()


def test_a_column_of_another_type_in_one_file_is_named_with_both_types(tmp_path):
    root = _dataset(tmp_path / "ds", "v2.1")
    first, third = _data_files(root)[0], _data_files(root)[2]
    _rewrite(
        third,
        lambda t: t.set_column(t.schema.get_field_index("is_success"), "is_success", t["is_success"].cast(pa.int64())),
    )
    with pytest.raises(DatasetError) as err:
        open_dataset(root).frame_table()
    rel = "/".join(first.parts[-3:])
    assert str(err.value) == f"{third}: is_success is int64 here, bool in {rel}"
    with pytest.raises(DatasetError, match="is_success is int64 here"):
        open_dataset(root).fingerprint


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda i: [1, 2], "the top level is a list, not a mapping"),
        (lambda i: {**i, "features": ["a"]}, '`features` is ["a"], not a mapping of feature name'),
        (lambda i: {**i, "features": {}}, "`features` is {}, not a mapping"),
        (lambda i: {**i, "features": {**i["features"], "x": {"shape": [1]}}}, "feature 'x' is {\"shape\": [1]}"),
        (lambda i: {**i, "fps": "ten"}, 'fps is "ten", not a positive finite number'),
        (lambda i: {**i, "fps": 0}, "fps is 0, not a positive finite number"),
        (lambda i: {**i, "fps": True}, "fps is true, not a positive finite number"),
        (lambda i: {**i, "total_frames": "15"}, 'total_frames is "15", not a whole number >= 0'),
        (lambda i: {**i, "chunks_size": 0}, "chunks_size is 0, not a whole number >= 1"),
        (lambda i: {**i, "data_path": 5}, "data_path is 5, not a path template string"),
    ],
)
def test_an_info_json_of_another_shape_is_exit_40_naming_the_field(tmp_path, edit, words):
    root = _dataset(tmp_path / "ds", "v3.0")
    info = root / "meta" / "info.json"
    info.write_text(json.dumps(edit(json.loads(info.read_text()))))
    with pytest.raises(DatasetError) as err:
        open_dataset(root)
    assert err.value.exit_code == 40
    assert str(err.value).startswith(f"{info}: ") and words in str(err.value)
    assert "meta/info.json is the header lerobot writes" in err.value.hint


def test_a_whole_fps_written_as_a_float_is_read(tmp_path):
    root = _dataset(tmp_path / "ds", "v3.0")
    info = root / "meta" / "info.json"
    info.write_text(json.dumps({**json.loads(info.read_text()), "fps": 10.0}))
    assert open_dataset(root).info.fps == 10


@pytest.mark.parametrize("column", ["length", "episode_index"])
def test_an_episode_table_without_its_columns_is_exit_40(tmp_path, column):
    root = _dataset(tmp_path / "ds", "v3.0")
    (table,) = sorted((root / "meta" / "episodes").glob("*/*.parquet"))
    _rewrite(table, lambda t: t.drop_columns([column]))
    with pytest.raises(DatasetError) as err:
        open_dataset(root)
    assert str(err.value) == f"{table}: no column {column} (an episode table has integer episode_index and length)"


def test_a_v21_episode_line_without_a_length_is_exit_40(tmp_path):
    root = _dataset(tmp_path / "ds", "v2.1")
    path = root / "meta" / "episodes.jsonl"
    lines = path.read_text().splitlines()
    doc = json.loads(lines[1])
    del doc["length"]
    path.write_text("\n".join([lines[0], json.dumps(doc), *lines[2:]]) + "\n")
    with pytest.raises(DatasetError, match=r"episodes.jsonl: episode line 2 has length None, not a whole number"):
        open_dataset(root)


def _drop_episode_row(root: Path) -> None:
    (table,) = sorted((root / "meta" / "episodes").glob("*/*.parquet"))
    _rewrite(table, lambda t: t.slice(0, 2))


def _longer_first_episode(root: Path) -> None:
    (table,) = sorted((root / "meta" / "episodes").glob("*/*.parquet"))
    lengths = pq.read_table(table)["length"].to_pylist()
    _rewrite(
        table,
        lambda t: t.set_column(t.schema.get_field_index("length"), "length", pa.array([lengths[0] + 3, *lengths[1:]])),
    )


def _info(**changes):
    def edit(root: Path) -> None:
        path = root / "meta" / "info.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))

    return edit


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        (_info(total_frames=100), "info.json says total_frames 100, the data files hold 15"),
        (_info(total_episodes=2), "info.json says total_episodes 2, the episode table lists 3"),
        (_drop_episode_row, "the data files hold 1 episode(s) the episode table lacks (2)"),
        (
            _longer_first_episode,
            "1 episode(s) of another length in the data than in the episode table (episode 0: 6 "
            "frames, the table says 9)",
        ),
    ],
)
def test_a_header_that_disagrees_with_the_data_is_refused_before_a_sidecar_is_written(tmp_path, damage, words):
    root = _dataset(tmp_path / "ds", "v3.0")
    damage(root)
    with pytest.raises(DatasetError) as err:
        _returns(root, tmp_path / "out")
    assert err.value.exit_code == 40
    assert str(err.value).startswith(f"{root / 'meta'}: the dataset's header disagrees with its data files: ")
    assert words in str(err.value)
    assert not (tmp_path / "out" / "ds" / "returns.parquet").exists()


def test_the_header_of_a_sound_dataset_agrees_in_both_layouts(tmp_path):
    for version in ("v2.1", "v3.0"):
        root = _dataset(tmp_path / version, version)
        (result,) = compute_returns(
            [open_dataset(root)], tmp_path / f"out{version}", ReturnsConfig(), types=["rollout"]
        )
        assert (result.num_frames, result.num_episodes) == (sum(LENGTHS), len(LENGTHS))


def test_through_the_cli_a_header_that_disagrees_is_one_error_line_exit_40(tmp_path):
    root = _dataset(tmp_path / "ds", "v3.0")
    _info(total_frames=99)(root)
    config = tmp_path / "run.yaml"
    config.write_text(f"datasets:\n  - path: {root}\n    type: rollout\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "reproduction.portable",
            "run",
            "--config",
            str(config),
            "--output",
            str(tmp_path / "run"),
            "--stages",
            "returns",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 40, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith(("error:", "hint:"))]
    assert lines[0].endswith("info.json says total_frames 99, the data files hold 15")
    assert lines[1].startswith("hint: the dataset was edited or copied in part")
    assert "Traceback" not in proc.stderr
