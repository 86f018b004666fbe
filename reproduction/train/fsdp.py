"""FSDP2: shard a model with `fully_shard` (declared units first, then the root), optional bf16."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from reproduction.train import dist


def shard(model: nn.Module, *, device: torch.device, mixed_precision: str,
          units: Callable[[nn.Module], list[nn.Module]] | None = None) -> nn.Module:
    """Move `model` to `device` and shard it in place over all ranks; returns the same module.

    bf16 keeps fp32 master weights and optimizer state, computes in bf16 and reduces gradients in
    fp32. Parameter names are unchanged, so param groups by name work on the result.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model.to(device)
    kwargs = {"mesh": dist.mesh(device.type)}
    if mixed_precision == "bf16":
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for unit in (units(model) if units else []):
        fully_shard(unit, **kwargs)
    fully_shard(model, **kwargs)
    return model
