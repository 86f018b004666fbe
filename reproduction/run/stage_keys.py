"""A stage's key: what it is made of (the config subsets a stage reads, less the fields declared not to change
outputs; its opened inputs' fingerprints; its upstream stages' output digests; its code modules' and input files'
digests), how a recorded key is compared with today's, and the lines that name what changed. The runner
(run/runner.py) decides skip / continue / redo / refuse from these; run.json records `key` = digest(key_parts).
"""

from __future__ import annotations

import hashlib
import importlib
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
        "code": {m: module_digest(m, digests) if spec.code else _code_digest(m, digests) for m in code_modules(spec)},
        "fn": spec.fn,
    }
    files = input_files(spec, plain_config)
    if spec.files or files:  # only then: the keys of stages that read no file stay as they were
        parts["files"] = {k: _file_digest(v, digests) for k, v in files.items()}
    return parts


def code_modules(spec: StageSpec) -> tuple[str, ...]:
    """The modules whose source is in a stage's key: StageSpec.code, or when it names none the module of the stage
    function (so a recipe that lists no `code` still sees an edit to the function's own module)."""
    return spec.code or (spec.fn.partition(":")[0],)


def _code_digest(module: str, digests: DigestCache) -> str:
    try:
        return module_digest(module, digests)
    except ConfigError:  # the stage function's module, missing: fn_problems names it before a selected stage runs
        return "absent"


def upgrade_parts(spec: StageSpec, recorded: dict[str, Any], today: dict[str, Any]) -> dict[str, Any]:
    """Recorded key parts brought to today's fields (a copy): a record written before the stage function was keyed
    (no `fn` part, and `code` empty when the stage names no code modules, as `code_modules` now defaults it) is taken
    as made by today's function and its module's source, so a run folder written then still resumes without redoing
    its stages; from its next record on both are keyed."""
    parts = json.loads(canonical(recorded))
    if "fn" not in parts and "fn" in today:
        parts["fn"] = today["fn"]
        if not spec.code and parts.get("code") == {}:
            parts["code"] = today.get("code", {})
    return parts


def fn_problems(recipe: Recipe, names: Sequence[str]) -> list[ConfigError]:
    """A ConfigError (exit 4) for each stage of `names` whose function (StageSpec.fn) cannot be found: its module
    not importable-by-name, or no top-level name of that spelling in its source, checked by reading the source and
    importing the module only when the name is not there (a finished --resume of a torch recipe imports no torch).
    Checked before anything runs: a misspelt last stage was found only after the earlier stages had run."""
    problems = []
    for spec in recipe.stages:
        if spec.name not in names:
            continue
        why = _unloadable(spec.fn)
        if why:
            problems.append(
                ConfigError(
                    f"recipe {recipe.name}: stage {spec.name}'s function {spec.fn!r} cannot be loaded: {why}",
                    field=f"stages.{spec.name}.fn",
                    hint="fix the spelling of the StageSpec's fn ('module:function', the module importable from the "
                    "config's environment)",
                )
            )
    return problems


def headline_problems(recipe: Recipe) -> list[ConfigError]:
    """A ConfigError (exit 4) when the recipe's headline (Recipe.headline) names no function that can be found,
    checked as fn_problems checks a stage's function, before anything runs: a misspelt one was found only after
    every stage had run, as a warning line, and the run printed no headline. (One that raises when called stays a
    warning: the run is complete by then.)"""
    # imported, not read from source: the run calls it at its end anyway, and a module in sys.modules is a dict
    # lookup on every later run in this process (parsing compare_cmd's source was ~2 ms a run: bench/run_overhead)
    why = _unloadable(recipe.headline, read_source=False) if recipe.headline else None
    if not why:
        return []
    return [
        ConfigError(
            f"recipe {recipe.name}: its headline {recipe.headline!r} cannot be loaded: {why}",
            field="headline",
            hint="fix the spelling of the Recipe's headline ('module:function' taking the run folder), or leave it "
            "None for no headline",
        )
    ]


def _unloadable(ref: Any, *, read_source: bool = True) -> str | None:
    """Why the "module:function" reference `ref` names no function (None when it does): a module not imported yet is
    read from its source when that defines the name (no import: a finished --resume of a torch recipe imports no
    torch; `read_source=False` imports it at once), else imported and the name looked up."""
    module, _, attr = ref.partition(":") if isinstance(ref, str) else ("", "", "")
    if not module or not attr:
        return "it is not a 'module:function' reference"
    if read_source and module not in sys.modules and _defines(module, attr):
        return None
    try:
        fn = getattr(importlib.import_module(module), attr)
    except ImportError as exc:
        return f"module {module!r} cannot be imported ({exc})"
    except AttributeError:
        return f"module {module!r} has no attribute {attr!r}"
    return None if callable(fn) else f"{module}.{attr} is a {type(fn).__name__}, not a function"


def _defines(module: str, attr: str) -> bool:
    """True when `module`'s source (found without importing it, when not imported yet) defines or imports `attr` at
    its top level; False when it does not seem to (then the caller imports it to be sure)."""
    import ast

    loaded = sys.modules.get(module)
    if loaded is not None:
        return hasattr(loaded, attr)
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return False
    if spec is None or not spec.origin or not os.path.isfile(spec.origin) or not spec.origin.endswith(".py"):
        return False
    try:
        tree = ast.parse(Path(spec.origin).read_bytes())
    except (OSError, SyntaxError, ValueError):
        return False
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == attr:
            return True
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and any(
            isinstance(t, ast.Name) and t.id == attr for t in targets
        ):
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
            (a.asname or a.name.split(".")[0]) == attr for a in node.names
        ):
            return True
    return False


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
    spec: StageSpec,
    recorded_parts: dict[str, Any],
    key: str,
    free: Sequence[str] = (),
    today: dict[str, Any] | None = None,
) -> bool:
    """True when key parts recorded before a config key became exempt (e.g. eval.reference, now the compare
    stage's input), or before the stage function was keyed (`upgrade_parts`, given today's parts `today`), give
    `key` once today's exemptions apply: such a stage is reused, not refused."""
    if not isinstance(recorded_parts.get("config"), dict):
        return False
    parts = upgrade_parts(spec, recorded_parts, today or {})
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
