"""Device abstraction: pick cpu / cuda / npu and its collective backend (gloo / nccl / hccl).

The choice reuses `portable check`'s probes (reproduction.checks: stdlib only, so the pipeline may
import it; checks never imports the pipeline). Workers reach Ascend through an explicit
`import torch_npu`; the driver only probes it in a subprocess. The hazard
`torch_npu.contrib.transfer_to_npu` is never used: it patches torch globally (replaces torch.cuda,
forces hccl, disables torch.jit.script).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from reproduction.errors import ConfigError

if TYPE_CHECKING:
    from reproduction.checks.context import CheckContext
    from reproduction.checks.probe import ProbeResult

BACKENDS = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}
RAY_RESOURCE = {"cpu": None, "cuda": "GPU", "npu": "NPU"}  # Ray does not detect NPUs: declare `NPU`


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceSpec:
    """Where a worker computes and how the workers talk."""

    kind: str
    """cpu, cuda or npu."""
    backend: str
    """torch.distributed backend: gloo, nccl or hccl."""
    ray_resource: str | None
    """The Ray resource one worker reserves besides CPU (GPU, NPU) or None on CPU."""


def check_device_kind(kind: str, key: str = "device") -> None:
    """ConfigError (naming `key`, e.g. `value.infer.device` when a run config's section is checked at load)
    unless `kind` is one of auto, cpu, cuda, npu: `resolve`'s rule, without its probes."""
    if kind not in (*BACKENDS, "auto"):
        raise ConfigError(
            f"{key}={kind!r} is not one of cpu, cuda, npu, auto",
            field=key,
            hint=f"set {key} to one of: auto, cpu, cuda, npu",
        )


def resolve(kind: str, *, ctx: CheckContext | None = None) -> DeviceSpec:
    """Turn `auto|cpu|cuda|npu` into a DeviceSpec with the probes `portable check` runs.

    `auto` picks what `portable check --device auto` selects (device nodes: /dev/nvidia* -> cuda,
    /dev/davinci* -> npu, else cpu); an accelerator, picked or asked for, must then pass check's
    device probe (`cuda` / `npu` row: torch, or torch_npu, in a subprocess of this interpreter with
    this environment, as the workers will start). A failing probe is a ConfigError (field 'device',
    exit 4) carrying the probe's finding and fix: a machine whose GPU is broken does not silently
    train on CPU. `cpu` probes nothing. `ctx` is the check context (tests pass fake hosts);
    the default is the live machine. Nothing is imported into this process (no torch_npu).
    """
    check_device_kind(kind)
    if kind == "cpu":
        return _spec("cpu")
    from reproduction.checks.context import CheckContext, load_facts, select_device

    ctx = ctx or CheckContext.live(device=kind)
    chosen, why = select_device(ctx) if kind == "auto" else (kind, "requested")
    if chosen == "cpu":
        return _spec("cpu")
    if not ctx.facts and not ctx.facts_error:
        load_facts(ctx)
    row = _device_row(ctx, chosen)
    if row.status == "fail":
        asked = f"device='auto' chose {chosen} ({why})" if kind == "auto" else f"device={kind!r}"
        raise ConfigError(
            f"{asked}, but `portable check`'s {row.name} probe fails: {row.finding}",
            field="device",
            value=kind,
            hint=f"{row.fix or 'run `portable check`'}; or set device to cpu",
        )
    return _spec(chosen)


def _device_row(ctx: CheckContext, kind: str) -> ProbeResult:
    """Check's device row for `kind` ('cuda' or 'npu'): the first row of its accelerator probe."""
    if kind == "cuda":
        from reproduction.checks.accelerator_cuda import probe_cuda

        rows = probe_cuda(ctx, "cuda")
    else:
        from reproduction.checks.accelerator_ascend import probe_ascend

        rows = probe_ascend(ctx, "npu")
    return next(r for r in rows if r.name == kind)


def _spec(kind: str) -> DeviceSpec:
    return DeviceSpec(kind=kind, backend=BACKENDS[kind], ray_resource=RAY_RESOURCE[kind])


def _torch_npu():
    """`torch.npu`, registered by an explicit `import torch_npu` (the transfer_to_npu hazard is never used)."""
    importlib.import_module("torch_npu")
    import torch

    return torch.npu  # type: ignore[attr-defined]


def local_device(spec: DeviceSpec, local_rank: int):
    """The torch.device a worker uses, made current for cuda/npu (Ray sets the visible devices)."""
    import torch

    if spec.kind == "cpu":
        return torch.device("cpu")
    module = torch.cuda if spec.kind == "cuda" else _torch_npu()
    index = local_rank % max(1, module.device_count())
    module.set_device(index)
    return torch.device(spec.kind, index)


def rng_module(spec: DeviceSpec):
    """The accelerator RNG module (torch.cuda / torch.npu) whose state resume must restore, or None."""
    import torch

    return {"cpu": None, "cuda": torch.cuda, "npu": _torch_npu() if spec.kind == "npu" else None}[spec.kind]
