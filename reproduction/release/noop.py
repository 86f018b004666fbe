"""The no-change re-restore, answered from the receipt and one stat pass before the CLI loads.

A second `portable restore` of an unchanged bundle is bounded by interpreter start and a stat
pass; argparse, dataclasses and the restore machinery cost more than the stat pass itself. This
module uses only os/errno/json/hashlib/fcntl and the stdlib-only reproduction.strict_json (a repeated key in
a JSON file it reads is a doubt), and answers one question: would `restore_bundle` do nothing
at all (every target kept, nothing to hash, no receipt to rewrite, no warning to print)? It says
yes only when every condition the full path checks holds, under the bundle's lock; at the first
doubt (any difference, a flag it does not know, an error of any kind) it says no and the full
path runs and reports. It never writes anything but the lock file's holder line, and not that on a
read-only filesystem, where an unchanged restored bundle is reported restored (exit 0) without it.

Conditions (mirroring restore_plan.py's `plan` and restore.py's `_verify_and_extract` and `_finish`, by design:
a condition added to one is added to the other, in the same terms): bundle.json
hashes to the receipt's digest and the bundle is where the receipt says; no staging or trash is
left over; every plain file is a regular file whose (size, mtime_ns) is the receipt's; no file
the manifest does not list lies outside the layer targets; every layer's receipt names the
archive's digest, the layer's target and the target's current path (a real folder), lists exactly
the files and links of the layer's verified member index, and every file and link it wrote still
has its recorded stat (no setuid/setgid bit) or text, and every folder of the member index (listed, or
above a listed entry) that is there is a real folder, not a symlink or a file (audit45 F1).
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import sys
import time

from reproduction import strict_json

# Duplicated from receipt.py / manifest.py / lock.py so this module imports none of them;
# tests/test_restore.py checks that they agree.
MANIFEST_NAME = "bundle.json"
STATE_DIR = ".portable"
RECEIPT_NAME = "receipt.json"
RECEIPT_FORMAT = "recap-portable-receipt"
RECEIPT_MAJOR = "1"
LOCK_NAME = "lock"
RUNS_DIR = "runs"

_QUIET = frozenset({"-q", "--quiet"})
_HARMLESS = _QUIET | {"--no-progress"}


def parse_argv(argv: list[str]) -> tuple[str | None, bool] | None:
    """(bundle argument or None, quiet) for `restore [BUNDLE]` with only -q/--no-progress, else None."""
    words = [a for a in argv if a not in _HARMLESS]
    if not words or words[0] != "restore" or len(words) > 2 or any(not w or w.startswith("-") for w in words):
        return None  # an empty BUNDLE is refused by the CLI (exit 2), never taken as the current folder
    return (words[1] if len(words) == 2 else None), any(a in _QUIET for a in argv)


def _unchanged_layer(root: str, rec: dict) -> bool:
    base = root + "/"
    lstat, isreg = os.lstat, stat.S_ISREG
    for rel, recorded in rec.get("files", {}).items():
        st = lstat(base + rel)
        if not isreg(st.st_mode) or st.st_mode & 0o6000 or [st.st_size, st.st_mtime_ns] != recorded:
            return False
    for rel, text in rec.get("links", {}).items():
        if os.readlink(base + rel) != text:
            return False
    return True


def _covers(bundle: str, group: list[dict], files: dict, recs: dict) -> bool:
    """The records of one target's layers list exactly the files and links of their verified member indexes
    (release/vouch.py's `vouched`: a receipt shipped in the bundle folder must not vouch for a hand-made tree),
    and every folder those indexes list or imply is there as a real folder (restore_plan.py's `_changed` with
    receipt.py's `changed_folders`: `_unchanged_layer`'s lstat follows a linked folder, and an empty listed folder
    has no file whose absence would tell)."""
    expected: dict[str, str | None] = {}
    recorded: dict[str, str | None] = {}
    folders: set[str] = set()
    for layer in group:
        index = layer.get("members_index")
        if not index or index not in files:
            return False
        with open(os.path.join(bundle, index), "rb") as fh:
            raw = fh.read()
        if hashlib.sha256(raw).hexdigest() != files[index]["sha256"]:
            return False
        for name, kind, _mode, _size, link in strict_json.loads(raw)["members"]:
            if kind in ("file", "symlink"):
                expected[name] = link if kind == "symlink" else None
            head = name if kind == "dir" else name.rpartition("/")[0]
            while head and head not in folders:  # a parent already seen brought its own parents
                folders.add(head)
                head = head.rpartition("/")[0]
        rec = recs[layer["archive"]]
        recorded.update(dict.fromkeys(rec.get("files", {})))
        recorded.update(rec.get("links", {}))
    if recorded != expected:
        return False
    base = os.path.join(bundle, group[0]["target"]) + "/"
    for rel in folders:
        try:
            if not stat.S_ISDIR(os.lstat(base + rel).st_mode):
                return False
        except OSError:
            return False
    return True


def _no_extras(bundle: str, listed: set[str], targets: set[str]) -> bool:
    """Nothing under `bundle` that verify's `find_extras` would report (see verify.ignored_paths)."""
    skip_dirs = {STATE_DIR} | targets
    if not any(p.split("/", 1)[0] == RUNS_DIR for p in listed):
        skip_dirs.add(RUNS_DIR)
    for root, dirs, names in os.walk(bundle):
        rel_root = os.path.relpath(root, bundle)
        rel_root = "" if rel_root == "." else rel_root + "/"
        keep = []
        for d in dirs:
            rel = rel_root + d
            if os.path.islink(os.path.join(root, d)) and rel != RUNS_DIR:
                return False
            if rel in skip_dirs or (d == "__pycache__" and rel.startswith("reproduction/")):
                continue
            keep.append(d)
        dirs[:] = keep
        for name in names:
            rel = rel_root + name
            if rel not in listed and rel != MANIFEST_NAME:
                return False
    return True


def _read_regular(path: str, *, follow: bool) -> bytes:
    """The bytes of `path` when it is a regular file; OSError otherwise. Never waits on a FIFO (audit48 F2: restore
    hung on a FIFO bundle.json or receipt); as fsio.open_regular, which this module does not import."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path}: not a regular file")
        with open(fd, "rb", closefd=False) as fh:
            return fh.read()
    finally:
        os.close(fd)


def _check(bundle: str) -> tuple[int, list[str]] | None:
    """(files verified, targets in restore order) when a restore of `bundle` would change nothing."""
    raw = _read_regular(os.path.join(bundle, MANIFEST_NAME), follow=True)
    state = os.path.join(bundle, STATE_DIR)
    receipt = strict_json.loads(_read_regular(os.path.join(state, RECEIPT_NAME), follow=False))
    if (
        receipt.get("format") != RECEIPT_FORMAT
        or str(receipt.get("format_version", "")).split(".")[0] != RECEIPT_MAJOR
        or receipt.get("manifest_sha256") != hashlib.sha256(raw).hexdigest()
        or receipt.get("bundle_path") != bundle
    ):
        return None
    if any(os.path.lexists(os.path.join(state, name)) for name in ("staging", "trash", "reloc")):
        return None
    manifest = strict_json.loads(raw)  # a repeated key raises: the full path reports it (audit58 A1)
    files = {e["path"]: e for e in manifest["files"]}
    plain = receipt.get("plain", {})
    if set(plain) != set(files):
        return None
    # A file that is a link, or lies under a linked folder, is one verify refuses (audit F7): lstat catches the
    # first, `_no_extras` (a linked folder outside the targets) the second; realpath per file cost a path walk each.
    for rel, recorded in plain.items():
        st = os.lstat(os.path.join(bundle, rel))
        if not stat.S_ISREG(st.st_mode) or [st.st_size, st.st_mtime_ns] != recorded:
            return None
    layers = sorted(manifest.get("layers", []), key=lambda x: x["order"])
    targets = {x["target"] for x in layers}
    if not _no_extras(bundle, set(files), targets):
        return None
    recs = receipt.get("layers", {})
    order: list[str] = []
    for layer in layers:
        rec, root = recs.get(layer["archive"]), os.path.join(bundle, layer["target"])
        if (
            not isinstance(rec, dict)
            or rec.get("sha256") != files[layer["archive"]]["sha256"]
            or rec.get("target") != layer["target"]
            or rec.get("prefix") != root
            or not stat.S_ISDIR(os.lstat(root).st_mode)
            or not _unchanged_layer(root, rec)
        ):
            return None
        if layer["target"] not in order:
            order.append(layer["target"])
    for target in order:
        if not _covers(bundle, [x for x in layers if x["target"] == target], files, recs):
            return None
    return len(files), order


def try_noop_restore(argv: list[str], default_bundle: str) -> int | None:
    """Exit code 0 after printing restore's summary when `argv` asks for a restore that would change
    nothing; None (having done nothing) whenever the full `portable restore` must run."""
    started = time.perf_counter()
    parsed = parse_argv(argv)
    if parsed is None:
        return None
    given, quiet = parsed
    try:
        bundle = os.path.realpath(given if given is not None else default_bundle)
        # The state folder opened without following a link, the lock opened in it: a symlinked state folder (even one
        # swapped in after a check) is never followed to a lock file outside the bundle (review65 H1); the full path
        # refuses it.
        state = os.open(os.path.join(bundle, STATE_DIR), os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        # O_NOFOLLOW: a lock that is a symlink must not be truncated through (the full path refuses it).
        flags = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd, writable = os.open(LOCK_NAME, os.O_RDWR | flags, dir_fd=state), True
        except OSError as exc:
            if exc.errno != errno.EROFS:
                raise
            # A read-only filesystem (a shared image of a restored bundle): no restore can change the bundle
            # there, so the check runs on a read-only lock without the holder line (audit56 A4).
            fd, writable = os.open(LOCK_NAME, os.O_RDONLY | flags, dir_fd=state), False
        finally:
            os.close(state)
    except (OSError, ValueError):
        return None
    try:
        import fcntl

        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if writable:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()}: restore".encode(), 0)
        try:
            found = _check(bundle)
        finally:
            if writable:
                os.ftruncate(fd, 0)
    except Exception:  # any doubt at all: the full path decides and reports
        return None
    finally:
        os.close(fd)
    if found is None:
        return None
    count, targets = found
    if not quiet:
        line = f"restored {bundle} in {time.perf_counter() - started:.1f}s: {count} files verified"
        if targets:
            line += f"; unchanged {', '.join(targets)}"
        print(line, file=sys.stderr, flush=True)
    return 0
