"""Value model on an accelerator: samples/s and memory of the `recap` preset trained through train().

For the GPU machine (CUDA, bf16): SigLIP2-so400m + Gemma3-270M sizes with random weights (no
download; throughput does not depend on the values), two cameras at 224 px (the second absent for
half the samples, so the no-compute-on-absent-cameras path is exercised), ~20-token prompts.
Anchor, same run: a bare single-process loop (same model, batches, AdamW, clipping, bf16 autocast).
Prints samples/s of both, peak accelerator memory, and the trainer's checkpoint save time.

    python3 bench/value_recap_gpu.py                                   # GPU: recap, cuda, bf16
    OMP_NUM_THREADS=1 python3 bench/value_recap_gpu.py --preset tiny --device cpu --precision fp32 --steps 12

Last line: `ratio: X.XX (goal >= 0.90)` = trainer samples/s / bare loop samples/s.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("PORTABLE_NO_PROGRESS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from reproduction.recap.tokenizer import format_prompt, train_tokenizer  # noqa: E402
from reproduction.recap.value.data import ValueCollator  # noqa: E402
from reproduction.recap.value.model import build_value_model, preset_config  # noqa: E402
from reproduction.recap.value.task import transformer_blocks, value_batch_loss, value_param_groups  # noqa: E402

TASKS = [
    "put both the alphabet soup and the tomato sauce in the basket",
    "turn on the stove and put the moka pot on it",
    "pick up the book and place it in the back compartment",
]
CAMS = ("base_0_rgb", "left_wrist_0_rgb")
WARMUP = 3


class Synthetic:
    """Map-style value samples: random pixels in [-1, 1], wrist camera present on even indices."""

    def __init__(self, n: int, size: int) -> None:
        self.n, self.size = n, size

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        g = torch.Generator().manual_seed(i)
        images = {"base_0_rgb": torch.rand(3, self.size, self.size, generator=g) * 2 - 1}
        if i % 2 == 0:
            images["left_wrist_0_rgb"] = torch.rand(3, self.size, self.size, generator=g) * 2 - 1
        return {
            "images": images,
            "prompt": format_prompt(TASKS[i % 3]),
            "target": -float(i % 97) / 97,
            "episode_index": i // 50,
            "frame_index": i % 50,
            "source": 0,
        }


def make_task(rank: int, world: int, *, preset: str, tok_dir: str, n: int):
    from reproduction.recap.tokenizer import load_tokenizer
    from reproduction.train.task import TrainTask

    cfg = preset_config(preset, cameras=CAMS, vocab_size=None if preset == "recap" else 512)
    model = build_value_model(cfg, seed=0)
    collate = ValueCollator(tokenizer=load_tokenizer(Path(tok_dir)), slots=cfg.cameras, image_size=cfg.image_size)
    return TrainTask(
        model=model,
        train_dataset=Synthetic(n, cfg.image_size),
        collate=collate,
        loss=functools.partial(value_batch_loss, v_min=-1.0, v_max=0.0),
        param_groups=functools.partial(value_param_groups, value_lr=1e-4),
        fsdp_units=transformer_blocks,
        model_config=cfg.to_dict(),
    )


def bare_loop(task, *, device: torch.device, steps: int, micro: int, bf16: bool) -> float:
    from reproduction.train.loop import to_device

    model = task.model.to(device).train()
    opt = torch.optim.AdamW(task.param_groups(model), lr=5e-5, betas=(0.9, 0.95), weight_decay=1e-10)
    t0 = 0.0
    for step in range(steps):
        if step == WARMUP:
            _sync(device)
            t0 = time.perf_counter()
        batch = to_device(
            task.collate([task.train_dataset[(step * micro + j) % len(task.train_dataset)] for j in range(micro)]),
            device,
        )
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss, _ = task.loss(model, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    _sync(device)
    return (steps - WARMUP) * micro / (time.perf_counter() - t0)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def trainer_rate(out: Path) -> float:
    from reproduction.train.metrics import read_records

    rates = [r["metrics"]["samples_per_s"] for r in read_records(out / "metrics.jsonl") if r["split"] == "train"]
    return float(np.median(rates[1:] if len(rates) > 1 else rates))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="recap")
    p.add_argument("--device", default="cuda")
    p.add_argument("--precision", default="bf16", choices=("bf16", "fp32"))
    p.add_argument("--micro", type=int, default=16)
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    from reproduction.train.api import train
    from reproduction.train.config import TrainConfig
    from reproduction.train.metrics import read_records

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("error: no CUDA device here; run on the GPU machine or pass --preset tiny --device cpu")
    with tempfile.TemporaryDirectory() as tmp:
        train_tokenizer(TASKS, Path(tmp) / "tok")
        make = functools.partial(make_task, preset=args.preset, tok_dir=str(Path(tmp) / "tok"), n=64 * args.micro)
        cfg = TrainConfig(
            max_steps=args.steps,
            global_batch=args.micro,
            micro_batch=args.micro,
            world_size=1,
            launcher="inprocess",
            device=args.device,
            mixed_precision=args.precision,
            log_interval=max(1, args.steps // 5),
            lr=5e-5,
        )
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        result = train(make, cfg, out_dir=Path(tmp) / "run", resume=False)
        ours = trainer_rate(Path(tmp) / "run")
        mem = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
        saves = [
            r["metrics"]["save_s"]
            for r in read_records(Path(tmp) / "run" / "metrics.jsonl")
            if r["split"] == "checkpoint"
        ]
        bare = bare_loop(make(0, 1), device=device, steps=args.steps, micro=args.micro, bf16=args.precision == "bf16")
    print(f"preset {args.preset} on {args.device} ({args.precision}), micro batch {args.micro}, {args.steps} steps")
    print(f"trainer: {ours:.1f} samples/s (run total {result.samples_per_s:.1f}); bare loop: {bare:.1f} samples/s")
    print(
        f"peak accelerator memory (trainer run): {mem:.2f} GiB; "
        f"checkpoint save: {saves[-1] if saves else float('nan'):.2f} s"
    )
    print(f"ratio: {ours / bare:.2f} (goal >= 0.90)")


if __name__ == "__main__":
    main()
