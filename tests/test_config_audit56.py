"""Hostile and mistaken run configs (audit56 D2-D6, D8): refused at config load, exit 4, one line naming the field,
the file or override it came from, and a hint."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from reproduction import portable
from reproduction.errors import ConfigError
from reproduction.run.resolve import load_run_config

REPO = Path(__file__).resolve().parent.parent
GRPO = REPO / "bundle" / "grpo" / "config.yaml"
RECAP = REPO / "bundle" / "demo" / "run.yaml"


def _refused(overrides: list[str], files: list[Path] | None = None, *, run_dir: Path | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_run_config(files if files is not None else [GRPO], overrides, bundle=Path("/b"), run_dir=run_dir)
    assert info.value.exit_code == 4
    return info.value


@pytest.mark.parametrize("key", ["sft.train.start_timeout_s", "sft.train.collective_timeout_s"])
def test_a_huge_timeout_is_refused_at_load(key):
    """D2: 1e300 passed the config and crashed in Ray with OverflowError (exit 1) after a run folder was made."""
    err = _refused([f"{key}=1e300"])
    assert err.message == f"command line: {key}=1e+300 must be > 0 and <= 604800"
    assert err.hint == f"set {key} to a finite number in (0, 604800] (docs/config.md)"
    assert err.field == key
    # one week is allowed
    load_run_config([GRPO], [f"{key}=604800"], bundle=Path("/b"), run_dir=None)


def test_a_huge_recap_timeout_is_refused_too():
    err = _refused(["policy.train.start_timeout_s=1e300"], [RECAP])
    assert err.message == "command line: policy.train.start_timeout_s=1e+300 must be > 0 and <= 604800"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["rl.group_size=1000000000000000000000000000000"],
            "rl.group_size=1000000000000000000000000000000 must be a whole number within "
            "+-9223372036854775807 (int64) >= 2 and <= 4096",
        ),
        (["rl.group_size=4097"], "rl.group_size=4097 must be >= 2 and <= 4096"),
        (["rl.group_size=1"], "rl.group_size=1 must be >= 2 and <= 4096"),
        (
            ["rl.init_states=1024", "rl.micro_init_states=16", "rl.group_size=2048"],
            "rl.init_states x rl.group_size = 1024 x 2048 rollouts per round is over 1048576",
        ),
        (
            ["eval.max_steps=1000000000000000000000000000000", "eval.tasks=[libero_10/0]"],
            "eval.max_steps=1000000000000000000000000000000 must be a whole number within "
            "+-9223372036854775807 (int64) >= 1",
        ),
    ],
)
def test_loop_and_memory_sizes_are_bounded(overrides, message):
    """D3: rl.group_size=10**30 passed the config (only < 2 was checked) and sft ran before anything noticed."""
    err = _refused(overrides)
    assert err.message == f"command line: {message}"  # audit58 D6: an override's rule names its source
    assert err.hint


def test_an_override_error_names_the_configs_recipe():
    """D4: the command-line merge did not see the files, so it named the default recipe 'recap'."""
    err = _refused(["a="])
    assert err.message == "command line: unknown config key `a` for recipe 'grpo'"


@pytest.mark.parametrize("item", [" rl.steps=4", "rl.steps =4"])
def test_an_override_with_spaces_around_its_key_is_refused(item):
    err = _refused([item])
    assert err.message == f"override {item!r} has spaces around its key {item.partition('=')[0]!r}"
    assert err.hint == "write it without them: rl.steps=4"


def test_a_config_file_over_1_mb_is_refused_before_parsing(tmp_path):
    """D5: a 50 MB file kept YAML busy for minutes; now its size is checked first."""
    big = tmp_path / "big.yaml"
    big.write_text("recipe: grpo\n# " + "x" * 1_000_000 + "\n")
    err = _refused([], [GRPO, big])
    assert err.message == f"{big}: 1,000,016 bytes, over the 1,000,000-byte limit of a run config"
    assert err.path == big


def test_an_interrupted_print_config_does_not_say_resume(capsys):
    """D5: --print-config starts no run, so `rerun it with --resume` was the wrong advice."""
    args = argparse.Namespace(command="run", print_config=True)
    assert portable._interrupted(args, as_program=False) == 130
    err = capsys.readouterr().err
    assert err == "error: interrupted\nhint: run the same command again: --print-config writes nothing\n"
    portable._interrupted(argparse.Namespace(command="run", print_config=False), as_program=False)
    assert "--resume" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("override", "hint"),
    [
        ("rl.clip_eps=0", "set rl.clip_eps to a number in (0, 1), e.g. 0.2 (PPO's usual)"),
        ("rl.reward=''", "set rl.reward to one of: success_at_end, success_once, progress"),
        ("rl.advantage_scale=''", "set rl.advantage_scale to one of: group, batch, none"),
        (
            "rl.cotrain_weight=1",
            "set rl.cotrain_dataset to an SFT dataset folder (e.g. ${BUNDLE}/data/sft), or rl.cotrain_weight=0",
        ),
        ("eval.tasks=[]", "e.g. eval.tasks=[FetchPush-v4]"),
    ],
)
def test_grpo_refusals_carry_a_hint(override, hint):
    """D6: these refusals had an `error:` line and no `hint:`."""
    assert _refused([override]).hint == hint


@pytest.mark.parametrize(
    ("override", "hint"),
    [
        ("returns.failure_reward=.nan", "set returns.failure_reward to a finite number (docs/config.md)"),
        ("eval.tasks=[]", "e.g. eval.tasks=[FetchPush-v4]"),
    ],
)
def test_recap_refusals_carry_a_hint(override, hint):
    assert _refused([override], [RECAP]).hint == hint


def test_a_value_for_a_list_says_write_a_list():
    """D6: omegaconf's own words were 'AnyNode is not a ListConfig, TupleConfig, list, or tuple'."""
    err = _refused(["eval.tasks=FetchPush-v4"])
    assert err.message == "command line: config key `eval.tasks` must be a list, e.g. [FetchPush-v4], not FetchPush-v4"
    assert err.hint == "write eval.tasks=[FetchPush-v4] (a YAML list: [a, b]; docs/config.md)"


def test_a_range_error_names_the_file_its_value_came_from(tmp_path):
    """D8: a section's own rule named the field but not the file that set it."""
    layer = tmp_path / "mine.yaml"
    layer.write_text("recipe: grpo\nrl:\n  steps: 3\n  updates_per_rollout: 2\n")
    err = _refused([], [GRPO, layer])
    assert err.message == f"{layer}: rl.steps=3 is not a multiple of rl.updates_per_rollout=2"


def test_a_non_utf8_file_names_the_line_and_offset(tmp_path):
    """D8: the hint said `fix the YAML syntax there`; the problem is the encoding."""
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"recipe: grpo\nrl:\n  steps: 4\n# \xff\n")
    err = _refused([], [GRPO, bad])
    assert err.message == f"{bad}:4: not UTF-8 text: byte 0xff at byte offset 30"
    assert err.hint == "save the file as UTF-8 (line 4, byte offset 30 holds 0xff)"


def test_a_utf8_byte_order_mark_is_fine(tmp_path):
    bom = tmp_path / "bom.yaml"
    bom.write_bytes(b"\xef\xbb\xbfrecipe: grpo\nrl:\n  steps: 4\n")
    config = load_run_config([GRPO, bom], [], bundle=Path("/b"), run_dir=None)[2]
    assert config.rl.steps == 4


def test_a_run_override_is_refused_not_ignored(tmp_path):
    """D8: `RUN=/tmp/x` was silently replaced by --output's folder."""
    err = _refused(["RUN=/tmp/x"], run_dir=tmp_path / "run")
    assert err.message == "override 'RUN=/tmp/x': RUN is the run folder, set by the command itself"
    assert err.hint == "remove the override and give --output DIR"
