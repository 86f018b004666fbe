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
