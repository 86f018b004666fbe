"""A tiny MLP regression task for the training-core tests, plus a child-process entry point.

`python3 tests/train_tiny.py OUT --world-size 2 --max-steps 24 [--ray-address A]` trains with
resume=True and prints the result as JSON on stdout (the kill/resume tests run it and kill -9 it).
Fault knobs (all picklable through functools.partial): `raise_at_step` / `die_at_step` on one
rank, `die_in_save` (SIGKILL on one rank right after it wrote its DCP shard of `step_N.partial/`),
`sleep_in_save` (rank 0 sleeps that many seconds right after writing each
`step_N.partial/manifest.json`, before the rename: a window to kill a run mid-save), `step_sleep`
to slow steps down, `pid_dir` to record each worker's pid (`rank<r>.pid`) and the environment it
runs under (`rank<r>.env.json`).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reproduction.train.config import TrainConfig  # noqa: E402
from reproduction.train.task import EvalContext, TrainTask  # noqa: E402

N_TRAIN, N_EVAL, DIM = 96, 20, 8


class Regression:
    """y = x @ w + 0.1 * noise, fixed by `seed`; samples are (x, y) float32 arrays."""

    def __init__(self, n: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.x = rng.normal(size=(n, DIM)).astype(np.float32)
        w = np.random.default_rng(1234).normal(size=(DIM, 1)).astype(np.float32)
        self.y = (self.x @ w + 0.1 * rng.normal(size=(n, 1))).astype(np.float32)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


class MLP(nn.Module):
    def __init__(self, dropout: float, scale: float) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(DIM, 32), nn.ReLU(), nn.Dropout(dropout), nn.Linear(32, 32), nn.ReLU())
        self.value_head = nn.Linear(32, 1)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.value_head(self.body(x)) * self.scale


def collate(samples: list) -> dict[str, torch.Tensor]:
    return {
        "x": torch.from_numpy(np.stack([s[0] for s in samples])),
        "y": torch.from_numpy(np.stack([s[1] for s in samples])),
    }


def augment(sample, rng: np.random.Generator):
    x, y = sample
    return (x + rng.normal(scale=0.05, size=x.shape).astype(np.float32), y)


class _Faults:
    """Counts loss calls on this rank and fires the configured fault."""

    def __init__(
        self,
        *,
        rank: int,
        fault_rank: int,
        raise_at_step: int | None,
        die_at_step: int | None,
        step_sleep: float,
        nan_at_call: int | None,
    ) -> None:
        self.rank, self.fault_rank, self.calls = rank, fault_rank, 0
        self.raise_at_step, self.die_at_step, self.step_sleep, self.nan_at_call = (
            raise_at_step,
            die_at_step,
            step_sleep,
            nan_at_call,
        )

    def __call__(self, model: nn.Module, batch: dict) -> tuple[torch.Tensor, dict[str, float]]:
        self.calls += 1
        if model.training and self.rank == self.fault_rank:
            if self.raise_at_step is not None and self.calls >= self.raise_at_step:
                raise RuntimeError(f"injected failure on rank {self.rank} at call {self.calls}")
            if self.die_at_step is not None and self.calls >= self.die_at_step:
                os.kill(os.getpid(), signal.SIGKILL)
        if self.step_sleep and model.training:
            time.sleep(self.step_sleep)
        pred = model(batch["x"])
        loss = ((pred - batch["y"]) ** 2).mean()
        if model.training and self.nan_at_call is not None and self.calls == self.nan_at_call:
            loss = loss * float("nan")
        return loss, {"abs_err": float((pred - batch["y"]).abs().mean().detach())}


def _die_after_shard_write(step: int) -> None:
    """Make this process SIGKILL itself inside the DCP save of `step_<step>.partial/`, after its shard
    file is on disk and before any .metadata or manifest.json exists (a kill mid-checkpoint-write)."""
    from torch.distributed.checkpoint import FileSystemWriter

    original = FileSystemWriter.write_data

    def write_data(self, plan, planner):
        future = original(self, plan, planner)
        if Path(str(self.path)).name == f"step_{step}.partial":
            future.wait()
            os.kill(os.getpid(), signal.SIGKILL)
        return future

    FileSystemWriter.write_data = write_data


def _sleep_after_manifest_write(seconds: float) -> None:
    """Make this worker process sleep right after the checkpoint commit writes a `manifest.json` into
    `step_N.partial/` (rank 0 only writes it), before the rename to `step_N/`. Patched in this worker
    process only (Ray gives every run fresh worker processes)."""
    from reproduction.train import checkpoint

    original = checkpoint.atomic_write_text

    def atomic_write_text(path, text, *args, **kwargs):
        result = original(path, text, *args, **kwargs)
        if Path(path).name == checkpoint.MANIFEST and Path(path).parent.name.endswith(".partial"):
            time.sleep(seconds)
        return result

    checkpoint.atomic_write_text = atomic_write_text


def evaluate(model: nn.Module, ctx: EvalContext) -> dict[str, float]:
    data = Regression(N_EVAL, seed=99)
    idx = list(ctx.shard(len(data)))
    batch = collate([data[i] for i in idx])
    err = ((model(batch["x"].to(ctx.device)) - batch["y"].to(ctx.device)) ** 2).cpu().numpy()[:, 0]
    every = ctx.all_gather(err.astype(np.float64))
    return {"mse": float(every.mean()), "count": float(len(every))}


def make_task(
    rank: int,
    world_size: int,
    *,
    dropout: float = 0.0,
    scale: float = 1.0,
    pid_dir: str | None = None,
    fault_rank: int = 1,
    raise_at_step: int | None = None,
    die_at_step: int | None = None,
    step_sleep: float = 0.0,
    nan_at_call: int | None = None,
    die_in_save: int | None = None,
    sleep_in_save: float = 0.0,
) -> TrainTask:
    """The tiny task; `*_at_step` count loss calls on `fault_rank` (one per micro batch)."""
    if pid_dir:
        Path(pid_dir).mkdir(parents=True, exist_ok=True)
        (Path(pid_dir) / f"rank{rank}.pid").write_text(str(os.getpid()))
        env = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TOKENIZERS_PARALLELISM")}
        (Path(pid_dir) / f"rank{rank}.env.json").write_text(json.dumps(env))
    if die_in_save is not None and rank == fault_rank:
        _die_after_shard_write(die_in_save)
    if sleep_in_save:
        _sleep_after_manifest_write(sleep_in_save)
    torch.manual_seed(7)
    model = MLP(dropout, scale)

    def groups(m: nn.Module) -> list[dict]:
        head = [p for n, p in m.named_parameters() if "value_head" in n]
        rest = [p for n, p in m.named_parameters() if "value_head" not in n]
        return [{"params": rest}, {"params": head, "lr": 3e-3}]

    def extras(folder: Path) -> None:
        (folder / "task.json").write_text(json.dumps({"dim": DIM}))

    faults = _Faults(
        rank=rank,
        fault_rank=fault_rank,
        raise_at_step=raise_at_step,
        die_at_step=die_at_step,
        step_sleep=step_sleep,
        nan_at_call=nan_at_call,
    )
    return TrainTask(
        model=model,
        train_dataset=Regression(N_TRAIN, seed=5),
        collate=collate,
        loss=faults,
        evaluate=evaluate,
        param_groups=groups,
        augment=augment,
        export_extras=extras,
        model_config={"kind": "tiny-mlp", "dim": DIM},
    )


def tb_scalars(out_dir: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of one TensorBoard scalar as TensorBoard itself reads the run's event files
    (purges on a restart included), in the order it keeps them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(Path(out_dir) / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)] if tag in acc.Tags()["scalars"] else []


def config(**overrides) -> TrainConfig:
    base = dict(
        max_steps=24,
        global_batch=8,
        micro_batch=2,
        world_size=2,
        device="cpu",
        lr=1e-3,
        warmup_steps=3,
        eval_interval=2,
        save_interval=4,
        keep_last=10,
        seed=3,
        start_timeout_s=60,
        collective_timeout_s=60,
    )
    base.update(overrides)
    return TrainConfig(**base)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=24)
    parser.add_argument("--ray-address", default=None)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--die-in-save", type=int, default=None, help="SIGKILL rank 1 inside the save of this step")
    parser.add_argument("--sleep-in-save", type=float, default=0.0, help="rank 0 sleeps this long inside each save")
    args = parser.parse_args()
    from reproduction.train.api import train

    task = functools.partial(
        make_task,
        dropout=args.dropout,
        step_sleep=args.step_sleep,
        pid_dir=str(Path(args.out) / "pids"),
        die_in_save=args.die_in_save,
        sleep_in_save=args.sleep_in_save,
    )
    result = train(
        task,
        config(world_size=args.world_size, max_steps=args.max_steps),
        out_dir=Path(args.out),
        resume=True,
        ray_address=args.ray_address,
    )
    from reproduction.train.ray_connect import START_SECONDS

    # how many local Rays this process started: Ray's own "Started a local Ray instance" line is off (audit60 L2)
    print(json.dumps({"step": result.step, "resumed_from": result.resumed_from, "local_rays": len(START_SECONDS)}))


if __name__ == "__main__":
    main()
