"""Stage 2's config dataclasses (torch-free: the run config and preflight import them without torch)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from reproduction.config_fields import check_bool, check_number, reject_unknown_fields, same_outputs
from reproduction.errors import ConfigError
from reproduction.recap.sources import DATASET_TYPES, DatasetSource  # noqa: F401 (DATASET_TYPES re-exported)

PRESETS = ("tiny", "recap")
"""The value model's presets (recap/value/model.py builds them)."""


@dataclass(kw_only=True, slots=True)
class ValueSource(DatasetSource):
    """One dataset the value stage reads (type: sft or rollout, validated; it matters in stages 1 and 3, not
    here, as upstream; weight: train sources only)."""

    returns: str | None = field(default=None, metadata=same_outputs(on_resume=True))
    """Folder holding the returns sidecar (a run folder); None = the dataset's meta/."""


@dataclass(kw_only=True, slots=True)
class ValueConfig:
    """What the value model is and how it reads its data (the run config's `value.model`, embedded as is); the
    datasets it trains on and the trainer's knobs (TrainConfig) are passed to the stage beside it."""

    preset: str = "tiny"
    """Model preset: tiny or recap."""
    cameras: dict[str, str] = field(default_factory=lambda: {"base_0_rgb": "observation.images.image"})
    """Model camera slot -> dataset feature key; a key a dataset lacks is an absent camera, but a map none of whose
    keys any dataset has, while they have image features, is refused at preflight (exit 4; `observation.images.none`
    asks for no image)."""
    tokenizer: str | None = field(default=None, metadata=same_outputs(on_resume=True))
    """Folder with tokenizer.json (required for recap); None with tiny = train one in-process."""
    pretrained_manifest: str | None = field(default=None, metadata=same_outputs(on_resume=True))
    """weights_manifest/*.json to initialise from (recap: the backbones; tiny: the whole model); None = random."""
    weights_dir: str | None = field(default=None, metadata=same_outputs(on_resume=True))
    """Folder the manifest's file paths are relative to (the bundle's weights/)."""
    allow_unpinned: bool = field(default=False, metadata=same_outputs(on_resume=True))
    """Accept manifest files whose sha256 is still `to-be-pinned`."""
    return_min: float | None = field(default=None, metadata=same_outputs(on_resume=True))
    """Explicit return range (both or neither, finite, return_min < return_max); default: from the training
    datasets' returns."""
    return_max: float | None = field(default=None, metadata=same_outputs(on_resume=True))
    folds: int = field(default=1, metadata=same_outputs(on_resume=True))
    """Cross-fitting folds K (1 = off)."""
    fold_seed: int = field(default=0, metadata=same_outputs(on_resume=True))
    """Seed of the fold split."""
    value_lr: float = 1e-4
    """Learning rate of the head group (`value_head`: projection + query; a finite number > 0); the rest uses
    TrainConfig.lr."""
    balance_weights: bool = True
    """Mixture shares proportional to weight x dataset size (else to weight)."""
    augment: bool = True
    """Per-sample image augmentation during training."""
    eval_max_samples: int = field(default=10_000, metadata=same_outputs(on_resume=True))
    """Cap per evaluation set (an evenly strided subset beyond it); >= 1."""
    eval_micro_batch: int = field(default=32, metadata=same_outputs(on_resume=True))
    """Frames per evaluation forward (>= 1)."""
    max_token_len: int = 200
    """Prompt truncation length in tokens, >= 1 (padding is to the batch's longest)."""
    value_dropout: float = 0.0
    """Dropout probability before the head, in [0, 1)."""
    model_seed: int = field(default=0, metadata=same_outputs(on_resume=True))
    """Seed of the model's random initialisation."""
    state_keys: list[str] = field(default_factory=list)
    """Dataset features concatenated into the value model's state token, e.g. [observation.state,
    observation.goal]; [] = no state input (upstream: image + prompt only)."""
    state_dims: list[int] | None = None
    """Components of the concatenated state to keep (e.g. positions only, no velocities); None = all."""

    def __post_init__(self) -> None:
        check_value_values(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ValueConfig:
        reject_unknown_fields(cls, data, what="value config")
        return cls(**dict(data))

    def to_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


def check_value_sources(sources: Sequence[ValueSource], eval_sources: Sequence[ValueSource] = ()) -> None:
    """ConfigError unless the value stage has training datasets (`sources`) and every dataset name, of those and of
    the extra evaluation datasets, is unique."""
    if not sources:
        raise ConfigError("value stage: no training datasets", field="train")
    names = [s.name for s in sources] + [s.name for s in eval_sources]
    if len(set(names)) != len(names):
        raise ConfigError(
            f"value stage: dataset names {names} are not unique", field="name", hint="give entries distinct `name`s"
        )


def check_value_values(cfg: Any, key: str = "") -> None:
    """ValueConfig's rules on `cfg`, a ValueConfig or anything with its fields as attributes; the ConfigError names
    each field as `key.field` (`value.model.folds` when the run config loads: its `component_checks`).
    ValueConfig.__post_init__ calls it with no key ("value stage: folds")."""

    def k(name: str) -> str:
        return f"{key}.{name}" if key else name

    where = "" if key else "value stage: "
    if cfg.preset not in PRESETS:
        raise ConfigError(
            f"{where}{k('preset')}={cfg.preset!r} is not one of {', '.join(PRESETS)}",
            field=k("preset"),
            hint=f"set {k('preset')} to one of: {', '.join(PRESETS)}",
        )
    if (cfg.return_min is None) != (cfg.return_max is None):
        raise ConfigError(
            f"{where}{k('return_min')}={cfg.return_min} and {k('return_max')}={cfg.return_max}: set both, or neither",
            field=k("return_min"),
            hint=f"set {k('return_min')} and {k('return_max')}, or neither (the range then comes from the returns)",
        )
    if cfg.preset == "recap" and not cfg.tokenizer:
        raise ConfigError(
            f"{where}{k('preset')}='recap' needs `{k('tokenizer')}` (the bundle's Gemma3 tokenizer folder)",
            field=k("tokenizer"),
            hint=f"set {k('tokenizer')}, or {k('preset')}=tiny",
        )
    check_number(cfg.folds, k("folds"), low=1, integer=True, where=where)
    # ranges of the numbers the model and trainer take as they are (audit52 W4: nan/inf trained a non-finite model,
    # a negative dropout failed in torch after stage 1 ran)
    for name, low in (("eval_max_samples", 1), ("eval_micro_batch", 1), ("max_token_len", 1)):
        check_number(getattr(cfg, name), k(name), low=low, integer=True, where=where)
    for name in ("fold_seed", "model_seed"):
        check_number(getattr(cfg, name), k(name), low=0, integer=True, where=where)
    check_number(cfg.value_lr, k("value_lr"), low=0, low_open=True, where=where)
    check_number(cfg.value_dropout, k("value_dropout"), low=0, high=1, high_open=True, where=where)
    for name in ("allow_unpinned", "balance_weights", "augment"):
        check_bool(getattr(cfg, name), k(name))
    if cfg.return_min is not None and cfg.return_max is not None:
        check_number(cfg.return_min, k("return_min"), where=where)
        check_number(cfg.return_max, k("return_max"), low=cfg.return_min, low_open=True, where=where)
    if not cfg.cameras:
        raise ConfigError(
            f"{where}{k('cameras')}={dict(cfg.cameras)} maps no model slot to a dataset key",
            field=k("cameras"),
            hint=f"map at least one slot, e.g. {k('cameras')}={{base_0_rgb: observation.images.image}}",
        )
    dims = None if cfg.state_dims is None else list(cfg.state_dims)
    if dims is not None and (not cfg.state_keys or not dims or len(set(dims)) != len(dims)):
        raise ConfigError(
            f"{where}{k('state_dims')}={dims} must be distinct indices of the vector {k('state_keys')} concatenates",
            field=k("state_dims"),
            hint=f"set {k('state_keys')} too, or drop {k('state_dims')}",
        )
    if dims is not None and min(dims) < 0:
        raise ConfigError(f"{where}{k('state_dims')}={dims} has a negative index", field=k("state_dims"))
