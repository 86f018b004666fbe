"""audit53 U1: a resumed training stage's lineage names the checkpoint it loaded (`<stage>/checkpoints/step_<n>`)
with the digest the trainer took when it loaded it, not a digest of the checkpoints folder at the end of the stage
(keep-last has pruned the loaded one by then, and every later save changed that digest)."""

from __future__ import annotations

import functools
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import train_tiny

from reproduction.recipe import Recipe, StageContext, StageOutput, StageSpec
from reproduction.run.lineage import tree_sha256
from reproduction.run.lineage_check import verify_lineage
from reproduction.run.record import make_recorder
from reproduction.run.runner import RunOptions, read_state, run_recipe
from reproduction.train.api import train

STEPS, KILLED_AT = 8, 4


@dataclass(kw_only=True, slots=True)
class Cfg:
    steps: int = STEPS


def trainer(ctx: StageContext) -> StageOutput:
    """Trains the tiny MLP; while `die_after` exists it stops at step KILLED_AT and fails (a killed first attempt)."""
    die = ctx.run_dir.parent / "die_after"
    steps = KILLED_AT if die.exists() else ctx.config.steps
    config = train_tiny.config(
        world_size=1, launcher="inprocess", max_steps=steps, save_interval=2, eval_interval=0, keep_last=2
    )
    result = train(functools.partial(train_tiny.make_task), config, out_dir=ctx.out_dir, resume=ctx.resume)
    if die.exists():
        die.unlink()
        raise RuntimeError("killed after a checkpoint")
    return StageOutput(
        files=sorted(p for p in result.export_dir.rglob("*") if p.is_file()),
        step=result.step,
        resumed_from=result.resumed_from,
        resumed_from_path=result.resumed_from_dir,
        resumed_from_sha256=result.resumed_from_sha256,
    )


RECIPE = Recipe(
    name="tiny",
    stages=(StageSpec(name="rl", fn=f"{__name__}:trainer", config=("steps",), inputs=False, training="steps"),),
)


def _resumed_run(root: Path) -> tuple[Path, str]:
    """A run whose stage was killed after step_KILLED_AT and resumed to STEPS; returns it and the tree digest of
    step_KILLED_AT taken before the resume (what the resumed trainer loaded)."""
    run = root / "run"
    (root / "die_after").write_text("")
    opts = RunOptions(recorder=make_recorder(None))
    with pytest.raises(RuntimeError, match="killed after a checkpoint"):
        run_recipe(RECIPE, Cfg(), run, opts)
    loaded = run / "rl" / "checkpoints" / f"step_{KILLED_AT}"
    digest = tree_sha256(loaded)
    run_recipe(RECIPE, Cfg(), run, RunOptions(recorder=make_recorder(None), resume=True))
    return run, digest


def _checkpoint_dependency(run: Path) -> tuple[dict, dict]:
    statement = json.loads((run / "lineage" / "rl.intoto.json").read_text())
    build = statement["predicate"]["buildDefinition"]
    deps = [d for d in build["resolvedDependencies"] if d["annotations"].get("role") == "checkpoint"]
    assert len(deps) == 1, deps
    return deps[0], build["internalParameters"]["resumed_from"]


def test_a_resumed_stage_names_the_checkpoint_it_loaded_with_its_load_time_digest(tmp_path):
    run, digest = _resumed_run(tmp_path)
    loaded = run / "rl" / "checkpoints" / f"step_{KILLED_AT}"
    assert not loaded.exists()  # keep_last=2: steps 6 and 8 remain, the loaded one is gone
    assert sorted(p.name for p in (run / "rl" / "checkpoints").glob("step_*")) == ["step_6", "step_8"]
    rec = read_state(run)["stages"]["rl"]
    assert (rec["status"], rec["step"], rec["resumed_from"]) == ("complete", STEPS, KILLED_AT)
    dep, resumed = _checkpoint_dependency(run)
    assert dep["name"] == f"rl/checkpoints/step_{KILLED_AT}"
    assert dep["digest"] == {"sha256": digest}
    assert (dep["annotations"]["kind"], dep["annotations"]["root"]) == ("tree", "run")
    assert resumed == {"name": dep["name"], "uri": dep["uri"], "digest": {"sha256": digest}}
    # run.json keeps it for a statement written again on --resume
    assert rec["lineage"]["resumed_from_path"] == str(loaded)
    assert rec["lineage"]["resumed_from_sha256"] == digest
    # a checkpoint keep-last pruned is no verify failure
    report = verify_lineage(run)
    assert report.problems == [] and report.exit_code == 0, report.problems


def test_a_lost_statement_written_again_keeps_the_load_time_digest(tmp_path):
    run, digest = _resumed_run(tmp_path)
    before = (run / "lineage" / "rl.intoto.json").read_bytes()
    (run / "lineage" / "rl.intoto.json").unlink()
    run_recipe(RECIPE, Cfg(), run, RunOptions(recorder=make_recorder(None), resume=True))
    dep, _ = _checkpoint_dependency(run)
    assert (dep["name"], dep["digest"]["sha256"]) == (f"rl/checkpoints/step_{KILLED_AT}", digest)
    assert (
        json.loads((run / "lineage" / "rl.intoto.json").read_bytes())["predicate"]["buildDefinition"][
            "resolvedDependencies"
        ]
        == json.loads(before)["predicate"]["buildDefinition"]["resolvedDependencies"]
    )


def test_two_identical_resumes_record_the_same_digest_only_from_the_same_checkpoint_bytes(tmp_path):
    """What was found: the digest covers manifest.json, whose `created` timestamp (one-second resolution) differs
    between two separately trained runs, so two fresh runs record the same digest only when their checkpoints were
    written in the same second; two resumes of the same killed run folder (a copy: same checkpoint bytes) record the
    same digest, and the same statement dependency."""
    copy = tmp_path / "b" / "run"
    # the killed state again: the first attempt's folder, copied before any resume
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "die_after").write_text("")
    with pytest.raises(RuntimeError):
        run_recipe(RECIPE, Cfg(), copy, RunOptions(recorder=make_recorder(None)))
    twin = tmp_path / "b" / "twin"
    shutil.copytree(copy, twin, symlinks=True)
    loaded = tree_sha256(copy / "rl" / "checkpoints" / f"step_{KILLED_AT}")
    for folder in (copy, twin):
        run_recipe(RECIPE, Cfg(), folder, RunOptions(recorder=make_recorder(None), resume=True))
    first, second = _checkpoint_dependency(copy)[0], _checkpoint_dependency(twin)[0]
    assert first["digest"] == second["digest"] == {"sha256": loaded}
    assert first["name"] == second["name"] == f"rl/checkpoints/step_{KILLED_AT}"
    created = json.loads((copy / "rl" / "checkpoints" / "step_8" / "manifest.json").read_text())["created"]
    assert created.endswith("Z")  # the timestamp the digest covers


GOOD = "a" * 64
BAD_CHECKPOINTS = {  # mode: (resumed_from_path relative to the stage folder, or an absolute one, sha256, words)
    "upper": ("checkpoints/step_1", "A" * 64, "resumed_from_sha256 is str 'AAAA"),
    "prefixed": ("checkpoints/step_1", "sha256:" + GOOD, "resumed_from_sha256 is str 'sha256:aaaa"),
    "short": ("checkpoints/step_1", "NOTHEX", "resumed_from_sha256 is str 'NOTHEX', expected a sha256"),
    "bytes": ("checkpoints/step_1", bytes.fromhex(GOOD), "resumed_from_sha256 is bytes b'"),
    "number": ("checkpoints/step_1", 5, "resumed_from_sha256 is int 5, expected a sha256 (64 lowercase hex digits)"),
    "no_path": (None, GOOD, f"resumed_from_sha256 is str '{GOOD}', but its resumed_from_path is None"),
    "outside": ("/", GOOD, "resumed_from_path is str '/', not inside the run folder"),
    "not_a_path": (7, None, "resumed_from_path is int 7, expected a path or None"),
}


@dataclass(kw_only=True, slots=True)
class ModeCfg:
    steps: int = 2
    mode: str = "ok"
    """Not in the stage's key (config=("steps",)): the good answer then resumes the refused stage."""


def claims_a_checkpoint(ctx: StageContext) -> StageOutput:
    """A stage that names the checkpoint it continued from as BAD_CHECKPOINTS[mode] says (mode ok: a good one)."""
    ck = ctx.out_dir / "checkpoints" / "step_1"
    ck.mkdir(parents=True, exist_ok=True)
    (ck / "w").write_text("w")
    (ctx.out_dir / "w.txt").write_text("x")
    path, sha, _ = BAD_CHECKPOINTS.get(ctx.config.mode, ("checkpoints/step_1", GOOD, ""))
    if isinstance(path, str):
        path = ctx.out_dir / path
    return StageOutput(
        files=[ctx.out_dir / "w.txt"], step=2, resumed_from=1, resumed_from_path=path, resumed_from_sha256=sha
    )


CLAIMING = Recipe(
    name="tiny",
    stages=(
        StageSpec(name="rl", fn=f"{__name__}:claims_a_checkpoint", config=("steps",), inputs=False, training="steps"),
    ),
)


@pytest.mark.parametrize("mode", list(BAD_CHECKPOINTS))
def test_a_resumed_checkpoint_digest_that_is_no_sha256_is_exit_54_and_the_run_still_reads(tmp_path, mode):
    """audit53 R3: a resumed_from_sha256 that was no 64 lowercase hex ran to `complete`, the statement recorded it,
    and every later read of run.json refused the folder (exit 55): the run could be neither resumed nor reported."""
    from reproduction.errors import StageProtocolError

    run = tmp_path / "run"
    with pytest.raises(StageProtocolError) as err:
        run_recipe(CLAIMING, ModeCfg(mode=mode), run, RunOptions(recorder=make_recorder(None)))
    message = str(err.value)
    assert err.value.exit_code == 54 and "\n" not in message
    assert message.startswith(f"recipe tiny: stage rl ({__name__}:claims_a_checkpoint) returned a StageOutput whose ")
    assert BAD_CHECKPOINTS[mode][2] in message, message
    assert "resumed_from" in err.value.hint
    assert not (run / "lineage" / "rl.intoto.json").exists()
    assert read_state(run)["stages"]["rl"]["status"] == "failed"
    # the folder still reads, and a good answer completes it
    run_recipe(CLAIMING, ModeCfg(mode="ok"), run, RunOptions(recorder=make_recorder(None), resume=True))
    rec = read_state(run)["stages"]["rl"]
    assert (rec["status"], rec["lineage"]["resumed_from_sha256"]) == ("complete", GOOD)
    assert rec["lineage"]["resumed_from_path"] == str(run / "rl" / "checkpoints" / "step_1")
