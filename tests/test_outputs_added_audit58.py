"""A file added by hand to a completed stage's folder that its `outputs` globs match (audit58 B2): `--resume` refused
edited and deleted recorded outputs (exit 52) but skipped a new shard file, and a redo of the stage downstream read
it by glob and gave another result while its upstream stage stood "complete, unchanged". Now an unrecorded match is
a change like an edit (exit 52, "... was added"), found by the same glob walk the record is made with. A graceful stop
of a continuation that added such a file (a checkpoint) leaves the stage `failed`, not its old complete record,
so `--resume` continues it rather than refusing. A tiny out-of-tree recipe defined here, run through `portable run`
in this process."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from reproduction.recipe import Recipe, StageContext, StageOutput, StageSpec


@dataclass(kw_only=True)
class Train:
    steps: int = 2
    """Steps to train."""


@dataclass(kw_only=True)
class AddedConfig:
    RUN: str = ""
    train: Train = field(default_factory=Train)


def shards_stage(ctx: StageContext) -> StageOutput:
    folder = ctx.out_dir / "shards"
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for i in range(3):
        (folder / f"s{i}.json").write_text(json.dumps({"v": i + 1}))
        files.append(folder / f"s{i}.json")
    (folder / "notes.txt").write_text("not an output: no glob matches it\n")
    return StageOutput(files=files, summary={})


def total_stage(ctx: StageContext) -> StageOutput:
    shards = ctx.out_dir.parent / "shards" / "shards"
    total = sum(json.loads(p.read_text())["v"] for p in sorted(shards.glob("*.json")))  # reads by glob, as B2's did
    (ctx.out_dir / "total.json").write_text(json.dumps({"total": total}))
    return StageOutput(files=[ctx.out_dir / "total.json"], summary={"total": total})


FAIL = False


def train_stage(ctx: StageContext) -> StageOutput:
    steps = ctx.target_step or ctx.config.train.steps
    ckpts = ctx.out_dir / "checkpoints"
    ckpts.mkdir(parents=True, exist_ok=True)
    done = max((int(p.stem.split("_")[1]) for p in ckpts.glob("step_*.json")), default=0) if ctx.resume else 0
    for step in range(done + 1, steps + 1):
        (ckpts / f"step_{step}.json").write_text(json.dumps({"step": step}))
    if FAIL:  # a stop after the continuation's checkpoints were written (set by the test)
        raise RuntimeError("stopped after its checkpoints")
    (ctx.out_dir / "weights.json").write_text(json.dumps({"step": steps}))
    files = [ctx.out_dir / "weights.json", *sorted(ckpts.glob("*.json"))]
    return StageOutput(files=files, summary={}, step=steps, resumed_from=done or None)


RECIPE = Recipe(
    name="added58",
    config_schema=f"{__name__}:AddedConfig",
    stages=(
        StageSpec(name="shards", fn=f"{__name__}:shards_stage", inputs=False, outputs=("shards/*.json",)),
        StageSpec(name="total", fn=f"{__name__}:total_stage", needs=("shards",), inputs=False, outputs=("*.json",)),
    ),
)
TRAINING = Recipe(
    name="added58t",
    config_schema=f"{__name__}:AddedConfig",
    stages=(
        StageSpec(
            name="train",
            fn=f"{__name__}:train_stage",
            config=("train",),
            training="train.steps",
            inputs=False,
            outputs=("weights.json", "checkpoints/*.json"),
        ),
    ),
)


def _portable(capsys, tmp_path: Path, recipe: str, *args: str) -> tuple[int, list[str]]:
    from reproduction.portable import main

    config = tmp_path / f"{recipe}.yaml"
    config.write_text(f"recipe: {__name__}:{recipe}\n")
    capsys.readouterr()
    code = main(["-q", "run", "--config", str(config), *args])
    return code, capsys.readouterr().err.splitlines()


def test_a_file_added_to_a_complete_stages_glob_is_refused_on_resume_like_an_edit(tmp_path, capsys):
    run = tmp_path / "run"
    assert _portable(capsys, tmp_path, "RECIPE", "--output", str(run)) == (0, [])
    assert json.loads((run / "total" / "total.json").read_text()) == {"total": 6}
    (run / "shards" / "shards" / "notes2.txt").write_text("no glob matches it: no change\n")
    assert _portable(capsys, tmp_path, "RECIPE", "--output", str(run), "--resume") == (0, [])

    (run / "shards" / "shards" / "s9.json").write_text(json.dumps({"v": 100}))
    code, err = _portable(capsys, tmp_path, "RECIPE", "--output", str(run), "--resume")
    assert (code, err) == (
        52,
        [
            "error: stage shards: its outputs changed after it completed: shards/s9.json was added",
            "hint: pass --restart-stage shards to redo it",
        ],
    )
    assert json.loads((run / "total" / "total.json").read_text()) == {"total": 6}  # nothing redone
    # the hint's redo starts the stage's folder afresh and records what it writes
    code, err = _portable(capsys, tmp_path, "RECIPE", "--output", str(run), "--restart-stage", "shards")
    assert code == 0, err
    assert sorted(json.loads((run / "run.json").read_text())["stages"]["shards"]["outputs"]) == [
        "shards/s0.json",
        "shards/s1.json",
        "shards/s2.json",
    ]
    assert _portable(capsys, tmp_path, "RECIPE", "--output", str(run), "--resume") == (0, [])


def test_edits_deletions_and_additions_are_named_together(tmp_path, capsys):
    run = tmp_path / "run"
    assert _portable(capsys, tmp_path, "RECIPE", "--output", str(run)) == (0, [])
    shards = run / "shards" / "shards"
    (shards / "s0.json").write_text(json.dumps({"v": 10}))  # another size
    (shards / "s1.json").unlink()
    (shards / "s7.json").write_text("{}")
    (shards / "s8.json").write_text("{}")
    code, err = _portable(capsys, tmp_path, "RECIPE", "--output", str(run), "--resume")
    assert code == 52
    assert err[0] == (
        "error: stage shards: its outputs changed after it completed: shards/s0.json was modified; "
        "shards/s1.json is missing; shards/s7.json was added; shards/s8.json was added"
    )


def test_a_stopped_continuation_that_added_checkpoints_is_continued_not_refused(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    assert _portable(capsys, tmp_path, "TRAINING", "--output", str(run)) == (0, [])
    monkeypatch.setattr(sys.modules[__name__], "FAIL", True)
    code, err = _portable(capsys, tmp_path, "TRAINING", "--output", str(run), "--resume", "train.steps=4")
    monkeypatch.undo()
    assert code != 0 and "stopped after its checkpoints" in "\n".join(err), err
    rec = json.loads((run / "run.json").read_text())["stages"]["train"]
    # its recorded files are unchanged, but step_3/step_4 now match its globs: the old complete record is not put back
    assert rec["status"] == "failed"
    code, err = _portable(capsys, tmp_path, "TRAINING", "--output", str(run), "--resume", "train.steps=4")
    assert code == 0, err
    rec = json.loads((run / "run.json").read_text())["stages"]["train"]
    assert (rec["status"], rec["step"]) == ("complete", 4)
    assert sorted(rec["outputs"]) == [f"checkpoints/step_{i}.json" for i in range(1, 5)] + ["weights.json"]
