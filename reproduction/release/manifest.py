"""`bundle.json`: the typed manifest of a release bundle, and its (de)serialisation.

On disk::

    <bundle>/
      bundle.json          written LAST by pack/fetch: its presence means the bundle is complete
      reproduction/ runtime/*.tar.zst source/*.tar.zst weights/ data/ config/ evidence/ LICENSES/
      <target>.members.json  each layer's member index (see release/layers.py), a pinned file like the others
      <layer targets>/     what restore extracts (e.g. runtime/python/ from runtime/python.tar.zst)
      .portable/           local state, never part of the bundle: receipt.json (what restore wrote),
                           lock (fcntl), staging/ and trash/ (restore's temporary folders)

`bundle.json` lists every other file of the bundle (path relative to the bundle, size, sha256),
every layer (archive, target, kind, order, the prefix it was built at and the files in which that
prefix occurs), the entry config and the format version. `FORMAT_VERSION` is "MAJOR.MINOR": a
reader accepts any minor of its major and refuses other majors with the fix named. `verify` reports
as "extra" any file not listed, except bundle.json, `.portable/`, the layers' targets, `runs/` (a
user's run outputs) and `reproduction/**/__pycache__/`; `restore` leaves extra files alone unless one
sits on a layer target's path. A manifest is refused (InvalidInputError, exit 4) when it lists a
file under `.portable/` or `runs/`, or bundle.json itself, a file that is another's folder (`x` and `x/y`), an
archive in two layers, a path that is not clean and relative (`.`, `..`, absolute, NUL, a control
character, a component over 255 bytes or 4095 in all), an entry_config that is not one of its files,
or an integer beyond 2**63-1.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from reproduction import strict_json
from reproduction.digests import is_sha256
from reproduction.errors import (
    InputNotFoundError,
    InvalidInputError,
    ReadFailedError,
    UnsupportedFormatError,
    os_error,
)
from reproduction.fsio import atomic_write_text, open_regular

FORMAT = "recap-portable-bundle"
FORMAT_VERSION = "1.0"
MANIFEST_NAME = "bundle.json"
STATE_DIR = ".portable"
RUNS_DIR = "runs"
"""The one folder of a bundle where a user's own files (run outputs) may live: never reported as extra, never a
bundle file (pack refuses a dest there, the manifest check a listed file: audit48 F4)."""
LAYER_KINDS = ("runtime", "source")
PREFIX_MODES = ("text", "binary", "elf-runpath")


MAX_INT = (1 << 63) - 1
"""Largest integer a manifest field may hold (sizes, counts, order)."""


def _require(data: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str, path: Path | None) -> Any:
    if not isinstance(data, dict):
        raise InvalidInputError(
            f"{where}: should be an object, got {type(data).__name__} {data!r:.60}",
            path=path,
            field=where,
            hint="the manifest is damaged; fetch or pack the bundle again",
        )
    if key not in data:
        raise InvalidInputError(
            f"{where}: missing field '{key}'",
            path=path,
            field=f"{where}.{key}",
            hint="the manifest is damaged; fetch or pack the bundle again",
        )
    value = data[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is int or kind is int and abs(value) > MAX_INT:
        # an int past the limit got "should be int, got int 9223372036854775808" (audit60 A1): name the limit
        # ... only for an int field: a str field given 1 said "should be an integer ..., got int 1" (audit62 L1)
        wanted = (
            f"an integer from -{MAX_INT} to {MAX_INT} (2**63-1)"
            if kind is int and type(value) is int
            else getattr(kind, "__name__", kind)
        )
        raise InvalidInputError(
            f"{where}: field '{key}' should be {wanted}, got {type(value).__name__} {value!r:.60}",
            path=path,
            field=f"{where}.{key}",
            hint="the manifest is damaged; fetch or pack the bundle again",
        )
    return value


def _count(data: dict[str, Any], key: str, where: str, path: Path | None) -> int:
    """An optional non-negative integer field (0 when absent)."""
    value = data.get(key, 0)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_INT:
        raise InvalidInputError(
            f"{where}: field '{key}' should be a non-negative integer of at most {MAX_INT} (2**63-1), "
            f"got {value!r:.60}",
            path=path,
            field=f"{where}.{key}",
            hint="the manifest is damaged; fetch or pack the bundle again",
        )
    return value


def _optional_path(data: dict[str, Any], key: str, where: str, path: Path | None) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidInputError(
            f"{where}: field '{key}' should be a path or null",
            path=path,
            field=f"{where}.{key}",
            hint="the manifest is damaged or hostile; fetch or pack the bundle again",
        )
    return check_relative_path(value, where=f"{where}.{key}", path=path)


def _foreign(data: dict[str, Any], where: str, path: Path | None) -> dict[str, tuple[PrefixOccurrence, ...]]:
    value = data.get("foreign_prefix_files", {})
    if not isinstance(value, dict) or not all(isinstance(v, list) for v in value.values()):
        raise InvalidInputError(
            f"{where}: foreign_prefix_files must map archives to lists",
            path=path,
            field=f"{where}.foreign_prefix_files",
            hint="the manifest is damaged; fetch or pack the bundle again",
        )
    return {
        check_relative_path(k, where=f"{where}.foreign_prefix_files", path=path): tuple(
            PrefixOccurrence.from_dict(o, where=f"{where}.foreign_prefix_files[{k!r}][{i}]", path=path)
            for i, o in enumerate(v)
        )
        for k, v in value.items()
    }


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
"""C0 (below 32), DEL and C1 (U+0080..U+009F: NEL is a line break to some readers, CSI starts an escape sequence
on some terminals)."""


def has_control(text: str) -> bool:
    """True when `text` holds a control character (C0, DEL or C1): refused in bundle paths, build prefixes, archive
    members and the bundle's own path when relocating (a newline splits every listing, error and shebang). Every
    message that names such a text prints its repr, which escapes all of them."""
    return _CONTROL.search(text) is not None


DECEPTIVE_FORMAT = frozenset(
    [*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C]  # bidi embeddings, overrides, isolates
    + [0x200B, 0x2060, 0x2061, 0x2062, 0x2063, 0x2064, 0xFEFF, 0x00AD, 0x180E]  # invisible: no glyph, no joining
)
"""The Unicode format characters (category Cf) a name may not hold: each reorders the text after it or shows as
nothing. The other Cf characters are left to names that need them: U+200C/U+200D (ZWNJ/ZWJ: Persian and Indic
words, emoji sequences), the tag characters of subdivision flags (review58 R3); messages print every one escaped."""


def has_format(text: str) -> bool:
    """True when `text` holds a deceptive Unicode format character (DECEPTIVE_FORMAT: the bidi overrides and isolates
    U+202A..U+202E and U+2066..U+2069, U+200B ZERO WIDTH SPACE, U+FEFF, a soft hyphen...): each is invisible or
    reorders the text after it, so a name holding one shows as another one (`evil\\u202eyp.txt`, `a\\u200b.py` next to
    `a.py`: Trojan Source, CVE-2021-42574). Refused where has_control is, in archive members and bundle paths (a
    bundle is untrusted input, so as with a control character the name is refused rather than written and shown;
    audit58 A5)."""
    return not text.isascii() and any(ord(c) in DECEPTIVE_FORMAT for c in text)


def shown_name(text: str) -> str:
    """`text` for a message line, every character that is not printable (a control character, a format character
    such as U+202E or U+200B, an undecodable byte's surrogate) escaped as repr writes it (`\\n`, `\\u202e`,
    `\\udcff`), the rest as is (no quotes, `é` stays `é`)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def path_clash(paths: list[str]) -> tuple[int, int, str] | None:
    """The first two of `paths` that cannot both be files of one folder, as (i, j, why): "twice" (the same
    path, i < j) or "folder" (paths[i] is a file and the folder of paths[j]); None when every path can be written.
    Paths that differ only by case or Unicode normalisation are two files here, as on the case-sensitive Linux
    filesystems restore and fetch write (a runtime layer's Linux headers hold such pairs: xt_MARK.h, xt_mark.h),
    so they are accepted. `clash_message` words the answer."""
    exact: dict[str, int] = {}
    for j, rel in enumerate(paths):
        if rel in exact:
            return exact[rel], j, "twice"
        exact[rel] = j
    for j, rel in enumerate(paths):
        head = rel.rpartition("/")[0]
        while head:
            if head in exact:
                return exact[head], j, "folder"
            head = head.rpartition("/")[0]
    return None


def clash_message(first: str, second: str, why: str) -> str:
    """One line for a `path_clash` answer (`first`, `second`: the two paths)."""
    if why == "twice":
        return f"{first!r} is listed twice"
    return f"{first!r} is listed as a file and as the folder of {second!r}"


def check_relative_path(rel: str, *, where: str, path: Path | None = None) -> str:
    """Return `rel` if it is a clean relative POSIX path inside its root, else raise InvalidInputError."""
    p = PurePosixPath(rel) if isinstance(rel, str) and "\0" not in rel else PurePosixPath("/")
    if (
        not rel
        or rel == "."
        or p.is_absolute()
        or ".." in p.parts
        or rel.startswith("~")
        or "\\" in rel
        or str(p) != rel
    ):
        raise InvalidInputError(
            f"{where}: path {rel!r} is not a clean relative path inside the bundle",
            path=path,
            field=where,
            hint="the manifest is damaged or hostile; do not use this bundle",
        )
    try:  # surrogateescape: a name of undecodable bytes (\udc80-\udcff) is a real file name, \ud800 is none
        encoded = rel.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise InvalidInputError(  # else verify or restore met it as an internal error (audit45 F5)
            f"{where}: path {rel[:60]!r} holds a lone surrogate such as \\ud800, which no file name has",
            path=path,
            field=where,
            hint="the manifest is damaged or hostile; do not use this bundle",
        ) from None
    if len(encoded) > PATH_MAX or any(len(part) > NAME_MAX for part in encoded.split(b"/")):
        raise InvalidInputError(  # else verify or restore met it as exit 8 "cannot write" (audit F11)
            f"{where}: path {rel[:60]!r}... is longer than filesystems allow ({NAME_MAX} bytes a component, "
            f"{PATH_MAX} in all)",
            path=path,
            field=where,
            hint="the manifest is damaged or hostile; do not use this bundle",
        )
    if has_control(rel):
        raise InvalidInputError(  # a newline would split a path across lines of every listing and error
            f"{where}: path {rel!r} holds a control character",
            path=path,
            field=where,
            hint="the manifest is damaged or hostile; do not use this bundle",
        )
    if has_format(rel):
        raise InvalidInputError(  # an invisible or reordering character shows the path as another (audit58 A5)
            f"{where}: path {rel!r} holds a Unicode format character (invisible or text-reordering)",
            path=path,
            field=where,
            hint="the manifest is damaged or hostile; do not use this bundle",
        )
    return rel


def _check_build_prefix(prefix: str, *, where: str, path: Path | None) -> None:
    """Refuse an absolute `prefix` that relocate.normalize_prefix would refuse at restore (exit 9 "relocation
    impossible", after extracting: audit48 F7): `/` itself, a NUL, a newline or another control character, a lone
    surrogate (no file name has one)."""
    problem = None
    if not prefix.rstrip("/"):
        problem = "is the root folder; a layer is built in a folder below /"
    elif has_control(prefix):
        problem = "holds a control character (a newline splits every listing and shebang it is written into)"
    else:
        try:
            prefix.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            problem = "holds a lone surrogate such as \\ud800, which no file name has"
    if problem:
        raise InvalidInputError(
            f"{where}: {prefix[:70]!r}{'...' if len(prefix) > 70 else ''} {problem}",
            path=path,
            field=where,
            hint="the manifest is damaged or hostile; do not use this bundle",
        )


NAME_MAX = 255
"""Longest file name (one path component, in bytes) Linux filesystems take."""
PATH_MAX = 4095
"""Longest path (and symlink text) in bytes the kernel takes."""


@dataclass(kw_only=True, slots=True, frozen=True)
class FileEntry:
    """One file of the bundle, pinned by size and SHA-256."""

    path: str
    """POSIX path relative to the bundle root."""
    size: int
    """Size in bytes."""
    sha256: str
    """Lower-case hex digest of the file's bytes."""

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256}

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, where: str = "files[]", path: Path | None = None) -> FileEntry:
        rel = check_relative_path(_require(data, "path", str, where, path), where=f"{where}.path", path=path)
        size = _require(data, "size", int, where, path)
        digest = _require(data, "sha256", str, where, path)
        if size < 0:
            raise InvalidInputError(
                f"{where}.size: {size} for {rel!r} is negative; a size is a byte count, 0 or more",
                path=path,
                field=f"{where}.size",
                hint="the manifest is damaged or hostile; fetch or pack the bundle again",
            )
        if not is_sha256(digest):
            raise InvalidInputError(  # audit48 F5: named neither the field, the value nor the rule
                f"{where}.sha256: {digest[:70]!r}{'...' if len(digest) > 70 else ''} for {rel!r} is not 64 "
                f"lower-case hex digits ({len(digest)} characters{', upper-case' if digest != digest.lower() else ''})",
                path=path,
                field=f"{where}.sha256",
                hint="the manifest is damaged or hostile; fetch or pack the bundle again",
            )
        return cls(path=rel, size=size, sha256=digest)


@dataclass(kw_only=True, slots=True, frozen=True)
class PrefixOccurrence:
    """A file inside a layer that contains the layer's build prefix and must be rewritten on restore."""

    path: str
    """Member path relative to the layer's target."""
    mode: str
    """'text' (any-length replace), 'binary' (same-length, NUL-padded) or 'elf-runpath'."""

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "mode": self.mode}

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, where: str, path: Path | None = None) -> PrefixOccurrence:
        rel = check_relative_path(_require(data, "path", str, where, path), where=f"{where}.path", path=path)
        mode = _require(data, "mode", str, where, path)
        if mode not in PREFIX_MODES:
            raise InvalidInputError(
                f"{where}: mode {mode!r} is not one of {', '.join(PREFIX_MODES)}", path=path, field=f"{where}.mode"
            )
        return cls(path=rel, mode=mode)


@dataclass(kw_only=True, slots=True, frozen=True)
class LayerEntry:
    """A `.tar.zst` archive extracted into `target` at restore, in `order`."""

    archive: str
    """Path of the archive relative to the bundle (also listed in `files`)."""
    target: str
    """Folder relative to the bundle that the layer becomes."""
    kind: str
    """'runtime' (interpreter, venv) or 'source' (project overlays, upstream snapshots)."""
    order: int
    """Extraction order; later layers may add files to an earlier layer's target only if declared."""
    build_prefix: str | None = None
    """Absolute path the tree lived at when packed (None for a layer that needs no relocation)."""
    prefix_files: tuple[PrefixOccurrence, ...] = ()
    """Files that contain `build_prefix`, with how to rewrite them."""
    foreign_prefix_files: dict[str, tuple[PrefixOccurrence, ...]] = field(default_factory=dict)
    """Files that contain ANOTHER layer's build prefix (a venv naming its interpreter), by that layer's archive."""
    members: int = 0
    """Number of archive members (files, dirs, links)."""
    unpacked_size: int = 0
    """Sum of regular file sizes once extracted."""
    tar_size: int = 0
    """Exact size of the decompressed tar stream; restore refuses a longer stream (0: unknown, not bounded)."""
    members_index: str | None = None
    """Bundle file listing the archive's members (see release/layers.py); lets restore extract in one pass."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "archive": self.archive,
            "target": self.target,
            "kind": self.kind,
            "order": self.order,
            "build_prefix": self.build_prefix,
            "prefix_files": [o.to_dict() for o in self.prefix_files],
            "foreign_prefix_files": {k: [o.to_dict() for o in v] for k, v in sorted(self.foreign_prefix_files.items())},
            "members": self.members,
            "unpacked_size": self.unpacked_size,
            "tar_size": self.tar_size,
            "members_index": self.members_index,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, where: str = "layers[]", path: Path | None = None) -> LayerEntry:
        kind = _require(data, "kind", str, where, path)
        if kind not in LAYER_KINDS:
            raise InvalidInputError(
                f"{where}: kind {kind!r} is not one of {', '.join(LAYER_KINDS)}", path=path, field=f"{where}.kind"
            )
        prefix = data.get("build_prefix")
        if prefix is not None and (not isinstance(prefix, str) or not prefix.startswith("/")):
            raise InvalidInputError(
                f"{where}: build_prefix must be an absolute path or null", path=path, field=f"{where}.build_prefix"
            )
        if prefix is not None:
            _check_build_prefix(prefix, where=f"{where}.build_prefix", path=path)
        occurrences = data.get("prefix_files", [])
        if not isinstance(occurrences, list):
            raise InvalidInputError(f"{where}: prefix_files must be a list", path=path, field=f"{where}.prefix_files")
        unpacked, tar_size = _count(data, "unpacked_size", where, path), _count(data, "tar_size", where, path)
        if (
            tar_size and unpacked > tar_size
        ):  # a tar stream holds its files' bytes: restore asked for 8 EiB (audit60 A2)
            raise InvalidInputError(
                f"{where}: field 'unpacked_size' is {unpacked}, more than its tar_size of {tar_size} bytes, "
                f"which holds every byte of the layer's files",
                path=path,
                field=f"{where}.unpacked_size",
                hint="the manifest is damaged or hostile; do not use this bundle; ask its publisher to re-pack it",
            )
        return cls(
            archive=check_relative_path(
                _require(data, "archive", str, where, path), where=f"{where}.archive", path=path
            ),
            target=check_relative_path(_require(data, "target", str, where, path), where=f"{where}.target", path=path),
            kind=kind,
            order=_require(data, "order", int, where, path),
            build_prefix=prefix,
            prefix_files=tuple(
                PrefixOccurrence.from_dict(o, where=f"{where}.prefix_files[{i}]", path=path)
                for i, o in enumerate(occurrences)
            ),
            foreign_prefix_files=_foreign(data, where, path),
            members=_count(data, "members", where, path),
            unpacked_size=unpacked,
            tar_size=tar_size,
            members_index=_optional_path(data, "members_index", where, path),
        )


@dataclass(kw_only=True, slots=True)
class Manifest:
    """The whole `bundle.json`."""

    name: str
    """Bundle name (from the spec)."""
    files: list[FileEntry]
    """Every file of the bundle except bundle.json itself, sorted by path."""
    layers: list[LayerEntry] = field(default_factory=list)
    """Archives to extract at restore, sorted by order."""
    entry_config: str | None = None
    """The run config a plain `portable run` uses, relative to the bundle."""
    created: str = ""
    """ISO-8601 UTC time of packing (informational; not part of any digest)."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Free-form information: description, upstream repos and revisions, licenses."""
    format_version: str = FORMAT_VERSION

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for entry in self.files:
            if entry.path in seen:
                raise InvalidInputError(f"files: {entry.path!r} is listed twice", field="files")
            seen.add(entry.path)
        for entry in self.files:  # `x` and `x/y`: one of them cannot be written (fetch failed at exit 8: audit F8a)
            head = entry.path.rpartition("/")[0]
            while head:
                if head in seen:
                    raise InvalidInputError(
                        f"files: {head!r} is listed as a file and as the folder of {entry.path!r}",
                        field="files",
                        hint="the manifest is damaged or hostile; do not use this bundle",
                    )
                head = head.rpartition("/")[0]
        archives = {layer.archive for layer in self.layers}
        if len(archives) != len(self.layers):
            twice = sorted({x.archive for x in self.layers if sum(y.archive == x.archive for y in self.layers) > 1})
            raise InvalidInputError(
                f"layers: archive {twice[0]!r} is listed in more than one layer",
                field="layers.archive",
                hint="each layer archive is extracted at one target; the manifest is damaged or hostile",
            )
        if self.entry_config is not None and self.entry_config not in seen:
            raise InvalidInputError(
                f"entry_config {self.entry_config!r} is not a file of the bundle",
                field="entry_config",
                hint="the manifest is damaged or hostile; fetch or pack the bundle again",
            )
        for layer in self.layers:
            if layer.archive not in seen:
                raise InvalidInputError(f"layers: archive {layer.archive!r} is not in files", field="layers.archive")
            if layer.members_index is not None and layer.members_index not in seen:
                raise InvalidInputError(
                    f"layers: members_index {layer.members_index!r} is not in files", field="layers.members_index"
                )
            for other in layer.foreign_prefix_files:
                if other not in archives:
                    raise InvalidInputError(
                        f"layers: {layer.archive!r} names unknown layer {other!r} in foreign_prefix_files",
                        field="layers.foreign_prefix_files",
                    )
        self.files.sort(key=lambda e: e.path)
        self.layers.sort(key=lambda layer: layer.order)

    def file(self, rel: str) -> FileEntry | None:
        for entry in self.files:
            if entry.path == rel:
                return entry
        return None

    @property
    def total_size(self) -> int:
        return sum(e.size for e in self.files)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "format_version": self.format_version,
            "name": self.name,
            "created": self.created,
            "entry_config": self.entry_config,
            "metadata": self.metadata,
            "layers": [layer.to_dict() for layer in self.layers],
            "files": [e.to_dict() for e in self.files],
        }

    @classmethod
    def from_dict(cls, data: Any, *, path: Path | None = None) -> Manifest:
        if not isinstance(data, dict):
            raise InvalidInputError("manifest: top level must be a JSON object", path=path, field="(root)")
        fmt = data.get("format")
        if fmt != FORMAT:
            raise InvalidInputError(
                f"manifest: field 'format' is {fmt!r}, expected {FORMAT!r}",
                path=path,
                field="format",
                hint="this is not a recap-portable bundle manifest",
            )
        version = _require(data, "format_version", str, "manifest", path)
        major = version.split(".", 1)[0]
        if major != FORMAT_VERSION.split(".", 1)[0] or not major.isdigit():
            raise UnsupportedFormatError(
                f"manifest: format_version {version!r} is not supported (this portable reads "
                f"{FORMAT_VERSION.split('.')[0]}.x)",
                path=path,
                field="format_version",
                hint="use the runner shipped inside the bundle: python3 <bundle>/reproduction/portable.py ...",
            )
        files = _require(data, "files", list, "manifest", path)
        layers = data.get("layers", [])
        if not isinstance(layers, list):
            raise InvalidInputError("manifest: field 'layers' must be a list", path=path, field="layers")
        metadata = data.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise InvalidInputError(
                "manifest: field 'metadata' must be an object",
                path=path,
                field="metadata",
                hint="the manifest is damaged or hostile; fetch or pack the bundle again",
            )
        entry = _optional_path(data, "entry_config", "manifest", path)
        for i, f in enumerate(files):
            rel = f.get("path") if isinstance(f, dict) else None
            if isinstance(rel, str) and (rel == MANIFEST_NAME or rel.split("/", 1)[0] == STATE_DIR):
                raise InvalidInputError(  # the bundle's own bookkeeping: a first restore works, every later one fails
                    f"files[{i}]: lists {rel!r}, which is reserved for bookkeeping",
                    path=path,
                    field=f"files[{i}].path",
                    hint="the manifest is damaged or hostile; do not use this bundle",
                )
            if isinstance(rel, str) and rel.split("/", 1)[0] == RUNS_DIR:
                raise InvalidInputError(  # the user's run outputs: a listed file there made them integrity failures
                    f"files[{i}]: lists {rel!r}, under {RUNS_DIR}/, which is left to the user's runs (pack never "
                    "writes there)",
                    path=path,
                    field=f"files[{i}].path",
                    hint="the manifest is damaged or hostile; do not use this bundle",
                )
        return cls(
            name=_require(data, "name", str, "manifest", path),
            files=[FileEntry.from_dict(f, where=f"files[{i}]", path=path) for i, f in enumerate(files)],
            layers=[LayerEntry.from_dict(layer, where=f"layers[{i}]", path=path) for i, layer in enumerate(layers)],
            entry_config=entry,
            created=data["created"][:100] if isinstance(data.get("created"), str) else "",
            metadata=metadata,
            format_version=version,
        )

    def dumps(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=False) + "\n"


def load_manifest(bundle: Path) -> Manifest:
    """Read `<bundle>/bundle.json`. Raises InputNotFoundError, InvalidInputError, UnsupportedFormatError."""
    path = Path(bundle) / MANIFEST_NAME
    if Path(bundle).exists() and not Path(bundle).is_dir():
        raise InputNotFoundError(
            f"{bundle} is a file, not a bundle folder",
            path=bundle,
            hint="pass the folder that holds bundle.json (e.g. the folder `portable fetch` or `portable pack` made)",
        )
    try:  # never blocks on a FIFO (verify and restore hung on one: audit48 F2); a link to a regular file is fine
        fh = open_regular(os.path.realpath(path))
        if fh is None:
            raise ReadFailedError(
                f"{path}: not a regular file (a folder, a FIFO or a device), so it holds no bundle manifest",
                path=path,
                hint="put the bundle's own bundle.json there: fetch or pack the bundle again",
            )
        with fh:
            data = fh.read()
    except FileNotFoundError:
        raise InputNotFoundError(
            f"{path}: no bundle manifest (bundle.json)",
            path=path,
            hint="a bundle is complete only once bundle.json exists: pack or fetch it again",
        ) from None
    except ReadFailedError:
        raise
    except OSError as exc:
        raise os_error(exc, "the bundle manifest", op="read") from None
    return parse_manifest(data, path=path)


def parse_manifest(data: bytes, *, path: Path, hint: str = "fetch or pack the bundle again") -> Manifest:
    """The manifest in `data` (the bytes of a bundle.json read from `path`), read strictly: UTF-8 without a BOM,
    no key repeated in one object. Raises InvalidInputError naming `path` (or UnsupportedFormatError) with `hint`
    as the fix; load_manifest (verify, restore) and fetch (the Hub's copy, before it writes anything: audit62
    M2) read a manifest the same way, so what one accepts the other never refuses."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInputError(
            f"{path}: not UTF-8 text", path=path, field="(root)", hint=f"the manifest is damaged; {hint}"
        ) from None
    try:
        parsed = strict_json.loads(text)
    except strict_json.RepeatedKeyError as exc:  # the last value silently won: a second "layers" dropped them (A1)
        raise InvalidInputError(
            f"{path}: the key {exc.key!r} occurs {exc.times} times in {exc.where or 'the top level'}; "
            "a manifest that JSON readers would read differently is damaged or hostile",
            path=path,
            field=f"{exc.where}.{exc.key}" if exc.where else exc.key,
            hint=hint,
        ) from None
    except json.JSONDecodeError as exc:
        raise InvalidInputError(
            f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})",
            path=path,
            field="(root)",
            hint=f"the manifest is damaged; {hint}",
        ) from None
    except (ValueError, RecursionError) as exc:  # an integer of more than 4,300 digits; nesting too deep
        raise InvalidInputError(
            f"{path}: not a manifest this portable reads ({str(exc)[:80] or type(exc).__name__})",
            path=path,
            field="(root)",
            hint=f"the manifest is damaged or hostile; {hint}",
        ) from None
    try:
        return Manifest.from_dict(parsed, path=path)
    except InvalidInputError as exc:
        exc.hint = exc.hint or f"the manifest is damaged or hostile; {hint}"
        raise


def write_manifest(bundle: Path, manifest: Manifest) -> Path:
    """Atomically write `<bundle>/bundle.json` (temp file, fsync, rename). Returns its path."""
    path = Path(bundle) / MANIFEST_NAME
    atomic_write_text(path, manifest.dumps())
    return path
