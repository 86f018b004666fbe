"""Preflight: check everything a run needs before any worker starts, and report every problem at once.

Generic checks live here (placeholder paths, disk space, the bundle's pinned weights, collecting); the
runner makes `run_problems` for every run, then each recipe adds its own (datasets, batch sizes) through
its `preflight` function, which returns a list of problems.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from reproduction.digest_cache import DigestCache
from reproduction.errors import PortableError, PreflightError

PLACEHOLDER = "/path/to/"
MISSING_DATASET_HINT = (
    "point it at a dataset folder; a ${BUNDLE}/... path needs the bundle as BUNDLE (portable run BUNDLE)"
)
"""The hint under a configured dataset path that does not exist (every recipe's preflight)."""


def placeholder_problems(plain: Any, prefix: str = "") -> list[str]:
    """Every config string that still holds a `/path/to/` placeholder, by key."""
    out: list[str] = []
    if isinstance(plain, dict):
        for k, v in plain.items():
            out += placeholder_problems(v, f"{prefix}{k}.")
    elif isinstance(plain, list):
        for i, v in enumerate(plain):
            out += placeholder_problems(v, f"{prefix.rstrip('.')}[{i}].")
    elif isinstance(plain, str) and PLACEHOLDER in plain:
        out.append(f"{prefix.rstrip('.')}: {plain!r} still holds a {PLACEHOLDER} placeholder; set a real path")
    return out


def run_problems(plain: Any, digests: DigestCache | None = None) -> tuple[list[str | PortableError], bool]:
    """The checks every recipe's run gets before its own (the runner makes them; a recipe's preflight adds the
    rest): config strings still holding a `/path/to/` placeholder (`plain`: the config as run.json records it,
    converted once by the runner), the bundle's pinned weights, the bundle files the config reads, the restore's
    receipt. Returns (problems, damaged): `damaged` when files the run reads are not the bundle's, so the
    recipe's checks (a dataset that no longer opens) would only echo them."""
    from reproduction.errors import ConfigError
    from reproduction.run.config import select

    bundle = select(plain, "BUNDLE")  # None: a schema without the field (or a config that is no dataclass)
    problems: list[str | PortableError] = [ConfigError(p) for p in placeholder_problems(plain)]
    problems += bundle_weights_problems(bundle, digests)
    damaged = bundle_files_problems(bundle, plain)
    if damaged:
        return problems + damaged, True
    return problems + bundle_restore_problems(bundle), False


def disk_problems(run_dir: Path, min_free_gb: float) -> list[str]:
    """The run folder's file system must have `min_free_gb` GiB free."""
    probe = Path(run_dir).resolve()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free / 2**30
    if not free >= min_free_gb:  # a nan minimum is a problem too, never a check that always passes (audit52 W7)
        return [f"{probe}: {free:.2f} GiB free, the run needs min_free_gb={min_free_gb:g} GiB; free space or lower it"]
    return []


def bundle_weights_problems(bundle: str | Path | None, digests: DigestCache | None = None) -> list[PortableError]:
    """The restored bundle's weights files whose bytes are not the ones its weight manifests pin.

    Rehashes every file the bundle's `weights_manifest/` copies name (release/weights.py), so a file
    edited or replaced after restore is caught before any worker starts. Returns at most one
    IntegrityError (exit 5) whose one-line message names every bad file by its bundle path; none for
    no bundle, a folder without bundle.json, or a bundle that carries no weight manifests. `digests`: the
    run's digest cache (the lineage of a stage that starts from these weights then hashes nothing again).
    """
    if not bundle:
        return []
    from reproduction.release.weights import verify_bundle_weights

    stamp_path, stamp = _weights_stamp(Path(bundle))
    if stamp_path is not None and _read_text(stamp_path) == stamp:
        return []  # the same files, by size and mtime, as at this bundle's last clean check
    try:
        verify_bundle_weights(Path(bundle), digests=digests)
    except PortableError as exc:
        exc.message = "bundle weights: " + " ".join(exc.message.split())  # one line, whatever it quoted
        exc.args = (exc.message,)
        return [exc]
    if stamp_path is not None:
        _save_stamp(stamp_path, stamp)
    return []


def _weights_stamp(bundle: Path) -> tuple[Path | None, str]:
    """(cache file, stamp): size and mtime_ns of bundle.json, the LICENSES/ and weights_manifest/ copies and
    every file under each weights `dest` the bundle names, so a finished `run --resume` does not rehash
    gigabytes of unchanged weights (the stat rule run/content.py uses). (None, "") when the bundle names no
    weights or its bundle.json is unreadable: then nothing is cached and the weights are always rehashed."""
    import json

    try:
        items = json.loads((bundle / "bundle.json").read_text(encoding="utf-8")).get("metadata", {}).get("weights")
        dests = sorted({str(item.get("dest", "weights")) for item in items or []})
    except (OSError, ValueError, AttributeError):
        return None, ""
    if not dests:
        return None, ""
    return _stamp(bundle, "weights", ["bundle.json", "LICENSES", "weights_manifest", *dests])


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return None


def bundle_files_problems(bundle: str | Path | None, plain: dict[str, Any]) -> list[PortableError]:
    """The bundle files the run reads (datasets, tokenizers, references, configs: every config path inside
    the bundle) whose bytes are not the ones `bundle.json` pins, checked like `portable verify` does.

    A config string that names a path inside `bundle` selects every manifest file at or under it (plus
    the files under it that bundle.json does not list, which the run would read too). Stat-stamped like
    the weights (`_stamp`): a finished `--resume` over unchanged files rehashes nothing. Returns at most
    one IntegrityError whose exit code is `portable verify`'s for the same problems (11 missing, 12 extra,
    13 size, 14 digest; lowest wins) and whose one-line message names every bad file; none for no bundle,
    a folder without bundle.json, or a config that reads nothing from the bundle.
    """
    if not bundle:
        return []
    from reproduction.errors import IntegrityError
    from reproduction.release.manifest import MANIFEST_NAME, STATE_DIR, load_manifest
    from reproduction.release.verify import EXIT_BY_KIND, Problem, hash_entries, sort_problems, stat_pass
    from reproduction.release.weights import weights_items

    root = Path(bundle).resolve()
    if not (root / MANIFEST_NAME).is_file():
        return []
    manifest = load_manifest(root)
    weights = {item.get("dest", "weights") for item in weights_items(manifest)}
    found = _bundle_prefixes(root, plain) | ({manifest.entry_config} if manifest.entry_config else set())
    # not twice: the weights' own check (bundle_weights_problems) rehashes their folders; layer targets are
    # restore's (its receipt), and .portable/ is bookkeeping
    skip = weights | {layer.target for layer in manifest.layers} | {STATE_DIR}
    prefixes = sorted(p for p in found if not any(p == w or p.startswith(w + "/") for w in skip))
    if not prefixes:
        return []

    def chosen(rel: str) -> bool:
        return any(rel == p or rel.startswith(p + "/") for p in prefixes)

    entries = [e for e in manifest.files if chosen(e.path)]
    stamp_path, stamp = _stamp(root, "files", [MANIFEST_NAME, *prefixes])
    if _read_text(stamp_path) == stamp:
        return []
    problems, present = stat_pass(root, entries)
    listed = {e.path for e in manifest.files}
    extras = [rel for rel in _files_under(root, prefixes) if rel not in listed]
    problems += [Problem(kind="extra", path=rel) for rel in extras if not any(rel.startswith(w + "/") for w in skip)]
    try:
        problems += hash_entries(root, [e for e, _ in present])
    except OSError as exc:
        from reproduction.errors import os_error

        return [os_error(exc, "a file of the bundle", op="read")]
    if problems:
        problems = sort_problems(problems)
        err = IntegrityError(
            f"bundle files: {len(problems)} file(s) the run reads differ from {root / MANIFEST_NAME}: "
            + "; ".join(" ".join(p.describe().split()) for p in problems[:20])
            + (f"; ... and {len(problems) - 20} more" if len(problems) > 20 else ""),
            problems=problems,
            bundle=root,
            hint=f"`portable verify {root}` lists every problem; fetch or copy the bundle again, then restore it",
        )
        err.exit_code = min(EXIT_BY_KIND[p.kind] for p in problems)  # the code `portable verify` gives
        return [err]
    _save_stamp(stamp_path, stamp)
    return []


def bundle_restore_problems(bundle: str | Path | None) -> list[PortableError]:
    """A bundle with layers (runtimes, sources) that was not restored here: one NotRestoredError (exit 57)
    naming `portable restore BUNDLE` and what is missing (the `bundle.restore` row of `portable check`).
    None for no bundle, a folder without bundle.json, or a bundle without layers (nothing to restore: the
    run uses the current interpreter and the bundle's plain files, which `bundle_files_problems` checks)."""
    if not bundle:
        return []
    from reproduction.checks.bundle import probe_restored
    from reproduction.errors import NotRestoredError
    from reproduction.release.manifest import MANIFEST_NAME, load_manifest

    root = Path(bundle).resolve()
    if not (root / MANIFEST_NAME).is_file():
        return []
    manifest = load_manifest(root)
    if not manifest.layers:
        return []
    row = probe_restored(root, manifest)
    if row.status != "fail":
        return []
    return [
        NotRestoredError(
            f"bundle {root} has {len(manifest.layers)} layer(s), {row.finding}",
            path=root,
            hint=f"run `portable restore {root}` first (it extracts and relocates the layers), then run again",
        )
    ]


def _bundle_prefixes(bundle: Path, plain: dict[str, Any]) -> set[str]:
    """Bundle-relative paths of every string of the (plain) config that names an existing path inside `bundle`
    (not the bundle itself, nor `runs/` where outputs go)."""

    out: set[str] = set()

    def walk(value: Any, key: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{key}.{k}" if key else str(k))
        elif isinstance(value, list):
            for v in value:
                walk(v, key)
        elif isinstance(value, str) and key not in ("BUNDLE", "RUN") and value and "\0" not in value:
            try:
                path = Path(value)
                if not path.is_absolute() or not path.exists():
                    return
                rel = path.resolve().relative_to(bundle).as_posix()
            except (OSError, ValueError):
                return
            if rel not in (".", "") and rel.split("/", 1)[0] != "runs":
                out.add(rel)

    walk(plain, "")
    return out


def _files_under(bundle: Path, prefixes: list[str]) -> list[str]:
    """Bundle-relative paths of the regular files at or under each prefix (no `__pycache__`)."""
    out = []
    for top in prefixes:
        root = bundle / top
        for path in [root] if root.is_file() else root.rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                out.append(path.relative_to(bundle).as_posix())
    return sorted(set(out))


def _stamp(bundle: Path, kind: str, tops: list[str]) -> tuple[Path, str]:
    """(cache file, stamp): size and mtime_ns of every file at or under each of `tops` (bundle-relative)."""
    import hashlib

    from reproduction.data.fingerprint import cache_dir

    lines = []
    for top in tops:
        root = bundle / top
        for path in sorted([root] if root.is_file() else root.rglob("*")):
            if path.is_file():
                st = path.stat()
                lines.append(f"{path.relative_to(bundle).as_posix()}\0{st.st_size}\0{st.st_mtime_ns}")
    key = hashlib.sha256(str(bundle.resolve()).encode()).hexdigest()[:32]
    return cache_dir() / f"{kind}-{key}.txt", "\n".join(tops) + "\n--\n" + "\n".join(lines) + "\n"


def _save_stamp(stamp_path: Path, stamp: str) -> None:
    from reproduction.fsio import atomic_write_text

    try:
        atomic_write_text(stamp_path, stamp)
    except OSError:
        pass  # a read-only cache only costs the rehash next time


NOTHING_STARTED = "nothing was started or written"
"""What the hint under a preflight refusal says of the run."""


def raise_problems(problems: list[str | PortableError]) -> None:
    """Raise nothing for no problems; for one, the error itself with its own exit code (a string, from a recipe's
    preflight, as a ConfigError: exit 4, as the generic checks' one placeholder is), and a hint when it has none;
    PreflightError (exit 56) listing all of them for several. One problem was exit 56 ("several problems") without a
    hint when a recipe returned it as a string (audit50 F10)."""
    if not problems:
        return
    if len(problems) == 1:
        from reproduction.errors import ConfigError

        (one,) = problems
        error = one if isinstance(one, PortableError) else ConfigError(f"preflight: {one}")
        if error.hint is None:
            error.hint = f"fix it, then run again ({NOTHING_STARTED})"
        raise error
    codes = {p.exit_code for p in problems if isinstance(p, PortableError)}
    lines = [p.message if isinstance(p, PortableError) else str(p) for p in problems]
    raise PreflightError(
        f"preflight found {len(lines)} problems: " + " | ".join(lines),
        codes=sorted(codes),
        problems=lines,
        hint=f"fix them all, then run again ({NOTHING_STARTED})",
    )
