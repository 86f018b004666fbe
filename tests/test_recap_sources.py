"""The dataset entry the value and policy stages share (reproduction/recap/sources.py)."""

from __future__ import annotations

import pytest

from reproduction.errors import ConfigError
from reproduction.recap.policy.data import PolicySource
from reproduction.recap.value.config import ValueSource


def test_value_and_policy_entries_share_rules_and_keep_their_own_fields():
    value = ValueSource.from_dict({"path": "/d/sft", "returns": "/run/returns"})
    assert value.to_dict() == {
        "path": "/d/sft",
        "type": "sft",
        "weight": 1.0,
        "name": "sft",
        "tag": None,
        "returns": "/run/returns",
    }
    policy = PolicySource(path="/d/rollout", advantages="/run/advantages", tag="t")
    assert (policy.type, policy.name, policy.to_dict()["advantages"]) == ("rollout", "rollout", "/run/advantages")
    assert PolicySource.from_dict(policy.to_dict()) == policy
    with pytest.raises(ConfigError, match="policy dataset entry: unknown fields \\['returns'\\]"):
        PolicySource.from_dict({"path": "x", "returns": "r"})
    with pytest.raises(ConfigError, match="^dataset entry: unknown fields \\['advantages'\\]"):
        ValueSource.from_dict({"path": "x", "advantages": "a"})
    for cls in (ValueSource, PolicySource):
        with pytest.raises(ConfigError, match="type 'bad' is not sft or rollout"):
            cls(path="x", type="bad")
        with pytest.raises(ConfigError, match="weight 0 must be > 0"):
            cls(path="x", weight=0)
