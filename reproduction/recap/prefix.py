"""The SigLIP + Gemma3 prefix both RECAP models read: camera tokens, extra tokens, prompt tokens, one Gemma3 pass.

    images per camera (B,3,S,S) --SigLIP (present cameras only)--> (n_present, N, Dv)
        --Linear(Dv -> Dt) `projector`--> image tokens, scattered back into (B, C*N, Dt)
    prompt ids (B,T) --Gemma3 embed (already x sqrt(Dt))--> text tokens
    a model concatenates [image tokens] + [its own tokens] + [text tokens] (+ readout queries) and
    runs `language` (a Gemma3TextModel) over them with `prefix_attention_masks`.

The value model (recap/value/model.py) subclasses `SiglipGemmaPrefix` and appends one query token;
the policy (recap/policy/model.py) adds a state token and reads every prefix state from its action
expert. Parameter names (`vision.*`, `projector.*`, `language.*`) are the value checkpoints' names.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def tiny_vision(*, image_size: int = 64, patch_size: int = 16, width: int = 64) -> dict[str, Any]:
    """SiglipVisionConfig kwargs of the CPU presets (2 layers, `width` wide)."""
    return dict(
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=image_size,
        patch_size=patch_size,
        vision_use_head=False,
    )


def tiny_text(*, vocab_size: int = 512, width: int = 64, layers: int = 2) -> dict[str, Any]:
    """Gemma3TextConfig kwargs of the CPU presets (`layers` alternating sliding/full attention)."""
    kinds = ["sliding_attention", "full_attention"]
    return dict(
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=width // 2,
        vocab_size=vocab_size,
        max_position_embeddings=1024,
        sliding_window=512,
        query_pre_attn_scalar=width // 2,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        layer_types=[kinds[i % 2] for i in range(layers)],
    )


class SiglipGemmaPrefix(nn.Module):
    """`vision` (SiglipVisionModel), `projector` (Linear Dv -> Dt) and `language` (Gemma3TextModel).

    `vision=None` builds a text-only prefix (no `vision`/`projector` parameters): a state-only policy.
    """

    def __init__(
        self, vision: dict[str, Any] | None, text: dict[str, Any], *, attn_implementation: str = "sdpa"
    ) -> None:
        super().__init__()
        from transformers import Gemma3TextConfig, Gemma3TextModel, SiglipVisionConfig, SiglipVisionModel

        tcfg = Gemma3TextConfig(**text)
        tcfg._attn_implementation = attn_implementation
        self.vision: nn.Module | None = None
        self.projector: nn.Linear | None = None
        if vision:
            vcfg = SiglipVisionConfig(**vision)
            vcfg._attn_implementation = attn_implementation
            self.vision = SiglipVisionModel(vcfg)
            self.projector = nn.Linear(vcfg.hidden_size, tcfg.hidden_size)
        self.language = Gemma3TextModel(tcfg)

    def init_projector(self) -> None:
        """Upstream: the new projection is N(0, 0.02) with zero bias (no-op on the meta device)."""
        if self.projector is None or self.projector.weight.device.type == "meta":
            return
        nn.init.normal_(self.projector.weight, std=0.02)
        nn.init.zeros_(self.projector.bias)

    @property
    def tokens_per_image(self) -> int:
        vc = self.vision.config
        return (vc.image_size // vc.patch_size) ** 2

    @property
    def width(self) -> int:
        return int(self.language.config.hidden_size)

    def encode_images(
        self, images: dict[str, torch.Tensor], masks: dict[str, torch.Tensor], cameras: tuple[str, ...]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Image tokens (B, C*N, Dt) and their validity (B, C*N); absent cameras are never encoded.

        All present images of all cameras go through SigLIP in one batch; absent slots stay zero
        and are masked out of attention. Every forward calls SigLIP exactly once (FSDP needs the
        same collectives on all ranks), on one blank image if the batch has no camera at all.
        """
        ref = images[cameras[0]]
        batch, n = ref.shape[0], self.tokens_per_image
        width = self.projector.out_features
        present = torch.stack([masks[c].to(torch.bool) for c in cameras], dim=1)  # (B, C)
        tokens = ref.new_zeros(batch, len(cameras), n, width, dtype=self.projector.weight.dtype)
        dtype = self.vision.embeddings.patch_embedding.weight.dtype
        if bool(present.any()):
            pixels = torch.stack([images[c] for c in cameras], dim=1)[present]  # (P, 3, S, S)
            feats = self.vision(pixel_values=pixels.to(dtype)).last_hidden_state
            tokens = tokens.index_put((present,), self.projector(feats).to(tokens.dtype))
        else:
            # No camera at all in this batch. Sharded (FSDP) towers still need the same calls on
            # every rank, so run one blank image and add it times zero: one image, not B x C.
            blank = ref.new_zeros(1, *ref.shape[1:], dtype=dtype)
            tokens = tokens + 0.0 * self.projector(self.vision(pixel_values=blank).last_hidden_state).sum()
        valid = present.unsqueeze(-1).expand(batch, len(cameras), n)
        return tokens.reshape(batch, len(cameras) * n, width), valid.reshape(batch, len(cameras) * n)

    def embed_text(self, input_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Gemma3's scaled token embeddings (B, T, Dt) (the embedding multiplies by sqrt(Dt) itself)."""
        return self.language.embed_tokens(input_ids).to(dtype)

    def run_language(self, embeds: torch.Tensor, valid: torch.Tensor, *, num_queries: int = 0) -> torch.Tensor:
        """Gemma3 over `embeds` (B, L, Dt) with validity (B, L): last hidden states (B, L, Dt).

        Positions count valid tokens only; the last `num_queries` tokens are readouts (see
        `prefix_attention_masks`)."""
        positions = (torch.cumsum(valid.long(), dim=1) - 1).clamp(min=0)
        masks = prefix_attention_masks(
            valid, positions, self.language.config.sliding_window, embeds.dtype, num_queries=num_queries
        )
        out = self.language(inputs_embeds=embeds, attention_mask=masks, position_ids=positions, use_cache=False)
        return out.last_hidden_state


def prefix_attention_masks(
    valid: torch.Tensor,
    positions: torch.Tensor,
    sliding_window: int | None,
    dtype: torch.dtype,
    *,
    num_queries: int = 1,
) -> dict[str, torch.Tensor]:
    """Additive (B, 1, L, L) masks for Gemma3's full and sliding layers; the last `num_queries` tokens are queries.

    allowed[b, q, k] = valid[b, k] and (k is not a query or q is a query); sliding layers also
    need |pos_q - pos_k| < window. So prefix tokens attend bidirectionally to every valid prefix
    token and never to a query. Rows of padding tokens see the valid keys too (never an all-masked
    row, so no NaN); nothing valid attends to them, so they cannot change a result.
    """
    seq = valid.shape[1]
    is_query = torch.zeros(seq, dtype=torch.bool, device=valid.device)
    if num_queries:
        is_query[-num_queries:] = True
    allowed = valid[:, None, :] & (~is_query[None, None, :] | is_query[None, :, None])  # (B, L, L)
    neg = torch.finfo(dtype).min
    full = torch.zeros(allowed.shape, dtype=dtype, device=valid.device).masked_fill(~allowed, neg)
    sliding = full
    if sliding_window is not None and sliding_window < seq:
        near = (positions[:, :, None] - positions[:, None, :]).abs() < sliding_window
        sliding = full.masked_fill(~near, neg)
    return {"full_attention": full[:, None], "sliding_attention": sliding[:, None]}
