"""Several evaluations through one worker pool: each result equals its evaluation alone, and a policy
with `reset` is built once per worker, not once per batch; looks (a sequential evaluation) run the very
episodes of the evaluation without looks."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from reproduction.errors import ConfigError
from reproduction.sim.evaluate import EvalConfig, EvalJob, PolicyCache, evaluate, evaluate_many
from reproduction.sim.policies import ExpertPolicy, RandomPolicy

BUILT: list[str] = []


@dataclass(frozen=True)
class Counted:
    """A hashable factory that records every build (in this process)."""

    seed: int

    def __call__(self) -> RandomPolicy:
        BUILT.append(f"seeded {self.seed}")
        return RandomPolicy(seed=self.seed)


class NoReset:
    def __call__(self, batch):
        return np.zeros((len(batch["task"]), 2, 4), np.float32)


def test_evaluate_many_equals_each_evaluation_alone():
    cfg = EvalConfig(tasks=("FetchPush-v4",), episodes_per_task=4, batch_size=2, execute_steps=2, videos=0)
    jobs = [
        EvalJob(factory=ExpertPolicy, config=cfg),
        EvalJob(factory=functools.partial(RandomPolicy, seed=3), config=cfg),
    ]
    together = evaluate_many(jobs)
    for job, got in zip(jobs, together):
        alone = evaluate(job.factory, job.config).to_dict()
        mine = got.to_dict()
        assert mine["per_episode"] == alone["per_episode"] and mine["reset_seeds"] == alone["reset_seeds"]
    assert together[0].success_at_end_rate == 1.0 and together[1].success_at_end_rate < 1.0


class Unhashable:
    """A factory the cache cannot key: its policy is built fresh for every batch."""

    __hash__ = None

    def __call__(self) -> RandomPolicy:
        BUILT.append("fresh")
        return RandomPolicy(seed=5)


def test_a_policy_with_reset_is_built_once_per_worker_with_the_same_results_as_fresh_builds():
    BUILT.clear()
    cfg = EvalConfig(tasks=("FetchPush-v4",), episodes_per_task=6, batch_size=2, execute_steps=2, videos=0)
    reused = evaluate(Counted(5), cfg).to_dict()["per_episode"]
    assert BUILT == ["seeded 5"]  # three batches, one build: reset(seed=batch seed) restarts its RNG
    fresh = evaluate(Unhashable(), cfg).to_dict()["per_episode"]
    assert BUILT == ["seeded 5"] + ["fresh"] * 3 and fresh == reused
    cache = PolicyCache()
    assert cache.get(NoReset, 1) is not cache.get(NoReset, 2)  # no reset: rebuilt per batch


def test_looks_run_the_fixed_evaluations_own_episodes_in_its_order():
    """The first n episodes of a stopped evaluation are the first n of the fixed one (same seeds, same outcomes)."""
    cfg = EvalConfig(
        tasks=("FetchPush-v4", "FetchPickAndPlace-v4"), episodes_per_task=6, batch_size=2, videos=0, seed=5
    )
    noisy = functools.partial(ExpertPolicy, noise=0.5)  # batch-seeded noise: a cut batch would change outcomes
    (fixed,) = evaluate_many([EvalJob(factory=noisy, config=cfg)])
    seen = []
    (stopped,) = evaluate_many(
        [EvalJob(factory=noisy, config=cfg)], looks=[2, 4, 6], go_on=lambda look, r: seen.append(look) or look < 1
    )
    assert seen == [0, 1]
    for task, result in stopped.tasks.items():
        assert result.episodes == 4
        assert result.episode_metrics == fixed.tasks[task].episode_metrics[:4]
    # a look that would cut a batch is refused, never run
    with pytest.raises(ConfigError, match="whole batches"):
        evaluate_many([EvalJob(factory=noisy, config=cfg)], looks=[3, 6], go_on=lambda look, r: True)


@dataclass(frozen=True)
class ImageProbe:
    """A picklable factory of a policy that logs the image keys and shapes it gets (one JSON line per call to
    `log`) and whose actions depend on them, so wrong images show in both the log and the outcomes."""

    log: str

    def __call__(self) -> _Probe:
        return _Probe(self.log)


class _Probe:
    def __init__(self, log: str) -> None:
        self.log, self.expert = log, ExpertPolicy()

    def reset(self, seed: int | None = None) -> None:
        self.expert.reset(seed=seed)

    def __call__(self, batch):
        images = {k: list(np.shape(v)) for k, v in batch.items() if k.startswith("observation.images")}
        with open(self.log, "a") as f:
            f.write(json.dumps(images, sort_keys=True) + "\n")
        sizes = [shape[1] for shape in images.values()]
        return self.expert(batch) * (sizes[0] / 64 if sizes else 1.0)


def _probe_run(jobs: list[tuple[EvalConfig, Path]]) -> list[tuple[list[dict], dict]]:
    results = evaluate_many([EvalJob(factory=ImageProbe(str(log)), config=cfg) for cfg, log in jobs])
    return [
        ([json.loads(line) for line in log.read_text().splitlines()], r.to_dict()) for (_, log), r in zip(jobs, results)
    ]


@pytest.mark.slow
def test_evaluate_many_steps_each_job_in_envs_built_from_its_own_cameras_and_image_size(tmp_path):
    """audit46 eval F1: every job's sims used to be built from the first batch's config (cameras, image size)."""
    base = dict(tasks=("FetchPush-v4",), episodes_per_task=2, batch_size=2, execute_steps=1, videos=0, episode_steps=30)
    state_only = dict(base, cameras=())
    cam32 = dict(base, cameras=("agentview",), image_size=32)
    cam64 = dict(base, cameras=("agentview",), image_size=64)
    want = {  # what the policy gets per call (30 calls: one batch, execute_steps 1)
        "state_only": [{}] * 30,
        "cam32": [{"observation.images.agentview": [2, 32, 32, 3]}] * 30,
        "cam64": [{"observation.images.agentview": [2, 64, 64, 3]}] * 30,
    }
    kinds = {"state_only": state_only, "cam32": cam32, "cam64": cam64}
    alone = {}
    for name, kw in kinds.items():
        ((calls, result),) = _probe_run([(EvalConfig(**kw), tmp_path / f"alone_{name}.jsonl")])
        assert calls == want[name]
        alone[name] = result["per_episode"]
    assert alone["cam32"] != alone["cam64"]  # the images steer the outcomes
    for order, workers in ((("state_only", "cam32"), 1), (("cam32", "state_only"), 1), (("cam64", "cam32"), 1),
                           (("cam64", "cam32"), 2)):  # fmt: skip
        jobs = [
            (EvalConfig(**kinds[n], workers=workers), tmp_path / f"{'_'.join(order)}_{workers}_{n}.jsonl")
            for n in order
        ]
        for name, (calls, result) in zip(order, _probe_run(jobs)):
            assert calls == want[name], (order, workers, name)
            assert result["per_episode"] == alone[name], (order, workers, name)
