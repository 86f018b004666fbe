"""What restore does with each layer target (extract, relocate in place, keep), decided before any archive is read.

Per target folder: the receipt's word (release/vouch.py) and a stat pass say whether the tree there is
the bundle's; a new source archive over local edits, or a target holding files restore never wrote,
is refused naming them before anything is swapped. Used by release/restore.py.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from reproduction.errors import InvalidInputError
from reproduction.release.manifest import STATE_DIR, LayerEntry, Manifest, shown_name
from reproduction.release.receipt import LayerReceipt, Receipt, at_or_below, changed_folders, layer_folders
from reproduction.release.swap import check_target_path
from reproduction.release.tarscan import Member
from reproduction.release.vouch import lost_files, own_files, vouched


def few(items: list[str], n: int = 8) -> str:
    """The first `n` of `items` for a one-line message ('a, b and 3 more'), each escaped as shown_name does."""
    return ", ".join(map(shown_name, items[:n])) + (f" and {len(items) - n} more" if len(items) > n else "")


@dataclass(kw_only=True, slots=True)
class Group:
    """The layers that share one target folder (usually one), and what restore will do with it."""

    target: str
    layers: list[LayerEntry]
    action: str = "keep"
    """'extract', 'relocate' or 'keep'."""
    changed: list[str] = field(default_factory=list)
    """Files whose stat differs from the receipt (local edits or damage)."""
    vouched: bool = False
    """The receipt vouches for the tree at the target (see release/vouch.py)."""
    members: dict[str, list[Member]] = field(default_factory=dict)
    """Archive -> its verified member index, for layers kept on the receipt's word (validated with the rest)."""
    restat: list[str] = field(default_factory=list)
    """Files whose stat differed from the receipt but whose bytes hash to its digest (a `cp -r` reset their mtime):
    not edits; their records were updated in place, for `_finish` to save (audit62 L8)."""
    recheck: bool = False
    """`--deep` on a vouched runtime target whose stat pass found nothing: it is extracted to staging only to
    compare with the tree in place, and kept (files added inside it too) when every file matches (audit62 L2)."""


def groups_of(manifest: Manifest) -> list[Group]:
    by_target: dict[str, Group] = {}
    for layer in manifest.layers:  # already sorted by order
        by_target.setdefault(layer.target, Group(target=layer.target, layers=[])).layers.append(layer)
    return list(by_target.values())


def plan(bundle: Path, manifest: Manifest, receipt: Receipt, *, deep: bool, refresh_source: bool) -> list[Group]:
    """Decide per target: extract, relocate in place, or keep. Raises InvalidInputError when a new
    source archive would silently discard local edits (the user must pass --refresh-source)."""
    groups = groups_of(manifest)
    for g in groups:
        check_target_path(bundle, g.target)  # every group: a kept target is relocated in place
        root = bundle / g.target
        trusted = vouched(bundle, manifest, receipt, g.layers)
        g.vouched = trusted is not None
        recs, g.members = trusted if trusted is not None else ([None] * len(g.layers), {})
        fresh = all(
            r is not None and r.sha256 == manifest.file(layer.archive).sha256 for r, layer in zip(recs, g.layers)
        )
        if recs and all(r is not None for r in recs) and root.is_dir():
            g.changed = _changed(root, g, recs, deep=deep)
        if not fresh or not root.is_dir():
            g.action = "extract"
            if g.changed and g.layers[0].kind == "source" and not refresh_source and all(recs):
                raise InvalidInputError(
                    f"{g.target}: the bundle has a new version of this source layer, and {len(g.changed)} file(s) "
                    f"were edited locally ({few(g.changed, 3)})",
                    field="--refresh-source",
                    hint="save your edits elsewhere, then run `portable restore --refresh-source`",
                )
        elif g.layers[0].kind == "runtime" and (deep or g.changed):
            g.action = "extract"
            g.recheck = not g.changed  # `--deep` only: replaced whole if its extraction differs (audit62 L2)
        elif g.layers[0].kind == "source" and refresh_source:
            g.action = "extract"
        elif any(r.prefix != str(root) for r in recs) and any(has_prefixes(layer) for layer in g.layers):
            g.action = "relocate"
    return groups


def _changed(root: Path, g: Group, recs: list[LayerReceipt], *, deep: bool) -> list[str]:
    """What differs from the receipt in a vouched target: folders of the member index that are not real
    folders (a symlink, a file: audit45 F1), then files and links by stat (`deep`, source: by hash too).

    release/noop.py's `_covers` checks the same folders: keep the two in step.
    """
    folders = changed_folders(root, layer_folders((m.name, m.kind) for ms in g.members.values() for m in ms))
    changed = set(folders)
    for r in recs:  # a file whose stat changed but whose bytes hash as recorded is no edit (audit62 L8)
        stale = [p for p in r.changed_files(root) if not at_or_below(p, changed)]
        same = set(r.restat_unchanged(root, stale))
        g.restat += sorted(same)
        changed |= set(stale) - same
    if deep and g.layers[0].kind == "source":  # rehash: catches edits that kept size and mtime
        changed |= {p for r in recs for p in r.changed_contents(root, skip=changed)}
    return sorted(changed)


def refuse_losing_files(
    bundle: Path, receipt: Receipt, groups: list[Group], overwritten: dict[str, list[str]], refresh: bool
) -> None:
    """Before any swap: never discard files in a target that restore did not write, without saying so.

    A layer target over a folder of the user's own (audit F4), or a target whose receipt was lost while it
    held local edits (F9; a runtime target's too, when no record names it: audit62 L3), is refused with
    InvalidInputError (4) naming the files;
    `--refresh-source` lets a source target's files go, named in `overwritten` (the restore report's) as for edits
    the receipt saw. Files the receipt records for the target and still unchanged count as restore's own even
    when it does not vouch for the tree (an older bundle's restore: audit58 A2). A target the receipt vouches
    for keeps today's rules: a runtime tree is replaced whole, a source tree's edits are caught by `plan`.
    """
    todo = [g for g in groups if g.action == "extract"]
    for i, g in enumerate(todo):
        source = g.layers[0].kind == "source"
        if g.vouched and not source:
            continue
        if g.vouched:
            known = {
                p
                for x in g.layers
                for p in receipt.layers[x.archive].files.keys() | receipt.layers[x.archive].links.keys()
            }
        else:  # what an older restore wrote here and nobody touched since is still restore's own (audit58 A2)
            known = own_files(bundle / g.target, receipt, g.target, source=source)
        rewritten = {o.path for x in g.layers for o in x.prefix_files}  # own and foreign prefixes, in this target
        rewritten |= {o.path for x in g.layers for occ in x.foreign_prefix_files.values() for o in occ}
        staged = bundle / STATE_DIR / "staging" / f"{i}"
        # a runtime target's files are compared with the new tree only when no receipt record names the target
        # (the receipt lost, audit62 L3): they carry no digests, so under a receipt a file merely touched or copied
        # (new mtime, same bytes) would be named as an edit, and an update refused (review62 R1)
        recorded = any(
            r.target == g.target and (r.files or r.links)
            for r in [*receipt.layers.values(), *receipt.replacing.values()]
        )
        lost = lost_files(
            bundle / g.target,
            staged,
            known=known,
            compare=not g.vouched and (source or not recorded),
            rewritten=rewritten,
        )
        if not lost:
            continue
        if source and refresh:
            overwritten[g.target] = sorted(set(overwritten.get(g.target, [])) | set(lost))
            continue
        edits = "save any edits of yours elsewhere, " if any(os.path.lexists(staged / p) for p in lost) else ""
        raise InvalidInputError(
            f"{g.target}: restore would replace this layer target, and {len(lost)} file(s) in it are not ones "
            f"restore wrote there ({few(lost, 3)})",
            field="--refresh-source" if source else f"layers.target {g.target}",
            hint="save your edits elsewhere, then run `portable restore --refresh-source` (it overwrites them)"
            if source
            else f"{edits}move your files out of {bundle / g.target} (a layer target is replaced whole; remove the "
            "folder if it holds an earlier restore) and run `portable restore` again; nothing was changed",
        )


def has_prefixes(layer: LayerEntry) -> bool:
    return bool(layer.prefix_files or layer.foreign_prefix_files)
