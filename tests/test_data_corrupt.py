"""Truncated and corrupt data parquets: a DatasetError (exit 40) naming the file and the fix, never a
raw pyarrow error, through every path that reads a data file (open, frames, stage 1, fingerprint)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from reproduction.data.reader import open_dataset
from reproduction.data.writer import EpisodeData, write_dataset
from reproduction.errors import DatasetError
from reproduction.recap.returns import ReturnsConfig, compute_returns

FEATURES = {"observation.state": {"dtype": "float32", "shape": [3]}, "is_success": {"dtype": "bool", "shape": [1]}}


def _dataset(tmp_path: Path) -> Path:
    """A v2.1 dataset of three episodes (one data file each)."""
    rng = np.random.default_rng(0)
    eps = [
        EpisodeData(
            episode_index=e,
            task="t",
            frames={"observation.state": rng.normal(size=(n, 3)).astype(np.float32), "is_success": np.ones(n, bool)},
        )
        for e, n in enumerate([40, 50, 30])
    ]
    return write_dataset(tmp_path / "ds", eps, fps=10, features=FEATURES, version="v2.1")


def _truncate(keep):
    def damage(path: Path) -> None:
        data = path.read_bytes()
        path.write_bytes(data[: keep(len(data))])

    return damage


def _corrupt_column_data(path: Path) -> None:
    """Overwrite the first page of the episode_index column chunk; the footer stays intact."""
    md = pq.read_metadata(path)
    names = [md.row_group(0).column(j).path_in_schema for j in range(md.num_columns)]
    col = md.row_group(0).column(names.index("episode_index"))
    start = col.dictionary_page_offset or col.data_page_offset
    data = bytearray(path.read_bytes())
    data[start : start + 24] = b"\xff" * 24
    path.write_bytes(bytes(data))


DAMAGE = {
    "half": _truncate(lambda n: n // 2),
    "minus_8_bytes": _truncate(lambda n: n - 8),
    "100_bytes": _truncate(lambda n: 100),
    "0_bytes": _truncate(lambda n: 0),
    "column_data": _corrupt_column_data,
}


def _check(exc: pytest.ExceptionInfo, path: Path) -> None:
    err = exc.value
    assert isinstance(err, DatasetError) and err.exit_code == 40
    assert str(path) in err.message
    assert err.hint and "again" in err.hint  # what to do: fetch or copy the dataset again
    assert "Traceback" not in err.message


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_a_damaged_data_file_is_a_dataset_error_naming_it(tmp_path, kind):
    root = _dataset(tmp_path)
    files = sorted((root / "data").glob("*/*.parquet"))
    bad = files[1]  # not the first: open_dataset reads only the first file's schema
    DAMAGE[kind](bad)
    with pytest.raises(DatasetError) as exc:
        compute_returns([root], tmp_path / "run", ReturnsConfig(dataset_type="rollout"))
    _check(exc, bad)
    assert not list((tmp_path / "run").rglob("*.parquet"))  # nothing half-written
    with pytest.raises(DatasetError) as exc:
        open_dataset(root).frame_table()
    _check(exc, bad)
    with pytest.raises(DatasetError) as exc:
        open_dataset(root).read_frames([45], ["episode_index", "observation.state"])  # row 45 lives in the damaged file
    _check(exc, bad)


@pytest.mark.parametrize("kind", ["half", "0_bytes", "column_data"])
def test_a_damaged_first_file_fails_at_open_or_fingerprint(tmp_path, kind):
    root = _dataset(tmp_path)
    bad = sorted((root / "data").glob("*/*.parquet"))[0]
    DAMAGE[kind](bad)
    with pytest.raises(DatasetError) as exc:
        _ = open_dataset(root).fingerprint  # a footer-intact file opens; its digest read then fails
    _check(exc, bad)
