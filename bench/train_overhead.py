"""Trainer overhead: samples/s of train() (Ray + FSDP2, world size 1 and 2, CPU) vs a bare PyTorch loop.

Same model (a small pre-norm residual MLP stack, a few ms per step), same data and collate, same
AdamW and grad clipping, same run. Throughput is measured after `WARMUP` steps: for the trainer
from the timestamps of its JSONL train records (so logging, the metrics all-reduce and FSDP
collectives are all counted; startup, eval and the final save are not), for the bare loop with a
timer around the same steps. Also prints checkpoint save and load seconds.

    OMP_NUM_THREADS=1 python3 bench/train_overhead.py [--steps 200]

Last line: `ratio: X.XX (goal >= 0.90)` = trainer world size 1 / bare loop.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("PORTABLE_NO_PROGRESS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from reproduction.train.config import TrainConfig  # noqa: E402
from reproduction.train.metrics import read_records  # noqa: E402
from reproduction.train.task import TrainTask  # noqa: E402

DIM, HIDDEN, BLOCKS, BATCH, N = 256, 512, 4, 32, 4096
WARMUP = 10


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[Block() for _ in range(BLOCKS)], nn.LayerNorm(DIM), nn.Linear(DIM, 1))


class Data:
    def __init__(self) -> None:
        rng = np.random.default_rng(0)
        self.x = rng.normal(size=(N, DIM)).astype(np.float32)
        self.y = rng.normal(size=(N, 1)).astype(np.float32)

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def collate(samples: list) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.from_numpy(np.stack([s[0] for s in samples])), torch.from_numpy(np.stack([s[1] for s in samples]))


def mse(model: nn.Module, batch) -> tuple[torch.Tensor, dict]:
    x, y = batch
    return ((model(x) - y) ** 2).mean(), {}


def make_task(rank: int, world_size: int) -> TrainTask:
    return TrainTask(model=build_model(), train_dataset=Data(), collate=collate, loss=mse)


def bare_loop(steps: int) -> float:
    """samples/s of the plain single-process loop over steps WARMUP..steps."""
    model, data = build_model(), Data()
    optim = torch.optim.AdamW(
        model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=1e-10, fused=True
    )  # the trainer's AdamW: measure overhead, not kernels
    order = np.random.default_rng(0).permutation(N)
    start = 0.0
    for step in range(steps):
        if step == WARMUP:
            start = time.perf_counter()
        idx = order[(step * BATCH) % N : (step * BATCH) % N + BATCH]
        loss, _ = mse(model, collate([data[int(i)] for i in idx]))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        optim.zero_grad(set_to_none=True)
    return (steps - WARMUP) * BATCH / (time.perf_counter() - start)


def trainer(out: Path, *, world_size: int, steps: int, resume: bool = False) -> list[dict]:
    from reproduction.train.api import train

    cfg = TrainConfig(
        max_steps=steps,
        world_size=world_size,
        global_batch=BATCH * world_size,
        micro_batch=BATCH,
        device="cpu",
        lr=1e-4,
        log_interval=WARMUP,
        keep_last=1,
    )
    train(make_task, cfg, out_dir=out, resume=resume)
    return read_records(out / "metrics.jsonl")


def rate(records: list[dict], samples_per_step: int) -> float:
    train = [r for r in records if r["split"] == "train"]
    first, last = train[0], train[-1]  # the record at step WARMUP, and the last one
    return (last["step"] - first["step"]) * samples_per_step / (last["time"] - first["time"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    import ray

    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=200 * 1024 * 1024,
        log_to_driver=False,
        _node_ip_address="127.0.0.1",  # loopback only
    )
    try:
        with tempfile.TemporaryDirectory(prefix="train_overhead_") as tmp:
            bare_a = bare_loop(args.steps)
            one = trainer(Path(tmp) / "ws1", world_size=1, steps=args.steps)
            bare_b = bare_loop(args.steps)
            two = trainer(Path(tmp) / "ws2", world_size=2, steps=args.steps)
            resumed = trainer(Path(tmp) / "ws1", world_size=1, steps=args.steps + 1, resume=True)
    finally:
        ray.shutdown()
    bare = (bare_a + bare_b) / 2  # bracket the trainer run: the machine is shared and noisy
    ws1, ws2 = rate(one, BATCH), rate(two, 2 * BATCH)
    save_s = [r["metrics"]["save_s"] for r in one if r["split"] == "checkpoint"][-1]
    load_s = [r["metrics"]["load_s"] for r in resumed if r["split"] == "resume"][-1]
    params = sum(p.numel() for p in build_model().parameters())
    print(f"model: {params / 1e6:.2f} M params, batch {BATCH} x {DIM}, {args.steps} steps (first {WARMUP} not timed)")
    print(f"bare loop:             {bare:8.1f} samples/s (runs before/after: {bare_a:.1f}, {bare_b:.1f})")
    print(
        f"trainer world size 1:  {ws1:8.1f} samples/s "
        "(one Ray worker, gloo group; unsharded in fp32, see train/fsdp.py)"
    )
    print(
        f"trainer world size 2:  {ws2:8.1f} samples/s "
        f"({ws2 / bare:.2f}x bare; Ray + FSDP2, 2 workers on a shared 2-core machine)"
    )
    print(f"checkpoint save: {save_s:.3f} s, load (incl. digest check + canary): {load_s:.3f} s")
    print(f"ratio: {ws1 / bare:.2f} (goal >= 0.90)")


if __name__ == "__main__":
    main()
