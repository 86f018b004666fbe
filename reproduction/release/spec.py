"""Bundle specs: the TOML file `portable pack` reads (see bundle/demo.toml), as typed values.

name = "demo"                      # bundle name
description = "..."                # optional, copied into bundle.json metadata
root = "."                         # folder that relative `source` paths start from (default: the spec's folder)
entry_config = "config/run.json"   # optional: the config `portable run` uses, relative to the bundle

[[layer]]                          # a folder packed as <target>.tar.zst, extracted by restore
source = "src/recap"               # the folder to pack
kind = "source"                    # "source" or "runtime"
name = "recap"                     # default: the source folder's name
target = "source/recap"            # default: "<kind>/<name>"
exclude = ["__pycache__", "*.pyc"] # globs; without '/' they match any name, with '/' the relative path
relocatable = false                # runtime layers built at an absolute prefix: record where it occurs
build_prefix = "/opt/py"           # default: the source folder's absolute path

[[file]]                           # plain files (weights, data, evidence): a file or a whole folder
source = "weights"
dest = "weights"
exclude = []

[[config]]                         # like [[file]], but absolute paths inside become ${BUNDLE}/...
source = "configs/run.json"
dest = "config/run.json"

[paths]                            # extra absolute prefixes to write as ${BUNDLE}/<value> in configs
"/home/me/recap" = "source/recap"
"""

from __future__ import annotations

import fnmatch
import sys
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from reproduction.errors import InputNotFoundError, InvalidInputError, MissingDependencyError
from reproduction.release.manifest import LAYER_KINDS, check_relative_path


@dataclass(kw_only=True, slots=True, frozen=True)
class LayerSpec:
    """A folder to pack as one layer."""

    source: Path
    """Absolute path of the folder to pack."""
    kind: str
    """'source' or 'runtime'."""
    name: str
    """Layer name (archive is <kind>/<name>.tar.zst unless target says otherwise)."""
    target: str
    """Folder relative to the bundle that restore creates."""
    exclude: tuple[str, ...] = ()
    """Globs of paths not to pack."""
    relocatable: bool = False
    """Record where `build_prefix` occurs so restore can rewrite it."""
    build_prefix: str | None = None
    """Absolute path the tree was built at (relocatable layers only)."""
    order: int = 0
    """Extraction order."""

    @property
    def archive(self) -> str:
        return f"{self.target}.tar.zst"


@dataclass(kw_only=True, slots=True, frozen=True)
class FileSpec:
    """A file or folder copied into the bundle as plain files."""

    source: Path
    """Absolute path of the file or folder."""
    dest: str
    """Path relative to the bundle."""
    exclude: tuple[str, ...] = ()
    """Globs of paths not to copy (folders only)."""
    config: bool = False
    """Rewrite absolute paths to ${BUNDLE} placeholders."""


@dataclass(kw_only=True, slots=True)
class BundleSpec:
    """A whole spec file."""

    path: Path
    """The spec file."""
    name: str
    """Bundle name."""
    description: str = ""
    """One line, copied into bundle.json."""
    entry_config: str | None = None
    """Run config relative to the bundle."""
    layers: list[LayerSpec] = field(default_factory=list)
    files: list[FileSpec] = field(default_factory=list)
    paths: dict[str, str] = field(default_factory=dict)
    """Absolute prefix -> bundle-relative path, for ${BUNDLE} placeholders."""


def excluded(rel: str, patterns: tuple[str, ...]) -> bool:
    """True when `rel` (a POSIX path relative to the packed folder) matches an exclude glob."""
    name = rel.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatchcase(rel if "/" in p else name, p.rstrip("/")) for p in patterns)


def _load_toml(path: Path) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        try:
            import tomli as tomllib
        except ImportError:
            raise MissingDependencyError(
                "reading a TOML spec on Python 3.10 needs the 'tomli' package",
                hint="python3 -m pip install tomli (or pack with Python 3.11+)",
            ) from None
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise InputNotFoundError(
            f"{path}: spec not found",
            path=path,
            hint="name a bundle spec (TOML); bundle/demo.toml shows the format (see the README's `portable pack`)",
        ) from None
    except IsADirectoryError:
        raise InvalidInputError(
            f"{path} is a folder, not a spec file", path=path, field="SPEC.toml", hint="name the spec's .toml file"
        ) from None
    except PermissionError:
        raise InvalidInputError(
            f"{path}: cannot read the spec (permission denied)", path=path, hint="make the file readable"
        ) from None
    except UnicodeDecodeError as exc:
        raise InvalidInputError(f"{path}: not valid TOML ({exc})", path=path, field="(root)") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidInputError(f"{path}: not valid TOML ({exc})", path=path, field="(root)") from None


def _get(data: dict[str, Any], key: str, kind: type, where: str, path: Path, default: Any = ...) -> Any:
    if key not in data:
        if default is ...:
            raise InvalidInputError(f"{path}: {where} is missing '{key}'", path=path, field=f"{where}.{key}")
        return default
    value = data[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise InvalidInputError(
            f"{path}: {where}.{key} should be {kind.__name__}, got {value!r:.60}", path=path, field=f"{where}.{key}"
        )
    return value


def _source(root: Path, value: str, where: str, path: Path) -> Path:
    src = (root / value).resolve() if not Path(value).is_absolute() else Path(value)
    if not src.exists():
        raise InputNotFoundError(
            f"{path}: {where}.source {str(src)!r} does not exist",
            path=src,
            field=f"{where}.source",
            hint=f"fix the path in the spec, or pass `portable pack --root DIR` (relative sources start at {root})",
        )
    return src


def _exclude(data: dict[str, Any], where: str, path: Path) -> tuple[str, ...]:
    globs = _get(data, "exclude", list, where, path, [])
    if not all(isinstance(g, str) for g in globs):
        raise InvalidInputError(
            f"{path}: {where}.exclude must be a list of strings", path=path, field=f"{where}.exclude"
        )
    return tuple(globs)


def _layer(data: dict[str, Any], i: int, root: Path, path: Path) -> LayerSpec:
    where = f"layer[{i}]"
    src = _source(root, _get(data, "source", str, where, path), where, path)
    if not src.is_dir():
        raise InvalidInputError(
            f"{path}: {where}.source {str(src)!r} is not a folder", path=path, field=f"{where}.source"
        )
    kind = _get(data, "kind", str, where, path, "source")
    if kind not in LAYER_KINDS:
        raise InvalidInputError(
            f"{path}: {where}.kind {kind!r} is not one of {', '.join(LAYER_KINDS)}", path=path, field=f"{where}.kind"
        )
    name = _get(data, "name", str, where, path, src.name)
    target = check_relative_path(
        _get(data, "target", str, where, path, f"{kind}/{name}"), where=f"{where}.target", path=path
    )
    relocatable = _get(data, "relocatable", bool, where, path, False)
    prefix = _get(data, "build_prefix", str, where, path, str(src) if relocatable else None) if relocatable else None
    if prefix is not None and not prefix.startswith("/"):
        raise InvalidInputError(
            f"{path}: {where}.build_prefix must be absolute", path=path, field=f"{where}.build_prefix"
        )
    return LayerSpec(
        source=src,
        kind=kind,
        name=name,
        target=target,
        exclude=_exclude(data, where, path),
        relocatable=relocatable,
        build_prefix=prefix,
        order=_get(data, "order", int, where, path, i),
    )


def _file(data: dict[str, Any], i: int, root: Path, path: Path, *, config: bool) -> FileSpec:
    where = f"{'config' if config else 'file'}[{i}]"
    src = _source(root, _get(data, "source", str, where, path), where, path)
    dest = check_relative_path(_get(data, "dest", str, where, path, src.name), where=f"{where}.dest", path=path)
    return FileSpec(source=src, dest=dest, exclude=_exclude(data, where, path), config=config)


def load_spec(path: Path, *, root: Path | None = None) -> BundleSpec:
    """Read and check a spec. `root` overrides the spec's own `root` (relative sources start there).

    Raises InputNotFoundError for a missing spec or source, InvalidInputError naming the field.
    """
    path = Path(path)
    data = _load_toml(path)
    base = Path(root) if root is not None else (path.parent / _get(data, "root", str, "spec", path, ".")).resolve()
    spec = BundleSpec(
        path=path,
        name=_get(data, "name", str, "spec", path),
        description=_get(data, "description", str, "spec", path, ""),
        entry_config=_get(data, "entry_config", str, "spec", path, None) if "entry_config" in data else None,
    )
    spec.layers = [_layer(d, i, base, path) for i, d in enumerate(_get(data, "layer", list, "spec", path, []))]
    spec.files = [
        _file(d, i, base, path, config=False) for i, d in enumerate(_get(data, "file", list, "spec", path, []))
    ]
    spec.files += [
        _file(d, i, base, path, config=True) for i, d in enumerate(_get(data, "config", list, "spec", path, []))
    ]
    paths = _get(data, "paths", dict, "spec", path, {})
    for prefix, rel in paths.items():
        if not prefix.startswith("/") or not isinstance(rel, str):
            raise InvalidInputError(
                f"{path}: paths.{prefix!r} must map an absolute prefix to a bundle path",
                path=path,
                field=f"paths.{prefix}",
            )
        spec.paths[prefix.rstrip("/")] = rel.strip("/")
    _check_unique(spec)
    return spec


def _check_unique(spec: BundleSpec) -> None:
    seen: dict[str, str] = {}
    for what, rel in [("layer target", layer.target) for layer in spec.layers] + [
        ("file dest", f.dest) for f in spec.files
    ]:
        top = PurePosixPath(rel).parts[0]
        if top in ("bundle.json", ".portable", "reproduction"):
            raise InvalidInputError(
                f"{spec.path}: {what} {rel!r} is reserved by the bundle format", path=spec.path, field=what
            )
        if rel in seen and not (what == "layer target" and seen[rel] == what):
            raise InvalidInputError(f"{spec.path}: {what} {rel!r} is used twice", path=spec.path, field=what)
        seen[rel] = what
