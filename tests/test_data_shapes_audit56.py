"""Audit 56 E1/E2: features of more than one dimension (shape [2, 3], [2, 2, 2]) are read nested (as lerobot
0.4.4 writes them) or flat (as our writer did before), checked against info.json's shape, and written nested."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reproduction.data.reader import column_to_numpy, open_dataset
from reproduction.data.writer import EpisodeData, write_dataset
from reproduction.errors import DatasetError

FILE = Path("/data/chunk-000/file-000.parquet")


def _nested(values: np.ndarray) -> pa.Array:
    """list<list<...>> of `values` (n, *shape), one level per dimension, as lerobot 0.4.4 stores it."""
    out = pa.array(values.reshape(-1))
    for d in reversed(values.shape[1:]):
        out = pa.ListArray.from_arrays(pa.array(np.arange(0, len(out) + 1, d, dtype=np.int32)), out)
    return out


@pytest.mark.parametrize("shape", [(2, 3), (2, 2, 2)])
def test_nested_and_flat_columns_read_as_frames_by_shape(shape):
    values = np.arange(5 * int(np.prod(shape)), dtype=np.float32).reshape(5, *shape)
    feature = {"dtype": "float32", "shape": list(shape)}
    nested = column_to_numpy(pa.chunked_array([_nested(values[:2]), _nested(values[2:])]), feature, name="s")
    assert nested.shape == (5, *shape) and nested.dtype == np.float32
    np.testing.assert_array_equal(nested, values)
    flat = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), int(np.prod(shape)))
    np.testing.assert_array_equal(column_to_numpy(flat, feature, name="s"), values)
    np.testing.assert_array_equal(column_to_numpy(_nested(values).slice(1, 3), feature), values[1:4])
    np.testing.assert_array_equal(column_to_numpy(_nested(values)), values)  # no feature: shape from the lists


def test_a_nested_list_of_the_wrong_length_is_refused_naming_file_column_and_shape():
    good = np.zeros((3, 2, 3), np.float32)
    bad = pa.array(
        [[[0.0] * 3, [0.0] * 3], [[0.0] * 3, [0.0] * 2], [[0.0] * 3, [0.0] * 3]], pa.list_(pa.list_(pa.float32()))
    )
    feature = {"dtype": "float32", "shape": [2, 3]}
    with pytest.raises(DatasetError) as err:
        column_to_numpy(bad, feature, name="observation.state", file_of_row=lambda row: FILE.with_name(f"file-{row}"))
    assert str(err.value) == (
        "/data/chunk-000/file-1: column 'observation.state' holds a list of 2 values at level 2 "
        "where info.json's shape is [2, 3]"
    )
    assert err.value.path == FILE.with_name("file-1") and err.value.field == "observation.state"
    with pytest.raises(DatasetError, match=r"^column 's' holds a list of 5 values at level 1 where .*\[2, 3\]$"):
        column_to_numpy(pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(10, np.float32)), 5), feature, name="s")
    with pytest.raises(
        DatasetError, match=r"^column 's' holds lists 2 levels deep where info.json's shape is \[2, 2, 3\]$"
    ):
        column_to_numpy(_nested(good), {"shape": [2, 2, 3]}, name="s")
    with pytest.raises(DatasetError, match=r"holds lists 2 levels deep where info.json's shape is \[6\]"):
        column_to_numpy(_nested(good), {"shape": [6]}, name="s")
    with pytest.raises(DatasetError, match="holds a list of 0 values at level 2"):  # a null inner list
        column_to_numpy(pa.array([[[1.0, 2.0, 3.0], None]], pa.list_(pa.list_(pa.float64()))), feature, name="s")


FEATURES = {"observation.state": {"dtype": "float32", "shape": [2, 3]}, "is_success": {"dtype": "bool", "shape": [1]}}


def _write(tmp_path: Path) -> tuple[Path, np.ndarray]:
    rng = np.random.default_rng(0)
    eps = [
        EpisodeData(
            episode_index=i,
            task=f"task {i}",
            frames={
                "observation.state": rng.normal(size=(n, 2, 3)).astype(np.float32),
                "is_success": np.arange(n) == n - 1,
            },
        )
        for i, n in enumerate([4, 3, 5])
    ]
    root = write_dataset(tmp_path / "ds", eps, fps=10, features=FEATURES)
    return root, np.concatenate([e.frames["observation.state"] for e in eps])


def test_writer_stores_a_2d_feature_as_nested_lists_and_reads_it_back(tmp_path):
    root, state = _write(tmp_path)
    (path,) = root.glob("data/*/*.parquet")
    t = pq.read_schema(path).field("observation.state").type
    assert pa.types.is_list(t) and pa.types.is_list(t.value_type) and t.value_type.value_type == pa.float32()
    ds = open_dataset(root)
    rows = np.array([11, 0, 5])
    np.testing.assert_array_equal(ds.read_frames(rows, ["observation.state"])["observation.state"], state[rows])


def _rewrite_state(root: Path, column: pa.Array) -> Path:
    (path,) = root.glob("data/*/*.parquet")
    table = pq.read_table(path)
    table = table.set_column(table.schema.get_field_index("observation.state"), "observation.state", column)
    pq.write_table(table, path)
    return path


def test_a_flat_2d_column_written_before_the_fix_still_reads(tmp_path):
    from reproduction.recap.value.data import read_state

    root, state = _write(tmp_path)
    _rewrite_state(root, pa.FixedSizeListArray.from_arrays(pa.array(state.reshape(-1)), 6))
    ds = open_dataset(root)
    np.testing.assert_array_equal(ds.read_frames(np.arange(12), ["observation.state"])["observation.state"], state)
    np.testing.assert_array_equal(read_state(ds, ["observation.state"], None), state.reshape(12, 6))


def test_value_state_of_a_2d_feature_is_its_flattened_components_and_bad_lengths_name_the_file(tmp_path):
    from reproduction.recap.returns import ReturnsConfig, compute_returns
    from reproduction.recap.value.data import ValueSource, load_source, read_state

    root, state = _write(tmp_path)
    compute_returns([root], tmp_path / "r", ReturnsConfig(failure_reward=-50.0, dataset_type="rollout"))
    src = ValueSource(path=str(root), type="rollout", returns=str(tmp_path / "r"))
    frames = load_source(src, state_keys=["observation.state"])
    np.testing.assert_array_equal(frames.state, state.reshape(12, 6))
    cells = state.tolist()
    cells[7][1] = cells[7][1][:2]  # row 7: its second inner list is one value short
    path = _rewrite_state(root, pa.array(cells, pa.list_(pa.list_(pa.float32()))))
    ds = open_dataset(root)
    want = f"{path}: column 'observation.state' holds a list of 2 values at level 2 where info.json's shape is [2, 3]"
    for read in (
        lambda: read_state(ds, ["observation.state"], None),
        lambda: ds.read_frames([7], ["observation.state"]),
    ):
        with pytest.raises(DatasetError) as err:
            read()
        assert str(err.value) == want and err.value.exit_code == 40
