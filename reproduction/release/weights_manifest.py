"""Weight manifests (`weights_manifest/*.json`): the third-party or built weights a preset starts from.

    weights_manifest/
      schema.json                              JSON Schema (draft 2020-12) of every manifest
      recap_value_siglip2_gemma3_270m.json     value `recap`: SigLIP2-so400m + Gemma3-270M (Hub)
      pi05_base.json                           policy `pi05`: lerobot/pi05_base + PaliGemma tokenizer (Hub)
      value_tiny.json                          value `tiny`: built from a config and a seed

A manifest lists components; each names its source (a Hub repo pinned to a commit, or a builder
called with a config and a seed), its license (an id and a file under `LICENSES/`, both checked
against `LICENSES/index.json`), the digest of its model config, its files (path under a weights
folder, path in the repo, size, sha256), how its keys map into our model, and the presets using it.
A value not known yet is the literal "to-be-pinned": explicit, reported by `portable weights verify`,
refused by fetch and pack. Stdlib only: the control plane reads these before any runtime exists.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reproduction import strict_json
from reproduction.errors import InputNotFoundError, InvalidInputError, UnsupportedFormatError
from reproduction.fsio import atomic_write_text
from reproduction.release.manifest import STATE_DIR, check_relative_path, clash_message, path_clash

FORMAT = "recap-portable-weights"
FORMAT_VERSION = 2
UNPINNED = "to-be-pinned"
FILE_KINDS = ("weights", "config", "tokenizer", "processor", "other")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_COMMIT = re.compile(r"[0-9a-f]{40}")
_BUILDER = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


def canonical_sha256(obj: Any) -> str:
    """sha256 of `obj` as canonical JSON (sorted keys, no spaces): the digest of an inline config."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


DATA_FOLDERS = ("bundle", "evidence", "LICENSES", "weights_manifest")
"""The project's data folders: in the checkout and an editable install, not in a wheel (`pip install .`)."""


def _is_checkout(folder: Path) -> bool:
    return (folder / "LICENSES" / "index.json").is_file() and (folder / "pyproject.toml").is_file()


def project_root(near: Path | None = None) -> Path:
    """The folder holding the project's data folders: the one holding `reproduction/` (a checkout, an
    editable install, a bundle: each has LICENSES/ there), else the checkout `near` (a spec or manifest
    file, or a folder) lies in, found walking up to a folder with LICENSES/index.json and pyproject.toml.
    A non-editable install leaves these folders in the checkout. When neither has them, the folder
    holding `reproduction/`: `project_path` turns that into the one-line error."""
    beside = Path(__file__).resolve().parent.parent.parent
    if (beside / "LICENSES" / "index.json").is_file() or near is None:
        return beside
    start = Path(near).resolve()
    for folder in (start, *start.parents):
        if _is_checkout(folder):
            return folder
    return beside


def project_path(rel: str, *, needed_by: str, near: Path | None = None) -> Path:
    """`rel` (e.g. "bundle/demo.toml") under `project_root(near)`; InputNotFoundError (exit 3) when it is
    not there, naming the missing data folder and why a non-editable install lacks it. Called before
    any work, so a command fails at once rather than after generating data (audit60 N1)."""
    root = project_root(near)
    path = root / rel
    if path.exists():
        return path
    top = rel.split("/")[0]
    if (root / top).is_dir():
        raise InputNotFoundError(f"{needed_by} needs {path}, which does not exist", path=path, hint=CHECKOUT_HINT)
    if (root / "bundle.json").is_file():  # a restored bundle's own runner, not an install (audit60 review S4)
        raise InputNotFoundError(
            f"{needed_by} needs the checkout's {top}/ folder, and the bundle {root} has none: "
            "a bundle carries only what its spec packs, not the checkout's data folders",
            path=path,
            hint=f"run `{needed_by}` from a recap-portable checkout, not with the bundle's own runner",
        )
    raise InputNotFoundError(
        f"{needed_by} needs the checkout's {top}/ folder, and {root} has none: "
        "a non-editable install (pip install .) does not carry bundle/, evidence/, LICENSES/ or weights_manifest/",
        path=path,
        hint=CHECKOUT_HINT,
    )


CHECKOUT_HINT = "install from the recap-portable checkout with `pip install -e .` (as README shows)"


class _Reader:
    """Typed field access that names the manifest and the field in every error."""

    def __init__(self, path: Path | None, label: str = "weights manifest") -> None:
        self.path = path
        self.label = label

    def fail(self, where: str, message: str, hint: str | None = None) -> InvalidInputError:
        return InvalidInputError(
            f"{self.path or self.label}: {where}: {message}",
            path=self.path,
            field=where,
            hint=hint or "fix the manifest (see weights_manifest/schema.json)",
        )

    def get(self, data: Any, key: str, kind: type | tuple[type, ...], where: str, default: Any = ...) -> Any:
        if not isinstance(data, dict):
            raise self.fail(where, f"should be an object, got {type(data).__name__}")
        if key not in data:
            if default is ...:
                raise self.fail(f"{where}.{key}", "missing")
            return default
        value = data[key]
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
            name = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
            raise self.fail(f"{where}.{key}", f"should be {name}, got {value!r:.60}")
        return value

    def pinned(self, value: Any, pattern: re.Pattern[str] | None, where: str, *, integer: bool = False) -> Any:
        if value == UNPINNED:
            return value
        if integer:
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                return value
        elif isinstance(value, str) and pattern is not None and pattern.fullmatch(value):
            return value
        raise self.fail(where, f"{value!r:.70} is neither a valid value nor {UNPINNED!r}")

    def strings(self, data: dict[str, Any], key: str, where: str, default: Any = ...) -> tuple[str, ...]:
        value = self.get(data, key, list, where, default)
        if not all(isinstance(v, str) for v in value):
            raise self.fail(f"{where}.{key}", "should be a list of strings")
        return tuple(value)


@dataclass(kw_only=True, slots=True)
class WeightFile:
    """One file of a component."""

    path: str
    """Path under a weights folder (the bundle's `weights/`)."""
    size: int | str
    """Bytes, or "to-be-pinned"."""
    sha256: str
    """Hex digest, or "to-be-pinned"."""
    repo_path: str | None = None
    """Path in the Hub repo (hub components)."""
    kind: str | None = None
    """weights / config / tokenizer / processor / other."""

    @property
    def pinned(self) -> bool:
        return self.size != UNPINNED and self.sha256 != UNPINNED

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path}
        if self.repo_path is not None:
            out["repo_path"] = self.repo_path
        if self.kind is not None:
            out["kind"] = self.kind
        out.update(size=self.size, sha256=self.sha256)
        return out


@dataclass(kw_only=True, slots=True)
class Component:
    """One upstream (or built) piece: a repo at a commit, or a builder, with its files and license."""

    role: str
    source: dict[str, Any]
    """{"kind": "hub", repo, repo_type, revision, commit} or {"kind": "built", builder, seed, config}."""
    license: dict[str, Any]
    """{"id", "file", optional "gated", "source"}."""
    model_config: dict[str, Any]
    """{"path": a file among `files` (hub), "sha256": digest of the config}."""
    files: list[WeightFile]
    key_mapping: dict[str, Any] | None
    presets: tuple[str, ...]
    note: str | None = None

    @property
    def kind(self) -> str:
        return str(self.source["kind"])

    @property
    def label(self) -> str:
        where = self.source.get("repo") if self.kind == "hub" else self.source.get("builder")
        return f"{self.role} ({where})"

    def unpinned(self) -> list[str]:
        """Names of the fields still "to-be-pinned" (relative to the component)."""
        out = []
        if self.kind == "hub" and self.source.get("commit") == UNPINNED:
            out.append("source.commit")
        if self.model_config.get("sha256") == UNPINNED:
            out.append("model_config.sha256")
        for i, f in enumerate(self.files):
            out += [f"files[{i}].{k} ({f.path})" for k in ("size", "sha256") if getattr(f, k) == UNPINNED]
        return out

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "role": self.role,
            "source": dict(self.source),
            "license": dict(self.license),
            "model_config": dict(self.model_config),
            "files": [f.to_dict() for f in self.files],
            "key_mapping": None if self.key_mapping is None else dict(self.key_mapping),
            "presets": list(self.presets),
        }
        if self.note:
            out["note"] = self.note
        return out


@dataclass(kw_only=True, slots=True)
class WeightsManifest:
    """A whole manifest file."""

    name: str
    model: str
    """value or policy."""
    presets: tuple[str, ...]
    components: list[Component]
    fresh_prefixes: tuple[str, ...] = ()
    note: str | None = None
    path: Path | None = field(default=None, compare=False)

    def unpinned(self) -> list[str]:
        """Every "to-be-pinned" field, as `components[i] role (repo): field`."""
        return [f"components[{i}] {c.label}: {u}" for i, c in enumerate(self.components) for u in c.unpinned()]

    def files(self) -> list[tuple[Component, WeightFile]]:
        return [(c, f) for c in self.components for f in c.files]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "$schema": "./schema.json",
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "name": self.name,
            "model": self.model,
            "presets": list(self.presets),
        }
        if self.note:
            out["note"] = self.note
        out["components"] = [c.to_dict() for c in self.components]
        out["fresh_prefixes"] = list(self.fresh_prefixes)
        return out

    def dumps(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_dict(cls, data: Any, *, path: Path | None = None) -> WeightsManifest:
        """Check every field (types, hex digests, clean paths, config digests); InvalidInputError names the field."""
        r = _Reader(path)
        if not isinstance(data, dict):
            raise r.fail("(root)", "should be a JSON object")
        version = data.get("format_version")
        if data.get("format") != FORMAT or version != FORMAT_VERSION:
            raise UnsupportedFormatError(
                f"{path or 'weights manifest'}: format {data.get('format')!r} version {version!r} is not "
                f"{FORMAT!r} version {FORMAT_VERSION}",
                path=path,
                field="format_version",
                hint="rewrite it after weights_manifest/schema.json, or upgrade recap-portable",
            )
        model = r.get(data, "model", str, "(root)")
        if model not in ("value", "policy"):
            raise r.fail("model", f"{model!r} is not 'value' or 'policy'")
        comps = r.get(data, "components", list, "(root)")
        if not comps:
            raise r.fail("components", "must list at least one component")
        components = [_component(r, c, f"components[{i}]") for i, c in enumerate(comps)]
        _check_distinct(r, components)
        return cls(
            name=r.get(data, "name", str, "(root)"),
            model=model,
            presets=r.strings(data, "presets", "(root)"),
            components=components,
            fresh_prefixes=r.strings(data, "fresh_prefixes", "(root)", []),
            note=r.get(data, "note", str, "(root)", None),
            path=path,
        )


def _check_distinct(r: _Reader, components: list[Component]) -> None:
    """Every file of every component goes to its own path of one weights folder: a path listed twice or a file
    that is another's folder cannot both be written (fetch downloaded both into one path, or failed at exit 8
    half-written: audit59 F2, F4). Paths only case or Unicode normalisation tells apart are two files (`path_clash`)."""
    where = [f"components[{i}].files[{k}].path" for i, c in enumerate(components) for k in range(len(c.files))]
    files = [f for c in components for f in c.files]
    clash = path_clash([f.path for f in files])
    if clash is not None:
        i, j, why = clash
        raise r.fail(
            where[j] if why == "twice" else f"{where[i]} and {where[j]}",
            clash_message(files[i].path, files[j].path, why) + (f" (also {where[i]})" if why == "twice" else ""),
            hint="each file needs a path of its own under the weights folder; fix the manifest",
        )


def check_component(data: Any, *, where: str, label: str) -> Component:
    """`data` checked by the rules `WeightsManifest.from_dict` applies to each component (a component built
    from a Hub's answer is checked so before it is printed or written); InvalidInputError names `label`
    (what `data` came from) and the field."""
    return _component(_Reader(None, label), data, where)


def check_file(data: Any, *, where: str, label: str) -> WeightFile:
    """`data` checked by the rules `WeightsManifest.from_dict` applies to each file of a component."""
    return _file(_Reader(None, label), data, where)


def _file(r: _Reader, data: Any, where: str) -> WeightFile:
    path = check_relative_path(r.get(data, "path", str, where), where=f"{where}.path", path=r.path)
    repo_path = r.get(data, "repo_path", str, where, None)
    if repo_path is not None:
        check_relative_path(repo_path, where=f"{where}.repo_path", path=r.path)
    for key, value in (("repo_path", repo_path or ""), ("path", path)):
        if STATE_DIR in value.split("/"):  # fetch keeps its lock and partial files in DIR/.portable/
            raise r.fail(f"{where}.{key}", f"{value!r:.80} is under {STATE_DIR}/, which is reserved for bookkeeping")
    kind = r.get(data, "kind", str, where, None)
    if kind is not None and kind not in FILE_KINDS:
        raise r.fail(f"{where}.kind", f"{kind!r} is not one of {', '.join(FILE_KINDS)}")
    return WeightFile(
        path=path,
        repo_path=repo_path,
        kind=kind,
        size=r.pinned(data.get("size"), None, f"{where}.size", integer=True),
        sha256=r.pinned(data.get("sha256"), _SHA256, f"{where}.sha256"),
    )


def _source(r: _Reader, data: Any, where: str) -> dict[str, Any]:
    kind = r.get(data, "kind", str, where)
    if kind == "hub":
        repo = r.get(data, "repo", str, where)
        if not re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", repo):
            raise r.fail(f"{where}.repo", f"{repo!r} is not OWNER/NAME")
        repo_type = r.get(data, "repo_type", str, where)
        if repo_type not in ("model", "dataset"):
            raise r.fail(f"{where}.repo_type", f"{repo_type!r} is not 'model' or 'dataset'")
        r.get(data, "revision", str, where)
        r.pinned(data.get("commit"), _COMMIT, f"{where}.commit")
        return dict(data)
    if kind == "built":
        builder = r.get(data, "builder", str, where)
        if not _BUILDER.fullmatch(builder):
            raise r.fail(f"{where}.builder", f"{builder!r} is not 'module:function'")
        r.get(data, "seed", int, where)
        r.get(data, "config", dict, where)
        config_class = r.get(data, "config_class", str, where, None)
        if config_class is not None and not _BUILDER.fullmatch(config_class):
            raise r.fail(f"{where}.config_class", f"{config_class!r} is not 'module:Class'")
        return dict(data)
    raise r.fail(f"{where}.kind", f"{kind!r} is not 'hub' or 'built'")


def _component(r: _Reader, data: Any, where: str) -> Component:
    files = [_file(r, f, f"{where}.files[{i}]") for i, f in enumerate(r.get(data, "files", list, where))]
    if not files:
        raise r.fail(f"{where}.files", "must list at least one file")
    source = _source(r, r.get(data, "source", dict, where), f"{where}.source")
    lic = r.get(data, "license", dict, where)
    r.get(lic, "id", str, f"{where}.license")
    r.get(lic, "file", str, f"{where}.license")
    config = r.get(data, "model_config", dict, where)
    config_sha = r.pinned(config.get("sha256"), _SHA256, f"{where}.model_config.sha256")
    if source["kind"] == "hub":
        config_path = r.get(config, "path", str, f"{where}.model_config")
        match = [f for f in files if f.path == config_path]
        if not match:
            raise r.fail(f"{where}.model_config.path", f"{config_path!r} is not one of the component's files")
        if UNPINNED not in (config_sha, match[0].sha256) and config_sha != match[0].sha256:
            raise r.fail(f"{where}.model_config.sha256", f"{config_sha} is not the sha256 of {config_path}")
    elif config_sha != UNPINNED and config_sha != canonical_sha256(source["config"]):
        raise r.fail(
            f"{where}.model_config.sha256",
            f"{config_sha} is not the digest of source.config ({canonical_sha256(source['config'])})",
            hint="the config was edited after pinning: pin again (`portable weights pin MANIFEST`)",
        )
    mapping = data.get("key_mapping", ...)
    if mapping is ...:
        raise r.fail(f"{where}.key_mapping", "missing (null when the files are not loaded into a model)")
    if mapping is not None:
        r.get(mapping, "source_prefix", str, f"{where}.key_mapping")
        r.get(mapping, "target_prefix", str, f"{where}.key_mapping")
        r.strings(mapping, "ignore_prefixes", f"{where}.key_mapping", [])
    return Component(
        role=r.get(data, "role", str, where),
        source=source,
        license=dict(lic),
        model_config=dict(config),
        files=files,
        key_mapping=None if mapping is None else dict(mapping),
        presets=r.strings(data, "presets", where),
        note=r.get(data, "note", str, where, None),
    )


def load_weights_manifest(path: Path, *, licenses: LicenseIndex | None = None, repin: bool = False) -> WeightsManifest:
    """Read and check a manifest, its license ids and files included (against `licenses`, default the
    project's LICENSES/index.json). Raises InputNotFoundError, InvalidInputError, UnsupportedFormatError.

    `repin` (for `portable weights pin`) accepts a built component whose config was edited since its
    last pin: its config digest is read as unpinned, since pinning records it again."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise InputNotFoundError(
            f"weights manifest {path} does not exist", path=path, hint="name a file under weights_manifest/"
        ) from None
    try:
        data = strict_json.loads(raw.decode("utf-8"))
    except strict_json.RepeatedKeyError as exc:  # json would keep the last value silently (audit58 A1)
        raise InvalidInputError(
            f"{path}: {exc}", path=path, field=exc.key, hint="fix the manifest (see weights_manifest/schema.json)"
        ) from None
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError included; nesting too deep (audit F14)
        raise InvalidInputError(
            f"{path}: not valid JSON ({str(exc)[:80] or type(exc).__name__})",
            path=path,
            field="(root)",
            hint="fix the manifest (see weights_manifest/schema.json)",
        ) from None
    if repin and isinstance(data, dict) and isinstance(data.get("components"), list):
        for comp in data["components"]:
            built = isinstance(comp, dict) and isinstance(comp.get("source"), dict) and comp["source"].get("kind")
            if built == "built" and isinstance(comp.get("model_config"), dict):
                comp["model_config"]["sha256"] = UNPINNED
    manifest = WeightsManifest.from_dict(data, path=path)
    (licenses or load_license_index(near=path, needed_by=f"weights manifest {path}")).check(manifest)
    return manifest


def write_weights_manifest(path: Path, manifest: WeightsManifest) -> None:
    """Write `manifest` atomically (the old file stays whole if this fails)."""
    atomic_write_text(Path(path), manifest.dumps())


# -- licenses ---------------------------------------------------------------------------------------


@dataclass(kw_only=True, slots=True)
class LicenseIndex:
    """LICENSES/index.json: license files (id, name, gated, what to accept) and the components they cover."""

    root: Path
    """The LICENSES/ folder."""
    files: dict[str, dict[str, Any]]
    components: dict[str, dict[str, Any]]

    @property
    def ids(self) -> list[str]:
        return sorted({str(v["id"]) for v in self.files.values()})

    def check_license(self, lic: dict[str, Any], *, where: str, path: Path | None = None) -> str:
        """Return the license file's name in LICENSES/; InvalidInputError for an unknown id or a file of another id."""
        lid, file = lic.get("id"), str(lic.get("file", ""))
        if lid not in self.ids:
            raise InvalidInputError(
                f"{path or 'manifest'}: {where}.id: unknown license id {lid!r} (known: {', '.join(self.ids)})",
                path=path,
                field=f"{where}.id",
                hint="add the license text to LICENSES/ and list it in LICENSES/index.json, or fix the id",
            )
        name = file.removeprefix("LICENSES/")
        entry = self.files.get(name)
        if entry is None or not (self.root / name).is_file():
            raise InvalidInputError(
                f"{path or 'manifest'}: {where}.file: {file!r} is not a license file in {self.root}",
                path=path,
                field=f"{where}.file",
                hint=f"use one of: {', '.join('LICENSES/' + n for n in sorted(self.files))}",
            )
        if entry["id"] != lid:
            raise InvalidInputError(
                f"{path or 'manifest'}: {where}: {file} holds license {entry['id']!r}, not {lid!r}",
                path=path,
                field=f"{where}.file",
            )
        return name

    def check(self, manifest: WeightsManifest) -> list[str]:
        """Check every component's license; returns the license file names the manifest needs."""
        names = []
        for i, comp in enumerate(manifest.components):
            names.append(self.check_license(comp.license, where=f"components[{i}].license", path=manifest.path))
        return sorted(set(names))

    def component_file(self, component: str, *, where: str, path: Path | None = None) -> str:
        """The license file covering a named component (spec `licenses = [...]`)."""
        entry = self.components.get(component)
        if entry is None:
            raise InvalidInputError(
                f"{path or 'spec'}: {where}: unknown component {component!r} "
                f"(known: {', '.join(sorted(self.components))})",
                path=path,
                field=where,
                hint="name a component listed in LICENSES/index.json",
            )
        return str(entry["file"])

    def describe(self, name: str) -> str:
        """One line for a model card: 'Gemma Terms of Use (gemma, gated: ...)'."""
        entry = self.files[name]
        text = f"{entry['name']} (`{entry['id']}`)"
        if entry.get("gated"):
            text += f"; gated: {entry.get('accept', 'accept the terms on the Hub before downloading')}"
        return text


def load_license_index(
    root: Path | None = None, *, near: Path | None = None, needed_by: str = "this command"
) -> LicenseIndex:
    """Read `root`/index.json (default: the LICENSES/ of `project_root(near)`; a missing one is
    `project_path`'s error)."""
    if root is None:
        root = project_path("LICENSES/index.json", needed_by=needed_by, near=near).parent
    root = Path(root)
    try:
        data = strict_json.loads((root / "index.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputNotFoundError(
            f"{root / 'index.json'} does not exist: the license registry is missing",
            path=root / "index.json",
            hint="run from a recap-portable checkout or a bundle (both carry LICENSES/index.json)",
        ) from None
    except strict_json.RepeatedKeyError as exc:  # json would keep the last value silently (audit58 A1)
        raise InvalidInputError(
            f"{root / 'index.json'}: {exc}",
            path=root / "index.json",
            field=exc.key,
            hint="the license registry is damaged; fetch or pack the bundle again",
        ) from None
    except (ValueError, RecursionError) as exc:
        raise InvalidInputError(
            f"{root / 'index.json'}: not valid JSON ({str(exc)[:80] or type(exc).__name__})",
            path=root / "index.json",
            hint="the license registry is damaged; fetch or pack the bundle again",
        ) from None
    files = data.get("licenses", {}) if isinstance(data, dict) else None
    components = data.get("components", {}) if isinstance(data, dict) else None
    if not isinstance(files, dict) or not isinstance(components, dict):  # a bundle's copy is input (audit F14)
        raise InvalidInputError(
            f"{root / 'index.json'}: should be an object whose 'licenses' and 'components' are objects",
            path=root / "index.json",
            hint="the license registry is damaged; fetch or pack the bundle again",
        )
    return LicenseIndex(root=root, files=dict(files), components=dict(components))
