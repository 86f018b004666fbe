"""A resumed run's refusal names the --config layers it was made with that the command leaves out (audit51 I4: after
`portable demo --recipe grpo --quick`, `portable run BUNDLE --resume --target-step N` without config/quick.yaml was
told to retrain sft at full size). On docs/recipes.md's example recipe through `portable run` (no training), and
missing_layers itself."""

from __future__ import annotations

import hashlib
import json

import pytest
from recipe_cli import run_portable
from test_recipe_guide import _block


@pytest.fixture
def guide(tmp_path):
    (tmp_path / "myrecipe.py").write_text(_block("module"))
    (tmp_path / "my.yaml").write_text(_block("config"))
    (tmp_path / "quick.yaml").write_text("train: {steps: 3}\n")
    (tmp_path / "data.txt").write_text("some data\n")
    return tmp_path.resolve()


def test_a_target_step_refusal_names_the_config_layer_the_resume_left_out(guide):
    made = run_portable(guide, "run", "--config", "my.yaml", "--config", "quick.yaml", "--output", "runs/q")
    assert made.returncode == 0, made.stderr
    state = json.loads((guide / "runs/q/run.json").read_text())
    sha = {n: hashlib.sha256((guide / n).read_bytes()).hexdigest() for n in ("my.yaml", "quick.yaml")}
    assert state["stages"]["train"]["config_files"] == [
        [str(guide / "my.yaml"), sha["my.yaml"]],
        [str(guide / "quick.yaml"), sha["quick.yaml"]],
    ]
    before = (guide / "runs/q/run.json").read_bytes()

    refused = run_portable(guide, "run", "--config", "my.yaml", "--output", "runs/q", "--resume", "--target-step", "2")
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.splitlines() == [
        "error: --target-step 2 asks for no more steps, but the config raises stage train's train.steps to 6, above "
        "the 3 steps it trained (nothing was run)",
        f"hint: this run was made with --config {guide / 'quick.yaml'} (layer 2), which this command does not pass: "
        f"pass the same --config layers (--config {guide / 'my.yaml'} --config {guide / 'quick.yaml'}); or drop "
        "--target-step to train on to train.steps=6 (--resume), or pass --target-step 6 or more",
    ]
    assert (guide / "runs/q/run.json").read_bytes() == before

    # with both layers again the target asks for no more than the 3 steps trained: skipped, as the hint says
    both = ("--config", "my.yaml", "--config", "quick.yaml")
    again = run_portable(guide, "run", *both, "--output", "runs/q", "--resume", "--target-step", "2", "--json")
    assert again.returncode == 0, again.stderr
    assert [s["action"] for s in json.loads(again.stdout)["stages"]] == ["skipped", "skipped"]


def test_a_changed_input_refusal_names_the_missing_layer_too(guide):
    (guide / "lr.yaml").write_text("train: {lr: 0.25}\n")
    made = run_portable(guide, "run", "--config", "my.yaml", "--config", "lr.yaml", "--output", "runs/l")
    assert made.returncode == 0, made.stderr
    refused = run_portable(guide, "run", "--config", "my.yaml", "--output", "runs/l", "--resume")
    assert refused.returncode == 52, refused.stderr
    assert f"hint: this run was made with --config {guide / 'lr.yaml'} (layer 2), which this command" in refused.stderr


def test_a_run_folder_from_before_the_field_keeps_the_old_hint(guide):
    made = run_portable(guide, "run", "--config", "my.yaml", "--config", "quick.yaml", "--output", "runs/o")
    assert made.returncode == 0, made.stderr
    path = guide / "runs/o/run.json"
    state = json.loads(path.read_text())
    for rec in state["stages"].values():
        rec.pop("config_files")
    path.write_text(json.dumps(state))
    refused = run_portable(guide, "run", "--config", "my.yaml", "--output", "runs/o", "--resume", "--target-step", "2")
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.splitlines()[-1] == (
        "hint: drop --target-step to train on to train.steps=6 (--resume), or pass --target-step 6 or more"
    )


def test_a_layer_with_the_same_bytes_elsewhere_is_not_missing(tmp_path):
    """A bundle restored into another folder keeps its layers' bytes: they count as given."""
    from reproduction.run.stage_decide import layers_hint, missing_layers

    a, b, moved = tmp_path / "run.yaml", tmp_path / "quick.yaml", tmp_path / "elsewhere.yaml"
    a.write_text("x: 1\n")
    b.write_text("y: 2\n")
    moved.write_bytes(b.read_bytes())
    rec = {"config_files": [[str(a), hashlib.sha256(b"x: 1\n").hexdigest()], [str(b), "0" * 64]]}
    rec["config_files"][1][1] = hashlib.sha256(b"y: 2\n").hexdigest()
    assert missing_layers([rec], [str(a), str(moved)]) == []
    assert missing_layers([rec], [str(a)]) == [(str(b), 2, [str(a), str(b)])]
    assert missing_layers([rec], None) == [] and missing_layers([{}], [str(a)]) == []
    assert layers_hint([]) == ""


def test_a_wrongly_shaped_config_files_record_is_refused_naming_the_field(guide):
    made = run_portable(guide, "run", "--config", "my.yaml", "--output", "runs/s")
    assert made.returncode == 0, made.stderr
    path = guide / "runs/s/run.json"
    state = json.loads(path.read_text())
    state["stages"]["train"]["config_files"] = "my.yaml"
    path.write_text(json.dumps(state))
    refused = run_portable(guide, "run", "--config", "my.yaml", "--output", "runs/s", "--resume")
    assert refused.returncode == 55, refused.stderr
    assert "stages.train.config_files is a string, expected a list of [path, sha256] pairs" in refused.stderr


# `portable run`, with the config layer edited right after the CLI read it (as a user preparing the next run
# while a long stage trains would): the record must keep the bytes the run was configured with
EDIT_AFTER_LOAD = """
import sys
from pathlib import Path
import reproduction.run.resolve as resolve

real = resolve.load_run_config


def load_then_edit(files, *args, **kwargs):
    out = real(files, *args, **kwargs)
    Path("quick.yaml").write_text("train: {steps: 5}\\n")
    return out


resolve.load_run_config = load_then_edit
from reproduction.portable import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_layer_edited_after_it_was_read_is_recorded_as_read(guide):
    """audit52 review R8: the sha256 was taken when each stage completed, so it named the edited bytes."""
    read = hashlib.sha256((guide / "quick.yaml").read_bytes()).hexdigest()
    args = ("run", "--config", "my.yaml", "--config", "quick.yaml", "--output", "runs/e")
    made = run_portable(guide, *args, program=("-c", EDIT_AFTER_LOAD))
    assert made.returncode == 0, made.stderr
    assert (guide / "quick.yaml").read_text() == "train: {steps: 5}\n"  # the seam did edit it
    state = json.loads((guide / "runs/e/run.json").read_text())
    assert state["stages"]["train"]["config_files"][1] == [str(guide / "quick.yaml"), read]


def test_a_layer_that_is_not_a_regular_file_is_not_read_again(tmp_path):
    """A pipe (`--config <(...)`, /dev/stdin) was consumed when the config was read: hashing it again would block
    (a FIFO with no writer) or hash nothing; its sha256 is recorded as "" and pairs pass through as given."""
    import os
    import threading

    from reproduction.run.stage_decide import config_layers

    fifo = tmp_path / "layer.yaml"
    os.mkfifo(fifo)
    got: list = []
    reader = threading.Thread(target=lambda: got.append(config_layers([str(fifo)])), daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive() and got == [[[str(fifo), ""]]]
    assert config_layers([("/x/a.yaml", "ab" * 32), ["/x/b.yaml", ""]]) == [["/x/a.yaml", "ab" * 32], ["/x/b.yaml", ""]]
