"""A GRPO run whose sft stage copies a pinned sft.export instead of training BC: the SFT baseline's step was recorded
as null (the sft record, the eval evidence's baseline, `portable eval --checkpoint STEP`'s baseline), though the
export names the step it was trained to (its train_config.json's max_steps). The sft record's `step` stays null
(nothing trained here: a raised sft.train.max_steps must not train on from it); the step is in its summary and in
the baseline the eval stage and `portable eval` evaluate."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from reproduction.recap.policy.config import EXPORT_FORMAT
from reproduction.recipe import StageOutput
from reproduction.recipes.grpo import GRPO
from reproduction.recipes.grpo import stages as grpo_stages
from reproduction.recipes.grpo.config import GrpoRunConfig
from reproduction.recipes.grpo.eval_cmd import _resolve_checkpoint
from reproduction.run.config import load_config
from reproduction.run.runner import RunOptions, read_state, run_recipe

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "bundle" / "grpo" / "config.yaml"
PINNED_STEP = 37


def _pinned_export(folder: Path, train_config: dict | None) -> Path:
    """A folder the sft stage takes for a policy export (policy.json of this build's format), trained to
    `train_config`'s max_steps; no train_config.json when `train_config` is None."""
    folder.mkdir(parents=True)
    (folder / "policy.json").write_text(json.dumps({"format_version": EXPORT_FORMAT}))
    (folder / "model.safetensors").write_bytes(b"not read by the sft stage")
    if train_config is not None:
        (folder / "train_config.json").write_text(json.dumps(train_config))
    return folder


def _config(tmp_path: Path, run: Path, *over: str) -> GrpoRunConfig:
    pinned = [f"sft.export={tmp_path / 'pinned'}", *over]
    return load_config([CONFIG], pinned, bundle=tmp_path, run_dir=run, schema=GrpoRunConfig)


def _run_sft(tmp_path: Path, train_config: dict | None) -> Path:
    """A run of the sft stage alone, copying a pinned export trained to `train_config`'s max_steps."""
    _pinned_export(tmp_path / "pinned", train_config)
    run = tmp_path / "run"
    run_recipe(GRPO, _config(tmp_path, run, "sft.train.max_steps=500"), run, RunOptions(stages=["sft"]))
    return run


def _eval_baseline(run: Path, monkeypatch) -> tuple[Path, int | None]:
    """The (export, step) the eval stage hands evaluate_exports as its sft baseline (the simulator swapped out)."""
    seen = {}
    monkeypatch.setattr(grpo_stages, "evaluate_exports", lambda config, exports, *a, **kw: seen.update(exports))
    rec = read_state(run)["stages"]["sft"]
    upstream = {
        "sft": StageOutput(files=[], summary=rec["summary"], step=rec["step"]),
        "rl": StageOutput(files=[], step=4),
    }
    grpo_stages.eval_stage(SimpleNamespace(config=None, run_dir=run, upstream=upstream, out_dir=run / "eval", ui=None))
    return seen["sft"]


def test_a_pinned_sft_exports_step_is_recorded_and_is_the_eval_baselines(tmp_path, monkeypatch):
    run = _run_sft(tmp_path, {"max_steps": PINNED_STEP, "lr": 1e-4})
    rec = read_state(run)["stages"]["sft"]
    assert rec["status"] == "complete"
    assert rec["step"] is None  # not counted in steps: --resume with a raised max_steps does not train on from it
    assert rec["summary"] == {"pinned": str(tmp_path / "pinned"), "step": PINNED_STEP}
    assert _eval_baseline(run, monkeypatch) == (run / "sft" / "export", PINNED_STEP)
    state = {"stages": {"sft": rec, "rl": {"status": "complete", "step": 4}}}
    exports, _ = _resolve_checkpoint("4", run, state)  # portable eval --checkpoint 4: the same baseline step
    assert exports["sft"] == (run / "sft" / "export", PINNED_STEP)
    report = run_recipe(
        GRPO, _config(tmp_path, run, "sft.train.max_steps=900"), run, RunOptions(resume=True, stages=["sft"])
    )
    assert [(s.name, s.action) for s in report.stages] == [("sft", "skipped")]


@pytest.mark.parametrize("train_config", [None, {"lr": 1e-4}, {"max_steps": "37"}])
def test_a_pinned_sft_export_without_a_step_records_null(tmp_path, monkeypatch, train_config):
    """An export with no train_config.json, or no integer max_steps in it, names no step: null, as before."""
    run = _run_sft(tmp_path, train_config)
    rec = read_state(run)["stages"]["sft"]
    assert rec["step"] is None and rec["summary"]["step"] is None
    assert _eval_baseline(run, monkeypatch) == (run / "sft" / "export", None)


@pytest.mark.parametrize(
    ("policy", "train", "step"),
    [
        ({"step": 12}, {"max_steps": 40}, 12),  # policy.json's own step first (RECAP's exports carry one)
        ({}, {"max_steps": 40}, 40),
        ({"step": True}, {"max_steps": True}, None),  # a bool is no step, in either file
        ({"step": "7"}, None, None),
        (None, {"max_steps": 9}, 9),  # no policy.json to read
    ],
)
def test_one_export_step_for_both_recipes(tmp_path, policy, train, step):
    """audit49 review F4: RECAP's and GRPO's eval each had an export_step, one preferring policy.json's step and
    taking a bool for a step, the other neither: the same export got two steps."""
    from reproduction.recap.policy.export import export_step

    if policy is not None:
        (tmp_path / "policy.json").write_text(json.dumps(policy))
    if train is not None:
        (tmp_path / "train_config.json").write_text(json.dumps(train))
    assert export_step(tmp_path) == step
    assert export_step(tmp_path, policy or {}) == step
