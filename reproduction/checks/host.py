"""Host probe: CPU cores, kernels and their numerics, memory, /dev/shm (Ray's object store) and free disk where runs
are written."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from reproduction.checks.context import CheckContext
from reproduction.checks.probe import ProbeResult, ok, python_script_argv, skip, warn

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
    """Rows host.cpu, host.cpu_kernels, host.memory, host.shm, host.disk, host.cache, host.settings; only warnings
    (slow is not broken)."""
    results = []
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    results.append(ok("host.cpu", f"{cores} usable cores (of {os.cpu_count()})", cores=cores, total=os.cpu_count()))
    results.append(cpu_kernels_row(ctx.cpuinfo_file, os.environ))
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
    results.append(cache_row(ctx.env))
    results.append(settings_row(ctx.env))
    return results


def cache_row(environ: Mapping[str, str]) -> ProbeResult:
    """host.cache: the cache root every command writes (fingerprints/, numerics/, libero/) and whether a file can be
    created there. Commands go on without a cache they cannot write (recomputing each time), so this row is the one
    place that says so (audit53 V14). Nothing is created: a probe file is made and removed in the folder or, while
    it is missing, in its nearest existing parent."""
    from reproduction.errors import PortableError
    from reproduction.fsio import refuse_unwritable
    from reproduction.settings import CACHE_DIR, cache_root_or_default

    try:
        root = cache_root_or_default(environ)
        refuse_unwritable(root, f"the cache root {root}", hint="")
    except PortableError as exc:
        return warn(
            "host.cache",
            f"no cache can be written: {exc.message}",
            f"point {CACHE_DIR} at a writable absolute folder, or unset it for the default",
        )
    return ok("host.cache", f"cache at {root} (writable)", path=str(root))


def settings_row(environ: Mapping[str, str]) -> ProbeResult:
    """host.settings: warns, with the closest known name, about every PORTABLE_* variable set that nothing reads
    (a misspelled knob otherwise silently keeps its default: audit53 V18)."""
    from reproduction.settings import PREFIX, unknown_settings

    unknown = unknown_settings(environ)
    if not unknown:
        return ok("host.settings", f"every {PREFIX}* variable set is one the tool reads")
    said = ", ".join(f"{name} (did you mean {near}?)" if near else name for name, near in unknown)
    return warn(
        "host.settings",
        f"{PREFIX}* variables that nothing reads, so they change nothing: {said}",
        "fix the name or unset it (docs/settings.md lists every knob)",
        unknown=[name for name, _ in unknown],
    )


def cpu_flags(path: Path) -> set[str]:
    """The first CPU's flags in /proc/cpuinfo (empty when unreadable or not x86)."""
    try:
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "flags":
                return set(value.split())
    except OSError:
        pass
    return set()


def cpu_kernels_row(cpuinfo: Path, environ: Mapping[str, str]) -> ProbeResult:
    """host.cpu_kernels: which CPU kernels a pipeline command will use (reproduction.numerics) and whether
    they compute what AVX2 servers compute (the reference evidence's kernels); warns where they cannot."""
    from reproduction.numerics import PINNED, SETTING, widest_vector_unit

    flags = cpu_flags(cpuinfo)
    widest = widest_vector_unit(flags) or "unknown"
    pinned = " ".join(f"{k}={environ[k]}" for k in PINNED if k in environ)
    if flags and "avx2" not in flags:
        return warn(
            "host.cpu_kernels",
            "this CPU has no AVX2: CPU training here computes other bits than on AVX2 servers, so CPU results "
            "will not match reference evidence made there",
            "compare with `portable compare` expecting `differs`/`inconclusive`, or run on an AVX2 server",
            cpu=widest,
        )
    if environ.get(SETTING, "").strip().lower() == "native":
        row = warn if widest == "AVX-512" else ok
        args = (f"unset {SETTING} to pin AVX2 kernels",) if row is warn else ()
        return row("host.cpu_kernels", f"native kernels ({SETTING}=native; the CPU offers {widest})", *args, cpu=widest)
    return ok("host.cpu_kernels", f"pinned to AVX2 ({pinned or 'AVX2'}); the CPU offers {widest}", cpu=widest)


NUMERICS_TIMEOUT = 120.0
"""Seconds the numerics probe may take (a cold torch import on a slow disk takes tens of seconds)."""


def probe_cpu_numerics(ctx: CheckContext) -> list[ProbeResult]:
    """host.cpu_numerics: the target interpreter runs reproduction.numerics.PROBE with the kernels a pipeline command
    would pin and compares its digest with the machines' that made the demo's reference evidence. Measured, not
    inferred from CPU flags: an AVX-512 Intel Xeon pinned to AVX2 computes other bits than AVX2 and AMD servers do.
    Only warns: a machine with other bits still runs everything, its CPU-trained weights just differ."""
    from reproduction.errors import ConfigError
    from reproduction.numerics import KNOWN_OTHER, PINNED, PROBE, REFERENCE_DIGEST, parse_probe, probe_environ

    name = "host.cpu_numerics"
    if ctx.facts and not (ctx.facts.get("modules") or {}).get("torch"):
        return [skip(name, f"torch is not importable by {ctx.python}")]
    try:
        env = probe_environ(ctx.env)
    except ConfigError as exc:  # host.cpu_kernels and every pipeline command say the same
        return [warn(name, f"not probed: {exc.message}", exc.hint or "fix the setting")]
    cache = _numerics_cache(ctx, env)
    got = _read_cached(cache)
    cached = got is not None
    if got is None:
        result = ctx.run(
            python_script_argv(ctx.python, "# portable-probe: cpu-numerics" + PROBE), timeout=NUMERICS_TIMEOUT, env=env
        )
        try:
            if result.returncode != 0:
                raise ValueError(f"exit {result.returncode}: {result.tail(200)}")
            got = parse_probe(result.stdout)
        except ValueError as exc:
            fix = f"run `{ctx.python} -c 'import torch'` to see why"
            if ctx.facts and not (ctx.facts.get("modules") or {}).get("numpy"):
                # the probe reads its digest through numpy, which the base install lacks (audit60 N3)
                fix = f"install numpy into {ctx.python} (it comes with the `sim` extra: pip install -e '.[sim]')"
            return [warn(name, f"the numerics probe did not run ({exc})", fix)]
        _write_cached(cache, got)
    digest, kernels = got["digest"], " ".join(f"{k}={env[k]}" for k in PINNED if k in env)
    details = {"digest": digest, "reference": REFERENCE_DIGEST, "capability": got["capability"], "cached": cached}
    if digest == REFERENCE_DIGEST:
        return [
            ok(
                name,
                f"CPU kernels compute the reference machines' bits (probe {digest}, {kernels or 'native'})",
                **details,
            )
        ]
    seen = f"; seen before: {KNOWN_OTHER[digest]}" if digest in KNOWN_OTHER else ""
    return [
        warn(
            name,
            f"CPU kernels compute other bits than the machines that made the demo's reference evidence (probe "
            f"{digest}, theirs {REFERENCE_DIGEST}; {kernels or 'native kernels'}): CPU training here gives other "
            f"weights, so comparisons with CPU-trained reference evidence may say `differs`{seen}",
            "expect CPU-trained results to differ from such evidence, or reproduce it where this row is ok "
            "(README: CPU kernels); GPU runs are not affected",
            **details,
        )
    ]


def _numerics_cache(ctx: CheckContext, env: Mapping[str, str]) -> Path | None:
    """Where the probe's answer for this interpreter, torch install, kernel settings and CPU is kept, or None when the
    interpreter's facts are unknown (then it always runs). The probe costs a torch import (~2 s), `portable check`
    runs at every demo; any change of those inputs is another file."""
    import hashlib
    import json

    from reproduction.errors import PortableError
    from reproduction.numerics import PINNED, SETTING
    from reproduction.settings import cache_root_or_default

    torch = (ctx.facts.get("modules") or {}).get("torch")
    if not torch:
        return None
    try:
        torch_mtime = os.stat(torch).st_mtime_ns
        cpu = [
            line
            for line in ctx.cpuinfo_file.read_text(encoding="utf-8", errors="replace").splitlines()
            if line.split(":")[0].strip() in ("vendor_id", "model name", "flags", "microcode")
        ][:4]
    except OSError:
        return None
    key = {
        "python": os.path.realpath(ctx.python),
        "torch": [torch, torch_mtime, (ctx.facts.get("dists") or {}).get("torch")],
        "env": {k: env.get(k) for k in (*PINNED, SETTING, "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")},
        "cpu": cpu,
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    try:
        return cache_root_or_default(ctx.env) / "numerics" / f"{digest}.json"
    except PortableError:  # a relative PORTABLE_CACHE_DIR: refused at startup, and here no cache rather than ./
        return None


def _read_cached(path: Path | None) -> dict[str, str] | None:
    import json

    try:
        got = json.loads(path.read_text(encoding="utf-8")) if path is not None else None
    except (OSError, ValueError):
        return None
    return got if isinstance(got, dict) and isinstance(got.get("digest"), str) else None


def _write_cached(path: Path | None, got: dict[str, str]) -> None:
    import json

    from reproduction.fsio import atomic_write_text

    if path is not None:
        try:
            atomic_write_text(path, json.dumps(got) + "\n")
        except OSError:
            pass  # a read-only cache: the probe runs again next time


def _existing(path: Path) -> Path:
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path
