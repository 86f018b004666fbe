"""A small LeRobot rollout dataset whose value is learnable from one image (value-model tests).

Each episode shows a red block moving toward a green goal marker on a noisy background. Successes
reach the goal on their last frame. Failures stall partway: mostly because a grey wall stands
between block and goal (visible from the first frame), sometimes with no visible cause. Start
positions, goals, lengths and stall points vary per episode, so value must be read from the scene
(wall or not, block-goal distance), not memorised per episode. Written with the data plane's writer;
returns come from stage 1 (`compute_returns`), so the targets are the real pipeline's.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from reproduction.recap.value.infer import infer_job as REAL_INFER_JOB  # bound before a test patches the module's name

CAMERA = "observation.images.front"
TASKS = ["push the red block to the green goal", "Move the red cube onto the green marker."]


def _frame(
    rng: np.random.Generator, block: np.ndarray, goal: np.ndarray, wall: tuple[int, int, int, int] | None
) -> np.ndarray:
    img = (rng.integers(20, 60, size=(64, 64, 3))).astype(np.uint8)
    gy, gx = np.round(goal).astype(int)
    img[max(gy - 5, 0) : gy + 5, max(gx - 5, 0) : gx + 5] = (30, 200, 40)
    if wall is not None:
        y0, y1, x0, x1 = wall
        img[y0:y1, x0:x1] = (170, 170, 170)
    by, bx = np.round(block).astype(int)
    img[max(by - 4, 0) : by + 4, max(bx - 4, 0) : bx + 4] = (220, 30, 30)
    return img


def _episode(rng: np.random.Generator, idx: int) -> tuple[np.ndarray, bool]:
    length = int(rng.integers(10, 25))
    goal = np.array([rng.uniform(8, 56), rng.uniform(44, 56)])
    start = np.array([rng.uniform(8, 56), rng.uniform(6, 16)])
    walled = rng.random() < 0.4
    success = (not walled) and rng.random() < 0.85
    stall = 1.0 if success else rng.uniform(0.25, 0.55)
    wall = None
    if walled:
        wx = int(start[1] + stall * (goal[1] - start[1])) + 4
        wall = (0, 64, min(wx, 56), min(wx + 8, 64))
    move_steps = max(1, int(round((length - 1) * (1.0 if success else rng.uniform(0.4, 0.8)))))
    frames = []
    for t in range(length):
        frac = min(1.0, t / move_steps) * stall
        frames.append(_frame(rng, start + frac * (goal - start), goal, wall))
    return np.stack(frames), success


def write_value_dataset(
    root: Path, *, episodes: int = 48, seed: int = 0, runs: Path | None = None, failure_reward: float = -30.0
) -> Path:
    """Write the dataset at `root` and its returns sidecar into `runs` (default root.parent/'returns').

    Returns the folder holding the sidecar (pass it as the source's `returns`). Episode ids are
    non-contiguous (2*i + 1) to keep the join by id honest.
    """
    from reproduction.data.writer import EpisodeData, write_dataset
    from reproduction.recap.returns import ReturnsConfig, compute_returns

    rng = np.random.default_rng(seed)
    eps = []
    for i in range(episodes):
        images, ok = _episode(rng, i)
        n = images.shape[0]
        eps.append(
            EpisodeData(
                episode_index=2 * i + 1,
                task=TASKS[i % len(TASKS)],
                frames={CAMERA: images, "is_success": np.full(n, ok, dtype=bool)},
            )
        )
    features = {CAMERA: {"dtype": "image", "shape": [64, 64, 3]}, "is_success": {"dtype": "bool", "shape": [1]}}
    write_dataset(root, eps, fps=10, features=features, tasks=TASKS, allow_id_gaps=True)
    runs = Path(runs) if runs is not None else Path(root).parent / "returns"
    compute_returns([Path(root)], runs, ReturnsConfig(failure_reward=failure_reward, dataset_type="rollout"))
    return runs


@dataclass(frozen=True)
class FaultyShardTask:
    """A stage-3 worker body for fault tests (`infer_dataset_ray(task=...)`): shard `rank` raises a
    RuntimeError (`action="raise"`) or SIGKILLs its own process (`action="die"`) before loading
    anything; every other shard runs the real `infer_job`. Picklable by reference (module level)."""

    action: str
    rank: int

    def __call__(self, job, cancelled=None, opened=None):
        if job.shard.rank == self.rank:
            if self.action == "die":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"injected failure in value inference shard {self.rank}")
        return REAL_INFER_JOB(job, cancelled=cancelled, opened=opened)
