"""The generic config loader's refusals (audit52 W1, W2, W5, W8, non-finite floats) through the function the CLI
uses (`load_run_config`: recipe name, then the recipe's schema), and `portable eval --plan` with overrides (W9)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from reproduction import portable
from reproduction.errors import ConfigError
from reproduction.run.config import ALLOWS_NONFINITE, _refuse_nonfinite, to_yaml
from reproduction.run.resolve import load_run_config

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "bundle" / "demo" / "run.yaml"


def _load(overrides: list[str], files: list[Path] | None = None, tmp: Path | None = None):
    return load_run_config(files if files is not None else [DEMO], overrides, bundle=tmp or Path("/b"), run_dir=None)


def _refused(overrides: list[str], files: list[Path] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        _load(overrides, files)
    assert info.value.exit_code == 4
    return info.value


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "value.model.cameras={a: [1]}",
            "command line: config key `value.model.cameras.a`: Cannot convert 'list' to string: '[1]'",
        ),
        (
            "policy.model.cameras={b: {c: 1}}",
            "command line: config key `policy.model.cameras.b`: Cannot convert 'dict' to string: '{'c': 1}'",
        ),
        (
            "value.model.state_keys=[[1]]",
            "command line: config key `value.model.state_keys[0]`: Cannot convert 'list' to string: '[1]'",
        ),
    ],
)
def test_container_items_are_checked_against_the_annotation(override, message):
    """W1: a dict[str, str] / list[str] merged whole had its items unchecked; --print-config then crashed (exit 1)."""
    err = _refused([override])
    assert err.message == message
    assert err.hint == "see docs/config.md for its type"


@pytest.mark.parametrize(
    ("override", "message", "hint"),
    [
        (
            "datasets={a: 1}",
            "command line: config key `datasets` is a list, not a mapping: {a: 1}",
            "write the whole list as datasets=[{NAME: ...}, ...], or set one item as datasets[0].NAME=... "
            "(docs/config.md)",
        ),
        (
            "value.model.state_keys={a: 1}",
            "command line: config key `value.model.state_keys` is a list, not a mapping: {a: 1}",
            "write the whole list as value.model.state_keys=[a, b], or set one item as value.model.state_keys[0]=... "
            "(docs/config.md)",
        ),
        (
            "value.train.betas=[0.9]",
            "command line: config key `value.train.betas` takes 2 values, got 1: [0.9]",
            "write it as value.train.betas=[0.9, 0.95] with your values",
        ),
        (
            "datasets[2].path=/x",
            "command line: config key `datasets[2].path`: datasets has 2 items, so `2` is not an index of it",
            "set an item that is there (datasets[0]..datasets[1]), or give the whole list: datasets=[...]",
        ),
        (
            "datasets.-1.path=/x",
            "command line: config key `datasets.-1.path`: datasets has 2 items, so `-1` is not an index of it",
            "set an item that is there (datasets[0]..datasets[1]), or give the whole list: datasets=[...]",
        ),
        (
            "datasets[0].weight=abc",
            "command line: config key `datasets[0].weight`: Value 'abc' of type 'str' could not be converted to Float",
            "see docs/config.md for its type",
        ),
    ],
)
def test_shape_errors_name_the_key_with_a_hint(override, message, hint):
    """W2: a mapping for a list, a wrong-length tuple, a bad list index: the key, what it takes, and a hint."""
    err = _refused([override])
    assert (err.message, err.hint) == (message, hint)


@pytest.mark.parametrize("key", ["datasets[1].path", "datasets.1.path"])
def test_an_indexed_override_sets_one_list_item(key, tmp_path):
    """W2: the documented datasets[].path can be set from the command line, in both spellings, typed and in order."""
    _, _, config = _load([f"{key}=/x", "datasets[0].weight=2"], tmp=tmp_path)
    assert [d.path for d in config.datasets] == [str(tmp_path.resolve() / "data" / "sft"), "/x"]
    assert [d.weight for d in config.datasets] == [2.0, 1.0] and config.datasets[1].type == "rollout"
    _, _, later = _load([f"{key}=/x", "datasets=[{path: /y, type: sft}]"], tmp=tmp_path)
    assert [d.path for d in later.datasets] == ["/y"]  # a later whole list wins, as with any repeated key
    _, _, first = _load(["datasets=[{path: /y, type: sft}]", "datasets[0].path=/z"], tmp=tmp_path)
    assert [d.path for d in first.datasets] == ["/z"]
    assert "/x" in to_yaml(config)


def test_a_config_for_another_recipe_names_its_keys_and_the_recipe():
    """W5: recipe=grpo with RECAP's file was exit 1 'internal error' (the diagnosis resolved ${BUNDLE})."""
    err = _refused(["recipe=grpo"])
    assert err.message == (
        f"{DEMO}: unknown config keys `datasets`, `returns`, `value`, `advantages`, `policy` for recipe 'grpo'"
    )
    assert (
        err.hint
        == "a config written for another recipe: run it with that recipe (recipe: NAME in the file, or recipe=NAME)"
    )


def test_a_too_large_yaml_says_so_not_syntax(tmp_path):
    """W8: valid YAML past omegaconf's node limit is 'too large' with the limit, not 'not valid YAML'."""
    big = tmp_path / "big.yaml"
    big.write_text("".join(f"k{i}: {i}\n" for i in range(12000)))
    err = _refused([], [big])
    assert err.message == (
        f"{big}: too large for a run config: more than 10000 YAML nodes (keys and values, aliases counted as expanded)"
    )
    assert "OMEGACONF" not in err.hint and "syntax" not in err.hint


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("eval.guidance_scales=[1.0, nan]", "eval.guidance_scales"),
        ("value.train.lr=.inf", "value.train.lr"),
        ("policy.train.lr=1e400", "policy.train.lr"),
        ("datasets[0].weight=.inf", "datasets[].weight"),
        ("returns.failure_reward=nan", "returns.failure_reward"),
    ],
)
def test_non_finite_floats_are_refused_by_name(override, named):
    """nan/inf from the command line is exit 4 naming the key: the components' own range checks answer first where
    they have one (audit52 W4), the loader's finite rule for any float field they do not cover."""
    err = _refused([override])
    assert named in err.message
    assert "nan" in err.message or "inf" in err.message


@dataclasses.dataclass
class _Section:
    rate: float = 1.0
    scales: list[float] = dataclasses.field(default_factory=lambda: [1.0])
    free: float = dataclasses.field(default=0.0, metadata={ALLOWS_NONFINITE: True})


@dataclasses.dataclass
class _Schema:
    section: _Section = dataclasses.field(default_factory=_Section)


def test_the_loaders_finite_rule_names_key_and_source(tmp_path):
    """The loader's backstop for a float field no component checks: the first non-finite value is named with its
    source (the file, or `command line`); a field declaring ALLOWS_NONFINITE is left alone."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("section:\n  scales: [1.0, .nan]\n")
    with pytest.raises(ConfigError) as info:
        _refuse_nonfinite(_Schema(_Section(scales=[1.0, math.nan])), _Schema, [cfg], [])
    assert info.value.exit_code == 4
    assert info.value.message == f"{cfg}: config key `section.scales[1]` is nan: a run config takes finite numbers"
    assert info.value.hint == "set section.scales[1] to a finite number (docs/config.md)"
    with pytest.raises(ConfigError) as info:
        _refuse_nonfinite(_Schema(_Section(rate=math.inf)), _Schema, [], ["section.rate=inf"])
    assert info.value.message == "command line: config key `section.rate` is inf: a run config takes finite numbers"
    _refuse_nonfinite(_Schema(_Section(free=math.nan)), _Schema, [], [])


@pytest.mark.parametrize("override", ["value.train.max_steps=5", "eval.episodes_per_task=abc", "eval.seed", "=1"])
def test_eval_plan_refuses_overrides(override, capsys):
    """W9: --plan reads no config, so every override was silently ignored (exit 0); now exit 2 naming it."""
    assert portable.main(["eval", "--plan", "--rate", "0.5", override]) == 2
    err = capsys.readouterr().err
    assert f"error: --plan takes no key.path=value overrides: {override}\n" in err
    assert "hint: drop the overrides" in err
    assert portable.main(["eval", "--plan", "--rate", "0.5"]) == 0
