"""Cross-fitting: K value models on disjoint episode folds, each episode labelled by a model that never saw it.

A value model trained on the episodes it later labels memorises their outcome from the first frame
(a simulator prototype: held-out Spearman 0.32 without, 0.67 with 2 folds), and stage 3's
advantages turn into noise. With `folds = K` (K >= 2) model k trains on every episode outside fold
k and is evaluated on fold k; stage 3 labels fold k's episodes with model k. `folds = 1` is off:
one model trains on everything and labels everything (upstream's behaviour).

A dataset no model trained on (upstream's normal flow: train on sft data, label rollouts) is
held out for every model. With folds = 1 model 0 labels it; with K >= 2 each episode goes to the
model `unseen_models` picks: a hash of (seed, dataset name, episode id) mod K. It depends on the
episode alone, never on which other episodes a call sees, so every inference shard (and the
lookahead rows two shards share) labels an episode with the same model, and the episodes spread
evenly over the models in expectation. With K >= 2, an episode missing from a dataset that WAS
split is an error (the dataset changed after stage 2, so which model saw it is unknown); with
folds = 1 the one model labels every episode of every dataset.

The split is a pure function of (dataset name, sorted episode ids, K, seed): within each dataset
the episode ids are permuted by a generator seeded from (seed, crc32(name)) and dealt round-robin,
so every dataset is spread evenly over the folds (stratified) and the plan never depends on file
order, worker count or Python's hash seed.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from reproduction.errors import ConfigError, DatasetError


@dataclass(kw_only=True, slots=True)
class CrossFitPlan:
    """Which fold each (dataset, episode) is in; model k is trained without fold k."""

    folds: int
    """K; 1 means cross-fitting is off."""
    seed: int
    """Seed of the per-dataset permutations."""
    assignment: dict[str, dict[int, int]] = field(default_factory=dict)
    """dataset name -> episode id -> fold."""

    def train_episodes(self, model: int, dataset: str) -> np.ndarray:
        """Sorted episode ids model `model` trains on (all of them when folds == 1)."""
        self._check_model(model)
        eps = self.assignment[dataset]
        return np.array(sorted(e for e, f in eps.items() if self.folds == 1 or f != model), dtype=np.int64)

    def heldout_episodes(self, model: int, dataset: str) -> np.ndarray:
        """Sorted episode ids model `model` is evaluated on and labels (all when folds == 1)."""
        self._check_model(model)
        eps = self.assignment[dataset]
        return np.array(sorted(e for e, f in eps.items() if self.folds == 1 or f == model), dtype=np.int64)

    def covers(self, dataset: str) -> bool:
        """True when the models trained on (folds of) this dataset."""
        return dataset in self.assignment

    def model_for(self, dataset: str, episode: int) -> int:
        """The model that labels this episode: the one that did not train on it (0 when folds == 1);
        for a dataset outside the plan, `unseen_models`' pick. DatasetError for an episode missing
        from a dataset the plan split."""
        return int(self.models_for(dataset, np.array([episode], dtype=np.int64))[0])

    def models_for(self, dataset: str, episodes: np.ndarray) -> np.ndarray:
        """Vectorised `model_for` over an array of episode ids (DatasetError names the first unknown one)."""
        episodes = np.asarray(episodes, dtype=np.int64)
        if self.folds == 1:
            return np.zeros_like(episodes)
        if dataset not in self.assignment:
            return unseen_models(dataset, episodes, folds=self.folds, seed=self.seed)
        table = self.assignment[dataset]
        keys = np.array(sorted(table), dtype=np.int64)
        folds = np.array([table[int(k)] for k in keys], dtype=np.int64)
        pos = np.searchsorted(keys, episodes).clip(0, max(keys.size - 1, 0))
        known = keys[pos] == episodes if keys.size else np.zeros(episodes.shape, bool)
        if not known.all():
            episode = int(episodes[~known][0])
            raise DatasetError(
                f"cross-fitting: episode {episode} of dataset {dataset!r} is not in the fold plan",
                hint="the dataset changed after the value models were trained; retrain stage 2",
            )
        return folds[pos]

    def _check_model(self, model: int) -> None:
        if not 0 <= model < self.folds:
            raise ConfigError(f"cross-fitting: model {model} is outside 0..{self.folds - 1}", field="fold")

    def to_dict(self) -> dict[str, Any]:
        return {
            "folds": self.folds,
            "seed": self.seed,
            "assignment": {
                name: {str(e): f for e, f in sorted(eps.items())} for name, eps in sorted(self.assignment.items())
            },
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CrossFitPlan:
        return cls(
            folds=int(data["folds"]),
            seed=int(data["seed"]),
            assignment={n: {int(e): int(f) for e, f in eps.items()} for n, eps in data["assignment"].items()},
        )


def unseen_models(dataset: str, episodes: np.ndarray, *, folds: int, seed: int = 0) -> np.ndarray:
    """The labelling model of each episode of a dataset no model trained on: splitmix64 of
    (seed, crc32(dataset), episode id) mod `folds`. A pure function of each episode (see the
    module docstring for why not of the whole episode set)."""
    with np.errstate(over="ignore"):  # uint64 arithmetic wraps by design
        x = np.asarray(episodes, dtype=np.int64).astype(np.uint64)
        x = x ^ np.uint64(((seed & 0xFFFFFFFF) << 32) | zlib.crc32(dataset.encode("utf-8")))
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return (x % np.uint64(folds)).astype(np.int64)


def split_folds(episodes: Mapping[str, Any], *, folds: int = 1, seed: int = 0) -> CrossFitPlan:
    """Deal each dataset's episodes over `folds` folds (see the module docstring).

    `episodes` maps a dataset name to its episode ids (any order, duplicates ignored). Raises
    ConfigError if folds < 1 or a dataset has fewer episodes than folds (a fold would be empty).
    """
    if folds < 1:
        raise ConfigError(f"cross-fitting: folds={folds} must be >= 1 (1 = off)", field="folds")
    assignment: dict[str, dict[int, int]] = {}
    for name in sorted(episodes):
        ids = np.unique(np.asarray(episodes[name], dtype=np.int64))
        if folds > 1 and ids.size < folds:
            raise ConfigError(
                f"cross-fitting: dataset {name!r} has {ids.size} episodes, fewer than folds={folds}",
                field="folds",
                hint="lower folds or add episodes",
            )
        rng = np.random.default_rng([seed, zlib.crc32(name.encode("utf-8"))])
        perm = ids[rng.permutation(ids.size)]
        fold_of = np.arange(ids.size) % folds
        assignment[name] = {int(e): int(f) for e, f in zip(perm, fold_of)}
    return CrossFitPlan(folds=folds, seed=seed, assignment=assignment)
