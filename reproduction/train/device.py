"""Device abstraction: pick cpu / cuda / npu and its collective backend (gloo / nccl / hccl).

Ascend is reached through an explicit, guarded `import torch_npu`. The hazard
`torch_npu.contrib.transfer_to_npu` is never used: it patches torch globally (replaces torch.cuda,
forces hccl, disables torch.jit.script).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from reproduction.errors import ConfigError

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


def _npu_available() -> bool:
    try:
        importlib.import_module("torch_npu")  # registers torch.npu; explicit, never transfer_to_npu
    except Exception:  # noqa: BLE001 - missing package, missing CANN libs, version skew: all mean "no npu"
        return False
    import torch

    return bool(getattr(torch, "npu", None) and torch.npu.is_available())


def resolve(kind: str) -> DeviceSpec:
    """Turn `auto|cpu|cuda|npu` into a DeviceSpec; asking for an absent accelerator is a ConfigError."""
    import torch

    if kind == "auto":
        kind = "npu" if _npu_available() else "cuda" if torch.cuda.is_available() else "cpu"
    elif kind == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda' but torch sees no CUDA device", field="device",
                          hint="run `portable check`, or set device to cpu")
    elif kind == "npu" and not _npu_available():
        raise ConfigError("device='npu' but torch_npu is not importable or sees no NPU", field="device",
                          hint="source CANN's set_env.sh and install the matching torch_npu, or set device to cpu")
    if kind not in BACKENDS:
        raise ConfigError(f"device={kind!r} is not one of cpu, cuda, npu, auto", field="device")
    return DeviceSpec(kind=kind, backend=BACKENDS[kind], ray_resource=RAY_RESOURCE[kind])


def local_device(spec: DeviceSpec, local_rank: int):
    """The torch.device a worker uses, made current for cuda/npu (Ray sets the visible devices)."""
    import torch

    if spec.kind == "cpu":
        return torch.device("cpu")
    module = torch.cuda if spec.kind == "cuda" else torch.npu  # type: ignore[attr-defined]
    index = local_rank % max(1, module.device_count())
    module.set_device(index)
    return torch.device(spec.kind, index)


def rng_module(spec: DeviceSpec):
    """The accelerator RNG module (torch.cuda / torch.npu) whose state resume must restore, or None."""
    import torch

    return {"cpu": None, "cuda": torch.cuda, "npu": getattr(torch, "npu", None)}[spec.kind]
