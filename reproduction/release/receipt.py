"""The restore receipt: what restore wrote into a bundle, so a second restore can skip it.

On disk (local state, never published)::

    <bundle>/.portable/
      receipt.json     {"format": "recap-portable-receipt", "format_version": "1.0",
                        "bundle_path": "/abs/bundle/at/last/restore",
                        "manifest_sha256": "<sha256 of bundle.json when restored>",
                        "plain": {"weights/x.safetensors": [size, mtime_ns], ...},
                        "layers": {"runtime/python.tar.zst": {
                            "sha256": "<archive digest>", "target": "runtime/python",
                            "prefix": "/abs/bundle/runtime/python",   # where it now lives
                            "files": {"bin/python3.11": [size, mtime_ns], ...},
                            "links": {"bin/python3": "python3.11", ...}}},
                        "replacing": {"runtime/python.tar.zst": {...}},   # only while a restore swaps targets
                        "fetch": {"repo": ..., "repo_type": ..., "revision": ..., "commit": ..., "time": ...,
                                  "manifest_sha256": "<sha256 of the bundle.json fetch wrote>"}}
      lock             see reproduction/release/lock.py

Written atomically (temp file + rename); a missing or unreadable receipt just means "trust
nothing", so a damaged one costs a full restore, never a wrong tree.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import stat as stat_mod
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reproduction import strict_json
from reproduction.errors import ReadFailedError
from reproduction.fsio import atomic_write_at, atomic_write_text, open_regular
from reproduction.release.manifest import STATE_DIR

if TYPE_CHECKING:
    from reproduction.release.lock import StateFolder

RECEIPT_NAME = "receipt.json"
FORMAT = "recap-portable-receipt"
FORMAT_VERSION = "1.0"


@dataclass(kw_only=True, slots=True)
class LayerReceipt:
    """What restore wrote for one layer."""

    sha256: str
    """Digest of the archive the layer was extracted from."""
    target: str
    """Folder relative to the bundle."""
    prefix: str
    """Absolute path the layer was relocated to (its target's path at the time)."""
    files: dict[str, list[int]] = field(default_factory=dict)
    """Regular files written: relative path -> [size, mtime_ns]."""
    links: dict[str, str] = field(default_factory=dict)
    """Symlinks written: relative path -> link text."""
    digests: dict[str, str] = field(default_factory=dict)
    """Source layers only: relative path -> sha256 written (what `restore --deep` compares)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "sha256": self.sha256,
            "target": self.target,
            "prefix": self.prefix,
            "files": self.files,
            "links": self.links,
            "digests": self.digests,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LayerReceipt:
        files, links, digests = data.get("files", {}), data.get("links", {}), data.get("digests", {})
        if not all(isinstance(x, dict) for x in (files, links, digests)):
            raise ValueError("files, links and digests must be objects")
        # Taken as loaded (tens of thousands of entries): `changed_files` treats a malformed value as changed.
        return cls(
            sha256=str(data["sha256"]),
            target=str(data["target"]),
            prefix=str(data["prefix"]),
            files=files,
            links=links,
            digests=digests,
        )

    def changed_files(self, root: Path) -> list[str]:
        """Recorded paths under `root` whose lstat (size, mtime) or link text no longer matches.

        lstat follows links in the folders above each path: callers check those folders once with
        `changed_folders` (release/restore_plan.py's `plan`). A path it cannot reach for lack of permission (a folder
        above it chmod 000) raises ReadFailedError (exit 3) naming it: unseen, it is not known to be edited, and a
        runtime target replaced or a source file called "locally edited" on that guess would be wrong (audit65)."""
        changed = []
        base = f"{root}/"
        for rel, recorded in self.files.items():
            try:
                st = os.lstat(base + rel)
            except PermissionError:
                raise unreachable(root, rel) from None
            except (OSError, TypeError, ValueError):
                changed.append(rel)
                continue
            if (
                not stat_mod.S_ISREG(st.st_mode)
                or st.st_mode & 0o6000  # restore never writes setuid/setgid files (safety.py refuses them)
                or [st.st_size, st.st_mtime_ns] != recorded
            ):
                changed.append(rel)
        for rel, text in self.links.items():
            try:
                if os.readlink(os.path.join(root, rel)) != text:
                    changed.append(rel)
            except PermissionError:
                raise unreachable(root, rel) from None
            except OSError:
                changed.append(rel)
        return sorted(changed)

    def changed_contents(self, root: Path, *, skip: Iterable[str] = ()) -> list[str]:
        """Recorded files whose bytes no longer hash to what was written (needs `digests`).

        `skip` (paths `changed_files` or `changed_folders` already named) are not opened, nor is
        anything below them. Each file is opened without following a link and without blocking, and
        read only when it is a regular file: a FIFO, a device or a link put in its place (to
        /dev/zero, say) counts as changed instead of hanging restore (audit45 F4). A file that cannot
        be opened for lack of permission raises ReadFailedError (exit 3) naming it: unread, it is not
        known to be edited, and calling it "locally edited" would be a guess (audit56 A2).
        """
        skipped = set(skip)
        changed = []
        for rel, digest in self.digests.items():
            if at_or_below(rel, skipped):
                continue
            try:
                if sha256_regular(f"{root}/{rel}") != digest:
                    changed.append(rel)
            except PermissionError:
                raise ReadFailedError(
                    f"cannot read {root}/{rel} to check its contents: permission denied",
                    path=f"{root}/{rel}",
                    hint=f"make it readable (`chmod u+r {root}/{rel}`) and run the command again; nothing was changed",
                ) from None
            except (OSError, TypeError, ValueError):
                changed.append(rel)
        return sorted(changed)

    def restat_unchanged(self, root: Path, paths: Iterable[str]) -> list[str]:
        """Of `paths` (files `changed_files` named by their stat), those whose bytes still hash to the recorded
        digest: a copy that reset every mtime (`cp -r`, `scp -r`) is no edit (audit62 L8). Their recorded stat is
        set to what they have now, so the next stat pass trusts them again (the caller saves the receipt). A path
        with no digest recorded (a link, a runtime layer's file), not a regular file, setuid/setgid, unreadable or
        changing while read is left out: still changed."""
        from reproduction.digests import sha256_open

        refreshed = []
        for rel in paths:
            digest = self.digests.get(rel)
            if digest is None or rel not in self.files:
                continue
            try:
                fh = open_regular(f"{root}/{rel}")
                if fh is None:
                    continue
                with fh:
                    st = os.fstat(fh.fileno())
                    if st.st_mode & 0o6000 or sha256_open(fh) != digest:
                        continue
                    after = os.fstat(fh.fileno())
            except (OSError, TypeError, ValueError):
                continue
            if (after.st_size, after.st_mtime_ns) != (st.st_size, st.st_mtime_ns):
                continue
            self.files[rel] = [st.st_size, st.st_mtime_ns]
            refreshed.append(rel)
        return refreshed


def sha256_regular(path: str) -> str | None:
    """Hex SHA-256 of the regular file at `path`; None when it is anything else (a link, a FIFO, a device)."""
    from reproduction.digests import sha256_open
    from reproduction.fsio import open_regular

    fh = open_regular(path)
    if fh is None:
        return None
    with fh:
        return sha256_open(fh)


def unreachable(root: Path, rel: str, *, purpose: str = "to check it against the restore receipt") -> ReadFailedError:
    """The one-line error (exit 3) for a recorded path `rel` under `root` that the receipt check (or what `purpose`
    says) cannot stat for lack of permission; the hint names the first folder on the way this user cannot search (else
    the path's own folder)."""
    path = f"{root}/{rel}"
    folder = os.path.dirname(path)
    here = str(root)
    for part in ["", *rel.split("/")[:-1]]:
        here = os.path.join(here, part) if part else here
        if not os.access(here, os.X_OK):
            folder = here
            break
    return ReadFailedError(
        f"cannot access {path} {purpose}: permission denied",
        path=path,
        hint=f"fix the permissions of {folder} (e.g. `chmod u+rwx {shlex.quote(folder)}`) and of the folders above "
        "it, then run the command again; nothing was changed",
    )


def at_or_below(rel: str, paths: set[str]) -> bool:
    """Whether `rel` or a folder above it is in `paths`."""
    while rel:
        if rel in paths:
            return True
        rel = rel.rpartition("/")[0]
    return False


def layer_folders(members: Iterable[tuple[str, str]]) -> set[str]:
    """The folders a tree of `members` ((name, kind) pairs) has: every folder listed and every parent
    folder of a listed entry ('' and the target itself excluded). One set lookup per member: a parent
    already seen brought its own parents with it."""
    folders: set[str] = set()
    for name, kind in members:
        head = name if kind == "dir" else name.rpartition("/")[0]
        while head and head not in folders:
            folders.add(head)
            head = head.rpartition("/")[0]
    return folders


def changed_folders(root: Path, folders: Iterable[str]) -> list[str]:
    """The `folders` under `root` that are not real folders (a symlink, a file, ...) or are gone.

    `changed_files` lstats `root/rel`, which follows a symlink in any folder above `rel`: a folder
    swapped for a link to a copy outside the bundle (same sizes, same mtimes) would pass, and a
    relocation would then rewrite files outside the bundle (audit45 F1). One lstat per distinct
    folder, not a path walk per file. A missing folder is named too: an empty folder the archive
    lists has no file whose absence would tell (a runtime may need its empty `tmp/` or `var/run/`).
    """
    bad = []
    base = f"{root}/"
    for rel in folders:
        try:
            if not stat_mod.S_ISDIR(os.lstat(base + rel).st_mode):
                bad.append(rel)
        except PermissionError:  # not known to be changed: named, as `LayerReceipt.changed_files` does (audit65)
            raise unreachable(root, rel) from None
        except (OSError, ValueError):
            bad.append(rel)
    return sorted(bad)


@dataclass(kw_only=True, slots=True)
class Receipt:
    """The whole receipt.json."""

    bundle_path: str = ""
    """Absolute bundle path at the last restore (a different path means the bundle moved)."""
    manifest_sha256: str = ""
    """Digest of bundle.json at the last restore."""
    plain: dict[str, list[int]] = field(default_factory=dict)
    """Plain files verified by hash at the last restore: path -> [size, mtime_ns]."""
    layers: dict[str, LayerReceipt] = field(default_factory=dict)
    """Restored layers by archive path."""
    fetch: dict[str, str] = field(default_factory=dict)
    """Provenance recorded by `portable fetch`: repo, repo_type, revision, commit, time."""
    replacing: dict[str, LayerReceipt] = field(default_factory=dict)
    """Records of the layers a restore was replacing when it stopped (a kill between its receipt save and its
    last swap): they vouch for nothing, but the files they record that are still as written count as restore's
    own (release/vouch.py's `own_files`), so the next restore finishes the job (audit62 M1). Empty after a
    restore that completed."""

    def to_dict(self) -> dict[str, Any]:
        out = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "bundle_path": self.bundle_path,
            "manifest_sha256": self.manifest_sha256,
            "plain": self.plain,
            "layers": {k: v.to_dict() for k, v in sorted(self.layers.items())},
            "fetch": self.fetch,
        }
        if self.replacing:  # older versions ignore the key (and, as before, count those files as nobody's)
            out["replacing"] = {k: v.to_dict() for k, v in sorted(self.replacing.items())}
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Receipt:
        if (
            data.get("format") != FORMAT
            or str(data.get("format_version", "")).split(".")[0] != FORMAT_VERSION.split(".")[0]
        ):
            raise ValueError("not a receipt this version understands")
        return cls(
            bundle_path=str(data.get("bundle_path", "")),
            manifest_sha256=str(data.get("manifest_sha256", "")),
            plain={str(k): [int(v[0]), int(v[1])] for k, v in data.get("plain", {}).items()},
            layers={str(k): LayerReceipt.from_dict(v) for k, v in data.get("layers", {}).items()},
            fetch={str(k): str(v) for k, v in data.get("fetch", {}).items()},
            replacing={str(k): LayerReceipt.from_dict(v) for k, v in data.get("replacing", {}).items()},
        )


def receipt_path(bundle: Path) -> Path:
    return Path(bundle) / STATE_DIR / RECEIPT_NAME


def refuse_receipt_folder(bundle: Path, *, what: str, dir_fd: int | None = None) -> None:
    """UnsafeArchiveError (exit 6) when `.portable/receipt.json` is a folder: `save_receipt`'s rename cannot replace
    one, so `what` (a restore) would do all its work and then fail at its last write, every time (audit62 L5). Any
    other non-file there (a link, a FIFO) is no receipt and is simply replaced. `dir_fd`: the state folder's fd
    (lock.StateFolder), the receipt looked up in it."""
    from reproduction.errors import UnsafeArchiveError

    path = receipt_path(bundle)
    try:
        folder = stat_mod.S_ISDIR((os.lstat(path) if dir_fd is None else os.lstat(RECEIPT_NAME, dir_fd=dir_fd)).st_mode)
    except OSError:
        return
    if folder:
        raise UnsafeArchiveError(
            f"{path} is a folder, where the restore receipt (a file) goes: refusing to {what}",
            member=str(path),
            hint=f"remove it (`rm -r {shlex.quote(str(path))}`: the receipt is the tool's own file) and run the "
            "command again",
        )


def load_receipt(bundle: Path, *, dir_fd: int | None = None) -> Receipt:
    """The bundle's receipt, or an empty one when absent, unreadable or of another format; `dir_fd`: the state
    folder's fd (lock.StateFolder), the receipt read from it."""
    try:  # a FIFO (or a folder, a link) is no receipt, and is never waited on (audit48 F2: restore hung on one)
        fh = open_regular(receipt_path(bundle)) if dir_fd is None else open_regular(RECEIPT_NAME, dir_fd=dir_fd)
        if fh is None:
            return Receipt()
        with fh:
            data = strict_json.loads(fh.read().decode("utf-8"))  # a repeated key: not one restore wrote (A1)
        return Receipt.from_dict(data)
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError):
        return Receipt()


def save_receipt(bundle: Path, receipt: Receipt, *, dir_fd: int | None = None) -> None:
    """Atomically replace the bundle's receipt (the old one stays if this fails). `dir_fd`: the state folder's fd
    (lock.StateFolder), the receipt written and renamed in it, never through a `.portable` swapped for a link since
    it was opened (audit65 H1)."""
    text = json.dumps(receipt.to_dict(), separators=(",", ":")) + "\n"
    if dir_fd is None:
        atomic_write_text(receipt_path(bundle), text)
    else:
        atomic_write_at(dir_fd, RECEIPT_NAME, text.encode("utf-8"), shown=receipt_path(bundle))


def record_fetch(
    bundle: Path,
    *,
    repo: str,
    repo_type: str,
    revision: str,
    commit: str,
    manifest_sha256: str = "",
    locked: bool = False,
    state: StateFolder | None = None,
) -> None:
    """Record where `bundle` was fetched from in its receipt (keeps everything else in it), with the sha256
    of the bundle.json that fetch writes (how a later fetch knows the folder's bundle is its own).

    Takes the bundle's lock (waiting up to 30 s for a running restore) unless the caller holds it
    (`locked`: fetch records under its own lock, and passes the `state` folder that lock opened: the receipt is then
    read and written through its fd, after its `check`, never through a `.portable` swapped for a link: review65 S
    M1). Raises LockHeldError if it cannot get it, OSError if the state folder cannot be written, UnsafeArchiveError
    (exit 6) when `.portable` was replaced.
    """
    from reproduction.release.lock import bundle_lock

    record = {
        "repo": repo,
        "repo_type": repo_type,
        "revision": revision or "",
        "commit": commit,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if manifest_sha256:
        record["manifest_sha256"] = manifest_sha256
    held = contextlib.nullcontext(state) if locked else bundle_lock(bundle, what="record the fetch", wait_s=30.0)
    with held as folder:
        dir_fd = None if folder is None else folder.fd
        if folder is not None:
            folder.check(what="fetch" if locked else "record the fetch")
        receipt = load_receipt(bundle, dir_fd=dir_fd)
        receipt.fetch = record
        if folder is not None:
            folder.check(what="fetch" if locked else "record the fetch")
        save_receipt(bundle, receipt, dir_fd=dir_fd)
