"""CUDA probe: nvidia-smi (GPUs, driver, processes already on each GPU), then torch in a subprocess.

nvidia-smi runs first and torch second, so the probe's own CUDA context never shows up as "another
process". Rows: `cuda` (devices usable by torch), `cuda.skew` (driver vs torch's CUDA runtime),
`cuda.processes` (GPUs already in use). A GPU counts as busy when another process holds at least
BUSY_MIB on it, or an amount nvidia-smi cannot report ('[N/A]', common across containers): fail,
the run would share the GPU or OOM; smaller holders (monitoring agents, Xorg) warn.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
from typing import Any

from reproduction.checks.context import CheckContext
from reproduction.checks.probe import ACCELERATOR, SKEW, ProbeResult, fail, ok, python_script_argv, skip, warn

QUERY_GPU = ("index", "uuid", "name", "memory.total", "memory.used", "driver_version", "compute_cap")
QUERY_APPS = ("gpu_uuid", "pid", "process_name", "used_memory")
BUSY_MIB = 1024

TORCH_CUDA_SCRIPT = r"""# portable-probe: torch-cuda
import json, os
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")  # a torch_npu without CANN must not break this probe
out = {}
try:
    import torch
    out["torch"] = torch.__version__
    out["cuda_runtime"] = torch.version.cuda
    out["available"] = bool(torch.cuda.is_available())
    try:
        v = torch._C._cuda_getDriverVersion()
        out["driver_cuda"] = "%d.%d" % (v // 1000, (v % 1000) // 10) if v else None
    except Exception:
        out["driver_cuda"] = None
    devices = []
    if out["available"]:
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            devices.append({"index": i, "name": p.name, "memory_mib": p.total_memory // 2**20,
                            "capability": "%d.%d" % (p.major, p.minor)})
    out["devices"] = devices
except Exception as exc:
    out["error"] = "%s: %s" % (type(exc).__name__, exc)
print(json.dumps(out))
"""


def _mib(value: str) -> int | None:
    value = value.strip()
    head = value.split()[0] if value else ""
    return int(head) if head.isdigit() else None  # '[N/A]', '[Not Supported]' -> None


def _csv_rows(text: str) -> list[dict[str, str]]:
    """nvidia-smi --format=csv: a header of names with units ('memory.total [MiB]'), then rows."""
    reader = csv.reader(io.StringIO(text.strip()), skipinitialspace=True)
    rows = [r for r in reader if r]
    if not rows:
        return []
    header = [h.strip().split(" [")[0] for h in rows[0]]
    return [dict(zip(header, (c.strip() for c in row))) for row in rows[1:] if len(row) == len(header)]


def parse_query_gpu(text: str) -> list[dict[str, Any]]:
    """Rows of `nvidia-smi --query-gpu=<QUERY_GPU> --format=csv` as typed dicts."""
    gpus = []
    for row in _csv_rows(text):
        gpus.append(
            {
                "index": int(row.get("index", len(gpus))),
                "uuid": row.get("uuid", ""),
                "name": row.get("name", ""),
                "memory_total_mib": _mib(row.get("memory.total", "")),
                "memory_used_mib": _mib(row.get("memory.used", "")),
                "driver": row.get("driver_version", ""),
                "capability": row.get("compute_cap", ""),
            }
        )
    return gpus


def parse_compute_apps(text: str) -> list[dict[str, Any]]:
    """Rows of `nvidia-smi --query-compute-apps=<QUERY_APPS> --format=csv` (header only when none run)."""
    apps = []
    for row in _csv_rows(text):
        pid = row.get("pid", "")
        if pid.isdigit():
            # The header of used_memory is 'used_gpu_memory [MiB]'.
            apps.append(
                {
                    "gpu_uuid": row.get("gpu_uuid", ""),
                    "pid": int(pid),
                    "process": row.get("process_name", ""),
                    "memory_mib": _mib(row.get("used_gpu_memory", row.get("used_memory", ""))),
                }
            )
    return apps


def visible(gpus: list[dict[str, Any]], env: dict[str, str]) -> list[dict[str, Any]]:
    """The GPUs CUDA_VISIBLE_DEVICES leaves (indices or UUID prefixes); all when unset."""
    spec = env.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return gpus
    keep = []
    for item in (s.strip() for s in spec.split(",") if s.strip()):
        keep += [
            g
            for g in gpus
            if (item.isdigit() and g["index"] == int(item)) or (item.startswith("GPU-") and g["uuid"].startswith(item))
        ]
    return keep


def driver_version(ctx: CheckContext, timeout: float = 5.0) -> str | None:
    """The NVIDIA driver version nvidia-smi reports for the first GPU (the `cuda` row's), or None without the tool,
    a GPU or an answer within `timeout`. Lineage records it (run/lineage.py runtime_versions)."""
    out = ctx.run(["nvidia-smi", f"--query-gpu={','.join(QUERY_GPU)}", "--format=csv"], timeout=timeout, env=ctx.env)
    gpus = parse_query_gpu(out.stdout) if out.returncode == 0 else []
    return (gpus[0]["driver"] or None) if gpus else None


def _nvidia_smi(ctx: CheckContext) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str]:
    """(gpus, compute apps, error) from nvidia-smi; error 'not found' when the tool is absent."""
    gpu_out = ctx.run(["nvidia-smi", f"--query-gpu={','.join(QUERY_GPU)}", "--format=csv"], timeout=30, env=ctx.env)
    if not gpu_out.found:
        return [], [], "not found"
    if gpu_out.returncode != 0:
        return [], [], f"nvidia-smi failed (exit {gpu_out.returncode}): {gpu_out.tail(200)}"
    apps_out = ctx.run(
        ["nvidia-smi", f"--query-compute-apps={','.join(QUERY_APPS)}", "--format=csv"], timeout=30, env=ctx.env
    )
    return parse_query_gpu(gpu_out.stdout), parse_compute_apps(apps_out.stdout) if apps_out.returncode == 0 else [], ""


def _torch_cuda(ctx: CheckContext) -> dict[str, Any]:
    if not ctx.module("torch"):
        return {"error": f"torch is not installed in {ctx.python}"}
    result = ctx.run(python_script_argv(ctx.python, TORCH_CUDA_SCRIPT), timeout=120, env=ctx.env)
    try:
        return json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": f"the torch probe died (exit {result.returncode}): {result.tail(300)}"}


def probe_cuda(ctx: CheckContext, selected: str) -> list[ProbeResult]:
    """CUDA rows; skipped without a torch import when CUDA is neither requested nor present."""
    if selected != "cuda":
        reason = (
            "nvidia-smi not on PATH"
            if not shutil.which("nvidia-smi", path=ctx.env.get("PATH"))
            else "nvidia-smi present"
        )
        torch = ctx.dist_version("torch")
        torch_note = f"torch {torch} not imported" if torch else "torch not installed"
        return [skip("cuda", f"not selected (device {selected}; {reason}; {torch_note})")]
    gpus, apps, smi_error = _nvidia_smi(ctx)
    info = _torch_cuda(ctx)
    details = {"nvidia_smi": gpus, "torch": info, "nvidia_smi_error": smi_error or None}
    results = [_device_row(gpus, info, smi_error, details)]
    if info.get("available") and info.get("cuda_runtime"):
        results.append(_skew_row(info, gpus))
    if gpus:
        results.append(_processes_row(visible(gpus, ctx.env), apps))
    return results


def _device_row(gpus: list, info: dict, smi_error: str, details: dict) -> ProbeResult:
    torch = info.get("torch")
    seen = f"nvidia-smi sees {len(gpus)} GPU(s)" if gpus else f"nvidia-smi {smi_error or 'lists no GPU'}"
    if info.get("error"):
        return fail(
            "cuda",
            ACCELERATOR,
            f"{seen}; {info['error']}",
            "install torch with CUDA in the runtime (restore the bundle), or use --device cpu",
            **details,
        )
    if not info.get("cuda_runtime"):
        if gpus:
            return fail(
                "cuda",
                SKEW,
                f"{seen} but torch {torch} is a CPU-only build",
                "install the torch CUDA build the bundle pins (restore the bundle's runtime)",
                **details,
            )
        return fail(
            "cuda",
            ACCELERATOR,
            f"no CUDA device: {seen}; torch {torch} is built without CUDA",
            "run on a GPU machine, or use --device cpu (or auto)",
            **details,
        )
    if not info.get("available") or not info.get("devices"):
        return fail(
            "cuda",
            ACCELERATOR,
            f"{seen} but torch {torch} (CUDA {info['cuda_runtime']}) cannot use any: "
            "torch.cuda.is_available() is False",
            "check the driver (nvidia-smi), CUDA_VISIBLE_DEVICES and the container's GPU access (--gpus all)",
            **details,
        )
    devs = info["devices"]
    names = sorted({d["name"] for d in devs})
    driver = gpus[0]["driver"] if gpus else "?"
    return ok(
        "cuda",
        f"{len(devs)} x {', '.join(names)} ({devs[0]['memory_mib'] / 1024:.0f} GiB, "
        f"sm_{devs[0]['capability'].replace('.', '')}); "
        f"driver {driver} (CUDA {info.get('driver_cuda') or '?'}); torch {torch} (CUDA {info['cuda_runtime']})",
        **details,
    )


def _skew_row(info: dict, gpus: list) -> ProbeResult:
    runtime, driver = info["cuda_runtime"], info.get("driver_cuda")
    details = {"cuda_runtime": runtime, "driver_cuda": driver, "driver": gpus[0]["driver"] if gpus else None}
    if not driver:
        return warn(
            "cuda.skew",
            f"driver CUDA version unknown; torch needs CUDA {runtime}",
            "check `nvidia-smi` (CUDA Version)",
            **details,
        )
    rt, dv = tuple(int(x) for x in runtime.split(".")[:2]), tuple(int(x) for x in driver.split(".")[:2])
    if rt[0] > dv[0]:
        return fail(
            "cuda.skew",
            SKEW,
            f"driver supports CUDA {driver} but torch was built for CUDA {runtime}",
            f"upgrade the NVIDIA driver to one supporting CUDA {runtime}, or use a torch build for CUDA {dv[0]}.x",
            **details,
        )
    if rt > dv:
        return warn(
            "cuda.skew",
            f"driver supports CUDA {driver}, torch uses CUDA {runtime} (minor-version compatibility: "
            "kernels JIT-compiled from newer PTX will fail)",
            f"upgrade the driver to CUDA {runtime} or newer",
            **details,
        )
    return ok("cuda.skew", f"driver CUDA {driver} >= torch CUDA {runtime}", **details)


def _processes_row(gpus: list[dict[str, Any]], apps: list[dict[str, Any]]) -> ProbeResult:
    by_gpu = {g["uuid"]: [a for a in apps if a["gpu_uuid"] == g["uuid"]] for g in gpus}
    held = {u: ps for u, ps in by_gpu.items() if ps}
    details = {"processes": [a for ps in held.values() for a in ps]}
    if not held:
        return ok("cuda.processes", f"no other process on the {len(gpus)} visible GPU(s)", **details)
    index = {g["uuid"]: g["index"] for g in gpus}
    desc = "; ".join(
        f"GPU {index[u]}: "
        + ", ".join(
            f"pid {a['pid']} {a['process']} {a['memory_mib'] if a['memory_mib'] is not None else '?'} MiB" for a in ps
        )
        for u, ps in sorted(held.items(), key=lambda kv: index[kv[0]])
    )
    busy = any((a["memory_mib"] or 0) >= BUSY_MIB or a["memory_mib"] is None for ps in held.values() for a in ps)
    if busy:
        return fail(
            "cuda.processes",
            ACCELERATOR,
            f"GPU(s) already in use: {desc}",
            "wait for those jobs or pick free GPUs with CUDA_VISIBLE_DEVICES",
            **details,
        )
    return warn(
        "cuda.processes",
        f"small processes on GPU(s): {desc}",
        "fine unless they grow; check with nvidia-smi",
        **details,
    )
