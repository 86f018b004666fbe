"""Size the demo: episodes/s of data generation (state only, two 64 px cameras) and of evaluation.

Generates DEMO_LAB's mix1 for one task (50 expert demos + 300 rollouts = 350 episodes of 50 steps)
with 1 worker, 2 spawn workers and 2 Ray workers (through the training launcher's `run_tasks`,
Ray start included), then with two 64 px cameras, then evaluates the scripted expert on 100
held-out episodes. One run each (minutes, not seconds); the machine is shared, so the figures are
noisy. The last line names the fastest generation path on this machine.

    python bench/sim_throughput.py [--episodes 350] [--camera-episodes 350] [--eval-episodes 100] [--skip-ray]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reproduction.sim.evaluate import EvalConfig, evaluate  # noqa: E402
from reproduction.sim.generate import GenConfig, generate_dataset  # noqa: E402
from reproduction.sim.policies import ExpertPolicy  # noqa: E402

TASK = ("FetchPickAndPlace-v4",)


def ray_runner():
    from reproduction.train.device import resolve
    from reproduction.train.launcher import run_tasks

    return functools.partial(run_tasks, spec=resolve("cpu"), ray_address=None, label="sim worker")


def gen(episodes: int, cameras: tuple[str, ...], workers: int, runner=None) -> float:
    """Seconds to write a mix1-shaped sft + rollout pair of `episodes` in all (1/7 expert demos)."""
    sft_n = max(1, episodes // 7)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        for kind, n in (("sft", sft_n), ("rollout", episodes - sft_n)):
            cfg = GenConfig(kind=kind, tasks=TASK, episodes_per_task=n, cameras=cameras, image_size=64)
            generate_dataset(cfg, Path(tmp) / kind, workers=workers, runner=runner)
        return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=350)
    ap.add_argument("--camera-episodes", type=int, default=350)
    ap.add_argument("--eval-episodes", type=int, default=100)
    ap.add_argument("--skip-ray", action="store_true")
    args = ap.parse_args()
    rows: dict[str, float] = {}
    for label, workers, runner in (
        ("state only, 1 worker", 1, None),
        ("state only, 2 spawn workers", 2, None),
        *(() if args.skip_ray else (("state only, 2 Ray workers", 2, ray_runner()),)),
    ):
        secs = gen(args.episodes, (), workers, runner)
        rows[label] = args.episodes / secs
        print(f"generate {args.episodes} episodes, {label}: {secs:7.1f} s  {rows[label]:6.2f} episodes/s", flush=True)
    if args.camera_episodes:
        secs = gen(args.camera_episodes, ("agentview", "wrist"), 2)
        print(
            f"generate {args.camera_episodes} episodes, two 64 px cameras, 2 spawn workers: {secs:7.1f} s  "
            f"{args.camera_episodes / secs:6.2f} episodes/s",
            flush=True,
        )
    for workers in (1, 2):
        cfg = EvalConfig(tasks=TASK, episodes_per_task=args.eval_episodes, videos=0, workers=workers, execute_steps=2)
        res = evaluate(ExpertPolicy, cfg)
        print(
            f"evaluate {args.eval_episodes} episodes (scripted expert, state only), {workers} worker(s): "
            f"{res.seconds:6.1f} s  {res.episodes / res.seconds:6.2f} episodes/s  "
            f"success {res.to_dict()['tasks'][TASK[0]]['success_at_end']}",
            flush=True,
        )
    fastest = max(rows, key=rows.get)
    print(f"fastest generation: {fastest} ({rows[fastest]:.2f} episodes/s)")


if __name__ == "__main__":
    main()
