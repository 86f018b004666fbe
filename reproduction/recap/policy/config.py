"""Stage 4's config: `PolicyConfig` (what the policy is and how it trains, but the trainer's knobs), its value rules,
and the names of the files the stage writes (the tree is in reproduction/recap/policy/task.py's docstring)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from reproduction.config_fields import added_field, check_bool, check_number, reject_unknown_fields, same_outputs
from reproduction.errors import ConfigError
from reproduction.recap.policy.conditioning import MODES

SETUP_NAME = "policy_setup.json"
ARRAYS_NAME = "frames.npz"
EXPORT_META = "policy.json"
EXPORT_FORMAT = 1


@dataclass(kw_only=True, slots=True)
class PolicyConfig:
    """What stage 4's policy is and how it trains (the run config's `policy.model`, embedded as is); the mode, the
    trainer's knobs (a TrainConfig) and the opened datasets are passed to the stage beside it."""

    preset: str = "tiny"
    """tiny (CPU) or pi05 (lerobot PI05Policy's architecture and keys)."""
    cameras: dict[str, str] = field(default_factory=dict)
    """Model camera slot -> dataset key; empty = state + goal + prompt only (the CPU demo)."""
    state_keys: list[str] = field(default_factory=list)
    """Dataset features concatenated into the state input; [] = observation.state ++ observation.goal (when the
    dataset has it). E.g. [observation.state, observation.object_state]: LIBERO's privileged object state (CPU tier)."""
    state_dims: list[int] | None = None
    """Components of that concatenated state to keep; None = all."""
    chunk: int = 4
    """Action chunk length H."""
    execute_steps: int = field(default=2, metadata=same_outputs())
    """Actions of each chunk the evaluator executes open-loop (stored in the export for the runner)."""
    # same_outputs(): an evaluation setting, so out of the policy stage's key and free on resume; the eval stage
    # names policy.model.execute_steps in its config subset and so keys on it.
    num_steps: int = field(default=10, metadata=same_outputs(on_resume=True))
    """Euler steps at inference (load_policy may override)."""
    positive_only: bool = True
    """Condition only on positive labels (negatives train the plain prompt), upstream's yaml default."""
    condition_dropout: float = 0.1
    """Probability that a sample's advantage text is dropped (plain prompt), upstream's yaml default."""
    hold_labels: bool = False
    """Label positive every frame from the first success on in successful episodes (DEMO_LAB 4; the demos set it).
    Off = upstream's rule: stage 4 takes stage 3's labels as they are."""
    width: int = 64
    """tiny: prefix and expert width."""
    prefix_layers: int = 2
    """tiny: Gemma3 layers of the prefix."""
    expert_layers: int = 2
    """tiny: action expert layers."""
    image_size: int = 64
    """tiny: camera resolution the SigLIP tower reads (>= 16: its patches are 16 pixels)."""
    tokenizer: str | None = field(default=None, metadata=same_outputs(on_resume=True))
    """Folder with tokenizer.json; None (tiny) = train one in-process from the tasks and prompt variants."""
    model_seed: int = field(default=0, metadata=same_outputs(on_resume=True))
    """Seed of the model's random initialisation."""
    pretrained_manifest: str | None = field(default=None, metadata=same_outputs(on_resume=True))
    """weights_manifest/*.json whose files initialise the model (strict, sha256-checked); None = random init."""
    weights_dir: str | None = field(default=None, metadata=same_outputs(on_resume=True))
    """Folder the manifest's file paths are relative to (the bundle's weights/)."""
    discrete_state_input: bool = field(default=False, metadata=added_field())
    """pi05: write the normalised state into the prompt as openpi's 256-bin text ("Task: ..., State: ...;\\nAction: ",
    openpi's Pi0Config field). False = upstream RLinf's pi05_libero: the prompt is the task alone (openpi's tokenizer
    without a state) and the policy never sees the state (pi0.5 has no state projection). tiny: must be false."""
    norm: str | None = field(default=None, metadata=added_field())
    """State/action normalisation: quantile (openpi's pi0.5: (x - q01) / (q99 - q01 + 1e-6) * 2 - 1) or zscore
    ((x - mean) / max(std, 1e-2)); None = the preset's: quantile for pi05, zscore for tiny."""
    norm_stats: str | None = field(default=None, metadata=added_field())
    """openpi's norm_stats.json (or the folder holding it, e.g. a checkpoint's assets/<asset_id>/) whose state and
    actions q01/q99 the quantile norm uses (upstream reads its checkpoint's); None = the training frames' quantiles."""
    image_augment: bool | None = field(default=None, metadata=added_field())
    """Train-time image augmentation as openpi's preprocess_observation_pytorch(train=True): 95% crop + resize and
    +-5 degree rotation on non-wrist cameras, brightness/contrast/saturation jitter on all; None = the preset's (pi05
    on, as upstream trains; tiny off)."""

    def __post_init__(self) -> None:
        check_policy_values(self)

    def to_dict(self) -> dict[str, Any]:
        out = {f: getattr(self, f) for f in self.__dataclass_fields__}
        out["cameras"] = dict(self.cameras)
        out["state_keys"] = list(self.state_keys)
        out["state_dims"] = None if self.state_dims is None else list(self.state_dims)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PolicyConfig:
        reject_unknown_fields(cls, data, what="policy config")
        return cls(**dict(data))


def check_mode(mode: str) -> None:
    """ConfigError unless `mode` is one of conditioning.MODES (recap, bc, filtered_bc)."""
    if mode not in MODES:
        raise ConfigError(f"policy stage: mode {mode!r} is not one of {', '.join(MODES)}", field="mode")


def check_policy_values(cfg: Any, key: str = "") -> None:
    """PolicyConfig's rules on `cfg`, a PolicyConfig or anything with its fields as attributes; the ConfigError names
    each field as `key.field` (`policy.model.chunk` when the run config loads: its `component_checks`).
    PolicyConfig.__post_init__ calls it with no key ("policy stage: chunk")."""

    def k(name: str) -> str:
        return f"{key}.{name}" if key else name

    where = "" if key else "policy stage: "
    presets = ("tiny", "pi05")  # model.PRESETS, without importing torch
    if cfg.preset not in presets:
        raise ConfigError(
            f"{where}{k('preset')}={cfg.preset!r} is not one of {', '.join(presets)}",
            field=k("preset"),
            hint=f"set {k('preset')} to one of: {', '.join(presets)}",
        )
    if not 0.0 <= cfg.condition_dropout < 1.0:  # also refuses nan
        raise ConfigError(
            f"{where}{k('condition_dropout')}={cfg.condition_dropout} is outside [0, 1)", field=k("condition_dropout")
        )
    for name in ("chunk", "execute_steps", "num_steps", "width", "prefix_layers", "expert_layers"):
        check_number(getattr(cfg, name), k(name), low=1, integer=True, where=where)
    # tiny's SigLIP tower cuts 16-pixel patches (audit52 W4: 0 and -5 were accepted)
    check_number(cfg.image_size, k("image_size"), low=16, integer=True, where=where)
    check_number(cfg.model_seed, k("model_seed"), low=0, integer=True, where=where)
    for name in ("positive_only", "hold_labels", "discrete_state_input"):
        check_bool(getattr(cfg, name, False), k(name))
    if getattr(cfg, "image_augment", None) is not None:
        check_bool(cfg.image_augment, k("image_augment"))
    if cfg.execute_steps > cfg.chunk:
        raise ConfigError(
            f"{where}{k('execute_steps')}={cfg.execute_steps} exceeds {k('chunk')}={cfg.chunk}",
            field=k("execute_steps"),
            hint=f"set {k('execute_steps')} to at most {k('chunk')}: the evaluator executes part of each chunk",
        )
    dims = None if cfg.state_dims is None else list(cfg.state_dims)
    if dims is not None and (not cfg.state_keys or not dims or len(set(dims)) != len(dims) or min(dims) < 0):
        raise ConfigError(
            f"{where}{k('state_dims')}={dims} must be distinct indices (>= 0) of the vector {k('state_keys')} "
            "concatenates",
            field=k("state_dims"),
            hint=f"set {k('state_keys')} too, or drop {k('state_dims')}",
        )
    check_input_options(cfg, key)


def check_input_options(cfg: Any, key: str = "") -> None:
    """The rules on how a preset reads its inputs (`norm`, `norm_stats`, `discrete_state_input`, pi05's `cameras`),
    shared by RECAP's policy.model and GRPO's sft.model (which embeds these fields but not the conditioning ones)."""
    from reproduction.recap.policy.normalize import check_norm, default_norm

    def k(name: str) -> str:
        return f"{key}.{name}" if key else name

    where = "" if key else "policy stage: "
    check_norm(getattr(cfg, "norm", None), k("norm"))
    norm = getattr(cfg, "norm", None) or default_norm(cfg.preset)
    if getattr(cfg, "norm_stats", None) and norm != "quantile":
        raise ConfigError(
            f"{where}{k('norm_stats')} is set, but the normalisation is z-score (only the quantile norm reads it)",
            field=k("norm_stats"),
            hint=f"set {k('norm')}=quantile, or drop {k('norm_stats')}",
        )
    if cfg.preset == "tiny" and getattr(cfg, "discrete_state_input", False):
        raise ConfigError(
            f"{where}{k('discrete_state_input')}=true applies to pi05 (tiny reads the state through its projection)",
            field=k("discrete_state_input"),
            hint=f"drop {k('discrete_state_input')}, or set {k('preset')}=pi05",
        )
    if cfg.preset == "pi05" and not cfg.cameras:
        raise ConfigError(
            f"{where}{k('preset')}='pi05' reads cameras (PaliGemma's SigLIP); `{k('cameras')}` maps none",
            field=k("cameras"),
            hint=f"map at least one slot, e.g. {k('cameras')}={{base_0_rgb: observation.images.agentview}}",
        )
