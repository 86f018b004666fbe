"""The shared vocabulary of `portable check`: results, failure classes and exit codes, the command seam.

Every probe returns `ProbeResult`s. Probes never call `subprocess` themselves: they take a
`RunCommand` (the one seam where tests inject real-format tool outputs), so the live probe and the
tests run the same parsing code. Exit codes (lowest failing class wins, as in `portable verify`):

    20  accelerator: the requested device is absent or unusable, or already held by other processes
    21  driver/toolkit skew: CUDA driver older than torch's CUDA runtime; torch_npu vs CANN or torch
    22  compile toolchain: no Python.h, no C compiler, a C extension (or a Triton kernel) fails to build
    23  hazard: a known way for a run to crash or go wrong (TensorFlow + NumPy 2, transfer_to_npu, ...)
    24  bundle: not a bundle, not restored (or moved since), not enough free disk for the run
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
STATUSES = (OK, WARN, FAIL, SKIP)

ACCELERATOR, SKEW, TOOLCHAIN, HAZARD, BUNDLE = "accelerator", "skew", "toolchain", "hazard", "bundle"
EXIT_CODES: dict[str, int] = {ACCELERATOR: 20, SKEW: 21, TOOLCHAIN: 22, HAZARD: 23, BUNDLE: 24}
EXIT_HELP = """check exit codes (several failures: the lowest code wins):
  0  every probe ok, or only warnings
  20 accelerator: requested device absent/unusable, or GPUs/NPUs already held by other processes
  21 driver/toolkit skew: CUDA driver older than torch's CUDA; torch_npu vs CANN or vs torch
  22 compile toolchain: Python.h, C compiler, C extension build/import (or Triton kernel) failed
  23 hazard: TensorFlow next to NumPy 2, transfer_to_npu, torch-npu without CANN, config placeholders,
     save/val intervals, batch sizes not dividing across workers
  24 bundle: not a bundle, not restored or moved since restore, not enough free disk, a bad value export"""


@dataclass(kw_only=True, slots=True)
class ProbeResult:
    """One row of the check table."""

    name: str
    """Probe id, dotted by area: 'cuda', 'cuda.processes', 'toolchain', 'hazard.tensorflow', ..."""
    status: str
    """'ok', 'warn', 'fail' or 'skip' (did not apply here; `finding` says why)."""
    finding: str
    """What was found, with the values (one line)."""
    fix: str = ""
    """What to do about it (empty when nothing to do)."""
    failure: str | None = None
    """Failure class when status is 'fail' (a key of EXIT_CODES)."""
    seconds: float = 0.0
    """Wall time the probe took."""
    details: dict[str, Any] = field(default_factory=dict)
    """Machine-readable facts (versions, devices, paths) for the JSON report and run evidence."""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"ProbeResult.status {self.status!r} is not one of {STATUSES}")
        if (self.status == FAIL) != (self.failure is not None) or (self.failure and self.failure not in EXIT_CODES):
            raise ValueError(f"ProbeResult {self.name}: status {self.status!r} with failure {self.failure!r}")

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.failure] if self.failure else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "finding": self.finding,
            "fix": self.fix,
            "failure": self.failure,
            "exit_code": self.exit_code,
            "seconds": round(self.seconds, 3),
            "details": self.details,
        }


def ok(name: str, finding: str, /, **details: Any) -> ProbeResult:
    return ProbeResult(name=name, status=OK, finding=finding, details=details)


def warn(name: str, finding: str, fix: str, /, **details: Any) -> ProbeResult:
    return ProbeResult(name=name, status=WARN, finding=finding, fix=fix, details=details)


def fail(name: str, failure: str, finding: str, fix: str, /, **details: Any) -> ProbeResult:
    return ProbeResult(name=name, status=FAIL, finding=finding, fix=fix, failure=failure, details=details)


def skip(name: str, finding: str, /, **details: Any) -> ProbeResult:
    return ProbeResult(name=name, status=SKIP, finding=finding, details=details)


# -- the command seam -----------------------------------------------------------------------------


@dataclass(kw_only=True, slots=True, frozen=True)
class CommandResult:
    """What a command did: 127 means not found, 124 means killed at its timeout."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str = ""
    stderr: str = ""
    seconds: float = 0.0

    @property
    def found(self) -> bool:
        return self.returncode != 127

    @property
    def timed_out(self) -> bool:
        return self.returncode == 124

    def tail(self, n: int = 300) -> str:
        """The last `n` characters of stderr (else stdout), on one line, for a finding."""
        text = (self.stderr.strip() or self.stdout.strip()).replace("\n", " | ")
        return text[-n:]


class RunCommand(Protocol):
    """Run `argv` with a timeout (seconds); never raises for a missing program or a timeout."""

    def __call__(
        self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None, cwd: Path | None = None
    ) -> CommandResult: ...


def run_command(
    argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> CommandResult:
    """The live `RunCommand`: its own process group, killed whole at the timeout (rc 124)."""
    argv = tuple(str(a) for a in argv)
    start = time.perf_counter()
    try:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )
    except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
        return CommandResult(argv=argv, returncode=127, stderr=f"{argv[0]}: {exc.strerror or exc}")
    try:
        out, err = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        # A hung hccl/Triton child must not outlive the check: kill the whole group.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        code, err = 124, (err or "") + f"\n(killed after {timeout:.0f} s)"
    return CommandResult(
        argv=argv, returncode=code, stdout=out or "", stderr=err or "", seconds=time.perf_counter() - start
    )


def python_script_argv(python: Path | str, script: str) -> list[str]:
    """argv running `script` with `python` exactly as a run would start it (user site and PYTHONPATH kept)."""
    return [str(python), "-c", script]
