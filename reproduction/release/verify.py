"""Check a bundle's files against `bundle.json`: missing, extra, size and digest mismatches.

Verify collects every problem, then reports (or raises) once, so a user fixes everything in one
pass. Sizes are checked by a stat pass first (cheap, catches truncation); only files whose size
matches are hashed, in a thread pool (hashlib releases the GIL). What counts as "extra" excludes
the bundle's own bookkeeping, listed in `ignored_paths` (see reproduction/release/manifest.py).
"""

from __future__ import annotations

import os
import stat as stat_mod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reproduction.digests import default_jobs, sha256_file
from reproduction.errors import IntegrityError, os_error
from reproduction.release.manifest import (
    MANIFEST_NAME,
    RUNS_DIR,
    STATE_DIR,
    FileEntry,
    Manifest,
    load_manifest,
    shown_name,
)
from reproduction.release.safety import check_targets
from reproduction.ui import UiOptions, human_bytes, progress

PROBLEM_KINDS = ("missing", "extra", "size", "digest")
EXTRA_HINT = (
    "remove the files bundle.json does not list, or move them out of the bundle (runs belong outside it or under "
    f"its {RUNS_DIR}/ folder, which verify ignores); `portable restore` leaves extra files alone"
)
FETCH_HINT = "fetch the bundle again (or re-pack it); `portable verify --json` lists every problem"
EXIT_BY_KIND = {"missing": 11, "extra": 12, "size": 13, "digest": 14}
_SUMMARY_LINES = 40


@dataclass(kw_only=True, slots=True, frozen=True)
class Problem:
    """One mismatch between the bundle on disk and its manifest."""

    kind: str
    """'missing', 'extra', 'size' or 'digest'."""
    path: str
    """Path relative to the bundle."""
    expected: str | int | None = None
    """What the manifest pins (size in bytes or hex sha256); None for extra files."""
    actual: str | int | None = None
    """What is on disk; None for missing files."""

    def describe(self) -> str:
        """One line naming the problem, the path escaped as manifest.shown_name does (an extra file is the user's,
        so its name may hold a newline or U+202E: audit58 A5)."""
        path = shown_name(self.path)
        if self.kind == "missing":
            return f"missing  {path}" + (f" ({self.actual})" if isinstance(self.actual, str) else "")
        if self.kind == "extra":
            return f"extra    {path}"
        if self.kind == "size":
            return f"size     {path}: expected {self.expected} bytes, found {self.actual}"
        return f"digest   {path}: expected sha256 {str(self.expected)[:16]}..., found {str(self.actual)[:16]}..."

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": self.path, "expected": self.expected, "actual": self.actual}


@dataclass(kw_only=True, slots=True)
class VerifyReport:
    """The outcome of `verify_bundle`; `exit_code` is what `portable verify` returns."""

    bundle: Path
    """The bundle folder that was checked."""
    files: int = 0
    """Number of files the manifest lists."""
    bytes_checked: int = 0
    """Bytes hashed (or confirmed by a trusted stat)."""
    problems: list[Problem] = field(default_factory=list)
    """Every mismatch found, sorted by kind then path."""

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def exit_code(self) -> int:
        """0 when ok; else the lowest of 11 missing, 12 extra, 13 size, 14 digest present."""
        return min((EXIT_BY_KIND[p.kind] for p in self.problems), default=0)

    def counts(self) -> dict[str, int]:
        return {kind: sum(1 for p in self.problems if p.kind == kind) for kind in PROBLEM_KINDS}

    def summary(self) -> str:
        """A human summary: one line when ok, else a count line plus one line per problem (capped)."""
        if self.ok:
            return (
                f"verified {self.bundle}: {self.files} files, {human_bytes(self.bytes_checked)}, all match bundle.json"
            )
        counts = ", ".join(f"{n} {kind}" for kind, n in self.counts().items() if n)
        lines = [f"verify {self.bundle}: {len(self.problems)} problem(s): {counts}"]
        lines += ["  " + p.describe() for p in self.problems[:_SUMMARY_LINES]]
        if len(self.problems) > _SUMMARY_LINES:
            lines.append(f"  ... and {len(self.problems) - _SUMMARY_LINES} more (see `portable verify --json`)")
        return "\n".join(lines)

    def hint(self) -> str:
        """What to do about the problems found (extra files alone need no new download)."""
        if self.problems and all(p.kind == "extra" for p in self.problems):
            return EXTRA_HINT
        return FETCH_HINT

    def to_dict(self) -> dict[str, Any]:
        return {
            "bundle": str(self.bundle),
            "ok": self.ok,
            "exit_code": self.exit_code,
            "files": self.files,
            "bytes_checked": self.bytes_checked,
            "counts": self.counts(),
            "problems": [p.to_dict() for p in self.problems],
        }


def ignored_paths(manifest: Manifest) -> tuple[set[str], set[str]]:
    """(ignored files, ignored folders) relative to the bundle: never reported as extra.

    bundle.json itself, the state folder (receipt, lock, staging), every layer's target (its
    contents are checked by restore's receipt, not by the manifest) and `runs/`, where a user's run
    outputs may live (unless the bundle itself ships files there). `__pycache__` folders under
    `reproduction/` are ignored by name in `find_extras`.
    """
    dirs = {STATE_DIR} | {layer.target for layer in manifest.layers}
    if not any(e.path.split("/", 1)[0] == RUNS_DIR for e in manifest.files):
        dirs.add(RUNS_DIR)
    return {MANIFEST_NAME}, dirs


def find_extras(bundle: Path, manifest: Manifest) -> list[str]:
    """Files under `bundle` that the manifest does not list (ignoring `ignored_paths`)."""
    listed = {e.path for e in manifest.files}
    skip_files, skip_dirs = ignored_paths(manifest)
    extras: list[str] = []
    for root, dirs, names in os.walk(bundle):
        rel_root = os.path.relpath(root, bundle)
        rel_root = "" if rel_root == "." else rel_root + "/"
        keep = []
        for d in dirs:
            rel = rel_root + d
            if os.path.islink(os.path.join(root, d)) and rel != RUNS_DIR:
                # A symlinked folder is never part of a bundle; the state folder or a layer target as a
                # link would have restore write through it (audit F1, F3). runs/ may point at a big disk.
                extras.append(rel)
                continue
            if rel in skip_dirs or (d == "__pycache__" and rel.startswith("reproduction/")):
                continue
            keep.append(d)
        dirs[:] = keep
        for name in names:
            rel = rel_root + name
            if rel not in listed and rel not in skip_files:
                extras.append(rel)
    return sorted(extras)


def stat_pass(
    bundle: Path, entries: Iterable[FileEntry]
) -> tuple[list[Problem], list[tuple[FileEntry, os.stat_result]]]:
    """Stat every entry: (missing/size problems, [(entry, stat)] of files whose size matches).

    lstat, and no folder on the way may be a symlink: a bundle file that is a link (or under a
    linked folder) out of the bundle would be hashed, then read by `run`, where it points and can
    change after verification (audit F7). Such a file is 'missing' with `actual` saying why.
    """
    problems: list[Problem] = []
    present: list[tuple[FileEntry, os.stat_result]] = []
    linked: dict[str, bool] = {}  # bundle-relative folder -> is it (or a folder above it) a symlink
    for entry in entries:
        if under_symlink(bundle, entry.path.rpartition("/")[0], linked):
            problems.append(Problem(kind="missing", path=entry.path, expected=entry.size, actual="under a symlink"))
            continue
        try:
            st = os.lstat(bundle / entry.path)
        except (FileNotFoundError, NotADirectoryError):
            problems.append(Problem(kind="missing", path=entry.path, expected=entry.size))
            continue
        except OSError as exc:  # verify only reads: EACCES is unreadable input (3), not a failed write (audit F11)
            raise os_error(exc, f"the bundle file {entry.path}", op="read") from None
        if stat_mod.S_ISLNK(st.st_mode):
            problems.append(Problem(kind="missing", path=entry.path, expected=entry.size, actual="a symlink"))
        elif not stat_mod.S_ISREG(st.st_mode):
            problems.append(Problem(kind="missing", path=entry.path, expected=entry.size, actual="not a regular file"))
        elif st.st_size != entry.size:
            problems.append(Problem(kind="size", path=entry.path, expected=entry.size, actual=st.st_size))
        else:
            present.append((entry, st))
    return problems, present


def under_symlink(bundle: Path, folder: str, cache: dict[str, bool] | None = None) -> bool:
    """Whether bundle-relative `folder` or a folder above it is a symlink (answers cached per folder)."""
    if not folder:
        return False
    cache = {} if cache is None else cache
    if folder not in cache:
        try:
            is_link = stat_mod.S_ISLNK(os.lstat(bundle / folder).st_mode)
        except OSError:
            is_link = False  # missing: the file's own lstat reports it
        cache[folder] = is_link or under_symlink(bundle, folder.rpartition("/")[0], cache)
    return cache[folder]


def hash_entries(
    bundle: Path, entries: list[FileEntry], *, jobs: int | None = None, on_bytes: Callable[[int], None] | None = None
) -> list[Problem]:
    """Hash `entries` in a thread pool, largest first (so the tail is short); digest problems only."""
    from concurrent.futures import ThreadPoolExecutor

    order = sorted(entries, key=lambda e: -e.size)
    with ThreadPoolExecutor(max_workers=jobs or default_jobs()) as pool:
        digests = list(pool.map(lambda e: sha256_file(bundle / e.path, on_bytes=on_bytes), order))
    return [
        Problem(kind="digest", path=e.path, expected=e.sha256, actual=d)
        for e, d in zip(order, digests)
        if d != e.sha256
    ]


def sort_problems(problems: list[Problem]) -> list[Problem]:
    return sorted(problems, key=lambda p: (PROBLEM_KINDS.index(p.kind), p.path))


def verify_bundle(
    bundle: Path,
    *,
    jobs: int | None = None,
    ui: UiOptions | None = None,
    manifest: Manifest | None = None,
    trusted: Callable[[FileEntry, os.stat_result], bool] | None = None,
    skip: Iterable[str] = (),
) -> VerifyReport:
    """Check every file of `bundle` against its manifest (read from `bundle.json` unless given).

    `trusted(entry, stat)` lets a caller (restore's receipt) vouch for a file without rehashing;
    `skip` names files the caller hashes itself (restore hashes archives while reading them).
    Reads only; never modifies the bundle. Raises InputNotFoundError / InvalidInputError /
    UnsupportedFormatError for a missing or malformed bundle.json; mismatches go in the report.
    """
    bundle = Path(bundle)
    manifest = manifest or load_manifest(bundle)
    check_targets(manifest)  # what restore refuses is not "all match" (audit60 A6)
    skip = set(skip)
    problems, present = stat_pass(bundle, (e for e in manifest.files if e.path not in skip))
    problems += [Problem(kind="extra", path=rel) for rel in find_extras(bundle, manifest)]
    to_hash = [e for e, st in present if not (trusted and trusted(e, st))]
    total = sum(e.size for e, _ in present)
    with progress(ui) as bars:
        task = bars.task("verify", total=sum(e.size for e in to_hash))
        try:
            problems += hash_entries(bundle, to_hash, jobs=jobs, on_bytes=task.advance)
        except OSError as exc:
            raise os_error(exc, "a file of the bundle", op="read") from None
    return VerifyReport(bundle=bundle, files=len(manifest.files), bytes_checked=total, problems=sort_problems(problems))


def raise_for_report(report: VerifyReport) -> None:
    """Raise one IntegrityError carrying every problem of a failed report (no-op when ok)."""
    if report.ok:
        return
    raise IntegrityError(report.summary(), problems=report.problems, bundle=report.bundle, hint=report.hint())


def verify_or_raise(
    bundle: Path, *, jobs: int | None = None, ui: UiOptions | None = None, manifest: Manifest | None = None
) -> VerifyReport:
    """`verify_bundle`, then raise IntegrityError (exit 5) listing every problem if any."""
    report = verify_bundle(bundle, jobs=jobs, ui=ui, manifest=manifest)
    raise_for_report(report)
    return report
