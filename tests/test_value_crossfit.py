"""Cross-fitting folds: deterministic, disjoint, stratified by dataset, and the labelling map."""

from __future__ import annotations

import json

import numpy as np
import pytest

from reproduction.errors import ConfigError, DatasetError
from reproduction.recap.crossfit import CrossFitPlan, split_folds

EPISODES = {"sft": np.arange(0, 23), "rollout": np.array([40, 7, 99, 3, 12, 15, 61, 8, 9])}


def test_split_is_deterministic_and_independent_of_input_order():
    a = split_folds(EPISODES, folds=3, seed=5)
    b = split_folds({"rollout": EPISODES["rollout"][::-1], "sft": np.r_[EPISODES["sft"][::-1], 4, 4]}, folds=3, seed=5)
    assert a.to_dict() == b.to_dict()
    assert split_folds(EPISODES, folds=3, seed=6).to_dict() != a.to_dict()
    assert CrossFitPlan.from_dict(json.loads(json.dumps(a.to_dict()))).to_dict() == a.to_dict()


@pytest.mark.parametrize("folds", [2, 3, 5])
def test_folds_are_disjoint_cover_everything_and_are_stratified(folds):
    plan = split_folds(EPISODES, folds=folds, seed=0)
    for name, eps in EPISODES.items():
        held = [set(plan.heldout_episodes(k, name).tolist()) for k in range(folds)]
        assert set().union(*held) == set(eps.tolist())
        assert sum(len(h) for h in held) == len(eps)  # pairwise disjoint
        assert max(map(len, held)) - min(map(len, held)) <= 1  # even within each dataset
        for k in range(folds):
            train = set(plan.train_episodes(k, name).tolist())
            assert train.isdisjoint(held[k]) and train | held[k] == set(eps.tolist())
            assert all(plan.model_for(name, e) == k for e in held[k])  # labelled by the model that did not train on it
        np.testing.assert_array_equal(plan.models_for(name, eps), [plan.model_for(name, e) for e in eps])


def test_one_fold_is_off():
    plan = split_folds(EPISODES, folds=1)
    assert plan.train_episodes(0, "sft").tolist() == plan.heldout_episodes(0, "sft").tolist() == list(range(23))
    assert plan.models_for("rollout", EPISODES["rollout"]).tolist() == [0] * 9


def test_bad_fold_counts_and_unknown_episodes_are_refused():
    with pytest.raises(ConfigError, match="folds=0 must be >= 1"):
        split_folds(EPISODES, folds=0)
    with pytest.raises(ConfigError, match="dataset 'rollout' has 9 episodes, fewer than folds=10"):
        split_folds(EPISODES, folds=10)
    plan = split_folds(EPISODES, folds=2)
    with pytest.raises(DatasetError, match="episode 5 of dataset 'rollout' is not in the fold plan"):
        plan.models_for("rollout", np.array([40, 5]))
    with pytest.raises(ConfigError, match="model 2 is outside 0..1"):
        plan.train_episodes(2, "sft")
