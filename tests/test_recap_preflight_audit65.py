"""A training set smaller than a training stage's global batch, and `value.model.folds` above a dataset's episode
count, are refused by the recipe's preflight before any stage runs, naming the full config key (audit65_E M1, L1):
they were refused only when each stage started (after the earlier ones had trained), naming `global_batch` or `folds`
alone, so lowering value's batch met the same error from the policy stage later. The policy's filtered_bc set (known
only when the stage reads is_success) is refused by the stage before training, naming the key and the mode; GRPO's
sft stage is checked like RECAP's policy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from reproduction.data.writer import EpisodeData, write_dataset
from reproduction.errors import ConfigError
from reproduction.recipes.recap.config import load_config

REPO = Path(__file__).resolve().parent.parent
STAGES = ["returns", "value", "advantages", "policy"]
TINY = [
    "value.model.preset=tiny",
    "value.model.cameras={base_0_rgb: observation.images.none}",
    "value.model.state_keys=[observation.state]",
]


def _dataset(root: Path, lengths: list[int], *, success: list[bool] | None = None) -> Path:
    """A rollout dataset with one episode per entry of `lengths` (frames), state 3, action 2, is_success."""
    eps = []
    for e, n in enumerate(lengths):
        ok = np.zeros(n, bool)
        ok[-1] = True if success is None else success[e]
        frames = {
            "observation.state": np.zeros((n, 3), np.float32),
            "action": np.zeros((n, 2), np.float32),
            "is_success": ok,
        }
        eps.append(EpisodeData(episode_index=e, task="pick", frames=frames))
    feats = {
        "observation.state": {"dtype": "float32", "shape": [3]},
        "action": {"dtype": "float32", "shape": [2]},
        "is_success": {"dtype": "bool", "shape": [1]},
    }
    return write_dataset(root, eps, fps=10, features=feats)


def _batch(section: str, n: int) -> list[str]:
    return [f"{section}.train.global_batch={n}", f"{section}.train.micro_batch={n}"]


def _problems(tmp_path: Path, datasets: str, *overrides: str, stages=STAGES) -> list:
    from reproduction.recipes.recap.recipe import preflight

    config = load_config(None, [f"datasets={datasets}", *TINY, *overrides])
    return [p for p in preflight(config, tmp_path / "run", {}, stages) if "min_free_gb" not in str(p.field or "")]


def _run(tmp_path: Path, out: Path, ds: Path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "reproduction.portable", "run", "--output", str(out), "--stages", ",".join(STAGES)]
        + [f"datasets=[{{path: {ds}, type: rollout}}]", *TINY, *overrides],
        capture_output=True,
        text=True,
        timeout=180,
        env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "HOME": str(tmp_path)},
    )


def test_both_training_stages_too_small_are_refused_at_once_before_returns_runs(tmp_path):
    five = _dataset(tmp_path / "five", [5])  # audit65_E's split: one 5-frame episode
    out = tmp_path / "run"
    proc = _run(tmp_path, out, five, *_batch("value", 8), *_batch("policy", 8))
    assert proc.returncode == 56, proc.stderr
    first = proc.stderr.splitlines()[0]
    assert first.startswith("error: preflight found 2 problems: ")
    assert "value.train.global_batch=8: the value model's training set has 5 samples, fewer than one global batch" in (
        first
    )
    assert "policy.train.global_batch=8: the policy's training set has 5 samples" in first
    assert "Traceback" not in proc.stderr
    assert not out.exists()  # nothing written: no returns/, no run.json


def test_value_batch_alone_is_exit_4_naming_the_key_in_message_and_hint(tmp_path):
    five = _dataset(tmp_path / "five", [5])
    out = tmp_path / "run"
    proc = _run(tmp_path, out, five, *_batch("value", 8), *_batch("policy", 4))
    assert proc.returncode == 4, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0] == (
        "error: value.train.global_batch=8: the value model's training set has 5 samples, fewer than one global batch"
    )
    assert lines[1] == (
        "hint: lower value.train.global_batch to at most 5 (a multiple of value.train.micro_batch x world_size), or "
        "add data"
    )
    assert not out.exists()


def test_folds_above_a_datasets_episodes_is_refused_naming_value_model_folds(tmp_path):
    five = _dataset(tmp_path / "five", [5])
    out = tmp_path / "run"
    proc = _run(tmp_path, out, five, "value.model.folds=2", *_batch("value", 2), *_batch("policy", 4))
    assert proc.returncode == 4, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("error: value.model.folds=2: datasets[0] (five) has 1 episode(s), fewer than the folds")
    assert lines[1].startswith("hint: lower value.model.folds to at most 1")
    assert not out.exists()


def test_cross_fitting_models_train_on_their_folds_complement(tmp_path):
    two = _dataset(tmp_path / "two", [4, 4])
    sets = f"[{{path: {two}, type: rollout}}]"
    assert _problems(tmp_path, sets, *_batch("value", 8), *_batch("policy", 8)) == []  # one model: all 8 frames
    (problem,) = _problems(tmp_path, sets, "value.model.folds=2", *_batch("value", 8), *_batch("policy", 8))
    assert isinstance(problem, ConfigError) and problem.exit_code == 4 and problem.field == "value.train.global_batch"
    assert problem.message == (
        "value.train.global_batch=8: the value model's training set has 4 samples (model 0 of 2 trains without fold "
        "0's episodes), fewer than one global batch"
    )
    assert "value.model.folds" in problem.hint
    assert _problems(tmp_path, sets, "value.model.folds=2", *_batch("value", 4), *_batch("policy", 8)) == []


def test_only_the_selected_stages_are_checked_and_a_mixture_counts_its_samples(tmp_path):
    five = _dataset(tmp_path / "five", [5])
    three = _dataset(tmp_path / "three", [3])
    sets = f"[{{path: {five}, type: rollout}}]"
    assert _problems(tmp_path, sets, *_batch("value", 8), *_batch("policy", 8), stages=["returns"]) == []
    (problem,) = _problems(tmp_path, sets, *_batch("value", 8), *_batch("policy", 8), stages=["returns", "value"])
    assert problem.field == "value.train.global_batch"
    (problem,) = _problems(tmp_path, sets, *_batch("value", 8), *_batch("policy", 8), stages=["policy"])
    assert problem.field == "policy.train.global_batch"
    # two datasets mixed by weight: the value stage's mixture holds 5 + 3 = 8 samples here (its own rule), policy 8
    both = f"[{{path: {five}, type: rollout}}, {{path: {three}, type: rollout}}]"
    assert _problems(tmp_path, both, *_batch("value", 8), *_batch("policy", 8)) == []
    # weights 1 and 3 without balancing: the mixture repeats `three` to its share (5 + 15 = 20 samples)
    weighted = f"[{{path: {five}, type: rollout}}, {{path: {three}, type: rollout, weight: 3}}]"
    over = ("value.model.balance_weights=false", *_batch("policy", 8))
    assert _problems(tmp_path, weighted, *over, *_batch("value", 20)) == []
    (problem,) = _problems(tmp_path, weighted, *over, "value.train.global_batch=21", "value.train.micro_batch=21")
    assert "has 20 samples" in problem.message


def test_filtered_bc_set_smaller_than_the_batch_names_the_key_before_training(tmp_path):
    from reproduction.recap.policy.config import PolicyConfig
    from reproduction.recap.policy.data import PolicySource, open_policy_input
    from reproduction.recap.policy.task import train_policy
    from reproduction.train.config import TrainConfig

    ds = _dataset(tmp_path / "half", [4, 4], success=[False, True])  # filtered_bc keeps 4 of 8 frames
    inp = open_policy_input(PolicySource(path=str(ds), type="rollout"), need_labels=False)
    train = TrainConfig(max_steps=1, global_batch=8, micro_batch=8, launcher="inprocess", device="cpu")
    out = tmp_path / "policy" / "filtered_bc"
    with pytest.raises(ConfigError) as err:
        train_policy([inp], PolicyConfig(), out, mode="filtered_bc", train=train, batch_key="policy.train.global_batch")
    assert err.value.exit_code == 4 and err.value.field == "policy.train.global_batch"
    assert err.value.message == (
        "policy stage (filtered_bc): the training set has 4 samples (the frames of successful episodes), fewer than "
        "policy.train.global_batch=8"
    )
    assert err.value.hint.startswith("lower policy.train.global_batch to at most 4")
    assert not (out / "checkpoints").exists()


def test_grpo_sft_set_smaller_than_its_batch_is_refused_in_preflight(tmp_path):
    from reproduction.recipes.grpo.config import GrpoRunConfig
    from reproduction.recipes.grpo.preflight import preflight
    from reproduction.run.config import load_config as load_run_config

    five = _dataset(tmp_path / "five", [5])
    config = REPO / "bundle" / "grpo" / "config.yaml"

    def problems(*over: str, stages=("sft", "rl", "eval", "compare")) -> list:
        cfg = load_run_config(
            [config],
            [f"sft.datasets=[{{path: {five}}}]", *over],
            bundle=tmp_path,
            run_dir=tmp_path / "run",
            schema=GrpoRunConfig,
        )
        found = preflight(cfg, tmp_path / "run", {}, list(stages))
        return [p for p in found if str(getattr(p, "field", "") or "").startswith("sft.train")]

    (problem,) = problems(*_batch("sft", 8))
    assert isinstance(problem, ConfigError) and problem.exit_code == 4
    assert problem.message == (
        "sft.train.global_batch=8: the SFT training set has 5 samples (the frames of sft.datasets), fewer than one "
        "global batch"
    )
    assert problem.hint.startswith("lower sft.train.global_batch to at most 5")
    assert problems(*_batch("sft", 5)) == []
    assert problems(*_batch("sft", 8), stages=("eval",)) == []
