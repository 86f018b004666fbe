"""`portable restore`: verify -> validate every layer -> extract to staging -> swap in -> relocate -> receipt.

Under the bundle's lock: plain files are hashed in a thread pool while the layer archives are read
(hashed and listed in the same pass); all layers are validated against one union view before any
is extracted; each target folder is built in `.portable/staging/` (target folders concurrently, a
large layer beside others in a child process: release/extract_child.py) and swapped into place with one
atomic rename (renameat2 RENAME_EXCHANGE where the kernel has it), then relocated for where it now
lives, then recorded in the receipt. A second restore trusts the receipt plus a stat pass (`deep`
rehashes); a kill at any moment leaves each target either as it was or complete, and the next
restore finishes the job.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from reproduction.digests import default_jobs, sha256_file, sha256_open
from reproduction.errors import InvalidInputError, RelocationError, UnsafeArchiveError, os_error
from reproduction.fsio import naming, open_regular, remove_orphaned_temps_at, remove_tree
from reproduction.release import extract_child
from reproduction.release import layers as layer_io
from reproduction.release.extract import open_parent, write_failed
from reproduction.release.lock import StateFolder, bundle_lock
from reproduction.release.manifest import (
    MANIFEST_NAME,
    STATE_DIR,
    LayerEntry,
    Manifest,
    PrefixOccurrence,
    has_control,
    load_manifest,
)
from reproduction.release.receipt import LayerReceipt, Receipt, load_receipt, refuse_receipt_folder, save_receipt
from reproduction.release.restore_plan import Group, few, has_prefixes, plan, refuse_losing_files
from reproduction.release.safety import check_path_lengths, check_recorded_lengths, check_targets, validate_layers
from reproduction.release.swap import preflight, swap_back, swap_into_place, through_link
from reproduction.release.tarscan import Member
from reproduction.release.verify import (
    Problem,
    VerifyReport,
    hash_entries,
    raise_for_report,
    sort_problems,
    stat_pass,
    verify_bundle,
)
from reproduction.release.vouch import same_bytes
from reproduction.release.weights import check_bundle_weights
from reproduction.ui import UiOptions, progress


@dataclass(kw_only=True, slots=True)
class RestoreReport:
    """What a restore did; `summary()` is what `portable restore` prints."""

    bundle: Path
    files: int = 0
    """Files of the bundle verified (hashed or confirmed by the receipt)."""
    extracted: list[str] = field(default_factory=list)
    """Targets extracted from their archives."""
    relocated: list[str] = field(default_factory=list)
    """Targets relocated in place because the bundle moved."""
    unchanged: list[str] = field(default_factory=list)
    """Targets the receipt and a stat pass confirmed."""
    overwritten: dict[str, list[str]] = field(default_factory=dict)
    """Target -> locally edited files that --refresh-source overwrote (or removed)."""
    kept_edits: dict[str, list[str]] = field(default_factory=dict)
    """Source target -> locally edited files kept (no --refresh-source)."""
    relocation_notes: list[str] = field(default_factory=list)
    """Strings relocation left at the build prefix because the new one is longer (harmless ones only)."""
    relocation_skipped: list[str] = field(default_factory=list)
    """Files (target/path) holding a build prefix that relocation left as they are: binary, but not ELF nor an `ar`
    archive (a pickle, a zip), so the prefix cannot be rewritten in place without corrupting them (audit62 M3)."""
    extras: list[str] = field(default_factory=list)
    """Files the bundle does not list, outside every layer target: left alone, named in the summary."""
    seconds: float = 0.0

    def summary(self) -> str:
        parts = [f"restored {self.bundle} in {self.seconds:.1f}s: {self.files} files verified"]
        for label, items in (
            ("extracted", self.extracted),
            ("relocated", self.relocated),
            ("unchanged", self.unchanged),
        ):
            if items:
                parts.append(f"{label} {', '.join(items)}")
        lines = ["; ".join(parts)]
        for target, files in self.overwritten.items():
            lines.append(f"--refresh-source overwrote {len(files)} locally edited file(s) in {target}: {few(files)}")
        for target, files in self.kept_edits.items():
            lines.append(
                f"kept {len(files)} locally edited file(s) in {target}: {few(files)} "
                f"(`portable restore --refresh-source` overwrites them)"
            )
        if self.extras:
            lines.append(
                f"warning: left alone {len(self.extras)} file(s) bundle.json does not list: {few(self.extras)} "
                f"(`portable verify` reports them as extra; keep runs outside the bundle or under its runs/ folder)"
            )
        if self.relocation_skipped:
            lines.append(
                f"warning: relocation left {len(self.relocation_skipped)} binary file(s) as they were, still naming "
                f"the folder they were built in: {few(self.relocation_skipped)} (neither ELF nor a static library, so "
                "the path in them cannot be rewritten in place without corrupting them; rebuild them where they now "
                "are, or pack the layer without them)"
            )
        if self.relocation_notes:
            lines.append(
                f"relocation kept the build prefix in {len(self.relocation_notes)} place(s) the loader never "
                f"uses (a shorter bundle path removes them): {few(self.relocation_notes)}"
            )
        return "\n".join(lines)


def _cleanup_state(state: StateFolder, *, strict: bool) -> None:
    """Remove what a killed restore left in `.portable/` (never anything at a final path).

    A leftover that is a symlink or a plain file (a hostile or damaged bundle folder) is unlinked
    itself, never what it points to: staging, trash and reloc are the tool's own (audit F2, F16).
    Each is reached through the state folder's fd, so a `.portable` swapped for a link while restore ran is
    never followed (audit65 H1).
    `strict` (before restoring) raises WriteFailedError (8) naming a leftover that cannot be removed;
    otherwise (after) what cannot be removed stays for the next restore. The temp file of a receipt write a kill
    interrupted (`.receipt.json.<pid>.<hex>.portable-tmp`, its writer gone) is removed too (review65 S L2).
    """
    try:
        remove_orphaned_temps_at(state.fd)
    except OSError:
        pass  # a state folder that cannot be listed: the writes below name what fails
    for name in ("staging", "trash", RELOC_TMP):
        path = state.path / name
        try:
            remove_tree(name, dir_fd=state.fd, shown=str(path))
        except OSError as exc:
            if strict:
                raise os_error(
                    exc,
                    f"the leftover {path}",
                    hint=f"remove {path} (restore's own temporary state) and run `portable restore` again",
                ) from None


RELOC_TMP = "reloc"
"""`.portable/reloc/`: relocation writes each rewritten file here, then renames it over the original, so a
kill between the two leaves nothing inside a restored tree that bundle.json and the receipt do not know
(the next restore removes the folder, like staging/ and trash/)."""


def _relocate(
    bundle: Path,
    manifest: Manifest,
    layer: LayerEntry,
    old_bundle: Path | None,
    report: RestoreReport,
    known: set[str],
    state: StateFolder,
) -> list[str]:
    """Rewrite `layer`'s own and foreign prefix occurrences for where the bundle now is.

    `old_bundle` is where the tree was last relocated for (None: fresh from the archive, so the
    build prefixes are what the files hold). `known` is the regular files the target's layers
    wrote (from the extraction or the receipt): an occurrence naming anything else (a symlink, a
    path through one, a file restore never wrote) is refused, InvalidInputError (4), before any
    file is touched. Returns the changed paths (relative to the target); appends to the report's
    `relocation_notes` the harmless strings that kept a build prefix because the new one is longer, and to
    its `relocation_skipped` the binary files relocation cannot rewrite safely (left as they are).
    """
    if not has_prefixes(layer):
        return []
    from reproduction.release.relocate import relocate_tree

    root = bundle / layer.target
    changed: list[str] = []
    skipped: list[str] = []
    state.check()  # the temp folder is made in the state folder's fd: a `.portable` swapped for a link is named first
    for owner, occurrences in _prefix_jobs(manifest, layer):
        strays = sorted({o.path for o in occurrences} - known)
        if strays:
            raise InvalidInputError(
                f"{layer.archive}: bundle.json names {strays[0]!r} as holding a prefix, but it is not a file the "
                f"layer wrote",
                field="layers.prefix_files",
                hint="the manifest is damaged or hostile; do not use this bundle",
            )
        old = str(old_bundle / owner.target) if old_bundle is not None else owner.build_prefix
        changed += relocate_tree(
            root,
            occurrences,
            old,
            str(bundle / owner.target),
            build_prefix=owner.build_prefix,
            notes=report.relocation_notes,
            tmp_dir=state.path / RELOC_TMP,  # a kill mid-rewrite leaves its temp here, not in the tree
            tmp_parent_fd=state.fd,  # made and opened in the state folder's fd, never through a link (audit65 H1)
            skipped=skipped,
            base=bundle,  # the target and the temp folder reached from the bundle without following a link (audit65)
        )
    for rel in dict.fromkeys(skipped):  # a file holding the layer's own and a foreign prefix is named once
        if f"{layer.target}/{rel}" not in report.relocation_skipped:
            report.relocation_skipped.append(f"{layer.target}/{rel}")
    return sorted(set(changed))


def _prefix_jobs(manifest: Manifest, layer: LayerEntry) -> list[tuple[LayerEntry, tuple[PrefixOccurrence, ...]]]:
    """(the layer whose build prefix it is, the occurrences) of `layer`'s files, in the order relocation applies
    them: its own prefix, then each foreign layer's by archive (those with no build prefix recorded skipped)."""
    by_archive = {x.archive: x for x in manifest.layers}
    jobs = [(layer, layer.prefix_files)] if layer.prefix_files and layer.build_prefix else []
    jobs += [
        (by_archive[a], occ) for a, occ in sorted(layer.foreign_prefix_files.items()) if by_archive[a].build_prefix
    ]
    return jobs


def _keep_rechecked(bundle: Path, manifest: Manifest, groups: list[Group], state: StateFolder) -> None:
    """`--deep` over a vouched runtime target whose stat pass found nothing changed (`Group.recheck`): its layers
    were extracted to staging like any other; when every file and link there is what the target holds (a file
    holding a build prefix compared as relocation would rewrite it for this folder), the target is kept (action
    'keep', staging removed, the other groups' staging folders renumbered) and files added inside it stay, as
    `--help` and the README promise: only a target found changed is extracted again, whole (audit62 L2)."""
    staging = bundle / STATE_DIR / "staging"
    todo = [g for g in groups if g.action == "extract"]
    kept = [i for i, g in enumerate(todo) if g.recheck and _same_as_staged(bundle, manifest, g, staging / f"{i}")]
    if not kept:
        return
    # staging/ reached through the state folder's fd, never through a link put at `.portable` (audit65 H1)
    with naming(staging):
        fd = os.open("staging", os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=state.fd)
    try:
        for i in kept:
            todo[i].action = "keep"
            remove_tree(f"{i}", dir_fd=fd, shown=str(staging / f"{i}"))
        for new, old in enumerate(i for i in range(len(todo)) if i not in kept):  # _finish numbers them 0, 1, ...
            if new != old:
                with naming(staging / f"{new}"):
                    os.rename(f"{old}", f"{new}", src_dir_fd=fd, dst_dir_fd=fd)
    finally:
        os.close(fd)


def _same_as_staged(bundle: Path, manifest: Manifest, g: Group, staged: Path) -> bool:
    """Whether every file and link extracted at `staged` is in place at `g`'s target, byte for byte (a file
    relocation rewrites: as it would be rewritten for the target where it is), and every folder with its mode.
    Anything it cannot read: False."""
    from reproduction.release.relocate import is_fallback, normalize_prefix, rewrite_bytes, strongest_modes

    root = bundle / g.target
    # (owner layer, {path: mode}) in the order `_relocate` applies them after an extraction
    jobs = [(owner, strongest_modes(occ)) for layer in g.layers for owner, occ in _prefix_jobs(manifest, layer)]
    try:
        for rel in layer_io.tree_files(staged):
            a, b = os.lstat(staged / rel), os.lstat(root / rel)
            if stat.S_ISLNK(a.st_mode) or stat.S_ISLNK(b.st_mode):
                if not (stat.S_ISLNK(a.st_mode) and stat.S_ISLNK(b.st_mode)) or os.readlink(staged / rel) != (
                    os.readlink(root / rel)
                ):
                    return False
                continue
            if not (stat.S_ISREG(a.st_mode) and stat.S_ISREG(b.st_mode)) or a.st_mode != b.st_mode:
                return False  # a lost exec bit is a change too (modes as extracted: archive's less the umask)
            if not any(rel in modes for _, modes in jobs):
                if a.st_size != b.st_size or not same_bytes(staged / rel, root / rel):
                    return False
                continue
            data = (staged / rel).read_bytes()
            for owner, modes in jobs:
                build, new = normalize_prefix(owner.build_prefix), normalize_prefix(str(bundle / owner.target))
                if rel in modes and build != new:
                    problems: list[str] = []
                    data = rewrite_bytes(
                        data,
                        modes[rel],
                        rel=rel,
                        root=root,
                        old=build,
                        new=new,
                        build=build,
                        problems=problems,
                        notes=[],
                        fallback=is_fallback(rel),
                        skipped=[],
                    )
                    if problems:
                        return False
            if data != (root / rel).read_bytes():
                return False
        if stat.S_IMODE(os.lstat(staged).st_mode) != stat.S_IMODE(os.lstat(root).st_mode):
            return False  # the target's own mode, which a fresh extraction sets from the layer's `./` (review63 R L1)
        for dirpath, dirs, _ in os.walk(staged):  # a folder's mode too, as a fresh extraction sets it (review62 R2)
            dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(dirpath, d))]
            for d in dirs:
                rel = os.path.relpath(os.path.join(dirpath, d), staged)
                a, b = os.lstat(staged / rel), os.lstat(root / rel)
                if not stat.S_ISDIR(b.st_mode) or stat.S_IMODE(a.st_mode) != stat.S_IMODE(b.st_mode):
                    return False
    except OSError:
        return False
    return True


def _check_relocatable_path(bundle: Path, manifest: Manifest) -> None:
    """Refuse, before anything is written, a bundle whose path holds a control character when a layer must be
    relocated to it (the relocator refused it after extracting, as "must be an absolute path other than '/'" with a
    hint about a folder to pass: audit48 F7); a newline would split every script and shebang it is written into."""
    if has_control(str(bundle)) and any(has_prefixes(x) for x in manifest.layers):
        raise RelocationError(
            f"{str(bundle)!r}: the bundle's path holds a control character (a newline, a tab, an escape), which "
            "the restored layers' scripts and shebangs cannot hold",
            path=bundle,
            hint="move (or rename) the bundle to a folder whose path has no control character, then restore again",
        )


def _old_bundle(rec: LayerReceipt) -> Path:
    """The bundle folder a layer was last relocated for (its recorded prefix minus its target)."""
    prefix = rec.prefix
    return Path(prefix[: len(prefix) - len(rec.target)].rstrip("/") or "/")


def _restat(bundle: Path, target: str, rec: LayerReceipt, paths: list[str]) -> None:
    """Record the files relocation rewrote as they are now: stat, and the digest of each the receipt hashes (a source
    layer's), so a later restore knows them as restore's own (review58 R2: a relocated source file that a newer
    bundle dropped was refused as "not one restore wrote"; `--deep` rehashed it against the extracted bytes).

    Each file is reached from the bundle one folder at a time without following a link (extract.open_parent) and
    read without following one: a symlink planted in a folder of `target` (or above it) after the swap is
    UnsafeArchiveError (6) naming it, never a stat or digest of a file outside the bundle recorded (audit65)."""
    for rel in paths:
        where = f"{target}/{rel}"
        try:
            fd, name = open_parent(bundle, where)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR) and exc.filename != str(bundle):
                raise through_link(bundle, where, "the restored file") from None
            raise
        try:
            st = os.lstat(name, dir_fd=fd)
            if rel in rec.digests:
                fh = open_regular(name, dir_fd=fd) if stat.S_ISREG(st.st_mode) else None
                if fh is None:  # relocation wrote a regular file there a moment ago
                    raise _replaced(bundle, where)
                with fh:
                    rec.digests[rel] = sha256_open(fh)
            rec.files[rel] = [st.st_size, st.st_mtime_ns]
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # open_regular: a symlink put in its place
                raise _replaced(bundle, where) from None
            raise OSError(exc.errno, exc.strerror, str(bundle / where)) from None
        finally:
            os.close(fd)


def _replaced(bundle: Path, where: str) -> UnsafeArchiveError:
    """The refusal of a relocated file found no longer a regular file when the receipt re-stats it (audit65)."""
    return UnsafeArchiveError(
        f"the restored file {where} is no longer a regular file (a symlink?), which appeared while restore ran: "
        "refusing to restore through it",
        member=where,
        hint=f"remove {bundle / where} and restore again; nothing outside the bundle was changed",
    )


def _member_lists(
    bundle: Path, manifest: Manifest, entries: list[LayerEntry], pool: ThreadPoolExecutor
) -> tuple[list[layer_io.LoadedLayer], list[Problem], set[str]]:
    """Member lists for `entries`: from verified indexes, else from a first (hashing) pass.

    Returns (loaded layers, problems found, index files hashed here). Archives whose size is wrong
    are not read (their stat problem is returned), nor are layers whose index does not verify.
    """
    problems, _ = stat_pass(bundle, [manifest.file(e.archive) for e in entries])
    bad = {p.path for p in problems}
    indexes = [manifest.file(e.members_index) for e in entries if e.members_index and e.archive not in bad]
    index_problems, present = stat_pass(bundle, indexes)
    index_problems += hash_entries(bundle, [f for f, _ in present], jobs=1)
    problems += index_problems
    bad |= {p.path for p in index_problems}
    futures = []  # one per layer entry (archive, target), never keyed by archive alone
    for e in entries:
        sha = manifest.file(e.archive).sha256
        if e.archive in bad or (e.members_index and e.members_index in bad):
            continue
        if e.members_index:
            members = layer_io.read_index(bundle / e.members_index, rel=e.members_index)
            futures.append(layer_io.LoadedLayer(entry=e, digest=sha, members=members))
        else:
            futures.append(pool.submit(layer_io.load_layer, bundle, e, sha))
    loaded = [f if isinstance(f, layer_io.LoadedLayer) else f.result() for f in futures]
    problems += [
        Problem(kind="digest", path=x.entry.archive, expected=manifest.file(x.entry.archive).sha256, actual=x.digest)
        for x in loaded
        if not x.ok
    ]
    return loaded, problems, {f.path for f in indexes}


_DIR_NOFOLLOW = os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _extract_groups(
    bundle: Path,
    groups: list[Group],
    loaded: dict[str, layer_io.LoadedLayer],
    *,
    jobs: int,
    ui: UiOptions | None,
    state: StateFolder,
) -> tuple[dict[str, dict[str, LayerReceipt]], list[Problem]]:
    """Extract every 'extract' group into `.portable/staging/`, up to `jobs` groups at once; each staging folder made
    and opened from the state folder's fd (never through a `.portable` swapped for a link: audit65 H1).

    Returns (receipts by target, digest problems found while extracting)."""
    staging = state.path / "staging"
    state.check()
    try:  # errors name the full path, not the bare name the *at call got (review65 S M2)
        with naming(staging):
            try:
                os.mkdir("staging", 0o755, dir_fd=state.fd)
            except FileExistsError:
                pass
            staging_fd = os.open("staging", os.O_PATH | _DIR_NOFOLLOW, dir_fd=state.fd)
    except OSError as exc:
        raise write_failed(exc, f"the staging folder {staging}") from None
    todo = [g for g in groups if g.action == "extract"]
    total = sum(x.entry.unpacked_size for x in loaded.values())
    workers = max(1, min(len(todo), jobs))  # a bundle of many targets never starts more extractions than cores

    def one(i: int, g: Group, on_bytes) -> dict[str, LayerReceipt]:
        dest = staging / f"{i}"
        try:
            with naming(dest):
                os.mkdir(f"{i}", 0o755, dir_fd=staging_fd)  # _cleanup_state emptied staging/: fresh, never a link
                dest_fd = os.open(f"{i}", os.O_RDONLY | _DIR_NOFOLLOW, dir_fd=staging_fd)
        except OSError as exc:
            raise write_failed(exc, f"the staging folder {dest}") from None
        try:
            return _extract_group(g, dest, dest_fd, on_bytes)
        finally:
            os.close(dest_fd)

    def _extract_group(g: Group, dest: Path, dest_fd: int, on_bytes) -> dict[str, LayerReceipt]:
        recs: dict[str, LayerReceipt] = {}
        for layer in g.layers:
            # Beside another group, a large layer extracts in a child: threads would take turns on the GIL.
            alone = workers == 1 or layer.members < extract_child.MIN_MEMBERS
            extract = layer_io.extract_layer if alone else extract_child.extract_layer_in_child
            written = extract(
                bundle, loaded[layer.archive], dest, digests=layer.kind == "source", on_bytes=on_bytes, dest_fd=dest_fd
            )
            for earlier in recs.values():  # an overlay's later file supersedes the earlier record
                for rel in written.files.keys() | written.links.keys():
                    earlier.files.pop(rel, None)
                    earlier.links.pop(rel, None)
                    earlier.digests.pop(rel, None)
            recs[layer.archive] = LayerReceipt(
                sha256=loaded[layer.archive].digest,
                target=g.target,
                prefix=str(bundle / g.target),
                files=written.files,
                links=written.links,
                digests=written.digests,
            )
        return recs

    recs: dict[str, dict[str, LayerReceipt]] = {}
    problems: list[Problem] = []
    try:
        with progress(ui) as bars:
            task = bars.task("extract", total=total)
            with ThreadPoolExecutor(max_workers=workers) as pool:
                futures = [pool.submit(one, i, g, task.advance) for i, g in enumerate(todo)]
                for g, f in zip(todo, futures):
                    try:
                        recs[g.target] = f.result()
                    except layer_io.DigestMismatch as exc:
                        problems.append(
                            Problem(
                                kind="digest", path=exc.archive, expected=loaded[exc.archive].digest, actual=exc.actual
                            )
                        )
    finally:
        os.close(staging_fd)
    return recs, problems


def _verify_and_extract(
    bundle: Path,
    manifest: Manifest,
    receipt: Receipt,
    groups: list[Group],
    *,
    deep: bool,
    same_manifest: bool,
    jobs: int,
    ui: UiOptions | None,
    state: StateFolder,
) -> tuple[VerifyReport, dict[str, dict[str, LayerReceipt]], list[str]]:
    """Hash plain files while layers are validated and extracted; raise once with every problem.

    Extraction goes to staging only (every component opened without following links), so when
    verification fails nothing visible has changed: no byte reaches a target before the whole
    bundle verified. Returns (report, receipts by target, harmless extra files).
    """
    entries = [layer for g in groups if g.action == "extract" for layer in g.layers]
    extracting = sum(1 for g in groups if g.action == "extract")

    def trusted(entry, st) -> bool:
        return not deep and same_manifest and receipt.plain.get(entry.path) == [st.st_size, st.st_mtime_ns]

    with ThreadPoolExecutor(max_workers=1 + max(1, len(entries))) as pool:
        loaded, problems, hashed = _member_lists(bundle, manifest, entries, pool)
        skip = {e.archive for e in entries} | hashed
        # Hashing gets the cores extraction leaves free (extraction is the critical path).
        plain = pool.submit(
            verify_bundle,
            bundle,
            manifest=manifest,
            jobs=max(1, jobs - extracting),
            trusted=trusted,
            skip=skip,
            ui=UiOptions(progress=False),
        )
        if problems:
            report = plain.result()
            extras = _split_extras(report, manifest)
            report.problems = sort_problems(report.problems + problems)
            raise_for_report(report)
        union = _union(manifest, groups, loaded)
        validate_layers(union)
        check_path_lengths(bundle, [(a, t, (m.name for m in ms)) for a, t, ms in union], targets=len(groups))
        _check_sizes(bundle, loaded)
        recs, problems = (
            _extract_groups(bundle, groups, {x.entry.archive: x for x in loaded}, jobs=jobs, ui=ui, state=state)
            if loaded
            else ({}, [])
        )
        report = plain.result()
    extras = _split_extras(report, manifest)
    report.problems = sort_problems(report.problems + problems)
    raise_for_report(report)
    report.files = len(manifest.files)
    return report, recs, extras


def _union(
    manifest: Manifest, groups: list[Group], loaded: list[layer_io.LoadedLayer]
) -> list[tuple[str, str, list[Member]]]:
    """Every layer's members in restore order: extracted ones as read, kept ones from their verified index."""
    members = {a: m for g in groups if g.action != "extract" for a, m in g.members.items()}
    members.update({x.entry.archive: x.members for x in loaded})
    return [(x.archive, x.target, members[x.archive]) for x in manifest.layers if x.archive in members]


def _split_extras(report: VerifyReport, manifest: Manifest) -> list[str]:
    """Take out of `report` the extra files that cannot affect a restore and return them.

    An extra file outside every layer target (a user's notes, a stray download) is harmless: restore
    names it and goes on. One on a target's path (a file or symlink where a target's parent folder
    must be) stays a problem: restore cannot put the target there without following or removing it.
    """
    targets = {layer.target for layer in manifest.layers}
    harmless = [
        p
        for p in report.problems
        if p.kind == "extra" and not any(t == p.path or t.startswith(p.path + "/") for t in targets)
    ]
    report.problems = [p for p in report.problems if p not in harmless]
    return [p.path for p in harmless]


def _check_sizes(bundle: Path, loaded: list[layer_io.LoadedLayer]) -> None:
    """Before any byte is written: the layers' files add up to no more than bundle.json declares.

    `unpacked_size` was only used for the free-space check, so a small archive declaring 10 bytes
    could write gigabytes (audit F6). The member list is exact (extraction refuses a header that
    differs from it), so its sum bounds what will be written: more than a declared size is
    UnsafeArchiveError (6); an undeclared size (0) still gets the free-space check (exit 8).
    """
    actual = 0
    for x in loaded:  # a layer listed from its archive was bounded while listing (layers.load_layer)
        size = 0
        for m in x.members:
            size += m.size if m.kind == "file" else 0
            if x.entry.tar_size and size > x.entry.tar_size:  # an index's impossible size (audit60 A2)
                raise layer_io.tar_size_error(x.entry, m.raw_name, m.size, size)
        if x.entry.unpacked_size and size > x.entry.unpacked_size:
            raise layer_io.unpacked_size_error(x.entry, size)
        actual += size
    layer_io.need_space(bundle, actual)


def _free_space_check(bundle: Path, groups: list[Group]) -> None:
    layer_io.need_space(bundle, sum(layer.unpacked_size for g in groups if g.action == "extract" for layer in g.layers))


def _finish(
    bundle: Path,
    manifest: Manifest,
    receipt: Receipt,
    groups: list[Group],
    recs: dict[str, dict[str, LayerReceipt]],
    report: RestoreReport,
    manifest_sha: str,
    state: StateFolder,
) -> None:
    """Swap extracted targets into place, relocate, and record everything in the receipt.

    Before the first swap the receipt stops vouching for the targets being replaced (saved to disk, their
    records moved to `replacing`, so that after a kill before every swap is done the next restore still knows
    the old trees' files as its own and finishes the job: audit62 M1); a failure after that (a swap,
    RelocationError, a full disk at the final receipt write) swaps the old trees back and re-saves the old
    receipt, so the previous state is kept. The one exception is a `relocate`-only target (the bundle moved):
    its files are rewritten in place, so after a failure the receipt no longer matches their stat and the next
    restore sees them as changed (a runtime target is extracted again; a source target reports them as locally
    edited, never overwritten).
    Every write in `.portable` (trash/, the receipt) goes through `state`'s fd, and a `.portable` found replaced
    (a symlink put there while restore ran) is UnsafeArchiveError (6) naming it, before the receipt is saved
    (audit65 H1).
    """
    trash = state.path / "trash"
    state.check()
    with naming(trash):  # an error names the full path (review65 S M2)
        os.mkdir("trash", dir_fd=state.fd)  # _cleanup_state removed any leftover (a symlink would send old trees away)
    staged = [g for g in groups if g.action == "extract"]
    preflight(bundle, [g.target for g in staged], state_dev=os.fstat(state.fd).st_dev)
    before = receipt.to_dict()
    if staged:
        for g in staged:
            for layer in g.layers:
                # Until swapped and recorded, vouch for nothing there; but a kill before the swap leaves the old tree,
                # whose files are still restore's own: kept as `replacing`, the next restore finishes (audit62 M1).
                rec = receipt.layers.pop(layer.archive, None)
                if rec is not None:
                    receipt.replacing[layer.archive] = rec
        state.check()
        save_receipt(bundle, receipt, dir_fd=state.fd)
    swapped: list[int] = []
    try:
        for i, g in enumerate(staged):
            swap_into_place(state.path / "staging" / f"{i}", bundle / g.target, trash / f"{i}", root=bundle)
            swapped.append(i)
        for g in groups:
            root = bundle / g.target
            for layer in g.layers:
                if g.action == "extract":
                    rec = recs[g.target][layer.archive]
                    known = {p for r in recs[g.target].values() for p in r.files}
                    _restat(bundle, g.target, rec, _relocate(bundle, manifest, layer, None, report, known, state))
                else:
                    rec = receipt.layers[layer.archive]
                    if g.action == "relocate":
                        known = {p for x in g.layers for p in receipt.layers[x.archive].files}
                        changed = _relocate(bundle, manifest, layer, _old_bundle(rec), report, known, state)
                        _restat(bundle, g.target, rec, changed)
                    rec.prefix = str(root)
                receipt.layers[layer.archive] = rec
            {"extract": report.extracted, "relocate": report.relocated, "keep": report.unchanged}[g.action].append(
                g.target
            )
        plain = _plain_receipt(bundle, manifest)
        if (
            report.extracted
            or report.relocated
            or receipt.replacing
            or any(g.restat for g in groups)  # files a copy gave new mtimes, found unchanged (audit62 L8)
            or (receipt.bundle_path, receipt.manifest_sha256, receipt.plain) != (str(bundle), manifest_sha, plain)
        ):
            receipt.bundle_path, receipt.manifest_sha256, receipt.plain = str(bundle), manifest_sha, plain
            receipt.replacing = {}  # every target is now recorded in `layers` (or was never the bundle's)
            state.check()
            save_receipt(bundle, receipt, dir_fd=state.fd)
    except BaseException:
        stuck = [
            x.archive
            for i in reversed(swapped)
            if not swap_back(bundle / staged[i].target, trash / f"{i}", trash / f"{i}.new", root=bundle)
            for x in staged[i].layers
        ]
        if staged or report.relocated:
            old = Receipt.from_dict(before)
            for archive in stuck:  # a target that could not be swapped back holds the new tree: vouch for nothing
                old.layers.pop(archive, None)
            try:
                save_receipt(bundle, old, dir_fd=state.fd)  # in the folder opened, whatever is at `.portable` now
            except OSError:
                pass  # the receipt on disk vouches for nothing that was being replaced: still consistent
        raise
    try:
        remove_tree("trash", dir_fd=state.fd, shown=str(trash))
    except OSError:
        pass  # the next restore removes it first (or names it)


def _plain_receipt(bundle: Path, manifest: Manifest) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for entry in manifest.files:
        st = os.lstat(bundle / entry.path)  # verified a regular file (verify's stat_pass lstats)
        out[entry.path] = [st.st_size, st.st_mtime_ns]
    return out


def restore_bundle(
    bundle: Path,
    *,
    deep: bool = False,
    refresh_source: bool = False,
    jobs: int | None = None,
    ui: UiOptions | None = None,
    wait_s: float = 0.0,
) -> RestoreReport:
    """Restore `bundle` in place: every layer extracted at its target, relocated, and recorded.

    Holds the bundle's lock throughout (LockHeldError, exit 7, if another restore holds it past
    `wait_s`). Raises InputNotFoundError (3) for a missing bundle or a file given as one,
    InvalidInputError (4) for a malformed or hostile manifest or member index, IntegrityError (5)
    listing every bad file, UnsafeArchiveError (6) naming the member, WriteFailedError (8) when the
    disk fills or a target's folder is read-only or on another filesystem, RelocationError (9) (or
    a member whose path in the bundle's folder would pass PATH_MAX), MissingDependencyError (10)
    without zstd. In every case the targets hold what they held before and the receipt vouches only
    for complete targets (see `_finish` for the one in-place case); a kill may also leave a target
    complete but not recorded, which the next restore redoes. Extra files outside every layer target
    do not stop a restore: they are listed in `report.extras`.
    """
    started = time.perf_counter()
    bundle = Path(bundle).resolve()
    manifest = load_manifest(bundle)
    check_targets(manifest)
    _check_relocatable_path(bundle, manifest)
    check_bundle_weights(bundle, manifest)  # weights must be the bytes their weight manifests pin
    jobs = jobs or default_jobs()
    report = RestoreReport(bundle=bundle)
    with bundle_lock(bundle, what="restore", wait_s=wait_s) as state:
        # `.portable` opened once, without following a link, with the lock: every later write and removal in it goes
        # through `state.fd`, so a `.portable` swapped for a symlink while restore runs is never followed (audit65 H1)
        _cleanup_state(state, strict=True)
        refuse_receipt_folder(bundle, what="restore", dir_fd=state.fd)  # before any work, not at the last write (L5)
        receipt = load_receipt(bundle, dir_fd=state.fd)
        targets = {x.target for x in manifest.layers}
        # files an earlier restore wrote, when the bundle was moved deeper since (else named as edits: audit63 A L2)
        recorded = [*receipt.replacing.values(), *receipt.layers.values()]
        check_recorded_lengths(bundle, [(r.target, [*r.files, *r.links]) for r in recorded if r.target in targets])
        manifest_sha = sha256_file(bundle / MANIFEST_NAME)
        groups = plan(bundle, manifest, receipt, deep=deep, refresh_source=refresh_source)
        _free_space_check(bundle, groups)
        for g in groups:
            if g.changed and g.layers[0].kind == "source":
                (report.overwritten if g.action == "extract" else report.kept_edits)[g.target] = g.changed
            if (
                g.action == "extract"
                and g.layers[0].kind == "source"
                and refresh_source
                and g.vouched  # else `refuse_losing_files` compares the tree with the new one and names what differs
                and (bundle / g.target).is_dir()
            ):
                known = {
                    p
                    for layer in g.layers
                    if layer.archive in receipt.layers
                    for p in receipt.layers[layer.archive].files.keys() | receipt.layers[layer.archive].links.keys()
                }
                extra = sorted(layer_io.tree_files(bundle / g.target) - known)
                if extra or g.changed:
                    report.overwritten[g.target] = sorted(set(g.changed) | set(extra))
        try:
            verified, recs, report.extras = _verify_and_extract(
                bundle,
                manifest,
                receipt,
                groups,
                deep=deep,
                same_manifest=receipt.manifest_sha256 == manifest_sha,
                jobs=jobs,
                ui=ui,
                state=state,
            )
            report.files = verified.files
            _keep_rechecked(bundle, manifest, groups, state)
            refuse_losing_files(bundle, receipt, groups, report.overwritten, refresh_source)
            _finish(bundle, manifest, receipt, groups, recs, report, manifest_sha, state)
        except OSError as exc:
            raise os_error(
                exc,
                f"the restored bundle at {bundle}",
                hint="free some space (or raise the limit, or fix the permissions) and run `portable restore` again; "
                "the previous state is kept",
            ) from None
        finally:
            _cleanup_state(state, strict=False)
        state.check()  # restored, but a `.portable` replaced meanwhile holds no receipt of it: named (audit65 H1)
    report.seconds = time.perf_counter() - started
    return report
