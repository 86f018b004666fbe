"""The RECAP value model: SigLIP images + Gemma3 text, bidirectional prefix, a query token, 201 bins.

    (the prefix is recap/prefix.py, shared with the policy)

    images per camera (B,3,S,S) --SigLIP (present cameras only)--> (n_present, N, Dv)
        --Linear(Dv -> Dt)--> image tokens, scattered back into (B, N, Dt) per camera
    prompt ids (B,T), T = the batch's longest prompt --Gemma3 embed (already x sqrt(Dt))--> text tokens
    state (B,S) --(x - mean) / std--> Linear(S -> Dt) --> one state token (only when state_dim > 0)
    prefix = [camera tokens in sorted key order] + [text tokens] + [state token] + [value query]
    Gemma3 text model over the prefix: prefix tokens attend bidirectionally to every valid prefix
    token (never to the query); the query attends to all valid prefix tokens and itself.
    value_head: dropout -> Linear(Dt -> num_bins) on the query's final state;
    atoms z = linspace(v_min, v_max, num_bins); V = sum softmax(logits) * z.

Readout choice: a learned query token (`value_head.query`) rather than a pooled state. Upstream reads
the value from a learned CLS embedding too (through a separate Gemma1 "expert" that re-reads Gemma3's
K/V cache); putting the query into the same Gemma3 pass keeps that behaviour (the readout learns
which tokens matter, e.g. the few image patches that show the object and the goal) at the cost of
one extra token instead of a second transformer. Mean pooling would weight every token equally, so
the value would drift with prompt length and the number of present cameras, and the 256 patch
tokens of a camera would swamp the handful that carry progress. Because the prefix never attends to
the query, prefix states are the same as upstream's stage A and the query lives in `value_head`
(the head's learning-rate group, as upstream's CLS does).

State input (not upstream's: its value model sees images and the prompt only, RECAP.md 2.1). With
`state_dim > 0` the proprioceptive state (and goal) enters as one continuous token, as the policy's
state token does (pi0's `state_proj`), normalised by the training frames' mean/std stored in the
config. Without it, a value model on small images learned each episode's outcome but not its
progress (values flat along an episode), so the N-step advantage was mostly noise. `state_dim = 0`
(the `recap` preset's default) keeps upstream's layout and state_dict keys exactly.

Fixes over upstream (RECAP.md 7 item 14): SigLIP runs only on cameras that are present (a dummy
camera costs nothing), prompts are padded to the batch's longest (not to 200), there is no unused
`lm_head`, and every Gemma3 layer that runs feeds the readout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from reproduction.config_fields import reject_unknown_fields
from reproduction.errors import ConfigError, InvalidInputError
from reproduction.recap.prefix import SiglipGemmaPrefix, prefix_attention_masks, tiny_text, tiny_vision
from reproduction.recap.value.config import PRESETS  # torch-free, so the run config checks it at load

__all__ = ["ValueModel", "ValueModelConfig", "build_value_model", "prefix_attention_masks", "preset_config"]

NUM_BINS = 201
V_MIN = -1.0
V_MAX = 0.0


@dataclass(kw_only=True, slots=True)
class ValueModelConfig:
    """Everything needed to rebuild the value model; stored with every checkpoint and export."""

    preset: str = "tiny"
    """Name of the preset this config came from (`tiny`, `recap`), for humans and logs."""
    vision: dict[str, Any] = field(default_factory=dict)
    """SiglipVisionConfig keyword arguments."""
    text: dict[str, Any] = field(default_factory=dict)
    """Gemma3TextConfig keyword arguments (vocab_size must match the tokenizer)."""
    cameras: tuple[str, ...] = ("base_0_rgb",)
    """Camera slots in the order their tokens enter the prefix (sorted, as upstream)."""
    num_bins: int = NUM_BINS
    """Atoms of the distributional head."""
    v_min: float = V_MIN
    """Lowest atom (value of the worst normalised return)."""
    v_max: float = V_MAX
    """Highest atom (value of a success at its last step)."""
    value_dropout: float = 0.0
    """Dropout before the head's linear layer (upstream default 0)."""
    attn_implementation: str = "sdpa"
    """transformers attention kernel for both towers (`sdpa` or `eager`)."""
    state_dim: int = 0
    """Length of the state vector read by the state token; 0 = no state input (upstream's layout)."""
    state_mean: tuple[float, ...] = ()
    """Per-component mean subtracted from the state (the training frames'); () = zeros."""
    state_std: tuple[float, ...] = ()
    """Per-component std the state is divided by (floored); () = ones."""

    def __post_init__(self) -> None:
        if self.state_dim < 0:
            raise ConfigError(f"value model: state_dim={self.state_dim} must be >= 0", field="state_dim")
        self.state_mean, self.state_std = tuple(map(float, self.state_mean)), tuple(map(float, self.state_std))
        for name in ("state_mean", "state_std"):
            if getattr(self, name) and len(getattr(self, name)) != self.state_dim:
                raise ConfigError(
                    f"value model: {name} has {len(getattr(self, name))} entries, state_dim is {self.state_dim}",
                    field=name,
                )
        bad = [(i, s) for i, s in enumerate(self.state_std) if not s > 0]
        if bad:
            raise ConfigError(
                f"value model: state_std entries must be > 0 (entry {bad[0][0]} is {bad[0][1]})", field="state_std"
            )
        if self.num_bins < 2:
            raise ConfigError(f"value model: num_bins={self.num_bins} must be >= 2", field="num_bins")
        if not self.v_max > self.v_min:
            raise ConfigError(f"value model: v_min={self.v_min} must be below v_max={self.v_max}", field="v_min/v_max")
        self.cameras = tuple(sorted(self.cameras))
        if not self.cameras or len(set(self.cameras)) != len(self.cameras):
            raise ConfigError(
                f"value model: cameras {list(self.cameras)} must be non-empty and distinct", field="cameras"
            )

    @property
    def image_size(self) -> int:
        return int(self.vision.get("image_size", 224))

    @property
    def width(self) -> int:
        return int(self.text["hidden_size"])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields; the state fields only when there is a state input, so a state-less config
        (upstream's layout, the pinned tiny weights' manifests) reads as it did before they existed."""
        out = {
            "preset": self.preset,
            "vision": dict(self.vision),
            "text": dict(self.text),
            "cameras": list(self.cameras),
            "num_bins": self.num_bins,
            "v_min": self.v_min,
            "v_max": self.v_max,
            "value_dropout": self.value_dropout,
            "attn_implementation": self.attn_implementation,
        }
        if self.state_dim:
            out.update(state_dim=self.state_dim, state_mean=list(self.state_mean), state_std=list(self.state_std))
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ValueModelConfig:
        reject_unknown_fields(cls, data, what="value model config")
        kwargs = dict(data)
        for key in ("cameras", "state_mean", "state_std"):
            if key in kwargs:
                kwargs[key] = tuple(kwargs[key])
        return cls(**kwargs)


def preset_config(
    name: str,
    *,
    vocab_size: int | None = None,
    cameras: tuple[str, ...] = ("base_0_rgb",),
    image_size: int | None = None,
    patch_size: int | None = None,
) -> ValueModelConfig:
    """The `tiny` (CPU minutes) or `recap` (SigLIP2-so400m/14 @224 + Gemma3-270M) architecture.

    `tiny` defaults to 64 px images in 16 px patches (16 tokens per camera: a 64 px scene's objects
    still span a patch, and a step costs a third of 8 px patches on CPU); `recap` is 224/14.

    `vocab_size` defaults to Gemma3's 262,144 for `recap`; `tiny` needs the trained tokenizer's size.
    Raises ConfigError for an unknown preset.
    """
    if name == "tiny":
        vision = tiny_vision(image_size=image_size or 64, patch_size=patch_size or 16)
        text = tiny_text(vocab_size=vocab_size or 512)
    elif name == "recap":
        # google/siglip2-so400m-patch14-224 vision tower and google/gemma-3-270m (config.json values).
        vision = dict(
            hidden_size=1152,
            intermediate_size=4304,
            num_hidden_layers=27,
            num_attention_heads=16,
            image_size=image_size or 224,
            patch_size=patch_size or 14,
            vision_use_head=False,
        )
        text = dict(
            hidden_size=640,
            intermediate_size=2048,
            num_hidden_layers=18,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=256,
            vocab_size=vocab_size or 262_144,
            max_position_embeddings=32_768,
            sliding_window=512,
            query_pre_attn_scalar=256,
            pad_token_id=0,
            bos_token_id=2,
            eos_token_id=1,
        )
    else:
        raise ConfigError(f"value model: unknown preset {name!r}", field="preset", hint=f"use one of {list(PRESETS)}")
    return ValueModelConfig(preset=name, vision=vision, text=text, cameras=cameras)


class ValueHead(nn.Module):
    """The learned query embedding and the distributional projection (one lr group, as upstream)."""

    def __init__(self, width: int, num_bins: int, dropout: float) -> None:
        super().__init__()
        self.query = nn.Parameter(torch.zeros(1, width))
        self.dropout = nn.Dropout(dropout)
        self.proj = nn.Linear(width, num_bins)

    def reset_parameters(self) -> None:
        nn.init.normal_(self.query, std=0.02)
        nn.init.normal_(self.proj.weight, std=0.02)
        nn.init.zeros_(self.proj.bias)

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        return self.proj(self.dropout(state))


class ValueModel(SiglipGemmaPrefix):
    """VLM value critic; `forward` returns (B, num_bins) logits. See the module docstring."""

    def __init__(self, config: ValueModelConfig) -> None:
        super().__init__(config.vision, config.text, attn_implementation=config.attn_implementation)
        self.config = config
        self.value_head = ValueHead(self.language.config.hidden_size, config.num_bins, config.value_dropout)
        self.register_buffer("atoms", torch.linspace(config.v_min, config.v_max, config.num_bins), persistent=False)
        if config.state_dim:
            s = config.state_dim
            self.state_proj = nn.Linear(s, self.language.config.hidden_size)
            mean = torch.tensor(config.state_mean or (0.0,) * s, dtype=torch.float32)
            std = torch.tensor(config.state_std or (1.0,) * s, dtype=torch.float32)
            # Not persistent: the config (stored with every export) is their one source.
            self.register_buffer("state_mean", mean, persistent=False)
            self.register_buffer("state_std", std, persistent=False)
        self._init_fresh()

    def _init_fresh(self) -> None:
        # Upstream: the new projection is N(0, 0.02) with zero bias; same for the head.
        if self.projector.weight.device.type == "meta":
            return
        self.init_projector()
        self.value_head.reset_parameters()
        if self.config.state_dim:
            nn.init.normal_(self.state_proj.weight, std=0.02)
            nn.init.zeros_(self.state_proj.bias)

    def forward(
        self,
        *,
        images: dict[str, torch.Tensor],
        image_masks: dict[str, torch.Tensor],
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        state: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits (B, num_bins) for a batch; `input_ids`/`attention_mask` are (B, T) with T the
        batch's longest prompt. Image tensors are (B, 3, S, S) in [-1, 1]; masks are (B,) bool.
        `state` (B, state_dim), raw (normalised here), is required exactly when state_dim > 0."""
        img_tok, img_valid = self.encode_images(images, image_masks, self.config.cameras)
        txt_tok = self.embed_text(input_ids, img_tok.dtype)
        ones = torch.ones_like(attention_mask[:, :1], dtype=torch.bool)
        parts, valid = [img_tok, txt_tok], [img_valid, attention_mask.to(torch.bool)]
        if self.config.state_dim:
            if state is None or state.shape[-1] != self.config.state_dim:
                got = None if state is None else tuple(state.shape)
                raise InvalidInputError(
                    f"value model: expected a state of shape (B, {self.config.state_dim}), got {got}"
                )
            x = (state.float() - self.state_mean) / self.state_std
            parts.append(self.state_proj(x.to(self.state_proj.weight.dtype)).to(img_tok.dtype)[:, None])
            valid.append(ones)
        elif state is not None:
            raise InvalidInputError("value model: got a state input, but the model has none (state_dim = 0)")
        query = self.value_head.query.to(img_tok.dtype).expand(input_ids.shape[0], 1, -1)
        embeds = torch.cat([*parts, query], dim=1)
        valid = torch.cat([*valid, ones], dim=1)
        return self.value_head(self.run_language(embeds, valid, num_queries=1)[:, -1])

    def expected_value(self, logits: torch.Tensor) -> torch.Tensor:
        """E[V] = sum softmax(logits) * atoms, in float32."""
        return torch.softmax(logits.float(), dim=-1) @ self.atoms.float()


def build_value_model(
    config: ValueModelConfig, *, device: str | torch.device = "cpu", seed: int | None = None
) -> ValueModel:
    """A randomly initialised model (no download). `device="meta"` builds shapes only (no memory)."""
    if seed is not None:
        torch.manual_seed(seed)
    with torch.device(device):
        return ValueModel(config)
