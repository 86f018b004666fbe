"""The value model: shapes, bidirectional prefix, no compute on absent cameras, presets, strict loading."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from reproduction.errors import CheckpointError, ConfigError, IntegrityError
from reproduction.recap.value.model import ValueModelConfig, build_value_model, prefix_attention_masks, preset_config
from reproduction.recap.value.weights import load_pretrained, load_safetensors_strict, load_state_strict

CAMS = ("base_0_rgb", "left_wrist_0_rgb")


def _model(seed: int = 0):
    return build_value_model(preset_config("tiny", vocab_size=300, cameras=CAMS), seed=seed).eval()


def _batch(b: int = 4, t: int = 7, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    images = {c: torch.rand(b, 3, 64, 64, generator=gen) * 2 - 1 for c in CAMS}
    masks = {
        "base_0_rgb": torch.ones(b, dtype=torch.bool),
        "left_wrist_0_rgb": torch.tensor([True, False, False, True])[:b],
    }
    ids = torch.randint(4, 300, (b, t), generator=gen)
    att = torch.ones(b, t, dtype=torch.bool)
    att[1, 5:] = False
    return dict(images=images, image_masks=masks, input_ids=ids, attention_mask=att)


def test_tiny_forward_shapes_and_expected_value_range():
    model = _model()
    logits = model(**_batch())
    assert logits.shape == (4, 201)
    v = model.expected_value(logits)
    assert v.shape == (4,) and bool(((v >= -1) & (v <= 0)).all())
    assert model.atoms[0] == -1.0 and model.atoms[-1] == 0.0 and model.atoms[1] - model.atoms[0] == pytest.approx(0.005)


def test_attention_mask_is_bidirectional_over_the_prefix_and_hides_the_query():
    valid = torch.tensor([[True, True, False, True, True]])  # 4th position padding-free; 3rd is padding
    pos = (valid.long().cumsum(1) - 1).clamp(min=0)
    full = prefix_attention_masks(valid, pos, None, torch.float32)["full_attention"][0, 0]
    allowed = full == 0
    assert allowed[0, 1] and allowed[0, 3]  # an early token sees later ones (not causal)
    assert not allowed[:, 2].any()  # nobody attends to padding
    assert not allowed[:4, 4].any() and allowed[4, 4] and allowed[4, [0, 1, 3]].all()  # query: sees all, seen by none
    near = prefix_attention_masks(valid, pos, 2, torch.float32)["sliding_attention"][0, 0] == 0
    assert near[0, 1] and not near[0, 3]  # positions 0 and 2 are 2 apart: outside a window of 2


def test_early_prefix_states_depend_on_later_text_tokens():
    model = _model()
    seen = {}
    model.language.register_forward_hook(
        lambda m, a, kw, out: seen.__setitem__("h", out.last_hidden_state), with_kwargs=True
    )
    batch = _batch()
    model(**batch)
    first = seen["h"][:, 0].clone()
    batch["input_ids"][:, 3] = 7  # change one text token after all image tokens
    model(**batch)
    assert (seen["h"][:, 0] - first).abs().max() > 1e-4  # the first image token saw it: bidirectional


def test_padding_and_absent_camera_pixels_do_not_change_the_value_and_are_not_encoded():
    model = _model()
    sizes = []
    model.vision.register_forward_hook(
        lambda m, a, kw, out: sizes.append(kw["pixel_values"].shape[0]), with_kwargs=True
    )
    batch = _batch()
    ref = model(**batch)
    batch["input_ids"][1, 5:] = 99  # padded positions of row 1
    batch["images"]["left_wrist_0_rgb"][1:3] = 5.0  # absent camera of rows 1 and 2
    assert torch.equal(model(**batch), ref)
    assert sizes == [6, 6]  # 4 base + 2 present wrist images, one SigLIP call per forward
    batch["image_masks"]["left_wrist_0_rgb"][:] = False
    model(**batch)
    assert sizes[-1] == 4
    batch["image_masks"]["base_0_rgb"][:] = False  # no camera at all: one blank image keeps FSDP ranks in step
    logits = model(**batch)
    assert sizes[-1] == 1 and logits.shape == (4, 201) and torch.isfinite(logits).all()


def test_text_embeddings_are_scaled_once_by_sqrt_width():
    model = _model()
    seen = {}
    model.language.register_forward_pre_hook(
        lambda m, a, kw: seen.__setitem__("e", kw["inputs_embeds"]), with_kwargs=True
    )
    batch = _batch()
    model(**batch)
    n_img = 2 * model.tokens_per_image
    raw = model.language.embed_tokens.weight[batch["input_ids"][0]]
    torch.testing.assert_close(seen["e"][0, n_img : n_img + 7], raw * math.sqrt(64))


def test_config_round_trip_and_bad_fields():
    cfg = preset_config("tiny", vocab_size=300, cameras=CAMS)
    assert ValueModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    with pytest.raises(ConfigError, match="unknown preset 'huge'"):
        preset_config("huge")
    with pytest.raises(ConfigError, match="unknown fields \\['bins'\\]"):
        ValueModelConfig.from_dict({**cfg.to_dict(), "bins": 3})
    with pytest.raises(ConfigError, match="v_min=0.0 must be below v_max=0.0"):
        ValueModelConfig(vision=cfg.vision, text=cfg.text, v_min=0.0)


def _siglip_vision_params(d=1152, mlp=4304, layers=27, patch=14, image=224):
    per_layer = 4 * (d * d + d) + 2 * 2 * d + (d * mlp + mlp) + (mlp * d + d)
    return 3 * patch * patch * d + d + (image // patch) ** 2 * d + layers * per_layer + 2 * d


def _gemma3_text_params(v=262_144, d=640, heads=4, kv=1, hd=256, mlp=2048, layers=18):
    per_layer = d * heads * hd * 2 + d * kv * hd * 2 + 2 * hd + 3 * d * mlp + 4 * d
    return v * d + layers * per_layer + d


def test_recap_preset_builds_on_meta_with_upstream_sizes():
    model = build_value_model(preset_config("recap"), device="meta")
    counts = {"vision": 0, "language": 0, "projector": 0, "value_head": 0}
    for name, p in model.named_parameters():
        assert p.device.type == "meta"
        counts[name.split(".")[0]] += p.numel()
    assert counts["language"] == _gemma3_text_params() == 268_098_176  # Gemma3-270M, no lm_head
    assert counts["vision"] == _siglip_vision_params() == 412_442_352  # so400m/14 tower without its pooling head
    assert counts["projector"] == 1152 * 640 + 640 and counts["value_head"] == 640 + 640 * 201 + 201
    assert model.tokens_per_image == 256


def test_recap_preset_forward_with_random_weights_two_cameras_at_224():
    """The recap architecture at its real widths (only depth and vocab cut): 2 cameras x 256 patches
    + a 3-prompt batch through one Gemma3 pass; logits come from the query's state via the value head."""
    cfg = preset_config("recap", vocab_size=1000, cameras=CAMS)
    cfg.vision["num_hidden_layers"], cfg.text["num_hidden_layers"] = 1, 2
    full = preset_config("recap", cameras=CAMS)
    for part in ("vision", "text"):  # every other size is the preset's
        assert {k: v for k, v in getattr(cfg, part).items() if k not in ("num_hidden_layers", "vocab_size")} == {
            k: v for k, v in getattr(full, part).items() if k not in ("num_hidden_layers", "vocab_size")
        }
    model = build_value_model(cfg, seed=0).eval()
    assert model.tokens_per_image == 256 and model.config.image_size == 224
    assert (model.projector.in_features, model.projector.out_features, model.language.config.head_dim) == (
        1152,
        640,
        256,
    )
    gen = torch.Generator().manual_seed(0)
    images = {c: torch.rand(3, 3, 224, 224, generator=gen) * 2 - 1 for c in CAMS}
    masks = {c: torch.ones(3, dtype=torch.bool) for c in CAMS}
    ids = torch.randint(3, 1000, (3, 9), generator=gen)
    ids[:, 0] = 2  # Gemma3's <bos>
    att = torch.ones(3, 9, dtype=torch.bool)
    att[2, 6:] = False  # prompts padded to the longest
    seen = {}
    model.language.register_forward_pre_hook(
        lambda m, a, kw: seen.__setitem__("embeds", kw["inputs_embeds"]), with_kwargs=True
    )
    model.value_head.register_forward_hook(lambda m, a, out: seen.__setitem__("head", (a[0], out)))
    with torch.no_grad():
        logits = model(images=images, image_masks=masks, input_ids=ids, attention_mask=att)
    assert logits.shape == (3, 201) and bool(torch.isfinite(logits).all())
    assert seen["embeds"].shape == (3, 2 * 256 + 9 + 1, 640)  # cameras, prompt, value query
    torch.testing.assert_close(seen["embeds"][:, -1], model.value_head.query.expand(3, -1))
    state, out = seen["head"]
    assert state.shape == (3, 640) and torch.equal(out, logits)
    torch.testing.assert_close(logits, model.value_head.proj(state))
    v = model.expected_value(logits)
    assert bool(((v >= -1) & (v <= 0)).all()) and float(logits.std()) > 0


def test_strict_load_names_missing_unexpected_and_misshaped_keys(tmp_path):
    model = _model()
    state = dict(model.state_dict())
    state.pop("value_head.proj.weight")
    state["value_head.extra"] = torch.zeros(1)
    state["projector.bias"] = torch.zeros(3)
    before = model.projector.weight.clone()
    with pytest.raises(CheckpointError) as err:
        load_state_strict(model, {**state, "projector.weight": torch.ones_like(before)}, source="ckpt.safetensors")
    msg = str(err.value)
    assert "ckpt.safetensors" in msg and "missing keys: value_head.proj.weight" in msg
    assert "unexpected keys: value_head.extra" in msg and "projector.bias (3,) != (64,)" in msg
    assert torch.equal(model.projector.weight, before)  # nothing loaded on failure
    assert err.value.exit_code == 50


def test_safetensors_round_trip_is_exact(tmp_path):
    from safetensors.torch import save_file

    src, dst = _model(seed=1), _model(seed=2)
    save_file({k: v.contiguous() for k, v in src.state_dict().items()}, str(tmp_path / "model.safetensors"))
    load_safetensors_strict(dst, tmp_path / "model.safetensors")
    batch = _batch()
    assert torch.equal(src(**batch), dst(**batch))


def _fake_upstream_files(tmp_path: Path, model) -> Path:
    """Write a tiny model's backbones under upstream's key names (SiglipModel / Gemma3ForCausalLM)."""
    from safetensors.torch import save_file

    sd = model.state_dict()
    vision = {"vision_model." + k[len("vision.") :]: v.contiguous() for k, v in sd.items() if k.startswith("vision.")}
    vision["text_model.embeddings.token_embedding.weight"] = torch.zeros(2, 2)
    vision["logit_scale"] = torch.zeros(1)
    lang = {"model." + k[len("language.") :]: v.contiguous() for k, v in sd.items() if k.startswith("language.")}
    (tmp_path / "w" / "siglip").mkdir(parents=True)
    (tmp_path / "w" / "gemma").mkdir(parents=True)
    save_file(vision, str(tmp_path / "w/siglip/model.safetensors"))
    save_file(lang, str(tmp_path / "w/gemma/model.safetensors"))
    manifest = json.loads(Path("weights_manifest/recap_value_siglip2_gemma3_270m.json").read_text())
    manifest["components"][0]["files"][0]["path"] = "siglip/model.safetensors"
    manifest["components"][1]["files"][0]["path"] = "gemma/model.safetensors"
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(manifest))
    return path


def test_pretrained_manifest_maps_upstream_keys_and_refuses_unpinned_and_wrong_digests(tmp_path):
    from reproduction.digests import sha256_file

    src = _model(seed=1)
    manifest_path = _fake_upstream_files(tmp_path, src)
    dst = _model(seed=2)
    with pytest.raises(IntegrityError, match="does not pin its sha256 yet"):
        load_pretrained(dst, manifest_path, tmp_path / "w")
    load_pretrained(dst, manifest_path, tmp_path / "w", allow_unpinned=True)
    assert torch.equal(dst.language.layers[1].mlp.up_proj.weight, src.language.layers[1].mlp.up_proj.weight)
    assert torch.equal(dst.vision.post_layernorm.weight, src.vision.post_layernorm.weight)
    assert not torch.equal(dst.value_head.proj.weight, src.value_head.proj.weight)  # fresh: stays random

    manifest = json.loads(manifest_path.read_text())
    for comp in manifest["components"]:
        entry = comp["files"][0]
        entry["sha256"] = sha256_file(tmp_path / "w" / entry["path"])
    manifest["components"][1]["files"][0]["sha256"] = "0" * 64
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(IntegrityError, match="gemma/model.safetensors: sha256 .* != manifest 0000"):
        load_pretrained(dst, manifest_path, tmp_path / "w")


def test_pretrained_with_a_missing_layer_names_it(tmp_path):
    from safetensors.torch import load_file, save_file

    src = _model(seed=1)
    manifest_path = _fake_upstream_files(tmp_path, src)
    gemma = tmp_path / "w/gemma/model.safetensors"
    state = load_file(str(gemma))
    state.pop("model.layers.1.self_attn.q_proj.weight")
    save_file(state, str(gemma))
    with pytest.raises(CheckpointError, match="missing keys: language.layers.1.self_attn.q_proj.weight"):
        load_pretrained(_model(), manifest_path, tmp_path / "w", allow_unpinned=True)
