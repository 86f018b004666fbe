"""Done-when for the value model: a 2-worker CPU value SFT (Ray + FSDP2) beats chance on HELD-OUT episodes.

The dataset (tests/value_synth.py, 48 episodes, 64x64) is written with the data plane's writer and
its returns by stage 1. `portable run --stages returns,value,advantages` trains two models (2 folds,
2 Ray workers each); each is evaluated on the fold it never saw, and stage-3 inference (2 workers)
labels every episode with the model that did not train on it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from value_synth import CAMERA, write_value_dataset

REPO = Path(__file__).resolve().parent.parent
HELDOUT_SPEARMAN_MIN = 0.3


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "reproduction.portable", "run", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
def test_two_worker_value_sft_with_two_folds_beats_chance_on_held_out_episodes(tmp_path):
    from reproduction.data.reader import open_dataset
    from reproduction.recap.sidecars import read_returns
    from reproduction.recap.value.infer import infer_dataset, open_value_stage
    from reproduction.recap.value.loss import spearman

    write_value_dataset(tmp_path / "ds", episodes=48, seed=0, runs=tmp_path / "unused")
    config = {
        "datasets": [{"path": str(tmp_path / "ds"), "type": "rollout"}],
        "returns": {"failure_reward": -30.0},
        "value": {
            "model": {
                "cameras": {"base_0_rgb": CAMERA, "left_wrist_0_rgb": "observation.images.wrist"},
                "folds": 2,
                "value_lr": 1e-3,
                "eval_micro_batch": 64,
            },
            "train": {
                "max_steps": 150,
                "global_batch": 32,
                "micro_batch": 16,
                "world_size": 2,
                "launcher": "ray",
                "device": "cpu",
                "lr": 1e-3,
                "warmup_steps": 10,
                "log_interval": 25,
            },
            "infer": {"workers": 2, "device": "cpu"},
        },
        "advantages": {"lookahead": 3, "tag": "e2e"},
    }
    (tmp_path / "run.json.yaml").write_text(json.dumps(config))  # JSON is YAML
    out = tmp_path / "run"
    proc = _run(
        ["--output", str(out), "--config", str(tmp_path / "run.json.yaml"), "--stages", "returns,value,advantages"],
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    stages = json.loads((out / "run.json").read_text())["stages"]
    summary = stages["value"]["summary"]
    assert summary["folds"] == 2 and summary["return_range"] == {"return_min": -53.0, "return_max": 0.0}
    held = [m["eval"]["ds.heldout/value_spearman"] for m in summary["models"]]
    frames = [m["eval"]["ds.heldout/num_frames"] for m in summary["models"]]
    print(f"held-out value Spearman per fold: {held}; frames {frames}")
    assert all(s > HELDOUT_SPEARMAN_MIN for s in held), held
    assert sum(frames) == 804  # the two held-out folds are disjoint and cover the dataset
    assert all(m["step"] == 150 for m in summary["models"])

    values = infer_dataset(open_value_stage(out / "value"), open_dataset(tmp_path / "ds"), world_size=2)
    returns = read_returns(out / "returns", None, expect_fingerprint=None, dataset_name="ds")
    assert values.column("episode_index").to_pylist() == returns.column("episode_index").to_pylist()
    crossfit = spearman(values.column("value").to_numpy(), returns.column("return").to_numpy())
    print(f"cross-fitted labels vs returns, Spearman: {crossfit:.3f}")
    assert crossfit > HELDOUT_SPEARMAN_MIN
    assert np.isfinite(values.column("value").to_numpy()).all()

    # Stage 3 ran on 2 Ray workers: the same plan gives the same numbers as the in-process inference.
    assert stages["advantages"]["summary"]["inference"]["ds"]["frames"] == 804
    written = pq.read_table(out / "advantages" / "values" / "ds.parquet")
    np.testing.assert_allclose(written.column("value").to_numpy(), values.column("value").to_numpy(), atol=1e-6)
    adv = pq.read_table(out / "advantages" / "ds" / "advantages_e2e.parquet")
    assert adv.num_rows == 804
    positive = adv.column("advantage").to_numpy(zero_copy_only=False).mean()
    assert abs(positive - 0.3) < 0.02, positive  # positive_quantile 0.3 of a global threshold
    assert adv.column("value_current").to_pylist() == written.column("value").to_pylist()
    # label_quality.json: the per-fold Spearman of the cross-fitted values, positive rates by kind of frame.
    quality = json.loads((out / "advantages" / "label_quality.json").read_text())["ds"]
    assert set(quality["value_spearman_per_fold"]) == {"0", "1"}
    assert all(s > HELDOUT_SPEARMAN_MIN for s in quality["value_spearman_per_fold"].values())
    assert quality["positive_rate"]["all"] == pytest.approx(positive)
    assert stages["advantages"]["summary"]["label_quality"]["ds"]["frames"] == quality["frames"]


def test_portable_run_reports_bad_configs_with_exit_codes(tmp_path):
    proc = _run(["--output", str(tmp_path / "o"), "--config", str(tmp_path / "nope.yaml")], timeout=120)
    assert proc.returncode == 3 and proc.stderr.startswith("error: config file ") and "does not exist" in proc.stderr
    (tmp_path / "ds").mkdir()
    (tmp_path / "bad.yaml").write_text("value:\n  model: {folds: 0}\n")
    proc = _run(["--output", str(tmp_path / "o"), "--config", str(tmp_path / "bad.yaml")], timeout=120)
    assert proc.returncode == 4 and proc.stdout == ""  # the file the value came from leads (audit56 D8)
    assert proc.stderr.startswith(f"error: {tmp_path / 'bad.yaml'}: value.model.folds=0 must be >= 1")
    (tmp_path / "bad2.yaml").write_text("value:\n  train:\n    max_steps: 1\n    global_batch: 5\n")
    proc = _run(["--output", str(tmp_path / "o"), "--config", str(tmp_path / "bad2.yaml")], timeout=120)
    assert proc.returncode == 4 and "global_batch=5 is not divisible" in proc.stderr
    assert not (tmp_path / "o").exists()  # nothing half-written
