"""The GRPO recipe value, its config schema, and one short run through the runner (sft, rl, eval, compare)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reproduction.recipes.grpo import GRPO, RECIPE
from reproduction.recipes.grpo.config import GrpoRunConfig
from reproduction.run.config import load_config, select, to_plain

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "bundle" / "grpo" / "config.yaml"


def test_recipe_graph_and_training_keys():
    from reproduction.run.resolve import recipe_schema, resolve_recipe

    assert resolve_recipe("grpo") is RECIPE is GRPO and GRPO.name == "grpo"
    assert recipe_schema(RECIPE) is GrpoRunConfig
    assert [s.name for s in GRPO.stages] == ["sft", "rl", "eval", "compare"]
    assert GRPO.stage("rl").needs == ("sft",) and GRPO.stage("eval").needs == ("sft", "rl")
    plain = to_plain(GrpoRunConfig())
    for spec in GRPO.stages:
        for key in spec.config + tuple(k for k in (spec.training,) if k):
            assert select(plain, key) is not None or key == "eval.reference", (spec.name, key)
    assert GRPO.stage("rl").training == "rl.steps" and GRPO.stage("sft").training == "sft.train.max_steps"


def test_bundle_config_loads_with_the_schema(tmp_path):
    cfg = load_config([CONFIG], ["rl.steps=40"], bundle=tmp_path, run_dir=tmp_path / "run", schema=GrpoRunConfig)
    assert cfg.recipe == "grpo"
    assert cfg.sft.datasets[0].path == f"{tmp_path}/data/sft"
    assert (cfg.rl.group_size, cfg.rl.init_states, cfg.rl.steps, cfg.rl.updates_per_rollout) == (8, 16, 40, 2)
    assert cfg.rl.train_config().global_batch == 16
    assert cfg.rl.reward == "progress"
    from reproduction.errors import ConfigError

    with pytest.raises(ConfigError, match="group_size"):
        load_config([CONFIG], ["rl.group_size=1"], bundle=tmp_path, run_dir=tmp_path / "run", schema=GrpoRunConfig)


def test_trainer_ranks_are_checked_against_the_launcher_and_the_batch(tmp_path):
    """rl.world_size: two ranks need the ray launcher, and B init states must split into micro batches over the
    ranks; a valid one reaches the trainer's config (and stays out of the rl stage's key: same_outputs)."""
    from reproduction.errors import ConfigError

    def load(*over):
        return load_config([CONFIG], list(over), bundle=tmp_path, run_dir=tmp_path / "run", schema=GrpoRunConfig)

    with pytest.raises(ConfigError, match=r"rl.world_size=2 needs rl.launcher=ray \('inprocess'") as err:
        load("rl.world_size=2")
    assert err.value.field == "rl.launcher"
    with pytest.raises(ConfigError, match=r"rl.init_states=16 is not a multiple of .* = 16 x 2") as err:
        load("rl.world_size=2", "rl.launcher=ray")  # the bundle's micro batch is the whole round
    assert err.value.field == "rl.micro_init_states" and "multiple of 32" in err.value.hint
    with pytest.raises(ConfigError, match="rl.world_size=0 must be >= 1"):
        load("rl.world_size=0")
    cfg = load("rl.world_size=2", "rl.launcher=ray", "rl.micro_init_states=4")
    train = cfg.rl.train_config()
    assert (train.world_size, train.micro_batch, train.grad_accum, train.launcher) == (2, 4, 2, "ray")
    from reproduction.config_fields import output_free_keys

    assert "rl.world_size" in output_free_keys(cfg)


@pytest.mark.slow
def test_a_short_run_through_the_runner_with_target_step(tmp_path):
    """sft (20 BC steps on 3 demos) -> rl (2 steps) -> eval -> compare, then --resume --target-step 4 continues rl
    from its step-2 checkpoint and re-evaluates; the evidence names both policies on the same reset seeds. A
    second run from the same SFT weights (pinned as sft.export) that trains 4 steps at once, its envs in the
    trainer's process instead of 2 simulator workers, ends with the same bytes: the resume is exact."""
    from reproduction.run.record import make_recorder
    from reproduction.run.runner import RunOptions, run_recipe
    from reproduction.sim.generate import GenConfig, generate_dataset

    generate_dataset(GenConfig(kind="sft", tasks=("FetchPush-v4",), episodes_per_task=3, cameras=()), tmp_path / "sft")
    over = [
        f"sft.datasets=[{{path: {tmp_path / 'sft'}}}]",
        "sft.train.max_steps=20",
        "sft.train.global_batch=64",
        "sft.train.micro_batch=64",
        "rl.steps=2",
        "rl.init_states=2",
        "rl.micro_init_states=1",
        "rl.group_size=2",
        "rl.updates_per_rollout=1",
        "rl.rollout_workers=2",
        "rl.eval_every=2",
        "rl.save_every=2",
        "rl.eval_episodes=1",
        "eval.episodes_per_task=3",
    ]
    run = tmp_path / "run"
    cfg = load_config([CONFIG], over, bundle=tmp_path, run_dir=run, schema=GrpoRunConfig)
    report = run_recipe(GRPO, cfg, run, RunOptions(recorder=make_recorder(None)))
    assert [(s.name, s.action) for s in report.stages] == [(n, "ran") for n in ("sft", "rl", "eval", "compare")]
    rl_statement = json.loads((run / "lineage" / "rl.intoto.json").read_text())
    assert "sft/export/model.safetensors" in json.dumps(rl_statement)  # rl's lineage names the SFT weights it read
    assert sorted(p.name for p in (run / "lineage").glob("*.intoto.json")) == [
        f"{n}.intoto.json" for n in ("compare", "eval", "rl", "sft")
    ]
    doc = json.loads((run / "evidence" / "eval_grpo_2.json").read_text())
    assert doc["policy"]["label"] == "grpo" and doc["baselines"][0]["policy"]["label"] == "sft"
    assert doc["tasks"]["FetchPush-v4"]["episodes"] == 3
    seeds = doc["tasks"]["FetchPush-v4"]["outcomes"]["reset_seeds"]
    assert len(seeds) == 3 and all(s % 2 == 1 for s in seeds)  # held-out: odd evaluation seeds
    assert doc["baselines"][0]["tasks"]["FetchPush-v4"]["outcomes"]["reset_seeds"] == seeds
    from reproduction.run.lineage import tree_sha256

    loaded = tree_sha256(run / "rl" / "checkpoints" / "step_2")  # what the continued trainer loads
    report = run_recipe(GRPO, cfg, run, RunOptions(resume=True, target_step=4, recorder=make_recorder(None)))
    actions = {s.name: s.action for s in report.stages}
    assert actions["sft"] == "skipped" and actions["rl"] == "continued"
    rl = json.loads((run / "run.json").read_text())["stages"]["rl"]
    assert rl["step"] == 4 and rl["resumed_from"] == 2
    # audit53 R7: the rl stage's statement names the checkpoint it continued from, digested as it was loaded
    build = json.loads((run / "lineage" / "rl.intoto.json").read_text())["predicate"]["buildDefinition"]
    deps = [d for d in build["resolvedDependencies"] if d["annotations"].get("role") == "checkpoint"]
    assert [(d["name"], d["digest"], d["annotations"]["kind"]) for d in deps] == [
        ("rl/checkpoints/step_2", {"sha256": loaded}, "tree")
    ]
    assert build["internalParameters"]["resumed_from"]["digest"] == {"sha256": loaded}
    assert rl["lineage"]["resumed_from_sha256"] == loaded
    assert (run / "evidence" / "eval_grpo_4.json").is_file()
    live = json.loads((run / "rl" / "evidence" / "eval_rl_4.json").read_text())
    assert live["policy"]["checkpoint"]["step"] == 4 and live["tasks"]["FetchPush-v4"]["episodes"] == 1

    from reproduction.recipes.grpo.report import main as report_main

    (run / "report.html").unlink()
    assert report_main([str(run)]) == 0 and "GRPO run" in (run / "report.html").read_text()

    straight = tmp_path / "straight"
    pinned = [*over, f"sft.export={run / 'sft' / 'export'}", "rl.steps=4", "rl.rollout_workers=1"]
    cfg = load_config([CONFIG], pinned, bundle=tmp_path, run_dir=straight, schema=GrpoRunConfig)
    run_recipe(GRPO, cfg, straight, RunOptions(stages=["sft", "rl"]))
    resumed = (run / "rl" / "export" / "model.safetensors").read_bytes()
    assert (straight / "rl" / "export" / "model.safetensors").read_bytes() == resumed


def test_resume_refuses_a_changed_setup_and_allows_free_fields(tmp_path):
    from reproduction.errors import CheckpointError
    from reproduction.recipes.grpo.config import RlSection
    from reproduction.recipes.grpo.train import _refuse_changed

    def setup(**rl):
        return {"rl": to_plain(RlSection(**rl)), "eval": {"seed": 1}, "sft_weights_sha256": "ab", "model_config": {}}

    path = tmp_path / "grpo_setup.json"
    path.write_text(json.dumps(setup()))
    _refuse_changed(path, setup(steps=80, save_every=20, rollout_workers=3, cpu_threads=2))
    # the live evaluations (evidence/eval_rl_*.json) are the stage's outputs: their interval and size change them
    with pytest.raises(CheckpointError, match=r"rl.eval_episodes: 20 -> 3; rl.eval_every: 10 -> 5"):
        _refuse_changed(path, setup(eval_every=5, eval_episodes=3))
    with pytest.raises(CheckpointError, match=r"rl.micro_init_states: 8 -> 4"):  # changes outputs (audit56 D1)
        _refuse_changed(path, setup(micro_init_states=4))
    with pytest.raises(CheckpointError, match=r"rl.lr: 0.0001 -> 0.0003; rl.noise_level: 0.5 -> 0.7") as err:
        _refuse_changed(path, setup(lr=3e-4, noise_level=0.7))
    assert "train into a new folder" in err.value.hint
    before = setup()
    del before["rl"]["advantage_scale"]  # a setup written before the field existed ran what its default does
    path.write_text(json.dumps(before))
    _refuse_changed(path, setup())
    with pytest.raises(CheckpointError, match=r"rl.advantage_scale: 'group' -> 'batch'"):
        _refuse_changed(path, setup(advantage_scale="batch"))
    path.write_text(json.dumps(setup()))
    changed = setup()
    changed["sft_weights_sha256"] = "cd"
    with pytest.raises(CheckpointError, match="sft_weights_sha256 differs"):
        _refuse_changed(path, changed)


def test_preflight_collects_every_problem(tmp_path):
    from reproduction.errors import ConfigError, InputNotFoundError
    from reproduction.recipes.grpo.preflight import preflight

    over = [
        f"sft.datasets=[{{path: {tmp_path / 'nope'}}}]",
        "rl.tasks=[FetchSlide-v4]",
        f"eval.reference={tmp_path / 'ref.json'}",
    ]
    cfg = load_config([CONFIG], over, bundle=tmp_path, run_dir=tmp_path / "run", schema=GrpoRunConfig)
    problems = preflight(cfg, tmp_path / "run", {}, ["sft", "rl", "eval", "compare"])
    kinds = sorted(type(p).__name__ for p in problems)
    assert kinds == ["ConfigError", "InputNotFoundError", "InputNotFoundError"], problems
    assert any(isinstance(p, ConfigError) and "rl.tasks" in p.message and "FetchSlide" in p.message for p in problems)
    assert any(isinstance(p, InputNotFoundError) and "sft.datasets[0].path" in p.message for p in problems)


def test_fields_that_do_not_change_outputs_are_declared_once():
    """The rl stage's key and its resume check (train.FREE_ON_RESUME) leave out the same rl fields, declared
    `same_outputs()` on RlSection; the sft trainer's free fields are TrainConfig's; eval.workers / eval.reference
    stay out of the eval stage's key."""
    from reproduction.config_fields import output_free_keys
    from reproduction.recipes.grpo.train import FREE_ON_RESUME
    from reproduction.run.stage_keys import digest, key_parts
    from reproduction.train.config import TrainConfig

    free = output_free_keys(GrpoRunConfig())
    rl_free = sorted(k[len("rl.") :] for k in free if k.startswith("rl."))
    # rl.advantage_scale, added after runs were recorded, is left out of the key at its default only
    assert rl_free == sorted([*(k for k in FREE_ON_RESUME if k != "steps"), "advantage_scale"])
    assert "rollout_workers" in rl_free
    assert not {"lr", "micro_init_states", "eval_every", "eval_episodes"} & set(rl_free)  # audit62 K M1
    # sft.model's input options, added after runs were recorded, are left out of the key at their defaults only
    added = [f"sft.model.{k}" for k in ("discrete_state_input", "norm", "norm_stats", "image_augment")]
    assert sorted(k for k in free if k.startswith("sft.")) == sorted(
        [*(f"sft.train.{k}" for k in output_free_keys(TrainConfig)), *added]
    )

    def key(stage, **over):
        plain = to_plain(GrpoRunConfig())
        for dotted, value in over.items():
            section, name = dotted.split("__")
            plain[section][name] = value
        return digest(key_parts(GRPO.stage(stage), plain, {}, {n: "u" for n in GRPO.stage(stage).needs}, free))

    assert key("rl") == key("rl", rl__rollout_workers=4, rl__save_every=5, rl__steps=80) != key("rl", rl__lr=1.0)
    assert key("rl") != key("rl", rl__eval_every=5) and key("rl") != key("rl", rl__eval_episodes=3)
    before = to_plain(GrpoRunConfig())
    del before["rl"]["advantage_scale"]  # the config of a run recorded before the field existed keys the same
    assert digest(key_parts(GRPO.stage("rl"), before, {}, {"sft": "u"}, free)) == key("rl")
    batch = GrpoRunConfig()
    batch.rl.advantage_scale = "batch"
    assert "rl.advantage_scale" not in output_free_keys(batch)
    assert digest(key_parts(GRPO.stage("rl"), to_plain(batch), {}, {"sft": "u"}, output_free_keys(batch))) != key("rl")
    assert key("eval") == key("eval", eval__workers=3, eval__reference="x.json") != key("eval", eval__seed=7)


def test_the_report_command_refuses_what_is_no_grpo_run_and_writes_nothing(tmp_path, capsys):
    """Before: `--help` made a folder named --help with a report in it, a missing folder got an empty report
    (exit 0), a RECAP run's report.html was replaced by a GRPO one, and no argument was an IndexError traceback."""
    from reproduction.recipes.grpo.report import main

    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0 and not (Path.cwd() / "--help").exists()
    with pytest.raises(SystemExit) as done:
        main([])
    assert done.value.code == 2
    assert main([str(tmp_path / "none")]) == 3 and not (tmp_path / "none").exists()
    recap = tmp_path / "recap"
    recap.mkdir()
    (recap / "run.json").write_text(json.dumps({"format_version": 1, "recipe": "recap", "run_id": "x", "stages": {}}))
    (recap / "report.html").write_text("recap's report")
    assert main([str(recap)]) == 4
    assert (recap / "report.html").read_text() == "recap's report" and not (recap / "plots").exists()
    assert "holds a 'recap' run, not a grpo run" in capsys.readouterr().err


def test_eval_workers_below_1_is_a_config_error_before_anything_runs(tmp_path):
    """eval.workers=0 once ran the evaluation in-process; the eval stage reports its workers as the stage's world size,
    which the runner now holds to >= 1 (exit 54 after the whole evaluation): refused at load instead, as RECAP's."""
    from reproduction.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        load_config([CONFIG], ["eval.workers=0"], bundle=tmp_path, run_dir=tmp_path / "run", schema=GrpoRunConfig)
    assert (
        err.value.field == "eval.workers"
        and err.value.exit_code == 4
        and "eval.workers=0 must be >= 1" in str(err.value)
    )


def test_live_evaluations_above_the_end_step_are_dropped(tmp_path):
    """audit50 F5's rule, alone: an earlier attempt's eval_rl_<n>.json with n above the step the stage ends at goes;
    the others and a name that is not the trainer's stay."""
    from reproduction.recipes.grpo.train import drop_live_evaluations_after

    folder = tmp_path / "evidence"
    folder.mkdir()
    names = ("eval_rl_2.json", "eval_rl_8.json", "eval_rl_10.json", "eval_rl_12.json", "eval_rl_best.json")
    for name in names:
        (folder / name).write_text("{}")
    assert [p.name for p in drop_live_evaluations_after(tmp_path, 8)] == ["eval_rl_10.json", "eval_rl_12.json"]
    assert sorted(p.name for p in folder.iterdir()) == ["eval_rl_2.json", "eval_rl_8.json", "eval_rl_best.json"]
    assert drop_live_evaluations_after(tmp_path / "absent", 0) == []
