"""Ascend probe: `npu-smi info`, the CANN toolkit (version files, env), and torch_npu in a guarded subprocess.

torch_npu is imported only in a subprocess with TORCH_DEVICE_BACKEND_AUTOLOAD=0, and never through
the `torch_npu.contrib.transfer_to_npu` hazard (it patches torch globally).
Rows: `npu` (devices usable by torch_npu), `npu.cann` (toolkit found and on the library path),
`npu.skew` (torch_npu vs CANN and vs torch), `npu.processes` (NPUs already in use, same rule as CUDA).

CANN is looked for at $ASCEND_TOOLKIT_HOME, $ASCEND_HOME_PATH, then <root>/ascend-toolkit/latest,
<root>/cann and <root>/cann-* for each default root (/usr/local/Ascend). Its version comes from
`<home>/<arch>-linux/ascend_toolkit_install.info` (`version=8.0.RC2`), else `<home>/version.cfg`
(`toolkit_running_version=[7.6.0.1.220:8.0.0]`, the part after the colon).
"""

from __future__ import annotations

import json
import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reproduction.checks.accelerator_cuda import BUSY_MIB
from reproduction.checks.context import CheckContext, version_tuple
from reproduction.checks.probe import ACCELERATOR, SKEW, ProbeResult, fail, ok, python_script_argv, skip, warn

# Oldest CANN each torch_npu release line supports, from the version table of Ascend/pytorch's README
# and docs/zh/release_notes/related_product_version_compatibility_notes.md. Older CANN gives undefined
# symbols at `import torch_npu`.
MIN_CANN = {
    (2, 1): "7.0.0",
    (2, 2): "8.0.RC1",
    (2, 3): "8.0.RC2",
    (2, 4): "8.0.RC3",
    (2, 5): "8.0.0",
    (2, 6): "8.1.RC1",
    (2, 7): "8.2.RC1",
    (2, 8): "8.3.RC1",
    (2, 9): "8.5.0",
}

TORCH_NPU_SCRIPT = r"""# portable-probe: torch-npu
import json, os
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
out = {}
try:
    import torch
    out["torch"] = torch.__version__
    import torch_npu  # explicit; never torch_npu.contrib.transfer_to_npu
    out["torch_npu"] = getattr(torch_npu, "__version__", None)
    out["available"] = bool(torch.npu.is_available())
    count = torch.npu.device_count() if out["available"] else 0
    out["devices"] = [{"index": i, "name": torch.npu.get_device_name(i)} for i in range(count)]
except BaseException as exc:
    out["error"] = "%s: %s" % (type(exc).__name__, exc)
print(json.dumps(out))
"""


@dataclass(kw_only=True, slots=True, frozen=True)
class CannInstall:
    """A CANN toolkit found on disk."""

    home: Path
    """The toolkit folder (what ASCEND_HOME_PATH should point at)."""
    version: str
    """CANN version, e.g. '8.0.RC2' ('' when no version file was readable)."""
    version_file: Path | None
    """The file the version came from."""
    set_env: Path | None
    """The set_env.sh that exports its environment, if found."""


def parse_key_values(text: str) -> dict[str, str]:
    """`key=value` lines (ascend_toolkit_install.info, version.cfg); '#' lines skipped."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and not key.startswith("#"):
            out[key.strip()] = value.strip()
    return out


def cann_version_from(path: Path) -> str:
    """The CANN version recorded in an ascend_toolkit_install.info or version.cfg file."""
    values = parse_key_values(path.read_text(encoding="utf-8", errors="replace"))
    if "version" in values:
        return values["version"]
    for key in ("toolkit_running_version", "runtime_running_version"):
        match = re.match(r"\[([^:\]]*):([^\]]*)\]", values.get(key, ""))
        if match:
            return match.group(2)
    return ""


def cann_key(version: str) -> tuple[int, int, int, int] | None:
    """Ordering key: 8.0.RC1 < 8.0.RC3 < 8.0.0 < 8.1.RC1 (an RC precedes the release of its minor)."""
    match = re.match(r"(\d+)\.(\d+)\.(?:rc(\d+)|(\d+))", version.strip(), re.IGNORECASE)
    if not match:
        return None
    return int(match[1]), int(match[2]), 0 if match[3] else 1, int(match[3] or match[4])


def _candidate_homes(ctx: CheckContext) -> list[Path]:
    homes = [Path(ctx.env[k]) for k in ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH") if ctx.env.get(k)]
    for root in ctx.ascend_roots:
        homes += [root / "ascend-toolkit" / "latest", root / "cann", *sorted(root.glob("cann-*"), reverse=True)]
    return homes


def find_cann(ctx: CheckContext) -> CannInstall | None:
    """The first CANN toolkit found (see the module docstring for the search order), or None."""
    arch = platform.machine()
    for home in _candidate_homes(ctx):
        files = [
            home / f"{arch}-linux" / "ascend_toolkit_install.info",
            *sorted(home.glob("*-linux/ascend_toolkit_install.info")),
            home / "version.cfg",
        ]
        found = next((f for f in files if f.is_file()), None)
        if found is None:
            continue
        try:
            version = cann_version_from(found)
        except OSError:
            version = ""
        set_env = next((p for p in (home / "set_env.sh", home.parent / "set_env.sh") if p.is_file()), None)
        return CannInstall(home=home, version=version, version_file=found, set_env=set_env)
    return None


_HEALTH = re.compile(r"^(OK|Warning|Alarm|Critical|Alarm\w*|Unknown|NA)$", re.IGNORECASE)
_BUS = re.compile(r"^([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d|NA)$")


def parse_npu_smi(text: str) -> dict[str, Any]:
    """`npu-smi info`: {'version', 'npus': [{npu, name, health, hbm_used_mb, hbm_total_mb}], 'processes': [...]}."""
    version_match = re.search(r"npu-smi\s+\S+\s+Version:\s*(\S+)", text)
    npus: list[dict[str, Any]] = []
    processes: list[dict[str, Any]] = []
    in_processes = False
    for line in text.splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if any(c.startswith("Process id") for c in cells):
            in_processes = True
            continue
        if in_processes:
            if len(cells) == 4 and cells[1].isdigit():
                mem = cells[3].split()[0] if cells[3] else ""
                processes.append(
                    {
                        "npu": int(cells[0].split()[0]),
                        "pid": int(cells[1]),
                        "process": cells[2],
                        "memory_mb": int(mem) if mem.isdigit() else None,
                    }
                )
            continue
        if len(cells) >= 3 and _HEALTH.match(cells[1]) and cells[0].split()[:1] and cells[0].split()[0].isdigit():
            npu_id, _, name = cells[0].partition(" ")
            npus.append(
                {
                    "npu": int(npu_id),
                    "name": name.strip(),
                    "health": cells[1],
                    "hbm_used_mb": None,
                    "hbm_total_mb": None,
                }
            )
        elif len(cells) >= 3 and _BUS.match(cells[1]) and npus:
            pairs = re.findall(r"(\d+)\s*/\s*(\d+)", cells[2])
            if pairs:
                npus[-1]["hbm_used_mb"], npus[-1]["hbm_total_mb"] = int(pairs[-1][0]), int(pairs[-1][1])
    return {"version": version_match.group(1) if version_match else None, "npus": npus, "processes": processes}


def _on_library_path(ctx: CheckContext, home: Path) -> bool:
    entries = [e for e in ctx.env.get("LD_LIBRARY_PATH", "").split(":") if e]
    roots = {str(home), os.path.realpath(home)}
    return any(os.path.realpath(e).startswith(tuple(roots)) or e.startswith(tuple(roots)) for e in entries)


def _torch_npu(ctx: CheckContext) -> dict[str, Any]:
    if not ctx.module("torch_npu"):
        return {"error": f"torch_npu is not installed in {ctx.python}"}
    env = dict(ctx.env, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    result = ctx.run(python_script_argv(ctx.python, TORCH_NPU_SCRIPT), timeout=180, env=env)
    try:
        return json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": f"the torch_npu probe died (exit {result.returncode}): {result.tail(300)}"}


def probe_ascend(ctx: CheckContext, selected: str) -> list[ProbeResult]:
    """Ascend rows; skipped (no torch_npu import) unless the NPU is selected."""
    if selected != "npu":
        return [skip("npu", f"not selected (device {selected})")]
    smi_result = ctx.run(["npu-smi", "info"], timeout=30, env=ctx.env)
    smi = (
        parse_npu_smi(smi_result.stdout)
        if smi_result.returncode == 0
        else {"version": None, "npus": [], "processes": []}
    )
    smi_note = (
        "npu-smi not found"
        if not smi_result.found
        else (
            f"npu-smi failed (exit {smi_result.returncode}): {smi_result.tail(150)}"
            if smi_result.returncode
            else f"npu-smi {smi['version']} sees {len(smi['npus'])} NPU(s)"
        )
    )
    cann = find_cann(ctx)
    info = _torch_npu(ctx)
    results = [_cann_row(ctx, cann), _device_row(info, smi_note, smi)]
    if info.get("torch_npu"):
        results.append(_skew_row(info, cann))
    if smi["npus"]:
        results.append(_processes_row(smi))
    return results


def _named_homes(ctx: CheckContext) -> list[str]:
    """What each set ASCEND_TOOLKIT_HOME / ASCEND_HOME_PATH points at when no CANN was found there: a variable set to
    a wrong path was reported as "unset", sending the user to look at the wrong thing (audit51 F3)."""
    named = []
    for key in ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH"):
        value = ctx.env.get(key)
        if value:
            path = Path(value)
            if path.is_dir():
                what = "holds no CANN version file"
            else:
                what = "is not a folder" if path.exists() else "does not exist"
            named.append(f"{key}={value} {what}")
    return named


def _cann_row(ctx: CheckContext, cann: CannInstall | None) -> ProbeResult:
    if cann is None:
        named = _named_homes(ctx)
        return fail(
            "npu.cann",
            ACCELERATOR,
            f"no CANN toolkit found ({'; '.join(named) or 'ASCEND_TOOLKIT_HOME/ASCEND_HOME_PATH unset'}; nothing "
            f"under {', '.join(map(str, ctx.ascend_roots))})",
            (
                "point the variable at the CANN toolkit (`source <toolkit>/set_env.sh` sets it) or unset it; "
                "install the CANN toolkit if there is none"
                if named
                else "install the CANN toolkit, then `source <toolkit>/set_env.sh`"
            ),
        )
    details = {
        "home": str(cann.home),
        "version": cann.version,
        "version_file": str(cann.version_file),
        "set_env": str(cann.set_env) if cann.set_env else None,
    }
    source = f"source {cann.set_env or cann.home / 'set_env.sh'}"
    if not (ctx.env.get("ASCEND_HOME_PATH") or ctx.env.get("ASCEND_TOOLKIT_HOME")) or not _on_library_path(
        ctx, cann.home
    ):
        return fail(
            "npu.cann",
            ACCELERATOR,
            f"CANN {cann.version} at {cann.home} is not set up in this shell "
            "(ASCEND_HOME_PATH unset or LD_LIBRARY_PATH lacks the toolkit): torch_npu fails with "
            "`ImportError: libhccl.so`",
            f"{source} before the run",
            **details,
        )
    return ok(
        "npu.cann",
        f"CANN {cann.version} at {cann.home} "
        f"(from {cann.version_file.name if cann.version_file else '?'}), on LD_LIBRARY_PATH",
        **details,
    )


def _device_row(info: dict, smi_note: str, smi: dict) -> ProbeResult:
    details = {"torch_npu": info, "npu_smi": smi}
    if info.get("error"):
        return fail(
            "npu",
            ACCELERATOR,
            f"{smi_note}; {info['error']}",
            "install torch_npu matching torch and CANN in the runtime, and source CANN's set_env.sh",
            **details,
        )
    if not info.get("available") or not info.get("devices"):
        return fail(
            "npu",
            ACCELERATOR,
            f"{smi_note}; torch_npu {info.get('torch_npu')} sees no NPU (torch.npu.is_available() is False)",
            "check the driver (npu-smi info), ASCEND_RT_VISIBLE_DEVICES and the container's /dev/davinci* mounts",
            **details,
        )
    names = sorted({d["name"] for d in info["devices"]})
    return ok(
        "npu",
        f"{len(info['devices'])} x {', '.join(names)}; {smi_note}; "
        f"torch {info.get('torch')}, torch_npu {info['torch_npu']}",
        **details,
    )


def _skew_row(info: dict, cann: CannInstall | None) -> ProbeResult:
    torch, npu = info.get("torch", ""), info["torch_npu"]
    details = {"torch": torch, "torch_npu": npu, "cann": cann.version if cann else None}
    if version_tuple(torch)[:3] != version_tuple(npu)[:3]:
        return fail(
            "npu.skew",
            SKEW,
            f"torch {torch} with torch_npu {npu}: torch_npu X.Y.Z needs torch X.Y.Z",
            f"install torch=={'.'.join(map(str, version_tuple(npu)[:3]))} (or the torch_npu matching torch {torch})",
            **details,
        )
    needed = MIN_CANN.get(version_tuple(npu)[:2])
    have = cann_key(cann.version) if cann and cann.version else None
    if needed is None or have is None:
        return warn(
            "npu.skew",
            f"torch_npu {npu} with CANN {cann.version if cann else '?'}: pair not in the known table",
            "check Ascend/pytorch's version table for this pair",
            **details,
        )
    if have < cann_key(needed):
        return fail(
            "npu.skew",
            SKEW,
            f"torch_npu {npu} needs CANN >= {needed}, found CANN {cann.version} (undefined symbols at import)",
            f"install CANN {needed} or newer, or a torch_npu release line built for CANN {cann.version}",
            **details,
        )
    return ok("npu.skew", f"torch {torch} / torch_npu {npu} / CANN {cann.version} (>= {needed})", **details)


def _processes_row(smi: dict) -> ProbeResult:
    procs = smi["processes"]
    details = {"processes": procs}
    if not procs:
        return ok("npu.processes", f"no other process on the {len(smi['npus'])} NPU(s)", **details)
    desc = "; ".join(f"NPU {p['npu']}: pid {p['pid']} {p['process']} {p['memory_mb']} MB" for p in procs)
    if any(p["memory_mb"] is None or p["memory_mb"] >= BUSY_MIB for p in procs):
        return fail(
            "npu.processes",
            ACCELERATOR,
            f"NPU(s) already in use: {desc}",
            "wait for those jobs or pick free NPUs with ASCEND_RT_VISIBLE_DEVICES",
            **details,
        )
    return warn(
        "npu.processes",
        f"small processes on NPU(s): {desc}",
        "fine unless they grow; check with npu-smi info",
        **details,
    )
