"""What every probe reads: the target interpreter and its facts, the environment, and the host paths.

Probes read the host only through a `CheckContext`, so tests point it at fixture files (a fake
/proc/mounts, a fake Ascend root, an empty /dev) and at a fake `RunCommand`; the live check builds it
from the real machine with `CheckContext.live(...)`.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reproduction.checks.probe import RunCommand, python_script_argv, run_command

DEVICES = ("auto", "cuda", "npu", "cpu")

# Runs inside the target interpreter (Python 3.10-3.13, stdlib only). find_spec on a top-level name
# does not import the package, so a broken torch_npu or TensorFlow cannot crash this probe.
FACTS_SCRIPT = r"""# portable-probe: facts
import importlib.util, json, sys, sysconfig
try:
    import importlib.metadata as md
except ImportError:
    md = None
def origin(name):
    try:
        spec = importlib.util.find_spec(name)
    except Exception:
        return None
    if spec is None:
        return None
    return spec.origin or next(iter(spec.submodule_search_locations or []), None)
def version(dist):
    try:
        return md.version(dist)
    except Exception:
        return None
paths = sysconfig.get_paths()
cv = sysconfig.get_config_var
print(json.dumps({
    "executable": sys.executable, "version": "%d.%d.%d" % sys.version_info[:3], "prefix": sys.prefix,
    "paths": {k: paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib", "include", "platinclude")},
    "cc": cv("CC"), "ext_suffix": cv("EXT_SUFFIX"), "libdir": cv("LIBDIR"),
    "modules": {m: origin(m) for m in ("torch", "torch_npu", "tensorflow", "numpy", "triton")},
    "dists": {
        d: version(d) for d in ("torch", "torch-npu", "torch_npu", "tensorflow", "tensorflow-cpu", "numpy", "triton")
    },
}))
"""


def version_tuple(text: str | None) -> tuple[int, ...]:
    """Leading numeric release of a version string: '2.5.1+cu124' -> (2, 5, 1); '' or None -> ()."""
    match = re.match(r"\d+(?:\.\d+)*", (text or "").strip())
    return tuple(int(p) for p in match.group(0).split(".")) if match else ()


@dataclass(kw_only=True, slots=True)
class CheckContext:
    """Inputs of one `portable check`; the host paths default to the real ones."""

    python: Path
    """The target interpreter: the bundle's restored runtime, else the current one."""
    env: dict[str, str]
    """Environment the run will see (subprocesses get exactly this)."""
    run: RunCommand = run_command
    """The command seam (tests inject real-format outputs here)."""
    bundle: Path | None = None
    """The bundle being checked, if any."""
    device: str = "auto"
    """Requested device: auto, cuda, npu or cpu."""
    jit_smoke: bool = False
    """Also compile and run a kernel."""
    home: Path = field(default_factory=Path.home)
    """The user's home (for ~/.triton and ~/.cache)."""
    mounts_file: Path = Path("/proc/mounts")
    """Mount table to read filesystem types from."""
    dev_dir: Path = Path("/dev")
    """Where device nodes (nvidiactl, davinci_manager) are looked for."""
    ascend_roots: tuple[Path, ...] = (Path("/usr/local/Ascend"),)
    """Default CANN install roots, searched after ASCEND_TOOLKIT_HOME/ASCEND_HOME_PATH."""
    meminfo_file: Path = Path("/proc/meminfo")
    """Memory totals."""
    cpuinfo_file: Path = Path("/proc/cpuinfo")
    """CPU flags (which vector instruction sets the CPU kernels could use)."""
    shm_dir: Path = Path("/dev/shm")
    """Shared memory (Ray's object store)."""
    work_dir: Path = field(default_factory=Path.cwd)
    """Where runs/ will be written (free disk is measured here and at the bundle)."""
    facts: dict[str, Any] = field(default_factory=dict)
    """The target interpreter's facts (FACTS_SCRIPT output); filled by `load_facts`."""
    facts_error: str = ""
    """Why the facts could not be read (the interpreter does not start), else ''."""

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"device {self.device!r} is not one of {', '.join(DEVICES)}")

    @classmethod
    def live(cls, *, python: Path | None = None, **kwargs: Any) -> CheckContext:
        return cls(python=Path(python or sys.executable), env=dict(os.environ), **kwargs)

    def module(self, name: str) -> str | None:
        """Where `name` would be imported from in the target interpreter, or None."""
        return (self.facts.get("modules") or {}).get(name)

    def dist_version(self, *names: str) -> str | None:
        """The first installed distribution version among `names` (importlib.metadata), or None."""
        dists = self.facts.get("dists") or {}
        return next((dists[n] for n in names if dists.get(n)), None)


def load_facts(ctx: CheckContext, timeout: float = 30.0) -> None:
    """Fill `ctx.facts` by running FACTS_SCRIPT with the target interpreter (sets `facts_error` on failure)."""
    result = ctx.run(python_script_argv(ctx.python, FACTS_SCRIPT), timeout=timeout, env=ctx.env)
    if result.returncode != 0:
        ctx.facts_error = f"{ctx.python} did not run (exit {result.returncode}): {result.tail(200)}"
        return
    try:
        ctx.facts = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        ctx.facts_error = f"{ctx.python} printed no facts: {result.stdout[-200:]!r}"


def select_device(ctx: CheckContext) -> tuple[str, str]:
    """(device, why): the requested one, or for 'auto' the first with device nodes: cuda, npu, cpu."""
    if ctx.device != "auto":
        return ctx.device, "requested with --device"
    if (ctx.dev_dir / "nvidiactl").exists() or any(ctx.dev_dir.glob("nvidia[0-9]*")):
        return "cuda", f"{ctx.dev_dir}/nvidia* present"
    if (ctx.dev_dir / "davinci_manager").exists() or any(ctx.dev_dir.glob("davinci[0-9]*")):
        return "npu", f"{ctx.dev_dir}/davinci* present"
    return "cpu", f"no {ctx.dev_dir}/nvidia* or {ctx.dev_dir}/davinci* device nodes"
