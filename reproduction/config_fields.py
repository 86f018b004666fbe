"""Config dataclasses built from user dicts: refuse unknown keys by name, in one place."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from reproduction.errors import ConfigError


def reject_unknown_fields(cls: type, data: Mapping[str, Any], *, what: str) -> None:
    """Raise ConfigError naming every key of `data` that is not a field of dataclass `cls`."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(
            f"{what}: unknown fields {unknown}", field=unknown[0], hint=f"known fields: {', '.join(sorted(known))}"
        )


OUTPUTS = "outputs"
"""Field metadata key: False on a field that does not change what is computed from its section."""
RESUMED_OUTPUTS = "resumed_outputs"
"""Field metadata key: False on a field that does not change what a training run computes once it continues from
its checkpoints (it still changes a fresh start's)."""


def same_outputs(*, on_resume: bool = False) -> dict[str, Any]:
    """Field metadata (`field(default=..., metadata=same_outputs())`) declaring, once, that the field does not change
    the outputs of what reads its section: a stage reading the section leaves it out of its key (run/stage_keys.py), the
    trainer leaves it out of a checkpoint's resume key (train/config.py). A stage that names the field itself in its
    config subsets (the eval stage's `policy.model.execute_steps`) reads it on purpose and keys on it.

    `on_resume=True` declares less: the field changes a fresh start's outputs (so stage keys keep it), but not those
    of a training run that continues from its checkpoints: it only shapes evaluation, or the initialisation a resume
    replaces with the checkpoint's weights, or names where things are whose contents the stage's setup check compares
    itself. A stage's setup guard lets such a field change on resume (`resume_free_fields`)."""
    return {RESUMED_OUTPUTS: False} if on_resume else {OUTPUTS: False}


ADDED = "added"
"""Field metadata key: True on a field added after runs were recorded (added_field)."""


def added_field() -> dict[str, Any]:
    """Field metadata (`field(default=..., metadata=added_field())`) for a field added after runs were recorded, whose
    default does what those runs did before it existed: at its default it is left out of stage keys
    (`output_free_keys` of an instance) and a setup recorded without it reads as its default, so the config of such a
    run keys as it did and a resume reports only what really changed (a stage whose code modules changed with the
    field is still named by their digests); set to anything else it keys like any field that changes outputs."""
    return {ADDED: True}


def added_defaults(cls: Any) -> dict[str, Any]:
    """{name: default} of the fields of dataclass `cls` declared `added_field()` (what a record written before
    them had)."""
    return {f.name: f.default for f in dataclasses.fields(cls) if f.metadata.get(ADDED)}


def changes_outputs(f: dataclasses.Field) -> bool:
    """False when field `f` was declared with `same_outputs()`."""
    return bool(f.metadata.get(OUTPUTS, True))


def resume_free_fields(cls: Any) -> tuple[str, ...]:
    """Names of the fields of dataclass `cls` (a class or an instance) a resumed training run may change: those
    declared `same_outputs()`, with or without `on_resume`; in declaration order."""
    return tuple(
        f.name for f in dataclasses.fields(cls) if not changes_outputs(f) or not f.metadata.get(RESUMED_OUTPUTS, True)
    )


def output_free_keys(config: Any, prefix: str = "") -> list[str]:
    """Dotted keys of every field of dataclass `config` (an instance or a class; nested sections too, and an instance's
    list items by index: `datasets.0.path`) declared with `same_outputs()`, and of an instance's `added_field()`s at
    their default; [] for anything that is not a dataclass (or a list of them)."""
    if isinstance(config, (list, tuple)):
        # a list of entries (a run's datasets): each item's fields, by index, as the stage keys' subsets hold them
        return [k for i, item in enumerate(config) for k in output_free_keys(item, f"{prefix}{i}.")]
    if not dataclasses.is_dataclass(config):
        return []
    out: list[str] = []
    for f in dataclasses.fields(config):
        key = prefix + f.name
        if not changes_outputs(f):
            out.append(key)
        elif f.metadata.get(ADDED) and not isinstance(config, type) and getattr(config, f.name) == f.default:
            out.append(key)
        elif not isinstance(config, type):
            out += output_free_keys(getattr(config, f.name, None), key + ".")
    return out
