"""A resume to a max_steps below a killed longer run's checkpoints ends exactly at max_steps (audit55 G2), RECAP's
policy stage refuses modes that ended at different steps, and a stage trained to a --target-step records it in its
lineage (audit55 G1)."""

from __future__ import annotations

import functools
import json
import signal
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import train_tiny

from reproduction.errors import CheckpointError
from reproduction.recipe import Recipe, StageContext, StageOutput, StageSpec
from reproduction.recipes.recap import policy
from reproduction.train import checkpoint
from reproduction.train.api import train
from reproduction.train.metrics import read_records


def _inproc(**kw):
    return train_tiny.config(world_size=1, launcher="inprocess", eval_interval=0, **kw)


def _train_steps(out: Path) -> list[int]:
    return [r["step"] for r in read_records(out / "metrics.jsonl") if r["split"] == "train"]


def test_a_resume_below_newer_checkpoints_ends_at_max_steps_and_cuts_them_back(tmp_path):
    task = functools.partial(train_tiny.make_task, dropout=0.2)  # dropout: the torch RNG must carry over
    train(task, _inproc(max_steps=25, save_interval=10), out_dir=tmp_path / "straight", resume=False)
    cut = tmp_path / "cut"
    train(task, _inproc(max_steps=30, save_interval=10, log_interval=1), out_dir=cut, resume=False)
    root = cut / "checkpoints"
    assert checkpoint.complete_steps(root) == [10, 20, 30]
    result = train(task, _inproc(max_steps=25, save_interval=10, log_interval=1), out_dir=cut, resume=True)
    assert (result.resumed_from, result.step) == (20, 25)
    assert result.checkpoint_dir == root / "step_25"
    assert _train_steps(cut) == list(range(1, 26))  # trained 21..25, the log cut back from 30
    a, b = checkpoint.load_export(tmp_path / "straight" / "export"), checkpoint.load_export(cut / "export")
    assert all(torch.equal(a[k], b[k]) for k in a)
    # step_30 went with the steps of the log it stood for (audit55 review): a later resume to 30 trains 26..30
    assert checkpoint.complete_steps(root) == [10, 20, 25]
    assert (root / "LATEST").read_text() == "step_25\n" and not list(root.glob("*.pruned"))
    # resuming to 25 again trains nothing and reports step 25
    again = train(task, _inproc(max_steps=25, save_interval=10), out_dir=cut, resume=True)
    assert (again.resumed_from, again.step, again.checkpoint_dir) == (25, 25, root / "step_25")
    on = train(task, _inproc(max_steps=30, save_interval=10, log_interval=1), out_dir=cut, resume=True)
    assert (on.resumed_from, on.step) == (25, 30) and _train_steps(cut) == list(range(1, 31))


def test_a_refused_resume_below_newer_checkpoints_removes_none(tmp_path):
    """audit55 review2 C1: the cut-back ran before the load's checks, so a resume refused for a changed config had
    already removed step_30 for good."""
    task = functools.partial(train_tiny.make_task, dropout=0.0)
    train(task, _inproc(max_steps=30, save_interval=10), out_dir=tmp_path, resume=False)
    with pytest.raises(CheckpointError, match="config changed"):
        train(task, _inproc(max_steps=25, save_interval=10, lr=0.5), out_dir=tmp_path, resume=True)
    assert checkpoint.complete_steps(tmp_path / "checkpoints") == [10, 20, 30]


def test_a_resume_with_only_checkpoints_above_max_steps_is_refused(tmp_path):
    task = functools.partial(train_tiny.make_task, dropout=0.0)
    train(task, _inproc(max_steps=6, save_interval=3, keep_last=1), out_dir=tmp_path, resume=False)
    with pytest.raises(CheckpointError) as err:
        train(task, _inproc(max_steps=4, save_interval=3, keep_last=1), out_dir=tmp_path, resume=True)
    assert str(err.value.message) == (
        f"{tmp_path / 'checkpoints'} holds only step_6, above this run's max_steps 4 (keep_last 1); no complete "
        "checkpoint at or below it is left to resume from"
    )
    assert err.value.hint == (
        "train to step 6 or more (--target-step 6), or retrain the stage from scratch (--restart-stage)"
    )
    assert checkpoint.complete_steps(tmp_path / "checkpoints") == [6]


def test_policy_stage_refuses_modes_that_ended_at_different_steps(tmp_path, monkeypatch):
    import reproduction.recap.policy.task as policy_task

    ended = {"recap": 30, "bc": 25, "filtered_bc": 25}

    def fake_train(inputs, stage, out_dir, *, mode, **kw):
        export = Path(out_dir) / "export"
        return SimpleNamespace(
            files=[],
            step=ended[mode],
            resumed_from=20,
            resumed_from_dir=Path(out_dir) / "checkpoints" / "step_20",
            resumed_from_sha256="0" * 64,
            export_dir=export,
            train_metrics={},
            samples_per_s=0.0,
            summary={},
        )

    monkeypatch.setattr(policy_task, "train_policy", fake_train)
    monkeypatch.setattr(policy, "policy_config", lambda ctx, mode: ([], None, None))
    ctx = SimpleNamespace(
        config=SimpleNamespace(policy=SimpleNamespace(modes=list(ended), train=SimpleNamespace(launcher="inprocess"))),
        ray_for=lambda wanted: None,
        out_dir=tmp_path / "policy",
        run_dir=tmp_path,
        resume=True,
        ui=None,
        writers_lock=None,
    )
    with pytest.raises(CheckpointError) as err:
        policy.policy_stage(ctx)
    assert err.value.message == (
        f"{tmp_path / 'policy'}: the policy modes ended at different steps (recap 30, bc 25, filtered_bc 25); the "
        "stage is not recorded complete over mixed step counts"
    )


# -- G1: the --target-step a stage trained to is in its lineage ---------------------------------------------------

STOP = {"after_write": False}


@dataclass(kw_only=True)
class Policy:
    steps: int = 4


@dataclass(kw_only=True)
class ToyConfig:
    RUN: str = ""
    policy: Policy = field(default_factory=Policy)


def toy_policy_stage(ctx: StageContext) -> StageOutput:
    model = ctx.out_dir / "model.json"
    start = json.loads(model.read_text())["step"] if ctx.resume and model.is_file() else 0
    step = ctx.target_step or ctx.config.policy.steps
    model.write_text(json.dumps({"step": step, "from": start}))
    if STOP["after_write"]:
        raise KeyboardInterrupt("SIGTERM")
    return StageOutput(files=[model], summary={}, step=step, resumed_from=start or None)


def toy_evaluate(args, run_dir, state, ui) -> int:
    return 0


RECIPE = Recipe(
    name="toy",
    config_schema=f"{__name__}:ToyConfig",
    evaluate=f"{__name__}:toy_evaluate",
    stages=(StageSpec(name="policy", fn=f"{__name__}:toy_policy_stage", config=("policy",), training="policy.steps"),),
)


@pytest.fixture
def cli(tmp_path, capsys):
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    (tmp_path / "run.yaml").write_text(f"recipe: {__name__}:RECIPE\n")

    def portable(run: Path, *args: str) -> tuple[int, str]:
        from reproduction.portable import main

        capsys.readouterr()
        code = main(["run", "--config", str(tmp_path / "run.yaml"), "--output", str(run), "--no-progress", *args])
        return code, capsys.readouterr().err

    yield portable
    signal.signal(signal.SIGINT, before)
    STOP["after_write"] = False


def _external(run: Path) -> dict:
    statement = json.loads((run / "lineage" / "policy.intoto.json").read_text())
    return statement["predicate"]["buildDefinition"]["externalParameters"]


def _lineage_record(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())["stages"]["policy"]["lineage"]


def test_a_stage_trained_to_an_inherited_target_step_records_it(tmp_path, cli):
    run = tmp_path / "run"
    assert cli(run)[0] == 0
    assert "target_step" not in _external(run) and "target_step" not in _lineage_record(run)  # bytes kept
    STOP["after_write"] = True
    assert cli(run, "--resume", "--target-step", "6")[0] == 130
    STOP["after_write"] = False
    code, err = cli(run, "--resume")  # trains to the killed run's --target-step 6, which its argv does not say
    assert code == 0, err
    assert json.loads((run / "policy" / "model.json").read_text()) == {"step": 6, "from": 6}
    external = _external(run)
    assert external["target_step"] == 6 and "--target-step" not in external["argv"]
    assert _lineage_record(run)["target_step"] == 6
    # a lost statement written again from run.json keeps it
    statement = run / "lineage" / "policy.intoto.json"
    written = statement.read_bytes()
    statement.unlink()
    assert cli(run, "--resume")[0] == 0
    assert statement.read_bytes() == written
    # an explicit --target-step is recorded too
    assert cli(run, "--resume", "--target-step", "8")[0] == 0
    assert _external(run)["target_step"] == 8 and _lineage_record(run)["target_step"] == 8
