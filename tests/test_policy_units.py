"""Policy pieces alone: guidance arithmetic, prompt routing and dropout rates, flow-matching math, the tiny model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from reproduction.recap.policy.conditioning import NEGATIVE, PLAIN, POSITIVE, prompt_text, route, route_batch
from reproduction.recap.policy.flow import euler_sample, flow_loss, guide, interpolate, sample_time
from reproduction.recap.policy.model import PolicyModelConfig, build_policy_model, tiny_config

# -- guidance -------------------------------------------------------------------------------------


def test_guidance_w1_is_the_conditional_velocity_and_needs_no_unconditional_pass():
    v_c = torch.randn(3, 4, 4)
    assert guide(v_c, None, 1.0) is v_c
    with pytest.raises(ValueError):
        guide(v_c, None, 2.0)


def test_guidance_w0_is_unconditional_and_w2_extrapolates_exactly():
    v_c, v_u = torch.randn(5, 4, 4), torch.randn(5, 4, 4)
    assert torch.equal(guide(v_c, v_u, 0.0), v_u)
    assert torch.allclose(guide(v_c, v_u, 2.0), 2 * v_c - v_u)
    assert torch.allclose(guide(v_c, v_u, 1.5), -0.5 * v_u + 1.5 * v_c)


# -- routing ----------------------------------------------------------------------------------------


def test_prompt_text_is_upstreams():
    assert prompt_text("pick up the cube", PLAIN) == "pick up the cube"
    assert prompt_text("pick up the cube", POSITIVE) == "pick up the cube\nAdvantage: positive"
    assert prompt_text("pick up the cube", NEGATIVE) == "pick up the cube\nAdvantage: negative"


@pytest.mark.parametrize(
    ("label", "u", "positive_only", "want"),
    [
        (True, 0.9, True, POSITIVE),
        (True, 0.05, True, PLAIN),  # dropped
        (False, 0.9, True, PLAIN),  # negatives train the plain prompt
        (False, 0.05, True, PLAIN),
        (True, 0.9, False, POSITIVE),
        (False, 0.9, False, NEGATIVE),
        (False, 0.05, False, PLAIN),
        (True, 0.05, False, PLAIN),
    ],
)
def test_routing_by_label_draw_and_mode(label, u, positive_only, want):
    assert route(label, u, mode="recap", dropout=0.1, positive_only=positive_only) == want
    assert (
        route_batch(np.array([label]), np.array([u]), mode="recap", dropout=0.1, positive_only=positive_only)[0] == want
    )


@pytest.mark.parametrize("mode", ["bc", "filtered_bc"])
def test_baselines_never_condition(mode):
    labels = np.array([True, False, True])
    assert (
        route_batch(labels, np.array([0.9, 0.9, 0.0]), mode=mode, dropout=0.1, positive_only=False).tolist() == [0] * 3
    )


@pytest.mark.parametrize(("p", "positive_only"), [(0.1, True), (0.3, False), (0.2, False)])
def test_dropout_rates_match_the_configured_probability(p, positive_only):
    """Routing through the trainer's per-sample RNG: rates within 4 sigma of the expectation."""
    from reproduction.recap.policy.batches import RouteAugment

    n = 20_000
    rng = np.random.default_rng(123)
    labels = rng.random(n) < 0.3
    hook = RouteAugment(mode="recap", dropout=p, positive_only=positive_only)
    kinds = np.array(
        [hook({"label": bool(lab), "kind": 0}, np.random.default_rng([7, i]))["kind"] for i, lab in enumerate(labels)]
    )
    pos = labels.sum()
    rate_dropped_pos = float((kinds[labels] == PLAIN).mean())
    assert abs(rate_dropped_pos - p) < 4 * np.sqrt(p * (1 - p) / pos)
    neg_kinds = kinds[~labels]
    if positive_only:
        assert set(neg_kinds.tolist()) == {PLAIN}
    else:
        rate = float((neg_kinds == PLAIN).mean())
        assert abs(rate - p) < 4 * np.sqrt(p * (1 - p) / (~labels).sum())
        assert set(neg_kinds.tolist()) == {PLAIN, NEGATIVE}
    assert POSITIVE not in neg_kinds


# -- flow matching ----------------------------------------------------------------------------------


def test_time_is_0999_beta_15_1_plus_0001():
    torch.manual_seed(0)
    t = sample_time(200_000)
    assert float(t.min()) >= 0.001 and float(t.max()) <= 1.0
    x = (t - 0.001) / 0.999
    # Beta(1.5, 1): mean 0.6, P(x < 0.25) = 0.25^1.5 = 0.125
    assert abs(float(x.mean()) - 0.6) < 0.005
    assert abs(float((x < 0.25).float().mean()) - 0.125) < 0.005


def test_interpolant_target_and_loss_values():
    a = torch.tensor([[[1.0, -1.0]]])
    eps = torch.tensor([[[0.0, 1.0]]])
    t = torch.tensor([0.25])
    x_t, u = interpolate(a, eps, t)
    assert torch.allclose(x_t, torch.tensor([[[0.75, -0.5]]]))  # t * eps + (1 - t) * a
    assert torch.allclose(u, torch.tensor([[[-1.0, 2.0]]]))  # eps - a
    assert float(flow_loss(torch.zeros_like(u), u)) == pytest.approx((1 + 4) / 2)
    assert float(flow_loss(u, u)) == 0.0


def test_euler_integrates_from_noise_to_data_in_num_steps_calls():
    """With the exact velocity of a straight path, Euler lands on the data for any step count."""
    a = torch.randn(4, 3, 2)
    eps = torch.randn(4, 3, 2)
    calls = []

    def v(x, t):
        calls.append(float(t[0]))
        return eps - a

    out = euler_sample(v, eps, 5)
    assert torch.allclose(out, a, atol=1e-6)
    assert calls == pytest.approx([1.0, 0.8, 0.6, 0.4, 0.2])


# -- the tiny model ---------------------------------------------------------------------------------


def _batch(model, prompts_ids, state):
    ids = torch.tensor(prompts_ids)
    return {"input_ids": ids, "attention_mask": ids != 0, "state": state}


def test_prompt_dedup_gives_the_numbers_of_a_per_sample_pass():
    cfg = tiny_config(vocab_size=64, state_dim=5, chunk=3)
    model = build_policy_model(cfg, seed=0).eval()
    ids = [[1, 5, 6, 7, 0], [1, 5, 6, 7, 0], [1, 9, 9, 0, 0], [1, 5, 6, 7, 0]]
    state = torch.randn(4, 5)
    x, t = torch.randn(4, 3, 4), torch.rand(4)
    with torch.no_grad():
        prefix, valid, index = model.encode_prefix(_batch(model, ids, state))
        assert prefix.shape[0] == 2 and index.tolist() in ([0, 0, 1, 0], [1, 1, 0, 1])
        together = model(_batch(model, ids, state), x, t)
        alone = torch.cat(
            [model(_batch(model, [ids[i]], state[i : i + 1]), x[i : i + 1], t[i : i + 1]) for i in range(4)]
        )
    assert torch.allclose(together, alone, atol=1e-5)


def test_expert_blocks_start_as_identity_and_the_config_round_trips():
    cfg = tiny_config(vocab_size=64, state_dim=5)
    model = build_policy_model(cfg, seed=0)
    for layer in model.expert:
        assert not layer.input_layernorm.dense.weight.detach().any()
    assert PolicyModelConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(Exception, match="cameras"):
        PolicyModelConfig(cameras=("a",), vision=None)


def test_fsdp_units_cover_every_tower():
    from reproduction.recap.policy.task import policy_blocks

    cfg = tiny_config(vocab_size=64, state_dim=5, cameras=("agentview",), image_size=32)
    model = build_policy_model(cfg, seed=0)
    units = policy_blocks(model)
    assert len(units) == 2 + 2 + 2  # SigLIP, Gemma3 prefix and expert layers
    assert len(policy_blocks(build_policy_model(tiny_config(vocab_size=64, state_dim=5), seed=0))) == 4


def test_hold_labels_are_off_by_default_as_upstream_and_on_in_every_demo_config():
    """Upstream's stage 4 takes stage 3's labels as they are; the policy's hold labels (frames after a successful
    episode's first success made positive) had defaulted on, so the LIBERO-10 release config, which names no value,
    trained on labels upstream never gives. The demos name it (DEMO_LAB 4), so their results are unchanged."""
    from pathlib import Path

    from reproduction.recap.policy.config import PolicyConfig
    from reproduction.recipes.recap.config import load_config

    assert PolicyConfig().hold_labels is False
    bundle = Path(__file__).resolve().parent.parent / "bundle"
    for name in ("demo/run.yaml", "demo/quick.yaml", "demo_libero/run.yaml", "demo_libero/quick.yaml"):
        cfg = load_config([bundle / name], bundle=bundle)
        assert cfg.policy.model.hold_labels is True and cfg.advantages.hold_labels is True, name
    assert load_config([bundle / "libero10" / "config.yaml"], bundle=bundle).policy.model.hold_labels is False
