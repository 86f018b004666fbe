"""Sequential evaluation in a run (eval.sequential): looks over the fixed evaluation's own episodes, a stop once
the comparison with the reference is settled, the record evidence keeps, and what the compare stage makes of it.

The policies are the simulator's scripted expert (success nearly always) and random actions (almost never),
swapped in at the export seam (`PolicyFactory`, `read_export`) so no policy trains; the run's evaluation
code (`recipes/recap/policy.py`'s `evaluate_exports`) and the simulator run for real, 25-episode batches and all."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from evidence_fixtures import eval_result, schema_errors

pytest.importorskip("gymnasium_robotics", reason="the simulator extra (recap-portable[sim]) is not installed")

from reproduction.errors import ConfigError  # noqa: E402
from reproduction.recipes.recap.config import load_config  # noqa: E402
from reproduction.run.comparison import compare_evidence  # noqa: E402
from reproduction.run.evidence import EvalRecord, build_evidence, load_evidence, write_evidence  # noqa: E402
from reproduction.sim.evaluate import EvalConfig, EvalJob, evaluate_many  # noqa: E402
from reproduction.sim.policies import ExpertPolicy, RandomPolicy  # noqa: E402

TASK = "FetchPush-v4"


@dataclass(frozen=True)
class ScriptedFactory:
    """Stands in for PolicyFactory: an export folder named "expert..." acts as the expert, else at random."""

    export_dir: str
    guidance_scale: float = 1.0

    def __call__(self):
        if Path(self.export_dir).name.startswith("expert"):
            return ExpertPolicy()
        return RandomPolicy(seed=3)


@pytest.fixture
def scripted(monkeypatch):
    monkeypatch.setattr("reproduction.recap.policy.export.PolicyFactory", ScriptedFactory)
    monkeypatch.setattr("reproduction.recap.policy.export.read_export", lambda path: {"execute_steps": 1})


def _config(*overrides: str):
    return load_config(None, [f"eval.tasks=[{TASK}]", "eval.episodes_per_task=50", "policy.modes=[bc]", *overrides])


def _run(tmp_path: Path, config, policy: str = "expert", name: str = "run") -> tuple[Path, dict]:
    """evaluate_exports of one bc "export" into tmp_path/name; (evidence path, stage summary)."""
    from reproduction.recipes.recap.policy import evaluate_exports

    export = tmp_path / "exports" / policy
    export.mkdir(parents=True, exist_ok=True)
    (export / "policy.json").write_text("{}")
    run_dir = tmp_path / name
    out = evaluate_exports(config, {"bc": (export, 7)}, run_dir / "eval", run_dir)
    return run_dir / out.summary["evidence"], out.summary


def _reference(tmp_path: Path, successes: int, episodes: int = 100, margins: dict | None = None) -> Path:
    doc = build_evidence(
        EvalRecord(result=eval_result({TASK: (successes, episodes)}), label="bc", mode="bc"),
        name="the reference",
        run_id="ref",
        seeds={"eval": 1000},
        settings={"tasks": [TASK], "episodes_per_task": episodes},
        margins=margins,
    )
    return write_evidence(tmp_path / f"reference_{successes}_{episodes}.json", doc)


def test_off_by_default_the_evidence_is_todays_byte_for_byte(tmp_path, scripted):
    """Sequential off (the default) writes exactly what the fixed evaluation wrote before it existed: the
    evidence of one evaluate_many over every episode, built as evaluate_exports always built it."""
    from reproduction.recipes.recap.policy import _counts, _mechanism

    config = _config()
    assert config.eval.sequential.enabled is False
    path, summary = _run(tmp_path, config)
    assert "sequential" not in summary
    export = tmp_path / "exports" / "expert"
    job = EvalJob(
        factory=ScriptedFactory(str(export), 1.0),
        config=EvalConfig(tasks=(TASK,), episodes_per_task=50, seed=1000, execute_steps=1, videos=0, workers=1),
    )
    (result,) = evaluate_many([job])
    from reproduction.run.lineage import path_sha256

    record = EvalRecord(
        result=_counts(result),
        label="bc",
        mode="bc",
        checkpoint=str(export),
        checkpoint_sha256=path_sha256(export)[0],
        step=7,
        extra_metrics=_mechanism(result),
    )
    expected = build_evidence(
        record,
        name="bc after 7 steps",
        run_id="run",
        seeds={"eval": 1000, "policy": config.policy.train.seed, "value": config.value.train.seed},
        settings={"tasks": [TASK], "episodes_per_task": 50},
    )
    assert path.read_text() == json.dumps(expected, indent=1) + "\n"
    assert load_evidence(path)["metrics"]["success_once"]["episodes"] == 50


def test_far_from_the_reference_it_stops_at_the_first_look_and_says_why(tmp_path, scripted):
    reference = _reference(tmp_path, successes=0)  # the reference never succeeds; the expert nearly always
    config = _config("eval.sequential.enabled=true", f"eval.reference={reference}")
    path, summary = _run(tmp_path, config)
    doc = load_evidence(path)
    seq = doc["sequential"]
    assert schema_errors("evaluation", doc) == []
    assert schema_errors("evaluation", {**doc, "sequential": {k: v for k, v in seq.items() if k != "why"}})
    assert seq["looks"] == [25, 50] and seq["stopped_at_look"] == 1 and seq["stopped_early"] is True
    assert seq["episodes_per_task"] == 25 and seq["episodes_per_task_max"] == 50
    assert seq["episodes"] == 25 and seq["episodes_max"] == 50
    assert seq["verdict"] == "differs" and "settled at look 1 of 2" in seq["why"]
    assert sum(seq["spend"]) == pytest.approx(0.05) and seq["level"] == seq["spend"][0]
    assert doc["metrics"]["success_once"]["episodes"] == 25 and summary["sequential"] == seq
    # the compare stage tests at the level the stop spent, so its rate verdicts are the ones it stopped on
    comparison = compare_evidence(doc, load_evidence(reference))
    rates = [r for r in comparison.rows if r.kind == "rate"]
    assert comparison.alpha == seq["level"] and {r.verdict for r in rates} == {"differs"}
    assert any("stopped at look 1 of 2" in n for n in comparison.notes)
    assert schema_errors("comparison", comparison.to_dict()) == []
    # deterministic: a rerun (what --resume does with an unfinished eval stage) writes the same bytes
    again, _ = _run(tmp_path, config, name="rerun")
    assert again.read_bytes().replace(b'"rerun"', b'"run"') == path.read_bytes()


def test_equal_to_the_reference_it_stops_early_as_reproduced_when_the_margin_allows(tmp_path, scripted):
    # a wide declared margin: 25 episodes settle "reproduced" at look 1
    reference = _reference(tmp_path, successes=100, margins={"success_once": 0.3, "success_at_end": 0.3})
    path, _ = _run(tmp_path, _config("eval.sequential.enabled=true", f"eval.reference={reference}"))
    seq = load_evidence(path)["sequential"]
    assert seq["stopped_at_look"] == 1 and seq["verdict"] == "reproduced", seq
    assert compare_evidence(load_evidence(path), load_evidence(reference)).verdict == "reproduced"


def test_each_look_records_the_calibrated_level_its_reproduced_rows_were_judged_at(tmp_path, scripted):
    """Look 1 (25 of 50 episodes, a_1 = 0.00625) against 100 reference episodes at margin 0.3: the plain interval's
    exact size there is 0.0134 > a_1, so every reproduced row is judged at the design's calibrated level, and the
    record keeps it per look and row."""
    from reproduction.run import stats

    reference = _reference(tmp_path, successes=100, margins={"success_once": 0.3, "success_at_end": 0.3})
    path, _ = _run(tmp_path, _config("eval.sequential.enabled=true", f"eval.reference={reference}"))
    doc = load_evidence(path)
    seq = doc["sequential"]
    a = seq["spend"][0]
    assert stats.exact_size(100, 25, 0.3, a) > a
    level = stats.calibrated_alpha(100, 25, 0.3, a)
    assert level < a and seq["stopped_at_look"] == 1 and len(seq["reproduced_levels"]) == 1
    (look,) = seq["reproduced_levels"]
    assert len(look) >= 2 and set(look.values()) == {level}, look
    assert schema_errors("evaluation", doc) == []
    rows = [r for r in compare_evidence(doc, load_evidence(reference)).rows if r.kind == "rate"]
    assert {r.metric: r.alpha_calibrated for r in rows if r.verdict == "reproduced"} == look


def test_equal_to_the_reference_at_the_default_margin_it_runs_to_the_end(tmp_path, scripted):
    # 50 episodes cannot show +-0.05: no look settles, the last decides (inconclusive), every episode is run
    reference = _reference(tmp_path, successes=100)
    path, _ = _run(tmp_path, _config("eval.sequential.enabled=true", f"eval.reference={reference}"))
    doc = load_evidence(path)
    seq = doc["sequential"]
    assert seq["stopped_at_look"] == 2 and seq["stopped_early"] is False and seq["episodes_per_task"] == 50
    assert seq["verdict"] == "inconclusive" and seq["why"].startswith("the last look (2 of 2) decides")
    assert doc["metrics"]["success_once"]["episodes"] == 50
    comparison = compare_evidence(doc, load_evidence(reference))
    assert comparison.alpha == seq["level"] == seq["spend"][-1]
    assert {r.verdict for r in comparison.rows if r.kind == "rate"} == {"inconclusive"}


@pytest.mark.parametrize(
    "overrides, words, field",
    [
        (["eval.sequential.enabled=true"], "eval.sequential.enabled=true needs eval.reference", "eval.reference"),
        (["eval.sequential.looks=0"], "eval.sequential.looks=0 must be >= 1", "eval.sequential.looks"),
        (["eval.sequential.rho=0"], "eval.sequential.rho=0.0 must be > 0", "eval.sequential.rho"),
        (["eval.sequential.rho=nan"], "eval.sequential.rho=nan must be > 0", "eval.sequential.rho"),
        (["eval.sequential.enabled=maybe"], "config key `eval.sequential.enabled`", "eval.sequential.enabled"),
        (["eval.sequential.look=2"], "unknown config key `eval.sequential.look`", "eval.sequential.look"),
    ],
)
def test_bad_sequential_settings_are_one_line_errors_with_exit_4(overrides, words, field):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert words in str(err.value) and "\n" not in str(err.value) and err.value.exit_code == 4
    assert err.value.field == field


def test_the_reference_keys_the_eval_stage_only_when_sequential(tmp_path):
    """Off: a new reference recompares and never re-evaluates (the eval key ignores it). On: the looks read
    the reference, so its content is part of the eval stage's key and lineage."""
    from reproduction.recipes.recap.recipe import RECAP
    from reproduction.run.config import to_plain
    from reproduction.run.stage_keys import input_files, key_parts

    reference = _reference(tmp_path, successes=10)
    spec = RECAP.stage("eval")
    off = to_plain(_config(f"eval.reference={reference}"))
    on = to_plain(_config(f"eval.reference={reference}", "eval.sequential.enabled=true"))
    assert input_files(spec, off) == {} and "files" not in key_parts(spec, off, {}, {"policy": "p"})
    assert input_files(spec, on) == {"eval.reference": str(reference)}
    assert key_parts(spec, on, {}, {"policy": "p"})["files"]["eval.reference"] != "absent"


def test_the_run_ends_by_saying_where_a_sequential_evaluation_stopped(tmp_path, scripted):
    from reproduction.run.compare_cmd import run_results_lines

    reference = _reference(tmp_path, successes=0)
    _, summary = _run(tmp_path, _config("eval.sequential.enabled=true", f"eval.reference={reference}"))
    stages = {"eval": {"summary": summary}, "compare": {"summary": {"verdict": "differs (2 differ)"}}}
    (tmp_path / "run" / "run.json").write_text(json.dumps({"stages": stages}))
    lines = run_results_lines(tmp_path / "run")
    assert lines[0].startswith("bc ") and "/25, 95% CI" in lines[0]
    assert lines[1] == "sequential evaluation: 25 of 50 episodes per task; " + summary["sequential"]["why"]


def test_portable_run_refuses_bad_sequential_settings_with_exit_4_before_anything_runs(tmp_path, capsys):
    from reproduction.portable import main

    assert main(["run", "--output", str(tmp_path / "r"), "eval.sequential.enabled=true"]) == 4
    assert main(["run", "--output", str(tmp_path / "r"), "eval.sequential.looks=0"]) == 4
    err = capsys.readouterr().err
    assert "needs eval.reference" in err and "eval.sequential.looks=0 must be >= 1" in err
    assert not (tmp_path / "r" / "run.json").exists()


def test_preflight_checks_the_reference_file_when_the_looks_read_it(tmp_path):
    from reproduction.recipes.recap.recipe import preflight

    missing = str(tmp_path / "no-such-reference.json")
    on = _config("eval.sequential.enabled=true", f"eval.reference={missing}")
    off = _config(f"eval.reference={missing}")
    named = lambda problems: [p for p in problems if "eval.reference" in str(p)]  # noqa: E731
    assert named(preflight(on, tmp_path / "run", {}, ["eval"]))
    assert not named(preflight(off, tmp_path / "run", {}, ["eval"]))  # off: only the compare stage reads it
