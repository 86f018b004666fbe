"""The explicit training loop one worker runs: resume, steps with accumulation, eval, save, export.

A resume starts from the newest checkpoint at or below `max_steps` and ends exactly at `max_steps`; checkpoints
above it are left untouched (`_resume`, audit55 G2).

Every rank runs `run_worker` with the same arguments; collectives happen at the same points on all
ranks (metrics at log steps, eval, checkpoints, export), decided by the step number alone.
"""

from __future__ import annotations

import gc
import hashlib
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from reproduction.digest_cache import tree_lines
from reproduction.digests import sha256_file
from reproduction.errors import CheckpointError, ResumeRefusedError
from reproduction.train import checkpoint, data_order, dist, fsdp
from reproduction.train.config import TrainConfig, trained_with
from reproduction.train.device import DeviceSpec, rng_module
from reproduction.train.metrics import MetricsLog, read_records
from reproduction.train.task import BatchKeys, EvalContext, TrainResult, TrainTask

_LOOP_KEYS = ("lr_factor", "skipped_steps", "samples_per_s")  # what the loop adds to a task's train metrics


@dataclass(kw_only=True)
class _State:
    """What a worker carries between steps."""

    task: TrainTask
    model: torch.nn.Module
    optim: torch.optim.Optimizer
    canary: Any
    device: torch.device
    accel: Any
    step: int = 0
    resumed_from: int | None = None
    resumed_from_dir: Path | None = None
    """The checkpoint folder `step_<resumed_from>` this invocation loaded (None: a fresh start)."""
    resumed_from_sha256: str | None = None
    """Its tree digest as loaded (`loaded_checkpoint_sha256`), taken before training saves or prunes anything."""
    trainer: dict[str, int] = field(default_factory=lambda: {"skipped_steps": 0, "samples_seen": 0})
    train_metrics: dict[str, float] = field(default_factory=dict)
    eval_metrics: dict[str, float] = field(default_factory=dict)
    checkpoint_dir: Path | None = None
    train_seconds: float = 0.0
    train_samples: int = 0
    load_seconds: float = 0.0
    world_sizes: list[int] = field(default_factory=list)
    """The world sizes that trained the steps before this invocation (from the checkpoint resumed)."""


def run_worker(
    make_task: Callable[[int, int], TrainTask],
    config: TrainConfig,
    *,
    out_dir: Path,
    resume: bool,
    spec: DeviceSpec,
    device: torch.device,
    on_record: Callable[[dict], None] | None = None,
) -> TrainResult | None:
    """Train inside an initialised process group; rank 0 returns the TrainResult, others None."""
    rank, world = dist.rank(), dist.world_size()
    task = make_task(rank, world)
    model = fsdp.shard(task.model, device=device, mixed_precision=config.mixed_precision, units=task.fsdp_units)
    st = _State(
        task=task,
        model=model,
        optim=_optimizer(model, task, config, device),
        device=device,
        canary=_canary_batch(task, config),
        accel=rng_module(spec),
    )
    _seed(config.seed, rank, 0)
    root = Path(out_dir) / "checkpoints"
    if resume:
        _resume(st, root, config)
    elif dist.broadcast_object(checkpoint.complete_steps(root) if dist.is_main() else None):
        raise CheckpointError(
            f"{root} already holds checkpoints and resume is off",
            path=root,
            hint="pass resume=True (--resume) to continue, or use a new out_dir",
        )
    log = MetricsLog(out_dir, resume_step=st.resumed_from) if dist.is_main() else None

    def emit(split: str, metrics: dict[str, float]) -> None:
        if log is not None:
            record = log.log(st.step, split, metrics)
            if on_record is not None:
                on_record(record)

    try:
        if st.resumed_from is not None:
            emit("resume", {"load_s": st.load_seconds})
        with _setup_heap_frozen():
            _loop(st, config, root, emit)
        export_dir = Path(out_dir) / "export"
        checkpoint.export(
            st.model,
            export_dir,
            model_config=task.model_config,
            train_config=trained_with(config),  # no same_outputs() field: the export's bytes do not follow one
            extras=task.export_extras,
        )
    finally:
        if log is not None:
            log.close()
    if not dist.is_main():
        return None
    if st.checkpoint_dir is None:  # the run was already complete: report what the log says
        st.checkpoint_dir = checkpoint.step_dir(root, st.step)
        _metrics_from_log(st, Path(out_dir))
    return TrainResult(
        step=st.step,
        resumed_from=st.resumed_from,
        resumed_from_dir=st.resumed_from_dir,
        resumed_from_sha256=st.resumed_from_sha256,
        train_metrics=st.train_metrics,
        eval_metrics=st.eval_metrics,
        skipped_steps=st.trainer["skipped_steps"],
        checkpoint_dir=st.checkpoint_dir,
        export_dir=export_dir,
        samples_per_s=st.train_samples / st.train_seconds if st.train_seconds else 0.0,
    )


def _loop(st: _State, config: TrainConfig, root: Path, emit: Callable[[str, dict], None]) -> None:
    n = len(st.task.train_dataset)
    data_order.steps_per_epoch(n, config.global_batch)
    window_t, window_samples = 0.0, 0
    for step in range(st.step + 1, config.max_steps + 1):
        t0 = time.perf_counter()
        finite, raw = _train_step(st, config, step, n)
        elapsed = time.perf_counter() - t0
        st.step = step
        st.trainer["samples_seen"] += config.global_batch
        st.trainer["skipped_steps"] += 0 if finite else 1
        st.train_seconds += elapsed
        st.train_samples += config.global_batch
        window_t, window_samples = window_t + elapsed, window_samples + config.global_batch
        last = step == config.max_steps
        if step % config.log_interval == 0 or last:
            values = {k: float(v) for k, v in raw.items()}
            st.train_metrics = dist.mean_dict(values)
            emit(
                "train",
                {
                    **st.train_metrics,
                    "lr_factor": _lr_factor(step, config),
                    "skipped_steps": st.trainer["skipped_steps"],
                    "samples_per_s": window_samples / window_t if window_t else 0.0,
                },
            )
            window_t, window_samples = 0.0, 0
        if (config.eval_interval and step % config.eval_interval == 0) or last:
            _evaluate(st, emit)
        if (config.save_interval and step % config.save_interval == 0) or last:
            _save(st, config, root, emit, n)


@contextmanager
def _setup_heap_frozen() -> Iterator[None]:
    """Keep the objects that exist before the first step out of the cyclic GC while the loop runs.

    Imports (torch, its distributed and compile stacks, Ray in a worker) leave ~350k long-lived
    objects; a full collection walks all of them (0.17-0.2 s here) and Python's thresholds land one
    every few hundred steps, a 200 ms stall measured at step ~160 of a Ray worker's run (13% of a
    1.5 s window). Freezing them after setup, as torchtitan's GarbageCollection tames the same
    pauses, leaves automatic GC on for what the loop itself creates. Unfrozen afterwards: an
    in-process run shares the caller's heap."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _train_step(st: _State, config: TrainConfig, step: int, n: int) -> tuple[bool, dict[str, Any]]:
    """One optimizer step (0-based data step `step - 1`); returns (gradients finite, raw metrics)."""
    factor = _lr_factor(step, config)
    for group in st.optim.param_groups:
        group["lr"] = group["base_lr"] * factor
    rank, world = dist.rank(), dist.world_size()
    batches = data_order.micro_batches(
        step - 1,
        seed=config.seed,
        n=n,
        global_batch=config.global_batch,
        micro_batch=config.micro_batch,
        rank=rank,
        world_size=world,
        shuffle=config.shuffle,
    )
    epoch = data_order.cursor(step - 1, n=n, global_batch=config.global_batch).epoch
    accum = len(batches)
    total = torch.zeros((), dtype=torch.float32, device=st.device)
    sums: dict[str, float] = {}
    for a, (indices, positions) in enumerate(batches):
        batch = to_device(_micro_batch(st.task, config, indices, positions, epoch), st.device)
        if accum > 1:  # reduce-scatter gradients once per step, not once per micro batch
            fsdp.set_gradient_sync(st.model, a == accum - 1)
        loss, metrics = st.task.loss(st.model, batch)
        (loss / accum).backward()
        total += loss.detach().float()
        for k, v in metrics.items():
            sums[k] = sums.get(k, 0.0) + float(v)
    norm = torch.nn.utils.clip_grad_norm_(st.model.parameters(), config.grad_clip or math.inf)
    norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
    finite = bool(torch.isfinite(norm).item())  # same on every rank: the norm is global
    if finite:
        st.optim.step()
    st.optim.zero_grad(set_to_none=True)
    return finite, {"loss": total / accum, "grad_norm": norm, **{k: v / accum for k, v in sums.items()}}


def _micro_batch(task: TrainTask, config: TrainConfig, indices: Any, positions: Any, epoch: int) -> Any:
    """The CPU batch of these samples: the task's batched `make_batch`, or getitem + augment + collate."""
    if task.make_batch is not None:
        return task.make_batch(BatchKeys(indices=indices, positions=positions, epoch=epoch, seed=config.seed))
    samples = [task.train_dataset[int(i)] for i in indices]
    if task.augment is not None:
        samples = [
            task.augment(s, data_order.sample_rng(config.seed, epoch, int(p))) for s, p in zip(samples, positions)
        ]
    return task.collate(samples)


def _lr_factor(step: int, config: TrainConfig) -> float:
    """Linear warmup from 0 (step 1 gets 1/warmup) then constant, as upstream's `constant` schedule."""
    return min(1.0, step / config.warmup_steps) if config.warmup_steps else 1.0


def _optimizer(model: torch.nn.Module, task: TrainTask, config: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    groups = (
        task.param_groups(model)
        if task.param_groups
        else [{"params": [p for p in model.parameters() if p.requires_grad]}]
    )
    for group in groups:
        group.setdefault("lr", config.lr)
        group.setdefault("weight_decay", config.weight_decay)
        group["base_lr"] = group["lr"]
    return torch.optim.AdamW(
        groups,
        lr=config.lr,
        betas=tuple(config.betas),
        eps=config.eps,
        weight_decay=config.weight_decay,
        **_adamw_impl(device),
    )


def _adamw_impl(device: torch.device) -> dict[str, bool]:
    """Fused AdamW where torch has it (cpu, cuda): one kernel for all tensors instead of a Python loop
    of small ops, which on CPU cost more than forward+backward of a small model. NPU: torch's default."""
    return {"fused": True} if device.type in ("cpu", "cuda") else {}


def _canary_batch(task: TrainTask, config: TrainConfig) -> Any:
    if task.canary_batch is not None:
        return task.canary_batch
    k = min(max(1, config.canary_samples), len(task.train_dataset))
    return task.collate([task.train_dataset[i] for i in range(k)])


def _resume(st: _State, root: Path, config: TrainConfig) -> None:
    """Load the newest complete checkpoint AT OR BELOW `config.max_steps`, so a resume ends exactly at max_steps.

    Checkpoints above it (a killed longer run's, e.g. `--target-step 30` killed, then `--target-step 25`) are
    removed once the one below is loaded and checked (`checkpoint.cut_back`; a resume refused there, e.g. for a
    changed config, removes nothing: audit55 review2 C1): the run is cut back to max_steps, as its metrics and
    GRPO's live evaluations are, so a later `--target-step 30` trains steps 26-30 again instead of loading a step_30
    whose steps no log holds (audit55 review). Loading the newest one whatever max_steps said ran no step and
    returned a step above the target, so a multi-mode stage (RECAP's policy: recap, bc, filtered_bc) ended with
    mixed step counts (audit55 G2). Every trainer resumes through here (RECAP's value and policy stages, GRPO's rl
    stage), so the rule holds for all of them. ResumeRefusedError (a CheckpointError, exit 50) where no complete
    checkpoint at or below max_steps is left (keep_last pruned them: keeping the newest keep_last steps, all above
    max_steps, the step_<max_steps> this run would save could not be kept either); nothing is removed then, and
    `portable run` leaves run.json as it was (audit56 K1)."""
    steps = dist.broadcast_object(checkpoint.tidy(root, config.keep_last) if dist.is_main() else None)
    if not steps:
        return
    usable = [s for s in steps if s <= config.max_steps]
    if not usable:  # tidy keeps the newest keep_last: all above max_steps, or training to it could not keep step N
        newer = ", ".join(checkpoint.step_dir(root, s).name for s in steps)
        raise ResumeRefusedError(
            f"{root} holds only {newer}, above this run's max_steps {config.max_steps} (keep_last "
            f"{config.keep_last}); no complete checkpoint at or below it is left to resume from",
            path=checkpoint.step_dir(root, steps[0]),
            hint=f"train to step {steps[-1]} or more (--target-step {steps[-1]}), "
            "or retrain the stage from scratch (--restart-stage)",
        )
    folder = checkpoint.step_dir(root, usable[-1])
    t0 = time.perf_counter()
    manifest = checkpoint.load(
        folder,
        st.model,
        st.optim,
        resume_key=config.resume_key(),
        accel=st.accel,
        kernels=checkpoint.kernels_for(st.device),
    )
    if manifest["world_size"] != dist.world_size():  # per-rank streams cannot carry over: derive new ones
        _seed(config.seed, dist.rank(), manifest["step"])
    checkpoint.check_canary(manifest["canary_loss"], canary_loss(st), rtol=config.canary_rtol, folder=folder)
    if usable != steps and dist.is_main():  # only once the resume is accepted: a refused one removes nothing
        checkpoint.cut_back(root, config.max_steps)
    st.step = st.resumed_from = manifest["step"]
    st.resumed_from_dir = folder
    # Taken now: keep-last prunes this folder once training saves newer steps (audit53 U1)
    st.resumed_from_sha256 = loaded_checkpoint_sha256(folder, manifest) if dist.is_main() else None
    st.trainer = dict(manifest["trainer"])
    st.world_sizes = checkpoint.trained_world_sizes(manifest)
    st.load_seconds = time.perf_counter() - t0


def loaded_checkpoint_sha256(folder: Path, manifest: dict[str, Any]) -> str:
    """The tree digest (lineage's: "<path>\\0<sha256>\\n" per file, sorted) of checkpoint `folder` as `checkpoint.load`
    verified it: its files' digests from `manifest` plus manifest.json's own bytes. Equals lineage's tree_sha256 of
    the folder while it holds just those files, without reading the shards a second time."""
    entries = {rel: entry["sha256"] for rel, entry in manifest["files"].items()}
    entries[checkpoint.MANIFEST] = sha256_file(folder / checkpoint.MANIFEST)
    return hashlib.sha256(tree_lines(entries)).hexdigest()


def _check_finite_weights(st: _State) -> None:
    """CheckpointError unless every parameter is finite on every rank. A non-finite step is skipped (a NaN loss is
    expected now and then), but a learning rate or data that steps the weights to nan/inf leaves every later step
    skipped and would checkpoint and export the broken model as complete (audit52 W4). One sync per save."""
    bad = torch.zeros((), dtype=torch.float64, device=st.device)
    for p in st.model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        bad += (~torch.isfinite(local.detach())).sum()
    count = round(dist.mean_dict({"bad": float(bad)})["bad"] * dist.world_size())
    if count:
        raise CheckpointError(
            f"training reached step {st.step} with {count} non-finite model parameters; nothing of this step is "
            "saved or exported",
            hint="lower the learning rates (train.lr, the model's own lr such as value.model.value_lr) or check the "
            "data for nan values, then rerun the stage",
        )


def _save(st: _State, config: TrainConfig, root: Path, emit: Callable, n: int) -> None:
    _check_finite_weights(st)
    t0 = time.perf_counter()
    cur = data_order.cursor(st.step, n=n, global_batch=config.global_batch)
    st.checkpoint_dir = checkpoint.save(
        root,
        st.step,
        st.model,
        st.optim,
        config_digest=config.digest(),
        resume_key=config.resume_key(),
        data_cursor={
            "next_step": st.step,
            "epoch": cur.epoch,
            "position": cur.position,
            "samples_seen": st.trainer["samples_seen"],
        },
        trainer=st.trainer,
        canary_loss=canary_loss(st),
        keep_last=config.keep_last,
        accel=st.accel,
        kernels=checkpoint.kernels_for(st.device),
        world_sizes=st.world_sizes,
    )
    emit("checkpoint", {"save_s": time.perf_counter() - t0})


def _evaluate(st: _State, emit: Callable) -> None:
    if st.task.evaluate is None:
        return
    ctx = EvalContext(
        rank=dist.rank(), world_size=dist.world_size(), device=st.device, step=st.step, all_gather=dist.all_gather_array
    )
    with _eval_mode(st):
        result = st.task.evaluate(st.model, ctx)
    st.eval_metrics = {k: float(v) for k, v in result.items()}
    emit("eval", st.eval_metrics)


def canary_loss(st: _State) -> float:
    """Loss of the canary batch, computed without disturbing any RNG stream or the train mode.

    The RNGs are seeded with a fixed canary seed first (inside the fork `_eval_mode` restores): a loss
    that draws noise (flow matching) then gives the same canary on every rank and after any load,
    where each rank's own stream would give each rank another value than the one rank 0 saved."""
    with _eval_mode(st):
        _seed(0xCA7A, 0, 0)
        loss, _ = st.task.loss(st.model, to_device(st.canary, st.device))
    return float(loss)


@contextmanager
def _eval_mode(st: _State) -> Iterator[None]:
    """Eval mode, no grad, and every RNG restored afterwards (so eval never shifts training)."""
    saved = checkpoint.capture_rng(st.accel)
    st.model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        st.model.train()
        checkpoint.restore_rng(saved, st.accel)


def _seed(seed: int, rank: int, step: int) -> None:
    import random

    words = np.random.SeedSequence([seed, rank, step, 0x7A1]).generate_state(2)
    torch.manual_seed(int(words[0]))
    np.random.seed(int(words[1]))
    random.seed(int(words[0]) ^ int(words[1]))


def _metrics_from_log(st: _State, out_dir: Path) -> None:
    for record in read_records(out_dir / "metrics.jsonl"):
        if record["split"] == "train":
            st.train_metrics = {k: v for k, v in record["metrics"].items() if k not in _LOOP_KEYS}
        elif record["split"] == "eval":
            st.eval_metrics = dict(record["metrics"])


def to_device(batch: Any, device: torch.device) -> Any:
    """Move every tensor in a (nested dict/list/tuple) batch to `device`; other values unchanged."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=device.type != "cpu")
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch
