"""audit56 B1: the run's current evaluation is found by what run.json recorded, not by a stage named `eval`.

A tiny out-of-tree recipe, pretrain (untargeted) -> train -> evaluate -> compare, whose evaluating stage is named
`evaluate`: after `--target-step` kept an earlier evaluation beside the current one, report.html's Summary shows the
recorded one and `portable compare` picks it (it refused the folder, exit 2); after `--target-step N --stages
pretrain` compare warns and report.html carries the stale banner (neither did).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from html import unescape
from pathlib import Path

from reproduction.recipe import Recipe, StageContext, StageOutput, StageSpec
from reproduction.run.evidence import EvalRecord, write_eval_evidence
from reproduction.run.runner import RunOptions, run_recipe


@dataclass(kw_only=True, slots=True)
class Steps:
    steps: int = 3


@dataclass(kw_only=True, slots=True)
class Eval:
    reference: str = ""


@dataclass(kw_only=True, slots=True)
class Cfg:
    pretrain: Steps = field(default_factory=Steps)
    train: Steps = field(default_factory=lambda: Steps(steps=4))
    eval: Eval = field(default_factory=Eval)


def _train(ctx: StageContext, steps: int) -> StageOutput:
    # trains on from its own weights when resumed (to --target-step, or `steps`), from scratch otherwise
    out = ctx.out_dir / "weights.json"
    target = ctx.target_step or steps
    done = json.loads(out.read_text())["step"] if ctx.resume and out.is_file() else 0
    out.write_text(json.dumps({"step": max(done, target)}))
    return StageOutput(files=[out], step=max(done, target))


def pretrain(ctx: StageContext) -> StageOutput:
    return _train(ctx, ctx.config.pretrain.steps)


def train(ctx: StageContext) -> StageOutput:
    return _train(ctx, ctx.config.train.steps)


_META = {"name": "toy", "run_id": "toy-run", "seeds": {"eval": 1}, "settings": {"episodes": 20}}


def _evidence(path: Path, step: int, successes: int) -> Path:
    result = {"tasks": {"toy": {"episodes": 20, "success_once": successes, "success_at_end": successes}}}
    return write_eval_evidence(path, EvalRecord(result=result, label="mine", mode="mine", step=step), **_META)


def evaluate(ctx: StageContext) -> StageOutput:
    step = json.loads((ctx.run_dir / "train" / "weights.json").read_text())["step"]
    path = _evidence(ctx.run_dir / "evidence" / f"eval_toy_{step}.json", step, successes=step)
    return StageOutput(files=[path], summary={"step": step})


def compare(ctx: StageContext) -> StageOutput:
    out = ctx.out_dir / "verdict.json"
    out.write_text("{}")
    return StageOutput(files=[out])


def write_report(run_dir: Path) -> Path:
    from reproduction.run.report import write_run_report

    return write_run_report(run_dir, title="toy", run_id=json.loads((run_dir / "run.json").read_text())["run_id"])


def _spec(name: str, **kw) -> StageSpec:
    return StageSpec(name=name, fn=f"{__name__}:{name}", inputs=False, **kw)


RECIPE = Recipe(
    name="toy-evaluate",
    report=f"{__name__}:write_report",
    stages=(
        _spec("pretrain", config=("pretrain",), training="pretrain.steps", target=False, outputs=("weights.json",)),
        _spec("train", needs=("pretrain",), config=("train",), training="train.steps", outputs=("weights.json",)),
        _spec("evaluate", needs=("train",), config=("eval",), outputs=("../evidence/*.json",)),
        _spec("compare", needs=("evaluate",), config=("eval",), outputs=("verdict.json",)),
    ),
)


def _summary(run: Path) -> str:
    html = (run / "report.html").read_text()
    table = re.search(r"<h2>Summary</h2>.*?</table>", html, re.S).group(0)
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", table)).split())


def _compare(capsys, ref: Path, run: Path) -> tuple[int, str]:
    from reproduction.portable import main

    capsys.readouterr()
    try:
        rc = main(["compare", str(ref), str(run)])
    except SystemExit as exc:
        rc = exc.code
    return rc, capsys.readouterr().err


def test_an_evaluating_stage_of_any_name_is_the_runs_current_evaluation(tmp_path, capsys):
    run, ref = tmp_path / "run", _evidence(tmp_path / "reference.json", 0, successes=4)
    run_recipe(RECIPE, Cfg(), run)  # eval_toy_4
    run_recipe(RECIPE, Cfg(), run, RunOptions(resume=True, target_step=6))  # train on to 6: eval_toy_6

    # pretrain moved on: train, evaluate and compare hold results of the earlier pretrain
    run_recipe(RECIPE, Cfg(), run, RunOptions(stages=["pretrain"], target_step=5))
    rc, err = _compare(capsys, ref, run)
    assert rc == 61 and err.splitlines() == [
        f"compare: using {run / 'evidence' / 'eval_toy_6.json'}, the evaluation {run / 'run.json'} records "
        "(also there: eval_toy_4.json)",
        f"warning: {run}: its evaluate stage ran before stage pretrain's outputs changed, so this evidence is of "
        "the earlier pretrain; `portable run ... --resume` evaluates the current one",
    ]
    html = (run / "report.html").read_text()
    assert re.findall(r'<div id="(\w+)" class="banner ([\w ]+)"', html) == [("stale", "stale")]
    assert 'id="summary-stale"' in html and "these evaluations are of the earlier pretrain" in html

    # --resume redoes train from scratch (4 steps): eval_toy_4 is current again, eval_toy_6 is kept beside it
    run_recipe(RECIPE, Cfg(), run, RunOptions(resume=True))
    assert json.loads((run / "run.json").read_text())["stages"]["evaluate"]["outputs"].keys() == {
        "../evidence/eval_toy_4.json"
    }
    assert "30.0% (6/20)" not in _summary(run) and "20.0% (4/20)" in _summary(run)
    html = (run / "report.html").read_text()
    assert 'id="stale"' not in html and "run.json's evaluate stage lists the evaluation shown above" in html
    assert re.search(r'<table id="earlier">.*eval_toy_6\.json.*</table>', html, re.S)
    rc, err = _compare(capsys, ref, run)
    assert rc == 61 and err == (  # inconclusive at 20 episodes; not exit 2
        f"compare: using {run / 'evidence' / 'eval_toy_4.json'}, the evaluation {run / 'run.json'} records "
        "(also there: eval_toy_6.json)\n"
    )


def test_several_evaluating_stages_all_count_and_a_name_is_only_a_fallback(tmp_path):
    from reproduction.run.report import current_evidence, evidence_stages

    run = tmp_path / "run"
    (run / "evidence").mkdir(parents=True)
    for step in (3, 5, 9):
        _evidence(run / "evidence" / f"eval_toy_{step}.json", step, successes=step)
    rec = {"status": "complete", "outputs": {}}
    stages = {
        "b": {**rec, "outputs": {"../evidence/eval_toy_5.json": [1, 2, "a" * 64]}},
        "a": {**rec, "outputs": {"../evidence/eval_toy_3.json": [1, 2, "b" * 64]}},
        "rl": {**rec, "outputs": {"evidence/eval_rl_9.json": [1, 2, "c" * 64]}},  # GRPO's live ones: rl/evidence/
    }
    (run / "run.json").write_text(json.dumps({"run_id": "r", "stages": stages}))
    assert evidence_stages(run) == ["a", "b"]
    current, others = current_evidence(run)
    assert [p.name for p in current] == ["eval_toy_3.json", "eval_toy_5.json"]
    assert [p.name for p in others] == ["eval_toy_9.json"]
    (run / "run.json").write_text(json.dumps({"run_id": "r", "stages": {"rl": stages["rl"]}}))
    assert evidence_stages(run) == ["eval"]  # nothing recorded: the built-in recipes' name
