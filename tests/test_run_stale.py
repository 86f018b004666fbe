"""After `--target-step N --stages policy` the evaluation and the comparison still hold the earlier policy's results
(the next --resume redoes them): `portable run` printed them as the run's headline without saying so (audit46
newcomer F17). Now it prints one note naming the stale stages instead, and report.html's stages table marks them;
once a --resume has redone them the headline is back, with the new results. A toy recipe (policy -> eval -> compare,
with RECAP's report) through the CLI; no training, fast."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from reproduction.recipe import Recipe, StageContext, StageOutput, StageSpec


@dataclass(kw_only=True)
class Policy:
    steps: int = 4


@dataclass(kw_only=True)
class ToyConfig:
    RUN: str = ""
    policy: Policy = field(default_factory=Policy)


def policy_stage(ctx: StageContext) -> StageOutput:
    step = ctx.target_step or ctx.config.policy.steps
    out = ctx.out_dir / "model.json"
    out.write_text(json.dumps({"step": step}))
    return StageOutput(files=[out], summary={}, step=step)


def eval_stage(ctx: StageContext) -> StageOutput:
    step = json.loads((ctx.run_dir / "policy" / "model.json").read_text())["step"]
    out = ctx.out_dir / "rates.json"
    out.write_text(json.dumps({"step": step}))
    tasks = {"Push": {"episodes": 10, "success_at_end": step, "success_once": step}}
    return StageOutput(files=[out], summary={"results": {f"recap@{step}": {"tasks": tasks}}})


def compare_stage(ctx: StageContext) -> StageOutput:
    step = json.loads((ctx.run_dir / "eval" / "rates.json").read_text())["step"]
    out = ctx.out_dir / "verdict.json"
    verdict = "reproduced" if step >= 6 else "differs"
    out.write_text(json.dumps({"verdict": verdict}))
    return StageOutput(files=[out], summary={"verdict": verdict})


RECIPE = Recipe(
    name="toy",
    config_schema=f"{__name__}:ToyConfig",
    report="reproduction.recipes.recap.report:write_run_report",
    headline="reproduction.run.compare_cmd:run_results_lines",  # RECAP's headline: a recipe prints one it names
    stages=(
        StageSpec(name="policy", fn=f"{__name__}:policy_stage", config=("policy",), training="policy.steps"),
        StageSpec(name="eval", fn=f"{__name__}:eval_stage", needs=("policy",)),
        StageSpec(name="compare", fn=f"{__name__}:compare_stage", needs=("eval",)),
    ),
)

NOTE = (
    "note: eval and compare ran before policy changed, so their results are not shown; `portable run ... --resume` "
    "(without --stages) redoes them"
)
STALE = "stale: ran before policy changed; its results here are of the earlier policy (--resume redoes it)"


@pytest.fixture
def cli(tmp_path, capsys):
    (tmp_path / "run.yaml").write_text(f"recipe: {__name__}:RECIPE\n")

    def portable(run: Path, *args: str) -> tuple[int, list[str]]:
        from reproduction.portable import main

        capsys.readouterr()
        code = main(["run", "--config", str(tmp_path / "run.yaml"), "--output", str(run), "--no-progress", *args])
        return code, capsys.readouterr().err.splitlines()

    return portable


def test_a_run_whose_evaluation_predates_its_policy_shows_a_note_not_the_old_headline(tmp_path, cli):
    run = tmp_path / "run"
    code, err = cli(run)
    assert code == 0 and err[-2:] == [
        "recap@4        success at end  40.0% (4/10, 95% CI 16.8%-68.7%), at any step  40.0%",
        "against the reference evidence: differs",
    ]
    assert STALE not in (run / "report.html").read_text()

    code, err = cli(run, "--target-step", "6", "--stages", "policy")
    assert code == 0 and err[-1] == NOTE, err
    assert not any("success at end" in line or "against the reference" in line for line in err)
    assert [line.split()[:2] for line in err[1:2]] == [["policy", "continued"]]
    html = (run / "report.html").read_text()
    assert html.count(STALE) == 2  # eval's and compare's rows

    code, err = cli(run, "--resume")  # redoes eval and compare on the step-6 policy
    assert code == 0 and NOTE not in err
    assert err[-2:] == [
        "recap@6        success at end  60.0% (6/10, 95% CI 31.3%-83.2%), at any step  60.0%",
        "against the reference evidence: reproduced",
    ]
    assert STALE not in (run / "report.html").read_text()


def test_stale_stages_follow_the_chain_and_ignore_incomplete_ones():
    from reproduction.run.runner import stale_stages
    from reproduction.run.stale import outputs_digest

    def rec(status="complete", outputs=None, **upstream):
        return {"status": status, "outputs": outputs or {}, "key_parts": {"upstream": upstream}}

    policy = {"model.json": [1, 2, "a" * 64]}
    now = outputs_digest(policy)
    state = {"stages": {"policy": rec(outputs=policy), "eval": rec(policy="0" * 64), "compare": rec(eval="x")}}
    state["stages"]["compare"]["key_parts"]["upstream"]["eval"] = outputs_digest({})
    assert stale_stages(state) == {"eval": "policy", "compare": "policy"}
    state["stages"]["eval"] = rec(policy=now)
    assert stale_stages(state) == {}
    state["stages"]["eval"] = rec("interrupted", policy="0" * 64)
    assert stale_stages(state) == {}


def test_run_json_names_the_stale_stages(tmp_path, capsys):
    """`--json` carried no stale marker: a script reading it could not tell the evaluation predates the policy."""
    from reproduction.portable import main

    (tmp_path / "run.yaml").write_text(f"recipe: {__name__}:RECIPE\n")
    run = tmp_path / "run"
    base = ["run", "--config", str(tmp_path / "run.yaml"), "--output", str(run), "--no-progress", "--json"]

    def doc(*args: str) -> dict:
        capsys.readouterr()
        assert main([*base, *args]) == 0
        return json.loads(capsys.readouterr().out)

    assert doc()["stale"] == {}
    stale = doc("--target-step", "6", "--stages", "policy")
    assert stale["stale"] == {"eval": "policy", "compare": "policy"}
    assert [r["stage"] for r in stale["stages"]] == ["policy"]
    assert doc("--resume")["stale"] == {}
