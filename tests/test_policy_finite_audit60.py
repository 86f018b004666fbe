"""A NaN or inf in what the policy reads (its state features, the action) is refused before training with a
DatasetError (exit 40) naming the dataset, the feature and the first episode and frame, as the value model's state is
(audit60_E E1: before, the policy trained with every loss NaN, every step skipped, exit 0, and policy.json held bare
NaN/Infinity). A `value: false` dataset's bad value state is refused by the value stage before it trains, not by the
advantages stage after (E2). Tiny datasets from the project's writer (policy_synth.write_small_rollout)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from policy_synth import tiny_value, write_small_rollout

from reproduction.errors import DatasetError
from reproduction.recap.policy.data import PolicySource, open_policy_input

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the writer's stats


def _open(root: Path, **kw):
    return open_policy_input(PolicySource(path=str(root), type="rollout"), need_labels=False, **kw)


@pytest.mark.parametrize(
    ("feature", "value"),
    [("observation.state", np.nan), ("observation.goal", np.inf), ("action", np.inf), ("action", -np.inf)],
)
def test_a_non_finite_policy_input_is_refused_naming_dataset_feature_and_frame(tmp_path, feature, value):
    root = write_small_rollout(tmp_path / "ds", bad=feature, value=value)
    with pytest.raises(DatasetError) as err:
        _open(root)
    assert err.value.exit_code == 40
    what = "action" if feature == "action" else "state"
    assert str(err.value) == (
        f"{root}: the policy's {what} feature {feature!r} is NaN or inf at 2 frame(s), the first at episode 1 frame 1"
    )
    assert err.value.field == feature


def test_components_the_policy_does_not_read_may_be_non_finite(tmp_path):
    root = write_small_rollout(tmp_path / "ds", bad="observation.state")
    inp = _open(root, state_keys=["observation.state"], state_dims=[0, 2])  # component 1 is not read
    assert inp.state.shape == (12, 2) and np.isfinite(inp.state).all()
    inp = _open(write_small_rollout(tmp_path / "ok"))
    assert inp.state.shape == (12, 5) and inp.action.shape == (12, 2)


TINY = [  # the auditor's cfg_pol.yaml: a tiny value model on CPU, two steps, then the policy
    *tiny_value(workers=1),
    "policy.model.preset=tiny",
    "policy.model.cameras={}",
    "policy.train.max_steps=2",
    "policy.train.global_batch=4",
    "policy.train.micro_batch=4",
]


def _run(tmp_path: Path, stages: str, datasets: str, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "reproduction.portable", "run", "--output", str(tmp_path / "run"), "--stages", stages]
        + [f"datasets={datasets}", *overrides],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "HOME": str(tmp_path)},
    )


def test_portable_run_policy_stage_exits_40_on_an_inf_action(tmp_path):
    root = write_small_rollout(tmp_path / "inf_action", bad="action", value=np.inf)
    proc = _run(tmp_path, "returns,value,advantages,policy", f"[{{path: {root}, type: rollout}}]", *TINY)
    assert proc.returncode == 40, proc.stderr
    assert (
        f"error: {root}: the policy's action feature 'action' is NaN or inf at 2 frame(s), the first at episode 1 "
        "frame 1"
    ) in proc.stderr.splitlines()


def test_value_stage_refuses_a_value_false_dataset_with_nan_state_before_training(tmp_path):
    good = write_small_rollout(tmp_path / "good")
    bad = write_small_rollout(tmp_path / "nan_state", bad="observation.state")
    proc = _run(
        tmp_path,
        "returns,value,advantages",
        f"[{{path: {good}, type: rollout}}, {{path: {bad}, type: rollout, value: false}}]",
        "value.model.state_keys=[observation.state]",
        *TINY,
    )
    assert proc.returncode == 40, proc.stderr
    assert (
        f"error: {bad}: the value model's state feature 'observation.state' is NaN or inf at 2 frame(s), the first "
        "at episode 1 frame 1"
    ) in proc.stderr.splitlines()
    # refused by the value stage before training (before: the advantages stage, after value trained and completed)
    assert not list((tmp_path / "run" / "value").glob("model_*"))
    assert not (tmp_path / "run" / "advantages").exists()
