"""The envs a rollout steps: in this process, or sliced over simulator worker processes that live across rounds.

`LocalEnvs` wraps FetchSims of this process. `EnvWorkers` starts `workers` spawn processes (a fresh interpreter
each: no EGL context crosses a fork, as reproduction/sim/workers.py does) that each own a contiguous slice of the
n envs and serve reset / step / success over a pipe, so physics runs in parallel while the policy forward stays
one batched call over all n rows in the caller. Physics does not depend on which process steps an env, so a
rollout is the same bytes for any number of workers (tests/test_grpo_rollout.py pins it).

Both give: reset(seeds) -> observations; step(actions (n, j, A)) -> (observations after j steps, success at any
of them (n,)); success() -> (n,) bool now; close().
"""

from __future__ import annotations

import os
import weakref
from typing import Any


class LocalEnvs:
    """n FetchSims of this process behind the env-group interface."""

    def __init__(self, sims: list[Any]) -> None:
        self.sims = sims

    def __len__(self) -> int:
        return len(self.sims)

    def reset(self, seeds: list[int]) -> list[dict[str, Any]]:
        return [sim.reset(int(s)) for sim, s in zip(self.sims, seeds)]

    def step(self, actions: Any) -> tuple[list[dict[str, Any]], Any]:
        return _step(self.sims, actions)

    def success(self) -> Any:
        import numpy as np

        return np.array([sim.is_success() for sim in self.sims], bool)

    def close(self) -> None:
        """Nothing to do: whoever made the sims closes them."""


def _step(sims: list[Any], actions: Any) -> tuple[list[dict[str, Any]], Any]:
    import numpy as np

    once = np.zeros(len(sims), bool)
    obs: list[dict[str, Any]] = []
    for j in range(actions.shape[1]):
        obs = []
        for i, sim in enumerate(sims):
            o, ok = sim.step(actions[i, j])
            obs.append(o)
            once[i] |= ok
    return obs, once


def _serve(conn: Any, task: str, n: int) -> None:
    """A worker's loop: own n state-only FetchSims of `task`, answer commands until "close" or EOF."""
    from reproduction.sim.workers import WORKER_ENV

    os.environ.update(WORKER_ENV)  # before numpy / mujoco load
    from reproduction.sim.env import FetchSim

    sims = [FetchSim(task, cameras=()) for _ in range(n)]
    try:
        while True:
            try:
                cmd, arg = conn.recv()
            except EOFError:
                return
            if cmd == "reset":
                conn.send([sim.reset(int(s)) for sim, s in zip(sims, arg)])
            elif cmd == "step":
                conn.send(_step(sims, arg))
            elif cmd == "success":
                conn.send([sim.is_success() for sim in sims])
            else:
                return
    finally:
        for sim in sims:
            sim.close()


class EnvWorkers:
    """n envs of `task` sliced over `workers` spawn processes (module docstring); close() ends them."""

    def __init__(self, task: str, n: int, workers: int) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        k = max(1, min(workers, n))
        self.bounds = [round(i * n / k) for i in range(k + 1)]
        self.conns, self.procs = [], []
        for a, b in zip(self.bounds, self.bounds[1:]):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(child, task, b - a), daemon=True)
            proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)
        self.n = n
        self._finalizer = weakref.finalize(self, _shutdown, self.conns, self.procs)

    def __len__(self) -> int:
        return self.n

    def _ask(self, cmd: str, args: list[Any]) -> list[Any]:
        from reproduction.errors import WorkerFailedError

        for conn, arg in zip(self.conns, args):
            conn.send((cmd, arg))
        out = []
        for rank, conn in enumerate(self.conns):
            try:
                out.append(conn.recv())
            except (EOFError, OSError):
                raise WorkerFailedError(
                    f"simulator worker {rank} of the rollout died during {cmd!r}",
                    rank=rank,
                    hint="rerun with rl.rollout_workers=1 to see the failure in the trainer's process",
                ) from None
        return out

    def _slices(self, values: Any) -> list[Any]:
        return [values[a:b] for a, b in zip(self.bounds, self.bounds[1:])]

    def reset(self, seeds: list[int]) -> list[dict[str, Any]]:
        return [o for part in self._ask("reset", self._slices(list(seeds))) for o in part]

    def step(self, actions: Any) -> tuple[list[dict[str, Any]], Any]:
        import numpy as np

        parts = self._ask("step", self._slices(actions))
        return [o for obs, _ in parts for o in obs], np.concatenate([once for _, once in parts])

    def success(self) -> Any:
        import numpy as np

        return np.array([s for part in self._ask("success", [None] * len(self.conns)) for s in part], bool)

    def close(self) -> None:
        """End the workers (also done when the group is garbage-collected or the interpreter exits)."""
        self._finalizer()
        self.conns, self.procs = [], []


def _shutdown(conns: list[Any], procs: list[Any]) -> None:
    for conn in conns:
        try:
            conn.send(("close", None))
        except OSError:
            pass
        conn.close()
    for proc in procs:
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
