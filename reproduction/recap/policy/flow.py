"""pi0 flow matching: Beta time, the noisy interpolant and velocity target, the loss, Euler sampling with guidance.

t = 0.999 * Beta(1.5, 1) + 0.001            (t = 1 is pure noise, t = 0 the data)
x_t = t * eps + (1 - t) * a,  u = eps - a   loss = mean (u - v_theta(x_t, t))^2 over batch, H, A
sampling: x_1 = eps; for step in 0..num_steps-1: t = 1 - step / num_steps, x <- x - v(x, t) / num_steps
guidance: v = (1 - w) * v_uncond + w * v_cond   (w == 1: v_cond alone, no unconditional pass)
"""

from __future__ import annotations

from collections.abc import Callable

import torch

TIME_ALPHA, TIME_BETA, TIME_SCALE, TIME_OFFSET = 1.5, 1.0, 0.999, 0.001


def sample_time(
    batch: int, *, device: torch.device | str = "cpu", generator: torch.Generator | None = None
) -> torch.Tensor:
    """(B,) float32 times t = 0.999 * Beta(1.5, 1) + 0.001, drawn from torch's RNG (or `generator`).

    Beta(a, 1) is sampled by inversion (U^(1/a)), so the draw uses exactly one uniform per sample and a
    generator can drive it (torch.distributions.Beta cannot take one)."""
    u = torch.rand(batch, generator=generator, device=device, dtype=torch.float32)
    assert TIME_BETA == 1.0  # inversion below is Beta(a, 1)'s
    return u.pow(1.0 / TIME_ALPHA) * TIME_SCALE + TIME_OFFSET


def interpolate(actions: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_t, u): x_t = t * noise + (1 - t) * actions and the velocity target u = noise - actions."""
    tt = t.to(actions.dtype).view(-1, *([1] * (actions.dim() - 1)))
    return tt * noise + (1 - tt) * actions, noise - actions


def flow_loss(v_pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error over batch, horizon and action dims (float32)."""
    return (v_pred.float() - target.float()).pow(2).mean()


def guide(v_cond: torch.Tensor, v_uncond: torch.Tensor | None, w: float) -> torch.Tensor:
    """(1 - w) * v_uncond + w * v_cond; `v_uncond` may be None only when w == 1."""
    if w == 1.0:
        return v_cond
    if v_uncond is None:
        raise ValueError(f"guidance scale {w} needs the unconditional velocity")
    return (1.0 - w) * v_uncond + w * v_cond


def euler_sample(
    velocity: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], noise: torch.Tensor, num_steps: int
) -> torch.Tensor:
    """Integrate dx/dt = v from t = 1 (x = noise) to t = 0 in `num_steps` Euler steps (dt = -1/num_steps)."""
    if num_steps < 1:
        raise ValueError(f"num_steps={num_steps} must be >= 1")
    x = noise
    dt = -1.0 / num_steps
    for step in range(num_steps):
        t = torch.full((noise.shape[0],), 1.0 + step * dt, dtype=torch.float32, device=noise.device)
        x = x + dt * velocity(x, t)
    return x
