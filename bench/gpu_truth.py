"""GPU truth in one command: Triton, bf16 training at full width, CUDA resume, EGL rendering.

    python3 bench/gpu_truth.py OUT_DIR [--smoke] [--parts jit,value_bf16,policy_pi05,resume,render]

Each part runs in its own child process under its own time limit (and the whole run under --budget-s,
default 450 s: under 8 minutes on one H200), writes OUT_DIR/<part>.json and prints one line:

    <part>: ok|FAIL|SKIP <figure> <unit>  (<what the figure is>)

A part that fails, crashes or runs out of time records that in its JSON ("ok": false, "error") and
the next part still runs. Every JSON file has the keys part, ok, figure, unit, device, torch, cuda,
details (and error when not ok); OUT_DIR/summary.json lists them all. Scratch (the Triton cache,
checkpoints, the temp folder of `portable check`) lives in OUT_DIR/work/ and is removed at the end
(--keep-work keeps it), so OUT_DIR holds 6 small files only.

Parts (docs/gpu.md says what each figure means and how to run this on a lent GPU machine):
  jit          `portable check --jit-smoke --device cuda --json` with TRITON_CACHE_DIR and TMPDIR under
               OUT_DIR/work (a cold Triton compile); the C extension (toolchain) row and the jit row.
  value_bf16   the value model's `recap` preset (SigLIP2-so400m + Gemma3-270M) at full width, random
               init from config, bf16 training steps (the trainer's FSDP2 bf16 policy and AdamW) at a
               stated batch: samples/s, MFU = 6 x N x tokens per sample x samples/s / 989 TFLOP/s.
  policy_pi05  the `pi05` preset at full width under bf16 autocast: forward + backward at batch 1 and
               at the largest batch that fits (halving on OOM): tokens/s, peak memory; the latency of
               one guided action chunk (GuidedPolicy: one batched forward for both guidance passes).
  resume       train() (the in-process launcher `portable run` uses on one device), bf16: N steps and
               a DCP save, SIGKILL, resume, N more; losses and weights against an uninterrupted run.
  render       the Fetch simulator on MUJOCO_GL=egl (the NVIDIA EGL device) against the CPU renderers
               (osmesa, EGL through Mesa) at the demo's 64 px, two cameras; LIBERO when importable.

--smoke: tiny presets, a few steps, on CPU (what CI runs: tests/test_gpu_truth.py).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("PORTABLE_NO_PROGRESS", "1")

PARTS = ("jit", "value_bf16", "policy_pi05", "resume", "render")
LIMITS_S = {"jit": 150, "value_bf16": 120, "policy_pi05": 150, "resume": 120, "render": 90}
"""Per-part wall-clock limits (full form); each part also gets no more than the budget left."""
SMOKE_LIMITS_S = {"jit": 30, "value_bf16": 60, "policy_pi05": 60, "resume": 90, "render": 45}
BUDGET_S = 450.0
H200_PEAK_BF16_TFLOPS = 989.0
"""Dense BF16 tensor-core peak of the H200 SXM (NVIDIA H200 datasheet: 1,979 TFLOP/s with sparsity,
half that dense); the MFU denominator. The H100 SXM's is the same figure."""
PEAKS_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "H800": 989.0, "A100": 312.0, "A800": 312.0, "L40S": 362.0}
RENDER_SIZE = 64
"""The demo's image size (reproduction/recipes/recap/demo.py: two 64 px cameras)."""


# -- the part record -------------------------------------------------------------------------------


def _env_facts() -> dict:
    try:
        import torch
    except ImportError:
        return {"device": "unknown", "torch": None, "cuda": None}
    if torch.cuda.is_available():
        device = f"cuda:0 {torch.cuda.get_device_name(0)}"
    else:
        device = "cpu"
    return {"device": device, "torch": torch.__version__, "cuda": torch.version.cuda}


def record(part: str, *, ok: bool, figure, unit: str, details: dict, error: str | None = None, **facts) -> dict:
    out = {"part": part, "ok": bool(ok), "figure": figure, "unit": unit, **_env_facts(), **facts, "details": details}
    if error is not None or not ok:
        out["error"] = error or "failed (no message)"
    return out


def _pythonpath() -> str:
    """The repo first, then whatever PYTHONPATH already names (carried wheels installed with --target)."""
    return os.pathsep.join([str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _peak_gib() -> float | None:
    import torch

    return round(torch.cuda.max_memory_allocated() / 2**30, 3) if torch.cuda.is_available() else None


def _reset_peak() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_tflops() -> tuple[float | None, str]:
    """(peak, what it is) for the MFU denominator: the H200 figure on an H200, by name otherwise."""
    import torch

    if not torch.cuda.is_available():
        return None, "no CUDA device: MFU is not computed on CPU"
    name = torch.cuda.get_device_name(0)
    for key, value in PEAKS_BF16_TFLOPS.items():
        if key in name:
            return value, f"{value:.0f} TFLOP/s dense BF16 ({key} SXM, NVIDIA datasheet)"
    return None, f"no dense BF16 peak known for {name!r}"


# -- jit ------------------------------------------------------------------------------------------


def part_jit(out: Path, smoke: bool, work: Path) -> dict:
    cache, tmp = work / "triton-cache", work / "tmp"
    cache.mkdir(parents=True, exist_ok=True)
    tmp.mkdir(parents=True, exist_ok=True)
    device = "cpu" if smoke else "cuda"
    argv = [sys.executable, "-m", "reproduction.portable", "check", "--jit-smoke", "--device", device, "--json"]
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache), "TMPDIR": str(tmp), "PYTHONPATH": _pythonpath()}
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=LIMITS_S["jit"] - 10)
    seconds = time.perf_counter() - t0
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        return record(
            "jit",
            ok=False,
            figure=None,
            unit="s",
            details={"exit": proc.returncode, "stderr_tail": proc.stderr[-2000:], "argv": argv[1:]},
            error=f"`portable check` printed no JSON report (exit {proc.returncode})",
        )
    rows = {r["name"]: r for r in report.get("results", [])}
    jit, tool = rows.get("jit", {}), rows.get("toolchain", {})
    details = {
        "command": "portable " + " ".join(argv[3:]),
        "exit": proc.returncode,
        "check_status": report.get("status"),
        "seconds": round(seconds, 3),
        "triton_cache_dir": "OUT_DIR/work/triton-cache (fresh); the check itself compiles in a fresh folder "
        "under TMPDIR=OUT_DIR/work/tmp",
        "jit_row": jit,
        "toolchain_row": tool,
        "report": report,
    }
    compile_s = (jit.get("details") or {}).get("compile_s")
    if smoke:
        ok = jit.get("status") == "skip" and tool.get("status") == "ok"
        err = None if ok else f"jit row {jit.get('status')!r}, toolchain row {tool.get('status')!r} on CPU"
        details["skipped"] = "CPU smoke: the Triton vector-add needs CUDA (jit row skipped); the C extension built"
        return record(
            "jit", ok=ok, figure=tool.get("seconds"), unit="s (C extension build)", details=details, error=err
        )
    ok = jit.get("status") == "ok" and tool.get("status") == "ok"
    err = None if ok else f"jit: {jit.get('finding')}; toolchain: {tool.get('finding')}"
    return record("jit", ok=ok, figure=compile_s, unit="s (Triton cold compile + run)", details=details, error=err)


# -- value_bf16 -------------------------------------------------------------------------------------


def model_flops_per_sample(model, batch: dict) -> dict:
    """6 x N x tokens per sample (forward + backward, matmul FLOPs; attention's L^2 term left out):
    N_vision (SigLIP without its position table) x image tokens + N_text (Gemma3 without the token
    table, which is a lookup) x prefix tokens, plus the projector, over the batch's real tokens."""
    vision = model.vision
    n_vision = sum(p.numel() for p in vision.parameters()) - vision.embeddings.position_embedding.weight.numel()
    n_text = sum(p.numel() for p in model.language.parameters()) - model.language.embed_tokens.weight.numel()
    n_proj = sum(p.numel() for p in model.projector.parameters())
    b = int(batch["input_ids"].shape[0])
    images = sum(int(m.sum()) for m in batch["image_masks"].values())
    per_image = model.tokens_per_image
    img_tokens = images * per_image / b
    txt_tokens = float(batch["attention_mask"].sum()) / b
    prefix = img_tokens + txt_tokens + 1  # + the value query
    flops = 6 * (n_vision * img_tokens + n_proj * img_tokens + n_text * prefix)
    return {
        "n_vision": n_vision,
        "n_text_non_embedding": n_text,
        "n_projector": n_proj,
        "image_tokens_per_sample": img_tokens,
        "text_tokens_per_sample": txt_tokens,
        "prefix_tokens_per_sample": prefix,
        "flops_per_sample_6NT": flops,
    }


def part_value_bf16(out: Path, smoke: bool, work: Path) -> dict:
    import torch
    import value_recap_gpu as vr

    from reproduction.recap.tokenizer import train_tokenizer
    from reproduction.train import dist, fsdp
    from reproduction.train.config import TrainConfig
    from reproduction.train.loop import _optimizer, to_device

    preset, micro, steps, warm = ("tiny", 4, 4, 1) if smoke else ("recap", 64, 15, 3)
    device = torch.device("cuda" if _cuda() else "cpu")
    tok = work / "tok-value"
    train_tokenizer(vr.TASKS, tok)
    task = vr.make_task(0, 1, preset=preset, tok_dir=str(tok), n=64 * micro)
    cfg = TrainConfig(
        max_steps=steps, global_batch=micro, micro_batch=micro, world_size=1, launcher="inprocess",
        device=device.type, mixed_precision="bf16",
    )  # fmt: skip
    counts = {k: sum(p.numel() for p in getattr(task.model, k).parameters()) for k in ("vision", "language")}
    first = task.collate(vr.micro_batch(task, 0, micro))
    flops = model_flops_per_sample(task.model, first)
    dist.init(
        backend="nccl" if device.type == "cuda" else "gloo", master_addr="127.0.0.1", master_port=dist.free_port(),
        rank=0, world_size=1, timeout_s=300, device=device,
    )  # fmt: skip
    try:
        model = fsdp.shard(task.model, device=device, mixed_precision="bf16", units=task.fsdp_units)
        model.train()
        opt = _optimizer(model, task, cfg, device)
        # Batches are collated and moved before timing: the figure is the model's rate, not the loader's.
        batches = [to_device(task.collate(vr.micro_batch(task, i, micro)), device) for i in range(min(steps, 4))]
        losses, t0 = [], 0.0
        _reset_peak()
        for step in range(steps):
            if step == warm:
                _sync()
                t0 = time.perf_counter()
            batch = batches[step % len(batches)]
            loss, _ = task.loss(model, batch)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
        _sync()
        elapsed = time.perf_counter() - t0
    finally:
        dist.destroy()
    rate = (steps - warm) * micro / elapsed
    peak, peak_note = peak_tflops()
    achieved = flops["flops_per_sample_6NT"] * rate / 1e12
    mfu = achieved / peak if peak else None
    details = {
        "preset": preset,
        "cameras": list(vr.CAMS),
        "image_size": task.model.config.image_size,
        "micro_batch": micro,
        "steps": steps,
        "warmup_steps_untimed": warm,
        "precision": "bf16 (FSDP2 MixedPrecisionPolicy: bf16 params/compute, fp32 master weights and reduction)",
        "optimizer": "the trainer's AdamW (train/loop._optimizer: fused on cuda/cpu)",
        "data": f"{len(batches)} synthetic batches collated and on the device before timing, cycled",
        "samples_per_s": round(rate, 3),
        "step_s": round(elapsed / (steps - warm), 4),
        "achieved_tflops_6NT": round(achieved, 3),
        "mfu": None if mfu is None else round(mfu, 4),
        "mfu_goal": 0.40,
        "peak_tflops": peak,
        "peak_note": peak_note,
        "params": counts,
        "flops": flops,
        "flop_formula": "6 x (N_vision x image tokens + N_projector x image tokens + N_text x prefix tokens) per "
        "sample; N without position/token tables; attention's quadratic term not counted",
        "losses": losses,
        "peak_memory_gib": _peak_gib(),
    }
    finite = all(x == x and abs(x) != float("inf") for x in losses)
    return record(
        "value_bf16",
        ok=finite,
        figure=round(rate, 3),
        unit="samples/s",
        details=details,
        error=None if finite else f"non-finite losses {losses}",
        mfu=details["mfu"],
        peak_memory_gib=details["peak_memory_gib"],
    )


# -- policy_pi05 ------------------------------------------------------------------------------------

SMOKE_PI05 = dict(
    vlm=dict(width=32, depth=2, mlp_dim=64, num_heads=2, num_kv_heads=1, head_dim=16),
    expert=dict(width=16, depth=2, mlp_dim=32, num_heads=2, num_kv_heads=1, head_dim=16),
    vision=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, patch_size=8),
    image_size=16,
    vocab_size=512,
    max_action_dim=6,
)
POLICY_CAMS = {"base_0_rgb": "observation.images.agentview", "left_wrist_0_rgb": "observation.images.wrist"}
STATE_DIM, GOAL_DIM, ACTION_DIM = 11, 3, 4  # the Fetch simulator's (reproduction/sim/env.py)


def _policy_samples(n: int, image_size: int, chunk: int, rng) -> list[dict]:
    import torch

    out = []
    for i in range(n):
        out.append(
            {
                "state": rng.uniform(-1, 1, STATE_DIM + GOAL_DIM).astype("float32"),
                "actions": rng.uniform(-1, 1, (chunk, ACTION_DIM)).astype("float32"),
                "task_id": i % 3,
                "label": bool(i % 2),
                "kind": i % 3,
                "images": {s: torch.rand(3, image_size, image_size) * 2 - 1 for s in POLICY_CAMS},
            }
        )
    return out


def part_policy_pi05(out: Path, smoke: bool, work: Path) -> dict:
    import numpy as np
    import torch
    import value_recap_gpu as vr

    from reproduction.recap.policy.batches import PolicyCollator
    from reproduction.recap.policy.export import GuidedPolicy
    from reproduction.recap.policy.model import build_policy_model
    from reproduction.recap.policy.pi05 import pi05_config
    from reproduction.recap.policy.task import policy_loss
    from reproduction.recap.tokenizer import load_tokenizer, train_tokenizer
    from reproduction.train.loop import to_device

    device = torch.device("cuda" if _cuda() else "cpu")
    cfg = pi05_config(
        state_dim=STATE_DIM + GOAL_DIM, action_dim=ACTION_DIM, cameras=tuple(POLICY_CAMS),
        reduced=SMOKE_PI05 if smoke else None, chunk=8 if smoke else 50,
    )  # fmt: skip
    tok_dir = work / "tok-policy"
    train_tokenizer(vr.TASKS, tok_dir)
    tokenizer = load_tokenizer(tok_dir)
    t0 = time.perf_counter()
    model = build_policy_model(cfg, device=device, seed=0)  # fp32 master weights, built on the device
    build_s = time.perf_counter() - t0
    n_params = sum(p.numel() for p in model.parameters())
    collate = PolicyCollator(
        tokenizer, vr.TASKS, cameras=cfg.cameras, image_size=cfg.image_size, state_text=True,
        action_dim=cfg.action_dim,
    )  # fmt: skip
    rng = np.random.default_rng(0)
    amp = functools.partial(torch.autocast, device_type=device.type, dtype=torch.bfloat16)

    def fwd_bwd(b: int) -> dict:
        batch = to_device(collate(_policy_samples(b, cfg.image_size, cfg.chunk, rng)), device)
        tokens = b * (
            len(cfg.cameras) * (cfg.image_size // cfg.vision["patch_size"]) ** 2 + batch["input_ids"].shape[1]
        )
        tokens += b * cfg.chunk
        times = []
        _reset_peak()
        for _ in range(3):  # one warm-up, two timed
            _sync()
            t = time.perf_counter()
            with amp():
                loss, _ = policy_loss(model, batch)
            loss.backward()
            _sync()
            times.append(time.perf_counter() - t)
            model.zero_grad(set_to_none=True)
        best = min(times[1:])
        return {
            "batch": b,
            "tokens_per_sample": tokens / b,
            "fwd_bwd_s": round(best, 4),
            "first_s": round(times[0], 3),
            "tokens_per_s": round(tokens / best, 1),
            "loss": float(loss.detach()),
            "peak_memory_gib": _peak_gib(),
        }

    runs, ooms = [fwd_bwd(1)], []
    b = 4 if smoke else 64
    while b > 1:
        try:
            runs.append(fwd_bwd(b))
            break
        except torch.cuda.OutOfMemoryError as exc:
            ooms.append({"batch": b, "error": str(exc).splitlines()[0][:300]})
            model.zero_grad(set_to_none=True)
            _reset_peak()
            b //= 2
    # One guided action chunk: GuidedPolicy (the project's sampling code), w = 1.5, batch 1.
    model.eval()
    meta = {
        "stats": {
            "state_mean": [0.0] * (STATE_DIM + GOAL_DIM),
            "state_std": [1.0] * (STATE_DIM + GOAL_DIM),
            "action_mean": [0.0] * ACTION_DIM,
            "action_std": [1.0] * ACTION_DIM,
        },
        "cameras": POLICY_CAMS,
        "mode": "recap",
        "chunk": cfg.chunk,
        "execute_steps": cfg.chunk,
    }
    steps = 10  # pi0's Euler steps
    policy = GuidedPolicy(model=model, meta=meta, tokenizer=tokenizer, guidance_scale=1.5, num_steps=steps, seed=0)
    size = RENDER_SIZE
    obs = {
        "observation.state": rng.uniform(-1, 1, (1, STATE_DIM)).astype("float32"),
        "observation.goal": rng.uniform(-1, 1, (1, GOAL_DIM)).astype("float32"),
        "observation.images.agentview": rng.integers(0, 255, (1, size, size, 3), dtype=np.uint8),
        "observation.images.wrist": rng.integers(0, 255, (1, size, size, 3), dtype=np.uint8),
        "task": [vr.TASKS[0]],
    }
    lat = []
    _reset_peak()
    with amp():
        for _ in range(3):  # one warm-up, two timed
            before = policy.forward_passes
            _sync()
            t = time.perf_counter()
            actions = policy(obs)
            _sync()
            lat.append(time.perf_counter() - t)
            assert policy.forward_passes == before + 1
    big = runs[-1]
    details = {
        "preset": "pi05" + (" (reduced widths: smoke)" if smoke else " (full width: Gemma 2B + 300M expert + SigLIP)"),
        "params": n_params,
        "build_s": round(build_s, 3),
        "cameras": list(POLICY_CAMS),
        "image_size": cfg.image_size,
        "chunk": cfg.chunk,
        "precision": "torch.autocast bf16 over fp32 weights (no FSDP: a plain module on one device)",
        "fwd_bwd": runs,
        "oom_tries": ooms,
        "largest_batch": big["batch"],
        "sampling": {
            "guidance_scale": 1.5,
            "euler_steps": steps,
            "batch": 1,
            "batched_rows": 2,
            "forward_passes_per_chunk": 1,
            "latency_s": round(min(lat[1:]), 4),
            "first_s": round(lat[0], 3),
            "actions_shape": list(actions.shape),
            "peak_memory_gib": _peak_gib(),
            "code": "reproduction.recap.policy.export.GuidedPolicy.__call__ (one prefix pass over 2B rows, one "
            "expert pass per Euler step)",
        },
    }
    ok = bool(np.isfinite(actions).all()) and all(r["loss"] == r["loss"] for r in runs)
    return record(
        "policy_pi05",
        ok=ok,
        figure=big["tokens_per_s"],
        unit=f"tokens/s (fwd+bwd, batch {big['batch']})",
        details=details,
        error=None if ok else "non-finite loss or actions",
        sample_latency_s=details["sampling"]["latency_s"],
        peak_memory_gib=big["peak_memory_gib"],
    )


# -- resume -----------------------------------------------------------------------------------------


class HangAfterSave:
    """The loss of a run that is to be killed: once `checkpoints/step_N/` is complete (manifest
    written, renamed), the next loss call touches `marker` and sleeps until SIGKILL arrives."""

    def __init__(self, loss, ckpt: Path, marker: Path) -> None:
        self.loss, self.ckpt, self.marker = loss, ckpt, marker

    def __call__(self, model, batch):
        if (self.ckpt / "manifest.json").is_file():
            self.marker.write_text(str(os.getpid()))
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                time.sleep(0.05)
            raise SystemExit("resume child: no SIGKILL within 120 s")
        return self.loss(model, batch)


def _resume_task(rank: int, world: int, *, tok: str, hang: tuple[str, str] | None = None):
    import value_recap_gpu as vr

    task = vr.make_task(rank, world, preset="tiny", tok_dir=tok, n=64)
    if hang:
        task.loss = HangAfterSave(task.loss, Path(hang[0]), Path(hang[1]))
    return task


def _resume_config(max_steps: int, n: int, device: str):
    from reproduction.train.config import TrainConfig

    return TrainConfig(
        max_steps=max_steps, global_batch=4, micro_batch=4, world_size=1, launcher="inprocess", device=device,
        mixed_precision="bf16", save_interval=n, log_interval=1, lr=1e-3, keep_last=4,
    )  # fmt: skip


def resume_child(run: Path, n: int, tok: str, device: str) -> None:
    """`--resume-child`: 2N steps with a save every N, hanging after the first save (killed there)."""
    from reproduction.train.api import train

    marker = run / "hanging"
    make = functools.partial(_resume_task, tok=tok, hang=(str(run / "checkpoints" / f"step_{n}"), str(marker)))
    train(make, _resume_config(2 * n, n, device), out_dir=run, resume=False)


def _losses(run: Path) -> dict[int, float]:
    from reproduction.train.metrics import read_records

    return {
        int(r["step"]): float(r["metrics"]["loss"])
        for r in read_records(run / "metrics.jsonl")
        if r["split"] == "train"
    }


def _weights_diff(a: Path, b: Path) -> dict:
    from safetensors.torch import load_file

    wa, wb = load_file(str(a / "export" / "model.safetensors")), load_file(str(b / "export" / "model.safetensors"))
    if set(wa) != set(wb):
        return {"identical": False, "max_abs_diff": None, "why": "different tensor names"}
    worst, where, equal = 0.0, None, True
    for k in sorted(wa):
        if not (wa[k].shape == wb[k].shape and bool((wa[k] == wb[k]).all())):
            equal = False
            d = float((wa[k].float() - wb[k].float()).abs().max())
            if d > worst:
                worst, where = d, k
    return {"identical": equal, "tensors": len(wa), "max_abs_diff": worst, "worst_tensor": where}


def part_resume(out: Path, smoke: bool, work: Path) -> dict:
    import value_recap_gpu as vr

    from reproduction.recap.tokenizer import train_tokenizer
    from reproduction.train.api import train

    device = "cuda" if _cuda() else "cpu"
    n = 2 if smoke else 4
    tok = work / "tok-resume"
    train_tokenizer(vr.TASKS, tok)
    make = functools.partial(_resume_task, tok=str(tok))
    timings = {}
    t0 = time.perf_counter()
    ref, again, run = work / "resume-ref", work / "resume-ref2", work / "resume-killed"
    for folder in (ref, again, run):
        shutil.rmtree(folder, ignore_errors=True)
    train(make, _resume_config(2 * n, n, device), out_dir=ref, resume=False)
    timings["reference_s"] = round(time.perf_counter() - t0, 2)
    t0 = time.perf_counter()
    train(make, _resume_config(2 * n, n, device), out_dir=again, resume=False)
    timings["reference_repeat_s"] = round(time.perf_counter() - t0, 2)
    # The run to kill: a child process in this part's process group (a timeout of the part kills it
    # too), SIGKILLed once step_N is committed; its output goes to a file (a pipe nobody reads can fill).
    run.mkdir(parents=True)
    t0 = time.perf_counter()
    with open(work / "resume-child.log", "w") as log:
        child = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--resume-child", str(run), "--n", str(n), "--tok",
             str(tok), "--device", device],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    marker, deadline = run / "hanging", time.monotonic() + 90
    while not marker.is_file() and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    hung = marker.is_file()
    child.kill()  # SIGKILL: the in-process launcher runs no other process
    child.wait(timeout=30)
    tail = (work / "resume-child.log").read_text(errors="replace")[-2000:]
    timings["killed_run_s"] = round(time.perf_counter() - t0, 2)
    if not hung:
        return record(
            "resume", ok=False, figure=None, unit="max |weight diff|",
            details={"child_exit": child.returncode, "child_tail": tail, **timings},
            error=f"the child run never reached step {n}'s committed checkpoint (exit {child.returncode})",
        )  # fmt: skip
    from reproduction.train import checkpoint

    steps_on_disk = checkpoint.complete_steps(run / "checkpoints")
    t0 = time.perf_counter()
    result = train(make, _resume_config(2 * n, n, device), out_dir=run, resume=True)
    timings["resumed_s"] = round(time.perf_counter() - t0, 2)
    la, lr2, lb = _losses(ref), _losses(again), _losses(run)
    loss_diff = max((abs(la[s] - lb.get(s, float("nan"))) for s in la), default=None)
    same_losses = la == lb
    weights = _weights_diff(ref, run)
    repeat = _weights_diff(ref, again)
    identical = same_losses and weights["identical"]
    if identical:
        why = "bit-identical: losses of all steps and every exported weight"
    elif not repeat["identical"] or la != lr2:
        why = (
            "two uninterrupted runs differ too (max weight diff "
            f"{repeat['max_abs_diff']:.3g}): non-deterministic kernels, not the resume"
        )
    else:
        why = "uninterrupted runs agree with each other but not with the resumed one: the resume changes numbers"
    details = {
        "code_path": "reproduction.train.api.train (in-process launcher, world size 1; the loop, DCP save/load, "
        "RNG and data-cursor restore that `portable run` uses), value `tiny` preset on synthetic samples",
        "precision": "bf16 (FSDP2 MixedPrecisionPolicy)",
        "n": n,
        "steps_total": 2 * n,
        "checkpoints_at_kill": steps_on_disk,
        "resumed_from": result.resumed_from,
        "kill": "SIGKILL of the child's process group while it waited in step N+1 after step N's DCP save committed",
        "losses_reference": [la[s] for s in sorted(la)],
        "losses_resumed": [lb[s] for s in sorted(lb)],
        "losses_identical": same_losses,
        "max_loss_diff": loss_diff,
        "weights": weights,
        "reference_repeat": {"losses_identical": la == lr2, "weights": repeat},
        "verdict": why,
        **timings,
    }
    fig = weights["max_abs_diff"]
    return record(
        "resume",
        ok=identical or not repeat["identical"],
        figure=fig,
        unit="max |weight diff| resumed vs uninterrupted (0 = bit-identical)",
        details=details,
        error=None if identical or not repeat["identical"] else why,
        identical=identical,
    )


# -- render -----------------------------------------------------------------------------------------

RENDER_PROBE = r"""
import ctypes, json, os, sys, time
sys.path.insert(0, sys.argv[1])
frames, size = int(sys.argv[2]), int(sys.argv[3])
out = {"MUJOCO_GL": os.environ.get("MUJOCO_GL"), "egl_device_id": os.environ.get("MUJOCO_EGL_DEVICE_ID")}
try:
    from reproduction.sim.env import CAMERAS, FetchSim
    import numpy as np
    with FetchSim("FetchPickAndPlace-v4", cameras=CAMERAS, image_size=size) as sim:
        sim.reset(seed=0)
        sim.render_frame(CAMERAS[0], size)
        for lib in ("libOpenGL.so.0", "libGL.so.1", "libOSMesa.so.8", "libOSMesa.so"):
            try:
                gl = ctypes.CDLL(lib)
                gl.glGetString.restype = ctypes.c_char_p
                for key, enum in (("gl_vendor", 0x1F00), ("gl_renderer", 0x1F01), ("gl_version", 0x1F02)):
                    v = gl.glGetString(enum)
                    if v:
                        out[key] = v.decode(errors="replace")
                if "gl_renderer" in out:
                    break
            except OSError:
                continue
        rng = np.random.default_rng(0)
        spent = 0.0
        for i in range(frames // len(CAMERAS)):
            sim.step(rng.uniform(-1, 1, 4))  # physics between frames, not timed
            t = time.perf_counter()
            obs = sim.observation()  # both cameras rendered and read back
            spent += time.perf_counter() - t
        out["seconds"] = spent
        out["frames"] = (frames // len(CAMERAS)) * len(CAMERAS)
        out["fps"] = out["frames"] / out["seconds"]
        out["mean_pixel"] = float(np.mean(obs["observation.images.agentview"]))
except BaseException as exc:
    out["error"] = "%s: %s" % (type(exc).__name__, str(exc)[-500:])
print(json.dumps(out))
"""


def _render_probe(backend: str, frames: int, env_extra: dict, timeout: float) -> dict:
    env = {**os.environ, "MUJOCO_GL": backend, **env_extra, "PYTHONPATH": _pythonpath()}
    if backend != "osmesa":
        env.pop("PYOPENGL_PLATFORM", None)
    try:
        proc = subprocess.run(
            [sys.executable, "-c", RENDER_PROBE, str(ROOT), str(frames), str(RENDER_SIZE)],
            env=env, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": f"exit {proc.returncode}: {proc.stderr[-600:]}"}


def _libero() -> dict:
    try:
        import libero  # noqa: F401
    except ImportError as exc:
        return {"skipped": f"LIBERO is not importable here ({exc}); install it (and robosuite) to measure one task"}
    return {"skipped": "LIBERO imports, but no LIBERO task runner is wired into this script yet"}


def part_render(out: Path, smoke: bool, work: Path) -> dict:
    frames = 40 if smoke else 2000
    nvidia = {"MUJOCO_EGL_DEVICE_ID": "0"}
    if Path("/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json").is_file():
        nvidia["__EGL_VENDOR_LIBRARY_FILENAMES"] = "/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json"
    mesa_json = next(iter(sorted(Path("/usr/share/glvnd/egl_vendor.d").glob("*mesa*.json"))), None)
    rows = {"egl": _render_probe("egl", frames, nvidia if _cuda() else {}, 40 if smoke else 60)}
    rows["osmesa"] = _render_probe("osmesa", frames // 4 if not smoke else frames, {}, 30)
    if mesa_json is not None:
        cpu_env = {"__EGL_VENDOR_LIBRARY_FILENAMES": str(mesa_json), "EGL_PLATFORM": "surfaceless"}
        rows["egl_mesa_cpu"] = _render_probe("egl", frames // 4 if not smoke else frames, cpu_env, 30)
    else:
        rows["egl_mesa_cpu"] = {"error": "no Mesa EGL vendor file in /usr/share/glvnd/egl_vendor.d"}
    egl = rows["egl"]
    cpu = [(k, r["fps"]) for k, r in rows.items() if k != "egl" and "fps" in r]
    cpu_best = max(cpu, key=lambda kv: kv[1]) if cpu else None
    renderer = egl.get("gl_renderer", "")
    on_gpu = "nvidia" in (renderer + egl.get("gl_vendor", "")).lower()
    details = {
        "task": "FetchPickAndPlace-v4",
        "image_size": RENDER_SIZE,
        "cameras": 2,
        "frames_per_backend": {k: r.get("frames") for k, r in rows.items()},
        "backends": rows,
        "egl_on_nvidia": on_gpu,
        "cpu_reference": {"backend": cpu_best[0], "fps": cpu_best[1]} if cpu_best else None,
        "speedup_vs_cpu": round(egl["fps"] / cpu_best[1], 2) if cpu_best and "fps" in egl else None,
        "libero": _libero(),
    }
    if "fps" not in egl:
        return record(
            "render", ok=False, figure=None, unit="frames/s", details=details, error=f"egl: {egl.get('error')}"
        )
    err = None
    if _cuda() and not on_gpu:
        err = f"MUJOCO_GL=egl rendered on {renderer or 'an unknown renderer'}, not the NVIDIA device"
    return record(
        "render",
        ok=err is None,
        figure=round(egl["fps"], 1),
        unit=f"frames/s (MUJOCO_GL=egl, {RENDER_SIZE} px)",
        details=details,
        error=err,
        cpu_fps=cpu_best[1] if cpu_best else None,
    )


# -- driver -----------------------------------------------------------------------------------------

RUNNERS = {
    "jit": part_jit,
    "value_bf16": part_value_bf16,
    "policy_pi05": part_policy_pi05,
    "resume": part_resume,
    "render": part_render,
}


def run_part_here(part: str, out: Path, smoke: bool, work: Path) -> None:
    """`--part`: run one part in this (child) process and write OUT_DIR/<part>.json."""
    t0 = time.perf_counter()
    try:
        if smoke:
            import torch

            torch.set_num_threads(1)
        res = RUNNERS[part](out, smoke, work)
    except BaseException as exc:  # a bug or an environment failure: recorded, never raised past here
        res = record(
            part, ok=False, figure=None, unit="", details={"traceback": traceback.format_exc()[-4000:]},
            error=f"{type(exc).__name__}: {str(exc)[:500]}",
        )  # fmt: skip
    res["seconds"] = round(time.perf_counter() - t0, 2)
    res["smoke"] = smoke
    (out / f"{part}.json").write_text(json.dumps(res, indent=1, default=str))


def line(res: dict) -> str:
    """The one printed line of a part."""
    status = "ok" if res["ok"] else "FAIL"
    fig = res.get("figure")
    fig = "-" if fig is None else (f"{fig:.4g}" if isinstance(fig, float) else str(fig))
    extra = []
    for key, fmt in (
        ("mfu", "MFU {:.1%}"),
        ("sample_latency_s", "chunk latency {:.4f} s"),
        ("cpu_fps", "cpu {:.1f} frames/s"),
    ):
        if res.get(key) is not None:
            extra.append(fmt.format(res[key]))
    if "mfu" in res and res["mfu"] is None:
        extra.append("MFU n/a (no CUDA)")
    if res.get("peak_memory_gib") is not None:
        extra.append(f"peak {res['peak_memory_gib']:.2f} GiB")
    if "identical" in res:
        extra.append("bit-identical" if res["identical"] else "NOT identical")
    if res.get("error"):
        extra.append(f"error: {res['error'][:200]}")
    tail = f" ({'; '.join(extra)})" if extra else ""
    return f"{res['part']}: {status} {fig} {res['unit']}{tail} [{res.get('seconds', '?')} s]"


def drive(out: Path, parts: list[str], smoke: bool, budget: float, keep_work: bool) -> int:
    out.mkdir(parents=True, exist_ok=True)
    work = out / "work"
    work.mkdir(exist_ok=True)
    start = time.monotonic()
    limits = SMOKE_LIMITS_S if smoke else LIMITS_S
    results = []
    for part in parts:
        (out / f"{part}.json").unlink(missing_ok=True)
        left = budget - (time.monotonic() - start)
        limit = min(limits[part], left)
        if limit < 5:
            res = record(
                part, ok=False, figure=None, unit="", details={"budget_s": budget}, error="no time left in the budget"
            )
            (out / f"{part}.json").write_text(json.dumps(res, indent=1))
        else:
            argv = [sys.executable, str(Path(__file__).resolve()), str(out), "--part", part] + (
                ["--smoke"] if smoke else []
            )
            env = {**os.environ, "PYTHONUNBUFFERED": "1", "TRITON_CACHE_DIR": str(work / "triton-cache")}
            if smoke:
                env.setdefault("OMP_NUM_THREADS", "1")
            t0 = time.monotonic()
            proc = subprocess.Popen(
                argv,
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
            try:
                log = proc.communicate(timeout=limit)[0]
                why = None if proc.returncode == 0 else f"the part's process exited {proc.returncode}"
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                log = proc.communicate(timeout=30)[0]
                why = f"timed out after {limit:.0f} s (its limit: {limits[part]} s, budget left {left:.0f} s)"
            path = out / f"{part}.json"
            if why or not path.is_file():
                prior = json.loads(path.read_text()) if path.is_file() else None
                res = prior or record(part, ok=False, figure=None, unit="", details={}, error=why or "no JSON written")
                if why and not prior:
                    res["error"] = why
                res["details"]["log_tail"] = (log or "")[-3000:]
                res["seconds"] = round(time.monotonic() - t0, 2)
                path.write_text(json.dumps(res, indent=1, default=str))
        res = json.loads((out / f"{part}.json").read_text())
        print(line(res), flush=True)
        results.append(res)
    total = time.monotonic() - start
    summary = {
        "smoke": smoke,
        "parts": {r["part"]: {k: r.get(k) for k in ("ok", "figure", "unit", "error", "seconds")} for r in results},
        "seconds": round(total, 2),
        "budget_s": budget,
        **_env_facts(),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    if not keep_work:
        shutil.rmtree(work, ignore_errors=True)
    bad = [r["part"] for r in results if not r["ok"]]
    print(
        f"gpu_truth: {len(results) - len(bad)}/{len(results)} parts ok in {total:.0f} s"
        + (f"; failed: {', '.join(bad)}" if bad else "")
    )
    return 1 if bad else 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir", type=Path, nargs="?")
    p.add_argument("--smoke", action="store_true", help="tiny presets, a few steps, on CPU (CI)")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    p.add_argument("--budget-s", type=float, default=BUDGET_S, help="total wall-clock budget of all parts")
    p.add_argument("--keep-work", action="store_true", help="keep OUT_DIR/work (checkpoints, Triton cache)")
    p.add_argument("--part", help=argparse.SUPPRESS)  # internal: run one part in this process
    p.add_argument("--resume-child", type=Path, help=argparse.SUPPRESS)  # internal: the run that gets killed
    p.add_argument("--n", type=int, help=argparse.SUPPRESS)
    p.add_argument("--tok", help=argparse.SUPPRESS)
    p.add_argument("--device", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.resume_child:
        resume_child(args.resume_child, args.n, args.tok, args.device)
        return
    if args.out_dir is None:
        p.error("OUT_DIR is required")
    if args.part:
        if args.smoke:
            os.environ["CUDA_VISIBLE_DEVICES"] = ""
        run_part_here(args.part, args.out_dir, args.smoke, args.out_dir / "work")
        return
    parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    unknown = [x for x in parts if x not in PARTS]
    if unknown or not parts:
        p.error(f"--parts: unknown part(s) {unknown or parts}; choose from {','.join(PARTS)}")
    sys.exit(drive(args.out_dir, parts, args.smoke, args.budget_s, args.keep_work))


if __name__ == "__main__":
    main()
