"""The GRPO objective: group-relative advantages and the PPO-clip loss with a KL penalty to the reference.

For init state b and its G rollouts with rewards R_{b,1..G} (GRPO, Shao et al. 2024, "DeepSeekMath",
arXiv:2402.03300, section 4.1):

    A_{b,g} = (R_{b,g} - mean_g R_{b,.}) / std_g R_{b,.}      (population std; a group whose rewards are all
                                                             equal, std < 1e-8, gets A = 0: no signal)

That is `rl.advantage_scale: group`. With a dense reward (`progress`) a group whose episodes all fail differs only
by how far each pushed the object, and the group std scales that small spread up to the weight of a group that
tells success from failure. `batch` keeps the group mean but divides by the std of the rewards of all the groups
collected together (Liu et al. 2025, "Tricks or Traps? A Deep Dive into RL for LLM Reasoning", arXiv:2508.08221,
section 4.1: group mean, batch std; TRL's `scale_rewards="batch"`); `none` divides by nothing (Dr. GRPO: Liu et al.
2025, "Understanding R1-Zero-Like Training", arXiv:2503.20783).

RLinf's GRPO advantage (rlinf/algorithms/advantages.py:107-117 at a3816b5) divides by the Bessel-corrected std plus
1e-6 instead, so the `group` advantages here are sqrt(G / (G - 1)) times RLinf's (1.069 at G = 8, 1.155 at G = 4,
1.414 at G = 2), and a nearly flat group differs more: rewards about 1e-7 apart get full-size advantages here and
ones shrunk by the 1e-6 there (docs/upstream.md, "GRPO").

Every denoising step j of every chunk of rollout (b, g) carries A_{b,g} (an outcome reward). With
r_j = exp(log pi_theta(j) - log pi_old(j)) (sde.py: one Gaussian step's log-prob),

    L = mean_j [ -min(r_j A_j, clip(r_j, 1 - eps, 1 + eps) A_j) + beta * KL_j(pi_theta || pi_ref) ]

averaged over all steps of the batch (zero-advantage groups stay in the mean: they still carry the KL term).
RLinf's embodied GRPO has no KL term (`kl_beta: 0.0` in its libero_10 GRPO config; its embodied actor never reads
it): `rl.kl_coef` = 0 gives its loss, the PPO-clip term alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from reproduction.recipes.grpo.config import ADVANTAGE_SCALES

ZERO_STD = 1e-8
"""A group whose reward std is below this has no learning signal (A = 0)."""


REWARDS = ("success_at_end", "success_once", "progress")
"""What `rl.reward` may name (rollout_rewards)."""


def rollout_rewards(r: Any, kind: str) -> np.ndarray:
    """(n,) float64 rewards of rollouts `r` (rollout.Rollouts) by `rl.reward`:

    success_at_end / success_once   1 for a success at the episode's end / at any step, else 0 (sparse);
    progress                        success_at_end + clip(1 - d_end / d_start, -1, 1), d the object-goal distance
                                    after reset and at the end (Fetch; needs rollouts with distances): a failed
                                    episode that pushed the object halfway earns 0.5, one that pushed it away
                                    loses up to 1, so a group whose episodes all fail still ranks them.
    """
    if kind == "success_at_end":
        return r.success_at_end.astype(np.float64)
    if kind == "success_once":
        return r.success_once.astype(np.float64)
    if kind == "progress":
        if r.distance_start is None or r.distance_end is None:
            raise ValueError("the progress reward needs rollouts with distances (rollout(..., distances=True))")
        start = np.maximum(np.asarray(r.distance_start, np.float64), 1e-6)
        gain = np.clip(1.0 - np.asarray(r.distance_end, np.float64) / start, -1.0, 1.0)
        return r.success_at_end.astype(np.float64) + gain
    raise ValueError(f"unknown reward {kind!r}: one of {', '.join(REWARDS)}")


def group_advantages(rewards: np.ndarray, scale: str = "group") -> np.ndarray:
    """(B, G) rewards -> (B, G) float64 advantages, each row centred on its mean and divided by (`scale`) its own
    std, the std of all B x G rewards, or nothing (the module docstring). Rows whose rewards are all equal
    give zeros whatever the scale; all rows equal give all zeros."""
    r = np.asarray(rewards, np.float64)
    if r.ndim != 2:
        raise ValueError(f"rewards must be (groups, group_size), got shape {r.shape}")
    if scale not in ADVANTAGE_SCALES:
        raise ValueError(f"unknown advantage scale {scale!r}: one of {', '.join(ADVANTAGE_SCALES)}")
    row_std = r.std(axis=1, keepdims=True)
    centred = np.where(row_std < ZERO_STD, 0.0, r - r.mean(axis=1, keepdims=True))
    std = row_std if scale == "group" else r.std(keepdims=True) if scale == "batch" else np.ones((1, 1))
    return centred / np.where(std < ZERO_STD, 1.0, std)


def ppo_clip_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantage: torch.Tensor,
    *,
    clip_eps: float,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """(loss, metrics) of the module docstring's L over elementwise tensors of the same shape.

    Metrics: clip_fraction (share of ratios outside [1 - eps, 1 + eps], whatever the advantage's sign; RLinf's
    actor/clip_fraction counts only the rows where the clip is active in the loss, r > 1 + eps with A > 0 or
    r < 1 - eps with A < 0: rlinf/algorithms/losses.py:256, 274-277 at a3816b5), ratio_mean, policy_loss, kl."""
    ratio = torch.exp(log_prob - old_log_prob)
    unclipped = ratio * advantage
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantage
    policy = -torch.minimum(unclipped, clipped).mean()
    kl_mean = kl.mean() if kl is not None else torch.zeros((), dtype=policy.dtype, device=policy.device)
    loss = policy + kl_coef * kl_mean
    with torch.no_grad():
        outside = ((ratio < 1.0 - clip_eps) | (ratio > 1.0 + clip_eps)).float().mean()
    return loss, {
        "clip_fraction": float(outside),
        "ratio_mean": float(ratio.detach().mean()),
        "policy_loss": float(policy.detach()),
        "kl": float(kl_mean.detach()),
    }
