"""LIBERO evaluation steps/s against the raw LIBERO loop, same env, same init states, in one run (goal >= 0.9x).

The raw side is what a hand-written LIBERO script does on the built env: `reset()`, `set_init_state()`, the settle
no-ops, then `step()` + `check_success()` per step. The protocol side is `evaluate_libero` on the same env (lent
through its `make_sim` seam, so neither side pays the 5-30 s build) with a constant-action policy, chunk 5.
Rounds alternate the sides (bench/_timing.alternate). Needs the libero extra. Prints CPU ms/step too: on a shared
machine CPU time is the figure to trust (LIBERO_LAB.md). Also prints the process's peak RSS: what one evaluation
worker holds (an env built once, reset per init state).

    python bench/libero_eval.py [--task libero_10/0] [--cameras] [--image-size 128] [--episodes 2] [--steps 60]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from reproduction.sim.libero.env import NOOP, LiberoSim  # noqa: E402
from reproduction.sim.libero.protocol import evaluate_libero  # noqa: E402
from reproduction.sim.libero.tasks import resolve_tasks  # noqa: E402

ACTION = np.array([0.2, -0.1, 0.0, 0.0, 0.0, 0.0, -1.0])


class _Lent:
    def __init__(self, sim):
        self._sim = sim

    def __getattr__(self, name):
        return getattr(self._sim, name)

    def close(self):
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="libero_10/0")
    ap.add_argument("--cameras", action="store_true")
    ap.add_argument("--image-size", type=int, default=128)
    ap.add_argument("--episodes", type=int, default=2)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()

    (task,) = resolve_tasks([args.task])
    t0, c0 = time.perf_counter(), time.process_time()
    sim = LiberoSim(task, cameras=args.cameras, image_size=args.image_size)
    print(f"build: {time.perf_counter() - t0:.1f} s wall, {time.process_time() - c0:.1f} s CPU", flush=True)
    env = sim.env

    def raw() -> None:
        for i in range(args.episodes):
            env.reset()
            env.set_init_state(sim.init_states[i])
            for _ in range(sim.settle_steps):
                env.step(NOOP)
            for _ in range(args.steps):
                env.step(ACTION)
                env.check_success()

    def ours() -> None:
        evaluate_libero(
            [args.task],
            args.episodes,
            lambda b: np.tile(ACTION, (1, 5, 1)),
            cameras=args.cameras,
            image_size=args.image_size,
            max_steps=args.steps,
            make_sim=lambda t, **kw: _Lent(sim),
        )

    steps = args.episodes * (args.steps + sim.settle_steps)
    best = {"raw": (1e9, 1e9), "protocol": (1e9, 1e9)}
    sides = {"raw": raw, "protocol": ours}
    for r in range(args.rounds):
        for name in list(sides)[r % 2 :] + list(sides)[: r % 2]:
            w0, c0 = time.perf_counter(), time.process_time()
            sides[name]()
            w, c = time.perf_counter() - w0, time.process_time() - c0
            best[name] = (min(best[name][0], w), min(best[name][1], c))
    for name, (w, c) in best.items():
        print(f"{name:9s} {steps / w:7.1f} steps/s wall   {1000 * c / steps:6.1f} CPU ms/step   ({steps} steps)")
    (rw, rc), (pw, pc) = best["raw"], best["protocol"]
    cams = f"2x{args.image_size}" if args.cameras else "none"
    load = os.getloadavg()[0]
    print(f"protocol/raw: {rw / pw:.2f}x wall, {rc / pc:.2f}x CPU  [{args.task}, cameras={cams}, load1 {load:.1f}]")
    # One evaluation worker holds exactly this: one built env reused across init states, the protocol, a policy.
    rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    total_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    print(f"peak RSS {rss_gb:.2f} GiB (one worker); 2 workers ~{2 * rss_gb:.1f} of this machine's {total_gb:.0f} GiB")
    sim.close()
    print(f"ratio: {rw / pw:.2f} (goal >= 0.90: protocol steps/s over the raw LIBERO loop's, wall)")


if __name__ == "__main__":
    main()
