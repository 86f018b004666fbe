"""The envs a rollout steps: in this process, or sliced over simulator worker processes that live across rounds.

`LocalEnvs` wraps FetchSims of this process. `EnvWorkers` starts `workers` spawn processes (a fresh interpreter
each: no EGL context crosses a fork, as reproduction/sim/workers.py does) that each own a contiguous slice of the
n envs and serve reset / step / success over a pipe, so physics runs in parallel while the policy forward stays
one batched call over all n rows in the caller. Physics does not depend on which process steps an env, so a
rollout is the same bytes for any number of workers (tests/test_grpo_rollout.py pins it).

Both give: reset(keys) -> observations; step(actions (n, j, A)) -> (observations after j steps, success at any
of them (n,)); success() -> (n,) bool now; goal_distance() -> (n,) float metres from object to goal now (Fetch
only: the `progress` reward); close().

Two worlds, one interface: a Fetch task (`FetchPush-v4`) or a LIBERO task id (`libero_10/0`, as RECAP's eval.tasks
names it: reproduction/sim/libero). The helpers below are the only places the recipe asks which: `init_reset` (a
Fetch reset seed, or a LIBERO (init-state index, robosuite seed) pair: LIBERO ships 50 fixed init states per task,
so RL init state i starts from index i % 50), `task_language`, `episode_steps` (Fetch 50; LIBERO the suite's
limit, or a lower `max_steps`) and `make_sims` (FetchSims rendering the cameras the policy reads, none for a
camera-free policy; LiberoSims rendering both LIBERO cameras at the policy's size for a policy that reads either,
or, camera-free, observing LIBERO's privileged object state instead). `export_cameras` says which cameras, at which
size, a policy export reads.
"""

from __future__ import annotations

import os
import weakref
from typing import Any


def is_libero(task: str) -> bool:
    """True when `task` names LIBERO (a `<suite>/<task>` id; static: LIBERO need not be installed)."""
    from reproduction.sim.libero.tasks import is_libero_id

    return is_libero_id(task)


def _libero_task(task: str) -> Any:
    """The resolved LiberoTask of one task id (imports LIBERO; MissingDependencyError when it is not installed)."""
    from reproduction.errors import SimError
    from reproduction.sim.libero.tasks import resolve_tasks

    tasks = resolve_tasks(task)
    if len(tasks) != 1:
        raise SimError(f"{task!r} names {len(tasks)} LIBERO tasks; rl.tasks takes one task per entry", value=task)
    return tasks[0]


def task_language(task: str) -> str:
    """The language string a policy is prompted with (what the SFT data wrote as `task`)."""
    if is_libero(task):
        return _libero_task(task).language
    from reproduction.sim.tasks import get_task

    return get_task(task).language


def episode_steps(task: str, max_steps: int | None) -> int:
    """Policy steps per episode: Fetch's fixed 50; LIBERO's suite limit (libero_10: 520) or `max_steps` below it."""
    if not is_libero(task):
        from reproduction.sim.env import EPISODE_STEPS

        return EPISODE_STEPS
    from reproduction.sim.libero.tasks import SUITES, parse_task_id

    limit = SUITES[parse_task_id(task).suite].max_steps
    return min(limit, int(max_steps)) if max_steps else limit


def init_reset(seed: int, task: str, index: int) -> Any:
    """What env `reset` takes for RL init state `index`: a Fetch reset seed (the simulator's "rollout" split: even
    seeds, disjoint from the odd evaluation seeds), or for LIBERO (init-state index index % 50, a robosuite seed
    from (seed, index): the arm's reset noise)."""
    import numpy as np

    if is_libero(task):
        from reproduction.sim.libero.tasks import INIT_STATES_PER_TASK

        noise = int(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, 11, int(index)]).generate_state(1)[0] >> 1)
        return (int(index) % INIT_STATES_PER_TASK, noise)
    from reproduction.sim.seeds import reset_seed
    from reproduction.sim.tasks import get_task

    return reset_seed(seed, "rollout", get_task(task).env_id, index)


class LiberoRolloutSim:
    """A LiberoSim behind FetchSim's rollout methods: reset((init index, seed)), step, is_success. `cameras`: it
    renders both LIBERO cameras at `image_size` (observation.images.image, .wrist_image); otherwise it observes the
    privileged object state (cheaper: LIBERO_LAB.md measured 23-36 ms a step without cameras, 130-450 with)."""

    def __init__(self, task: str, cameras: bool = False, image_size: int = 64) -> None:
        from reproduction.sim.libero.env import LiberoSim

        self.sim = LiberoSim(_libero_task(task), cameras=cameras, image_size=int(image_size))

    def reset(self, key: Any) -> dict[str, Any]:
        index, seed = key
        return self.sim.reset(int(index), seed=int(seed))

    def step(self, action: Any) -> tuple[dict[str, Any], bool]:
        return self.sim.step(action)

    def is_success(self) -> bool:
        return self.sim.is_success()

    def close(self) -> None:
        self.sim.close()


def make_sims(task: str, n: int, cameras: tuple[str, ...] = (), image_size: int = 64) -> list[Any]:
    """n envs of `task` (the caller closes them): FetchSims rendering `cameras` at `image_size` into every
    observation (() = state only), or LiberoRolloutSims (rendering both LIBERO cameras when `cameras` names any:
    camera_names(..., libero=True))."""
    if is_libero(task):
        return [LiberoRolloutSim(task, cameras=bool(cameras), image_size=image_size) for _ in range(n)]
    from reproduction.sim.env import FetchSim

    return [FetchSim(task, cameras=tuple(cameras), image_size=int(image_size)) for _ in range(n)]


def export_cameras(export_dir: Any, *, libero: bool = False) -> tuple[tuple[str, ...], int]:
    """(the simulator cameras a policy export reads, in the simulator's order (`libero`: LIBERO's); the size to
    render them at: the model's input, tiny's image_size or pi05's 224); ((), 64) for a camera-free export.
    ConfigError when the export reads a camera the simulator does not render."""
    import json
    from pathlib import Path

    from reproduction.recap.policy.export import read_export
    from reproduction.recipes.grpo.config import camera_names

    meta = read_export(Path(export_dir))
    key = f"the policy export {export_dir} (policy.json cameras)"
    cameras = camera_names(meta.get("cameras") or {}, key=key, libero=libero)
    if not cameras:
        return (), 64
    model = json.loads((Path(export_dir) / "model_config.json").read_text(encoding="utf-8"))
    return cameras, int((model.get("vision") or {}).get("image_size", 224))


class LocalEnvs:
    """n sims of this process (FetchSims or LiberoRolloutSims) behind the env-group interface."""

    def __init__(self, sims: list[Any], *, owned: bool = False) -> None:
        self.sims = sims
        self.owned = owned
        """close() closes the sims (a group built by make_sims); else whoever made them does."""

    def __len__(self) -> int:
        return len(self.sims)

    def reset(self, keys: list[Any]) -> list[dict[str, Any]]:
        return [sim.reset(k) for sim, k in zip(self.sims, keys)]

    def step(self, actions: Any) -> tuple[list[dict[str, Any]], Any]:
        return _step(self.sims, actions)

    def success(self) -> Any:
        import numpy as np

        return np.array([sim.is_success() for sim in self.sims], bool)

    def goal_distance(self) -> Any:
        import numpy as np

        return np.array([sim.goal_distance() for sim in self.sims], np.float64)

    def close(self) -> None:
        """Close the sims when the group owns them (else whoever made them does)."""
        if self.owned:
            for sim in self.sims:
                sim.close()
            self.sims = []


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


def _serve(conn: Any, task: str, n: int, cameras: tuple[str, ...] = (), image_size: int = 64) -> None:
    """A worker's loop: own n envs of `task` (make_sims, rendering `cameras`), answer commands until "close", EOF or
    a pipe the driver no longer holds (a driver killed by SIGKILL or the OOM killer: the worker ends quietly, no
    traceback of ConnectionResetError or BrokenPipeError on the terminal, audit65 K)."""
    from reproduction.sim.workers import WORKER_ENV

    os.environ.update(WORKER_ENV)  # before numpy / mujoco load
    sims = make_sims(task, n, cameras, image_size)
    try:
        while True:
            try:
                cmd, arg = conn.recv()
            except (EOFError, OSError):  # closed, or reset by a driver that died
                return
            if cmd == "reset":
                answer = [sim.reset(k) for sim, k in zip(sims, arg)]
            elif cmd == "step":
                answer = _step(sims, arg)
            elif cmd == "success":
                answer = [sim.is_success() for sim in sims]
            elif cmd == "goal_distance":
                answer = [sim.goal_distance() for sim in sims]
            else:
                return
            try:
                conn.send(answer)
            except OSError:  # the driver is gone: nobody reads the answer
                return
    finally:
        for sim in sims:
            sim.close()


class EnvWorkers:
    """n envs of `task` (rendering `cameras` at `image_size`) sliced over `workers` spawn processes (module
    docstring); close() ends them."""

    def __init__(self, task: str, n: int, workers: int, *, cameras: tuple[str, ...] = (), image_size: int = 64) -> None:
        import multiprocessing

        from reproduction.sim.workers import _sigint_blocked

        ctx = multiprocessing.get_context("spawn")
        k = max(1, min(workers, n))
        self.bounds = [round(i * n / k) for i in range(k + 1)]
        self.conns, self.procs = [], []
        self.n = n
        self._asking = [True]
        """True while the workers start and from a command's sends to its last answer: a close then finds them busy
        (an interrupt, an error) and terminates them."""
        # Registered first: whatever stops the starts (an interrupt), the workers started so far are ended.
        self._finalizer = weakref.finalize(self, _shutdown, self.conns, self.procs, self._asking)
        # The workers start with SIGINT blocked and keep it so (as run_units' pool workers): Ctrl-C reaches the whole
        # process group, and a worker still importing or waiting for its next command printed a KeyboardInterrupt
        # traceback (or 'Fatal Python error: init_import_site') under the driver's one-line `error: interrupted`
        # (audit64 k2). The driver ends them itself (_shutdown); a SIGINT that came during the starts is raised here.
        with _sigint_blocked():
            for a, b in zip(self.bounds, self.bounds[1:]):
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=_serve, args=(child, task, b - a, tuple(cameras), image_size), daemon=True)
                proc.start()
                self.procs.append(proc)
                self.conns.append(parent)
                child.close()
        self._asking[0] = False

    def __len__(self) -> int:
        return self.n

    def _ask(self, cmd: str, args: list[Any]) -> list[Any]:
        """Each worker's answer to `cmd`; a worker found dead, whether by the send (the usual case: it died while
        the trainer was busy) or by the receive, is the one-line WorkerFailedError (exit 51)."""
        rank = 0
        self._asking[0] = True
        try:
            for rank, (conn, arg) in enumerate(zip(self.conns, args)):
                conn.send((cmd, arg))
            out = []
            for rank, conn in enumerate(self.conns):
                out.append(conn.recv())
        except (EOFError, OSError):  # BrokenPipeError, ConnectionResetError: the worker's end of the pipe is gone
            raise self._died(rank, cmd) from None
        self._asking[0] = False
        return out

    @staticmethod
    def _died(rank: int, cmd: str) -> Exception:
        from reproduction.errors import WorkerFailedError, killed_worker_hint

        return WorkerFailedError(
            f"simulator worker {rank} of the rollout died during {cmd!r}",
            rank=rank,
            hint=killed_worker_hint("rl.rollout_workers"),
        )

    def _slices(self, values: Any) -> list[Any]:
        return [values[a:b] for a, b in zip(self.bounds, self.bounds[1:])]

    def reset(self, keys: list[Any]) -> list[dict[str, Any]]:
        return [o for part in self._ask("reset", self._slices(list(keys))) for o in part]

    def step(self, actions: Any) -> tuple[list[dict[str, Any]], Any]:
        import numpy as np

        parts = self._ask("step", self._slices(actions))
        return [o for obs, _ in parts for o in obs], np.concatenate([once for _, once in parts])

    def success(self) -> Any:
        import numpy as np

        return np.array([s for part in self._ask("success", [None] * len(self.conns)) for s in part], bool)

    def goal_distance(self) -> Any:
        import numpy as np

        parts = self._ask("goal_distance", [None] * len(self.conns))
        return np.array([d for part in parts for d in part], np.float64)

    def close(self) -> None:
        """End the workers (also done when the group is garbage-collected or the interpreter exits)."""
        self._finalizer()
        self.conns, self.procs = [], []


def _shutdown(conns: list[Any], procs: list[Any], asking: list[bool] | None = None) -> None:
    """End the workers: each is told to close (its sims closed) and given 10 s. Workers stopped in the middle of a
    command (`asking`: an interrupt or an error came while the driver waited for their answers) are terminated at
    once instead: their answers are not wanted, and one may block for ever sending an answer no one reads (their
    SIGINT is blocked, so Ctrl-C does not end them)."""
    if asking and asking[0]:
        for proc in procs:
            proc.terminate()
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
