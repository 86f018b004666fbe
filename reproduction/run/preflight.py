"""Preflight: check everything a run needs before any worker starts, and report every problem at once.

Generic checks live here (placeholder paths, disk space, the bundle's pinned weights, collecting);
each recipe adds its own (datasets, batch sizes) through its `preflight` function, which returns a
list of problem lines.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from reproduction.errors import PortableError, PreflightError

PLACEHOLDER = "/path/to/"


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


def disk_problems(run_dir: Path, min_free_gb: float) -> list[str]:
    """The run folder's file system must have `min_free_gb` GiB free."""
    probe = Path(run_dir).resolve()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free / 2**30
    if free < min_free_gb:
        return [f"{probe}: {free:.2f} GiB free, the run needs min_free_gb={min_free_gb:g} GiB; free space or lower it"]
    return []


def bundle_weights_problems(bundle: str | Path | None) -> list[PortableError]:
    """The restored bundle's weights files whose bytes are not the ones its weight manifests pin.

    Rehashes every file the bundle's `weights_manifest/` copies name (release/weights.py), so a file
    edited or replaced after restore is caught before any worker starts. Returns at most one
    IntegrityError (exit 5) whose one-line message names every bad file by its bundle path; none for
    no bundle, a folder without bundle.json, or a bundle that carries no weight manifests.
    """
    if not bundle:
        return []
    from reproduction.release.weights import verify_bundle_weights

    stamp_path, stamp = _weights_stamp(Path(bundle))
    if stamp_path is not None and _read_text(stamp_path) == stamp:
        return []  # the same files, by size and mtime, as at this bundle's last clean check
    try:
        verify_bundle_weights(Path(bundle))
    except PortableError as exc:
        exc.message = "bundle weights: " + " ".join(exc.message.split())  # one line, whatever it quoted
        exc.args = (exc.message,)
        return [exc]
    if stamp_path is not None:
        from reproduction.fsio import atomic_write_text

        try:
            atomic_write_text(stamp_path, stamp)
        except OSError:
            pass  # a read-only cache only costs the rehash next time
    return []


def _weights_stamp(bundle: Path) -> tuple[Path | None, str]:
    """(cache file, stamp): size and mtime_ns of bundle.json, the LICENSES/ and weights_manifest/ copies and
    every file under each weights `dest` the bundle names, so a finished `run --resume` does not rehash
    gigabytes of unchanged weights (the stat rule run/content.py uses). (None, "") when the bundle names no
    weights or its bundle.json is unreadable: then nothing is cached and the weights are always rehashed."""
    import hashlib
    import json

    from reproduction.data.fingerprint import cache_dir

    try:
        items = json.loads((bundle / "bundle.json").read_text(encoding="utf-8")).get("metadata", {}).get("weights")
        dests = sorted({str(item.get("dest", "weights")) for item in items or []})
    except (OSError, ValueError, AttributeError):
        return None, ""
    if not dests:
        return None, ""
    lines = []
    for top in ("bundle.json", "LICENSES", "weights_manifest", *dests):
        root = bundle / top
        for path in sorted([root] if root.is_file() else root.rglob("*")):
            if path.is_file():
                st = path.stat()
                lines.append(f"{path.relative_to(bundle).as_posix()}\0{st.st_size}\0{st.st_mtime_ns}")
    key = hashlib.sha256(str(bundle.resolve()).encode()).hexdigest()[:32]
    return cache_dir() / f"weights-{key}.txt", "\n".join(lines) + "\n"


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return None


def raise_problems(problems: list[str | PortableError]) -> None:
    """Raise nothing for no problems; the error itself for one (its own exit code); PreflightError
    (exit 56) listing all of them for several."""
    if not problems:
        return
    if len(problems) == 1 and isinstance(problems[0], PortableError):
        raise problems[0]
    codes = {p.exit_code for p in problems if isinstance(p, PortableError)}
    lines = [p.message if isinstance(p, PortableError) else str(p) for p in problems]
    if len(lines) == 1:
        raise PreflightError(f"preflight: {lines[0]}", problems=lines)
    raise PreflightError(
        f"preflight found {len(lines)} problems: " + " | ".join(lines),
        codes=sorted(codes),
        problems=lines,
        hint="fix them all, then run again (nothing was started or written)",
    )
