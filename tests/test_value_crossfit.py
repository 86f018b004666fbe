"""Cross-fitting folds: deterministic, disjoint, stratified by dataset, and the labelling map."""

from __future__ import annotations

import json

import numpy as np
import pytest

from reproduction.errors import ConfigError, DatasetError
from reproduction.recap.value.crossfit import CrossFitPlan, split_folds

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


def test_a_dataset_no_model_trained_on_is_labelled_by_every_model_in_turn():
    """Upstream's flow: train on sft, label rollouts. folds=1: model 0; folds>1: a per-episode pick."""
    eps = np.arange(1, 401, 2)
    one = split_folds({"sft": EPISODES["sft"]}, folds=1)
    assert one.models_for("rollout", eps).tolist() == [0] * eps.size and one.model_for("rollout", 7) == 0
    plan = split_folds({"sft": EPISODES["sft"]}, folds=2, seed=3)
    assert not plan.covers("rollout") and plan.covers("sft")
    got = plan.models_for("rollout", eps)
    assert set(got.tolist()) == {0, 1} and 70 <= int((got == 0).sum()) <= 130  # spread over both models
    # a pure function of the episode: any subset, order or shard gives each episode the same model
    np.testing.assert_array_equal(plan.models_for("rollout", eps[::-1][:37]), got[::-1][:37])
    assert [plan.model_for("rollout", int(e)) for e in eps[:20]] == got[:20].tolist()
    assert split_folds({"sft": EPISODES["sft"]}, folds=2, seed=3).models_for("rollout", eps).tolist() == got.tolist()
    assert plan.models_for("other", eps).tolist() != got.tolist()  # the dataset name enters the pick
    three = split_folds({"sft": EPISODES["sft"]}, folds=3).models_for("rollout", eps)
    assert set(three.tolist()) == {0, 1, 2}
    with pytest.raises(DatasetError, match="episode 23 of dataset 'sft' is not in the fold plan"):
        plan.models_for("sft", np.array([0, 23]))  # a dataset that WAS split: a new episode is still an error
    with pytest.raises(DatasetError, match="episode 99 of dataset 'sft'"):
        plan.model_for("sft", 99)
