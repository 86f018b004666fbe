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


# --- openpi's prompt and normalisation (upstream RLinf's pi05_libero: discrete_state_input False, quantile norm) ---

TASK_TEXT = "  put_both the alphabet soup\nin the basket "


def _tokenizer(tmp_path):
    from reproduction.recap.policy.conditioning import KINDS, prompt_text
    from reproduction.recap.tokenizer import train_tokenizer

    return train_tokenizer([prompt_text(TASK_TEXT, k) for k in range(len(KINDS))], tmp_path / "tok")


def _openpi_tokenize(tok, prompt, state=None):
    """openpi 0.1.1 PaligemmaTokenizer.tokenize (models/tokenizer.py) with this tokenizer's encode standing in for
    sentencepiece's (`add_bos` = add_special_tokens): the two branches, before padding to max_len."""
    import numpy as np

    encode = lambda text, add_bos=False: tok(text, add_special_tokens=add_bos)["input_ids"]  # noqa: E731
    cleaned_text = prompt.strip().replace("_", " ").replace("\n", " ")
    if state is not None:
        discretized_state = np.digitize(state, bins=np.linspace(-1, 1, 256 + 1)[:-1]) - 1
        state_str = " ".join(map(str, discretized_state))
        full_prompt = f"Task: {cleaned_text}, State: {state_str};\nAction: "
        return encode(full_prompt, add_bos=True)
    return encode(cleaned_text, add_bos=True) + encode("\n")


def test_the_pi05_prompt_tokenises_as_openpis_without_the_state(tmp_path):
    """discrete_state_input False (pi05_libero): the cleaned task with <bos>, then "\\n" alone; no Task:/State text,
    and the ids do not depend on the state; True: openpi's state text, binned without a clip."""
    import numpy as np

    from reproduction.recap.policy.batches import PolicyCollator
    from reproduction.recap.policy.conditioning import KINDS, prompt_text

    tok = _tokenizer(tmp_path)
    states = np.array([[0.0, -0.5, 0.99], [1.7, -1.3, -1.0]], np.float32)  # outside [-1, 1] too
    plain = PolicyCollator(tok, [TASK_TEXT], cameras=("base_0_rgb",), prompt="pi05")
    with_state = PolicyCollator(tok, [TASK_TEXT], cameras=("base_0_rgb",), prompt="pi05_state")
    assert with_state.state_text and plain.state_text and plain.max_token_len == 200
    for kind in range(len(KINDS)):
        raw = prompt_text(TASK_TEXT, kind)
        ids, mask = plain.encode(plain.prompts([0, 0], [kind, kind], states))
        want = _openpi_tokenize(tok, raw)
        assert ids[0][mask[0]].tolist() == ids[1][mask[1]].tolist() == want  # the state changes nothing
        assert want[0] == tok.bos_token_id and want[-1:] == tok("\n", add_special_tokens=False)["input_ids"]
        text = tok.decode(want, skip_special_tokens=True)
        assert "Task:" not in text and "State" not in text and text.startswith("put both the alphabet soup in")
        ids, mask = with_state.encode(with_state.prompts([0, 0], [kind, kind], states))
        for row in range(2):
            assert ids[row][mask[row]].tolist() == _openpi_tokenize(tok, raw, states[row])
    assert with_state.prompts([0], [0], states[1:])[0].endswith("State: 255 -1 0;\nAction: ")
    clipped = PolicyCollator(tok, [TASK_TEXT], prompt="pi05_state_clipped")  # exports written before
    assert clipped.prompts([0], [0], states[1:])[0].endswith("State: 255 0 0;\nAction: ")
    assert PolicyCollator(tok, [TASK_TEXT], state_text=True).prompt == "pi05_state"


def test_an_export_without_the_new_keys_reads_as_it_was_written():
    """policy.json before discrete_state_input/norm: pi05 = the clipped state text, stats = z-score; tiny unchanged."""
    import numpy as np

    from reproduction.recap.policy.normalize import Normalizer
    from reproduction.recap.policy.pi05 import export_prompt_style, prompt_style

    assert export_prompt_style({"preset": "pi05"}) == "pi05_state_clipped"
    assert export_prompt_style({"preset": "pi05", "prompt": "pi05"}) == "pi05"
    assert export_prompt_style({"preset": "tiny"}) is None
    assert prompt_style("pi05", False) == "pi05" and prompt_style("pi05", True) == "pi05_state"
    assert prompt_style("tiny", False) is None
    old = {"state_mean": [1.0, 2.0], "state_std": [2.0, 0.5], "action_mean": [0.5], "action_std": [2.0]}
    norm = Normalizer(old)
    x = np.array([[3.0, 1.0]], np.float32)
    assert norm.norm == "zscore" and norm.state(x).tolist() == [[1.0, -2.0]]
    assert norm.unaction(np.array([[1.0]], np.float32)).tolist() == [[2.5]]


def test_quantile_normalisation_is_openpis_and_round_trips(tmp_path):
    """openpi transforms.Normalize/Unnormalize(use_quantiles=True), q01/q99 from frames or a norm_stats.json."""
    import json

    import numpy as np

    from reproduction.errors import ConfigError
    from reproduction.recap.policy.normalize import Normalizer, quantile_stats, read_norm_stats

    rng = np.random.default_rng(0)
    state = (rng.normal(size=(500, 3)) * [0.1, 2.0, 0.01] + [0.0, 5.0, -1.0]).astype(np.float32)
    action = (rng.normal(size=(500, 2)) * [0.3, 1.0]).astype(np.float32)
    q = quantile_stats(state, action)
    assert np.allclose(q["state_q01"], np.quantile(state.astype(np.float64), 0.01, axis=0))
    stats = {"state_mean": [0.0] * 3, "state_std": [1.0] * 3, "action_mean": [0.0] * 2, "action_std": [1.0] * 2}
    norm = Normalizer({**stats, "norm": "quantile", **q})
    q01, q99 = np.asarray(q["action_q01"]), np.asarray(q["action_q99"])
    want = (action - q01) / (q99 - q01 + 1e-6) * 2.0 - 1.0
    got = norm.action(action)
    assert got.dtype == np.float32 and np.allclose(got, want, atol=1e-6)
    assert np.mean(np.abs(got) <= 1.0) > 0.97  # 1%..99% land in [-1, 1]
    assert np.allclose(norm.unaction(got), action, atol=1e-5)
    s01, s99 = np.asarray(q["state_q01"]), np.asarray(q["state_q99"])
    assert np.allclose(norm.state(state), (state - s01) / (s99 - s01 + 1e-6) * 2 - 1, atol=1e-6)
    # openpi's norm_stats.json: cut to the policy's dims as Normalize cuts them
    doc = {
        "norm_stats": {
            "state": {"mean": [0] * 4, "std": [1] * 4, "q01": [-1, -2, -3, -4], "q99": [1, 2, 3, 4]},
            "actions": {"mean": [0] * 2, "std": [1] * 2, "q01": [-0.5, -1], "q99": [0.5, 1]},
        }
    }
    (tmp_path / "assets").mkdir()
    (tmp_path / "assets" / "norm_stats.json").write_text(json.dumps(doc))
    got = read_norm_stats(tmp_path / "assets", state_dim=3, action_dim=2)
    assert got == {"state_q01": [-1, -2, -3], "state_q99": [1, 2, 3], "action_q01": [-0.5, -1], "action_q99": [0.5, 1]}
    with pytest.raises(ConfigError, match="actions.q01 of at least 3 values"):
        read_norm_stats(tmp_path / "assets" / "norm_stats.json", state_dim=3, action_dim=3)


def test_the_config_fields_and_their_rules():
    from reproduction.errors import ConfigError
    from reproduction.recap.policy.config import PolicyConfig

    cams = {"base_0_rgb": "observation.images.image"}
    cfg = PolicyConfig(preset="pi05", cameras=cams)
    assert cfg.discrete_state_input is False and cfg.norm is None and cfg.image_augment is None
    assert PolicyConfig(preset="pi05", cameras=cams, discrete_state_input=True, norm="zscore").norm == "zscore"
    with pytest.raises(ConfigError, match="discrete_state_input=true applies to pi05"):
        PolicyConfig(discrete_state_input=True)
    with pytest.raises(ConfigError, match="norm='minmax' is not one of zscore, quantile"):
        PolicyConfig(norm="minmax")
    with pytest.raises(ConfigError, match="norm_stats is set, but the normalisation is z-score"):
        PolicyConfig(norm_stats="/x/norm_stats.json")


def test_a_pi05_setup_records_quantiles_and_its_export_the_prompt(tmp_path):
    """prepare_policy_setup for pi05 (no model built): quantile stats from the training frames or a norm_stats.json,
    and policy.json's `prompt`; tiny's setup keeps z-score stats and its policy.json no new key."""
    import json

    import numpy as np

    from reproduction.recap.policy.config import PolicyConfig
    from reproduction.recap.policy.data import PolicySource, open_policy_input, state_stats
    from reproduction.recap.policy.setup import prepare_policy_setup
    from reproduction.recap.policy.task import export_metadata
    from reproduction.train.config import TrainConfig
    from tests.policy_synth import write_policy_dataset

    ds = write_policy_dataset(tmp_path / "sft", episodes=4, length=8)
    inp = [open_policy_input(PolicySource(path=str(ds), type="sft"), need_labels=False)]
    train = TrainConfig(max_steps=1, global_batch=4, micro_batch=4, launcher="inprocess")
    cams = {"base_0_rgb": "observation.images.agentview"}
    setup = prepare_policy_setup(
        inp, PolicyConfig(preset="pi05", cameras=cams), tmp_path / "p", mode="bc", train=train, resume=False
    )
    stats = setup["stats"]
    assert stats["norm"] == "quantile" and len(stats["state_q01"]) == 8 and len(stats["action_q99"]) == 4
    assert np.allclose(stats["action_q01"], np.quantile(inp[0].action.astype(np.float64), 0.01, axis=0))
    meta = export_metadata(setup)
    assert meta["prompt"] == "pi05" and meta["stats"] == stats
    doc = {
        "norm_stats": {"state": {"q01": [-1.0] * 9, "q99": [1.0] * 9}, "actions": {"q01": [-2.0] * 4, "q99": [2.0] * 4}}
    }
    (tmp_path / "norm_stats.json").write_text(json.dumps(doc))
    cfg = PolicyConfig(
        preset="pi05", cameras=cams, discrete_state_input=True, norm_stats=str(tmp_path / "norm_stats.json")
    )
    setup = prepare_policy_setup(inp, cfg, tmp_path / "q", mode="bc", train=train, resume=False)
    assert setup["stats"]["state_q99"] == [1.0] * 8 and setup["stats"]["action_q01"] == [-2.0] * 4
    assert export_metadata(setup)["prompt"] == "pi05_state"
    tiny = prepare_policy_setup(inp, PolicyConfig(), tmp_path / "t", mode="bc", train=train, resume=False)
    from reproduction.recap.policy.data import build_arrays

    assert tiny["stats"] == state_stats(build_arrays(inp, mode="bc", chunk=4)[0])
    assert "prompt" not in export_metadata(tiny) and "norm" not in export_metadata(tiny)["stats"]


def test_a_pi05_export_samples_with_its_prompt_and_unnormalises_by_quantiles(tmp_path):
    """GuidedPolicy (load_policy's callable) of a reduced pi05: the no-state prompt (the same ids for any state) and
    actions mapped back by openpi's Unnormalize."""
    import numpy as np

    from reproduction.recap.policy.export import GuidedPolicy
    from reproduction.recap.policy.normalize import Normalizer

    tok = _tokenizer(tmp_path)
    cfg = pi05_config(
        state_dim=3, action_dim=2, chunk=4, cameras=("base_0_rgb",), reduced={**REDUCED, "vocab_size": len(tok)}
    )
    model = build_policy_model(cfg, seed=0).eval()
    stats = {
        "state_mean": [0.0] * 3,
        "state_std": [1.0] * 3,
        "action_mean": [0.0] * 2,
        "action_std": [1.0] * 2,
        "norm": "quantile",
        "state_q01": [-1.0] * 3,
        "state_q99": [1.0] * 3,
        "action_q01": [0.0, -4.0],
        "action_q99": [10.0, 4.0],
    }
    meta = {"preset": "pi05", "mode": "bc", "chunk": 4, "execute_steps": 2, "num_steps": 2, "prompt": "pi05"}
    meta |= {"cameras": {"base_0_rgb": "observation.images.image"}, "stats": stats, "state_keys": ["observation.state"]}
    pol = GuidedPolicy(model=model, meta=meta, tokenizer=tok, guidance_scale=1.0, num_steps=2, seed=0)
    assert pol.collator.prompt == "pi05"
    obs = {
        "observation.state": np.array([[0.1, 0.2, 0.3], [5.0, -5.0, 0.0]], np.float32),
        "observation.images.image": np.zeros((2, 16, 16, 3), np.uint8),
        "task": [TASK_TEXT] * 2,
    }
    batch = pol.batch(obs, [0, 0])
    assert batch["input_ids"][0].tolist() == batch["input_ids"][1].tolist() == _openpi_tokenize(tok, TASK_TEXT)
    out = pol(obs)
    assert out.shape == (2, 4, 2) and np.isfinite(out).all()
    import torch

    with torch.no_grad():  # the same sampler, unnormalised by hand
        from reproduction.recap.policy.flow import euler_sample

        cache = model.prefix_cache(*model.encode_prefix(batch))
        x = euler_sample(lambda x, t: model.velocity(cache, x, t), pol.noise(pol._state(obs)), 2).numpy()[..., :2]
    want = (x.astype(np.float64) + 1) / 2 * (np.array([10.0, 8.0]) + 1e-6) + np.array([0.0, -4.0])
    assert np.allclose(out, want, atol=1e-4)
    assert Normalizer(stats).norm == "quantile"


def test_a_setup_written_before_the_new_fields_resumes_at_their_defaults(tmp_path):
    """policy_setup.json of a run recorded before discrete_state_input/norm/norm_stats existed: resuming with them
    at their defaults is no change; another value is named."""
    import copy
    import json

    from reproduction.errors import CheckpointError
    from reproduction.recap.policy.config import SETUP_NAME
    from reproduction.recap.policy.setup import _refuse_changed

    new = {
        "model_config": {"preset": "tiny"},
        "stats": {},
        "tasks": [],
        "fingerprints": {},
        "arrays_sha256": "x",
        "stage": {"mode": "bc", "chunk": 4, "discrete_state_input": False, "norm": None, "norm_stats": None},
    }
    new["stage"]["train"] = {}
    old = copy.deepcopy(new)
    for key in ("discrete_state_input", "norm", "norm_stats"):
        del old["stage"][key]
    (tmp_path / SETUP_NAME).write_text(json.dumps(old))
    _refuse_changed(tmp_path, new, tmp_path / "tok")
    new["stage"]["norm"] = "quantile"
    with pytest.raises(CheckpointError, match="norm None -> 'quantile'"):
        _refuse_changed(tmp_path, new, tmp_path / "tok")


def _openpi_augment(image, key):
    """openpi 0.1.1 preprocess_observation_pytorch's train branch for one camera, verbatim but for the loop around it
    (models_pytorch/preprocessing_pytorch.py; image (B, H, W, C) in [-1, 1], already at its resolution)."""
    image = image / 2.0 + 0.5
    if "wrist" not in key:
        height, width = image.shape[1:3]
        crop_height = int(height * 0.95)
        crop_width = int(width * 0.95)
        max_h = height - crop_height
        max_w = width - crop_width
        if max_h > 0 and max_w > 0:
            start_h = torch.randint(0, max_h + 1, (1,), device=image.device)
            start_w = torch.randint(0, max_w + 1, (1,), device=image.device)
            image = image[:, start_h : start_h + crop_height, start_w : start_w + crop_width, :]
        image = torch.nn.functional.interpolate(
            image.permute(0, 3, 1, 2), size=(height, width), mode="bilinear", align_corners=False
        ).permute(0, 2, 3, 1)
        angle = torch.rand(1, device=image.device) * 10 - 5
        if torch.abs(angle) > 0.1:
            angle_rad = angle * torch.pi / 180.0
            cos_a = torch.cos(angle_rad)
            sin_a = torch.sin(angle_rad)
            grid_x = torch.linspace(-1, 1, width, device=image.device)
            grid_y = torch.linspace(-1, 1, height, device=image.device)
            grid_y, grid_x = torch.meshgrid(grid_y, grid_x, indexing="ij")
            grid_x = grid_x.unsqueeze(0).expand(image.shape[0], -1, -1)
            grid_y = grid_y.unsqueeze(0).expand(image.shape[0], -1, -1)
            grid_x_rot = grid_x * cos_a - grid_y * sin_a
            grid_y_rot = grid_x * sin_a + grid_y * cos_a
            grid = torch.stack([grid_x_rot, grid_y_rot], dim=-1)
            image = torch.nn.functional.grid_sample(
                image.permute(0, 3, 1, 2), grid, mode="bilinear", padding_mode="zeros", align_corners=False
            ).permute(0, 2, 3, 1)
    brightness_factor = 0.7 + torch.rand(1, device=image.device) * 0.6
    image = image * brightness_factor
    contrast_factor = 0.6 + torch.rand(1, device=image.device) * 0.8
    mean = image.mean(dim=[1, 2, 3], keepdim=True)
    image = (image - mean) * contrast_factor + mean
    saturation_factor = 0.5 + torch.rand(1, device=image.device) * 1.0
    gray = image.mean(dim=-1, keepdim=True)
    image = gray + (image - gray) * saturation_factor
    image = torch.clamp(image, 0, 1)
    return image * 2.0 - 1.0


def test_image_augmentation_draws_and_computes_as_openpis_train_preprocessing():
    """augment.augment_images = openpi's train-time augmentation (the same torch RNG draws, the same pixels), per
    camera in sorted slot order; the input is left as it was."""
    from reproduction.recap.policy.augment import augment_images

    gen = torch.Generator().manual_seed(0)
    images = {
        "left_wrist_0_rgb": torch.rand(3, 3, 40, 40, generator=gen) * 2 - 1,
        "base_0_rgb": torch.rand(3, 3, 40, 40, generator=gen) * 2 - 1,
    }
    before = {k: v.clone() for k, v in images.items()}
    for seed in range(4):
        torch.manual_seed(seed)
        got = augment_images(images)
        torch.manual_seed(seed)
        for slot in sorted(images):
            want = _openpi_augment(images[slot].permute(0, 2, 3, 1), slot).permute(0, 3, 1, 2)
            assert torch.allclose(got[slot], want, atol=1e-6), (seed, slot)
        assert not torch.equal(got["base_0_rgb"], images["base_0_rgb"])
    assert all(torch.equal(images[k], before[k]) for k in images)


def test_the_loss_augments_only_where_the_config_says(monkeypatch):
    """make_policy_task's loss: pi05 augments by default, tiny never unless asked; a camera-free policy never."""
    from types import SimpleNamespace

    from reproduction.recap.policy import task
    from reproduction.recap.policy.config import PolicyConfig

    cams = {"base_0_rgb": "observation.images.image"}
    pi05 = SimpleNamespace(preset="pi05", cameras=("base_0_rgb",))
    tiny_cam = SimpleNamespace(preset="tiny", cameras=("base_0_rgb",))
    assert task._loss(PolicyConfig(preset="pi05", cameras=cams), pi05).keywords == {"image_augment": True}
    assert task._loss(PolicyConfig(preset="pi05", cameras=cams, image_augment=False), pi05) is task.policy_loss
    assert task._loss(PolicyConfig(cameras=cams), tiny_cam) is task.policy_loss
    assert task._loss(PolicyConfig(cameras=cams, image_augment=True), tiny_cam).keywords == {"image_augment": True}
    assert task._loss(PolicyConfig(image_augment=True), SimpleNamespace(preset="tiny", cameras=())) is task.policy_loss
    seen = []

    def model(batch, x_t, t):
        seen.append(batch["images"]["base_0_rgb"])
        return torch.zeros_like(x_t)

    image = torch.zeros(2, 3, 20, 20)
    batch = {
        "actions": torch.zeros(2, 4, 3),
        "images": {"base_0_rgb": image},
        "kind": torch.zeros(2, dtype=torch.long),
        "label": torch.ones(2, dtype=torch.bool),
    }
    torch.manual_seed(0)
    task.policy_loss(model, batch, image_augment=True)
    assert seen[-1] is not image and batch["images"]["base_0_rgb"] is image
    task.policy_loss(model, batch)
    assert seen[-1] is image


def test_make_policy_task_trains_pi05_on_the_openpi_prompt_quantiles_and_augmented_images(tmp_path, monkeypatch):
    """Stage 4's task of a pi05 setup (the model config swapped for test widths): the collator's prompts are openpi's
    task-only ones, the samples' actions quantile-normalised, the loss augments the camera."""
    import json

    import numpy as np

    from reproduction.recap.policy.config import SETUP_NAME, PolicyConfig
    from reproduction.recap.policy.data import PolicySource, open_policy_input
    from reproduction.recap.policy.setup import prepare_policy_setup
    from reproduction.recap.policy.task import make_policy_task
    from reproduction.recap.tokenizer import load_tokenizer
    from reproduction.train.config import TrainConfig
    from tests.policy_synth import CAMERA, TASK, write_policy_dataset

    ds = write_policy_dataset(tmp_path / "cams", episodes=2, length=6, camera=True)
    inp = [open_policy_input(PolicySource(path=str(ds), type="sft"), need_labels=False)]
    train = TrainConfig(max_steps=1, global_batch=2, micro_batch=2, launcher="inprocess")
    cfg = PolicyConfig(preset="pi05", cameras={"base_0_rgb": CAMERA}, chunk=4, execute_steps=2)
    out = tmp_path / "p"
    setup = prepare_policy_setup(inp, cfg, out, mode="bc", train=train, resume=False)
    tok = load_tokenizer(out / "tokenizer")
    small = pi05_config(
        state_dim=8, action_dim=4, chunk=4, cameras=("base_0_rgb",), reduced={**REDUCED, "vocab_size": len(tok)}
    )
    setup["model_config"] = small.to_dict()
    (out / SETUP_NAME).write_text(json.dumps(setup))
    task = make_policy_task(0, 1, setup_path=str(out / SETUP_NAME))
    assert task.collate.prompt == "pi05" and task.loss.keywords == {"image_augment": True}
    samples = [task.train_dataset[i] for i in range(2)]
    st = setup["stats"]
    q01, q99 = np.asarray(st["action_q01"]), np.asarray(st["action_q99"])
    raw = inp[0].action[:4]
    assert np.allclose(samples[0]["actions"], (raw - q01) / (q99 - q01 + 1e-6) * 2 - 1, atol=1e-5)
    batch = task.collate(samples)
    assert batch["input_ids"][0][batch["attention_mask"][0]].tolist() == _openpi_tokenize(tok, TASK)
    torch.manual_seed(0)
    loss, _ = task.loss(task.model, batch)
    assert torch.isfinite(loss)


def test_a_pi05_setup_written_before_openpis_prompt_does_not_resume(tmp_path):
    """Its checkpoints read the clipped state text, which no field reproduces: resuming it is refused by name."""
    import json

    from reproduction.errors import CheckpointError
    from reproduction.recap.policy.config import SETUP_NAME
    from reproduction.recap.policy.setup import _refuse_changed

    stage = {"mode": "bc", "chunk": 4, "train": {}}
    new = {"model_config": {"preset": "pi05"}, "stats": {}, "tasks": [], "fingerprints": {}, "arrays_sha256": "x"}
    (tmp_path / SETUP_NAME).write_text(json.dumps({**new, "stage": stage}))
    new["stage"] = {**stage, "discrete_state_input": False, "norm": None, "norm_stats": None, "image_augment": None}
    with pytest.raises(CheckpointError, match="pi05 prompt: the checkpoints were trained on the state text"):
        _refuse_changed(tmp_path, new, tmp_path / "tok")
