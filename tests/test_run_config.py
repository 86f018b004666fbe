"""The run config: YAML + dotted overrides on the dataclass schema, placeholders, refusals, reference doc."""

from __future__ import annotations

from pathlib import Path

import pytest

from reproduction.errors import ConfigError, InputNotFoundError
from reproduction.run.config import load_config, reference, to_yaml

REPO = Path(__file__).resolve().parent.parent


def test_yaml_then_overrides_then_placeholders(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        "datasets:\n  - {path: '${BUNDLE}/data/sft', type: sft}\n"
        "value:\n  train: {max_steps: 20}\n  model: {tokenizer: '${RUN}/tok'}\n"
        "advantages: {lookahead: 5, tag: '${returns.tag}'}\nreturns: {tag: t1}\n"
    )
    c = load_config(
        [cfg],
        ["value.train.max_steps=7", "advantages.positive_quantile=0.4"],
        bundle=tmp_path / "b",
        run_dir=tmp_path / "r",
    )
    assert c.value.train.max_steps == 7 and c.advantages.lookahead == 5 and c.advantages.positive_quantile == 0.4
    assert c.datasets[0].path == str((tmp_path / "b").resolve() / "data" / "sft") and c.datasets[0].type == "sft"
    assert c.value.model.tokenizer == str((tmp_path / "r").resolve() / "tok")
    assert c.advantages.tag == "t1"  # ${...} interpolation between keys
    text = to_yaml(c)
    assert "max_steps: 7" in text and "${" not in text


@pytest.mark.parametrize(
    "overrides, words, hint",
    [
        (
            ["value.train.max_step=5"],
            "unknown config key `value.train.max_step`",
            "did you mean `value.train.max_steps`?",
        ),
        (["advantage.lookahead=3"], "unknown config key `advantage`", "did you mean `advantages`?"),
        (["value.train.max_steps=abc"], "config key `value.train.max_steps`: Value 'abc'", "docs/config.md"),
        (["advantages.lookahead=0"], "lookahead 0 must be >= 1", None),  # 0 is refused, never replaced by 10
        (["value.model.folds=0"], "value stage: folds=0 must be >= 1", None),
        (["value.train.global_batch=5"], "global_batch=5 is not divisible", "multiple of micro_batch"),
        (["datasets=[{type: sft}]"], "config key `datasets[0].path` has no value", None),
        (["novalue"], "is not key.path=value", None),
    ],
)
def test_bad_values_are_one_line_config_errors_naming_the_key(overrides, words, hint):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert words in str(err.value) and "\n" not in str(err.value) and err.value.exit_code == 4
    if hint:
        assert hint in err.value.hint


def test_bad_files(tmp_path):
    with pytest.raises(InputNotFoundError):
        load_config([tmp_path / "nope.yaml"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("value: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config([bad])
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="top level is not a mapping"):
        load_config([bad])
    bad.write_text("value:\n  modle: {}\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: unknown config key `value.modle`") as err:
        load_config([bad])
    assert err.value.hint == "did you mean `value.model`?"


def test_the_reference_doc_is_generated_and_up_to_date():
    text = reference()
    for key in ("`value.train.max_steps`", "`advantages.lookahead`", "`datasets[].path`", "`value.model.folds`"):
        assert key in text
    assert "| `value.model.folds` | int | `1` | Cross-fitting folds K (1 = off). |" in text
    assert (REPO / "docs" / "config.md").read_text() == text, (
        "regenerate: python -m reproduction.run.config > docs/config.md"
    )
