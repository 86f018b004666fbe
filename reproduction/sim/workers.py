"""Run independent work units in this process, in a spawn pool, or through an injected `run_tasks`.

The simulator may not import `train/` (ARCHITECTURE.md), so Ray placement comes in from the caller as
a `Runner`: any callable `(fn, payloads) -> results in payload order`, e.g.
`functools.partial(launcher.run_tasks, spec=..., ray_address=...)`. Without one, units run in this
process (workers=1) or in a `spawn` multiprocessing pool (a fresh interpreter per worker: no EGL
context crosses a fork), each worker with OMP_NUM_THREADS=1. This module imports nothing heavy at
the top so that a spawned worker sets its environment before numpy or mujoco load.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

Runner = Callable[[Callable[[Any], Any], Sequence[Any]], list[Any]]
"""(fn, payloads) -> [fn(p) for p in payloads], possibly elsewhere; fn is a module-level function."""

WORKER_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def _init_worker() -> None:
    for key, value in WORKER_ENV.items():
        os.environ[key] = value


def _groups(payloads: list[Any], workers: int) -> list[list[Any]]:
    """Contiguous, near-equal groups: one per worker (a Ray task each), order kept when flattened."""
    n = max(1, min(workers, len(payloads)))
    bounds = [round(i * len(payloads) / n) for i in range(n + 1)]
    return [payloads[a:b] for a, b in zip(bounds, bounds[1:])]


def run_group(group: dict[str, Any]) -> list[Any]:
    """A runner's task body: `fn` over a group of payloads, in one worker process."""
    _init_worker()
    return [group["fn"](payload) for payload in group["payloads"]]


def run_units(
    fn: Callable[[Any], Any], payloads: Sequence[Any], *, workers: int, runner: Runner | None = None
) -> Iterator[Any]:
    """Yield fn(payload) for each payload, in payload order, as soon as each is ready.

    With `runner`, the payloads are cut into `workers` contiguous groups, one runner task each (so a
    Ray launcher places exactly `workers` workers), and the results come back when all are done;
    otherwise workers=1 runs here and workers>1 in a spawn pool, streaming results in order.
    """
    if runner is not None:
        groups = _groups(list(payloads), workers)
        for results in runner(run_group, [{"fn": fn, "payloads": g} for g in groups]):
            yield from results
        return
    if workers <= 1 or len(payloads) <= 1:
        for payload in payloads:
            yield fn(payload)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    from reproduction.errors import WorkerFailedError

    ctx = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(max_workers=min(workers, len(payloads)), mp_context=ctx, initializer=_init_worker)
    try:
        futures = [pool.submit(fn, payload) for payload in payloads]
        for i, future in enumerate(futures):
            try:
                yield future.result()
            except BrokenProcessPool as exc:
                raise WorkerFailedError(
                    f"simulator worker died while running unit {i} ({exc})",
                    rank=i,
                    hint="rerun with workers=1 to see the failure in this process",
                ) from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
