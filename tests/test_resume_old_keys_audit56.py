"""audit56 R1: a run folder recorded before a field entered the keys (`train.micro_batch`, audit56 D1) resumes: a
stage key or checkpoint resume key without the field takes the value the stage provably ran with (audit56 review2
S1: run.json's config only where its digest is the record's, else the lineage statement's; a checkpoint's from its
stage setup), by one rule for both (S5); a value that differs is still refused (exit 52) naming both, and one that
cannot be told is refused naming the field and --restart-stage."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
from test_grpo_cli import CONFIG, portable

from reproduction.config_fields import added_defaults, added_field, unrecorded_filled
from reproduction.digests import json_sha256
from reproduction.errors import StageKeyChangedError
from reproduction.recipe import Recipe, StageContext, StageOutput, StageSpec
from reproduction.run.record import make_recorder
from reproduction.run.runner import RunOptions, run_recipe
from reproduction.run.stage_decide import ran_with_config
from reproduction.run.stage_keys import UNTOLD, Untold, unkeyed_filled, upgrade_parts
from reproduction.train.checkpoint import setup_train


@dataclass
class _Old:
    lr: float = 0.1
    micro: int = 2
    new: str = field(default="off", metadata=added_field())


def test_a_resume_key_without_a_field_takes_the_value_it_ran_with_and_an_added_one_its_default():
    today = {"lr": 0.1, "micro": 8, "new": "on"}
    added = added_defaults(_Old)
    assert unrecorded_filled({"lr": 0.1}, today, {"micro": 4}, added=added) == (
        {"lr": 0.1, "micro": 4, "new": "off"},
        [],
    )
    assert unrecorded_filled({"lr": 0.1, "micro": 4}, today, None, added=added)[0]["micro"] == 4  # compared as before
    # nothing says what it ran with: not today's value (which accepted any), but "cannot be told"
    assert unrecorded_filled({"lr": 0.1}, today, None, added=added) == ({"lr": 0.1, "new": "off"}, ["micro"])
    assert unrecorded_filled({"lr": 0.1}, today, {}, added=added)[0] == {"lr": 0.1, "new": "off"}  # did not exist


def test_a_stage_key_without_a_config_key_takes_the_value_the_stage_ran_with():
    today = {"sft": {"train": {"lr": 1, "micro_batch": 8, "added": "on"}}}
    ran = {"sft": {"train": {"lr": 1, "micro_batch": 4}}}
    filled = unkeyed_filled(json.loads(json.dumps({"sft": {"train": {"lr": 1}}})), today, ran)
    assert filled == {"sft": {"train": {"lr": 1, "micro_batch": 4}}}  # the field that did not exist stays absent
    assert unkeyed_filled({"sft": {"train": {}}}, today, None) == {"sft": {"train": {}}}
    with pytest.raises(StageKeyChangedError) as e:
        unkeyed_filled({"sft": {"train": {"lr": 1}}}, today, UNTOLD, stage="sft")
    assert e.value.exit_code == 52
    assert "recorded before config sft.train.micro_batch was keyed" in str(e.value)
    assert e.value.hint.startswith("pass --restart-stage sft ")
    spec = StageSpec(name="sft", fn="m:f", config=("sft",))
    old = upgrade_parts(spec, {"config": {"sft": {"train": {"lr": 1}}}}, {"config": today}, ran)
    assert old["config"]["sft"]["train"]["micro_batch"] == 4


def test_the_config_a_stage_ran_with_is_runs_only_where_its_digest_is_the_records(tmp_path):
    ran = {"sft": {"train": {"micro_batch": 8}}}
    latest = {"sft": {"train": {"micro_batch": 4}}}  # a later invocation's
    rec = {"status": "complete", "lineage": {"config_sha256": json_sha256(ran)}}
    statement = tmp_path / "sft.intoto.json"
    assert ran_with_config(rec, ran, statement) == ran
    assert ran_with_config(rec, latest, statement) is UNTOLD  # no statement: cannot be told
    body = {"predicate": {"buildDefinition": {"externalParameters": {"config": ran}}}}
    statement.write_text(json.dumps(body))
    assert ran_with_config(rec, latest, statement) == ran
    other = {"status": "complete", "lineage": {"config_sha256": json_sha256(latest)}}
    assert ran_with_config(other, {}, statement) is UNTOLD
    told = ran_with_config({"status": "complete"}, ran, statement)  # a record without its config's digest
    assert isinstance(told, Untold) and "holds no digest of the config it ran with" in told.why


def test_an_unfinished_record_tells_its_config_by_its_own_digest_not_a_previous_completions(tmp_path):
    """audit56 review3 T2: a `running` record keeps the `lineage` of the completion before it (another invocation's
    config, maybe another micro_batch); the digest the killed invocation wrote into it is the one to trust."""
    ran = {"sft": {"train": {"micro_batch": 8}}}
    statement = tmp_path / "sft.intoto.json"
    stale = {"status": "running", "lineage": {"config_sha256": json_sha256(ran)}}
    assert isinstance(ran_with_config(stale, ran, statement), Untold)
    assert ran_with_config({**stale, "config_sha256": json_sha256(ran)}, ran, statement) == ran


def test_a_checkpoint_reads_the_train_config_its_stage_setup_recorded(tmp_path):
    step = tmp_path / "checkpoints" / "step_2"
    step.mkdir(parents=True)
    assert setup_train(step) is None
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "train_config.json").write_text(json.dumps({"micro_batch": 4}))
    assert setup_train(step) == {"micro_batch": 4}
    (tmp_path / "policy_setup.json").write_text(json.dumps({"stage": {"train": {"micro_batch": 8}}}))
    assert setup_train(step) == {"micro_batch": 8}


def _strip_micro_batch(run):
    """Make `run` read as yesterday's code left it: no micro_batch in the stage key or the checkpoints' resume keys."""
    state = json.loads((run / "run.json").read_text())
    rec = state["stages"]["sft"]
    del rec["key_parts"]["config"]["sft"]["train"]["micro_batch"]
    rec["key"] = json_sha256(rec["key_parts"])
    (run / "run.json").write_text(json.dumps(state))
    manifests = sorted((run / "sft/checkpoints").glob("step_*/manifest.json"))
    assert manifests
    for path in manifests:
        manifest = json.loads(path.read_text())
        manifest["resume_key"].pop("micro_batch", None)
        path.write_text(json.dumps(manifest))


@pytest.mark.slow
def test_a_run_recorded_before_micro_batch_was_keyed_resumes_and_a_changed_one_is_refused(tmp_path):
    from reproduction.sim.generate import GenConfig, generate_dataset

    bundle = tmp_path / "bundle"
    generate_dataset(
        GenConfig(kind="sft", tasks=("FetchPush-v4",), episodes_per_task=3, cameras=()), bundle / "data" / "sft"
    )
    common = ("run", str(bundle), "--config", str(CONFIG), "--output", "run", "--stages", "sft")
    tiny = ("sft.train.max_steps=2", "sft.train.global_batch=8", "sft.train.log_interval=1")
    made = portable(*common, *tiny, "sft.train.micro_batch=8", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    _strip_micro_batch(tmp_path / "run")
    refused = portable(*common, "--resume", *tiny, "sft.train.micro_batch=4", cwd=tmp_path)
    assert refused.returncode == 52, refused.stderr
    assert "config.sft.train.micro_batch: 8 -> 4" in refused.stderr
    same = portable(*common, "--resume", *tiny, "sft.train.micro_batch=8", cwd=tmp_path)
    assert same.returncode == 0, same.stderr
    assert "sft    skipped" in same.stderr
    _strip_micro_batch(tmp_path / "run")  # the skip recorded today's key: take it out again for the checkpoint load
    more = portable(*common, "--resume", "--target-step", "3", *tiny, "sft.train.micro_batch=8", cwd=tmp_path)
    assert more.returncode == 0, more.stderr
    assert "resumed from step 2" in more.stdout + more.stderr
    state = json.loads((tmp_path / "run/run.json").read_text())
    assert state["stages"]["sft"]["step"] == 3
    assert state["stages"]["sft"]["key_parts"]["config"]["sft"]["train"]["micro_batch"] == 8


@pytest.mark.slow
def test_a_later_invocations_config_is_not_taken_for_the_one_an_old_record_ran_with(tmp_path):
    """audit56 review2 S1 (its stale_config.sh): sft trained with micro_batch 8; the record lacks it and run.json's
    config says 4 (a later old-code invocation's). A resume with 4 was skipped and recorded 4; now the statement's
    config (8, its digest the record's) is what it ran with; with the statement gone, nothing says: refused."""
    from reproduction.sim.generate import GenConfig, generate_dataset

    bundle = tmp_path / "bundle"
    generate_dataset(
        GenConfig(kind="sft", tasks=("FetchPush-v4",), episodes_per_task=3, cameras=()), bundle / "data" / "sft"
    )
    common = ("run", str(bundle), "--config", str(CONFIG), "--output", "run", "--stages", "sft")
    tiny = ("sft.train.max_steps=2", "sft.train.global_batch=8", "sft.train.log_interval=1")
    made = portable(*common, *tiny, "sft.train.micro_batch=8", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    run = tmp_path / "run"
    _strip_micro_batch(run)
    state = json.loads((run / "run.json").read_text())
    state["config"]["sft"]["train"]["micro_batch"] = 4
    (run / "run.json").write_text(json.dumps(state))
    wrong = portable(*common, "--resume", *tiny, "sft.train.micro_batch=4", cwd=tmp_path)
    assert wrong.returncode == 52, wrong.stderr
    assert "config.sft.train.micro_batch: 8 -> 4" in wrong.stderr
    assert (
        "micro_batch"
        not in json.loads((run / "run.json").read_text())["stages"]["sft"]["key_parts"]["config"]["sft"]["train"]
    )
    (run / "lineage" / "sft.intoto.json").unlink()
    untold = portable(*common, "--resume", *tiny, "sft.train.micro_batch=8", cwd=tmp_path)
    assert untold.returncode == 52, untold.stderr
    assert "recorded before config sft.train.micro_batch was keyed" in untold.stderr
    assert "--restart-stage sft" in untold.stderr


@dataclass(kw_only=True, slots=True)
class _Train:
    steps: int = 2
    micro: int = 8
    lr: float = 0.5


@dataclass(kw_only=True, slots=True)
class _Cfg:
    train: _Train = field(default_factory=_Train)
    note: str = "a"


KILLS: list[int] = []


def _train_stage(ctx: StageContext) -> StageOutput:
    if KILLS:
        KILLS.pop()
        raise KeyboardInterrupt  # killed mid-run, before anything completed
    out = ctx.out_dir / "model.txt"
    out.write_text(f"{ctx.config.train.micro}\n")
    return StageOutput(files=[out], step=ctx.config.train.steps)


def _note_stage(ctx: StageContext) -> StageOutput:
    out = ctx.out_dir / "note.txt"
    out.write_text(ctx.config.note + "\n")
    return StageOutput(files=[out])


_TRAIN = StageSpec(name="train", fn=f"{__name__}:_train_stage", config=("train",), inputs=False, training="train.steps")
_NOTE = StageSpec(name="note", fn=f"{__name__}:_note_stage", config=("note",), inputs=False, needs=("train",))


def _unkey_micro(run, drop: tuple[str, ...] = ()):
    """Make stage train's record read as one written before train.micro was keyed (and without `drop`)."""
    doc = json.loads((run / "run.json").read_text())
    rec = doc["stages"]["train"]
    del rec["key_parts"]["config"]["train"]["micro"]
    rec["key"] = json_sha256(rec["key_parts"])
    for k in drop:
        rec.pop(k, None)
    (run / "run.json").write_text(json.dumps(doc))
    return doc


def _resume(run, micro: int, **kw):
    opts = RunOptions(inputs={}, resume=True, **kw)
    return [
        (s.name, s.action)
        for s in run_recipe(Recipe(name="t", stages=(_TRAIN,)), _Cfg(train=_Train(micro=micro)), run, opts).stages
    ]


def test_a_training_stage_killed_on_its_first_run_resumes_by_the_config_its_running_record_names(tmp_path):
    """audit56 review3 T1: a stage killed on its first run kept no `lineage`, so a field keyed after it was written
    could not be told and every such --resume was refused (exit 52, blaming a later invocation's config). Its
    `running` record now names the digest of the config it runs with."""
    run = tmp_path / "run"
    KILLS[:] = [1]
    with pytest.raises(KeyboardInterrupt):
        run_recipe(Recipe(name="t", stages=(_TRAIN,)), _Cfg(), run, RunOptions(inputs={}))
    doc = _unkey_micro(run)
    assert doc["stages"]["train"]["status"] == "interrupted"
    assert doc["stages"]["train"]["config_sha256"] == json_sha256(doc["config"])
    with pytest.raises(StageKeyChangedError) as e:
        _resume(run, micro=4)
    assert e.value.exit_code == 52 and "config.train.micro: 8 -> 4" in str(e.value)
    assert _resume(run, micro=8) == [("train", "continued")]


def test_an_old_killed_training_stage_reads_its_setup_or_is_refused_naming_the_cause(tmp_path):
    """audit56 review3 T1: a killed record from before records named their config's digest takes the value from the
    stage's setup files (the rule its checkpoints resume by); with none, the refusal says so (not "a later
    invocation's config")."""
    run = tmp_path / "run"
    KILLS[:] = [1]
    with pytest.raises(KeyboardInterrupt):
        run_recipe(Recipe(name="t", stages=(_TRAIN,)), _Cfg(), run, RunOptions(inputs={}))
    _unkey_micro(run, drop=("config_sha256",))
    with pytest.raises(StageKeyChangedError) as e:
        _resume(run, micro=8)
    assert str(e.value) == (
        "stage train: it was recorded before config train.micro was keyed, and neither its record nor its setup "
        "files say which value it ran with"
    )
    assert e.value.exit_code == 52 and e.value.hint == "pass --restart-stage train to redo it (and what follows)"
    (run / "train" / "policy_setup.json").write_text(json.dumps({"stage": {"train": {"micro": 8, "lr": 0.5}}}))
    with pytest.raises(StageKeyChangedError, match=r"config\.train\.micro: 8 -> 4"):
        _resume(run, micro=4)
    assert _resume(run, micro=8) == [("train", "continued")]


def test_a_left_out_stages_lost_statement_is_not_restated_by_a_later_invocations_config(tmp_path, capsys):
    """audit56 review3 T3: `--stages note --resume` with train's statement lost filled train.micro, which train's key
    lacks, from run.json's config (the latest invocation's, micro 4), and wrote the statement again for a stage
    that ran with 8. It reads the config the record names (`stage_ran_with`), here untold: named, not written."""
    two = Recipe(name="t", stages=(_TRAIN, _NOTE))
    run = tmp_path / "run"
    KILLS.clear()
    run_recipe(two, _Cfg(), run, RunOptions(inputs={}, recorder=make_recorder(None)))
    doc = _unkey_micro(run)
    doc["config"]["train"]["micro"] = 4  # what a later `--stages note` with micro 4 left in run.json
    (run / "run.json").write_text(json.dumps(doc))
    (run / "lineage" / "train.intoto.json").unlink()
    capsys.readouterr()
    opts = RunOptions(inputs={}, resume=True, stages=["note"], recorder=make_recorder(None))
    report = run_recipe(two, _Cfg(train=_Train(micro=4)), run, opts)
    assert [(s.name, s.action) for s in report.stages] == [("note", "skipped")]
    assert capsys.readouterr().err == (
        "train: its lineage statement lineage/train.intoto.json is missing and cannot be written again (which config "
        "it ran with cannot be told); --restart-stage train redoes the stage and writes it\n"
    )
    assert not (run / "lineage" / "train.intoto.json").exists()
