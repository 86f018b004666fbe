"""Which file an out-of-tree recipe runs from, checked against the copy a bundle ships in its source layer.

A bundle may pack an out-of-tree recipe's package as a `kind = "source"` layer, and its lineage then lists that
layer as a material of every stage. `portable run` still imports the recipe from sys.path (PYTHONPATH), never from
the bundle: code in a bundle is not executed unless the user puts it on PYTHONPATH. So that "material: the bundle's
source layer" stays true, a recipe module whose bytes differ from the layer's copy is refused before anything runs
(audit54 A1), and the file that did run is recorded (run.json `recipe_module`, and a `source` material of each stage).
Built-in and other in-tree recipes (reproduction/...) are not compared: a bundle's snapshot of the project is history.
"""

from __future__ import annotations

import importlib.util
import json
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


def check_recipe_source(name: str | None, bundle: Path | None) -> dict[str, str] | None:
    """For an out-of-tree recipe reference (`package.module:NAME`): {"module", "path", "sha256"} of the module file
    Python will import, without importing the module itself. None for a built-in or in-tree recipe, and for a module
    that cannot be found or located (resolve_recipe then says why), unless the bundle ships it.

    Guarantees, when `bundle` has a source layer holding the module: IntegrityError (exit 5) naming both files and
    digests when the imported file's bytes differ from the layer's; ConfigError (exit 4) naming the layer folder to
    put on PYTHONPATH when the module cannot be imported at all. Nothing from the bundle is executed."""
    module, sep, _ = (name or "").partition(":")
    if not sep or not module or module.split(".")[0] == "reproduction":
        return None
    layers = _source_layers(bundle) if bundle is not None else []
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        spec = None
    except Exception:  # noqa: BLE001 - a parent package that fails to import: resolve_recipe names the error
        return None
    origin = Path(spec.origin) if spec is not None and spec.has_location and spec.origin else None
    if origin is None or not origin.is_file():
        shipped = _layer_copy(module, layers, package=None)
        if shipped is None:
            return None
        folder = shipped.parents[module.count(".") + (shipped.name == "__init__.py")]
        raise ConfigError(
            f"recipe: {name!r} cannot be imported, but the bundle ships it in its source layer ({shipped})",
            field="recipe",
            hint=f"a bundle's code is never run unless you ask: put its source layer first on PYTHONPATH "
            f"(PYTHONPATH={folder}:$PYTHONPATH portable run ...), or install the recipe's package",
        )
    origin = origin.resolve()
    if origin.is_relative_to(_TREE):
        return None
    sha = sha256_file(origin)
    shipped = _layer_copy(module, layers, package=origin.name == "__init__.py")
    if shipped is not None:
        shipped_sha = sha256_file(shipped)
        if shipped_sha != sha:
            folder = shipped.parents[module.count(".") + (shipped.name == "__init__.py")]
            raise IntegrityError(
                f"recipe: {name!r} would run {origin} (sha256 {sha[:12]}), not the bundle's copy {shipped} "
                f"(sha256 {shipped_sha[:12]}) that its lineage names",
                path=origin,
                hint=f"to run the bundle's code put {folder} first on PYTHONPATH; to run yours, repack the bundle "
                "with it (`portable pack`)",
            )
    return {"module": module, "path": str(origin), "sha256": sha}


def recipe_material(recorded: dict[str, Any] | None) -> list[Any]:
    """The lineage input (role "source") of the recipe module a run imported, from `check_recipe_source`'s record;
    [] for none."""
    if not recorded:
        return []
    from reproduction.run.lineage import Artifact

    return [Artifact(path=Path(recorded["path"]), role="source", sha256=recorded["sha256"])]
