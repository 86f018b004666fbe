"""The run config: YAML + dotted overrides on the dataclass schema, placeholders, refusals, reference doc."""

from __future__ import annotations

from pathlib import Path

import pytest

from reproduction.errors import ConfigError, InputNotFoundError
from reproduction.recipes.recap.config import RunConfig, load_config
from reproduction.run.config import reference, to_yaml

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
        # omegaconf names no key for a section set to a value: "config key ``: Merge error: int is not ..."
        (["returns=3"], "command line: config key `returns` is a section, not a value", "returns.NAME="),
        (["value={train: 3}"], "config key `value.train` is a section, not a value", "value.train.NAME="),
    ],
)
def test_bad_values_are_one_line_config_errors_naming_the_key(overrides, words, hint):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert words in str(err.value) and "\n" not in str(err.value) and err.value.exit_code == 4
    if hint:
        assert hint in err.value.hint


def test_yaml_errors_keep_where_and_why(tmp_path):
    """audit46 newcomer F7: a YAML error kept only PyYAML's first line ("while parsing a flow sequence"): no line,
    no column, no cause; a bad override named no override and had no hint. Now file:line:column and the problem,
    or the override and where in its value."""

    def error(files=(), overrides=()):
        with pytest.raises(ConfigError) as err:
            load_config(list(files), list(overrides))
        assert err.value.exit_code == 4 and "\n" not in err.value.message
        return err.value.message, err.value.hint

    bad = tmp_path / "bad.yaml"
    bad.write_text("this is: [not yaml\n")
    assert error([bad]) == (
        f"{bad}:2:1: not valid YAML: did not find expected ',' or ']' (while parsing a flow sequence that starts at "
        "line 1, column 10)",
        "fix the YAML syntax there",
    )
    bad.write_text("returns:\n  gamma: 1\nvalue: {}\nreturns:\n  gamma: 2\n")
    assert error([bad]) == (
        f"{bad}:4:1: not valid YAML: found duplicate key returns (while constructing a mapping that starts at line 1, "
        "column 1)",
        "each key once per mapping: merge the two (or remove one)",
    )
    bad.write_text("returns: {tag: ${oops}\n")
    assert error([bad])[0] == (
        f"{bad}:1:17: not valid YAML: did not find expected ',' or '}}' (while parsing a flow mapping that starts at "
        "line 1, column 10)"
    )
    flow = "datasets=[{path: /x/${RUN}, type: sft}]"
    assert error(overrides=["value.train.max_steps=3", flow]) == (
        f"override '{flow}': not valid YAML at column 13 of the value: did not find expected ',' or '}}' (while "
        "parsing a flow mapping that starts at column 2 of the value)",
        'inside [...] or {...} a value holding ${...} must be quoted: path: "/data/${RUN}" (and the whole override in '
        "single quotes for the shell)",
    )
    assert error(overrides=["eval.tasks=[a,"]) == (
        "override 'eval.tasks=[a,': not valid YAML at the end of the value: did not find expected node content "
        "(while parsing a flow node)",
        "the value after = is YAML: check its brackets and quotes (quote a string holding `: ` or `,`)",
    )
    assert error(overrides=["returns.tag=${oops"]) == (
        "override 'returns.tag=${oops': bad interpolation: no viable alternative at input '${oops'",
        "an interpolation is ${key.path} (or ${BUNDLE}, ${RUN}): check its braces",
    )
    quoted = load_config([], ['datasets=[{path: "/x/${RUN}", type: sft}]'], run_dir=tmp_path / "r")
    assert quoted.datasets[0].path == f"/x/{(tmp_path / 'r').resolve()}"


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
    text = reference(RunConfig)
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
        "command line: policy.train.save_interval=4 is not a multiple of policy.train.eval_interval=3"
    ) and err.value.field == ("policy.train.save_interval")


@pytest.mark.parametrize("key", ["value.train.max_steps", "policy.train.max_steps"])
def test_max_steps_0_on_the_command_line_names_its_section(tmp_path, capsys, key):
    from reproduction.portable import main

    assert main(["-q", "run", "--output", str(tmp_path / "run"), f"{key}=0"]) == 4
    assert capsys.readouterr().err.splitlines()[0] == f"error: command line: {key}=0 must be >= 1"
    assert not (tmp_path / "run").exists()


# Every rule of a component section (returns, value.model, value.infer.device, advantages, policy.model)
# reached through a run config: (overrides, the field the error names, the message's start). The rules stay
# with their components (recap/returns.py, recap/value/config.py, train/device.py, recap/advantage_config.py,
# recap/policy/config.py); the run config passes each section's key.
COMPONENT_RULES = [
    ("returns.gamma=2", "returns.gamma", "returns.gamma=2.0 is outside (0, 1]"),
    ("returns.gamma=0", "returns.gamma", "returns.gamma=0.0 is outside (0, 1]"),
    ("returns.failure_reward=nan", "returns.failure_reward", "returns.failure_reward=nan is not a finite number"),
    ("value.model.folds=0", "value.model.folds", "value.model.folds=0 must be >= 1"),
    ("value.model.preset=huge", "value.model.preset", "value.model.preset='huge' is not one of tiny, recap"),
    (
        "value.model.return_min=-5",
        "value.model.return_min",
        "value.model.return_min=-5.0 and value.model.return_max=None: set both, or neither",
    ),
    ("value.model.preset=recap", "value.model.tokenizer", "value.model.preset='recap' needs `value.model.tokenizer`"),
    (
        "value.model.state_dims=[0]",
        "value.model.state_dims",
        "value.model.state_dims=[0] must be distinct indices of the vector value.model.state_keys concatenates",
    ),
    (
        "value.model.state_keys=[s] value.model.state_dims=[1,1]",
        "value.model.state_dims",
        "value.model.state_dims=[1, 1] must be distinct indices",
    ),
    (
        "value.model.state_keys=[s] value.model.state_dims=[-1]",
        "value.model.state_dims",
        "value.model.state_dims=[-1] has a negative index",
    ),
    (
        "value.infer.device=tpu",
        "value.infer.device",
        "value.infer.device='tpu' is not one of cpu, cuda, npu, auto",
    ),
    ("advantages.lookahead=0", "advantages.lookahead", "advantages.lookahead=0 must be >= 1"),
    ("advantages.gamma=1.5", "advantages.gamma", "advantages.gamma=1.5 is outside (0, 1]"),
    ("advantages.positive_quantile=1", "advantages.positive_quantile", "advantages.positive_quantile=1.0 is outside"),
    (
        "advantages.threshold_scope=local",
        "advantages.threshold_scope",
        "advantages.threshold_scope='local' is not one of global, per_task",
    ),
    ("policy.model.preset=huge", "policy.model.preset", "policy.model.preset='huge' is not one of tiny, pi05"),
    (
        "policy.model.condition_dropout=1",
        "policy.model.condition_dropout",
        "policy.model.condition_dropout=1.0 is outside [0, 1)",
    ),
    ("policy.model.chunk=0", "policy.model.chunk", "policy.model.chunk=0 must be >= 1"),
    ("policy.model.execute_steps=0", "policy.model.execute_steps", "policy.model.execute_steps=0 must be >= 1"),
    ("policy.model.num_steps=0", "policy.model.num_steps", "policy.model.num_steps=0 must be >= 1"),
    ("policy.model.width=0", "policy.model.width", "policy.model.width=0 must be >= 1"),
    ("policy.model.prefix_layers=0", "policy.model.prefix_layers", "policy.model.prefix_layers=0 must be >= 1"),
    ("policy.model.expert_layers=0", "policy.model.expert_layers", "policy.model.expert_layers=0 must be >= 1"),
    (
        "policy.model.execute_steps=5",
        "policy.model.execute_steps",
        "policy.model.execute_steps=5 exceeds policy.model.chunk=4",
    ),
    ("policy.model.preset=pi05", "policy.model.cameras", "policy.model.preset='pi05' reads cameras"),
]


@pytest.mark.parametrize("override, key, words", COMPONENT_RULES, ids=[c[0] for c in COMPONENT_RULES])
def test_every_component_rule_names_its_full_key(override, key, words):
    """A component's rule, reached through a run config, names `section.KEY` in its message and `field`, not the
    bare `KEY` (`folds`, `gamma`: returns and advantages both have one) the component names on its own."""
    with pytest.raises(ConfigError) as err:
        load_config(None, override.split())
    # a value the command line gave is named as such (audit58 D6); a rule on a default field (cameras) is not
    source = "command line: " if any(o.startswith(key + "=") for o in override.split()) else ""
    assert str(err.value).startswith(source + words) and "\n" not in str(err.value), str(err.value)
    assert err.value.field == key and err.value.exit_code == 4
    assert "\n" not in (err.value.hint or "")


def test_components_on_their_own_still_name_the_bare_field():
    """The same rules outside a run config (a stage's config built in Python) name the field alone."""
    from reproduction.recap.advantage_config import AdvantageConfig
    from reproduction.recap.policy.config import PolicyConfig
    from reproduction.recap.returns import ReturnsConfig
    from reproduction.recap.value.config import ValueConfig

    cases = [
        (lambda: ReturnsConfig(gamma=2.0), "gamma", "gamma=2.0 is outside (0, 1]"),
        (lambda: AdvantageConfig(lookahead=0), "lookahead", "lookahead=0 must be >= 1"),
        (lambda: ValueConfig(folds=0), "folds", "value stage: folds=0"),
        (lambda: PolicyConfig(chunk=0), "chunk", "policy stage: chunk=0 must be >= 1"),
    ]
    for build, field, words in cases:
        with pytest.raises(ConfigError) as err:
            build()
        assert str(err.value).startswith(words) and err.value.field == field, str(err.value)


# One bad value per section of the run config: each error names the full dotted key (message and `field`).
ONE_BAD_VALUE_PER_SECTION = [
    ("returns.gamma=2", "returns.gamma", "returns.gamma=2.0 is outside (0, 1]"),
    ("value.model.folds=0", "value.model.folds", "value.model.folds=0 must be >= 1"),
    ("value.train.max_steps=0", "value.train.max_steps", "value.train.max_steps=0 must be >= 1"),
    ("value.infer.batch_size=0", "value.infer.batch_size", "value.infer.batch_size=0 must be >= 1"),
    ("advantages.lookahead=0", "advantages.lookahead", "advantages.lookahead=0 must be >= 1"),
    ("policy.modes=[dagger]", "policy.modes", "policy.modes=['dagger'] must name each of"),
    ("policy.model.chunk=0", "policy.model.chunk", "policy.model.chunk=0 must be >= 1"),
    ("policy.train.max_steps=0", "policy.train.max_steps", "policy.train.max_steps=0 must be >= 1"),
    ("eval.episodes_per_task=0", "eval.episodes_per_task", "eval.episodes_per_task=0 must be >= 1"),
    ("eval.sequential.looks=0", "eval.sequential.looks", "eval.sequential.looks=0 must be >= 1"),
    ("eval.libero.image_size=4", "eval.libero.image_size", "eval.libero.image_size=4 must be >= 8"),
    ("min_free_gb=-1", "min_free_gb", "min_free_gb=-1.0 must be >= 0"),
]


@pytest.mark.parametrize(
    "override, key, words", ONE_BAD_VALUE_PER_SECTION, ids=[c[1] for c in ONE_BAD_VALUE_PER_SECTION]
)
def test_one_bad_value_per_section_names_its_full_key_at_load(override, key, words):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert str(err.value).startswith(f"command line: {words}") and "\n" not in str(err.value), str(err.value)
    assert err.value.field == key and err.value.exit_code == 4


@pytest.mark.parametrize(
    "override, key, words", ONE_BAD_VALUE_PER_SECTION, ids=[c[1] for c in ONE_BAD_VALUE_PER_SECTION]
)
def test_one_bad_value_per_section_through_portable_run(tmp_path, capsys, override, key, words):
    """`portable run` refuses it before anything is created: exit 4, the first stderr line names the full key,
    at most a hint after it, no traceback, no --output folder."""
    from reproduction.portable import main

    out = tmp_path / "run"
    assert main(["-q", "run", "--output", str(out), override]) == 4
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert lines[0].startswith(f"error: command line: {words}") and f"{key}=" in lines[0], err
    assert len(lines) <= 2 and (len(lines) == 1 or lines[1].startswith("hint: ")), err
    assert "Traceback" not in err
    assert not out.exists()


def test_a_config_without_recipe_says_it_was_read_as_recaps_when_a_key_is_unknown(tmp_path):
    from reproduction.run.resolve import load_run_config

    unnamed, named = tmp_path / "a.yaml", tmp_path / "b.yaml"
    unnamed.write_text("data: x\n")
    named.write_text("recipe: recap\ndata: x\n")
    with pytest.raises(ConfigError) as err:
        load_run_config([unnamed], [], bundle=None, run_dir=tmp_path / "run")
    assert err.value.hint == (
        "did you mean `datasets`?; the config names no `recipe:`, so it was read as RECAP's: add `recipe: NAME` for "
        "another recipe"
    )
    with pytest.raises(ConfigError) as err:
        load_run_config([named], [], bundle=None, run_dir=tmp_path / "run")
    assert err.value.hint == "did you mean `datasets`?"
