"""audit56 G1/G4: rewards and returns beyond float32 are refused before anything is written, a return range or
stats.json entry is never non-finite, and all-equal returns stop `portable run` with a one-line error (exit 4)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from reproduction.data.writer import EpisodeData, write_dataset
from reproduction.errors import ConfigError
from reproduction.recap import returns as rt
from reproduction.recap.returns import ReturnsConfig, column_stats, compute_returns_table
from reproduction.value_export import ReturnRange

FEATURES = {"observation.state": {"dtype": "float32", "shape": [2]}, "is_success": {"dtype": "bool", "shape": [1]}}


def _dataset(tmp_path, lengths, success=True):
    eps = [
        EpisodeData(
            episode_index=e,
            task="t",
            frames={"observation.state": np.zeros((n, 2), np.float32), "is_success": np.full(n, success)},
        )
        for e, n in enumerate(lengths)
    ]
    return write_dataset(tmp_path / "ds", eps, fps=10, features=FEATURES)


def _run(out, stages, *overrides):
    cmd = [sys.executable, "-m", "reproduction.portable", "run", "--stages", stages, "--output", str(out)]
    return subprocess.run(cmd + list(overrides), capture_output=True, text=True, timeout=300)


def test_portable_run_refuses_a_failure_reward_beyond_float32_before_writing(tmp_path):
    """-1e39 is finite in float64 but -inf in the float32 sidecar: it wrote -inf returns, stats.json -Infinity/NaN and
    trained stage 2 on NaN targets, exit 0."""
    root = _dataset(tmp_path, [3, 2], success=False)
    out = tmp_path / "out"
    proc = _run(out, "returns", f"datasets=[{{path: {root}, type: rollout}}]", "returns.failure_reward=-1e39")
    assert proc.returncode == 4, proc.stderr
    assert proc.stderr.splitlines() == [
        "error: command line: returns.failure_reward=-1e+39 is not a finite number in float32, the returns sidecar's "
        "dtype (its range is +-3.4028235e+38)",
        "hint: set returns.failure_reward within +-3.4028235e+38 (RLinf's default: -300)",
    ]
    assert not out.exists()


def test_failure_reward_at_the_float32_limit_is_kept_and_one_beyond_refused():
    frames = pa.table({"episode_index": [0, 0, 1], "frame_index": [0, 1, 0], "is_success": [False, False, True]})
    limit = ReturnsConfig(dataset_type="rollout", failure_reward=-3.4028235e38)  # rounds to float32's max
    returns = compute_returns_table(frames, limit).column("return").to_numpy()
    assert returns.tolist() == [float(np.float32(-3.4028235e38))] * 2 + [0.0]
    for bad in (-1e39, -3.40282357e38, 1e39):
        with pytest.raises(ConfigError, match=r"^failure_reward=.* is not a finite number in float32") as info:
            ReturnsConfig(dataset_type="rollout", failure_reward=bad)
        assert info.value.field == "failure_reward"


def test_a_return_beyond_float32_is_refused_not_written_as_inf():
    with pytest.raises(ConfigError) as info:
        rt._float32_returns(np.array([-3.5e38, -1.0, 0.0]), -3.4e38)
    assert str(info.value) == (
        "returns.failure_reward=-3.4e+38: the smallest return, -3.5e+38, is beyond float32's range "
        "(+-3.4028235e+38), the returns sidecar's dtype"
    )
    assert rt._float32_returns(np.array([-2.0, 0.0]), -1.0).dtype == np.float32


def test_stats_json_entries_are_never_non_finite():
    assert column_stats(np.array([-2.0, 0.0], np.float32)) == {"mean": -1.0, "std": 1.0, "min": -2.0, "max": 0.0}
    with pytest.raises(ConfigError, match=r"^returns: stats.json entry mean would be -inf, not a finite number$"):
        column_stats(np.array([-np.inf, 0.0], np.float32))


@pytest.mark.parametrize(
    ("lo", "hi", "message"),
    [
        (-np.inf, 0.0, "return range: return_min=-inf is not a finite number"),
        (-1.0, np.nan, "return range: return_max=nan is not a finite number"),
        (-1.0, np.inf, "return range: return_max=inf is not a finite number"),
    ],
)
def test_return_range_refuses_non_finite_bounds(lo, hi, message):
    with pytest.raises(ConfigError) as info:
        ReturnRange(return_min=lo, return_max=hi)
    assert str(info.value) == message
    with pytest.raises(ConfigError) as info:
        ReturnRange.from_dict({"return_min": lo, "return_max": hi}, "run/mixture_config.yaml")
    assert str(info.value) == f"run/mixture_config.yaml: {message}"


def test_portable_run_refuses_all_equal_returns_in_one_line(tmp_path):
    """audit56 G4: only 1-frame successful episodes give every return 0; RLinf trains on targets 0 and labels with a
    constant advantage, the project stops at the value stage (exit 4) saying what to do."""
    root = _dataset(tmp_path, [1, 1, 1])
    proc = _run(
        tmp_path / "out",
        "returns,value",
        f"datasets=[{{path: {root}, type: rollout}}]",
        "value.train.max_steps=2",
        # a batch the 3 frames can fill, or the preflight refuses the batch first (audit65 E)
        "value.train.global_batch=3",
        "value.train.micro_batch=1",
    )
    assert proc.returncode == 4, proc.stderr
    assert proc.stderr.splitlines() == [
        "error: return range [0.0, 0.0] is empty: return_max must exceed return_min (every training return is 0.0)",
        "hint: train on episodes of several lengths or outcomes (equal returns leave the value model nothing to tell "
        "apart), or set value.model.return_min < value.model.return_max explicitly",
    ]
    assert not (tmp_path / "out" / "value" / "model_0").exists()
