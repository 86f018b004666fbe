"""Preflight: check everything a run needs before any worker starts, and report every problem at once.

Generic checks live here (placeholder paths, disk space, collecting); each recipe adds its own
(datasets, batch sizes) through its `preflight` function, which returns a list of problem lines.
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
