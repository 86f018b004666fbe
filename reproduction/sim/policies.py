"""Reference policies in the simulator's Policy protocol: the scripted expert (from observations) and random.

    Policy = Callable[[dict[str, np.ndarray]], np.ndarray]
    input:  observation.state (B, S), observation.goal (B, 3), optional observation.images.<cam> (B, H, W, 3),
            task (list[str] of length B)
    output: actions (B, H, 4) float32, a chunk per episode; the evaluator executes the first execute_steps.

A policy may expose `reset()` (or `reset(seed=...)`, called with each batch's seed so that a sampling
policy gives the same numbers for any number of workers). The classes here are their own picklable
zero-argument factories' products: pass `ExpertPolicy` or `functools.partial(RandomPolicy, seed=1)`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from reproduction.sim.experts import Scene, expert_action
from reproduction.sim.tasks import get_task

Policy = Callable[[dict], np.ndarray]
TABLE_Z = 0.42469975
"""The cube's resting height in both Fetch tasks (the env's `height_offset`)."""


class ExpertPolicy:
    """The scripted expert acting from the observation dict alone (state = STATE_NAMES layout)."""

    def __init__(self, noise: float = 0.0, seed: int = 0) -> None:
        self.noise = noise
        self._rng = np.random.default_rng(seed)

    def reset(self, seed: int | None = None) -> None:
        if seed is not None:
            self._rng = np.random.default_rng(seed)

    def __call__(self, batch: dict) -> np.ndarray:
        state = np.asarray(batch["observation.state"], dtype=np.float64)
        goal = np.asarray(batch["observation.goal"], dtype=np.float64)
        out = np.zeros((len(state), 1, 4), dtype=np.float32)
        for i, (s, g, task) in enumerate(zip(state, goal, batch["task"])):
            scene = Scene(grip=s[0:3], fingers=float(s[3] + s[4]), cube=s[5:8], goal=g, table_z=TABLE_Z)
            action, _ = expert_action(get_task(task).lifts, scene)
            if self.noise > 0:
                action[:3] += self._rng.normal(0, self.noise, size=3)
            out[i, 0] = np.clip(action, -1, 1)
        return out


class RandomPolicy:
    """Uniform random actions in [-1, 1]; a chunk of `horizon` per call."""

    def __init__(self, seed: int = 0, horizon: int = 4) -> None:
        self.horizon = horizon
        self._rng = np.random.default_rng(seed)

    def reset(self, seed: int | None = None) -> None:
        if seed is not None:
            self._rng = np.random.default_rng(seed)

    def __call__(self, batch: dict) -> np.ndarray:
        n = len(batch["observation.state"])
        return self._rng.uniform(-1, 1, size=(n, self.horizon, 4)).astype(np.float32)
