"""Timing shared by the benches: best-of-N wall and CPU seconds (the least disturbed run)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

REPEAT = int(os.environ.get("BENCH_REPEAT", "5"))


def best(fn: Callable[[], object], repeat: int = REPEAT) -> tuple[float, float]:
    """(best wall seconds, best CPU seconds) over `repeat` runs of fn()."""
    wall, cpu = [], []
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    return min(wall), min(cpu)


def alternate(sides: dict[str, Callable[[], object]], rounds: int = REPEAT) -> dict[str, float]:
    """Best wall seconds of each side over `rounds` rounds, the sides run in turn within a round and
    the order rotated between rounds, so a burst of load from other processes hits all sides alike."""
    names = list(sides)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            t0 = time.perf_counter()
            sides[name]()
            times[name].append(time.perf_counter() - t0)
    return {n: min(v) for n, v in times.items()}


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a timed child process: this one's, one OpenMP thread, the repository on the
    path, and bytecode cached as an installed package's is. (This sandbox sets PYTHONDONTWRITEBYTECODE,
    which recompiles the project's modules at every start while numpy's and pyarrow's come compiled
    from their wheels: a cost only one side of a bench would pay, and no user does.)"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return {**env, "PYTHONPATH": repo, "OMP_NUM_THREADS": "1", **extra}


def run_process(args: list[str], env: dict[str, str] | None = None, timeout: float = 1800) -> None:
    """Run a child process to completion (its start included in whatever times this); raise on failure."""
    import subprocess

    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode:
        raise SystemExit(f"{' '.join(args[:3])} ... failed ({proc.returncode}):\n{proc.stderr[-3000:]}")


def machine_note() -> str:
    """Cores and load: the context every figure of a shared machine needs."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return f"{cores} cores, load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (1/5/15 min)"
