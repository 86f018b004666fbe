"""FSDP2: shard a model with `fully_shard` (declared units first, then the root), optional bf16.

With one worker in fp32 there is nothing to shard and FSDP2's all-gather/reduce-scatter copies and
hooks doubled the step time of a small model here (3.2 -> 7.5 ms), so the model stays a plain
module, as torchtitan does when dp_shard == 1. DCP checkpoints of either form load into the other
(DCP stores global tensors by name), so world sizes still change freely across a resume. bf16 at
world size 1 still goes through FSDP2 for its MixedPrecisionPolicy, so bf16 numerics are the same
code path at every world size.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from reproduction.train import dist


def shard(
    model: nn.Module,
    *,
    device: torch.device,
    mixed_precision: str,
    units: Callable[[nn.Module], list[nn.Module]] | None = None,
) -> nn.Module:
    """Move `model` to `device` and shard it in place over all ranks; returns the same module
    (unsharded for one fp32 worker, see the module doc).

    bf16 keeps fp32 master weights and optimizer state, computes in bf16 and reduces gradients in
    fp32. Parameter names are unchanged, so param groups by name work on the result.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model.to(device)
    if dist.world_size() == 1 and mixed_precision == "fp32":
        return model
    kwargs = {"mesh": dist.mesh(device.type)}
    if mixed_precision == "bf16":
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for unit in units(model) if units else []:
        fully_shard(unit, **kwargs)
        _register_methods(unit)
    fully_shard(model, **kwargs)
    _register_methods(model)
    return model


def _register_methods(module: nn.Module) -> None:
    """Methods a unit declares in `fsdp_forward_methods` (called by its parent instead of `forward`,
    e.g. a layer's projection of cached prefix states) get FSDP2's unshard/reshard hooks too; without
    them such a call sees sharded DTensor weights and fails ("mixed torch.Tensor and DTensor")."""
    from torch.distributed.fsdp import register_fsdp_forward_method

    for name in getattr(module, "fsdp_forward_methods", ()):
        register_fsdp_forward_method(module, name)


def set_gradient_sync(model: nn.Module, enabled: bool) -> None:
    """Turn FSDP2's per-backward gradient reduce-scatter on/off (a no-op for an unsharded model)."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(enabled)


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole (unsharded) state dict of `model` on every rank, on the device the model lives on.

    Collective on a sharded model: every rank must call it at the same point. (Not cpu_offload: with it
    torch gives the full dict to rank 0 only.) An unsharded model's own state dict is returned as is."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(model, FSDPModule):
        return model.state_dict()
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
