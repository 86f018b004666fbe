"""A stage's key: what it is made of (the config subsets a stage reads, less the fields declared not to change
outputs; its opened inputs' fingerprints; its upstream stages' output digests; its code modules' and input files'
digests), how a recorded key is compared with today's, and the lines that name what changed. The runner
(run/runner.py) decides skip / continue / redo / refuse from these; run.json records `key` = digest(key_parts).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from reproduction.digest_cache import DigestCache
from reproduction.errors import ConfigError
from reproduction.recipe import Recipe, StageSpec
from reproduction.run.config import select


def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def digest(obj: Any) -> str:
    return hashlib.sha256(canonical(obj).encode()).hexdigest()


def module_digest(name: str, digests: DigestCache | None = None) -> str:
    """sha256 of a module's source file, found without importing it (an imported module's file is the one
    find_spec would find: asking the import system costs ~0.2 ms a module, a stage key names several)."""
    origin = getattr(sys.modules.get(name), "__file__", None)
    if origin is None:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):  # a parent package that does not exist, or a malformed name
            spec = None
        if spec is None:
            raise ConfigError(
                f"code module {name!r} a stage declares (StageSpec.code) cannot be found",
                field="code",
                hint="name importable modules whose source the stage's outputs depend on, or fix the recipe's spelling",
            )
        origin = spec.origin
    if not origin or not os.path.isfile(origin):
        return "absent"  # a namespace package or a built-in module: no source to pin
    return (digests or DigestCache()).file(Path(origin))


def _drop(tree: Any, dotted: str) -> None:
    head, _, rest = dotted.partition(".")
    if isinstance(tree, dict) and head in tree:
        if rest:
            _drop(tree[head], rest)
        else:
            del tree[head]


def key_parts(
    spec: StageSpec,
    plain_config: dict[str, Any],
    inputs: dict[str, Any],
    upstream: dict[str, str],
    free: Sequence[str] = (),
    digests: DigestCache | None = None,
) -> dict:
    """The parts of a stage's key (JSON-able); the key is digest(key_parts). `free`: the config's dotted keys declared
    not to change outputs (`output_free_keys(config)`), left out of the subsets that hold them. `digests`: the run's
    digest cache (code and input files)."""
    digests = digests or DigestCache()
    config = _exempt(spec, {k: json.loads(canonical(select(plain_config, k))) for k in spec.config}, free)
    parts = {
        "config": config,
        "inputs": {n: _fingerprint(n, v) for n, v in sorted(inputs.items())} if spec.inputs else {},
        "upstream": {n: upstream[n] for n in spec.needs},
        "code": {m: module_digest(m, digests) for m in spec.code},
    }
    files = input_files(spec, plain_config)
    if spec.files or files:  # only then: the keys of stages that read no file stay as they were
        parts["files"] = {k: _file_digest(v, digests) for k, v in files.items()}
    return parts


def _fingerprint(name: str, opened: Any) -> Any:
    """An opened input's `.fingerprint` (what the stage keys pin of it). ConfigError when the object has none; an
    AttributeError raised inside a fingerprint property propagates as the recipe's own bug."""
    try:
        return opened.fingerprint
    except AttributeError:
        if hasattr(type(opened), "fingerprint"):
            raise
        raise ConfigError(
            f"opened input {name!r} ({type(opened).__name__}) has no fingerprint, so a stage key cannot pin it",
            field="open_inputs",
            hint="give every input the recipe's open_inputs returns a .fingerprint (a digest of its content); "
            "docs/recipes.md shows one",
        ) from None


def declaration_problems(recipe: Recipe, plain: Any) -> list[ConfigError]:
    """Every dotted config key a stage of `recipe` declares (StageSpec.config, files, files_if, training, weights)
    that the run config does not have: a misspelt section would be keyed as None, and a change to the real one
    would then never be seen on --resume. Nothing to check for a config that is not a dict (a recipe run by code
    with an object of its own)."""
    if not isinstance(plain, dict):
        return []
    problems = []
    for spec in recipe.stages:
        declared = [
            ("config", spec.config),
            ("files", spec.files),
            ("files_if", tuple(k for pair in spec.files_if for k in pair)),
            ("training", (spec.training,) if spec.training else ()),
            ("weights", spec.weights),
        ]
        for what, keys in declared:
            for key in keys:
                if not _has_key(plain, key):
                    problems.append(
                        ConfigError(
                            f"recipe {recipe.name}: stage {spec.name} declares {what} key {key!r}, which the run "
                            f"config does not have (its top-level keys: {', '.join(sorted(plain)) or 'none'})",
                            field=f"stages.{spec.name}.{what}",
                            hint="fix the spelling in the recipe's StageSpec, or add the key to its config schema",
                        )
                    )
    return problems


_ABSENT = object()


def _has_key(plain: dict[str, Any], dotted: str) -> bool:
    return select(plain, dotted, _ABSENT) is not _ABSENT


def _exempt(spec: StageSpec, config: dict[str, Any], free: Sequence[str] = ()) -> dict[str, Any]:
    """`config` (the stage's config subsets, {subset: value}) without the keys that do not change its outputs: each
    `free` key inside a subset (a subset that names the key itself reads it on purpose and keeps it), and the
    training step count (`--target-step` raises it); mutated and returned."""
    for dotted in free:
        for k in list(config):
            if dotted.startswith(k + "."):
                _drop(config[k], dotted[len(k) + 1 :])
    if spec.training:
        for k in list(config):
            if spec.training == k:
                config[k] = None
            elif spec.training.startswith(k + "."):
                _drop(config[k], spec.training[len(k) + 1 :])
    return config


def recorded_key_still_matches(
    spec: StageSpec, recorded_parts: dict[str, Any], key: str, free: Sequence[str] = ()
) -> bool:
    """True when key parts recorded before a config key became exempt (e.g. eval.reference, now the compare
    stage's input) give `key` once today's exemptions apply: such a stage is reused, not refused."""
    if not isinstance(recorded_parts.get("config"), dict):
        return False
    parts = json.loads(canonical(recorded_parts))
    parts["config"] = _exempt(spec, parts["config"], free)
    return digest(parts) == key


def input_files(spec: StageSpec, plain_config: dict[str, Any]) -> dict[str, str | None]:
    """{dotted key: path} of the files a stage reads by path (spec.files, and spec.files_if whose condition
    is true); None where the key is unset."""
    out: dict[str, str | None] = {}
    for k in (*spec.files, *(k for k, when in spec.files_if if select(plain_config, when) is True)):
        value = select(plain_config, k)
        out[k] = str(value) if value not in (None, "") else None
    return out


def weight_files(spec: StageSpec, plain_config: dict[str, Any]) -> list[str]:
    """The starting weights a stage initialises from (spec.weights): each section's `pretrained_manifest` and
    the weights files it lists (under `weights_dir`), those that exist. Unset, or an unreadable manifest: the
    manifest alone (the stage itself refuses a manifest it cannot read)."""
    out: list[str] = []
    for section in spec.weights:
        manifest = select(plain_config, f"{section}.pretrained_manifest")
        if manifest in (None, "") or not Path(str(manifest)).is_file():
            continue
        out.append(str(manifest))
        root = Path(str(select(plain_config, f"{section}.weights_dir") or "."))
        try:
            doc = json.loads(Path(str(manifest)).read_text(encoding="utf-8"))
            entries = [f for c in doc.get("components", []) for f in c.get("files", [])]
        except (OSError, ValueError, AttributeError, TypeError):
            continue
        for entry in entries:
            if not isinstance(entry, dict) or entry.get("kind", "weights") != "weights" or not entry.get("path"):
                continue
            path = root / str(entry["path"])
            if path.is_file() and str(path) not in out:
                out.append(str(path))
    return out


def _file_digest(path: str | None, digests: DigestCache) -> str | None:
    if path is None:
        return None
    return digests.file(Path(path)) if Path(path).is_file() else "absent"


def describe_changes(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Human lines naming each differing leaf of two key-part trees."""
    out = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k, "<absent>"), new.get(k, "<absent>")
        where = f"{prefix}{k}"
        if isinstance(a, dict) and isinstance(b, dict):
            out += describe_changes(a, b, where + ".")
        elif a != b:
            out.append(f"{where}: {_short(a)} -> {_short(b)}")
    return out


def _short(v: Any) -> str:
    text = json.dumps(v, default=str) if not isinstance(v, str) else v
    return text[:16] + "..." if len(text) > 40 and len(text) == 64 else (text if len(text) <= 80 else text[:77] + "...")
