"""The `tiny` policy: SigLIP + Gemma3 prefix (recap/prefix.py) over cameras and prompt, a flow-matching action expert.

    prefix = [camera tokens (cameras present)] + [prompt tokens]
        --Gemma3 (bidirectional over valid prefix tokens)--> prefix states P (B, L, Dt)
    suffix = [state token: Linear(S -> De)(state ++ goal)] + H action tokens: Linear(A -> De)(x_t) + position
    time t --sinusoid(De) -> time_mlp_in -> silu -> time_mlp_out -> silu--> cond (B, De)
    expert layer (x `expert_layers`), pi0.5's block with adaRMS time conditioning:
        h, g1 = input_layernorm(x, cond)          adaRMS: rms(x) * (1 + scale) + shift, gate
        x = x + g1 * o_proj(attn(q(h), [k_p(P); k(h)], [v_p(P); v(h)]))   suffix sees prefix + suffix
        h, g2 = post_attention_layernorm(x, cond)
        x = x + g2 * mlp(h)                        gelu-tanh gated MLP (Gemma's)
    v = action_out_proj(norm(x, cond))[:, 1:] : (B, H, A), the flow-matching velocity.

The state enters the expert stream as one continuous token (pi0's `state_proj`), not the prefix:
pi0.5 writes it into the prompt as discretised text (recap/policy/pi05.py keeps that), which on
CPU would make every sample's prefix distinct. Here, without cameras, the prefix depends on the
prompt alone, so `encode_prefix` runs Gemma3 once per DISTINCT prompt in the batch (a few: tasks x
{plain, positive, negative}) and gathers: the same numbers as a per-sample pass at a fraction of
the cost. The expert reads the prefix's final states through per-layer K/V projections instead of
pi0.5's layer-by-layer shared attention; sampling computes the prefix K/V once and reruns only the
expert `num_steps` times. The adaRMS `dense` layers start at zero (openpi's init), so every expert
block starts as the identity and learns its gates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from reproduction.config_fields import reject_unknown_fields
from reproduction.errors import ConfigError
from reproduction.recap.prefix import SiglipGemmaPrefix, tiny_text, tiny_vision

PRESETS = ("tiny", "pi05")


@dataclass(kw_only=True, slots=True)
class PolicyModelConfig:
    """Everything needed to rebuild a policy model; stored with every checkpoint and export."""

    preset: str = "tiny"
    """`tiny` (this module) or `pi05` (recap/policy/pi05.py)."""
    vision: dict[str, Any] | None = None
    """SiglipVisionConfig kwargs; None = no camera input (state + prompt only)."""
    text: dict[str, Any] = field(default_factory=dict)
    """Gemma3TextConfig kwargs of the prefix (vocab_size must match the tokenizer)."""
    cameras: tuple[str, ...] = ()
    """Camera slots in prefix order (sorted); empty when `vision` is None."""
    state_dim: int = 1
    """Length of the (normalised) state vector the state token reads: state + goal."""
    action_dim: int = 4
    """Action dimensions (Fetch: dx, dy, dz, gripper)."""
    chunk: int = 4
    """Actions per chunk H."""
    expert_width: int = 64
    expert_layers: int = 2
    expert_heads: int = 2
    expert_mlp: int = 128
    expert_kv_heads: int | None = None
    """pi05: key/value heads of the expert (grouped-query attention); tiny: unused."""
    expert_head_dim: int | None = None
    """pi05: head width of the expert; tiny: expert_width / expert_heads."""
    min_period: float = 4e-3
    """Sinusoidal time embedding periods (pi0's)."""
    max_period: float = 4.0
    attn_implementation: str = "sdpa"

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ConfigError(f"policy model: unknown preset {self.preset!r}", field="preset", hint=f"use {PRESETS}")
        self.cameras = tuple(sorted(self.cameras))
        if bool(self.vision) != bool(self.cameras):
            raise ConfigError(
                f"policy model: cameras {list(self.cameras)} and vision config must be both set or both empty",
                field="cameras",
            )
        for name in ("state_dim", "action_dim", "chunk", "expert_layers", "expert_heads"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"policy model: {name}={getattr(self, name)} must be >= 1", field=name)
        if self.expert_width % (2 * self.expert_heads):
            raise ConfigError(
                f"policy model: expert_width={self.expert_width} must be a multiple of 2 x expert_heads",
                field="expert_width",
            )

    @property
    def image_size(self) -> int:
        return int((self.vision or {}).get("image_size", 224))

    def to_dict(self) -> dict[str, Any]:
        out = {f: getattr(self, f) for f in self.__dataclass_fields__}
        out["cameras"] = list(self.cameras)
        out["vision"] = dict(self.vision) if self.vision else None
        out["text"] = dict(self.text)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PolicyModelConfig:
        reject_unknown_fields(cls, data, what="policy model config")
        kwargs = dict(data)
        kwargs["cameras"] = tuple(kwargs.get("cameras", ()))
        return cls(**kwargs)


def tiny_config(
    *,
    vocab_size: int,
    state_dim: int,
    action_dim: int = 4,
    chunk: int = 4,
    cameras: tuple[str, ...] = (),
    image_size: int = 64,
    width: int = 64,
    prefix_layers: int = 2,
    expert_layers: int = 2,
) -> PolicyModelConfig:
    """The CPU preset: prefix and expert `width` wide; cameras () = state + prompt only."""
    return PolicyModelConfig(
        preset="tiny",
        vision=tiny_vision(image_size=image_size, patch_size=16, width=width) if cameras else None,
        text=tiny_text(vocab_size=vocab_size, width=width, layers=prefix_layers),
        cameras=cameras,
        state_dim=state_dim,
        action_dim=action_dim,
        chunk=chunk,
        expert_width=width,
        expert_layers=expert_layers,
        expert_heads=2,
        expert_mlp=2 * width,
    )


def sinusoidal_time(t: torch.Tensor, dim: int, min_period: float, max_period: float) -> torch.Tensor:
    """openpi's `create_sinusoidal_pos_embedding`: (B,) -> (B, dim) [sin | cos], float32."""
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=torch.float64, device=t.device)
    period = min_period * (max_period / min_period) ** fraction
    angle = (2 * math.pi / period)[None, :] * t.double()[:, None]
    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=1).float()


class AdaRMSNorm(nn.Module):
    """openpi's adaptive RMSNorm: rms(x) * (1 + scale) + shift and a residual gate, all from `cond`."""

    def __init__(self, dim: int, cond_dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.dense = nn.Linear(cond_dim, 3 * dim)

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.dense.weight)
        nn.init.zeros_(self.dense.bias)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        var = x.float().pow(2).mean(-1, keepdim=True)
        normed = (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype)
        scale, shift, gate = self.dense(cond)[:, None, :].chunk(3, dim=-1)
        return normed * (1 + scale) + shift, gate


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + bias) v. On CPU written out: with H + 1 queries over ~30 keys per row,
    SDPA's flash kernel costs more per call than the two batched matmuls (a 256-row training step:
    ~65 -> ~60 ms on 2 cores); elsewhere SDPA (fused, and stable in bf16)."""
    if q.device.type != "cpu":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    scores = torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5 + bias
    return torch.matmul(scores.softmax(dim=-1), v)


class ExpertLayer(nn.Module):
    """One action-expert block (module docstring): attention over [prefix; chunk], gated MLP."""

    fsdp_forward_methods = ("prefix_kv",)
    """Called by the policy outside `forward` (train/fsdp.py gives it FSDP2's unshard hooks)."""

    def __init__(self, width: int, heads: int, mlp: int, prefix_width: int) -> None:
        super().__init__()
        self.heads = heads
        self.input_layernorm = AdaRMSNorm(width, width)
        self.q_proj = nn.Linear(width, width, bias=False)
        self.k_proj = nn.Linear(width, width, bias=False)
        self.v_proj = nn.Linear(width, width, bias=False)
        self.prefix_k_proj = nn.Linear(prefix_width, width, bias=False)
        self.prefix_v_proj = nn.Linear(prefix_width, width, bias=False)
        self.o_proj = nn.Linear(width, width, bias=False)
        self.post_attention_layernorm = AdaRMSNorm(width, width)
        self.gate_proj = nn.Linear(width, mlp, bias=False)
        self.up_proj = nn.Linear(width, mlp, bias=False)
        self.down_proj = nn.Linear(mlp, width, bias=False)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        return x.view(b, n, self.heads, d // self.heads).transpose(1, 2)

    def prefix_kv(self, prefix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This layer's keys and values of the prefix states (computed once per sampling call)."""
        return self._heads(self.prefix_k_proj(prefix)), self._heads(self.prefix_v_proj(prefix))

    def forward(
        self, x: torch.Tensor, cond: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], bias: torch.Tensor
    ) -> torch.Tensor:
        h, gate = self.input_layernorm(x, cond)
        q = self._heads(self.q_proj(h))
        k = torch.cat([kv[0], self._heads(self.k_proj(h))], dim=2)
        v = torch.cat([kv[1], self._heads(self.v_proj(h))], dim=2)
        att = _attend(q, k, v, bias)
        b, _, n, _ = att.shape
        x = x + gate * self.o_proj(att.transpose(1, 2).reshape(b, n, -1))
        h, gate = self.post_attention_layernorm(x, cond)
        mlp = self.down_proj(F.gelu(self.gate_proj(h), approximate="tanh") * self.up_proj(h))
        return x + gate * mlp


@dataclass
class PrefixCache:
    """What the expert reads of a batch's prefix: per-layer K/V, the key bias, and the (normalised) state."""

    kv: list[tuple[torch.Tensor, torch.Tensor]]
    """Per expert layer, prefix keys and values (B, heads, L, d)."""
    bias: torch.Tensor
    """Additive (B, 1, 1, L + 1 + H) attention bias: valid prefix keys, state token, chunk."""
    state: torch.Tensor
    """(B, S) normalised state ++ goal."""


class TinyPolicy(SiglipGemmaPrefix):
    """The `tiny` preset (module docstring). `forward` gives the velocity for (x_t, t) given a batch."""

    def __init__(self, config: PolicyModelConfig) -> None:
        super().__init__(config.vision, config.text, attn_implementation=config.attn_implementation)
        self.config = config
        dt, de = self.width, config.expert_width
        self.state_proj = nn.Linear(config.state_dim, de)
        self.action_in_proj = nn.Linear(config.action_dim, de)
        self.action_pos = nn.Parameter(torch.zeros(config.chunk, de))
        self.time_mlp_in = nn.Linear(de, de)
        self.time_mlp_out = nn.Linear(de, de)
        self.expert = nn.ModuleList(
            ExpertLayer(de, config.expert_heads, config.expert_mlp, dt) for _ in range(config.expert_layers)
        )
        self.norm = AdaRMSNorm(de, de)
        self.action_out_proj = nn.Linear(de, config.action_dim)
        self._init_fresh()

    def _init_fresh(self) -> None:
        if self.state_proj.weight.device.type == "meta":
            return
        self.init_projector()
        nn.init.normal_(self.action_pos, std=0.02)
        for module in self.modules():
            if isinstance(module, AdaRMSNorm):
                module.reset_parameters()

    def encode_prefix(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Prefix states, validity and the row -> state index (None = one row per sample).

        Without cameras the states are computed once per distinct prompt: (U, T, Dt), (U, T) and the
        (B,) index of each sample's prompt. With cameras: (B, C*N + T, Dt), (B, C*N + T), None; or, when the
        batch carries `prefix_index` (B,) (its images and prompts one per distinct prefix, U of them: GRPO's
        update, whose K loss rows of a decision share it), (U, C*N + T, Dt), (U, C*N + T) and that index."""
        dtype = self.state_proj.weight.dtype
        if self.vision is None and "prompt_index" in batch:  # the collator already de-duplicated the prompts
            att = batch["prompt_mask"].to(torch.bool)
            states = self.run_language(self.embed_text(batch["prompt_ids"], dtype), att, num_queries=0)
            return states, att, batch["prompt_index"]
        ids, att = batch["input_ids"], batch["attention_mask"].to(torch.bool)
        if self.vision is None:
            uniq, inverse = torch.unique(torch.cat([ids, att.long()], dim=1), dim=0, return_inverse=True)
            ids, att = uniq[:, : ids.shape[1]], uniq[:, ids.shape[1] :].to(torch.bool)
            return self.run_language(self.embed_text(ids, dtype), att, num_queries=0), att, inverse
        img_tok, img_valid = self.encode_images(batch["images"], batch["image_masks"], self.config.cameras)
        embeds = torch.cat([img_tok.to(dtype), self.embed_text(ids, dtype)], dim=1)
        valid = torch.cat([img_valid, att], dim=1)
        return self.run_language(embeds, valid, num_queries=0), valid, batch.get("prefix_index")

    def prefix_cache(
        self, prefix: torch.Tensor, valid: torch.Tensor, index: torch.Tensor | None, state: torch.Tensor
    ) -> PrefixCache:
        """Per-layer prefix K/V (projected once per distinct prefix, then gathered per sample)."""
        return self.gather_cache(self.prompt_kv(prefix), valid, index, state)

    def prompt_kv(self, prefix: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per expert layer, the keys and values of prefix states (U, L, Dt): what an inference
        caller may keep per prompt while the weights do not change (the policy export does)."""
        return [layer.prefix_kv(prefix) for layer in self.expert]

    def gather_cache(
        self,
        kv: list[tuple[torch.Tensor, torch.Tensor]],
        valid: torch.Tensor,
        index: torch.Tensor | None,
        state: torch.Tensor,
    ) -> PrefixCache:
        """The PrefixCache of a batch from per-prefix K/V (`prompt_kv`) and each row's prefix `index`."""
        if index is not None:  # index_select, not k[index]: its backward is a scatter-add, not a slow
            # accumulating index_put (~10 of ~80 ms in a 256-row CPU training step)
            valid = valid.index_select(0, index)
            kv = [(k.index_select(0, index), v.index_select(0, index)) for k, v in kv]
        prefix = kv[0][0]
        suffix = valid.new_ones(valid.shape[0], 1 + self.config.chunk)
        keys = torch.cat([valid, suffix], dim=1)
        bias = torch.zeros(keys.shape, dtype=prefix.dtype, device=prefix.device).masked_fill(
            ~keys, torch.finfo(prefix.dtype).min
        )
        return PrefixCache(kv=kv, bias=bias[:, None, None, :], state=state)

    def time_cond(self, t: torch.Tensor) -> torch.Tensor:
        emb = sinusoidal_time(t, self.config.expert_width, self.config.min_period, self.config.max_period)
        emb = emb.to(self.time_mlp_in.weight.dtype)
        return F.silu(self.time_mlp_out(F.silu(self.time_mlp_in(emb))))

    def velocity(self, cache: PrefixCache, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """v_theta(x_t, t | prefix, state): (B, H, A) float32. `x_t` may hold k x the cache's rows
        (guidance): the cache is then used for each block of rows in turn."""
        reps = x_t.shape[0] // cache.state.shape[0]
        kv, bias, state = cache.kv, cache.bias, cache.state
        if reps > 1:
            kv = [(k.repeat(reps, 1, 1, 1), v.repeat(reps, 1, 1, 1)) for k, v in kv]
            bias, state = bias.repeat(reps, 1, 1, 1), state.repeat(reps, 1)
        dtype = self.action_in_proj.weight.dtype
        cond = self.time_cond(t)
        x = torch.cat(
            [self.state_proj(state.to(dtype))[:, None], self.action_in_proj(x_t.to(dtype)) + self.action_pos], dim=1
        )
        for layer, layer_kv in zip(self.expert, kv):
            x = layer(x, cond, layer_kv, bias)
        h, _ = self.norm(x, cond)
        return self.action_out_proj(h[:, 1:]).float()

    def forward(self, batch: dict[str, Any], x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        prefix, valid, index = self.encode_prefix(batch)
        return self.velocity(self.prefix_cache(prefix, valid, index, batch["state"]), x_t, t)


def build_policy_model(
    config: PolicyModelConfig, *, device: str | torch.device = "cpu", seed: int | None = None
) -> nn.Module:
    """A randomly initialised policy of `config.preset` (no download); `device="meta"` builds shapes only."""
    if seed is not None:
        torch.manual_seed(seed)
    with torch.device(device):
        if config.preset == "pi05":
            from reproduction.recap.policy.pi05 import Pi05Policy

            return Pi05Policy(config)
        return TinyPolicy(config)
