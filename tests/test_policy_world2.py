"""Stage 4 at world size 2 (two Ray workers, gloo, CPU, FSDP2): a run killed at a checkpoint and
resumed matches its own uninterrupted run bit for bit (weights and every logged loss)."""

from __future__ import annotations

import json

import pytest
import torch

from reproduction.recap.policy.config import PolicyConfig
from reproduction.recap.policy.data import PolicySource, open_policy_input
from reproduction.recap.policy.task import train_policy
from reproduction.train.config import TrainConfig
from tests.policy_synth import write_labels, write_policy_dataset

pytestmark = pytest.mark.slow


def _inputs(root):
    ds = write_policy_dataset(root / "rollouts", episodes=8, length=10)
    adv = write_labels(ds, root / "adv", tag="t")
    demos = write_policy_dataset(root / "demos", episodes=2, length=10, seed=3, success=False)
    src = PolicySource(path=str(ds), type="rollout", advantages=str(adv), tag="t")
    return [
        open_policy_input(src, need_labels=True),
        open_policy_input(PolicySource(path=str(demos), type="sft"), need_labels=False),
    ]


def _config(steps: int) -> dict:
    """train_policy's config, mode and train (keywords)."""
    train = TrainConfig(
        max_steps=steps, global_batch=8, micro_batch=2, world_size=2, launcher="ray", lr=1e-3, save_interval=2,
        log_interval=1, start_timeout_s=300,
    )  # fmt: skip
    return {"config": PolicyConfig(condition_dropout=0.3), "mode": "recap", "train": train}


def _losses(out):
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["metrics"]["loss"] for r in records if r.get("split") == "train"}


def test_world_size_2_resume_matches_the_uninterrupted_run(tmp_path, ray_address):
    inputs = _inputs(tmp_path)
    straight = train_policy(inputs, out_dir=tmp_path / "a", **_config(4), ray_address=ray_address)
    train_policy(inputs, out_dir=tmp_path / "b", **_config(2), ray_address=ray_address)
    resumed = train_policy(inputs, out_dir=tmp_path / "b", **_config(4), resume=True, ray_address=ray_address)
    assert resumed.resumed_from == 2 and straight.step == resumed.step == 4
    from safetensors.torch import load_file

    a = load_file(str(straight.export_dir / "model.safetensors"))
    b = load_file(str(resumed.export_dir / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert _losses(tmp_path / "a") == _losses(tmp_path / "b") and len(_losses(tmp_path / "a")) == 4
    manifest = json.loads((straight.checkpoint_dir / "manifest.json").read_text())
    assert manifest["world_size"] == 2  # trained sharded (FSDP2 over gloo), not silently on one worker
