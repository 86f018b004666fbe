"""CPU kernels pinned to one instruction set, so a CPU run trains the same bits across x86-64 servers (measured:
an AVX2 server and an AVX-512 AMD EPYC agree; an AVX-512 Intel Xeon does not: tests/test_numerics.py).

torch picks its vectorised CPU kernels (layer norm, softmax, reductions, AdamW) by the CPU's widest
instruction set, and MKL picks its GEMM kernels by CPU vendor and instruction set. Each width sums in
another order, so the same recipe trains other weights on an AVX-512 server than on an AVX2 one, and a
100-episode evaluation of those weights differs by more than sampling: measured on the demo, at the same
code, seed and data, success at the last step of 100 episodes for bc / filtered bc / RECAP w=1 / w=2 was
52 / 77 / 74 / 88 with AVX2 kernels (an AVX2 server, and an AVX-512 AMD EPYC pinned to AVX2), 47 / 71 /
83 / 84 with the EPYC's native AVX-512 kernels, and 56 / 63 / 88 / 88 on another server's native kernels. Reference
evidence is only reproducible if every server computes alike, so pipeline commands pin both libraries to
AVX2 (every x86-64 server since 2013-2015 has it) before torch is imported:

    ATEN_CPU_CAPABILITY=avx2   torch's CPU dispatch (read once, at the first CPU kernel)
    MKL_CBWR=AVX2              MKL's conditional numerical reproducibility mode (Intel's AVX2 code path)

`PORTABLE_CPU_KERNELS=native` leaves both alone (the fastest kernels of this CPU, results tied to it);
a value the user already exported for either variable wins. Ray tasks get the driver's values with their task
(`reproduction.train.launcher`), so a remote node started without them computes the same bits.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from pathlib import Path

from reproduction.settings import CPU_KERNELS, choice

SETTING = CPU_KERNELS
"""The knob: "avx2" (the default) pins the kernels; "native" leaves them to the CPU."""
PINNED = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}
"""What "avx2" sets (each only where the user has not set it)."""
CHOICES = ("avx2", "native")
CPUINFO = Path("/proc/cpuinfo")
"""Where the CPU's flags are read (`cpu_kernels`; `portable check` reads the same file)."""


def pin_cpu_kernels(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set PINNED in `environ` (default os.environ) unless PORTABLE_CPU_KERNELS=native, leaving any variable
    the user set; returns what is now in force for those variables. Worker processes inherit it.

    Must run before torch is first imported in this process to affect it (it always affects the worker
    processes started afterwards). Raises ConfigError (exit 4) for an unknown PORTABLE_CPU_KERNELS value."""
    env = os.environ if environ is None else environ
    hint = f"unset {SETTING} (AVX2 kernels: the same bits across the servers measured), or {SETTING}=native"
    if choice(SETTING, CHOICES, hint, env) == "avx2":
        for name, value in PINNED.items():
            env.setdefault(name, value)
    return {name: env[name] for name in PINNED if name in env}


def cpu_kernels(cpuinfo: Path = CPUINFO) -> str:
    """One line for records (lineage, check): the kernels this process uses or will use and the CPU's widest vector
    unit, e.g. "ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2 cpu=AVX-512" or "native cpu=AVX2" (`cpu=` left out where
    `cpuinfo` names no x86 flags). A function of the settings and the machine only: torch's own report of its
    capability is not asked even when torch is loaded, so a stage's statement does not depend on what ran before it
    in the process (a `--resume` that redoes only compare never imports torch). The variables and the CPU's widest
    unit determine the capability torch dispatches to (the narrower of the two)."""
    from reproduction.checks.host import cpu_flags

    parts = [f"{name}={os.environ[name]}" for name in PINNED if name in os.environ] or ["native"]
    widest = widest_vector_unit(cpu_flags(cpuinfo))
    if widest is not None:
        parts.append(f"cpu={widest}")
    return " ".join(parts)


def widest_vector_unit(flags: set[str]) -> str | None:
    """The widest vector unit in /proc/cpuinfo's `flags`: AVX-512, AVX2 or "no AVX2"; None without flags (not x86)."""
    if not flags:
        return None
    return "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"


# -- the probe: does this machine compute the reference machines' bits? ----------------------------------------------

PROBE = """
import hashlib, json
import torch
torch.manual_seed(0)
x = torch.randn(256, 384)
w = torch.randn(384, 384, requires_grad=True)
y = torch.nn.functional.layer_norm(x @ w, (384,)).softmax(-1)
(y * torch.randn_like(y)).sum().backward()
digest = hashlib.sha256(y.detach().numpy().tobytes() + w.grad.numpy().tobytes()).hexdigest()[:16]
print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(), "digest": digest}))
"""
"""A forward and backward of the ops a policy step uses (matmul through MKL, layer norm, softmax and the reductions
through torch's vectorised kernels), digested. Run it in a fresh interpreter with `probe_environ(...)`."""
REFERENCE_DIGEST = "5ff1c271954ef4d2"
"""PROBE's digest under the pinned kernels on the machines that made the demo's reference evidence (an AVX2 server;
an AVX-512 AMD EPYC pinned to AVX2 reproduced that evidence bit for bit and gives the same digest; measured again
2026-12-03 on a 2-core AMD EPYC with AVX2)."""
KNOWN_OTHER = {
    "13912debe236239b": "an AVX-512 Intel Xeon ('Intel(R) Xeon(R) Processor') pinned to AVX2 (measured 2026-12-02; "
    "no MKL_CBWR branch tried gives the reference's): the demo trained other weights there and its comparison "
    "said `differs` (README, CPU kernels)",
}
"""Pinned digests measured on CPUs known NOT to give REFERENCE_DIGEST, with what was seen there."""


def probe_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment PROBE runs in: `environ` with the kernels a pipeline command would pin (pin_cpu_kernels:
    PORTABLE_CPU_KERNELS=native and the user's own values respected) and OMP_NUM_THREADS=1, as every digest above
    was measured. Raises ConfigError for a bad PORTABLE_CPU_KERNELS."""
    env = dict(environ)
    pin_cpu_kernels(env)
    env["OMP_NUM_THREADS"] = "1"
    return env


def parse_probe(stdout: str) -> dict[str, str]:
    """{"capability", "digest"} from PROBE's output; ValueError when it printed something else."""
    import json

    lines = stdout.strip().splitlines()
    try:
        out = json.loads(lines[-1]) if lines else None
    except ValueError:
        out = None
    if not isinstance(out, dict) or not isinstance(out.get("digest"), str):
        raise ValueError(f"the probe printed {stdout[-200:]!r}, not its digest")
    return {"capability": str(out.get("capability")), "digest": out["digest"]}
