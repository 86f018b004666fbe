"""GRPO's math on hand cases: group advantages, the PPO-clip + KL loss and its gradient, the flow-SDE step."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from reproduction.recipes.grpo import sde
from reproduction.recipes.grpo.objective import group_advantages, ppo_clip_loss


def test_group_advantages_standardise_within_each_group_and_zero_flat_groups():
    adv = group_advantages(np.array([[1, 0, 0, 1], [1, 1, 1, 1], [0, 0, 0, 1], [0, 0, 0, 0]]))
    np.testing.assert_allclose(adv[0], [1, -1, -1, 1])
    np.testing.assert_array_equal(adv[1], [0, 0, 0, 0])  # all succeeded: no signal
    s = math.sqrt(0.25 * 0.75)  # population std of (0, 0, 0, 1)
    np.testing.assert_allclose(adv[2], [-0.25 / s, -0.25 / s, -0.25 / s, 0.75 / s])
    np.testing.assert_allclose(adv[2], [-0.5773503, -0.5773503, -0.5773503, 1.7320508], rtol=1e-6)
    np.testing.assert_array_equal(adv[3], [0, 0, 0, 0])
    assert adv.sum(axis=1) == pytest.approx([0, 0, 0, 0], abs=1e-12)


def test_group_advantages_refuse_a_flat_vector():
    with pytest.raises(ValueError, match="groups, group_size"):
        group_advantages(np.array([1.0, 0.0]))
    with pytest.raises(ValueError, match="unknown advantage scale 'rank': one of group, batch, none"):
        group_advantages(np.array([[1.0, 0.0]]), "rank")


def test_batch_and_none_scales_keep_the_group_mean_and_weigh_groups_by_their_spread():
    # a success/failure group and an all-fail group that only differs by how far the object moved (progress)
    r = np.array([[1.0, 0.0, 0.0, 1.0], [0.1, 0.0, 0.0, 0.3], [2.0, 2.0, 2.0, 2.0]])
    group, batch, none = (group_advantages(r, s) for s in ("group", "batch", "none"))
    np.testing.assert_allclose(group[1], [0, -math.sqrt(2 / 3), -math.sqrt(2 / 3), 2 * math.sqrt(2 / 3)])
    np.testing.assert_allclose(none, [[0.5, -0.5, -0.5, 0.5], [0.0, -0.1, -0.1, 0.2], [0, 0, 0, 0]], atol=1e-12)
    s = r.std()  # population std over all 12 rewards, the flat group's too: sqrt(18.1 / 12 - (10.4 / 12) ** 2)
    assert s == pytest.approx(0.87019, abs=1e-5)
    np.testing.assert_allclose(batch, none / s)
    assert abs(group[1]).max() / abs(group[0]).max() == pytest.approx(1.633, abs=1e-3)  # the small spread scaled up
    assert abs(batch[1]).max() / abs(batch[0]).max() == pytest.approx(0.4)  # kept at its size: 0.2 / 0.5
    np.testing.assert_array_equal(batch[2], [0, 0, 0, 0])
    np.testing.assert_array_equal(group_advantages(np.full((2, 3), 0.7), "batch"), np.zeros((2, 3)))


def test_ppo_clip_loss_value_and_gradient_on_a_hand_case():
    # ratios 1.5, 1.5, 0.5, 1.0 with advantages 1, -1, 1, 2 and eps 0.2:
    #   1.5 *  1 -> clipped to 1.2 (no gradient)      1.5 * -1 -> min(-1.5, -1.2) = -1.5 (gradient)
    #   0.5 *  1 -> min(0.5, 0.8) = 0.5 (gradient)    1.0 *  2 -> 2 (gradient)
    lp = torch.tensor([math.log(1.5), math.log(1.5), math.log(0.5), 0.0], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(4, dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0, 1.0, 2.0], dtype=torch.float64)
    kl = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    loss, m = ppo_clip_loss(lp, old, adv, clip_eps=0.2, kl=kl, kl_coef=0.5)
    assert float(loss.detach()) == pytest.approx(-(1.2 - 1.5 + 0.5 + 2.0) / 4 + 0.5 * 0.25)  # -0.425
    loss.backward()
    # d/d lp of -r*A/4 is -A*r/4 where unclipped, 0 where the clipped branch is the min
    np.testing.assert_allclose(lp.grad.numpy(), [0.0, 0.375, -0.125, -0.5])
    assert m["clip_fraction"] == pytest.approx(0.75)  # 1.5, 1.5 and 0.5 lie outside [0.8, 1.2]
    assert m["policy_loss"] == pytest.approx(-0.55)
    assert m["kl"] == pytest.approx(0.25)
    assert m["ratio_mean"] == pytest.approx(1.125)


def test_ppo_clip_loss_on_policy_is_the_policy_gradient():
    lp = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
    adv = torch.tensor([0.5, -1.0, 2.0])
    loss, m = ppo_clip_loss(lp, lp.detach(), adv, clip_eps=0.2)
    loss.backward()
    np.testing.assert_allclose(lp.grad.numpy(), (-adv / 3).numpy(), rtol=1e-6)
    assert m["clip_fraction"] == 0.0 and m["ratio_mean"] == 1.0 and m["kl"] == 0.0


def test_sde_schedule_numbers():
    np.testing.assert_allclose(sde.timesteps(4).numpy(), [1.0, 0.75, 0.5, 0.25, 0.0])
    stds = sde.step_stds(10, 0.5).numpy()
    # sigma_0 = a * sqrt(1 / (1 - t_1)) = 0.5 * sqrt(10); std_0 = sqrt(1/10) * sigma_0 = 0.5
    assert stds[0] == pytest.approx(0.5)
    assert stds[5] == pytest.approx(math.sqrt(0.1) * 0.5)  # t = 0.5: sigma = a
    assert stds[9] == pytest.approx(math.sqrt(0.1) * 0.5 * math.sqrt(0.1 / 0.9))
    assert np.all(np.diff(stds) < 0)


def test_sde_mean_without_noise_is_the_euler_step():
    g = torch.Generator().manual_seed(0)
    x, v = torch.randn(5, 4, 3, generator=g), torch.randn(5, 4, 3, generator=g)
    k = torch.tensor([0, 1, 2, 3, 4])
    np.testing.assert_allclose(sde.sde_mean(x, v, k, 5, 0.0).numpy(), (x - v / 5).numpy(), atol=1e-6)
    # with noise the mean pulls x1_hat back by sigma^2 * delta / (2 t): a hand value at k = 2 (t = 0.6)
    t, tn, s = 0.6, 0.4, 0.5 * math.sqrt(0.6 / 0.4)
    x1 = torch.ones(1, 1, 1)
    vv = torch.full((1, 1, 1), 2.0)
    want = (1 - t * 2) * (1 - tn) + (1 + (1 - t) * 2) * (tn - s * s * 0.2 / (2 * t))
    assert float(sde.sde_mean(x1, vv, torch.tensor([2]), 5, 0.5)) == pytest.approx(want, rel=1e-6)


def test_gaussian_log_prob_matches_torch_normal_and_kl_closed_form():
    g = torch.Generator().manual_seed(1)
    x, mu = torch.randn(6, 3, generator=g, dtype=torch.float64), torch.randn(6, 3, generator=g, dtype=torch.float64)
    std = torch.tensor(0.37, dtype=torch.float64)
    want = torch.distributions.Normal(mu, std).log_prob(x)
    np.testing.assert_allclose(sde.gaussian_log_prob(x, mu, std).numpy(), want.numpy(), rtol=1e-12)
    ref = torch.randn(6, 3, generator=g, dtype=torch.float64)
    kl = torch.distributions.kl_divergence(torch.distributions.Normal(mu, std), torch.distributions.Normal(ref, std))
    np.testing.assert_allclose(sde.step_kl(mu, ref, std).numpy(), kl.numpy(), rtol=1e-12)


def test_sample_chain_log_probs_match_a_direct_computation():
    """Each step's log-prob equals -d log std - d/2 log 2pi - |z|^2 / 2 over the executed dims (z the step noise),
    and recomputing it from the stored chain (what the loss does) gives the same number."""
    torch.manual_seed(0)
    w = torch.randn(3, 3) * 0.3
    velocity = lambda x, t: x @ w + t.view(-1, 1, 1)  # noqa: E731  a toy velocity field
    g = torch.Generator().manual_seed(2)
    n, h, a, k_steps = 4, 4, 3, 5
    noise = torch.randn(n, h, a, generator=g)
    z = torch.randn(k_steps, n, h, a, generator=g)
    chain, means, logp = sde.sample_chain(velocity, noise, z, k_steps, 0.5, (2, 2))
    assert chain.shape == (n, k_steps + 1, h, a) and logp.shape == (n, k_steps)
    stds = sde.step_stds(k_steps, 0.5)
    d = 2 * 2
    for k in range(k_steps):
        s = float(stds[k])
        direct = -d * math.log(s) - d / 2 * math.log(2 * math.pi) - 0.5 * (z[k, :, :2, :2] ** 2).sum(dim=(1, 2))
        np.testing.assert_allclose(logp[:, k].numpy(), direct.numpy(), rtol=1e-5, atol=1e-5)
        x, t = chain[:, k], torch.full((n,), float(sde.timesteps(k_steps)[k]))
        mean = sde.sde_mean(x, velocity(x, t), torch.full((n,), k), k_steps, 0.5)
        again = sde.gaussian_log_prob(chain[:, k + 1, :2, :2], mean[:, :2, :2], torch.tensor(s)).sum(dim=(1, 2))
        np.testing.assert_allclose(again.numpy(), logp[:, k].numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(chain[:, 0].numpy(), noise.numpy())
