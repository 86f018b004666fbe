"""Read layer archives for restore: member lists (from the index or a first pass), then one extracting pass.

A layer packed by this tool has a member index (`<target>.members.json`, a bundle file pinned by
its sha256 like any other): restore validates that list, then extracts in ONE pass that hashes the
archive as it goes and refuses any header that differs from the validated list before writing it;
a digest mismatch at the end discards the staging folder. A layer without an index is read twice:
once to hash it and list its members (nothing written), once to extract. Decompressing into
memory instead was measured slower here: page faults on a tar-sized buffer cost more than a second
zstd pass through a 4 MiB window.

    <target>.members.json   {"format": "recap-portable-members", "format_version": "1.0",
                             "members": [[name, kind, mode, size, linkname], ...]}   (archive order)
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from reproduction import strict_json
from reproduction.digests import sha256_file
from reproduction.errors import InvalidInputError, UnsafeArchiveError, WriteFailedError
from reproduction.release.extract import Written, extract_stream, member_count_error
from reproduction.release.manifest import LayerEntry, clash_message
from reproduction.release.tarscan import KINDS, Member, StreamSource, iter_members, normalise, stream_bound
from reproduction.release.zstdio import open_decompressed, zstd_error
from reproduction.ui import human_bytes


@dataclass(kw_only=True, slots=True)
class LoadedLayer:
    """A layer archive that has been read once."""

    entry: LayerEntry
    """The manifest's description of the layer."""
    digest: str
    """SHA-256 of the archive bytes as read."""
    members: list[Member]
    """Its members (empty when the digest did not match: never trust unverified bytes)."""
    ok: bool = True
    """False when the digest did not match the manifest."""


class DigestMismatch(Exception):
    """An archive's bytes did not hash to the manifest's digest (found while extracting)."""

    def __init__(self, archive: str, actual: str) -> None:
        super().__init__(archive)
        self.archive, self.actual = archive, actual


INDEX_FORMAT = "recap-portable-members"


def index_path(target: str) -> str:
    return f"{target}.members.json"


def write_index(path: Path, members: list[Member]) -> None:
    """Write a member index (compact JSON, archive order)."""
    rows = [[m.name, m.kind, m.mode, m.size, m.linkname] for m in members]
    path.write_text(
        json.dumps({"format": INDEX_FORMAT, "format_version": "1.0", "members": rows}, separators=(",", ":")) + "\n",
        encoding="utf-8",
    )


_KINDS = frozenset(KINDS.values())


def _row(row: list) -> Member:
    name, kind, mode, size, link = row
    if type(name) is not str or type(link) is not str or kind not in _KINDS:
        if not (isinstance(name, str) and isinstance(kind, str) and isinstance(link, str)):
            raise TypeError(f"row {row!r:.80}: name, kind and link must be strings")
        raise ValueError(f"row {row!r:.80}: unknown kind or a name that is not normalised")
    if type(mode) is not int or type(size) is not int or not 0 <= mode <= 0o7777 or not 0 <= size < 1 << 63:
        raise ValueError(f"row {row!r:.80}: mode and size must be small non-negative integers")
    if normalise(name) != name:
        raise ValueError(f"row {row!r:.80}: unknown kind or a name that is not normalised")
    if not (name.isascii() and link.isascii()):  # \udc80-\udcff are undecodable bytes; \ud800 names no file
        try:
            name.encode("utf-8", "surrogateescape"), link.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:  # restore failed on it as an internal error (audit45 F5)
            raise ValueError(f"row {row!r:.80}: a name or link holds a lone surrogate such as \\ud800") from None
    return Member(name=name, raw_name=name, kind=kind, mode=mode, size=size, mtime=0, linkname=link)


def read_index(path: Path, *, rel: str) -> list[Member]:
    """Members from an index the caller has verified by digest. InvalidInputError (exit 4) names a bad row."""
    try:
        data = strict_json.loads(path.read_text(encoding="utf-8"))  # a repeated key: ValueError (audit58 A1)
        if data.get("format") != INDEX_FORMAT or str(data.get("format_version", "")).split(".")[0] != "1":
            raise ValueError(f"format {data.get('format')!r:.40} {data.get('format_version')!r:.40}")
        rows = data["members"]
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise _bad_index(rel, exc) from None
    return members_from_rows(rows, rel=rel)


def members_from_rows(rows: list, *, rel: str) -> list[Member]:
    """Members from index rows `[name, kind, mode, size, linkname]`; InvalidInputError (exit 4) names a bad row."""
    try:
        members = [_row(row) for row in rows]
    except (ValueError, TypeError) as exc:
        raise _bad_index(rel, exc) from None
    seen: set[str] = set()
    for m in members:  # the last member won, and a reader of the index could not tell which (audit60 A5)
        if m.name in seen:
            raise InvalidInputError(
                f"{rel}: {clash_message(m.name, m.name, 'twice')}",
                path=rel,
                field=rel,
                hint="the bundle is damaged or hostile; do not use this bundle; ask its publisher to re-pack it",
            )
        seen.add(m.name)
    return members


def _bad_index(rel: str, exc: Exception) -> InvalidInputError:
    return InvalidInputError(
        f"{rel}: not a member index this portable reads ({exc})",
        path=rel,
        field=rel,
        hint="the bundle is damaged or from a newer portable; use its own runner",
    )


def unpacked_size_error(entry: LayerEntry, size: int) -> UnsafeArchiveError:
    """The one refusal of a layer whose files add up to `size` bytes, more than its declared unpacked_size."""
    return UnsafeArchiveError(
        f"{entry.archive}: its files add up to at least {human_bytes(size)} ({size} bytes), more than the "
        f"{entry.unpacked_size} bytes bundle.json declares as its unpacked_size; nothing was extracted",
        archive=entry.archive,
        hint="do not use this bundle; ask its publisher to re-pack it with `portable pack`",
    )


def tar_size_error(entry: LayerEntry, name: str, size: int, total: int) -> UnsafeArchiveError:
    """The one refusal of a member whose size cannot fit in the layer's declared tar_size (audit60 A2: a pax
    size of 2**63 in a 3 KB archive asked the user to free 8 EiB)."""
    return UnsafeArchiveError(
        f"{entry.archive}: member {name!r} declares a size of {size} bytes, so its files add up to at least "
        f"{total} bytes, more than the {entry.tar_size}-byte tar stream bundle.json declares (tar_size) can hold; "
        f"nothing was extracted",
        archive=entry.archive,
        hint="do not use this bundle; ask its publisher to re-pack it with `portable pack`",
    )


def need_space(bundle: Path, need: int) -> None:
    """WriteFailedError (exit 8) when `need` bytes do not fit in the free space of `bundle`'s filesystem."""
    free = shutil.disk_usage(bundle).free
    if need > free:
        raise WriteFailedError(
            f"not enough space to restore {bundle}: the layers need {human_bytes(need)}, {human_bytes(free)} is free",
            path=bundle,
            hint="free some space and run `portable restore` again; nothing was changed",
        )


def short_layer_error(archive: str, got: str, declared: str) -> UnsafeArchiveError:
    """A layer without a member index that ends before what bundle.json declares (audit48 F6: it restored empty)."""
    return UnsafeArchiveError(
        f"{archive}: {got}, fewer than the {declared} bundle.json declares; nothing was changed",
        archive=archive,
        hint="the archive is incomplete; do not use this bundle; ask its publisher to re-pack it with `portable pack`",
    )


def load_layer(bundle: Path, entry: LayerEntry, expected_sha: str) -> LoadedLayer:
    """Read `entry`'s archive once: its digest and (if that matches `expected_sha`) its member list.

    A digest mismatch is returned (verify reports it with the other problems). A stream that fails
    to decompress although its digest matches raises UnsafeArchiveError (exit 6), as do, while
    listing: files adding up to more than a declared `unpacked_size` (before the member's data is
    decompressed), a stream longer than a declared `tar_size`, and more than MAX_TRAILER bytes after
    the end-of-archive block; with no unpacked_size declared, files adding up to more than the free
    space is WriteFailedError (exit 8) as the space check after listing would be. More members than
    a declared `members` is UnsafeArchiveError at the header that passes it, and so are fewer
    members than declared and a stream shorter than a declared `tar_size` (both exact); with no tar_size the
    stream is bounded by tarscan.stream_bound of what is declared (audit45 F3), and a layer that
    declares neither tar_size nor members is InvalidInputError (exit 4) before anything is read.
    """
    if not entry.tar_size and not entry.members:  # an archive of headers only would be unbounded (audit45 F3)
        raise InvalidInputError(
            f"bundle.json: layer {entry.archive} has no member index and declares neither tar_size nor members, "
            f"so nothing bounds reading it; nothing was changed",
            path=bundle / "bundle.json",
            field="layers[].tar_size",
            hint="ask its publisher to re-pack it with `portable pack`, which records both",
        )
    path = bundle / entry.archive
    hasher = hashlib.sha256()
    try:
        with open_decompressed(path, hasher=hasher) as stream:
            files, free = 0, shutil.disk_usage(bundle).free if not entry.unpacked_size else 0
            most = entry.members or 1 << 63
            files_bound = "its unpacked_size" if entry.unpacked_size else "the free space"
            bound = f"that its {entry.members} members and {files_bound} allow (bundle.json declares no tar_size)"
            limit = entry.tar_size or stream_bound(entry.unpacked_size or free, entry.members)
            source = StreamSource(stream, archive=entry.archive, limit=limit, bound="" if entry.tar_size else bound)
            members: list[Member] = []
            for m in iter_members(source, archive=entry.archive):  # m's data is not read yet
                members.append(m)
                files += m.size  # 0 for anything but a file
                if entry.tar_size and files > entry.tar_size:  # impossible, not a space shortage (audit60 A2)
                    raise tar_size_error(entry, m.raw_name, m.size, files)
                if entry.unpacked_size and files > entry.unpacked_size:
                    raise unpacked_size_error(entry, files)
                if not entry.unpacked_size and files > free:  # undeclared: what the disk holds bounds the listing
                    need_space(bundle, files)
                if len(members) > most:
                    raise member_count_error(entry.archive, entry.members, m.raw_name)
            if entry.members and len(members) < entry.members:  # a short or empty archive (audit48 F6)
                raise short_layer_error(entry.archive, f"holds {len(members)} members", f"{entry.members} members")
            source.drain()  # the digest must cover the whole file
            if entry.tar_size and source.total < entry.tar_size:  # tar_size is exact: what `pack` records
                raise short_layer_error(
                    entry.archive, f"decompresses to {source.total} bytes", f"tar_size of {entry.tar_size} bytes"
                )
    except (zstd_error(), UnsafeArchiveError, WriteFailedError, EOFError, ValueError) as exc:
        digest = sha256_file(path)  # the compressed bytes only: a bomb is never decompressed to tell
        if digest != expected_sha:
            return LoadedLayer(entry=entry, digest=digest, members=[], ok=False)
        if isinstance(exc, (UnsafeArchiveError, WriteFailedError)):  # name the archive or the bundle already
            raise
        raise UnsafeArchiveError(
            f"{entry.archive}: cannot be read although its digest matches bundle.json ({exc})",
            archive=entry.archive,
            hint="the publisher packed a broken archive; ask for a re-pack",
        ) from None
    digest = hasher.hexdigest()
    ok = digest == expected_sha
    return LoadedLayer(entry=entry, digest=digest, members=members if ok else [], ok=ok)


def extract_layer(
    bundle: Path,
    layer: LoadedLayer,
    dest: Path,
    *,
    digests: bool = False,
    on_bytes: Callable[[int], None] | None = None,
    dest_fd: int | None = None,
) -> Written:
    """Write a validated layer into `dest` (through `dest_fd` when given: extract_stream) in one pass over its archive,
    hashing it as it goes.

    `layer.digest` is the digest the bytes must have (the manifest's). Raises DigestMismatch when
    they do not (corrupt, truncated, or replaced since it was listed: the caller discards `dest`);
    UnsafeArchiveError when a header differs from `layer.members` although the digest matches.
    """
    path = bundle / layer.entry.archive
    hasher = hashlib.sha256()
    try:
        with open_decompressed(path, hasher=hasher) as stream:
            written = extract_stream(
                stream,
                layer.members,
                dest,
                archive=layer.entry.archive,
                tar_size=layer.entry.tar_size,
                members=layer.entry.members,
                digests=digests,
                on_bytes=on_bytes,
                dest_fd=dest_fd,
            )
    except (zstd_error(), UnsafeArchiveError, EOFError, ValueError) as exc:
        actual = sha256_file(path)
        if actual != layer.digest:
            raise DigestMismatch(layer.entry.archive, actual) from None
        if isinstance(exc, UnsafeArchiveError):
            raise
        raise UnsafeArchiveError(
            f"{layer.entry.archive}: cannot be read although its digest matches bundle.json ({exc})",
            archive=layer.entry.archive,
            hint="the publisher packed a broken archive; ask for a re-pack",
        ) from None
    if hasher.hexdigest() != layer.digest:
        raise DigestMismatch(layer.entry.archive, hasher.hexdigest())
    return written


def tree_files(root: Path) -> set[str]:
    """Relative paths of the files and symlinks below `root` (no folders), `__pycache__` ignored."""
    out: set[str] = set()
    for dirpath, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__" or os.path.islink(os.path.join(dirpath, d))]
        rel = os.path.relpath(dirpath, root)
        out.update(n if rel == "." else f"{rel}/{n}" for n in names)
        out.update(d if rel == "." else f"{rel}/{d}" for d in dirs if os.path.islink(os.path.join(dirpath, d)))
    return out
