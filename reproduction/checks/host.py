"""Host probe: CPU cores, memory, /dev/shm (Ray's object store) and free disk where runs are written."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from reproduction.checks.context import CheckContext
from reproduction.checks.probe import ProbeResult, ok, warn

GIB = 1024**3
MIN_SHM = 2 * GIB
"""Below this Ray's object store spills to /tmp (Docker's default is 64 MiB)."""
MIN_AVAILABLE_MEMORY = 4 * GIB
"""Below this a CPU run of the demo pipeline (Ray + two workers) is likely to be OOM-killed."""


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def read_meminfo(path: Path) -> dict[str, int]:
    """/proc/meminfo as bytes by key (MemTotal, MemAvailable, ...)."""
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        key, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            out[key] = int(fields[0]) * (1024 if fields[1:2] == ["kB"] else 1)
    return out


def probe_host(ctx: CheckContext) -> list[ProbeResult]:
    """Rows host.cpu, host.memory, host.shm, host.disk; only warnings (a slow run is not a broken one)."""
    results = []
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    results.append(ok("host.cpu", f"{cores} usable cores (of {os.cpu_count()})", cores=cores, total=os.cpu_count()))
    try:
        mem = read_meminfo(ctx.meminfo_file)
        total, avail = mem.get("MemTotal", 0), mem.get("MemAvailable", mem.get("MemFree", 0))
        row = ok if avail >= MIN_AVAILABLE_MEMORY else warn
        args = () if row is ok else ("free memory (stop other jobs) or run fewer workers",)
        results.append(
            row("host.memory", f"{_gib(avail)} available of {_gib(total)}", *args, total=total, available=avail)
        )
    except OSError as exc:
        results.append(warn("host.memory", f"cannot read {ctx.meminfo_file}: {exc.strerror}", "check memory by hand"))
    try:
        st = os.statvfs(ctx.shm_dir)
        size, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
        if size < MIN_SHM:
            results.append(
                warn(
                    "host.shm",
                    f"{ctx.shm_dir} is {_gib(size)}: Ray's object store will fall back to /tmp (slow)",
                    "give the container more shared memory: docker run --shm-size=16g",
                    size=size,
                    free=free,
                )
            )
        else:
            results.append(ok("host.shm", f"{ctx.shm_dir} {_gib(free)} free of {_gib(size)}", size=size, free=free))
    except OSError as exc:
        results.append(warn("host.shm", f"{ctx.shm_dir} unusable: {exc.strerror}", "mount a tmpfs at /dev/shm"))
    usage = shutil.disk_usage(_existing(ctx.work_dir))
    results.append(
        ok(
            "host.disk",
            f"{_gib(usage.free)} free at {ctx.work_dir} (where runs/ is written)",
            free=usage.free,
            total=usage.total,
            path=str(ctx.work_dir),
        )
    )
    return results


def _existing(path: Path) -> Path:
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path
