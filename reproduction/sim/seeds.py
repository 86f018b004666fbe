"""Per-episode seeds: every episode's reset seed and behaviour RNG follow from (seed, split, task, index) alone.

So an episode is the same whichever worker runs it and however many there are. Generation splits
(sft, rollout) get even reset seeds and evaluation gets odd ones: the held-out evaluation episodes
never start from a state a generated episode started from. A physics variant's episodes
(`FetchPush-v4:heavy`) get its base task's seeds: episode i starts from the same cube and goal in both.
"""

from __future__ import annotations

import numpy as np

from reproduction.sim.tasks import task_id

SPLITS = {"sft": 0, "rollout": 1, "eval": 2}
"""Split -> id in the seed derivation; only "eval" draws odd reset seeds."""


def _words(seed: int, split: str, task: str, index: int) -> list[int]:
    return [int(seed) & 0xFFFFFFFF, SPLITS[split], task_id(task), int(index)]


def reset_seed(seed: int, split: str, task: str, index: int) -> int:
    """The env reset seed of episode `index` of `task` in `split` (< 2**31; odd exactly for "eval")."""
    word = int(np.random.SeedSequence(_words(seed, split, task, index)).generate_state(1, np.uint32)[0])
    return ((word >> 2) << 1) | (1 if split == "eval" else 0)


def episode_rng(seed: int, split: str, task: str, index: int) -> np.random.Generator:
    """The behaviour RNG (plan and noise) of one episode."""
    return np.random.default_rng(np.random.SeedSequence([*_words(seed, split, task, index), 1]))
