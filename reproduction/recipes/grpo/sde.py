"""Flow-SDE sampling: each denoising step of the flow-matching head as a Gaussian with a tractable log-prob.

The policy head (reproduction/recap/policy/flow.py) is trained by flow matching with t = 1 pure noise and
t = 0 the action chunk: x_t = t * eps + (1 - t) * a, v_theta(x_t, t) ~ eps - a, and it samples with the
deterministic Euler ODE x <- x - delta * v over the grid t_k = 1 - k / K (k = 0..K-1), t_K = 0, delta = 1/K.
An ODE sample has no likelihood a policy gradient can use. Flow-GRPO (Liu et al. 2025, "Flow-GRPO: Training
Flow Matching Models via Online RL", arXiv:2505.05470, eq. 9-12) turns the ODE into the reverse-time SDE with
the same marginals and discretises it, so each step is a Gaussian; RLinf's openpi policy implements that step as
`noise_method: flow_sde` (RLinf/RLinf at a3816b5, rlinf/models/embodiment/openpi/openpi_action_model.py:
`sample_mean_var_val`'s flow_sde branch, lines 1176-1183, and `get_logprob_norm`, 1287-1300), which this module's
step follows in our time convention (mean, std and log-prob within 5e-6 of RLinf's: docs/upstream.md, "GRPO"):

    x0_hat = x_k - t_k * v              (the action the velocity points to)
    x1_hat = x_k + (1 - t_k) * v        (the noise it came from)
    sigma_k = a * sqrt(t_k / (1 - t_k))  (t_k = 1 uses t_1 in the denominator, as RLinf does)
    mu_k  = x0_hat * (1 - t_{k+1}) + x1_hat * (t_{k+1} - sigma_k^2 * delta / (2 t_k))
    std_k = sqrt(delta) * sigma_k
    x_{k+1} = mu_k + std_k * z,  z ~ N(0, I)

a = `noise_level` (RLinf's default 0.5). With a = 0 the step is exactly the Euler step x_k - delta * v (the
evaluation sampler), so the SDE policy is the ODE policy plus exploration noise whose size the schedule sets.

The chain is not RLinf's. `sample_chain` takes the SDE step at EVERY one of the K denoising steps. RLinf's flow_sde
rollout (`joint_logprob: False`, its default: openpi_action_model.py:77, 1041-1070 at a3816b5) takes it at ONE step
j, drawn by `random.randint` once per sampling call and shared by the whole batch, and a plain Euler step (flow_ode,
std 0) at the others; the old log-prob it stores is step j's (lines 1098-1102). Each is the exact likelihood of its
own sampler; the exploration differs. On an analytic velocity field (data N(0.3, 0.05^2) per dimension, a = 0.5;
audit 46) the final actions' std at K = 10 is 0.0199 for the Euler ODE, 0.0535 for this chain, and 0.020-0.023 for
RLinf's with j = 0..8 (0.053 only with j = 9, the last step); at K = 4: 0.0074, 0.151, and 0.008-0.009 for j = 0..2
(0.148 for j = 3). So at the same noise level every rollout here spreads about as much as RLinf's rollouts do only
in the 1-in-K sampling calls that draw the last step.

Log-likelihood. Given the initial noise x_0 ~ N(0, I) (independent of theta), the chain x_0 -> ... -> x_K has
density prod_k N(x_{k+1}; mu_theta(x_k, t_k), std_k^2 I). Per step

    log p_k = sum_d [ -log std_k - log(2 pi) / 2 - (x_{k+1,d} - mu_{k,d})^2 / (2 std_k^2) ]

summed over the dimensions d the environment executes (the first `execute_steps` actions of the chunk and the
real action dims; the rest never reaches the environment: RLinf cuts the same `[:action_chunk, :action_env_dim]`).
The PPO ratio is taken per denoising step (Flow-GRPO treats every step as an MDP action with the episode's
advantage), so one chunk gives K ratios; the loss takes `rl.logprob_steps` of them, drawn per (rollout, decision)
(task.pick_steps), where RLinf trains on its one step j. Because the two policies share std_k, the KL of one step
has the closed form Flow-GRPO uses for its KL penalty (RLinf's embodied GRPO has no KL term: objective.py):

    KL(N(mu, s^2) || N(mu_ref, s^2)) = sum_d (mu_d - mu_ref,d)^2 / (2 s^2).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch


def timesteps(num_steps: int) -> torch.Tensor:
    """(K + 1,) float64 grid t_k = 1 - k / K, t_K = 0 (the Euler sampler's grid)."""
    if num_steps < 1:
        raise ValueError(f"num_steps={num_steps} must be >= 1")
    return torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float64)


def sigmas(num_steps: int, noise_level: float) -> torch.Tensor:
    """(K,) float64 sigma_k = a * sqrt(t_k / (1 - t_k)); the t = 1 step divides by 1 - t_1 (RLinf's rule)."""
    t = timesteps(num_steps)
    denom = torch.where(t == 1.0, 1.0 - t[1], 1.0 - t)
    return noise_level * torch.sqrt(t / denom)[:-1]


def step_stds(num_steps: int, noise_level: float) -> torch.Tensor:
    """(K,) float64 std_k = sqrt(delta) * sigma_k of each denoising step."""
    return math.sqrt(1.0 / num_steps) * sigmas(num_steps, noise_level)


def sde_mean(x: torch.Tensor, v: torch.Tensor, k: torch.Tensor, num_steps: int, noise_level: float) -> torch.Tensor:
    """mu_k (module docstring) for rows `x`, `v` (N, ...) at step indices `k` (N,) int64; float32 like x."""
    t_all = timesteps(num_steps).to(x.device)
    sig = sigmas(num_steps, noise_level).to(x.device)
    shape = (-1,) + (1,) * (x.dim() - 1)
    t = t_all[k].view(shape).to(x.dtype)
    t_next = t_all[k + 1].view(shape).to(x.dtype)
    s = sig[k].view(shape).to(x.dtype)
    delta = t - t_next
    x0_hat = x - t * v
    x1_hat = x + (1 - t) * v
    return x0_hat * (1 - t_next) + x1_hat * (t_next - s * s * delta / (2 * t))


def gaussian_log_prob(sample: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Elementwise log N(sample; mean, std^2); `std` broadcasts (it must be > 0)."""
    return -torch.log(std) - 0.5 * math.log(2 * math.pi) - 0.5 * ((sample - mean) / std) ** 2


def step_kl(mean: torch.Tensor, ref_mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Elementwise KL(N(mean, std^2) || N(ref_mean, std^2)) = (mean - ref_mean)^2 / (2 std^2)."""
    return (mean - ref_mean) ** 2 / (2 * std**2)


def sample_chain(
    velocity: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    noise: torch.Tensor,
    step_noise: torch.Tensor,
    num_steps: int,
    noise_level: float,
    dims: tuple[int, int],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the SDE from `noise` (N, H, A) with the step noises `step_noise` (K, N, H, A).

    Returns (chain (N, K + 1, H, A), means (N, K, H, A), log_probs (N, K)), each step's log-prob summed over the
    first `dims` = (h, a) entries (the executed actions' real dims). `velocity(x, t)` -> v (N, H, A); no grad is
    taken here (the caller wraps it)."""
    t_all = timesteps(num_steps)
    stds = step_stds(num_steps, noise_level)
    h, a = dims
    x = noise
    chain, means, logps = [x], [], []
    for k in range(num_steps):
        t = torch.full((x.shape[0],), float(t_all[k]), dtype=torch.float32)
        v = velocity(x, t)
        kk = torch.full((x.shape[0],), k, dtype=torch.long)
        mean = sde_mean(x, v, kk, num_steps, noise_level)
        std = torch.tensor(float(stds[k]), dtype=x.dtype)
        x = mean + std * step_noise[k]
        logps.append(gaussian_log_prob(x[:, :h, :a], mean[:, :h, :a], std).sum(dim=(1, 2)))
        chain.append(x)
        means.append(mean)
    return torch.stack(chain, 1), torch.stack(means, 1), torch.stack(logps, 1)
