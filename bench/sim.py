"""Bench the simulator: FetchSim steps/s with both cameras rendering against the raw MuJoCo loop.

The anchor is the least a headless camera env can do per step: set the mocap target and finger
control, `mj_step` 20 substeps, then `update_scene` + `render` for the same two free cameras at the
same size with the same fast settings (offsamples 0, shadowsize 0), on the same model. Ours is
`FetchSim.step` (clipping, gymnasium-robotics' action code, observation dict, both camera renders).
Also printed: the state-only step rate of both, for sizing, the core count and load, and the spread
of the per-round ratio. Runs alternate between ours and the anchor (the starting side rotating
between rounds) so both see the same load, and every figure is the best of N rounds (the machine is
shared); the last line is `ratio: X.XX (goal >= 0.80)`.

    python bench/sim.py [--size 64] [--steps 200] [--task FetchPickAndPlace-v4] [--repeat 7]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MUJOCO_GL", "egl")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mujoco  # noqa: E402
import numpy as np  # noqa: E402
from _timing import REPEAT, machine_note  # noqa: E402

from reproduction.sim.env import AGENTVIEW, CAMERAS, WRIST, FetchSim, _free_camera  # noqa: E402


def ours(sim: FetchSim, actions: np.ndarray) -> None:
    sim.reset(0)
    for a in actions:
        sim.step(a)


def raw_loop(model: mujoco.MjModel, actions: np.ndarray, renderer: mujoco.Renderer | None) -> None:
    data = mujoco.MjData(model)
    mujoco.mj_forward(model, data)
    grip = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, "robot0:grip")
    welded = model.eq_obj2id[0]  # the gripper body the mocap is welded to (what gymnasium-robotics moves)
    agent = _free_camera(**AGENTVIEW)
    wrist = _free_camera((0.0, 0.0, 0.0), WRIST["distance"], WRIST["azimuth"], WRIST["elevation"])
    for a in actions:
        data.mocap_pos[0] = data.xpos[welded] + a[:3] * 0.05
        data.ctrl[:] = data.qpos[model.jnt_qposadr[model.actuator_trnid[:, 0]]] + a[3]
        mujoco.mj_step(model, data, nstep=20)
        if renderer is not None:
            renderer.update_scene(data, camera=agent)
            renderer.render()
            wrist.lookat[:] = data.site_xpos[grip] + np.asarray(WRIST["offset"])
            renderer.update_scene(data, camera=wrist)
            renderer.render()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--task", default="FetchPickAndPlace-v4")
    ap.add_argument("--repeat", type=int, default=max(REPEAT, 7), help="alternating rounds (best of N)")
    args = ap.parse_args()
    actions = np.random.default_rng(0).uniform(-1, 1, size=(args.steps, 4))
    with FetchSim(args.task, cameras=CAMERAS, image_size=args.size) as cams, FetchSim(args.task, cameras=()) as plain:
        model = cams.model
        renderer = mujoco.Renderer(model, args.size, args.size)
        try:
            ours(cams, actions[:5]), raw_loop(model, actions[:5], renderer)  # warm up both GL paths
            runs = {
                "ours_cam": lambda: ours(cams, actions),
                "raw_cam": lambda: raw_loop(model, actions, renderer),
                "ours_state": lambda: ours(plain, actions),
                "raw_state": lambda: raw_loop(plain.model, actions, None),
            }
            times = rounds(runs, args.repeat)
        finally:
            renderer.close()
    n = args.steps
    ours_cam, raw_cam, ours_state, raw_state = (
        min(times[k]) for k in ("ours_cam", "raw_cam", "ours_state", "raw_state")
    )
    per_round = sorted(r / o for r, o in zip(times["raw_cam"], times["ours_cam"]))
    print(f"task {args.task}, {n} steps, two {args.size}px cameras, best of {args.repeat} alternating rounds")
    print(f"machine: {machine_note()} (shared: figures are noisy)")
    print(f"raw mujoco step + 2 renders: {n / raw_cam:8.1f} steps/s")
    print(f"FetchSim.step, 2 cameras:    {n / ours_cam:8.1f} steps/s")
    print(f"raw mujoco step, no render:  {n / raw_state:8.1f} steps/s")
    print(f"FetchSim.step, state only:   {n / ours_state:8.1f} steps/s  ({raw_state / ours_state:.2f} of raw)")
    print(
        f"per-round ratio (same round, 2 cameras): min {per_round[0]:.2f}, "
        f"median {per_round[len(per_round) // 2]:.2f}, max {per_round[-1]:.2f}"
    )
    print(f"ratio: {raw_cam / ours_cam:.2f} (goal >= 0.80)")


def rounds(runs: dict[str, Callable[[], object]], repeat: int) -> dict[str, list[float]]:
    """Wall seconds of every side in each of `repeat` rounds: the sides run in turn within a round
    (ours next to its anchor) and the starting side rotates between rounds, so a burst of load from
    other processes hits both sides alike; a figure is the best round, a ratio's spread is per round."""
    names = list(runs)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeat):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            t0 = time.perf_counter()
            runs[name]()
            times[name].append(time.perf_counter() - t0)
    return times


if __name__ == "__main__":
    main()
