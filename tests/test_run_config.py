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
        (["advantages.lookahead=0"], "advantages.lookahead=0 must be >= 1", None),  # 0 is refused, never replaced by 10
        (["value.model.folds=0"], "value.model.folds=0 must be >= 1", None),
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


@pytest.mark.parametrize("section", ["value.train", "policy.train"])
@pytest.mark.parametrize(
    "override, words",
    [
        ("max_steps=0", "{s}.max_steps=0 must be >= 1"),
        ("global_batch=0", "{s}.global_batch=0 must be >= 1"),
        ("micro_batch=0", "{s}.micro_batch=0 must be >= 1"),
        ("world_size=0", "{s}.world_size=0 must be >= 1"),
        ("keep_last=0", "{s}.keep_last=0 must be >= 1"),
        ("log_interval=0", "{s}.log_interval=0 must be >= 1"),
        ("warmup_steps=-1", "{s}.warmup_steps=-1 must be >= 0"),
        ("eval_interval=-1", "{s}.eval_interval=-1 must be >= 0"),
        ("save_interval=-1", "{s}.save_interval=-1 must be >= 0"),
        ("canary_samples=-1", "{s}.canary_samples=-1 must be >= 0"),
        ("cpu_threads=-1", "{s}.cpu_threads=-1 must be >= 0"),
        ("lr=0", "{s}.lr=0.0 must be > 0"),
        ("cpus_per_worker=0", "{s}.cpus_per_worker=0.0 must be > 0"),
        ("start_timeout_s=0", "{s}.start_timeout_s=0.0 must be > 0"),
        ("collective_timeout_s=0", "{s}.collective_timeout_s=0.0 must be > 0"),
        ("grad_clip=-1", "{s}.grad_clip=-1.0 must be >= 0"),
        ("weight_decay=-1", "{s}.weight_decay=-1.0 must be >= 0"),
        ("canary_rtol=-1", "{s}.canary_rtol=-1.0 must be >= 0"),
        ("eps=-1", "{s}.eps=-1.0 must be >= 0"),
        ("betas=[0.9,1.5]", "{s}.betas=(0.9, 1.5) must be two numbers in [0, 1)"),
        ("device=tpu", "{s}.device='tpu' is not one of"),
        ("launcher=mpi", "{s}.launcher='mpi' is not one of"),
        ("mixed_precision=fp8", "{s}.mixed_precision='fp8' is not one of"),
        ("global_batch=5", "{s}.global_batch=5 is not divisible by {s}.micro_batch x {s}.world_size"),
        ("world_size=2 micro_batch=1", "{s}.launcher='inprocess' runs one worker, but {s}.world_size=2"),
    ],
)
def test_every_training_config_error_names_its_full_key(section, override, words):
    """TrainConfig's rules, reached through a run config, name `value.train.KEY` / `policy.train.KEY` (message
    and `field`), not the bare `KEY` that cannot tell the two training sections apart."""
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"{section}.{o}" for o in override.split()])
    key = section + "." + override.split("=")[0]
    if override.startswith("world_size=2"):
        key = section + ".launcher"  # the cross-field rule names the field it asks to change
    assert words.format(s=section) in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert err.value.field == key and err.value.exit_code == 4


def test_save_interval_not_a_multiple_names_both_full_keys():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["policy.train.eval_interval=3", "policy.train.save_interval=4"])
    assert str(err.value).startswith(
        "policy.train.save_interval=4 is not a multiple of policy.train.eval_interval=3"
    ) and err.value.field == ("policy.train.save_interval")


@pytest.mark.parametrize("key", ["value.train.max_steps", "policy.train.max_steps"])
def test_max_steps_0_on_the_command_line_names_its_section(tmp_path, capsys, key):
    from reproduction.portable import main

    assert main(["-q", "run", "--output", str(tmp_path / "run"), f"{key}=0"]) == 4
    assert capsys.readouterr().err.splitlines()[0] == f"error: {key}=0 must be >= 1"
    assert not (tmp_path / "run").exists()
