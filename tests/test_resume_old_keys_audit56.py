"""audit56 R1: a run folder recorded before a field entered the keys (`train.micro_batch`, audit56 D1) resumes: a
stage key or checkpoint resume key without the field reads as "not recorded" (the stage key takes the value the run
config recorded), while a value that differs from the recorded one is still refused (exit 52) naming both."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
from test_grpo_cli import CONFIG, portable

from reproduction.config_fields import added_field, unrecorded_filled
from reproduction.digests import json_sha256
from reproduction.recipe import StageSpec
from reproduction.run.stage_keys import NO_CONFIG, unkeyed_filled, upgrade_parts


@dataclass
class _Old:
    lr: float = 0.1
    micro: int = 2
    new: str = field(default="off", metadata=added_field())


def test_a_resume_key_without_a_field_reads_it_as_not_recorded_and_an_added_one_as_its_default():
    today = {"lr": 0.1, "micro": 8, "new": "on"}
    assert unrecorded_filled(_Old, {"lr": 0.1}, today) == {"lr": 0.1, "micro": 8, "new": "off"}
    assert unrecorded_filled(_Old, {"lr": 0.1, "micro": 4}, today)["micro"] == 4  # recorded: compared as before


def test_a_stage_key_without_a_config_key_takes_the_recorded_configs_value():
    today = {"sft": {"train": {"lr": 1, "micro_batch": 8, "added": "on"}}}
    ran = {"sft": {"train": {"lr": 1, "micro_batch": 4}}}
    filled = unkeyed_filled(json.loads(json.dumps({"sft": {"train": {"lr": 1}}})), today, ran)
    assert filled == {"sft": {"train": {"lr": 1, "micro_batch": 4}}}  # the field that did not exist stays absent
    assert unkeyed_filled({"sft": {"train": {}}}, today, NO_CONFIG) == today
    assert unkeyed_filled({"sft": {"train": {}}}, today, None) == {"sft": {"train": {}}}
    spec = StageSpec(name="sft", fn="m:f", config=("sft",))
    old = upgrade_parts(spec, {"config": {"sft": {"train": {"lr": 1}}}}, {"config": today}, ran)
    assert old["config"]["sft"]["train"]["micro_batch"] == 4


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
