"""Load a trained policy export as the simulator's `Policy` callable, with classifier-free guidance.

    export/ model.safetensors  model_config.json  policy.json  tokenizer/

`load_policy(export_dir, guidance_scale=w)` -> GuidedPolicy: batch dict (observation.state (B,S),
observation.goal (B,3), image keys (B,H,W,3) uint8 if the export reads cameras, task list[str]) ->
actions (B, H, A) float32. With w != 1 the conditional ("{task}\\nAdvantage: positive") and the
unconditional ("{task}") prompts go through ONE batched prefix pass and ONE batched expert pass per
Euler step (batch concat 2B); w == 1 runs the conditional half only. Without cameras (the tiny CPU
preset) the prefix depends on the prompts alone: its per-layer K/V are computed once per prompt set
and reused by later calls (the weights of a loaded policy never change). The initial noise of each row
is drawn from a generator seeded by (seed, the row's state and goal bytes), so an action depends on
the observation alone, not on which other rows share the batch or which worker evaluates it.
`PolicyFactory` is the picklable zero-argument factory the evaluator's workers call.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from reproduction.errors import (
    CheckpointError,
    ConfigError,
    GuidanceScaleError,
    InputNotFoundError,
    SimError,
    UnsupportedFormatError,
)
from reproduction.recap.policy.conditioning import PLAIN, POSITIVE
from reproduction.recap.policy.data import GOAL_KEY, STATE_KEY


def check_guidance(guidance_scale: float, mode: str | None = None) -> float:
    """A valid guidance scale for an export of `mode` (GuidanceScaleError otherwise)."""
    w = float(guidance_scale)
    if not np.isfinite(w) or w < 0:
        raise GuidanceScaleError(
            f"guidance scale {guidance_scale} is below 0 (or not finite)",
            field="guidance_scale",
            hint="use w >= 0: 1 = conditional only, 0 = unconditional only, >1 = extrapolate toward 'positive'",
        )
    if mode is not None and mode != "recap" and w != 1.0:
        raise GuidanceScaleError(
            f"guidance scale {w} given for a policy trained with mode {mode!r}, which has no advantage conditioning",
            field="guidance_scale",
            hint="use guidance scale 1 for bc and filtered_bc policies",
        )
    return w


def read_export(export_dir: Path) -> dict[str, Any]:
    """policy.json of an export; InputNotFoundError / UnsupportedFormatError when missing or newer."""
    from reproduction.recap.policy.config import EXPORT_FORMAT, EXPORT_META

    path = Path(export_dir) / EXPORT_META
    if not path.is_file():
        raise InputNotFoundError(
            f"{path}: no policy export here", path=path, hint="point at a policy stage's export/ folder"
        )
    meta = json.loads(path.read_text(encoding="utf-8"))
    if int(meta.get("format_version", 0)) != EXPORT_FORMAT:
        raise UnsupportedFormatError(
            f"{path}: export format {meta.get('format_version')} (this build reads {EXPORT_FORMAT})",
            path=path,
            hint="re-export with this version",
        )
    return meta


def export_step(export_dir: Path | str, meta: dict[str, Any] | None = None) -> int | None:
    """The step a policy export was written at: policy.json's `step` when it has one (`meta`: policy.json already
    read, else read here), else its training's `max_steps` (train_config.json: an export is written once training
    reached it); None when neither holds an integer (a bool is none)."""

    def whole(value: Any) -> int | None:
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    folder = Path(export_dir)
    if meta is None:
        try:
            meta = json.loads((folder / "policy.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            meta = {}
    step = whole(meta.get("step")) if isinstance(meta, dict) else None
    if step is not None:
        return step
    try:
        train = json.loads((folder / "train_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return whole(train.get("max_steps")) if isinstance(train, dict) else None


def export_image_size(export_dir: Path | str) -> int:
    """The camera resolution an export's model reads (its model_config.json's vision image size): what a simulator
    renders its cameras at, so no frame is resized on the way in."""
    from reproduction.recap.policy.model import PolicyModelConfig

    cfg = json.loads((Path(export_dir) / "model_config.json").read_text(encoding="utf-8"))
    return PolicyModelConfig.from_dict(cfg).image_size


def load_policy(
    export_dir: Path | str,
    *,
    guidance_scale: float,
    device: str = "cpu",
    num_steps: int | None = None,
    seed: int = 0,
    expect_preset: str | None = None,
) -> GuidedPolicy:
    """The export's policy (module docstring). Checks everything before building anything.

    Raises GuidanceScaleError (exit 53) for w < 0 or w != 1 on an unconditioned export,
    CheckpointError (50) when the export is of another preset than `expect_preset` or its weights
    do not match its config (strict load), InputNotFoundError / UnsupportedFormatError for a
    missing or newer export.
    """
    from reproduction.recap.policy.model import PolicyModelConfig, build_policy_model
    from reproduction.recap.tokenizer import load_tokenizer
    from reproduction.recap.value.weights import load_safetensors_strict

    export_dir = Path(export_dir)
    meta = read_export(export_dir)
    w = check_guidance(guidance_scale, meta["mode"])
    if expect_preset is not None and meta["preset"] != expect_preset:
        raise CheckpointError(
            f"{export_dir}: a {meta['preset']!r} policy export, but the config asks for preset {expect_preset!r}",
            path=export_dir,
            expected=expect_preset,
            actual=meta["preset"],
            hint=f"set the policy preset to {meta['preset']!r}, or point at a {expect_preset!r} export",
        )
    cfg = json.loads((export_dir / "model_config.json").read_text(encoding="utf-8"))
    mcfg = PolicyModelConfig.from_dict(cfg)
    if mcfg.preset != meta["preset"]:
        raise CheckpointError(f"{export_dir}: model_config preset {mcfg.preset!r} != policy.json {meta['preset']!r}")
    # Built for real (not meta + to_empty): non-persistent buffers such as SigLIP's position ids are
    # not in the state dict and must be initialised by the constructor.
    model = build_policy_model(mcfg, device=device)
    load_safetensors_strict(model, export_dir / "model.safetensors")
    model.eval()
    steps = int(num_steps or meta["num_steps"])
    if steps < 1:
        raise GuidanceScaleError(f"num_steps={steps} must be >= 1", field="num_steps")
    tokenizer = load_tokenizer(export_dir / meta["tokenizer"])
    return GuidedPolicy(model=model, meta=meta, tokenizer=tokenizer, guidance_scale=w, num_steps=steps, seed=seed)


class GuidedPolicy:
    """The `Policy` callable (module docstring); `reset()` is a no-op (the policy keeps no episode state)."""

    def __init__(self, *, model: Any, meta: dict, tokenizer: Any, guidance_scale: float, num_steps: int, seed: int):
        from reproduction.recap.policy.batches import PolicyCollator
        from reproduction.recap.policy.normalize import Normalizer
        from reproduction.recap.policy.pi05 import export_prompt_style

        self.model, self.meta, self.guidance_scale, self.num_steps, self.seed = (
            model,
            meta,
            guidance_scale,
            num_steps,
            seed,
        )
        self.norm = Normalizer(meta["stats"])  # z-score, or openpi's quantiles (pi05; absent `norm`: z-score)
        self.s_mean, self.s_std, self.a_mean, self.a_std = (
            self.norm.s_mean,
            self.norm.s_std,
            self.norm.a_mean,
            self.norm.a_std,
        )
        self.cameras = dict(meta["cameras"])
        self.collator = PolicyCollator(
            tokenizer,
            [],
            cameras=tuple(self.cameras),
            image_size=model.config.image_size,
            action_dim=model.config.action_dim,
            prompt=export_prompt_style(meta),
        )
        self.uses_guidance = meta["mode"] == "recap" and guidance_scale != 1.0
        self.forward_passes = 0
        """Batched forwards run so far (one per call, whatever w is): the evidence for 'one batched forward'."""
        self.prefix_runs = 0
        """Prefix (Gemma3) passes run so far: without cameras the prefix depends on the prompts alone, so
        its per-layer K/V are kept per prompt set and a call whose prompts were seen runs none."""
        self._prompt_kv: dict[Any, Any] = {}
        self._cache_prompts = not self.cameras and hasattr(model, "gather_cache") and model.config.preset == "tiny"

    @property
    def chunk(self) -> int:
        return int(self.meta["chunk"])

    @property
    def execute_steps(self) -> int:
        return int(self.meta["execute_steps"])

    def reset(self) -> None:
        """Nothing to reset: actions depend only on the observation (and the seed)."""

    def _state(self, obs: dict[str, Any]) -> np.ndarray:
        """(B, S) the policy's raw state of `obs`: its state_keys (or observation.state ++ observation.goal where the
        observation has a goal) concatenated, its state_dims picked. SimError (exit 45) when the observation does not
        give the width the policy was trained on: a bare ValueError here was exit 1, "a bug" (audit62 H1)."""
        n = len(obs["task"])
        keys = self.meta.get("state_keys") or [STATE_KEY] + ([GOAL_KEY] if GOAL_KEY in obs else [])
        state = np.concatenate([np.asarray(obs[k], np.float32).reshape(n, -1) for k in keys], axis=1)
        dims = self.meta.get("state_dims")
        given = f"{' + '.join(keys)}: {state.shape[1]} values"
        if dims is not None and max(dims) >= state.shape[1]:
            wrong = f"the policy picks state index {max(dims)} (state_dims), but the observations give {given}"
        elif (len(dims) if dims is not None else state.shape[1]) != self.s_mean.size:
            wrong = f"the policy reads a state of {self.s_mean.size} values, but the observations give {given}"
        else:
            return state[:, list(dims)] if dims is not None else state
        raise SimError(
            wrong,
            field="state",
            hint="evaluate the policy in a world whose observation matches its training data's state",
        )

    def noise(self, state: np.ndarray) -> Any:
        """(B, H, A) standard normal noise, each row seeded by (seed, its state bytes)."""
        import torch

        rows = []
        g = torch.Generator()
        for row in state:
            g.manual_seed((self.seed << 32) ^ zlib.crc32(np.ascontiguousarray(row).tobytes()))
            rows.append(torch.randn(self.chunk, self.model.config.action_dim, generator=g))
        return torch.stack(rows)

    def _cached_prefix(self, tasks: list[str], kinds: list[int], state: Any) -> Any:
        """The PrefixCache of a camera-free tiny batch, its prompts' K/V from (or into) the per-prompt cache."""

        names = sorted(set(tasks))
        self.collator.tasks = names
        where = {t: i for i, t in enumerate(names)}
        reps = len(kinds) // len(tasks)
        task_ids = np.array([where[t] for t in tasks] * reps, np.int64)
        ids, mask, index = self.collator.prompt_table(task_ids, np.asarray(kinds, np.int64))
        key = (tuple(ids.shape), ids.numpy().tobytes(), mask.numpy().tobytes())
        if key not in self._prompt_kv:
            if len(self._prompt_kv) >= 64:  # bounded: evaluation sees a handful of prompt sets
                self._prompt_kv.clear()
            device = state.device
            prompt = {"prompt_ids": ids.to(device), "prompt_mask": mask.to(device), "prompt_index": index}
            states, valid, _ = self.model.encode_prefix(prompt)
            self._prompt_kv[key] = (self.model.prompt_kv(states), valid)
            self.prefix_runs += 1
        kv, valid = self._prompt_kv[key]
        return self.model.gather_cache(kv, valid, index.to(state.device), state)

    def batch(self, obs: dict[str, Any], kinds: list[int]) -> dict[str, Any]:
        """The model batch for `obs` with one prompt kind per row (rows repeat when kinds is longer)."""
        import torch

        from reproduction.recap.value.data import to_pixels

        tasks = list(obs["task"])
        missing = [key for key in self.cameras.values() if key not in obs]
        if missing:  # masking them would evaluate a camera policy blind, silently
            raise ConfigError(
                f"the policy reads camera(s) {', '.join(missing)}, which the observations lack",
                field="cameras",
                hint="render the cameras the policy was trained on into the evaluation's observations",
            )
        n = len(tasks)
        reps = len(kinds) // n
        state = self.norm.state(self._state(obs))
        samples = []
        for r in range(reps):
            for i in range(n):
                s = {
                    "state": state[i].astype(np.float32),
                    "actions": np.zeros((1, 1), np.float32),
                    "task_id": i,
                    "label": True,
                    "kind": kinds[r * n + i],
                }
                if self.cameras:
                    size = self.collator.image_size
                    s["images"] = {slot: to_pixels(np.asarray(obs[key][i]), size) for slot, key in self.cameras.items()}
                samples.append(s)
        self.collator.tasks = tasks
        out = self.collator(samples)
        out.pop("actions")
        return {k: v for k, v in out.items() if isinstance(v, (torch.Tensor, dict))}

    def __call__(self, obs: dict[str, Any]) -> np.ndarray:
        import torch

        from reproduction.recap.policy.flow import euler_sample, guide
        from reproduction.train.loop import to_device

        n = len(obs["task"])
        device = next(self.model.parameters()).device
        cond_kind = POSITIVE if self.meta["mode"] == "recap" else PLAIN
        kinds = [cond_kind] * n + ([PLAIN] * n if self.uses_guidance else [])
        noise = self.noise(self._state(obs)).to(device)
        with torch.no_grad():
            if self._cache_prompts:
                state = torch.from_numpy(self.norm.state(self._state(obs)))
                state = state.repeat(len(kinds) // n, 1).to(device)
                cache = self._cached_prefix(list(obs["task"]), kinds, state)
            else:
                batch = to_device(self.batch(obs, kinds), device)
                cache = self.model.prefix_cache(*self.model.encode_prefix(batch), batch["state"])
                self.prefix_runs += 1
            self.forward_passes += 1
            w = self.guidance_scale

            def velocity(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
                if not self.uses_guidance:
                    return self.model.velocity(cache, x, t)
                # rows [0, n) carry the conditional prompt, [n, 2n) the plain one: one expert pass
                v = self.model.velocity(cache, torch.cat([x, x]), torch.cat([t, t]))
                return guide(v[:n], v[n:], w)

            actions = euler_sample(velocity, noise, self.num_steps)
        actions = actions.float().cpu().numpy()[..., : self.a_mean.size]  # pi05 pads actions to 32 dims
        return self.norm.unaction(actions)


@dataclass(frozen=True)
class PolicyFactory:
    """Picklable zero-argument factory: each evaluator worker builds its own policy copy."""

    export_dir: str
    guidance_scale: float = 1.0
    device: str = "cpu"
    num_steps: int | None = None
    seed: int = 0

    def __call__(self) -> GuidedPolicy:
        import torch

        torch.set_num_threads(1)
        return load_policy(
            self.export_dir,
            guidance_scale=self.guidance_scale,
            device=self.device,
            num_steps=self.num_steps,
            seed=self.seed,
        )
