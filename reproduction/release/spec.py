"""Bundle specs: the TOML file `portable pack` reads, as typed values.

The format, every key with an example, is spec_format.FORMAT, which `portable pack --help` shows (every install
has it; the repository checkout's bundle/demo.toml is a real spec). A key not listed there is refused (exit 4,
naming it), as are a name that is not one path component and a target or dest under bundle.json, .portable/,
reproduction/ or runs/.
"""

from __future__ import annotations

import difflib
import fnmatch
import sys
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from reproduction.errors import InputNotFoundError, InvalidInputError, MissingDependencyError
from reproduction.release.manifest import LAYER_KINDS, RUNS_DIR, check_relative_path


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

    @property
    def members_index(self) -> str:
        """Where pack writes the layer's member index (layers.index_path, which would import restore's code)."""
        return f"{self.target}.members.json"


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
    origin: str | None = None
    """Where to get the source when it is missing (for `pack --dry-run`)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class WeightsSpec:
    """Weights named by a manifest (weights_manifest/*.json), placed under `dest`."""

    manifest: Path
    """Absolute path of the weights manifest."""
    source: Path | None = None
    """Folder holding the manifest's files (their `path`s relative to it); None: build or report missing."""
    dest: str = "weights"
    """Folder of the bundle the files go to."""


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
    weights: list[WeightsSpec] = field(default_factory=list)
    """Pinned weights to place (see release/weights.py)."""
    licenses: tuple[str, ...] = ()
    """Components (LICENSES/index.json) whose licenses the bundle carries besides its weights'."""
    origins: dict[str, str] = field(default_factory=dict)
    """Source path -> where to get it when missing (the entries' `origin`)."""


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
            hint=f"name a bundle spec (TOML); {FORMAT_HELP}",
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
        raise InvalidInputError(f"{path}: not valid TOML ({exc})", path=path, field="(root)", hint=TOML_HINT) from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidInputError(f"{path}: not valid TOML ({exc})", path=path, field="(root)", hint=TOML_HINT) from None


FORMAT_HELP = "`portable pack --help` shows the format"
"""Where the hints send a user for the spec format: every install has it (bundle/demo.toml only the checkout)."""
TOML_HINT = f"fix the TOML syntax there ({FORMAT_HELP})"


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


SPEC_KEYS = ("name", "description", "root", "entry_config", "layer", "file", "config", "paths", "weights", "licenses")
LAYER_KEYS = ("source", "kind", "name", "target", "exclude", "relocatable", "build_prefix", "order", "origin")
FILE_KEYS = ("source", "dest", "exclude", "origin")
WEIGHTS_KEYS = ("manifest", "source", "dest")
RESERVED = ("bundle.json", ".portable", "reproduction", RUNS_DIR)
"""Top-level bundle paths no layer target, file dest or weights dest may take: the bundle format's own, and
`runs/`, which verify and restore leave to runs."""


def _table(data: Any, keys: tuple[str, ...], where: str, path: Path) -> dict[str, Any]:
    """`data` when it is a TOML table holding only `keys`; InvalidInputError (exit 4) naming the file, the table and
    the first unknown key (with the known key it looks like), else: a typo such as `exclud` was ignored and the files
    it meant to leave out were packed (audit47 F4)."""
    if not isinstance(data, dict):
        raise InvalidInputError(
            f"{path}: {where} should be a table, got {data!r:.60}", path=path, field=where, hint=SPEC_HINT
        )
    unknown = [key for key in data if key not in keys]
    if unknown:
        key = unknown[0]
        close = difflib.get_close_matches(key, keys, n=1)
        table = "the top level" if where == "spec" else where
        raise InvalidInputError(
            f"{path}: unknown key {key!r} in {table}",
            path=path,
            field=f"{where}.{key}",
            hint=(f"did you mean {close[0]!r}? " if close else "")
            + f"the keys of {table} are {', '.join(keys)} ({FORMAT_HELP})",
        )
    return data


def _name(value: str, where: str, path: Path) -> str:
    """`value` when it can name a bundle or a layer (one path component, printable); else InvalidInputError."""
    if (
        not value.strip()
        or value in (".", "..")
        or any(c in value for c in "/\\")
        or not value.isprintable()
        or value != value.strip()
    ):
        raise InvalidInputError(
            f"{path}: {where}.name {value!r} is not a usable name (empty, '.', '..', a '/' or '\\', a control "
            "character or surrounding spaces)",
            path=path,
            field=f"{where}.name",
            hint="use letters, digits, '-', '_' and '.', e.g. name = \"recap-demo\"",
        )
    return value


SPEC_HINT = f"fix the spec ({FORMAT_HELP})"


def _source(root: Path, value: str, where: str, path: Path, missing: list[str] | None = None) -> Path:
    src = (root / value).resolve() if not Path(value).is_absolute() else Path(value)
    if not src.exists() and missing is not None:
        missing.append(f"{where}.source {src}")
        return src
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


def _layer(data: dict[str, Any], i: int, root: Path, path: Path, missing: list[str] | None = None) -> LayerSpec:
    where = f"layer[{i}]"
    _table(data, LAYER_KEYS, where, path)
    src = _source(root, _get(data, "source", str, where, path), where, path, missing)
    if src.exists() and not src.is_dir():
        raise InvalidInputError(
            f"{path}: {where}.source {str(src)!r} is not a folder", path=path, field=f"{where}.source"
        )
    kind = _get(data, "kind", str, where, path, "source")
    if kind not in LAYER_KINDS:
        raise InvalidInputError(
            f"{path}: {where}.kind {kind!r} is not one of {', '.join(LAYER_KINDS)}", path=path, field=f"{where}.kind"
        )
    name = _name(_get(data, "name", str, where, path, src.name), where, path)
    target = _bundle_path(_get(data, "target", str, where, path, f"{kind}/{name}"), f"{where}.target", path)
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


def _file(
    data: dict[str, Any], i: int, root: Path, path: Path, *, config: bool, missing: list[str] | None = None
) -> FileSpec:
    where = f"{'config' if config else 'file'}[{i}]"
    _table(data, FILE_KEYS, where, path)
    src = _source(root, _get(data, "source", str, where, path), where, path, missing)
    dest = _bundle_path(_get(data, "dest", str, where, path, src.name), f"{where}.dest", path)
    origin = _get(data, "origin", str, where, path, None)
    return FileSpec(source=src, dest=dest, exclude=_exclude(data, where, path), config=config, origin=origin)


def _bundle_path(rel: str, where: str, path: Path) -> str:
    """`rel` when it is a clean path inside the bundle (bundle.json's rule, manifest.check_relative_path), else the
    spec's own InvalidInputError (exit 4) naming the spec file: the manifest's said "the manifest is damaged or
    hostile; do not use this bundle" of a bundle not yet packed (review63 R L3)."""
    try:
        return check_relative_path(rel, where=where, path=path)
    except InvalidInputError as exc:
        raise InvalidInputError(
            f"{path}: {exc.message}",
            path=path,
            field=where,
            hint="write it as a plain relative path inside the bundle, such as 'data' or 'config/run.yaml' (no "
            "leading ./ or /, no trailing / or //, no .., ~ or backslash)",
        ) from None


def _weights(data: dict[str, Any], i: int, root: Path, path: Path) -> WeightsSpec:
    where = f"weights[{i}]"
    _table(data, WEIGHTS_KEYS, where, path)
    manifest = Path(_get(data, "manifest", str, where, path))
    manifest = manifest if manifest.is_absolute() else (path.parent / manifest).resolve()
    source = _get(data, "source", str, where, path, None)
    dest = _bundle_path(_get(data, "dest", str, where, path, "weights"), f"{where}.dest", path)
    src = None if source is None else (Path(source) if Path(source).is_absolute() else (root / source).resolve())
    return WeightsSpec(manifest=manifest, source=src, dest=dest)


def load_spec(path: Path, *, root: Path | None = None, missing: list[str] | None = None) -> BundleSpec:
    """Read and check a spec. `root` overrides the spec's own `root` (relative sources start there).

    Raises InputNotFoundError for a missing spec or source, InvalidInputError naming the field. With
    a `missing` list, missing sources are appended to it (and kept in the spec) instead of raising.
    """
    path = Path(path)
    data = _table(_load_toml(path), SPEC_KEYS, "spec", path)
    base = Path(root) if root is not None else (path.parent / _get(data, "root", str, "spec", path, ".")).resolve()
    spec = BundleSpec(
        path=path,
        name=_name(_get(data, "name", str, "spec", path), "spec", path),
        description=_get(data, "description", str, "spec", path, ""),
        entry_config=_get(data, "entry_config", str, "spec", path, None) if "entry_config" in data else None,
    )
    layer_data = _get(data, "layer", list, "spec", path, [])
    spec.layers = [_layer(d, i, base, path, missing) for i, d in enumerate(layer_data)]
    spec.files = [
        _file(d, i, base, path, config=False, missing=missing)
        for i, d in enumerate(_get(data, "file", list, "spec", path, []))
    ]
    spec.files += [
        _file(d, i, base, path, config=True, missing=missing)
        for i, d in enumerate(_get(data, "config", list, "spec", path, []))
    ]
    spec.weights = [_weights(d, i, base, path) for i, d in enumerate(_get(data, "weights", list, "spec", path, []))]
    licenses = _get(data, "licenses", list, "spec", path, [])
    if not all(isinstance(x, str) for x in licenses):
        raise InvalidInputError(f"{path}: licenses must be a list of component names", path=path, field="licenses")
    spec.licenses = tuple(licenses)
    for d, layer in zip(layer_data, spec.layers):
        if isinstance(d.get("origin"), str):
            spec.origins[str(layer.source)] = d["origin"]
    spec.origins.update({str(f.source): f.origin for f in spec.files if f.origin})
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
    """InvalidInputError (exit 4), before anything is written, for a target or dest that is reserved or used twice,
    two layers at one target (pack names an archive by its target), two weights manifests of one file name (each is
    copied to weights_manifest/<name>), a plain file inside a layer target or a layer under a one-file dest, and a
    dest at, inside or holding a path pack writes itself (a layer's archive or member index: pack wrote it over the
    [[file]] copied there, exit 0, audit63 A M1; inside one, exit 8 with a free-space hint)."""
    seen: dict[str, str] = {}
    for what, rel in [("weights dest", w.dest) for w in spec.weights]:
        _refuse_reserved(spec, what, rel)
    named: dict[str, int] = {}
    for i, w in enumerate(spec.weights):  # pack copies each manifest to weights_manifest/<its file name>
        j = named.setdefault(w.manifest.name, i)
        if j != i and spec.weights[j].manifest != w.manifest:
            raise InvalidInputError(
                f"{spec.path}: weights[{i}].manifest {str(w.manifest)!r} has the file name of weights[{j}]'s "
                f"({str(spec.weights[j].manifest)!r}), and pack copies each to weights_manifest/{w.manifest.name}",
                path=spec.path,
                field=f"weights[{i}].manifest",
                hint="give the two manifests different file names (the second replaced the first: review63 R M2)",
            )
    first: dict[str, int] = {}
    for i, layer in enumerate(spec.layers):  # pack names a layer's archive by its target: a second would overwrite it
        if layer.target in first:  # (restore takes overlays in a bundle.json made otherwise; pack makes none: A L4)
            raise InvalidInputError(
                f"{spec.path}: layer[{i}].target {layer.target!r} is layer[{first[layer.target]}]'s too, and pack "
                f"writes one archive per target ({layer.archive})",
                path=spec.path,
                field=f"layer[{i}].target",
                hint="give each [[layer]] its own target, or pack the two source folders as one layer",
            )
        first[layer.target] = i
    for what, rel in [("layer target", layer.target) for layer in spec.layers] + [
        ("file dest", f.dest) for f in spec.files
    ]:
        _refuse_reserved(spec, what, rel)
        if rel in seen:
            raise InvalidInputError(f"{spec.path}: {what} {rel!r} is used twice", path=spec.path, field=what)
        seen[rel] = what
    written = layer_outputs(spec)
    entries = [(f"{'config' if f.config else 'file'}[{i}].dest", f.dest) for i, f in _numbered(spec.files)]
    entries += [(f"weights[{i}].dest", w.dest) for i, w in enumerate(spec.weights)]
    single = {f.dest for f in spec.files if f.source.is_file()}  # a [[file]] of one file: its dest is that file
    for where, rel in entries:  # bundle.json keeps plain files out of layer targets (verify refused the bundle pack
        for i, layer in enumerate(spec.layers):  # wrote), and a layer under a file stopped pack (exit 8: audit63 A L4)
            inside = rel != layer.target and PurePosixPath(rel).is_relative_to(layer.target)
            if inside or (rel in single and PurePosixPath(layer.target).is_relative_to(rel)):
                raise InvalidInputError(
                    f"{spec.path}: {where} {rel!r} and layer[{i}].target {layer.target!r} lie one inside the other",
                    path=spec.path,
                    field=where,
                    hint="keep plain files outside the layers' target folders, and no layer under a file's dest",
                )
    for where, rel in entries:
        below = next((w for w in written if PurePosixPath(rel).is_relative_to(w)), None)  # inside a file pack writes
        above = next((w for w in written if rel in single and PurePosixPath(w).is_relative_to(rel)), None)
        if rel not in written and (below or above):  # ("File exists", exit 8 with a free-space hint: review63 R M1)
            w = below or above
            raise InvalidInputError(
                f"{spec.path}: {where} {rel!r} and {w!r}, {written[w]}, lie one inside the other",
                path=spec.path,
                field=where,
                hint=f"choose another dest for {where.split('.')[0]} (none may hold or lie inside a layer's "
                "<target>.tar.zst or <target>.members.json)",
            )
        if rel in written:
            raise InvalidInputError(
                f"{spec.path}: {where} {rel!r} is {written[rel]}, which pack writes there",
                path=spec.path,
                field=where,
                hint=f"choose another dest for {where.split('.')[0]} (none may be <target>.tar.zst or "
                "<target>.members.json of a layer)",
            )


def layer_outputs(spec: BundleSpec) -> dict[str, str]:
    """Bundle path -> what it is, for each file pack derives from a layer: its archive and its member index."""
    out: dict[str, str] = {}
    for i, layer in enumerate(spec.layers):
        out.setdefault(layer.archive, f"the archive of layer[{i}] (target {layer.target!r})")
        out.setdefault(layer.members_index, f"the member index of layer[{i}] (target {layer.target!r})")
    return out


def _numbered(files: list[FileSpec]) -> list[tuple[int, FileSpec]]:
    """(index among its kind, entry): spec.files holds [[file]] then [[config]] entries, each numbered from 0."""
    counts = {False: 0, True: 0}
    out = []
    for f in files:
        out.append((counts[f.config], f))
        counts[f.config] += 1
    return out


def _refuse_reserved(spec: BundleSpec, what: str, rel: str) -> None:
    top = PurePosixPath(rel).parts[0]
    if top in RESERVED:
        reason = "left to runs (verify and restore ignore it)" if top == RUNS_DIR else "reserved by the bundle format"
        raise InvalidInputError(
            f"{spec.path}: {what} {rel!r} is {reason}",
            path=spec.path,
            field=what,
            hint=f"choose another {what.split()[-1]}: none may start with {', '.join(RESERVED)}",
        )
