"""Config dataclasses built from user dicts: refuse unknown keys by name, in one place."""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
from collections.abc import Mapping
from pathlib import Path
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


def unrecorded_filled(
    recorded: Mapping[str, Any],
    today: Mapping[str, Any],
    ran_with: Mapping[str, Any] | None,
    *,
    added: Mapping[str, Any] | None = None,
    prefix: str = "",
) -> tuple[dict[str, Any], list[str]]:
    """The one rule for a key recorded before a field entered it (stage keys: run/stage_keys.unkeyed_filled;
    checkpoint resume keys: train/checkpoint.load; audit56 review2 S5): (a copy of `recorded` with each key of `today`
    it lacks filled in, nested mappings too; the dotted names, after `prefix`, of those whose value cannot be told).
    A field of `added` (dotted name: default, `added_defaults`) reads as its default: at its default it was never
    keyed, and before it existed the run did what its default does. Any other field (keyed later: declared
    `same_outputs()` then, as `train.micro_batch` until audit56 D1) takes its value in `ran_with`, the config the
    record provably ran with (its digest is the record's); a field `ran_with` lacks did not exist then and is left
    absent, so today's value reads as a change. With `ran_with` None the value cannot be told: filling today's
    value, or the latest invocation's, accepted a resume with another value and recorded the wrong one (audit56
    review2 S1), so the caller refuses naming the field."""
    out = json.loads(json.dumps(dict(recorded)))
    untold: list[str] = []
    for k, now in today.items():
        dotted = prefix + str(k)
        if k in out:
            if isinstance(out[k], dict) and isinstance(now, Mapping):
                out[k], more = unrecorded_filled(out[k], now, ran_with, added=added, prefix=dotted + ".")
                untold += more
        elif added is not None and dotted in added:
            out[k] = json.loads(json.dumps(added[dotted]))
        elif ran_with is None:
            untold.append(dotted)
        elif (then := _dotted(ran_with, dotted)) is not _ABSENT:
            out[k] = json.loads(json.dumps(then))
    return out, untold


def recorded_train(out_dir: Path) -> dict[str, Any] | None:
    """The train config a training stage's folder `out_dir` records it trained with: its setup's
    (`<out_dir>/*_setup.json`'s `stage.train`, as policy_setup.json keeps it and its setup guard compares on resume
    before any checkpoint is loaded), else its export's (`<out_dir>/export/train_config.json`, written by the
    invocation that trained there last). None when neither says. Here, torch-free, because both a checkpoint's
    resume (`train.checkpoint.setup_train`) and the stage decision of a killed stage (`run.stage_decide`, where a
    finished --resume loads no torch) read it: one rule (audit56 review3 T1)."""
    out_dir = Path(out_dir)
    found = []
    for path in sorted(out_dir.glob("*_setup.json")):
        try:
            train = json.loads(path.read_text())["stage"]["train"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(train, dict):
            found.append(train)
    if len(found) == 1:
        return found[0]
    try:
        train = json.loads((out_dir / "export" / "train_config.json").read_text())
    except (OSError, ValueError):
        return None
    return train if isinstance(train, dict) else None


_ABSENT = object()


def _dotted(tree: Mapping[str, Any], dotted: str) -> Any:
    """The value at `dotted` (`sft.train.micro_batch`) of nested mappings `tree`, _ABSENT where there is none."""
    for part in dotted.split("."):
        if not isinstance(tree, Mapping) or part not in tree:
            return _ABSENT
        tree = tree[part]
    return tree


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
    """Dotted keys of every field of dataclass `config` (an instance or a class; nested sections too, not list
    items) declared with `same_outputs()`, and of an instance's `added_field()`s at their default; [] for anything that
    is not a dataclass."""
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


# -- value rules shared by every section's checks (audit52 W3/W4) ---------------------------------------------------

NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
NAME_MAX = 100
INT_MAX = 2**63 - 1
"""Largest whole number a config field takes: numpy and torch keep seeds and counts in int64."""
TIMEOUT_MAX_S = 7 * 24 * 3600.0
"""Longest timeout (seconds) a config field takes, one week: Ray and torch turn a timeout into C integers of
milliseconds, and 1e300 crashed with OverflowError after Ray had started (audit56 D2)."""


def is_safe_name(value: object) -> bool:
    """True when `value` is a non-empty string usable as one file or folder name on every platform: letters,
    digits, `.`, `_` and `-` only (so no separator, NUL or space), not `.`/`..`, not starting with `-`, at most
    NAME_MAX characters."""
    return (
        isinstance(value, str)
        and 0 < len(value) <= NAME_MAX
        and set(value) <= NAME_CHARS
        and value not in (".", "..")
        and not value.startswith("-")
    )


SHOWN_VALUE_CHARS = 200
"""How much of a value an error shows: a rule quoting a 900 KB value made a 900 KB error line (audit60 D8)."""


def shown(value: object) -> str:
    """`value` as an error message quotes it (repr), a string longer than SHOWN_VALUE_CHARS cut to its start then
    `...' (N chars)`, so the key and the rule stay readable on one line. The value is cut before it is quoted, not
    the finished message (audit60 review S3: a regex over the message missed "it's ..." and cut prose)."""
    if isinstance(value, str) and len(value) > SHOWN_VALUE_CHARS:
        head = repr(value[:SHOWN_VALUE_CHARS])
        return f"{head[:-1]}...{head[-1]} ({len(value)} chars)"
    text = repr(value)
    return text if len(text) <= SHOWN_VALUE_CHARS else f"{text[:SHOWN_VALUE_CHARS]}... ({len(text)} chars)"


def check_name(value: object, name: str, *, optional: bool = True) -> None:
    """ConfigError naming field `name` unless `value` is a safe single path component (is_safe_name), or None
    where `optional`. Tags and labels become file names: a `/` or `..` would write outside the run folder."""
    if value is None and optional:
        return
    if not is_safe_name(value):
        raise ConfigError(
            f"{name}={shown(value)} must be a plain name (letters, digits, - _ .; at most {NAME_MAX} characters, "
            "not starting with -)",
            field=name,
            hint=f"set {name} to a name such as run1" + (", or leave it unset" if optional else ""),
        )


def check_number(
    value: object,
    name: str,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    integer: bool = False,
    where: str = "",
) -> None:
    """ConfigError naming field `name` unless `value` is a finite number (a whole one, at most INT_MAX in size,
    where `integer`; never a bool) within [low, high] (an end excluded where `*_open`; None = unbounded). Every
    comparison is written so nan and inf fail it. `where` prefixes the message (e.g. "policy stage: ")."""
    if integer:
        # a float such as 2.0 (a programmatic caller's) counts as whole; numpy's integers are Integral
        whole = isinstance(value, numbers.Integral) or (
            isinstance(value, float) and math.isfinite(value) and value.is_integer()
        )
        kind_ok = whole and not isinstance(value, bool) and -INT_MAX <= value <= INT_MAX
        kind = "a whole number" if kind_ok or not whole else f"a whole number within +-{INT_MAX} (int64)"
    else:
        kind_ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
        kind = "a finite number"
    ok = kind_ok
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if ok:
        return
    lo = "" if low is None else f"{'>' if low_open else '>='} {low:g}"
    hi = "" if high is None else f"{'<' if high_open else '<='} {high:g}"
    rule = " and ".join(r for r in (lo, hi) if r)
    # in range words ("must be >= 1") when only the range is broken, as the configs' messages always read
    must = rule if kind_ok else f"{kind} {rule}".strip()
    noun = "a whole number" if integer else "a finite number"
    if low is not None and high is None:
        allowed = f"{noun} above {low:g}" if low_open else f"{noun} of {low:g} or more"
    elif low is not None and high is not None:
        allowed = f"{noun} in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    else:
        allowed = f"{noun}" + (f" {rule}" if rule else "")
    raise ConfigError(
        f"{where}{name}={value} must be {must}", field=name, hint=f"set {name} to {allowed} (docs/config.md)"
    )


def check_bool(value: object, name: str) -> None:
    """ConfigError naming field `name` unless `value` is true or false (not 0/1/2 or a string)."""
    if not isinstance(value, bool):
        raise ConfigError(f"{name}={shown(value)} must be true or false", field=name, hint=f"set {name}=true or false")
