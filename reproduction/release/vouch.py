"""What restore may keep or replace in a bundle folder it did not make: the receipt's word, checked.

The receipt (`.portable/receipt.json`) sits in the bundle folder, which may come from anyone, so it
is trusted only as far as the pinned member indexes back it (`vouched`), and before a target folder
is swapped out the files restore did not write there are found (`lost_files`) so none is discarded
without being named (audit F3b, F4, F5, F9).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from reproduction.digests import sha256_file
from reproduction.errors import ReadFailedError
from reproduction.release import layers as layer_io
from reproduction.release.manifest import LayerEntry, Manifest
from reproduction.release.receipt import (
    LayerReceipt,
    Receipt,
    at_or_below,
    changed_folders,
    layer_folders,
    sha256_regular,
)
from reproduction.release.tarscan import Member


def vouched(
    bundle: Path, manifest: Manifest, receipt: Receipt, layers: list[LayerEntry]
) -> tuple[list[LayerReceipt], dict[str, list[Member]]] | None:
    """(the receipt's records, archive -> verified member index) for one target's `layers`, or None
    when the receipt does not vouch for the tree at that target.

    A record is trusted only when it names this target (a layer moved to another folder was never
    restored there: F5) and the records' files and links are exactly what the layers' verified member
    indexes list (a record with empty lists would vouch for a hand-made tree: F3b). A layer without
    an index cannot be checked cheaply: None (it is extracted again). The caller validates the
    returned members with safety.py, so a kept tree is one an extraction would have accepted.
    """
    recs = [receipt.layers.get(layer.archive) for layer in layers]
    if any(
        r is None or r.target != layer.target or not r.prefix.endswith("/" + layer.target) or not layer.members_index
        for r, layer in zip(recs, layers)
    ):
        return None
    members: dict[str, list[Member]] = {}
    expected: dict[str, str | None] = {}  # path -> link text (None: a regular file), the last layer's wins
    for layer in layers:
        entry = manifest.file(layer.members_index)
        path = bundle / layer.members_index
        try:
            if os.lstat(path).st_size != entry.size or sha256_file(path) != entry.sha256:
                return None  # verify reports it
        except OSError:
            return None
        members[layer.archive] = layer_io.read_index(path, rel=layer.members_index)
        for m in members[layer.archive]:
            if m.kind in ("file", "symlink"):
                expected[m.name] = m.linkname if m.kind == "symlink" else None
    recorded: dict[str, str | None] = {}
    for r in recs:
        recorded.update(dict.fromkeys(r.files))
        recorded.update(r.links)
    return (recs, members) if recorded == expected else None


def own_files(root: Path, receipt: Receipt, target: str, *, source: bool) -> set[str]:
    """Files and links under `root` that the receipt records for `target` and that are still as restore
    wrote them, for a target the receipt does not vouch for as the new layers' tree (the bundle's file
    list changed: a newer bundle fetched into the same folder, audit58 A2).

    Records that name another target count for nothing (F5); those a killed restore left `replacing` count
    like the others (the target may still hold their tree: audit62 M1). A file counts when its size and mtime
    are as recorded and, in a `source` target, its bytes hash to the recorded digest (a file with no
    digest recorded, or one it cannot read, does not count); a link when its text is. Nothing below a
    recorded folder that is no longer a real folder counts (audit45 F1). These may be replaced or removed
    like any file restore wrote; anything else at `root` is still named by `lost_files`.
    """
    every = [*receipt.layers.values(), *receipt.replacing.values()]  # a killed restore's old records too (audit62 M1)
    recs = [r for r in every if r.target == target and r.prefix.endswith("/" + target)]
    recorded = {p for r in recs for p in r.files.keys() | r.links.keys()}
    if not recorded or not os.path.isdir(root) or os.path.islink(root):
        return set()
    bad = set(changed_folders(root, layer_folders((p, "file") for p in recorded)))
    hashed: list[set[str]] = []  # per record, the files just found unchanged by their digest: not hashed again
    for r in recs:  # a file whose stat changed but whose bytes hash as recorded is still its own (audit62 L8)
        stale = [p for p in r.changed_files(root) if not at_or_below(p, bad)]
        hashed.append(set(r.restat_unchanged(root, stale)))
        bad |= set(stale) - hashed[-1]
    if source:
        bad |= {p for r in recs for p in r.files if p not in r.digests}
        for r, done in zip(recs, hashed):
            bad |= {
                p
                for p, digest in r.digests.items()
                if p not in done and not at_or_below(p, bad) and _digest(root, p) != digest
            }
    return {p for p in recorded if not at_or_below(p, bad)}


def _digest(root: Path, rel: str) -> str | None:
    """sha256 of the regular file `root/rel` (receipt.sha256_regular: no link followed, no blocking); None for
    anything else, or one it cannot read (not known to be unchanged: `lost_files` then names it, or fails on it)."""
    try:
        return sha256_regular(f"{root}/{rel}")
    except (OSError, ValueError):
        return None


def lost_files(root: Path, staged: Path, *, known: set[str], compare: bool, rewritten: set[str]) -> list[str]:
    """Files under the existing target `root` that swapping in `staged` would discard unnamed.

    Those the new tree lacks and restore did not write (`known`: the files and links the receipt
    records, when it vouches for the tree, else those `own_files` finds unchanged); with `compare` (a
    target the receipt does not vouch for: lost, damaged or from an older bundle, F9, audit62 L3) also
    those whose bytes or link text differ from the new tree, except `rewritten` (paths holding a build
    prefix, which relocation rewrote) and `known` ones. `__pycache__` is
    ignored. [] when there is no folder at `root`. A file at `root` that `compare` cannot read raises
    ReadFailedError (exit 3) naming it: unread, it is neither "the same" nor "edited" (audit56 A1).
    """
    if not os.path.isdir(root) or os.path.islink(root):
        return []
    existing, new = layer_io.tree_files(root), layer_io.tree_files(staged)
    lost = existing - new - known
    if compare:
        lost |= {p for p in (existing & new) - rewritten - known if not _same_entry(root / p, staged / p)}
    return sorted(lost)


def _same_entry(a: Path, b: Path) -> bool:
    sa, sb = os.lstat(a), os.lstat(b)
    if stat.S_ISLNK(sa.st_mode) or stat.S_ISLNK(sb.st_mode):
        return stat.S_ISLNK(sa.st_mode) == stat.S_ISLNK(sb.st_mode) and os.readlink(a) == os.readlink(b)
    if stat.S_ISREG(sa.st_mode) != stat.S_ISREG(sb.st_mode):
        return False
    try:
        return same_bytes(a, b)
    except PermissionError as exc:
        raise ReadFailedError(
            f"cannot read {exc.filename or a} to compare it with the bundle's copy: permission denied",
            path=exc.filename or a,
            hint=f"make it readable (`chmod u+r {exc.filename or a}`) and run `portable restore` again; "
            "nothing was changed",
        ) from None


def same_bytes(a: Path, b: Path) -> bool:
    """Whether the regular files `a` and `b` hold the same bytes, read now. Not filecmp.cmp: it keeps an answer per
    (size, mtime) pair, so a file changed with its stat put back compared equal in the same process (audit62 L2)."""
    with open(a, "rb") as fa, open(b, "rb") as fb:
        if os.fstat(fa.fileno()).st_size != os.fstat(fb.fileno()).st_size:
            return False
        while True:
            x, y = fa.read(1 << 20), fb.read(1 << 20)
            if x != y:
                return False
            if not x:
                return True
