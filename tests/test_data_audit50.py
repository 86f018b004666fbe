"""Findings of an outside audit (audit50_D) on real LeRobot data: values a dataset or a stage file may hold that
were read without a word or refused with a message naming nothing. Each is now a DatasetError (exit 40) naming
the file (or dataset), the column or feature, and the first frame: a null key column (F2/F3), a frame_index gap
(F4), a non-finite value (F1), a corrupt mp4 (F6), a non-finite state (F7)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reproduction.data.reader import open_dataset
from reproduction.data.writer import EpisodeData, write_dataset
from reproduction.errors import DatasetError
from reproduction.recap.returns import ReturnsConfig, compute_returns, compute_returns_table

FEATURES = {"observation.state": {"dtype": "float32", "shape": [2]}, "is_success": {"dtype": "bool", "shape": [1]}}
LENGTHS = [3, 7, 4]


def _dataset(
    root: Path, version: str = "v2.1", features: dict | None = None, frames=None, image_storage: str = "png"
) -> Path:
    eps = [
        EpisodeData(
            episode_index=e,
            task=f"task {e % 2}",
            frames=(frames or (lambda e, n: {}))(e, n)
            or {"observation.state": np.full((n, 2), e, np.float32), "is_success": np.full(n, e != 1)},
        )
        for e, n in enumerate(LENGTHS)
    ]
    return write_dataset(root, eps, fps=10, features=features or FEATURES, version=version, image_storage=image_storage)


def _data_files(root: Path) -> list[Path]:
    return sorted((root / "data").glob("*/*.parquet"))


def _set(path: Path, column: str, row: int, value) -> None:
    """Rewrite one cell of a data parquet, keeping the column's type (None writes a null)."""
    t = pq.read_table(path)
    values = t.column(column).to_pylist()
    values[row] = value
    i = t.schema.get_field_index(column)
    pq.write_table(t.set_column(i, column, pa.array(values, t.schema.field(column).type)), path)


def _returns(root: Path, out: Path):
    return compute_returns([open_dataset(root)], out, ReturnsConfig(), types=["rollout"])


# -- F2 / F3: a null in a key column ---------------------------------------------------------------


@pytest.mark.parametrize("version", ["v2.1", "v3.0"])
@pytest.mark.parametrize("column", ["frame_index", "episode_index", "task_index"])
def test_a_null_key_column_is_refused_naming_file_column_and_row(tmp_path, version, column):
    """Before: a null frame_index was cast to -9223372036854775808 (a numpy RuntimeWarning on stderr) and stage 1
    wrote returns for that bogus frame (exit 0); a null episode_index or task_index was refused naming the fake id."""
    root = _dataset(tmp_path / "ds", version)
    path = _data_files(root)[-1] if version == "v2.1" else _data_files(root)[0]
    row = 2 if version == "v2.1" else 3 + 2  # episode 2 frame 2 (v2.1: its own file) / episode 1 frame 2
    _set(path, column, row, None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "invalid value encountered in cast" on the way
        with pytest.raises(DatasetError) as err:
            _returns(root, tmp_path / "out")
    assert err.value.exit_code == 40
    msg = str(err.value)
    assert msg.startswith(f"{path}: {column} is missing (null) in 1 of "), msg
    assert f"the first at row {row} of this file" in msg
    assert "-9223372036854775808" not in msg
    assert not (tmp_path / "out" / "ds" / "returns.parquet").exists()


@pytest.mark.parametrize("column", ["index", "timestamp"])
def test_a_null_in_a_key_column_stage_1_does_not_read_is_refused_where_it_is_read(tmp_path, column):
    """timestamp is read to find video frames (a null was NaN: refused, but as a timestamp drift), index by
    callers of frame_table; both as the columns above."""
    root = _dataset(tmp_path / "ds", "v3.0")
    path = _data_files(root)[0]
    _set(path, column, 4, None)
    with pytest.raises(DatasetError) as err:
        open_dataset(root).frame_table(["episode_index", "frame_index", column])
    assert str(err.value).startswith(f"{path}: {column} is missing (null) in 1 of 14 rows, the first at row 4 of ")
    assert str(err.value).endswith(", episode 1")


def test_compute_returns_table_refuses_a_null_key_given_directly():
    table = pa.table({"episode_index": [0, 0, 0], "frame_index": pa.array([0, None, 2], pa.int64())})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(DatasetError) as err:
            compute_returns_table(table, ReturnsConfig(), source="ds")
    assert str(err.value) == "ds: frame_index is missing (null) in 1 of 3 rows, the first at row 1"
    assert err.value.exit_code == 40


# -- F4: frame_index must run 0..length-1 in each episode -----------------------------------------


@pytest.mark.parametrize("version", ["v2.1", "v3.0"])
def test_a_frame_index_gap_is_refused_by_stage_1_naming_file_episode_and_frame(tmp_path, version):
    """Before: an image (or state-only) dataset whose episode's last frame_index was 6 -> 7 passed stage 1, its rows
    counted as consecutive frames (as RLinf does), while reading the same dataset's video refused it."""
    root = _dataset(tmp_path / "ds", version)
    path = _data_files(root)[1] if version == "v2.1" else _data_files(root)[0]
    _set(path, "frame_index", 6 if version == "v2.1" else 3 + 6, 7)  # episode 1's last frame
    with pytest.raises(DatasetError) as err:
        _returns(root, tmp_path / "out")
    assert err.value.exit_code == 40
    assert str(err.value) == (
        f"{path}: episode 1 has no frame 6 (frame 5 is followed by 7); an episode's frame_index runs "
        "0..length-1 (7 frames), 1 episode(s) differ"
    )
    assert not (tmp_path / "out" / "ds" / "returns.parquet").exists()


def test_an_episode_not_starting_at_frame_0_is_refused_also_when_rows_are_shuffled():
    keys = {"episode_index": [4, 3, 4, 3, 3], "frame_index": [2, 0, 1, 2, 1]}
    with pytest.raises(DatasetError) as err:
        compute_returns_table(pa.table(keys), ReturnsConfig(), source="ds")
    assert str(err.value).startswith("ds: episode 4 starts at frame 1, not 0; ")
    ok = compute_returns_table(pa.table({"episode_index": [3, 3, 4], "frame_index": [1, 0, 0]}), ReturnsConfig())
    assert ok.column("return").to_pylist() == [-1.0, 0.0, 0.0]


# -- F1: a non-finite per-frame value -------------------------------------------------------------


HEAD = {"format_version": 2, "num_bins": 201, "v_min": -1.0, "v_max": 0.0}


def _stage3_inputs(tmp_path: Path):
    root = _dataset(tmp_path / "ds")
    run = tmp_path / "run"
    compute_returns([root], run, ReturnsConfig(), types=["rollout"])
    frames = open_dataset(root).frame_table(["episode_index", "frame_index"])
    values = np.random.default_rng(0).uniform(-1, 0, frames.num_rows)
    return root, run, frames, values


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_value_is_refused_where_stage_3_reads_the_values(tmp_path, bad):
    """Before: no error; the NaN advantage made the threshold NaN, every frame of every dataset was labelled negative
    and mixture_config.yaml recorded `unified_threshold: .nan`."""
    from reproduction.recap.advantage_inputs import load_dataset_arrays

    root, run, frames, values = _stage3_inputs(tmp_path)
    values[[3 + 5, 3 + 2]] = bad  # episode 1 frames 5 and 2; the file's rows shuffled
    table = frames.append_column("value", pa.array(values))
    path = tmp_path / "values.parquet"
    pq.write_table(table.take(pa.array(np.random.default_rng(1).permutation(table.num_rows))), path)
    with pytest.raises(DatasetError) as err:
        load_dataset_arrays(root, run, path, dataset_type="rollout", returns_tag=None)
    assert err.value.exit_code == 40
    assert str(err.value) == (
        f"{root}: the values ({path}) holds 2 non-finite value(s) (NaN or inf) of 14, the first at episode 1 frame 2 "
        f"({bad})"
    )
    assert "--restart-stage value" in err.value.hint


def test_a_non_finite_value_given_in_memory_is_refused_before_any_file_is_written(tmp_path):
    from reproduction.recap.advantage_inputs import DatasetArrays
    from reproduction.recap.advantages import AdvantageConfig, compute_advantages
    from reproduction.recap.normalize import ReturnRange

    ep = np.repeat([0, 1], [4, 3])
    values = np.linspace(-1, 0, 7)
    values[5] = np.nan
    arrays = DatasetArrays(
        name="roll",
        dataset_type="rollout",
        episode_index=ep,
        frame_index=np.array([0, 1, 2, 3, 0, 1, 2]),
        returns=np.linspace(-6, 0, 7),
        rewards=-np.ones(7),
        values=values,
        prompts=np.array(["t"] * 7, dtype=object),
    )
    with pytest.raises(
        DatasetError, match=r"^roll: the values holds 1 non-finite value\(s\) .* episode 1 frame 1 \(nan\)$"
    ):
        compute_advantages(
            [arrays], AdvantageConfig(lookahead=2), ReturnRange(return_min=-10, return_max=0), out_dirs=[tmp_path / "o"]
        )
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("recompute", [False, True])
def test_relabel_refuses_a_non_finite_score_in_its_source_sidecar(tmp_path, recompute):
    import json

    from reproduction.recap.advantage_inputs import load_dataset_arrays
    from reproduction.recap.advantages import AdvantageConfig, compute_advantages, relabel

    root, run, frames, values = _stage3_inputs(tmp_path)
    path = tmp_path / "values.parquet"
    pq.write_table(frames.append_column("value", pa.array(values)), path)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "value_head.json").write_text(json.dumps({**HEAD, "return_range": {"return_min": -310, "return_max": 0}}))
    inputs = [load_dataset_arrays(root, run, path, dataset_type="rollout", returns_tag=None)]
    compute_advantages(inputs, AdvantageConfig(tag="a", lookahead=2), ckpt, out_dirs=[run / "ds"])
    sidecar = run / "ds" / "advantages_a.parquet"
    column = "value_current" if recompute else "advantage_continuous"
    table = pq.read_table(sidecar)
    cells = table.column(column).to_numpy().copy()
    cells[4] = np.nan  # episode 1 frame 1
    pq.write_table(table.set_column(table.schema.get_field_index(column), column, pa.array(cells)), sidecar)
    with pytest.raises(DatasetError) as err:
        relabel([root], run, source_tag="a", config=AdvantageConfig(tag="b"), recompute=recompute, out=run)
    assert str(err.value).startswith(f"ds: the source advantages sidecar's {column} holds 1 non-finite value(s)")
    assert "the first at episode 1 frame 1 (nan)" in str(err.value)


# -- F6: a truncated or corrupt mp4 ----------------------------------------------------------------


@pytest.mark.parametrize("keep", [400, 0.5])
def test_a_truncated_video_is_a_dataset_error_naming_file_and_episode(tmp_path, keep):
    """Before: PyAV's InvalidDataError (a ValueError, no PortableError) ended `portable run` with exit 1 and a hint
    blaming "a recipe's or other code of yours"."""
    video = {"observation.images.front": {"dtype": "video", "shape": [32, 32, 3]}}
    rng = np.random.default_rng(0)

    def frames(e, n):
        return {
            "observation.state": np.full((n, 2), e, np.float32),
            "is_success": np.full(n, e != 1),
            "observation.images.front": rng.integers(0, 255, (n, 32, 32, 3), dtype=np.uint8),
        }

    root = _dataset(tmp_path / "ds", "v2.1", {**FEATURES, **video}, frames, image_storage="video")
    mp4 = sorted((root / "videos").rglob("*.mp4"))[1]  # episode 1's
    data = mp4.read_bytes()
    mp4.write_bytes(data[: keep if isinstance(keep, int) else int(len(data) * keep)])
    ds = open_dataset(root)
    with pytest.raises(DatasetError) as err:
        ds.read_frames(np.arange(ds.num_frames), ["observation.images.front"])
    assert err.value.exit_code == 40
    assert str(err.value).startswith(f"{mp4}: episode 1: not a readable video (InvalidDataError: ")
    assert "truncated or corrupt" in err.value.hint


# -- F7: a non-finite state value the value model reads -------------------------------------------


def _nan_state_dataset(tmp_path: Path) -> Path:
    def frames(e, n):
        state = np.full((n, 2), e, np.float32)
        if e == 1:
            state[[4, 2], 1] = [np.inf, np.nan]  # episode 1 frames 2 and 4, component 1
        return {"observation.state": state, "is_success": np.full(n, e != 1)}

    return _dataset(tmp_path / "ds", "v3.0", frames=frames)


def test_a_non_finite_state_is_refused_naming_dataset_feature_and_frame(tmp_path):
    """Before: the NaN made the state statistics NaN and the value stage ended with exit 4
    "value model: state_std entries must be > 0", naming no dataset, feature or frame."""
    from reproduction.recap.value.config import ValueSource
    from reproduction.recap.value.data import load_source, read_state

    root = _nan_state_dataset(tmp_path)
    compute_returns([root], tmp_path / "run", ReturnsConfig(), types=["rollout"])
    source = ValueSource(path=str(root), type="rollout", returns=str(tmp_path / "run"))
    with pytest.raises(DatasetError) as err:
        load_source(source, state_keys=["observation.state"])
    assert err.value.exit_code == 40
    assert str(err.value) == (
        f"{root}: the value model's state feature 'observation.state' is NaN or inf at 2 frame(s), the first at "
        "episode 1 frame 2"
    )
    assert "value.model.state_keys" in err.value.hint
    ds = open_dataset(root)
    with pytest.raises(DatasetError, match="NaN or inf at 1 frame\\(s\\), the first at episode 1 frame 4$"):
        read_state(ds, ["observation.state"], None, np.array([0, 3 + 4, 1]))  # inference reads rows
    kept = read_state(ds, ["observation.state"], [0])  # the component the model reads is finite
    assert np.isfinite(kept).all() and kept.shape == (14, 1)
