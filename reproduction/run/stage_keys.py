"""A stage's key: what it is made of (the config subsets a stage reads, less the fields declared not to change
outputs; its opened inputs' fingerprints; its upstream stages' output digests; its code modules' and input files'
digests), how a recorded key is compared with today's, and the lines that name what changed. The runner
(run/runner.py) decides skip / continue / redo / refuse from these; run.json records `key` = digest(key_parts).
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import json
import os
import sys
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reproduction.config_fields import unrecorded_filled
from reproduction.digest_cache import DigestCache
from reproduction.digests import canonical_json as canonical
from reproduction.digests import json_sha256 as digest
from reproduction.errors import (
    MISSING_ERRNOS,
    ConfigError,
    InputNotFoundError,
    PortableError,
    ReadFailedError,
    StageKeyChangedError,
    errno_of,
)
from reproduction.recipe import Recipe, StageSpec, import_failure
from reproduction.run.config import as_recorded, select
from reproduction.run.resolve import import_problem
from reproduction.run.stage_call import ASYNC_STAGE, module_dependency, signature_problem, uncallable_error

_LOCATED: weakref.WeakKeyDictionary[DigestCache, dict[str, tuple[Any, Any] | None]] = weakref.WeakKeyDictionary()
"""Per run (its digest cache): module name -> where `_locate` found it."""


def _locate(name: str, digests: DigestCache | None = None) -> tuple[Any, Any] | None:
    """(source file, package folders or None) of module `name`, found without importing it; None when it cannot be
    found. An imported module's are the ones find_spec would find; the others are asked of the import system once per
    run (~50 us a module): fn_problems checks a stage's code modules before anything runs, and the key digests them."""
    loaded = sys.modules.get(name)
    if loaded is not None:
        return getattr(loaded, "__file__", None), getattr(loaded, "__path__", None)
    memo = _LOCATED.setdefault(digests, {}) if digests is not None else {}
    if name not in memo:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):  # a parent package that does not exist, or a malformed name
            spec = None
        memo[name] = None if spec is None else (spec.origin, spec.submodule_search_locations)
    return memo[name]


def module_digest(name: str, digests: DigestCache | None = None, *, whole_package: bool = True) -> str:
    """sha256 of a module's source file, found without importing it (`_locate`). A package's is the digest of every
    .py file under its folder(s), by path relative to them, sorted (`package_digest`): its `__init__.py` alone, often
    empty, pinned nothing of the modules a recipe meant by naming its package in StageSpec.code. With
    `whole_package` False a package is its `__init__.py`, as the module a stage function is defined in (its
    function's source is there; the package's other modules are keyed when `code` names them)."""
    digests = digests or DigestCache()
    found = _locate(name, digests)
    if found is None:
        raise ConfigError(
            f"code module {name!r} a stage declares (StageSpec.code) cannot be found",
            field="code",
            hint="name importable modules whose source the stage's outputs depend on, or fix the recipe's spelling",
        )
    origin, folders = found
    if folders is not None and whole_package:
        return package_digest([Path(f) for f in folders], digests)
    if not origin or not os.path.isfile(origin):
        return "absent"  # a built-in module: no source to pin
    return digests.file(Path(origin))


def package_digest(folders: Sequence[Path], digests: DigestCache) -> str:
    """The digest of a package's source: {path relative to its folder: sha256} of every .py file under `folders`
    (a namespace package may have several; __pycache__ and hidden folders skipped), sorted. Links are not followed
    into folders, so a link out of the package pins nothing beyond it."""
    found: dict[str, Path] = {}
    for folder in folders:
        for root, dirs, names in os.walk(folder):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
            for n in names:
                if n.endswith(".py"):
                    found.setdefault(os.path.relpath(os.path.join(root, n), folder), Path(root, n))
    shas = digests.files(found.values())
    return digest({rel: shas[path] for rel, path in sorted(found.items())})


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
    codes = code_modules(spec)
    # the subsets as run.json records the config (an Enum by name, a literal `${` escaped: audit62 B7)
    config = exempt(spec, {k: json.loads(canonical(as_recorded(select(plain_config, k)))) for k in spec.config}, free)
    parts = {
        "config": config,
        "inputs": {n: _fingerprint(n, v, spec, plain_config) for n, v in sorted(inputs.items())} if spec.inputs else {},
        "upstream": {n: upstream[n] for n in spec.needs},
        "code": {m: module_digest(m, digests) if m in spec.code else _code_digest(m, digests) for m in codes},
        "fn": spec.fn,
    }
    files = input_files(spec, plain_config)
    if spec.files or files:  # only then: the keys of stages that read no file stay as they were
        parts["files"] = {k: _file_digest(v, digests) for k, v in files.items()}
    return parts


def fn_module(spec: StageSpec) -> str:
    """The module of a stage's function (StageSpec.fn's part before the colon)."""
    return spec.fn.partition(":")[0]


def code_modules(spec: StageSpec) -> tuple[str, ...]:
    """The modules whose source is in a stage's key: the module of the stage function, always (so an edit to the
    function's own module is seen), then those StageSpec.code names. Until audit50_B a stage naming `code` keyed only
    those: one naming its recipe's package keyed its empty `__init__.py`, and an edit to the function went unseen."""
    return tuple(dict.fromkeys((fn_module(spec), *spec.code)))


def _code_digest(module: str, digests: DigestCache) -> str:
    """The digest of the module a stage function is defined in (a package: its `__init__.py`), "absent" when missing."""
    try:
        return module_digest(module, digests, whole_package=False)
    except ConfigError:  # the stage function's module, missing: fn_problems names it before a selected stage runs
        return "absent"


def upgrade_parts(
    spec: StageSpec, recorded: dict[str, Any], today: dict[str, Any], ran_with: Any = None
) -> dict[str, Any]:
    """Recorded key parts brought to today's fields (a copy), so a run folder written before a field was keyed still
    resumes without redoing its stages, and from its next record on the field is keyed: a record without the stage
    function's reference (no `fn` part, and `code` empty when the stage names no code modules) is taken as made by
    today's function and its module's source; a record of a stage naming `code` whose `code` part holds exactly
    those modules (written before the function's own module was always keyed, `code_modules`) is taken as made by
    today's source of the function's module; a package `code` names recorded by its `__init__.py` alone (before a
    package was keyed whole), where that file is unchanged, is taken as made by today's package; a config key today's
    parts hold and the record lacks is filled in from `ran_with` (`unkeyed_filled`)."""
    parts = json.loads(canonical(recorded))
    if isinstance(parts.get("config"), dict) and isinstance(today.get("config"), dict):
        parts["config"] = unkeyed_filled(parts["config"], today["config"], ran_with, stage=spec.name)
    if "fn" not in parts and "fn" in today:
        parts["fn"] = today["fn"]
        if not spec.code and parts.get("code") == {}:
            parts["code"] = today.get("code", {})
    code, module, now = parts.get("code"), fn_module(spec), today.get("code", {})
    if spec.code and module not in spec.code and isinstance(code, dict) and set(code) == set(spec.code):
        if module in now:
            code[module] = now[module]
    if isinstance(code, dict):
        for m in spec.code:
            if m in code and m in now and code[m] != now[m] and code[m] == _init_digest(m):
                code[m] = now[m]
    return parts


@dataclass(frozen=True)
class Untold:
    """`ran_with` of a stage whose record does not say which config it ran with (`stage_decide.ran_with_config`);
    `why`: what a refusal says of it, after "it was recorded before config <field> was keyed, and "."""

    why: str


UNTOLD: Any = Untold(
    "the value it ran with cannot be told (run.json's config is a later invocation's, and its lineage statement is "
    "missing or another config's)"
)
"""run.json's `config` is another invocation's and the stage's statement is gone or another config's."""


def unkeyed_filled(
    recorded: dict[str, Any], today: dict[str, Any], ran_with: Any, prefix: str = "", *, stage: str = ""
) -> dict[str, Any]:
    """The recorded config key parts `recorded` with each key that today's (`today`) hold and they lack filled in
    (a copy) by the one rule for a field keyed after the record was written (`config_fields.unrecorded_filled`): a
    field that entered the key later (`train.micro_batch`, audit56 D1) takes its value in `ran_with`, the config
    the stage provably ran with (`stage_decide.ran_with_config`), so the same value resumes and another is still
    refused naming both (exit 52, audit56 R1); a key it lacks is left absent (the field did not exist then). With
    UNTOLD the value cannot be told: StageKeyChangedError (exit 52) naming the field and `--restart-stage`; run.json's
    `config` is the latest invocation's, and filling from it accepted another value and recorded it (audit56 review2
    S1). None fills nothing (as before)."""
    if ran_with is None:
        return recorded
    filled, untold = unrecorded_filled(
        recorded, today, None if isinstance(ran_with, Untold) else ran_with, prefix=prefix
    )
    if untold:
        raise StageKeyChangedError(
            f"stage {stage}: it was recorded before config {untold[0]} was keyed, and {ran_with.why}",
            stage=stage,
            changes=[f"config.{k}: <not recorded>" for k in untold],
            hint=f"pass --restart-stage {stage} to redo it (and what follows)",
        )
    return filled


def _init_digest(package: str) -> str | None:
    """The digest of a package's `__init__.py` (how a package in StageSpec.code was keyed until audit50), None for a
    module that is no package or cannot be found. Read only where a recorded key differs from today's."""
    found = _locate(package)
    if found is None or found[1] is None:
        return None
    return module_digest(package, whole_package=False)


def fn_problems(
    recipe: Recipe,
    names: Sequence[str],
    digests: DigestCache | None = None,
    *,
    unfinished: Sequence[str] = (),
    failed: set[str] | None = None,
) -> list[PortableError]:
    """For each stage of `names`: a ConfigError (exit 4) when its function (StageSpec.fn) cannot be found (its module
    not importable-by-name, or no top-level name of that spelling in its source, checked by reading the source and
    importing the module only when the name is not there: a finished --resume of a torch recipe imports no torch) or
    a `code` module cannot be; a StageProtocolError (exit 54) when the function cannot be called as fn(ctx) (read
    from its signature, or from its `def` when the module is not imported: `stage_call.signature_problem`), or is an
    async def. Checked before anything runs: a misspelt last stage was found only after the earlier stages had run,
    and a function of another signature was "internal error: TypeError" (audit50_B F4). `digests`: the run's digest
    cache (a code module is then looked up once per run). For the stages of `unfinished` (those the run will call,
    not complete in the run folder), a MissingDependencyError (exit 10) when the function's module imports at its top
    level a package that is not installed (`_dependency_problem`); a complete stage's is not asked for, so a finished
    --resume needs none of its stages' packages. A module that cannot be imported for its own fault (a SyntaxError,
    an exception at its top level: `import_failure`, exit 4 naming the file and line) or for a package it imports is
    one problem however many stages (and the recipe's open_inputs) it holds: `failed` collects the modules reported
    (shared with headline_problems); the same problem five times was exit 56 without the install hint (audit65_B L1)."""
    problems: list[PortableError] = []
    code: list[tuple[str, str]] = []  # (a `code` module, the stage declaring it)
    failed = set() if failed is None else failed
    for spec in recipe.stages:
        if spec.name not in names:
            continue
        why = _unloadable(spec.fn)
        if isinstance(why, BaseException) or fn_module(spec) in failed:
            module = fn_module(spec)
            if module not in failed and isinstance(why, BaseException):
                failed.add(module)
                problems.append(
                    _module_problem(module, why, f"recipe {recipe.name}: stage {spec.name}'s module {module!r}", spec)
                )
            code += [(m, spec.name) for m in spec.code]
            continue
        dependency = (
            _dependency_problem(spec, recipe.name, suspect=bool(why), digests=digests)
            if why or spec.name in unfinished  # one that cannot be loaded is refused anyway: with the right code
            else None
        )
        if dependency is not None:
            failed.add(fn_module(spec))
            problems.append(dependency)
        elif why:
            problems.append(
                ConfigError(
                    f"recipe {recipe.name}: stage {spec.name}'s function {spec.fn!r} cannot be loaded: {why}",
                    field=f"stages.{spec.name}.fn",
                    hint="fix the spelling of the StageSpec's fn ('module:function', the module importable from the "
                    "config's environment)",
                )
            )
        elif why := _uncallable(spec.fn):
            problems.append(uncallable_error(recipe.name, spec, why))
        code += [(m, spec.name) for m in spec.code]
    declared: dict[str, list[str]] = {}
    for m, stage in code:
        declared.setdefault(m, []).append(stage)
    problems += [  # one per module, naming every stage declaring it (a recipe's shared CODE tuple misspelt)
        ConfigError(
            f"recipe {recipe.name}: stage{'s' if len(stages) > 1 else ''} {', '.join(stages)} "
            f"declare{'' if len(stages) > 1 else 's'} code module {m!r}, which cannot be found",
            field=f"stages.{stages[0]}.code",
            hint="name importable modules whose source the stage's outputs depend on, or fix the spelling",
        )
        for m, stages in declared.items()
        if _locate(m, digests) is None
    ]
    return problems


def _module_problem(module: str, exc: BaseException, who: str, spec: StageSpec | None = None) -> PortableError:
    """The error for importing `module` (`who` names it) failing with `exc`, its own failure (`_unloadable`): a
    package it imports not installed (exit 10) or a misspelt submodule (exit 4), as for a recipe module; an error of
    ours raised there as it is; anything else its code raised, a SyntaxError included, exit 4 naming the file and
    line (`import_failure`)."""
    field = f"stages.{spec.name}.fn" if spec is not None else who
    if isinstance(exc, PortableError):
        return exc
    if isinstance(exc, ModuleNotFoundError):
        problem = import_problem(module, exc, who, field=field)
        if problem is not None:
            return problem
    return import_failure(module, exc, who, field=field)


def _dependency_problem(
    spec: StageSpec, recipe: str, *, suspect: bool = False, digests: DigestCache | None = None
) -> PortableError | None:
    """The MissingDependencyError (exit 10) for a stage whose function's module imports, at its top level, a package
    that is not installed (a misspelt submodule: a ConfigError), found before any stage runs; None otherwise. The
    module is imported only when it could not be loaded (`suspect`) or its source imports a top-level package the
    import system cannot find (it may extend sys.path first: the import decides), so a --resume of a torch recipe
    still imports no torch. Until audit54 A7 this was exit 4 "fix the spelling", after the stages before it ran."""
    module = fn_module(spec)
    if module in sys.modules or not (suspect or _imports_missing(module, digests)):
        return None
    try:
        module_dependency(spec, recipe)
    except PortableError as exc:
        return exc
    except Exception:  # noqa: BLE001 - the module's own failure: the stage's call reports it, with its traceback
        return None
    return None


def _imports_missing(module: str, digests: DigestCache | None) -> bool:
    """True when a top-level `import X` / `from X import ...` of `module`'s source (read, not imported) names a
    top-level package the import system cannot find; imports inside a try, an if or a function are not read."""
    for node in _source_body(module):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        if any(_locate(n.partition(".")[0], digests) is None for n in names):
            return True
    return False


def _uncallable(ref: str) -> str | None:
    """Why the function `ref` names cannot be called as fn(ctx) (None when it can, or when that cannot be told
    without importing its module: a decorated def, a name bound by assignment; the call then checks it)."""
    module, _, attr = ref.partition(":")
    loaded = sys.modules.get(module)
    if loaded is not None:
        return signature_problem(getattr(loaded, attr))
    node = _definition(module, attr)
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.decorator_list:
        return None
    if isinstance(node, ast.AsyncFunctionDef):
        return ASYNC_STAGE
    args = node.args
    positional = [*args.posonlyargs, *args.args]
    if not positional and args.vararg is None:
        return "too many positional arguments"
    required = [a.arg for a in positional[1 : len(positional) - len(args.defaults)]]
    required += [a.arg for a, default in zip(args.kwonlyargs, args.kw_defaults) if default is None]
    return f"missing a required argument: {required[0]!r}" if required else None


def headline_problems(
    recipe: Recipe, *, open_inputs: bool = False, failed: set[str] | None = None
) -> list[PortableError]:
    """A ConfigError (exit 4) when the recipe's headline (Recipe.headline), or with `open_inputs` its open_inputs
    (the run calls it: no inputs were given), names no function that can be found, checked as fn_problems checks a
    stage's function, before anything runs: a misspelt headline was found only after every stage had run, as a warning
    line, and the run printed no headline; a misspelt open_inputs left a run folder holding only its lock. (One that
    raises when called stays a warning: the run is complete by then.) An out-of-tree recipe's report likewise, read
    from its module's source (a misspelt one was a warning after every stage had run, each --resume again: audit65_B
    L3). A module that fails to import for its own fault
    is `_module_problem`'s error, once per module (`failed`, as fn_problems)."""
    # imported, not read from source: the run calls them anyway, and a module in sys.modules is a dict lookup on
    # every later run in this process (parsing compare_cmd's source was ~2 ms a run: bench/run_overhead)
    refs = [("headline", recipe.headline, "the run folder"), ("open_inputs", recipe.open_inputs, "the run config")]
    problems: list[PortableError] = []
    failed = set() if failed is None else failed
    chosen = refs if open_inputs else refs[:1]
    if isinstance(recipe.report, str) and not recipe.report.startswith("reproduction."):  # read, not imported
        chosen = [*chosen, ("report", recipe.report, "the run folder")]  # (built-ins' are tested: no parse a run)
    for what, ref, takes in chosen:
        why = _unloadable(ref, read_source=what == "report") if ref else None
        if isinstance(why, BaseException):
            module = ref.partition(":")[0]
            if module not in failed:
                failed.add(module)
                problems.append(_module_problem(module, why, f"recipe {recipe.name}: {what} module {module!r}"))
        elif why:
            problems.append(
                ConfigError(
                    f"recipe {recipe.name}: its {what} {ref!r} cannot be loaded: {why}",
                    field=what,
                    hint=f"fix the spelling of the Recipe's {what} ('module:function' taking {takes})"
                    + (", or leave it None for no headline" if what == "headline" else ""),
                )
            )
    return problems


def _unloadable(ref: Any, *, read_source: bool = True) -> str | BaseException | None:
    """Why the "module:function" reference `ref` names no function (None when it does): a module not imported yet is
    read from its source when that defines the name (no import: a finished --resume of a torch recipe imports no
    torch; `read_source=False` imports it at once), else imported and the name looked up. A str is a spelling (no
    such module or name); the exception the import raised when the module is there but its own code failed (a
    SyntaxError, which its source could not be read past, a package it imports not installed, a NameError at its top
    level): `_module_problem` words it. A SyntaxError escaped as "internal error", exit 1 (audit65_B H1)."""
    module, _, attr = ref.partition(":") if isinstance(ref, str) else ("", "", "")
    if not module or not attr:
        return "it is not a 'module:function' reference"
    if read_source and module not in sys.modules and _defines(module, attr):
        return None
    try:
        loaded = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        parents = {".".join(module.split(".")[: i + 1]) for i in range(module.count(".") + 1)}
        return exc if exc.name and exc.name not in parents else f"module {module!r} cannot be imported ({exc})"
    except Exception as exc:  # noqa: BLE001 - the module's own code failed: named with its file and line
        return exc
    try:
        fn = getattr(loaded, attr)
    except AttributeError:
        return f"module {module!r} has no attribute {attr!r}"
    return None if callable(fn) else f"{module}.{attr} is a {type(fn).__name__}, not a function"


def _defines(module: str, attr: str) -> bool:
    """True when `module`'s source (found without importing it, when not imported yet) defines or imports `attr` at
    its top level; False when it does not seem to (then the caller imports it to be sure)."""
    loaded = sys.modules.get(module)
    if loaded is not None:
        return hasattr(loaded, attr)
    return _definition(module, attr) is not None


def _definition(module: str, attr: str) -> ast.stmt | None:
    """The last top-level statement of `module`'s source (found without importing it) that defines or imports `attr`
    (a def rebound below, `f = wrap(f)`, is what the name holds: its signature is not the def's); None when there
    seems to be none or the source cannot be read."""
    found = None
    for node in _source_body(module):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == attr:
            found = node
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and any(
            isinstance(t, ast.Name) and t.id == attr for t in targets
        ):
            found = node
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
            (a.asname or a.name.split(".")[0]) == attr for a in node.names
        ):
            found = node
    return found


def _source_body(module: str) -> tuple[ast.stmt, ...]:
    """The top-level statements of `module`'s .py source, found without importing it; () when it cannot be read."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return ()
    if spec is None or not spec.origin or not os.path.isfile(spec.origin) or not spec.origin.endswith(".py"):
        return ()
    try:
        st = os.stat(spec.origin)
        return _top_level(spec.origin, st.st_size, st.st_mtime_ns)
    except (OSError, SyntaxError, ValueError):
        return ()


@functools.lru_cache(maxsize=64)
def _top_level(origin: str, size: int, mtime_ns: int) -> tuple[ast.stmt, ...]:
    """The top-level statements of the source file `origin` as it is at (size, mtime_ns): parsed once for the check
    that the function exists and the check of its signature (fn_problems), and once per edit."""
    return tuple(ast.parse(Path(origin).read_bytes()).body)


def _fingerprint(name: str, opened: Any, spec: StageSpec | None = None, plain: Any = None) -> str:
    """An opened input's `.fingerprint` (what the stage keys pin of it). ConfigError when the object has none or it is
    no non-empty str; an AttributeError raised inside a fingerprint property propagates as the recipe's own bug; an
    OSError raised by it (docs/recipes.md's DataFile reading a path that is not there) is InputNotFoundError /
    ReadFailedError (exit 3) naming the stage `spec` being keyed, the input, the config key of `plain` that holds the
    path (when one does) and the path: it was exit 1 "code of yours", with the stage unrecorded (audit60_B B3)."""
    hint = (
        "give every input the recipe's open_inputs returns a .fingerprint (a str digest of its content); "
        "docs/recipes.md shows one"
    )
    try:
        value = opened.fingerprint
    except OSError as exc:
        raise _unreadable_input(name, exc, spec, plain) from None
    except AttributeError:
        if hasattr(type(opened), "fingerprint"):
            raise
        raise ConfigError(
            f"opened input {name!r} ({type(opened).__name__}) has no fingerprint, so a stage key cannot pin it",
            field="open_inputs",
            hint=hint,
        ) from None
    if not isinstance(value, str) or not value:  # None pinned nothing; bytes were keyed as their repr (audit50_B F11)
        raise ConfigError(
            f"opened input {name!r} ({type(opened).__name__}) has fingerprint {type(value).__name__} {value!r:.40}, "
            "not a non-empty str, so a stage key cannot pin it",
            field="open_inputs",
            hint=hint,
        )
    return value


def _unreadable_input(name: str, exc: OSError, spec: StageSpec | None, plain: Any) -> PortableError:
    """The exit-3 error for input `name` whose fingerprint raised `exc` (see _fingerprint)."""
    path = exc.filename
    key = _key_holding(plain, str(path)) if path is not None else None
    who = f"stage {spec.name}: " if spec is not None else ""
    where = f" {str(path)!r}" + (f" (config key {key})" if key else "") if path is not None else ""
    reason = exc.strerror or str(exc) or type(exc).__name__
    missing = errno_of(exc) in MISSING_ERRNOS
    fix = f"set {key} to an existing path" if key else "fix the path the recipe's open_inputs opens"
    then = f"then `portable run ... --resume` runs stage {spec.name}" if spec is not None else "then run again"
    message = f"{who}opened input {name!r} cannot be fingerprinted: {reason}" + (f":{where}" if where else "")
    cls = InputNotFoundError if missing else ReadFailedError
    return cls(message, path=path, field=key or "open_inputs", stage=spec.name if spec else None, hint=f"{fix}, {then}")


def _key_holding(plain: Any, path: str, prefix: str = "") -> str | None:
    """The first dotted key of the plain config whose str value is `path` (or resolves to it), else None."""
    if not isinstance(plain, dict):
        return None
    for k, v in plain.items():
        dotted = f"{prefix}{k}"
        if isinstance(v, str) and v and (v == path or os.path.abspath(v) == os.path.abspath(path)):
            return dotted
        found = _key_holding(v, path, f"{dotted}.")
        if found:
            return found
    return None


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
                elif what == "training":
                    problems += _training_problem(recipe, spec, select(plain, key))
    return problems


def _training_problem(recipe: Recipe, spec: StageSpec, value: Any) -> list[ConfigError]:
    """A ConfigError when the stage's `training` key holds no integer step count (or a negative one: audit65_B L7,
    recorded complete at step 0): the key is left out of the stage's
    key (`--target-step` raises it), so one naming a section left the whole section out, and a changed learning rate
    was skipped on --resume (audit50_B F1); one naming a str field made a raised count mean nothing."""
    if isinstance(value, int) and not isinstance(value, bool) and value < 0:  # recorded complete at step 0 (L7)
        return [
            ConfigError(
                f"config key `{spec.training}` is {value}: it is stage {spec.name}'s step count (StageSpec.training "
                f"of recipe {recipe.name}), which cannot be negative",
                field=spec.training,
                hint=f"set {spec.training} to the number of steps to train (>= 0)",
            )
        ]
    if isinstance(value, int) and not isinstance(value, bool):
        return []
    what = "a section" if isinstance(value, dict) else f"{type(value).__name__} {value!r:.40}"
    return [
        ConfigError(
            f"recipe {recipe.name}: stage {spec.name} declares training key {spec.training!r}, which is {what}, not "
            "an integer step count",
            field=f"stages.{spec.name}.training",
            hint="set StageSpec.training to the dotted path of the stage's integer step count (e.g. 'train.steps'), "
            "and list its section in config",
        )
    ]


_ABSENT = object()


def _has_key(plain: dict[str, Any], dotted: str) -> bool:
    return select(plain, dotted, _ABSENT) is not _ABSENT


def exempt(spec: StageSpec, config: dict[str, Any], free: Sequence[str] = ()) -> dict[str, Any]:
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
    ran_with: Any = None,
) -> bool:
    """True when key parts recorded before a config key became exempt (e.g. eval.reference, now the compare
    stage's input), or before the stage function was keyed (`upgrade_parts`, given today's parts `today`), give
    `key` once today's exemptions apply, or before a config key was keyed (`unkeyed_filled`, from `ran_with`): such a
    stage is reused, not refused."""
    if not isinstance(recorded_parts.get("config"), dict):
        return False
    parts = upgrade_parts(spec, recorded_parts, today or {}, ran_with)
    parts["config"] = exempt(spec, parts["config"], free)
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
    """A `files` value's digest: a file's sha256 (the bytes keyed since files were), a folder's tree digest (as
    lineage records it; until audit54 A3 a folder was "absent" and a change to it never seen), None when unset;
    "absent" for a path that does not exist (`missing_file_problems` refuses that before a selected stage runs)."""
    if path is None:
        return None
    if Path(path).is_file():
        return digests.file(Path(path))
    return digests.tree(Path(path))[0] if Path(path).is_dir() else "absent"


def missing_file_problems(recipe: Recipe, names: Sequence[str], plain: Any) -> list[InputNotFoundError]:
    """An InputNotFoundError (exit 3) for each path a stage of `names` reads by config key (StageSpec.files, and
    files_if whose condition holds) that is neither a file nor a folder; an unset (None or "") value is the stage's
    to handle, a `/path/to/` placeholder the generic preflight's. Checked before anything runs: such a path was keyed
    "absent", and its run accepted (audit54 A3)."""
    from reproduction.run.preflight import PLACEHOLDER  # a `/path/to/` value: the generic preflight names it

    if not isinstance(plain, dict):
        return []
    problems = []
    for spec in recipe.stages:
        if spec.name not in names:
            continue
        for key, path in input_files(spec, plain).items():
            if path is not None and PLACEHOLDER not in path and not os.path.exists(path):
                problems.append(
                    InputNotFoundError(
                        f"recipe {recipe.name}: stage {spec.name} reads {key}={path!r}, which does not exist",
                        path=path,
                        field=key,
                        hint=f"set {key} to the path the stage reads (a path relative to the current directory, "
                        "or absolute)",
                    )
                )
    return problems


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
