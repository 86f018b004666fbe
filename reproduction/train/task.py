"""The contract between a stage and the trainer: what a `TrainTask` gives and what `train()` returns.

A stage (value SFT, CFG policy) describes its job as a `TrainTask` and calls

    from reproduction.train.api import train
    result = train(make_task, config, out_dir=path, resume=True)

`make_task(rank, world_size) -> TrainTask` is a picklable top-level function (or a
`functools.partial` of one); it runs INSIDE each worker process, after the process group exists,
so models and datasets are never pickled across processes. Rules a task must keep:

- `model` is built the same way on every rank (seed it: `torch.manual_seed(...)` before building);
  the trainer moves it to the device and shards it with FSDP2 (`fsdp_units` first, then the root);
  one fp32 worker keeps it unsharded (nothing to shard; see train/fsdp.py). Parameter names are
  the same either way, and checkpoints move between world sizes.
- `train_dataset` is map-style: `len()` and `[i] -> sample`. The trainer decides the order
  (reproduction/train/data_order.py: a function of (seed, epoch, position), sharded by rank) and
  calls `augment(sample, rng)` with a per-sample `numpy.random.Generator` derived from
  (seed, epoch, position), so augmentation is reproducible across kill/resume and world sizes.
- `make_batch(keys) -> batch` (optional) replaces `train_dataset[i]`, `augment` and `collate` for a
  training micro batch: `keys` (`BatchKeys`) holds the dataset indices, their epoch positions, the
  epoch and the seed, and `keys.uniforms(k)` gives the per-sample draws (a function of (seed, epoch,
  position), like `augment`'s RNG), so a task gathers a whole batch with array operations instead
  of building hundreds of per-sample dicts and Generators per step. The canary still uses `collate`.
- `collate(samples) -> batch` builds CPU tensors (a tensor, or dict/list/tuple of them); the trainer
  moves every tensor in the batch to the device before calling `loss`.
- `loss(model, batch) -> (loss, metrics)`: `loss` is the MEAN over the micro batch (a 0-d tensor
  with grad); `metrics` are floats with the SAME keys on every rank and call, averaged over micro
  batches and ranks and logged as `train/<k>` (the loop adds loss, grad_norm, lr_factor,
  skipped_steps and samples_per_s). `loss` is also called (eval mode, no grad) on the canary batch.
- `evaluate(model, ctx) -> metrics` runs on ALL ranks at once (FSDP forward needs every rank); use
  `ctx.shard(n)` to split an eval set, `ctx.all_gather(array)` to collect per-rank numpy arrays in
  rank order, and return the same dict on every rank (rank 0's is logged as `eval/<k>`). The model
  is in eval mode under `torch.no_grad()`.
- `param_groups(model) -> [{"params": [...], "lr": ..., ...}]` builds AdamW groups from the SHARDED
  model's `named_parameters()` (names are unchanged by FSDP2). A group without "lr" gets
  `config.lr`; the warmup factor multiplies each group's own lr.
- `canary_batch` is a fixed batch whose loss is stored in each checkpoint and recomputed after a
  load; a mismatch beyond `config.canary_rtol` raises `CheckpointError` (exit 50). Default: the
  collate of the first `config.canary_samples` dataset samples, without augmentation.
- `export_extras(dir)` writes task files (model config, tokenizer, return range) next to the
  model-only export `export/model.safetensors`; called on rank 0 only.
- `model_config` is a JSON-able dict written as `export/model_config.json` (what rebuilds the model).

RNG: torch, numpy and python RNG states are saved per rank in each checkpoint and restored on
resume with the same world size; the canary and eval run inside a forked RNG so they do not perturb
training. Tasks that need randomness in `loss` (dropout, noise) get exact resume for free.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch/numpy stay out of import time: Ray helper processes import this module
    import numpy as np
    import torch
    from torch import nn


@dataclass(kw_only=True)
class EvalContext:
    """What `TrainTask.evaluate` gets: where it runs and how to combine results across ranks."""

    rank: int
    """This worker's rank in [0, world_size)."""
    world_size: int
    """Number of workers evaluating together."""
    device: torch.device
    """Where the model lives; move eval batches here."""
    step: int
    """The optimizer step just finished (the one being evaluated)."""
    all_gather: Callable[[np.ndarray], np.ndarray]
    """Concatenate a per-rank numpy array (any first-axis length, same trailing shape and dtype)
    along axis 0 in rank order; every rank gets the whole array."""

    def shard(self, n: int) -> range:
        """The indices of an n-item eval set this rank evaluates: a contiguous block, no padding and
        no duplicates (upstream's DistributedSampler padding double-counted samples)."""
        lo = n * self.rank // self.world_size
        hi = n * (self.rank + 1) // self.world_size
        return range(lo, hi)


@dataclass(frozen=True, kw_only=True)
class BatchKeys:
    """One training micro batch as `TrainTask.make_batch` receives it."""

    indices: np.ndarray
    """Dataset indices (int64), in batch order."""
    positions: np.ndarray
    """Their positions within the epoch's order (what fixes per-sample randomness)."""
    epoch: int
    seed: int

    def uniforms(self, k: int = 1) -> np.ndarray:
        """(len(indices), k) uniform draws in [0, 1), each a function of (seed, epoch, position, j)."""
        from reproduction.train.data_order import sample_uniforms

        return sample_uniforms(self.seed, self.epoch, self.positions, k)


@dataclass(kw_only=True)
class TrainTask:
    """One training job, built inside each worker by `make_task(rank, world_size)`."""

    model: nn.Module
    """The model, same init on every rank (seeded)."""
    train_dataset: Sequence
    """Map-style training set: `len()` and `[i] -> sample`."""
    collate: Callable[[list], Any]
    """List of samples -> batch of CPU tensors (tensor or dict/list/tuple of tensors)."""
    loss: Callable[[nn.Module, Any], tuple[torch.Tensor, dict[str, float]]]
    """(model, batch on device) -> (mean loss over the micro batch, float metrics)."""
    evaluate: Callable[[nn.Module, EvalContext], dict[str, float]] | None = None
    """Runs on all ranks at eval intervals and at the last step; returns the same dict everywhere."""
    param_groups: Callable[[nn.Module], list[dict]] | None = None
    """AdamW param groups from the sharded model (e.g. a head at a higher lr); None = one group."""
    augment: Callable[[Any, np.random.Generator], Any] | None = None
    """Per-sample augmentation with an RNG derived from (seed, epoch, position); None = none."""
    make_batch: Callable[[BatchKeys], Any] | None = None
    """Batched fast path for training micro batches (module docstring); None = getitem + augment + collate."""
    canary_batch: Any | None = None
    """Fixed batch whose loss is checked after every checkpoint load; None = first samples."""
    fsdp_units: Callable[[nn.Module], list[nn.Module]] | None = None
    """Submodules to shard as their own FSDP2 units (e.g. transformer blocks), before the root."""
    export_extras: Callable[[Path], None] | None = None
    """Writes task files next to the model-only export (rank 0 only)."""
    model_config: dict[str, Any] = field(default_factory=dict)
    """JSON-able description of the model, written as export/model_config.json."""


@dataclass(kw_only=True)
class TrainResult:
    """What `train()` returns to the stage (built from rank 0's view)."""

    step: int
    """The last optimizer step taken (== config.max_steps on success)."""
    resumed_from: int | None
    """The checkpoint step the run continued from, or None for a fresh start."""
    train_metrics: dict[str, float]
    """The last logged `train/*` metrics (without the prefix)."""
    eval_metrics: dict[str, float]
    """The last `evaluate` result (empty when the task has no evaluate)."""
    skipped_steps: int
    """Steps skipped because the gradient norm was not finite (over the whole run, resumes included)."""
    checkpoint_dir: Path
    """The final complete checkpoint `checkpoints/step_N/`."""
    export_dir: Path
    """The model-only export: model.safetensors, model_config.json, train_config.json, extras."""
    samples_per_s: float
    """Training throughput of this invocation (excludes startup, eval and saving)."""
    resumed_from_dir: Path | None = None
    """The checkpoint folder `checkpoints/step_<resumed_from>` it loaded (None for a fresh start)."""
    resumed_from_sha256: str | None = None
    """That folder's tree digest as loaded (lineage's tree digest: manifest.json, which lists every file's sha256, and
    the files it lists), taken at load time: keep-last usually deletes the folder before the stage ends."""
