"""Which files an out-of-tree recipe runs from, checked against the copy a bundle ships in its source layer.

A bundle may pack an out-of-tree recipe's package as a `kind = "source"` layer, and its lineage then lists that
layer as a material of every stage. `portable run` still imports the recipe from sys.path (PYTHONPATH), never from
the bundle: code in a bundle is not executed unless the user puts it on PYTHONPATH. So that "material: the bundle's
source layer" stays true, the recipe's package on the import side must hold the same .py files as the layer's copy
of it, byte for byte, or the run is refused before anything of it is imported or executed (audit54 A1, R4): stage
functions and the modules they import usually live beside the module `recipe:` names. The recipe module that runs
is recorded in run.json (`recipe_module`); it is no lineage material of its own (audit54 R5): with a bundle the
layer, already a material, is that code; without one a user's working copy is no pinned input (as before A1).
Built-in and other in-tree recipes (reproduction/...) are not compared: a bundle's snapshot of the project is history.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from reproduction.digests import sha256_file
from reproduction.errors import ConfigError, IntegrityError

_TREE = Path(__file__).resolve().parents[1]
"""The reproduction package: a recipe module inside it is in-tree."""


def _source_layers(bundle: Path) -> list[Path]:
    """The restored folders of `bundle`'s source layers, in layer order ([] without a readable bundle.json)."""
    try:
        manifest = json.loads((bundle / "bundle.json").read_text(encoding="utf-8"))
        layers = sorted(manifest.get("layers", []), key=lambda layer: layer.get("order", 0))
    except (OSError, ValueError, AttributeError, TypeError):
        return []  # the run's own manifest checks name a broken bundle.json
    return [
        bundle / layer["target"]
        for layer in layers
        if isinstance(layer, dict) and layer.get("kind") == "source" and isinstance(layer.get("target"), str)
    ]


def _layer_copy(module: str, layers: list[Path], *, package: bool | None) -> Path | None:
    """The first file among `layers` that holds `module` (pkg/mod.py, or pkg/mod/__init__.py for a package)."""
    base = Path(*module.split("."))
    shapes = {None: (".py", "/__init__.py"), False: (".py",), True: ("/__init__.py",)}[package]
    for root in layers:
        for shape in shapes:
            path = root / f"{base}{shape}"
            if path.is_file():
                return path
    return None


def _layer_root(shipped: Path, module: str) -> Path:
    """The source layer folder holding `shipped`, the layer's file of `module`: the folder to put on PYTHONPATH."""
    return shipped.parents[module.count(".") + (shipped.name == "__init__.py")]


def _find(fullname: str, path: list[str] | None) -> Any:
    """The spec sys.meta_path's finders give `fullname` searched in `path` (a parent's search locations), as an
    import would find it, but without importing (executing) any parent package; None when none finds it."""
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        try:
            spec = find(fullname, path)
        except KeyError:
            # PathFinder wraps a namespace package's locations in a _NamespacePath, which looks its parent up in
            # sys.modules: a namespace inside a namespace (myns.sub, never imported here) raised KeyError 'myns'
            # and went unrecorded (audit56 B2). The same search, without the wrapper: a plain list of folders.
            search = getattr(finder, "_get_spec", None)
            if search is None:
                raise
            spec = search(fullname, path)
            if spec is not None and spec.loader is None:
                spec = spec if spec.submodule_search_locations else None  # a namespace portion, as find_spec
        if spec is not None:
            return spec
    return None


def _locate(module: str) -> tuple[Any, tuple[str, ...]]:
    """(spec of `module`, the dotted parts of the first regular package on its path, () for none), found level by
    level from the top-level package's search locations: nothing is imported or executed. (None, ()) when a level
    is missing."""
    spec, unit = None, ()
    parts = module.split(".")
    for depth in range(len(parts)):
        locations = None if spec is None else spec.submodule_search_locations
        if depth and locations is None:  # a plain module has no submodules
            return None, ()
        spec = _find(".".join(parts[: depth + 1]), None if locations is None else list(locations))
        if spec is None:
            return None, ()
        regular = spec.submodule_search_locations is not None and spec.has_location and spec.origin
        if not unit and regular:
            unit = tuple(parts[: depth + 1])
    return spec, unit


def _py_files(folder: Path) -> dict[str, Path]:
    """Every .py file under `folder`, by its path relative to it (POSIX), outside __pycache__."""
    return {
        p.relative_to(folder).as_posix(): p
        for p in sorted(folder.rglob("*.py"))
        if p.is_file() and "__pycache__" not in p.relative_to(folder).parts
    }


def check_recipe_source(name: str | None, bundle: Path | None) -> dict[str, str] | None:
    """For an out-of-tree recipe reference (`package.module:NAME`): {"module", "path", "sha256"} of the module file
    Python will import, found without importing or executing anything (not even its parent packages). None for a
    built-in or in-tree recipe, and for a module that cannot be found or located (resolve_recipe then says why),
    unless the bundle ships it.

    Guarantees, when `bundle` has a source layer holding the module: the recipe's unit (its first regular package
    on the dotted path, or the module file alone when it has none) holds on the import side exactly the .py files
    the layer's copy of that unit holds, with the same bytes; otherwise IntegrityError (exit 5) naming the first
    file that differs (the recipe module first, then by relative path), is missing on the import side, or is only
    there, with the digests known. ConfigError (exit 4) naming the layer folder to put on PYTHONPATH when the
    module cannot be imported at all. Nothing from the bundle or the import side is executed."""
    module, sep, _ = (name or "").partition(":")
    if not sep or not module or module.split(".")[0] == "reproduction":
        return None
    layers = _source_layers(bundle) if bundle is not None else []
    try:
        spec, unit = _locate(module)
    except Exception:  # noqa: BLE001 - a finder that fails on a broken path entry: resolve_recipe names the error
        spec, unit = None, ()
    origin = Path(spec.origin) if spec is not None and spec.has_location and spec.origin else None
    if origin is None or not origin.is_file():
        shipped = _layer_copy(module, layers, package=None)
        if shipped is None:
            return None
        folder = _layer_root(shipped, module)
        raise ConfigError(
            f"recipe: {name!r} cannot be imported, but the bundle ships it in its source layer ({shipped})",
            field="recipe",
            hint=f"a bundle's code is never run unless you ask: put its source layer first on PYTHONPATH "
            f"(PYTHONPATH={folder}:$PYTHONPATH portable run ...), or install the recipe's package",
        )
    if origin.resolve().is_relative_to(_TREE):
        return None
    shipped = _layer_copy(module, layers, package=origin.name == "__init__.py")
    if shipped is not None:
        _compare(name, origin, shipped, _layer_root(shipped, module), unit)
    return {"module": module, "path": str(origin.resolve()), "sha256": sha256_file(origin)}


def _compare(name: str, origin: Path, shipped: Path, folder: Path, unit: tuple[str, ...]) -> None:
    """IntegrityError for the first .py file of the recipe's unit (`unit`: the dotted parts of its regular package,
    () for the module file alone) that differs between the import side (`origin`) and the layer (`shipped`, under
    the layer root `folder`)."""
    hint = (
        f"to run the bundle's code put {folder} first on PYTHONPATH; to run yours, repack the bundle with it "
        "(`portable pack`)"
    )
    if not unit:  # no regular package on the path (a top-level module, a namespace's module): the file alone
        here_dir = origin.parent
        mine, theirs = {origin.name: origin}, {shipped.name: shipped}
        first = origin.name
    else:
        # the import side's package folder: `origin` sits len(module parts) - len(unit) folders below it
        # (one fewer for a package's own __init__.py)
        depth = len(shipped.relative_to(folder).parts) - len(unit)
        here_dir = origin.parents[depth - 1]
        shipped_dir = folder.joinpath(*unit)
        mine, theirs = _py_files(here_dir), _py_files(shipped_dir)
        first = origin.relative_to(here_dir).as_posix()
    for rel in [first, *sorted((set(mine) | set(theirs)) - {first})]:
        here, there = mine.get(rel), theirs.get(rel)
        if here is not None and there is not None:
            here_sha, there_sha = sha256_file(here), sha256_file(there)
            if here_sha != there_sha:
                raise IntegrityError(
                    f"recipe: {name!r} would run {here} (sha256 {here_sha[:12]}), not the bundle's copy {there} "
                    f"(sha256 {there_sha[:12]}) that its lineage names",
                    path=here,
                    hint=hint,
                )
        elif there is not None:
            gone = here_dir / rel
            raise IntegrityError(
                f"recipe: {name!r} would run without {gone}, which the bundle's copy {there} "
                f"(sha256 {sha256_file(there)[:12]}) that its lineage names has",
                path=gone,
                hint=hint,
            )
        elif here is not None:
            raise IntegrityError(
                f"recipe: {name!r} would run beside {here} (sha256 {sha256_file(here)[:12]}), which the bundle's "
                f"source layer {folder} that its lineage names does not ship",
                path=here,
                hint=hint + "; or move the file out of the package",
            )
