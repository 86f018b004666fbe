"""Value model on an accelerator: samples/s, MFU and memory of the `recap` preset trained through train().

For the GPU machine (CUDA, bf16): SigLIP2-so400m + Gemma3-270M sizes with random weights (no
download; throughput does not depend on the values), two cameras at 224 px (the second absent for
half the samples, so the no-compute-on-absent-cameras path is exercised), ~20-token prompts.

Both sides get the same model, batches, optimizer (the trainer's own AdamW construction: fused
where torch has it, the same param groups and hyper-parameters), the same precision policy (the
trainer's FSDP2 wrapping: bf16 compute over fp32 master weights, fp32 gradient reduction, through
`train/fsdp.shard` in a one-rank process group for the bare loop too) and the same clipping, and
both are timed by wall clock:
  trainer  train() run twice, to WARMUP steps and to --steps; its rate is the extra steps' samples
           over the extra wall time (set-up, model build and the final save cancel out; logging,
           data, step-time syncs and everything else a step costs are in)
  bare     a plain Python loop: wall clock from the end of step WARMUP to the last step's sync
The sides alternate over --rounds rounds (order rotated) and keep their best. MFU = model FLOPs
(forward + backward of one micro batch, counted by torch's FlopCounterMode) x steps/s / peak
(bf16 dense peak of the detected GPU, or --peak-tflops); printed beside the ratio.

    python3 bench/value_recap_gpu.py                                   # GPU: recap, cuda, bf16
    OMP_NUM_THREADS=1 python3 bench/value_recap_gpu.py --preset tiny --device cpu --precision fp32 --steps 8 --micro 4

Last line: `ratio: X.XX (goal >= 0.90)` = trainer samples/s / bare loop samples/s.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("PORTABLE_NO_PROGRESS", "1")
sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]

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


PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "H800": 989.0, "A100": 312.0, "A800": 312.0, "L40S": 362.0}
"""Dense bf16 tensor-core peaks (NVIDIA data sheets, SXM parts), by a substring of the device name."""


def peak_tflops(device: torch.device, override: float | None) -> float | None:
    if override:
        return override
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)
    return None


def micro_batch(task, step: int, micro: int) -> list:
    return [task.train_dataset[(step * micro + j) % len(task.train_dataset)] for j in range(micro)]


def step_flops(task, *, device: torch.device, micro: int) -> float:
    """FLOPs of one forward + backward of a micro batch (matmuls and convolutions, FlopCounterMode)."""
    from torch.utils.flop_counter import FlopCounterMode

    from reproduction.train.loop import to_device

    model = task.model.to(device).train()
    batch = to_device(task.collate(micro_batch(task, 0, micro)), device)
    with FlopCounterMode(display=False) as counter:
        loss, _ = task.loss(model, batch)
        loss.backward()
    model.zero_grad(set_to_none=True)
    return float(counter.get_total_flops())


def bare_loop(task, cfg, *, device: torch.device, steps: int, micro: int) -> float:
    """Samples/s of a plain loop with the trainer's wrapping and optimizer (wall clock after WARMUP)."""
    from reproduction.train import dist, fsdp
    from reproduction.train.loop import _optimizer, to_device  # the trainer's own optimizer construction

    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init(
        backend=backend,
        master_addr="127.0.0.1",
        master_port=dist.free_port(),
        rank=0,
        world_size=1,
        timeout_s=300,
        device=device,
    )
    try:
        model = fsdp.shard(task.model, device=device, mixed_precision=cfg.mixed_precision, units=task.fsdp_units)
        model.train()
        opt = _optimizer(model, task, cfg, device)
        t0 = 0.0
        for step in range(steps):
            if step == WARMUP:
                _sync(device)
                t0 = time.perf_counter()
            batch = to_device(task.collate(micro_batch(task, step, micro)), device)
            loss, _ = task.loss(model, batch)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip or 1.0)
            norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
            if bool(torch.isfinite(norm).item()):  # the trainer's non-finite skip, and its sync
                opt.step()
            opt.zero_grad(set_to_none=True)
        _sync(device)
        return (steps - WARMUP) * micro / (time.perf_counter() - t0)
    finally:
        dist.destroy()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def trainer_wall(make, cfg, out: Path) -> float:
    """Wall seconds of one train() run from scratch into `out`."""
    from reproduction.train.api import train

    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    train(make, cfg, out_dir=out, resume=False)
    _sync(torch.device(cfg.device))
    return time.perf_counter() - t0


def main() -> None:
    from _timing import machine_note

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="recap")
    p.add_argument("--device", default="cuda")
    p.add_argument("--precision", default="bf16", choices=("bf16", "fp32"))
    p.add_argument("--micro", type=int, default=16)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--peak-tflops", type=float, default=None, help="the device's peak, for MFU (default: by name)")
    args = p.parse_args()
    if args.steps <= WARMUP + 1:
        sys.exit(f"error: --steps must exceed {WARMUP + 1} (warm-up steps are not timed)")
    from reproduction.train.config import TrainConfig
    from reproduction.train.metrics import read_records

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("error: no CUDA device here; run on the GPU machine or pass --preset tiny --device cpu")
    print(f"machine: {machine_note()}; device {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}")
    with tempfile.TemporaryDirectory() as tmp:
        train_tokenizer(TASKS, Path(tmp) / "tok")
        make = functools.partial(make_task, preset=args.preset, tok_dir=str(Path(tmp) / "tok"), n=64 * args.micro)

        def config(steps: int) -> TrainConfig:
            return TrainConfig(
                max_steps=steps,
                global_batch=args.micro,
                micro_batch=args.micro,
                world_size=1,
                launcher="inprocess",
                device=args.device,
                mixed_precision=args.precision,
                log_interval=max(1, args.steps // 5),
                lr=5e-5,
            )

        flops = step_flops(make(0, 1), device=device, micro=args.micro)
        trainer_wall(make, config(WARMUP), Path(tmp) / "warm")  # untimed: first-call imports and allocator warm-up
        trainer_rates, bare_rates = [], []
        mem = float("nan")
        for r in range(args.rounds):
            for side in ("trainer", "bare") if r % 2 == 0 else ("bare", "trainer"):
                if side == "bare":
                    bare_rates.append(
                        bare_loop(make(0, 1), config(args.steps), device=device, steps=args.steps, micro=args.micro)
                    )
                    continue
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                short = trainer_wall(make, config(WARMUP), Path(tmp) / "short")
                full = trainer_wall(make, config(args.steps), Path(tmp) / "run")
                if device.type == "cuda":
                    mem = torch.cuda.max_memory_allocated() / 2**30
                if full <= short:
                    sys.exit(f"error: {args.steps} steps no longer than {WARMUP} ({full:.2f} s): raise --steps")
                trainer_rates.append((args.steps - WARMUP) * args.micro / (full - short))
            print(f"round {r + 1}: trainer {trainer_rates[-1]:.1f} samples/s, bare loop {bare_rates[-1]:.1f} samples/s")
        saves = [
            r["metrics"]["save_s"]
            for r in read_records(Path(tmp) / "run" / "metrics.jsonl")
            if r["split"] == "checkpoint"
        ]
    ours, bare = max(trainer_rates), max(bare_rates)
    peak = peak_tflops(device, args.peak_tflops)
    achieved = flops * ours / args.micro / 1e12
    mfu = (
        f"MFU {achieved / peak:.1%} of {peak:.0f} TFLOPS"
        if peak
        else "MFU n/a (no peak known for this device; pass --peak-tflops)"
    )
    print(
        f"preset {args.preset} on {args.device} ({args.precision}), micro batch {args.micro}, "
        f"{args.steps} steps, best of {args.rounds}"
    )
    print(
        f"trainer: {ours:.1f} samples/s; bare loop: {bare:.1f} samples/s (same optimizer, precision policy, wall clock)"
    )
    print(
        f"model FLOPs per sample (fwd+bwd): {flops / args.micro / 1e9:.2f} GFLOP; trainer {achieved:.2f} TFLOPS, {mfu}"
    )
    last_save = saves[-1] if saves else float("nan")
    print(f"peak accelerator memory (trainer run): {mem:.2f} GiB; checkpoint save: {last_save:.2f} s")
    print(f"ratio: {ours / bare:.2f} (goal >= 0.90; {mfu})")


if __name__ == "__main__":
    main()
