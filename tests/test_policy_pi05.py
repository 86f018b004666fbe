"""The pi05 preset: lerobot PI05Policy's keys and parameter counts on the meta device; a reduced-width forward.

Ground truth for the keys (no Hub access here): lerobot 0.4.4's modeling_pi05.py (module names,
`model.` prefix of PI05Policy, adaRMS `.dense` on every expert norm, no expert token embedding)
and the published lerobot/pi05 checkpoints' 812 tensors, 74 of them adaRMS `.dense` weights/biases.
lerobot's own PI05Pytorch cannot run here: it refuses any transformers without its patched
`transformers.models.siglip.check` (and stock Gemma has no adaRMS), so instead the reduced-width
test checks this module's prefix-cache + expert split against a direct layer-by-layer joint pass
written after lerobot's `compute_layer_complete`.
"""

from __future__ import annotations

import math

import pytest
import torch

from reproduction.errors import CheckpointError
from reproduction.recap.policy.model import build_policy_model
from reproduction.recap.policy.pi05 import lerobot_state_dict, load_pi05_state_dict, map_pi05_keys, pi05_config


@pytest.fixture(scope="module")
def meta_model():
    return build_policy_model(pi05_config(state_dim=8), device="meta")


def _count(model, prefix: str) -> int:
    return sum(p.numel() for n, p in model.named_parameters() if n.startswith(prefix))


def test_keys_match_lerobot_pi05_checkpoints(meta_model):
    keys = set(lerobot_state_dict(meta_model))
    assert len(keys) == 812
    assert sum(".dense." in k for k in keys) == 74
    for key in (
        "model.paligemma_with_expert.paligemma.model.vision_tower.vision_model.embeddings.patch_embedding.weight",
        "model.paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers.26.mlp.fc2.bias",
        "model.paligemma_with_expert.paligemma.model.vision_tower.vision_model.post_layernorm.weight",
        "model.paligemma_with_expert.paligemma.model.multi_modal_projector.linear.weight",
        "model.paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight",
        "model.paligemma_with_expert.paligemma.model.language_model.layers.17.self_attn.q_proj.weight",
        "model.paligemma_with_expert.paligemma.model.language_model.norm.weight",
        "model.paligemma_with_expert.gemma_expert.model.layers.0.input_layernorm.dense.weight",
        "model.paligemma_with_expert.gemma_expert.model.layers.17.post_attention_layernorm.dense.bias",
        "model.paligemma_with_expert.gemma_expert.model.norm.dense.weight",
        "model.paligemma_with_expert.gemma_expert.lm_head.weight",
        "model.action_in_proj.weight",
        "model.action_out_proj.bias",
        "model.time_mlp_in.weight",
        "model.time_mlp_out.bias",
    ):
        assert key in keys, key
    assert not any(k.endswith("layernorm.weight") and "gemma_expert" in k for k in keys)
    assert not any("gemma_expert.model.embed_tokens" in k or "vision_tower.head" in k for k in keys)


def test_parameter_counts_on_the_meta_device(meta_model):
    d, v = 2048, 257_152
    gemma_2b = v * d + 18 * (d * 2048 + 2 * d * 256 + 2048 * d + 3 * d * 16_384 + 2 * d) + d
    siglip = (
        (3 * 14 * 14 * 1152 + 1152)
        + 256 * 1152
        + 27 * (4 * (1152 * 1152 + 1152) + 2 * 1152 * 4304 + 4304 + 1152 + 4 * 1152)  # attn, mlp, 2 LNs
        + 2 * 1152
    )
    e = 1024
    expert = 18 * (e * 2048 + 2 * e * 256 + 2048 * e + 3 * e * 4096 + 2 * (e * 3 * e + 3 * e)) + (e * 3 * e + 3 * e)
    assert _count(meta_model, "paligemma_with_expert.paligemma.model.language_model") == gemma_2b
    assert _count(meta_model, "paligemma_with_expert.paligemma.model.vision_tower") == siglip
    assert _count(meta_model, "paligemma_with_expert.gemma_expert.model") == expert
    assert _count(meta_model, "paligemma_with_expert.gemma_expert.lm_head") == v * e
    assert _count(meta_model, "action_") + _count(meta_model, "time_mlp") == 2 * (32 * e + e) + 2 * (e * e + e) - e + 32
    # the headline figures: SigLIP so400m ~0.41B, Gemma 2B ~2.5B, the expert ~0.43B with adaRMS (~0.31B without)
    assert round(siglip / 1e9, 2) == 0.41 and round(gemma_2b / 1e9, 1) == 2.5
    assert round((expert - 37 * (e * 3 * e + 3 * e)) / 1e6) == 311


def test_both_key_spellings_load_strictly_and_a_mismatch_names_the_keys(meta_model):
    lerobot = lerobot_state_dict(meta_model)
    fresh = build_policy_model(pi05_config(state_dim=8), device="meta")
    load_pi05_state_dict(fresh, lerobot)  # lerobot PI05Policy spelling, tied lm_head left out
    openpi = {k[len("model.") :]: t for k, t in lerobot.items()}
    openpi["action_time_mlp_in.weight"] = openpi.pop("time_mlp_in.weight")
    load_pi05_state_dict(fresh, openpi)
    assert set(map_pi05_keys(openpi)) == set(map_pi05_keys(lerobot))
    broken = dict(lerobot)
    del broken["model.paligemma_with_expert.gemma_expert.model.norm.dense.bias"]
    broken["model.state_proj.weight"] = torch.empty(1, device="meta")
    with pytest.raises(CheckpointError, match="missing keys: paligemma_with_expert.gemma_expert.model.norm.dense.bias"):
        load_pi05_state_dict(fresh, broken)
    with pytest.raises(CheckpointError, match="not a pi0.5 checkpoint") as e:
        load_pi05_state_dict(fresh, {"language.embed_tokens.weight": torch.empty(1)}, source="tiny/model.safetensors")
    assert e.value.exit_code == 50


REDUCED = dict(
    vlm=dict(width=32, depth=2, mlp_dim=64, num_heads=2, num_kv_heads=1, head_dim=16),
    expert=dict(width=16, depth=2, mlp_dim=32, num_heads=2, num_kv_heads=1, head_dim=16),
    vision=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, patch_size=8),
    image_size=16,
    vocab_size=300,
    max_action_dim=6,
)


def _joint_pass(model, batch, x_t, t):
    """lerobot's joint forward: per layer, Q/K/V of prefix and suffix concatenated, one attention
    with pi0.5's masks (prefix bidirectional, suffix sees everything), each stream its own weights."""
    from transformers.models.gemma.modeling_gemma import apply_rotary_pos_emb

    from reproduction.recap.policy.model import sinusoidal_time

    pg = model.paligemma_with_expert
    prefix, valid, _ = model.encode_prefix(batch)
    cfg = model.config
    cond = torch.nn.functional.silu(
        model.time_mlp_out(
            torch.nn.functional.silu(
                model.time_mlp_in(sinusoidal_time(t, cfg.expert_width, cfg.min_period, cfg.max_period))
            )
        )
    )
    suffix = model.action_in_proj(x_t)
    b, lp, h = prefix.shape[0], prefix.shape[1], suffix.shape[1]
    pad = torch.cat([valid, valid.new_ones(b, h)], dim=1)
    ar = torch.cat([torch.zeros(b, lp, dtype=torch.long), torch.zeros(b, h, dtype=torch.long)], dim=1)
    ar[:, lp] = 1
    cum = torch.cumsum(ar, dim=1)
    allowed = (cum[:, None, :] <= cum[:, :, None]) & pad[:, None, :] & pad[:, :, None]
    allowed[:, :lp] |= ~pad[:, :lp, None] & pad[:, None, :] & (cum[:, None, :] == 0)  # pad rows: any valid prefix key
    bias = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)[:, None]
    pos = torch.cumsum(pad.long(), dim=1) - 1
    cos, sin = pg.language.rotary_emb(prefix, pos)
    streams = [prefix, suffix]
    towers = [pg.language, pg.gemma_expert.model]
    for i in range(len(towers[0].layers)):
        qs, ks, vs, gates = [], [], [], []
        for s, tower in enumerate(towers):
            layer = tower.layers[i]
            hn, g = (layer.input_layernorm(streams[s]), None) if s == 0 else layer.input_layernorm(streams[s], cond)
            gates.append(g)
            shape = (*hn.shape[:-1], -1, layer.self_attn.head_dim)
            qs.append(layer.self_attn.q_proj(hn).view(shape).transpose(1, 2))
            ks.append(layer.self_attn.k_proj(hn).view(shape).transpose(1, 2))
            vs.append(layer.self_attn.v_proj(hn).view(shape).transpose(1, 2))
        q, k, v = torch.cat(qs, 2), torch.cat(ks, 2), torch.cat(vs, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)
        k, v = k.repeat_interleave(q.shape[1] // k.shape[1], 1), v.repeat_interleave(q.shape[1] // v.shape[1], 1)
        scale = towers[0].layers[i].self_attn.scaling
        att = torch.softmax(q @ k.transpose(2, 3) * scale + bias, -1) @ v
        att = att.transpose(1, 2).reshape(b, lp + h, -1)
        outs = []
        for s, tower in enumerate(towers):
            layer = tower.layers[i]
            part = att[:, :lp] if s == 0 else att[:, lp:]
            o = layer.self_attn.o_proj(part)
            x = streams[s] + (o if s == 0 else gates[s] * o)
            if s == 0:
                x = x + layer.mlp(layer.post_attention_layernorm(x))
            else:
                hn, g = layer.post_attention_layernorm(x, cond)
                x = x + g * layer.mlp(hn)
            outs.append(x)
        streams = outs
    out, _ = pg.gemma_expert.model.norm(streams[1], cond)
    return model.action_out_proj(out)


def test_reduced_width_forward_equals_the_joint_layer_by_layer_pass():
    torch.manual_seed(0)
    cfg = pi05_config(state_dim=8, chunk=5, cameras=("base_0_rgb",), reduced=REDUCED)
    model = build_policy_model(cfg, seed=0).eval()
    for m in model.modules():  # make the adaRMS gates non-trivial (they start at zero)
        if hasattr(m, "dense") and isinstance(m.dense, torch.nn.Linear):
            torch.nn.init.normal_(m.dense.weight, std=0.1)
    ids = torch.randint(3, 300, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 5:] = False
    batch = {
        "input_ids": ids,
        "attention_mask": mask,
        "images": {"base_0_rgb": torch.rand(2, 3, 16, 16) * 2 - 1},
        "image_masks": {"base_0_rgb": torch.tensor([True, False])},
    }
    x_t, t = torch.randn(2, 5, 6), torch.tensor([0.3, 0.9])
    with torch.no_grad():
        split = model(batch, x_t, t)
        joint = _joint_pass(model, batch, x_t, t)
    assert split.shape == (2, 5, 6)
    assert torch.allclose(split, joint, atol=1e-4), float((split - joint).abs().max())
    # sampling: the prefix K/V is computed once and reused for every Euler step
    from reproduction.recap.policy.flow import euler_sample

    with torch.no_grad():
        cache = model.prefix_cache(*model.encode_prefix(batch))
        out = euler_sample(lambda x, tt: model.velocity(cache, x, tt), torch.randn(2, 5, 6), 3)
    assert torch.isfinite(out).all() and not math.isnan(float(out.sum()))
