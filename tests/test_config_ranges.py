"""Every config field that becomes a file name or a number the trainer uses is refused at config load when it is out
of range (exit 4, naming the field), and the writers defend themselves too (audit52 W3, W4, W6, W7)."""

from __future__ import annotations

import dataclasses
import functools

import pyarrow as pa
import pytest
import train_tiny

from reproduction.errors import CheckpointError, ConfigError
from reproduction.recap.policy.config import PolicyConfig
from reproduction.recap.sidecars import sidecar_name, write_sidecar
from reproduction.recap.value.config import ValueConfig
from reproduction.recipes.grpo.config import GrpoRunConfig
from reproduction.recipes.recap.config import load_config
from reproduction.run.config import load_config as load_with_schema
from reproduction.run.preflight import disk_problems
from reproduction.train.api import train
from reproduction.train.config import TrainConfig
from reproduction.train.metrics import read_records

BIG = "100000000000000000000000"  # 10^23: past int64

RECAP = [
    # W3: tags are file names
    ("returns.tag=x/../../../../ESCAPED", "returns.tag", "returns.tag='x/../../../../ESCAPED' must be a plain name"),
    ("advantages.tag=x/../../../../ADV", "advantages.tag", "advantages.tag='x/../../../../ADV' must be a plain name"),
    ("advantages.returns_tag=..", "advantages.returns_tag", "advantages.returns_tag='..' must be a plain name"),
    ("returns.tag=''", "returns.tag", "returns.tag='' must be a plain name"),
    ("returns.tag=-x", "returns.tag", "returns.tag='-x' must be a plain name"),
    # W4: the value model and its trainer
    ("value.model.value_lr=nan", "value.model.value_lr", "value.model.value_lr=nan must be a finite number > 0"),
    ("value.model.value_lr=0", "value.model.value_lr", "value.model.value_lr=0.0 must be > 0"),
    ("value.train.lr=inf", "value.train.lr", "value.train.lr=inf must be a finite number > 0"),
    ("policy.train.lr=1e400", "policy.train.lr", "policy.train.lr=inf must be a finite number > 0"),
    ("value.train.eps=inf", "value.train.eps", "value.train.eps=inf must be a finite number >= 0"),
    ("value.train.grad_clip=inf", "value.train.grad_clip", "value.train.grad_clip=inf must be a finite number >= 0"),
    ("value.train.start_timeout_s=inf", "value.train.start_timeout_s", "start_timeout_s=inf must be a finite"),
    ("policy.train.collective_timeout_s=inf", "policy.train.collective_timeout_s", "=inf must be a finite number"),
    (
        "value.model.value_dropout=-5",
        "value.model.value_dropout",
        "value.model.value_dropout=-5.0 must be >= 0 and < 1",
    ),
    ("value.model.value_dropout=1", "value.model.value_dropout", "value.model.value_dropout=1.0 must be >= 0 and < 1"),
    ("value.model.eval_micro_batch=0", "value.model.eval_micro_batch", "value.model.eval_micro_batch=0 must be >= 1"),
    ("value.model.eval_max_samples=-5", "value.model.eval_max_samples", "eval_max_samples=-5 must be >= 1"),
    ("value.model.max_token_len=0", "value.model.max_token_len", "value.model.max_token_len=0 must be >= 1"),
    ("value.model.model_seed=-5", "value.model.model_seed", "value.model.model_seed=-5 must be >= 0"),
    ("value.model.fold_seed=-1", "value.model.fold_seed", "value.model.fold_seed=-1 must be >= 0"),
    (f"value.model.folds={BIG}", "value.model.folds", f"value.model.folds={BIG} must be a whole number within"),
    (f"value.train.seed={BIG}", "value.train.seed", f"value.train.seed={BIG} must be a whole number within"),
    ("value.train.seed=-5", "value.train.seed", "value.train.seed=-5 must be >= 0"),
    ("value.model.return_min=5 value.model.return_max=1", "value.model.return_max", "return_max=1.0 must be > 5"),
    ("value.model.return_min=nan value.model.return_max=1", "value.model.return_min", "return_min=nan must be a fin"),
    # W4: the policy model
    ("policy.model.image_size=0", "policy.model.image_size", "policy.model.image_size=0 must be >= 16"),
    (f"policy.model.chunk={BIG}", "policy.model.chunk", f"policy.model.chunk={BIG} must be a whole number within"),
    ("policy.model.model_seed=-5", "policy.model.model_seed", "policy.model.model_seed=-5 must be >= 0"),
    (f"advantages.lookahead={BIG}", "advantages.lookahead", None),
    # W7
    ("min_free_gb=nan", "min_free_gb", "min_free_gb=nan must be a finite number >= 0"),
    ("min_free_gb=inf", "min_free_gb", "min_free_gb=inf must be a finite number >= 0"),
    ("eval.guidance_scales=[1.0,.nan]", "eval.guidance_scales", "must be a non-empty list of finite values >= 0"),
]


@pytest.mark.parametrize(("override", "key", "words"), RECAP)
def test_recap_refuses_an_out_of_range_value_at_load_naming_it(override, key, words):
    with pytest.raises(ConfigError) as err:
        load_config(None, override.split())
    assert err.value.exit_code == 4 and err.value.field == key
    if words is not None:
        assert words in str(err.value)


@pytest.mark.parametrize(
    ("overrides", "key", "shown"),
    [
        (["value.model.augment=2"], "value.model.augment", "2"),
        (["value.train.shuffle=0"], "value.train.shuffle", "0"),
        (['advantages.hold_labels="false"'], "advantages.hold_labels", "'false'"),
        (["policy.model.image_augment=0.5"], "policy.model.image_augment", "0.5"),
        (["value={model: {balance_weights: 1}}"], "value.model.balance_weights", "1"),
        (["datasets=[{path: /x, value: 3}]"], "datasets[0].value", "3"),
        (["datasets=[{path: /x}]", "datasets[0].policy=2"], "datasets[0].policy", "2"),
    ],
)
def test_a_bool_key_takes_only_true_or_false(overrides, key, shown):
    """omegaconf loads 2, 0.5 and the string "false" into a bool field as their truth (`augment=2` ran with
    augmentation on, `"false"` as true): the loader refuses them before the merge, naming the key (audit52 W)."""
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert err.value.exit_code == 4 and err.value.field == key
    assert str(err.value) == f"command line: config key `{key}` is {shown}: it takes true or false"
    assert err.value.hint == f"set {key}=true or {key}=false (docs/config.md)"


def test_a_bool_key_in_a_config_file_is_refused_naming_the_file(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("value:\n  model:\n    augment: 1\n")
    with pytest.raises(ConfigError, match=r": config key `value.model.augment` is 1: it takes true or false$") as err:
        load_config([config])
    assert str(err.value).startswith(f"{config}: ")
    # true, false, YAML's other spellings of them and null (for an optional bool) load as before
    ok = load_config(
        None, ["value.model.augment=false", "advantages.hold_labels=yes", "policy.model.image_augment=null"]
    )
    assert (ok.value.model.augment, ok.advantages.hold_labels, ok.policy.model.image_augment) == (False, True, None)


@pytest.mark.parametrize(
    ("overrides", "key", "shown"),
    [
        (["value.model.augment=${eval.seed}"], "value.model.augment", "${eval.seed}, which is 1000"),
        (
            ["eval.seed=0", "policy.model.image_augment=${eval.seed}"],
            "policy.model.image_augment",
            "${eval.seed}, which is 0",
        ),
        (
            ["datasets=[{path: /x}]", "datasets[0].value=${value.train.lr}"],
            "datasets[0].value",
            "${value.train.lr}, which is 5.0e-05",
        ),
    ],
)
def test_a_bool_key_refuses_an_interpolation_that_resolves_to_a_non_bool(overrides, key, shown):
    """omegaconf converts a ${...}'s result into a bool field as it converts a literal: `augment=${eval.seed}` loaded as
    true (stop 53's left-over). The loader reads what the interpolation gives before any bool node converts it."""
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert err.value.exit_code == 4 and err.value.field == key
    assert str(err.value) == f"command line: config key `{key}` is {shown}: it takes true or false"
    # an interpolation of a bool (or of the words true/false) loads as before
    ok = load_config(None, ["value.model.augment=false", "advantages.hold_labels=${value.model.augment}"])
    assert ok.advantages.hold_labels is False


@pytest.mark.parametrize("weight", ["nan", "-1", "0", "inf"])
def test_a_dataset_weight_must_be_a_finite_number_above_0(tmp_path, weight):
    config = tmp_path / "c.yaml"
    config.write_text(f"datasets:\n  - path: /x\n    weight: {weight}\n")
    with pytest.raises(ConfigError) as err:
        load_config([config])
    assert err.value.field == "datasets[].weight" and err.value.exit_code == 4


GRPO = [
    ("eval.episodes_per_task=-5", "eval.episodes_per_task", "eval.episodes_per_task=-5 must be >= 1"),
    ("eval.episodes_per_task=0", "eval.episodes_per_task", "eval.episodes_per_task=0 must be >= 1"),
    ("eval.videos=-5", "eval.videos", "eval.videos=-5 must be >= 0"),
    ("rl.rollout_workers=0", "rl.rollout_workers", "rl.rollout_workers=0 must be >= 1"),
    ("rl.cotrain_batch=-5", "rl.cotrain_batch", "rl.cotrain_batch=-5 must be >= 1"),
    ("rl.eval_every=-5", "rl.eval_every", "rl.eval_every=-5 must be >= 0"),
    ("rl.eval_every=3", "rl.save_every", "rl.save_every=10 is not a multiple of rl.eval_every=3"),
    ("rl.save_every=-10", "rl.save_every", "rl.save_every=-10 must be >= 0"),
    ("rl.lr=inf", "rl.lr", "rl.lr=inf must be a finite number > 0"),
    ("rl.grad_clip=inf", "rl.grad_clip", "rl.grad_clip=inf must be a finite number >= 0"),
    ("rl.kl_coef=nan", "rl.kl_coef", "rl.kl_coef=nan must be a finite number >= 0"),
    ("rl.noise_level=inf", "rl.noise_level", "rl.noise_level=inf must be a finite number >= 1e-06"),
    # its float32 step noise is 0: every rl step's loss was NaN and skipped, and the run exited 0 (audit54 C2)
    ("rl.noise_level=1e-46", "rl.noise_level", "rl.noise_level=1e-46 must be >= 1e-06"),
    (f"sft.model.width={BIG}", "sft.model.width", f"sft.model.width={BIG} must be a whole number within"),
    ("sft.model.model_seed=-1", "sft.model.model_seed", "sft.model.model_seed=-1 must be >= 0"),
    ("sft.train.lr=inf", "sft.train.lr", "sft.train.lr=inf must be a finite number > 0"),
    ("min_free_gb=nan", "min_free_gb", "min_free_gb=nan must be a finite number >= 0"),
    ("min_free_gb=-5", "min_free_gb", "min_free_gb=-5.0 must be >= 0"),
]


@pytest.mark.parametrize(("override", "key", "words"), GRPO)
def test_grpo_refuses_an_out_of_range_value_at_load_naming_its_own_key(override, key, words):
    with pytest.raises(ConfigError) as err:
        load_with_schema(None, override.split(), schema=GrpoRunConfig)
    assert err.value.exit_code == 4 and err.value.field == key
    assert words in str(err.value)
    assert "eval_interval" not in str(err.value) and "save_interval" not in str(err.value)


def test_programmatic_configs_refuse_non_bools_and_non_finite_numbers():
    """The component checks stand on their own, without the run config's loader."""
    with pytest.raises(ConfigError, match=r"^value stage: value_lr=nan must be a finite number > 0$"):
        ValueConfig(value_lr=float("nan"))
    with pytest.raises(ConfigError, match=r"^augment=2 must be true or false$"):
        ValueConfig(augment=2)
    with pytest.raises(ConfigError, match=r"^shuffle=1 must be true or false$"):
        TrainConfig(max_steps=1, shuffle=1)
    with pytest.raises(ConfigError, match=r"^lr=inf must be a finite number > 0$"):
        TrainConfig(max_steps=1, lr=float("inf"))
    with pytest.raises(ConfigError, match=r"^policy stage: image_size=-5 must be >= 16$"):
        PolicyConfig(image_size=-5)
    # whole floats (2.0) stay accepted for counts, as `int(x) < 1` took them
    assert TrainConfig(max_steps=2.0).max_steps == 2.0


@pytest.mark.parametrize("tag", ["x/../../ESCAPED", "..", "", "a\0b", "a\\b", "/abs"])
def test_the_sidecar_writer_never_leaves_its_folder(tmp_path, tag):
    """A caller that skips the config check still cannot write outside the sidecar folder: the name is refused
    before anything is written."""
    folder = tmp_path / "run" / "returns" / "ds"
    folder.mkdir(parents=True)
    with pytest.raises(ConfigError) as err:
        write_sidecar(folder / sidecar_name("returns", tag), pa.table({"a": [1]}), {})
    assert err.value.exit_code == 4 and err.value.field == "returns.tag"
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "run",
        "run/returns",
        "run/returns/ds",
    ]
    assert sidecar_name("returns", None) == "returns.parquet"
    assert sidecar_name("advantages", "v1.2_a-b") == "advantages_v1.2_a-b.parquet"


def test_a_nan_minimum_free_space_is_a_problem_not_a_pass(tmp_path):
    (problem,) = disk_problems(tmp_path, float("nan"))
    assert "min_free_gb=nan" in problem
    assert disk_problems(tmp_path, 0.0) == []


def _nan_head_task(rank: int, world_size: int):
    """The tiny task with its head group's lr nan, as `value.model.value_lr=nan` trained the value model."""
    task = train_tiny.make_task(rank, world_size)
    inner = task.param_groups

    def groups(model):
        return [{**g, "lr": float("nan")} if "lr" in g else g for g in inner(model)]

    return dataclasses.replace(task, param_groups=groups)


def test_training_that_makes_the_weights_non_finite_stops_before_saving_or_exporting(tmp_path):
    config = train_tiny.config(world_size=1, launcher="inprocess", max_steps=4, save_interval=0, eval_interval=0)
    with pytest.raises(CheckpointError) as err:
        train(functools.partial(_nan_head_task), config, out_dir=tmp_path, resume=False)
    assert str(err.value).startswith("training reached step 4 with ")
    assert "non-finite model parameters; nothing of this step is saved or exported" in str(err.value)
    assert not list(tmp_path.rglob("model.safetensors")) and not list(tmp_path.rglob("step_*"))
    assert [r["step"] for r in read_records(tmp_path / "metrics.jsonl") if r["split"] == "train"] == [1, 2, 3, 4]


def test_a_non_finite_value_is_told_the_finite_range_allowed():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["value.model.value_lr=nan"])
    assert err.value.hint == "set value.model.value_lr to a finite number above 0 (docs/config.md)"
    with pytest.raises(ConfigError) as err:
        load_config(None, ["value.model.value_dropout=nan"])
    assert err.value.hint == "set value.model.value_dropout to a finite number in [0, 1) (docs/config.md)"
