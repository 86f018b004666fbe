"""The `pi05` preset: lerobot's PI05Pytorch architecture and state_dict keys (lerobot/pi05_base, openpi's PyTorch port).

    paligemma_with_expert.paligemma          PaliGemmaForConditionalGeneration: SigLIP so400m/14 @224
                                             (`model.vision_tower`), `model.multi_modal_projector.linear`,
                                             Gemma 2B (`model.language_model`, 18 x 2048, 8 heads / 1 KV head
                                             of 256), `lm_head` (tied to the token embedding)
    paligemma_with_expert.gemma_expert       GemmaForCausalLM, ~300M: 18 x 1024, mlp 4096, no token
                                             embedding; every RMSNorm is adaRMS (`...layernorm.dense`,
                                             `model.norm.dense`: Linear(1024 -> 3 x 1024), the flow time),
                                             plus its (unused) `lm_head`
    action_in_proj, action_out_proj          Linear(32 <-> 1024) (actions padded to max_action_dim 32)
    time_mlp_in, time_mlp_out                Linear(1024 -> 1024)

A checkpoint saved by lerobot's PI05Policy prefixes every key with `model.`; openpi's PyTorch
checkpoints do not; `load_pi05_state_dict` accepts both, fills a tied `lm_head` left out by
deduplicating savers, and loads strictly (every key of the architecture, nothing else).

Forward: prefix = [SigLIP tokens per camera] + [prompt tokens x sqrt(2048)], where the prompt is openpi's
(PROMPTS): the task alone (upstream's pi05_libero: the policy never sees the state) or, with discrete_state_input,
"Task: {task}, State: {256-bin state};\\nAction: " (state as discretised text). Suffix =
action_in_proj(x_t) (H tokens), with the time as adaRMS condition. pi0.5's attention masks never
let a prefix token see the suffix, so the joint layer-by-layer pass equals a prefix pass that keeps
each layer's rotated K/V followed by an expert pass attending to [prefix K/V; suffix K/V] with its
own weights: the same numbers, and sampling reuses the prefix K/V for every Euler step.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from reproduction.errors import CheckpointError
from reproduction.recap.policy.model import AdaRMSNorm, PolicyModelConfig, sinusoidal_time

VOCAB = 257_152
GEMMA_2B = dict(width=2048, depth=18, mlp_dim=16_384, num_heads=8, num_kv_heads=1, head_dim=256)
GEMMA_300M = dict(width=1024, depth=18, mlp_dim=4096, num_heads=8, num_kv_heads=1, head_dim=256)
SIGLIP_SO400M = dict(
    hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16, patch_size=14
)
MAX_ACTION_DIM = 32
CHUNK = 50


def pi05_config(
    *,
    state_dim: int,
    action_dim: int = 4,
    chunk: int = CHUNK,
    cameras: tuple[str, ...] = ("base_0_rgb",),
    reduced: dict[str, Any] | None = None,
) -> PolicyModelConfig:
    """pi0.5's sizes (lerobot PI05Config defaults); `reduced` overrides widths for CPU tests
    (keys: vlm, expert (Gemma dicts), vision (SigLIP dict), image_size, vocab_size)."""
    r = reduced or {}
    vlm, expert = {**GEMMA_2B, **r.get("vlm", {})}, {**GEMMA_300M, **r.get("expert", {})}
    vision = {**SIGLIP_SO400M, **r.get("vision", {}), "image_size": int(r.get("image_size", 224))}
    return PolicyModelConfig(
        preset="pi05",
        vision=vision,
        text={**vlm, "vocab_size": int(r.get("vocab_size", VOCAB))},
        cameras=cameras,
        state_dim=state_dim,
        action_dim=max(action_dim, int(r.get("max_action_dim", MAX_ACTION_DIM))),
        chunk=chunk,
        expert_width=expert["width"],
        expert_layers=expert["depth"],
        expert_heads=expert["num_heads"],
        expert_mlp=expert["mlp_dim"],
        expert_kv_heads=expert["num_kv_heads"],
        expert_head_dim=expert["head_dim"],
    )


class PaliGemmaWithExpert(nn.Module):
    """`paligemma` + `gemma_expert` with lerobot's configuration (module docstring)."""

    def __init__(self, config: PolicyModelConfig) -> None:
        super().__init__()
        from transformers import GemmaConfig, PaliGemmaConfig, PaliGemmaForConditionalGeneration
        from transformers.models.gemma.modeling_gemma import GemmaForCausalLM

        vlm, vis = config.text, config.vision or {}
        vocab = int(vlm["vocab_size"])
        text_cfg = dict(
            hidden_size=vlm["width"],
            intermediate_size=vlm["mlp_dim"],
            num_attention_heads=vlm["num_heads"],
            head_dim=vlm["head_dim"],
            num_hidden_layers=vlm["depth"],
            num_key_value_heads=vlm["num_kv_heads"],
            hidden_activation="gelu_pytorch_tanh",
            vocab_size=vocab,
            model_type="gemma",
        )
        vision_cfg = dict(
            hidden_size=vis["hidden_size"],
            intermediate_size=vis["intermediate_size"],
            num_hidden_layers=vis["num_hidden_layers"],
            num_attention_heads=vis["num_attention_heads"],
            patch_size=vis["patch_size"],
            image_size=vis["image_size"],
            projection_dim=vlm["width"],
            vision_use_head=False,
            model_type="siglip_vision_model",
        )
        pcfg = PaliGemmaConfig(
            text_config=text_cfg, vision_config=vision_cfg, image_token_index=vocab, projection_dim=vlm["width"]
        )
        pcfg.text_config._attn_implementation = "eager"
        pcfg.vision_config._attn_implementation = "sdpa"
        self.paligemma = PaliGemmaForConditionalGeneration(pcfg)
        ecfg = GemmaConfig(
            head_dim=config.expert_head_dim,
            hidden_size=config.expert_width,
            intermediate_size=config.expert_mlp,
            num_attention_heads=config.expert_heads,
            num_hidden_layers=config.expert_layers,
            num_key_value_heads=config.expert_kv_heads,
            vocab_size=vocab,
            hidden_activation="gelu_pytorch_tanh",
            tie_word_embeddings=False,
        )
        ecfg._attn_implementation = "eager"
        self.gemma_expert = GemmaForCausalLM(ecfg)
        self.gemma_expert.model.embed_tokens = None
        width = config.expert_width
        for layer in self.gemma_expert.model.layers:  # adaRMS in place of RMSNorm (openpi's use_adarms)
            layer.input_layernorm = AdaRMSNorm(width, width)
            layer.post_attention_layernorm = AdaRMSNorm(width, width)
        self.gemma_expert.model.norm = AdaRMSNorm(width, width)

    @property
    def language(self) -> nn.Module:
        return self.paligemma.model.language_model

    def embed_image(self, pixels: torch.Tensor) -> torch.Tensor:
        out = self.paligemma.model.get_image_features(pixels)
        return out.pooler_output if hasattr(out, "pooler_output") else out


def _attend(layer: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Eager GQA attention (as lerobot's compute_layer_complete): (B, Hq, Lq, d) -> (B, Lq, Hq*d)."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = torch.matmul(q, k.transpose(2, 3)) * layer.self_attn.scaling + bias
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    out = torch.matmul(probs, v).transpose(1, 2)
    return out.reshape(out.shape[0], out.shape[1], -1)


def _qkv(layer: nn.Module, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    shape = (*h.shape[:-1], -1, layer.self_attn.head_dim)
    return tuple(
        p(h).view(shape).transpose(1, 2)
        for p in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj)
    )


class Pi05Cache:
    """Per-layer rotated prefix K/V, the prefix validity and each row's next position."""

    def __init__(self, kv: list[tuple[torch.Tensor, torch.Tensor]], valid: torch.Tensor) -> None:
        self.kv, self.valid = kv, valid


class Pi05Policy(nn.Module):
    """pi0.5 with lerobot's parameter names; same interface as TinyPolicy (encode_prefix, prefix_cache, velocity)."""

    def __init__(self, config: PolicyModelConfig) -> None:
        super().__init__()
        self.config = config
        self.paligemma_with_expert = PaliGemmaWithExpert(config)
        width = config.expert_width
        self.action_in_proj = nn.Linear(config.action_dim, width)
        self.action_out_proj = nn.Linear(width, config.action_dim)
        self.time_mlp_in = nn.Linear(width, width)
        self.time_mlp_out = nn.Linear(width, width)
        if self.action_in_proj.weight.device.type != "meta":
            for module in self.modules():
                if isinstance(module, AdaRMSNorm):
                    module.reset_parameters()

    def fsdp_units(self) -> list[nn.Module]:
        pg = self.paligemma_with_expert
        return (
            list(pg.paligemma.model.vision_tower.encoder.layers)
            + list(pg.language.layers)
            + list(pg.gemma_expert.model.layers)
        )

    def encode_prefix(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Prefix embeddings (B, L, D), validity (B, L) and the row -> prefix index: the batch's `prefix_index` (its
        images and prompts one per distinct prefix: GRPO's update) or None (one row per sample)."""
        pg = self.paligemma_with_expert
        embs, valid = [], []
        for slot in self.config.cameras:
            img = pg.embed_image(batch["images"][slot])
            embs.append(img)
            valid.append(batch["image_masks"][slot][:, None].expand(img.shape[0], img.shape[1]))
        text = pg.language.embed_tokens(batch["input_ids"])
        embs.append(text * math.sqrt(text.shape[-1]))
        valid.append(batch["attention_mask"].to(torch.bool))
        return torch.cat(embs, dim=1), torch.cat(valid, dim=1), batch.get("prefix_index")

    def prefix_cache(
        self, embeds: torch.Tensor, valid: torch.Tensor, index: torch.Tensor | None = None, state: Any = None
    ) -> Pi05Cache:
        """Runs the Gemma 2B layers over the prefix (bidirectional over valid tokens), keeping rotated K/V: once per
        prefix, then gathered per row by `index` (None: one row per prefix)."""
        from transformers.models.gemma.modeling_gemma import apply_rotary_pos_emb

        lm = self.paligemma_with_expert.language
        pos = torch.cumsum(valid.long(), dim=1) - 1
        bias = _bias(valid[:, None, :].expand(-1, valid.shape[1], -1), embeds.dtype)
        cos, sin = lm.rotary_emb(embeds, pos)
        x, kv = embeds, []
        for layer in lm.layers:
            h = layer.input_layernorm(x)
            q, k, v = _qkv(layer, h)
            q, k = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)
            kv.append((k, v))
            x = x + layer.self_attn.o_proj(_attend(layer, q, k, v, bias))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        if index is not None:  # index_select: its backward is a scatter-add over the rows sharing a prefix
            kv = [(k.index_select(0, index), v.index_select(0, index)) for k, v in kv]
            valid = valid.index_select(0, index)
        return Pi05Cache(kv, valid)

    def velocity(self, cache: Pi05Cache, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        from transformers.models.gemma.modeling_gemma import apply_rotary_pos_emb

        expert = self.paligemma_with_expert.gemma_expert.model
        width = self.config.expert_width
        emb = sinusoidal_time(t, width, self.config.min_period, self.config.max_period).to(x_t.dtype)
        cond = F.silu(self.time_mlp_out(F.silu(self.time_mlp_in(emb))))
        x = self.action_in_proj(x_t)
        b, h = x.shape[:2]
        pos = cache.valid.long().sum(dim=1, keepdim=True) + torch.arange(h, device=x.device)[None, :]
        keys = torch.cat([cache.valid, cache.valid.new_ones(b, h)], dim=1)
        bias = _bias(keys[:, None, :].expand(-1, h, -1), x.dtype)
        cos, sin = self.paligemma_with_expert.language.rotary_emb(x, pos)
        for layer, (pk, pv) in zip(expert.layers, cache.kv):
            hn, gate = layer.input_layernorm(x, cond)
            q, k, v = _qkv(layer, hn)
            q, k = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)
            att = _attend(layer, q, torch.cat([pk, k], dim=2), torch.cat([pv, v], dim=2), bias)
            x = x + gate * layer.self_attn.o_proj(att)
            hn, gate = layer.post_attention_layernorm(x, cond)
            x = x + gate * layer.mlp(hn)
        out, _ = expert.norm(x, cond)
        return self.action_out_proj(out).float()

    def forward(self, batch: dict[str, Any], x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.velocity(self.prefix_cache(*self.encode_prefix(batch)), x_t, t)


def _bias(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, Lq, Lk) bool -> (B, 1, Lq, Lk) additive mask (openpi's -2.38e38 is finfo.min here)."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, torch.finfo(dtype).min)[
        :, None
    ]


PROMPTS = ("pi05", "pi05_state", "pi05_state_clipped")
"""pi0.5 prompt styles. `pi05`: openpi's tokenizer without a state (upstream's pi05_libero, discrete_state_input
False): the cleaned task encoded with <bos>, then "\\n" encoded alone. `pi05_state`: openpi's with the state
(discrete_state_input True): "Task: {task}, State: {256-bin state};\\nAction: " with <bos>. `pi05_state_clipped`: what
this project wrote before the field existed (the state clipped to [-1, 1] before binning): exports without a
`prompt` key in policy.json."""


def prompt_style(preset: str, discrete_state_input: bool) -> str | None:
    """The prompt style of a newly trained policy: None for tiny (the value model's `Task: ...` template)."""
    if preset != "pi05":
        return None
    return "pi05_state" if discrete_state_input else "pi05"


def export_prompt_style(meta: dict[str, Any]) -> str | None:
    """The prompt style an export was trained with: its policy.json's `prompt`, or for a pi05 export written before
    the key existed the state text it then used (`pi05_state_clipped`); None for tiny."""
    if meta.get("preset") != "pi05":
        return None
    return str(meta.get("prompt", "pi05_state_clipped"))


def discretize_state(state: np.ndarray, bins: int = 256, *, clip: bool = False) -> list[str]:
    """pi0.5's state text, as openpi's PaligemmaTokenizer bins it: np.digitize(state, linspace(-1, 1, bins + 1)[:-1])
    - 1, space-separated per row; no clip, so a value below -1 is bin -1 and one above 1 bin bins - 1. `clip=True`:
    clipped to [-1, 1] first (pi05_state_clipped, exports written before openpi's binning was matched)."""
    edges = np.linspace(-1.0, 1.0, bins + 1)[:-1]
    ids = np.digitize(np.clip(state, -1.0, 1.0) if clip else state, edges) - 1
    return [" ".join(str(int(i)) for i in row) for row in np.atleast_2d(ids)]


def clean_task(task: str) -> str:
    """openpi's cleaning of the prompt (the advantage text is part of `task`): strip, "_" and newlines -> spaces."""
    return task.strip().replace("_", " ").replace("\n", " ")


def pi05_prompt(task: str, state_text: str) -> str:
    """openpi's pi0.5 prompt with the state as text (discrete_state_input True)."""
    return f"Task: {clean_task(task)}, State: {state_text};\nAction: "


def pi05_token_ids(tokenizer: Any, texts: list[str], *, max_len: int) -> list[list[int]]:
    """openpi's PaligemmaTokenizer without a state: each cleaned text encoded with <bos>, then "\\n" encoded alone
    (its "start of answer" token), concatenated, cut to `max_len`."""
    newline = tokenizer("\n", add_special_tokens=False)["input_ids"]
    enc = tokenizer(texts, add_special_tokens=True)["input_ids"]
    return [(list(ids) + list(newline))[:max_len] for ids in enc]


_VISION_LEROBOT = "paligemma_with_expert.paligemma.model.vision_tower.vision_model."
_VISION_HERE = "paligemma_with_expert.paligemma.model.vision_tower."


def map_pi05_keys(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """lerobot PI05Policy keys (`model.` prefix) or openpi PyTorch keys -> this module's keys.

    Also `action_time_mlp_*` -> `time_mlp_*` (lerobot's own fix-up) and transformers 4.x's
    `vision_tower.vision_model.*` -> transformers 5's flattened `vision_tower.*`."""
    out = {}
    for key, value in state_dict.items():
        new = key[len("model.") :] if key.startswith("model.") else key
        for old, repl in (("action_time_mlp_in.", "time_mlp_in."), ("action_time_mlp_out.", "time_mlp_out.")):
            if new.startswith(old):
                new = repl + new[len(old) :]
        if new.startswith(_VISION_LEROBOT):
            new = _VISION_HERE + new[len(_VISION_LEROBOT) :]
        out[new] = value
    return out


def lerobot_state_dict(model: nn.Module, *, prefix: str = "model.") -> dict[str, torch.Tensor]:
    """This model's weights under lerobot PI05Policy's key names (what `save_pretrained` writes),
    with the tied lm_head left out as deduplicating savers do."""
    out = {}
    for key, value in model.state_dict().items():
        if key == TIED[0]:
            continue
        if key.startswith(_VISION_HERE):
            key = _VISION_LEROBOT + key[len(_VISION_HERE) :]
        out[prefix + key] = value
    return out


TIED = (
    "paligemma_with_expert.paligemma.lm_head.weight",
    "paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight",
)


def load_pi05_state_dict(model: nn.Module, state_dict: dict[str, torch.Tensor], *, source: str | Path = "") -> None:
    """Strictly load a pi0.5 checkpoint (either key spelling) into a `pi05` model.

    A saver that deduplicated the tied lm_head / token embedding keeps one of the two: the other is
    filled from it. Any other missing or unexpected key raises CheckpointError (exit 50) naming
    them; a checkpoint of another architecture (no `paligemma_with_expert.` keys) says so.
    """
    from reproduction.recap.value.weights import check_state_keys

    mapped = map_pi05_keys(state_dict)
    if not any(k.startswith("paligemma_with_expert.") for k in mapped):
        raise CheckpointError(
            f"{source}: not a pi0.5 checkpoint (no paligemma_with_expert.* keys; e.g. {next(iter(mapped), None)!r})",
            path=str(source),
            hint="the pi05 preset loads lerobot PI05Policy / openpi PyTorch checkpoints; use the tiny preset's "
            "export for tiny",
        )
    a, b = TIED
    if a in mapped and b not in mapped:
        mapped[b] = mapped[a]
    elif b in mapped and a not in mapped:
        mapped[a] = mapped[b]
    check_state_keys(model, mapped, source=str(source))
    model.load_state_dict(mapped, strict=True)
