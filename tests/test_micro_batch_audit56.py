"""audit56 D1: `train.micro_batch` (and GRPO's `rl.micro_init_states`) change what a run computes, so they are in the
stage key and the resume key: a `--resume` that changes one is refused (exit 52) naming it, instead of keeping
outputs a fresh run would not produce. Why they change outputs: flow matching draws its noise and time (and openpi's
image augmentation its crop/colour) from torch's RNG once per forward, so another split trains on other draws."""

from __future__ import annotations

import torch
from test_grpo_cli import CONFIG, portable

from reproduction.config_fields import output_free_keys, resume_free_fields
from reproduction.recap.policy.task import policy_loss
from reproduction.recipes.grpo.config import RlSection
from reproduction.recipes.grpo.train import FREE_ON_RESUME
from reproduction.train.config import RESUME_KEY_FIELDS, TrainConfig


def test_micro_batch_and_micro_init_states_change_outputs():
    assert "micro_batch" in RESUME_KEY_FIELDS
    assert "micro_batch" not in output_free_keys(TrainConfig) + list(resume_free_fields(TrainConfig))
    assert "micro_init_states" not in output_free_keys(RlSection) and "micro_init_states" not in FREE_ON_RESUME
    a, b = TrainConfig(max_steps=1, micro_batch=2), TrainConfig(max_steps=1, micro_batch=4)
    assert a.resume_key()["micro_batch"] == 2 and a.digest() != b.digest()


class _Velocity(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.linspace(-1.0, 1.0, 6).reshape(1, 1, 6))

    def forward(self, batch, x_t, t):
        return x_t * self.w + t.view(-1, 1, 1)


def _grad(splits: int) -> torch.Tensor:
    torch.manual_seed(0)
    model = _Velocity()
    actions = torch.arange(8 * 4 * 6, dtype=torch.float32).reshape(8, 4, 6) / 100
    batch = {"actions": actions, "kind": torch.zeros(8), "label": torch.ones(8)}
    for part in torch.chunk(torch.arange(8), splits):
        loss, _ = policy_loss(model, {k: v[part] for k, v in batch.items()})
        (loss / splits).backward()
    return model.w.grad.clone()


def test_the_flow_matching_gradient_depends_on_the_split():
    """The cause: one batch of 8 as one micro batch or as two of 4 draws other noise/time per sample (torch's RNG
    per forward), so the gradients differ by far more than float rounding."""
    whole, halves = _grad(1), _grad(2)
    assert (whole - halves).abs().max() > 1e-3


def test_resume_with_another_micro_batch_is_refused_naming_it(tmp_path):
    from reproduction.sim.generate import GenConfig, generate_dataset

    bundle = tmp_path / "bundle"  # ${BUNDLE}: the config reads ${BUNDLE}/data/sft
    generate_dataset(
        GenConfig(kind="sft", tasks=("FetchPush-v4",), episodes_per_task=3, cameras=()), bundle / "data" / "sft"
    )
    common = ("run", str(bundle), "--config", str(CONFIG), "--output", "run", "--stages", "sft")
    tiny = ("sft.train.max_steps=2", "sft.train.global_batch=8", "sft.train.log_interval=1")
    made = portable(*common, *tiny, "sft.train.micro_batch=8", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    model = (tmp_path / "run/sft/export/model.safetensors").read_bytes()
    refused = portable(*common, "--resume", *tiny, "sft.train.micro_batch=4", cwd=tmp_path)
    assert refused.returncode == 52, refused.stderr
    assert "sft.train.micro_batch" in refused.stderr
    assert (tmp_path / "run/sft/export/model.safetensors").read_bytes() == model
    # the same micro batch is still up to date
    again = portable(*common, "--resume", *tiny, "sft.train.micro_batch=8", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
