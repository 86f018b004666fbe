"""Sequential evaluation in a run (eval.sequential): looks over the fixed evaluation's own episodes, a stop once
the comparison with the reference is settled, the record evidence keeps, and what the compare stage makes of it.

The policies are the simulator's scripted expert (success nearly always) and random actions (almost never),
swapped in at the export seam (`PolicyFactory`, `read_export`) so no policy trains; the run's evaluation
code (`recap_policy.evaluate_exports`) and the simulator run for real, 25-episode batches and all."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from evidence_fixtures import eval_result

pytest.importorskip("gymnasium_robotics", reason="the simulator extra (recap-portable[sim]) is not installed")

from reproduction.errors import ConfigError  # noqa: E402
from reproduction.run.config import load_config  # noqa: E402
from reproduction.run.evidence import EvalRecord, build_evidence, write_evidence  # noqa: E402
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
    from reproduction.run.recap_policy import evaluate_exports

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
    from reproduction.run.config import to_plain
    from reproduction.run.recap_recipe import RECAP
    from reproduction.run.runner import input_files, key_parts

    reference = _reference(tmp_path, successes=10)
    spec = RECAP.stage("eval")
    off = to_plain(_config(f"eval.reference={reference}"))
    on = to_plain(_config(f"eval.reference={reference}", "eval.sequential.enabled=true"))
    assert input_files(spec, off) == {} and "files" not in key_parts(spec, off, {}, {"policy": "p"})
    assert input_files(spec, on) == {"eval.reference": str(reference)}
    assert key_parts(spec, on, {}, {"policy": "p"})["files"]["eval.reference"] != "absent"
