"""Decide, before any byte is written, that every member of every layer stays inside its target.

All layers are checked together against one union view of the paths they would create (paths
relative to the bundle), so a symlink planted by one layer and written through by a later one (the
two-archive attack) is caught as well as the single-archive attacks. Refused: absolute names,
`..` in names, control characters in names or link text, paths more than MAX_DEPTH folders deep,
hard links, device files and fifos, setuid/setgid bits, writing through or replacing a symlink, a
file where a folder is (or the reverse), absolute symlink text, and symlinks whose target leaves
the union of the bundle's layer targets. Relative symlinks may only climb (`../`) at their start,
so a lexical check is exact: the climb walks real folders (their parents are checked not to be
symlinks) and every later hop lands on a path this same rule vetted.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from reproduction.errors import InvalidInputError, RelocationError, UnsafeArchiveError
from reproduction.release.extract import open_parent
from reproduction.release.manifest import (
    MANIFEST_NAME,
    NAME_MAX,
    PATH_MAX,
    RUNS_DIR,
    STATE_DIR,
    Manifest,
    has_control,
    has_format,
)
from reproduction.release.tarscan import Member

_MAX_LISTED = 10

MAX_DEPTH = 256
"""Most folders a member's bundle-relative path may lie below (real trees stay far under it). Deeper trees
restored once, then wedged every later restore in recursive tree removal (audit48 F9), so they are refused."""


@dataclass(slots=True)
class UnionView:
    """What the layers would create, by bundle-relative path: kind and the archive that made it."""

    targets: tuple[str, ...]
    entries: dict[str, tuple[str, str]] = field(default_factory=dict)

    def inside_targets(self, rel: str) -> bool:
        return any(rel == t or rel.startswith(t + "/") for t in self.targets)


def check_targets(manifest: Manifest, *, packing: bool = False) -> None:
    """Layer targets are equal (an overlay, of layers of one kind) or disjoint, and never hold a plain file, the runner
    or `runs/`; a member index is never a layer archive.

    Raises InvalidInputError naming the layer field at fault. pack, restore and verify all ask here, so verify never
    calls "all match" what restore refuses (audit60 A6); `packing` words the hint for the one who chose the targets,
    otherwise for a user of a received bundle, who cannot choose them.
    """
    received = "the manifest is damaged or hostile; do not use this bundle; ask its publisher to re-pack it"
    plain = [e.path for e in manifest.files]
    reserved = (MANIFEST_NAME, STATE_DIR, "reproduction", RUNS_DIR)  # runs/: the user's run outputs (audit F4)
    targets = sorted({layer.target for layer in manifest.layers})
    archives = {layer.archive for layer in manifest.layers}
    first: dict[str, int] = {}  # target -> the first layer there
    for i, layer in enumerate(manifest.layers):
        t = layer.target
        j = first.setdefault(t, i)
        if layer.kind != manifest.layers[j].kind:  # restore keeps or replaces a target by its first layer's kind, so
            raise InvalidInputError(  # a source edit was overwritten, or a runtime update refused (audit63 A L5)
                f"layers[{i}] ({layer.archive}, a {layer.kind} layer) and layers[{j}] ({manifest.layers[j].archive}, "
                f"a {manifest.layers[j].kind} layer) share the target {t!r}: the layers of one target are all of "
                "one kind",
                field=f"layers[{i}].kind",
                hint="give each kind of layer its own target" if packing else received,
            )
        if layer.members_index and layer.members_index in archives:  # restore cannot read it (audit62 L7)
            raise InvalidInputError(
                f"layers[{i}].members_index {layer.members_index!r} is a layer archive, not a member index",
                field=f"layers[{i}].members_index",
                hint="the manifest is damaged; pack the bundle again" if packing else received,
            )
        if t.split("/")[0] in reserved:
            raise InvalidInputError(
                f"layers[{i}].target {t!r} would overwrite {t.split('/')[0]}",
                field=f"layers[{i}].target",
                hint="choose a target folder such as runtime/<name> or source/<name>" if packing else received,
            )
        for other in targets:
            if other != t and (other.startswith(t + "/") or t.startswith(other + "/")):
                raise InvalidInputError(
                    f"layers[{i}].target {t!r} nests with layer target {other!r}",
                    field=f"layers[{i}].target",
                    hint="layer targets must be the same folder (an overlay) or disjoint folders"
                    if packing
                    else received,
                )
        for rel in plain:
            if rel == t or rel.startswith(t + "/") or t.startswith(rel + "/"):
                raise InvalidInputError(
                    f"layers[{i}].target {t!r} overlaps the bundle file {rel!r}",
                    field=f"layers[{i}].target",
                    hint="keep plain files outside the layers' target folders" if packing else received,
                )


def _member_problem(m: Member, path: str, view: UnionView) -> str | None:
    """Why member `m` (to be created at bundle-relative `path`) is unsafe, or None."""
    raw = m.raw_name
    if raw.startswith("/") or m.name.startswith("/"):
        return "has an absolute path"
    if ".." in m.name.split("/"):
        return "contains '..'"
    if "\0" in path or "\0" in m.linkname:
        return "has a NUL byte in its name or link text"
    if has_control(path) or has_control(m.linkname):  # a newline splits every listing and error (audit48 F1)
        return "has a control character (newline, carriage return, escape...) in its name or link text"
    if has_format(path) or has_format(m.linkname):  # it would show as another name (audit58 A5)
        return (
            "has a Unicode format character (invisible or text-reordering, such as U+202E or U+200B) in its name or "
            "link text"
        )
    if path.count("/") > MAX_DEPTH:
        return f"lies {path.count('/')} folders deep, more than the {MAX_DEPTH} restore allows"
    encoded = path.encode("utf-8", "surrogateescape")
    if len(encoded) > NAME_MAX and (
        len(encoded) > PATH_MAX or any(len(part) > NAME_MAX for part in encoded.split(b"/"))
    ):
        return f"has a name longer than filesystems allow ({NAME_MAX} bytes a component, {PATH_MAX} in all)"
    if len(m.linkname.encode("utf-8", "surrogateescape")) > PATH_MAX:
        return f"has link text longer than {PATH_MAX} bytes"
    if m.kind == "hardlink":
        return f"is a hard link (to {m.linkname!r}); layers may not contain hard links"
    if m.kind in ("chardev", "blockdev", "fifo"):
        return f"is a {m.kind} (device and special files are refused)"
    if m.mode & 0o6000:
        return f"has the setuid/setgid bit set (mode {m.mode:o})"
    if not _ancestors_are_dirs(path, view):
        return _ancestor_problem(path, view)
    kind, origin = view.entries.get(path, ("", ""))
    if kind == "symlink":
        return f"would replace (and write through) the symlink {path!r} planted by {origin}"
    if kind and (kind == "dir") != (m.kind == "dir"):
        return f"would turn the {kind} {path!r} from {origin} into a {m.kind}"
    if m.kind == "symlink":
        return _symlink_problem(m.linkname, path, view)
    return None


def _ancestors_are_dirs(path: str, view: UnionView) -> bool:
    """No ancestor of `path` is a symlink or a file in the view, walking up from the parent.

    A folder enters the view only after a member below it passed (its own ancestors then were
    folders or unknown), and a folder's kind never changes afterwards (turning it into anything
    else is refused), so the walk stops at the first known folder: O(1) for most members
    instead of O(depth) joins.
    """
    entries = view.entries
    head = path.rpartition("/")[0]
    while head:
        got = entries.get(head)
        if got is not None:
            if got[0] == "dir":
                return True
            return False
        head = head.rpartition("/")[0]
    return True


def _ancestor_problem(path: str, view: UnionView) -> str:
    """The shallowest ancestor of `path` that is a symlink or a file, described."""
    parts = path.split("/")
    for depth in range(1, len(parts)):
        ancestor = "/".join(parts[:depth])
        kind, origin = view.entries.get(ancestor, ("", ""))
        if kind == "symlink":
            return f"would be written through the symlink {ancestor!r} planted by {origin}"
        if kind == "file":
            return f"would be written under {ancestor!r}, which is a file from {origin}"
    return "would be written under a path that is not a folder"


def _symlink_problem(linkname: str, path: str, view: UnionView) -> str | None:
    if not linkname:
        return "is a symlink with an empty target"
    if linkname.startswith("/"):
        return f"is a symlink to the absolute path {linkname!r}"
    parts = [p for p in linkname.split("/") if p not in ("", ".")]
    climb = 0
    while climb < len(parts) and parts[climb] == "..":
        climb += 1
    if ".." in parts[climb:]:
        return f"is a symlink to {linkname!r}, which has '..' after a folder name"
    base = path.split("/")[:-1]
    if climb > len(base):
        return f"is a symlink to {linkname!r}, which leaves the bundle"
    resolved = "/".join(base[: len(base) - climb] + parts[climb:])
    if not view.inside_targets(resolved):
        return f"is a symlink to {linkname!r}, which leaves the layer targets (resolves to {resolved!r})"
    return None


def validate_layers(layers: list[tuple[str, str, list[Member]]]) -> UnionView:
    """Check every member of every layer, in restore order, against one union view.

    `layers` is [(archive, target, members)]. Collects every refusal, then raises one
    UnsafeArchiveError (exit 6) naming each archive and member. Writes nothing.
    """
    view = UnionView(targets=tuple(sorted({t for _, t, _ in layers})))
    problems: list[tuple[str, str, str]] = []
    for archive, target, members in layers:
        for m in members:
            if m.name == "" and not m.raw_name.startswith("/"):
                if m.kind != "dir":
                    problems.append((archive, m.raw_name, "is the archive root but not a folder"))
                elif m.mode & 0o6000:  # its mode is applied to the target since pack writes it (audit63 A L9)
                    problems.append((archive, m.raw_name, f"has the setuid/setgid bit set (mode {m.mode:o})"))
                continue
            path = posixpath.join(target, m.name)
            why = _member_problem(m, path, view)
            if why:
                problems.append((archive, m.raw_name, why))
                continue
            # Register the folders above it inside the target, deepest first, up to the first one
            # already known (its own ancestors were registered with it).
            head = path.rpartition("/")[0]
            while len(head) > len(target) and head not in view.entries:
                view.entries[head] = ("dir", archive)
                head = head.rpartition("/")[0]
            view.entries[path] = (m.kind, archive)
    if problems:
        archive, member, why = problems[0]
        lines = [f"{a}: member {mm!r} {w}" for a, mm, w in problems[:_MAX_LISTED]]
        more = f" (and {len(problems) - _MAX_LISTED} more)" if len(problems) > _MAX_LISTED else ""
        raise UnsafeArchiveError(
            "unsafe layer archive, nothing was extracted: " + "; ".join(lines) + more,
            archive=archive,
            member=member,
            problems=problems,
            hint="do not use this bundle; ask its publisher to re-pack it with `portable pack`",
        )
    return view


def _bytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogateescape"))


def _shown(name: str) -> str:
    return repr(name) if len(name) <= 120 else f"'{name[:60]}...{name[-50:]}'"


_SHORTEST_BUNDLE = 2
"""Bytes of the shortest path a bundle folder can have (`/b`): a path whose part inside the bundle leaves less than
this of PATH_MAX fits no folder, and a hint to move the bundle could not be followed (review64 R L3)."""


def _move_hint(base: int, size: int, inside: int, too_long: str) -> str:
    """The hint for a path of `size` bytes under a bundle path of `base` bytes, `inside` of them within the bundle."""
    if inside + _SHORTEST_BUNDLE > PATH_MAX:
        return too_long
    return (
        f"move the bundle to a folder whose path is at least {size - PATH_MAX} "
        f"{'byte' if size - PATH_MAX == 1 else 'bytes'} shorter (it is {base} bytes now), then run `portable restore` "
        "there"
    )


def check_path_lengths(bundle: Path, layers: Iterable[tuple[str, str, Iterable[str]]], *, targets: int) -> None:
    """Refuse, before anything is written, a layer member whose absolute path under `bundle` would pass PATH_MAX.

    `layers` is [(archive, target, member names)], `targets` how many layer targets the manifest has. The members
    are written through folder fds, so extraction worked, but every later restore stats them by path, got
    ENAMETOOLONG and counted them changed for ever (a runtime target re-extracted each time, a source file called
    locally edited: audit63 A L2). The bundle-relative path is bounded by `_member_problem`; this bounds the
    bundle's path plus the longest path restore gives a member: at its target, or in `.portable/staging/<i>` (where
    it is extracted and `restore --deep` compares it by path) and `.portable/trash/<i>`, which are longer than a
    short target (review64 R L2), <i> taken as the highest a target can get, so the bound does not depend on which
    targets a restore extracts. Raises RelocationError (9), as for a bundle path that relocation cannot fit, naming
    the longest member.
    """
    base = len(os.fsencode(str(bundle)))
    state = max((f"{STATE_DIR}/staging/{max(0, targets - 1)}", f"{STATE_DIR}/trash/{max(0, targets - 1)}"), key=_bytes)
    worst: tuple[int, int, str, str, str] | None = None
    for archive, target, names in layers:
        at_target, longest = _bytes(target), max(_bytes(target), _bytes(state))
        for name in names:
            tail = 1 + _bytes(name) if name else 0
            size = base + 1 + longest + tail
            if size > PATH_MAX and (worst is None or size > worst[0]):
                worst = (size, base + 1 + at_target + tail, archive, target, name)
    if worst is None:
        return
    size, final, archive, target, name = worst
    where = f"in {bundle / target}"
    if size > final:
        where = f"in {bundle / STATE_DIR}/staging while restore extracts it ({final} bytes in {bundle / target})"
    raise RelocationError(
        f"{archive}: member {_shown(name)} would lie at a path of {size} bytes {where}, longer than the {PATH_MAX} "
        "bytes a path may have; nothing was changed",
        path=bundle,
        hint=_move_hint(
            base,
            size,
            size - base,
            f"its path inside the bundle alone is {size - base - 1} bytes, too long for a bundle in any folder: do not "
            "use this bundle; ask its publisher to re-pack it with shorter names",
        ),
    )


def check_recorded_lengths(bundle: Path, recorded: Iterable[tuple[str, Iterable[str]]]) -> None:
    """Refuse, before planning, a file an earlier restore wrote (and that is still there) whose absolute path under
    `bundle` now passes PATH_MAX: the bundle was moved to a longer path since, and `plan` would stat it by path, get
    ENAMETOOLONG and name it locally edited (audit63 A L2).

    `recorded` is [(target, file names the receipt records there)], for the targets the manifest still has. A name
    that fits no bundle path at all, or that is no relative path below the target, is no file restore wrote: the
    receipt is damaged there, and it is left to `LayerReceipt.changed_files`, which counts it changed as it does any
    malformed entry (review64 R L3). A recorded file no longer there is left to it too (a deleted file is changed).
    Raises RelocationError (9) naming the longest file that is there.
    """
    base = len(os.fsencode(str(bundle)))
    found: list[tuple[int, str, str]] = []
    for target, names in recorded:
        for name in names:
            if not isinstance(name, str) or not name or name.startswith("/") or "\0" in name:
                continue
            parts = name.split("/")
            if any(part in ("", ".", "..") or _bytes(part) > NAME_MAX for part in parts):
                continue
            inside = 1 + _bytes(target) + 1 + _bytes(name)
            if base + inside > PATH_MAX and inside + _SHORTEST_BUNDLE <= PATH_MAX:
                found.append((base + inside, target, name))
    for size, target, name in sorted(found, key=lambda x: -x[0]):
        if _lexists_below(bundle, f"{target}/{name}"):
            raise RelocationError(
                f"{bundle / target}: the file {_shown(name)}, which an earlier restore wrote there, now lies at a path "
                f"of {size} bytes, longer than the {PATH_MAX} bytes a path may have; nothing was changed",
                path=bundle,
                hint=_move_hint(base, size, size - base, ""),
            )


def _lexists_below(root: Path, rel: str) -> bool:
    """Whether `rel` exists below `root`, reached without following a link (extract.open_parent: any path length,
    search permission suffices). A symlink or file in place of a folder on the way is False."""
    try:
        fd, base = open_parent(root, rel)
    except OSError:
        return False
    try:
        os.lstat(base, dir_fd=fd)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True
