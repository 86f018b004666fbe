"""A recipe by name: `recap` is reproduction.recipes.recap's RECIPE; `package.module:NAME` any importable Recipe.

run/ imports no recipe: the name comes from the run config (`recipe:`, absent = recap) or from run.json, and
the module is imported here by that name, so an out-of-tree recipe runs with `portable run` like a built-in one.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pkgutil
import re
import sys
from pathlib import Path
from typing import Any

from reproduction.errors import ConfigError, MissingDependencyError, PortableError
from reproduction.recipe import Recipe, a_kind, import_failure, resolve_fn

BUILTIN_PACKAGE = "reproduction.recipes"
"""Built-in recipes: reproduction/recipes/<name>/ exporting RECIPE."""
_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def builtin_names() -> list[str]:
    """The built-in recipes' names (the packages under reproduction/recipes/)."""
    try:
        package = importlib.import_module(BUILTIN_PACKAGE)
    except ImportError:  # pragma: no cover - a build without recipes
        return []
    return sorted(m.name for m in pkgutil.iter_modules(package.__path__) if m.ispkg)


def resolve_recipe(name: str) -> Recipe:
    """The Recipe named `name`. ConfigError (one line naming `recipe` and the value) when the name is malformed,
    unknown, its module fails to import, or the attribute is not a Recipe."""
    module, sep, attr = name.partition(":")
    if not sep:
        module, attr = f"{BUILTIN_PACKAGE}.{name}", "RECIPE"
    known = ", ".join(builtin_names()) or "none"
    if not _DOTTED.match(module) or not attr.isidentifier():
        raise ConfigError(
            f"recipe: {name!r} is neither a built-in recipe nor package.module:NAME",
            field="recipe",
            hint=f"built-in recipes: {known}; or write recipe: package.module:RECIPE",
        )
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        problem = import_problem(module, exc, f"recipe: {name!r}", field="recipe")
        builtin = (exc.name or "").startswith(BUILTIN_PACKAGE)
        if problem is not None and not (builtin and isinstance(problem, MissingDependencyError)):
            raise problem from None
        if not sep and (exc.name == BUILTIN_PACKAGE or module.startswith(f"{exc.name}.") or exc.name == module):
            # `aud.r` (the colon forgotten) was looked up as reproduction.recipes.aud: naming that internal module
            # said nothing of what to write (audit54 A8)
            example = f" (e.g. {_colon_for_dot(name)})" if "." in name else ""
            raise ConfigError(
                f"recipe: {name!r} is not a built-in recipe (built-in recipes: {known})",
                field="recipe",
                hint=f"name a built-in recipe, or an out-of-tree one as package.module:ATTRIBUTE{example}, its "
                "package importable (PYTHONPATH)",
            ) from None
        top = (exc.name or module).split(".")[0]
        here = [Path.cwd() / top, Path.cwd() / f"{top}.py"]
        where = ""
        if any(p.exists() for p in here) and not {"", os.getcwd()} & set(sys.path):
            # `portable` is a console script: the current folder is not on sys.path, as it is for `python -m`
            where = f"; {top} is in the current folder, which is not searched: run with PYTHONPATH={os.getcwd()}"
        raise ConfigError(
            f"recipe: {name!r} cannot be imported: {_line(exc)}",
            field="recipe",
            hint=f"built-in recipes: {known}; an out-of-tree recipe's package must be importable (PYTHONPATH){where}",
        ) from None
    except ConfigError as exc:  # a Recipe built wrong (a str for a tuple, a duplicate stage): its own hint
        raise ConfigError(
            f"recipe: {name!r} cannot be imported: {exc.message}",
            field=exc.fields.get("field") or "recipe",
            hint=exc.hint or "fix the recipe module",
        ) from None
    except Exception as exc:  # the recipe module's own code failed: one line, the recipe, the file and line named
        raise import_failure(module, exc, f"recipe: {name!r}", field="recipe") from None  # audit65_B L5: no line was
    except SystemExit as exc:  # named, and the hint said python -c 'import ...' with the module left out
        raise ConfigError(
            f"recipe: {name!r} cannot be imported: {type(exc).__name__}: {_line(exc)}",
            field="recipe",
            hint="fix the recipe module (run it with python -c 'import ...' to see the traceback)",
        ) from None
    obj = getattr(mod, attr, None)
    if not isinstance(obj, Recipe):
        got = "nothing" if obj is None else a_kind(type(obj).__name__)
        raise ConfigError(
            f"recipe: {name!r} names {got}, not a Recipe (reproduction.recipe.Recipe)",
            field="recipe",
            hint=_recipe_attributes_hint(mod, module),
        )
    return obj


def _colon_for_dot(name: str) -> str:
    """The reference to suggest for a `recipe:` written without its colon: `pkg.mod:ATTR` when `pkg.mod` imports and
    its ATTR holds a Recipe (a dot for the colon: `pkg.mod.ATTR`, whose suggested `pkg.mod.ATTR:RECIPE` failed,
    audit65_B L2), else `NAME:RECIPE`."""
    module, _, attr = name.rpartition(".")
    try:
        found = isinstance(getattr(importlib.import_module(module), attr, None), Recipe)
    except Exception:  # noqa: BLE001 - only a suggestion: the module's own failure is named when it is referenced
        found = False
    return f"{module}:{attr}" if found else f"{name}:RECIPE"


def _recipe_attributes_hint(mod: Any, module: str) -> str:
    """What to write instead of a reference that names no Recipe: the module's attributes holding one (the hint
    repeated the failing value, audit54 A8)."""
    found = sorted(k for k, v in vars(mod).items() if isinstance(v, Recipe) and not k.startswith("_"))
    if found:
        return f"point recipe at one of the module's Recipes: {', '.join(f'{module}:{k}' for k in found)}"
    return f"module {module!r} holds no Recipe: point recipe at package.module:ATTRIBUTE where ATTRIBUTE is a Recipe"


def import_problem(module: str, exc: ModuleNotFoundError, who: str, *, field: str) -> PortableError | None:
    """The error for importing `module` failing with `exc` where a module it imports is the one not found (`who`
    names what imported it): MissingDependencyError (exit 10) naming the package with an install hint, or a
    ConfigError (exit 4) when that is a misspelt submodule of a package that can be imported. None when `module`
    itself (or a package it is in) is the one not found: a spelling of the reference, which the caller names."""
    parents = {".".join(module.split(".")[: i + 1]) for i in range(module.count(".") + 1)}
    if not exc.name or exc.name in parents:
        return None
    parent = _importable_parent(exc.name)
    if parent:  # a misspelt submodule of a package that is there: not a pip install
        return ConfigError(
            f"{who} imports {exc.name!r}, which the package {parent[0]!r} ({parent[1]}) does not have",
            field=field,
            hint=f"fix the spelling of the import (the modules {parent[0]!r} has are in {parent[1]})",
        )
    return MissingDependencyError(
        f"{who} imports {exc.name!r}, which is not installed in this environment",
        hint=f"install the package that provides {exc.name!r} (pip install ...) and run again",
    )


def recipe_schema(recipe: Recipe) -> type:
    """The config dataclass `portable run` loads for `recipe`; ConfigError (exit 4, naming the recipe and the value)
    when it declares none, names nothing importable, or names something that is not a dataclass (audit47 F7: a
    function there was an internal error from OmegaConf), or is neither a str nor a class. A class given itself is
    used as is (nothing records the schema: run.json keeps the recipe's reference and the resolved config)."""
    import dataclasses

    if not recipe.config_schema:
        raise ConfigError(
            f"recipe: {recipe.name!r} declares no config_schema, so `portable run` cannot load a config for it",
            field="recipe",
            hint="set Recipe(config_schema='module:ConfigClass') in the recipe",
        )
    hint = "point the recipe's config_schema at an importable 'module:Class' (a dataclass)"
    given = recipe.config_schema
    if isinstance(given, type):  # the dataclass itself, as a recipe module that imports it may write it
        schema: Any = given
        shown = f"{given.__module__}:{given.__qualname__}"
    elif isinstance(given, str):
        schema = resolve_fn(given, what=f"recipe {recipe.name!r}: config_schema", key="config_schema", hint=hint)
        shown = repr(given)
    else:  # a Recipe, a function, an instance: `.partition` of it was an internal error, exit 1 (audit60_B B2)
        raise ConfigError(
            f"recipe {recipe.name!r}: config_schema is {a_kind(type(given).__name__)} ({given!r:.80}), not a "
            "'module:Class' str or a dataclass",
            field="config_schema",
            hint="write config_schema='module:ConfigClass' (or the @dataclass class itself) in the recipe",
        )
    if not (isinstance(schema, type) and dataclasses.is_dataclass(schema)):
        kind = "a class" if isinstance(schema, type) else f"a {type(schema).__name__}"
        raise ConfigError(
            f"recipe {recipe.name!r}: config_schema {shown} {'is' if schema is given else 'names'} {kind}, not a "
            "dataclass",
            field="config_schema",
            hint="point the recipe's config_schema at a 'module:Class' whose class is a @dataclass (docs/recipes.md)",
        )
    return schema


def _importable_parent(missing: str | None) -> tuple[str, str] | None:
    """(package, its folder) when the module `missing` ("pkg.sub") names a submodule of a regular package that can be
    imported: the submodule is misspelt in the recipe's code (audit50_B F10: exit 10 "pip install" sent the user to
    install a package they had). None for a top-level module, or a namespace package's (another distribution of it
    may not be installed)."""
    parent = (missing or "").rpartition(".")[0]
    if not parent:
        return None
    try:
        spec = importlib.util.find_spec(parent)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.submodule_search_locations:
        return None
    return parent, str(list(spec.submodule_search_locations)[0])


def _line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]


def load_run_config(files: list[Any], overrides: list[str], *, bundle: Any, run_dir: Any) -> tuple[str, Recipe, Any]:
    """(recipe name as the config gives it, the Recipe, the typed config): the name read first (run/config.py's
    `recipe_name`), then the config loaded into the recipe's schema."""
    from reproduction.run.config import DEFAULT_RECIPE, given_recipe, load_config

    given = given_recipe(files, overrides)
    name = given or DEFAULT_RECIPE
    recipe = resolve_recipe(name)
    schema = recipe_schema(recipe)
    try:
        config = load_config(files, overrides, bundle=bundle, run_dir=run_dir, schema=schema)
    except ConfigError as exc:
        if exc.hint and "docs/config.md" in exc.hint and not schema.__module__.startswith("reproduction."):
            # docs/config.md lists the built-in recipes' keys, not an out-of-tree one's (audit65_B L4)
            exc.hint = exc.hint.replace("docs/config.md", f"its schema {schema.__module__}:{schema.__qualname__}")
        # a config without `recipe:` is read as RECAP's; not said of a field of an item of RECAP's own list
        # (`datasets[0].bogus`): the list was RECAP's, so the config was (audit59 B1)
        if given is None and "unknown config key" in exc.message and "[" not in str(exc.field or ""):
            exc.hint = (f"{exc.hint}; " if exc.hint else "") + (
                "the config names no `recipe:`, so it was read as RECAP's: add `recipe: NAME` for another recipe"
            )
        raise
    return name, recipe, config
