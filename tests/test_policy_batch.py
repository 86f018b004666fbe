"""The trainer's batched fast path for the policy equals the per-sample path (getitem, route, collate)."""

from __future__ import annotations

import numpy as np
import torch

from reproduction.recap.policy.conditioning import route
from reproduction.recap.policy.config import SETUP_NAME, PolicyConfig
from reproduction.recap.policy.data import PolicySource, open_policy_input
from reproduction.recap.policy.setup import prepare_policy_setup
from reproduction.recap.policy.task import make_policy_task
from reproduction.train.config import TrainConfig
from reproduction.train.data_order import sample_uniforms
from reproduction.train.task import BatchKeys
from tests.policy_synth import write_labels, write_policy_dataset


def test_sample_uniforms_are_per_position_and_independent_of_the_batch():
    a = sample_uniforms(3, 1, np.arange(1000), k=2)
    assert a.shape == (1000, 2) and (a >= 0).all() and (a < 1).all()
    assert np.array_equal(sample_uniforms(3, 1, np.arange(200, 300), k=2), a[200:300])
    assert not np.array_equal(sample_uniforms(3, 2, np.arange(1000), k=2), a)
    assert not np.array_equal(sample_uniforms(4, 1, np.arange(1000), k=2), a)
    assert abs(a.mean() - 0.5) < 0.03 and abs(np.corrcoef(a[:, 0], a[:, 1])[0, 1]) < 0.1


def test_make_batch_matches_the_per_sample_path(tmp_path):
    ds = write_policy_dataset(tmp_path / "rollouts", episodes=6, length=8)
    adv = write_labels(ds, tmp_path / "adv", tag="t")
    src = PolicySource(path=str(ds), type="rollout", advantages=str(adv), tag="t")
    config = PolicyConfig(condition_dropout=0.3, positive_only=False)
    inputs = [open_policy_input(src, need_labels=True)]
    prepare_policy_setup(inputs, config, tmp_path / "out", mode="recap", train=TrainConfig(max_steps=1), resume=False)
    task = make_policy_task(0, 1, setup_path=str(tmp_path / "out" / SETUP_NAME))
    keys = BatchKeys(indices=np.array([5, 0, 17, 33, 2, 40]), positions=np.arange(10, 16), epoch=2, seed=7)
    fast = task.make_batch(keys)
    u = keys.uniforms(1)[:, 0]
    samples = [dict(task.train_dataset[int(i)]) for i in keys.indices]
    for s, draw in zip(samples, u):
        s["kind"] = route(s["label"], float(draw), mode="recap", dropout=0.3, positive_only=False)
    slow = task.collate(samples)
    assert len(set(fast["kind"].tolist())) > 1  # the draws route to several prompts
    for key in ("state", "actions", "kind", "label"):
        assert torch.equal(fast[key], slow[key]), key
    for row in range(len(samples)):  # same tokens (padding may differ in length)
        assert fast["input_ids"][row][fast["attention_mask"][row]].tolist() == (
            slow["input_ids"][row][slow["attention_mask"][row]].tolist()
        )
    rows = fast["prompt_ids"][fast["prompt_index"]]
    assert torch.equal(rows, fast["input_ids"]) and len(fast["prompt_ids"]) == len(set(fast["kind"].tolist()))
    x, t = torch.randn(6, 4, 4), torch.rand(6)
    with torch.no_grad():
        assert torch.allclose(task.model(fast, x, t), task.model(slow, x, t), atol=1e-5)
