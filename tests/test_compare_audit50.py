"""The statistics audit of `portable compare` with simulated truth (audit50 C F1-F5): a sequential record that
picks its own test level, a task the reference does not have pooled into the overall rows, counts too large for
a float, the plan's paired hint, and per-episode outcomes that are no bool. Each test fails on the code before its
fix."""

from __future__ import annotations

import json

import numpy as np
import pytest
from evidence_fixtures import control_plane_cli as portable
from evidence_fixtures import write_json as _write

from reproduction.errors import InvalidInputError
from reproduction.run.evidence import EvalRecord, build_evidence
from reproduction.run.evidence_check import check_evidence


def _result(tasks: dict[str, str], seed0: int = 1000) -> dict:
    """An EvalResult.to_dict() of per-episode outcomes: {task: "0110..."} (success once = success at end)."""
    out: dict = {"tasks": {}, "per_episode": {}}
    for i, (task, text) in enumerate(tasks.items()):
        k = text.count("1")
        out["tasks"][task] = {"episodes": len(text), "success_once": k, "success_at_end": k}
        out["per_episode"][task] = [
            {"episode": j, "reset_seed": seed0 + 10_000 * i + j, "success_once": c == "1", "success_at_end": c == "1"}
            for j, c in enumerate(text)
        ]
    return out


def _evidence(tasks: dict[str, str], name: str = "e", **extra) -> dict:
    record = EvalRecord(result=_result(tasks), label="recap", mode="recap")
    return build_evidence(record, name=name, run_id="r", seeds={"eval": 1}, settings={}, **extra)


# -- F3: counts too large for a float -------------------------------------------------------------------------


def test_a_count_too_large_for_a_float_is_malformed_evidence_naming_the_field(tmp_path):
    """10**300 episodes (valid JSON) was an OverflowError in stats.wilson: exit 1, "internal error"."""
    ref = _evidence({"t": "01" * 50}, name="ref")
    act = _evidence({"t": "01" * 50}, name="act")
    act["metrics"]["success_once"] = {"successes": 10**300, "episodes": 2 * 10**300, "rate": 0.5, "display": "x"}
    del act["tasks"]
    out = portable("compare", _write(tmp_path / "ref.json", ref), bad := _write(tmp_path / "act.json", act))
    assert out.returncode == 4 and out.stdout == "", out.stderr
    assert out.stderr.splitlines()[0] == (
        f"error: {bad} is malformed evidence: metrics.success_once.successes is a number of 301 digits, above "
        "9007199254740992 (2**53), the largest count evidence holds (give the true count); "
        "metrics.success_once.episodes is a number of 301 digits, above 9007199254740992 (2**53), the largest count "
        "evidence holds (give the true count)"
    )
    # 2**53 itself is still a count: a verdict (the task the reference has is missing here, so `differs`)
    act["metrics"]["success_once"] = {"successes": 2**52, "episodes": 2**53, "rate": 0.5, "display": "x"}
    out = portable("compare", str(tmp_path / "ref.json"), _write(tmp_path / "act.json", act))
    assert out.returncode == 60 and out.stderr == "", out.stderr


# -- F5: per-episode outcomes that are no bool -----------------------------------------------------------------


@pytest.mark.parametrize("bad", [0.5, float("nan"), "False", 2, 1.0, np.float64(1.0), None])
def test_build_evidence_refuses_an_outcome_that_is_not_a_bool_or_0_1_naming_task_and_episode(bad):
    """0.5, NaN, "False" and 2 were written as "1" (a success) whenever the task's count agreed."""
    result = _result({"t": "11"})
    result["per_episode"]["t"][0]["success_once"] = bad
    with pytest.raises(InvalidInputError) as err:
        build_evidence(
            EvalRecord(result=result, label="recap", mode="recap"), name="x", run_id="r", seeds={}, settings={}
        )
    assert err.value.exit_code == 4 and err.value.field == "per_episode['t'][0].success_once"
    assert str(err.value).startswith(f"per-episode outcome success_once of task 't', episode 0, is {bad!r}")


@pytest.mark.parametrize("good", [True, 1, np.bool_(True), np.int64(1), np.uint8(1)])
def test_build_evidence_takes_bools_and_0_1_numpy_ones_included(good):
    result = _result({"t": "10"})
    result["per_episode"]["t"][0]["success_once"] = good
    result["per_episode"]["t"][1]["success_once"] = 0
    doc = build_evidence(
        EvalRecord(result=result, label="recap", mode="recap"), name="x", run_id="r", seeds={}, settings={}
    )
    assert doc["tasks"]["t"]["outcomes"]["success_once"] == "10"


# -- F1: a sequential record cannot choose its own test level ---------------------------------------------------


def _sequential(level: float | None = None, *, alpha: float = 0.05, looks=(25, 50, 75, 100), stop: int = 4) -> dict:
    """A record as the eval stage writes it (recipes/recap/policy.py's evaluate_sequentially): the rule's spend at
    the looks' fractions, the stopping look's spend as `level` unless `level` is given."""
    from reproduction.run.sequential import SequentialRule

    spend = SequentialRule(looks=len(looks), rho=3.0, alpha=alpha).spend([n / looks[-1] for n in looks])
    return {
        "rule": "power-family error spending (Kim & DeMets 1987), rho 3, Bonferroni over looks",
        "alpha": alpha,
        "looks": list(looks),
        "spend": spend,
        "stopped_at_look": stop,
        "stopped_early": stop < len(looks),
        "episodes_per_task": looks[stop - 1],
        "episodes_per_task_max": looks[-1],
        "level": spend[stop - 1] if level is None else level,
        "verdict": "inconclusive",
        "reference": "ref",
        "why": "the last look (4 of 4) decides",
    }


def test_a_sequential_level_the_rule_does_not_give_is_malformed_evidence(tmp_path):
    """The audit's case: 50/100 against 50/100 at margin 0.1 is `inconclusive`; a `level` of 0.3 in the run's own
    record made it `reproduced` (exit 0; false `reproduced` 0.245 at |d| = m)."""
    ref = _write(tmp_path / "ref.json", _evidence({"t": "01" * 50}, name="ref", margins={"success_once": 0.1}))
    act = _evidence({"t": "10" * 50}, name="act")  # other seeds' outcomes: unpaired rows
    for task in act["tasks"].values():
        task["outcomes"]["reset_seeds"] = [s + 1 for s in task["outcomes"]["reset_seeds"]]
    honest = _write(tmp_path / "honest.json", act | {"sequential": _sequential()})
    out = portable("compare", ref, honest, "--json")
    assert out.returncode == 61, out.stderr
    doc = json.loads(out.stdout)
    assert doc["alpha"] == _sequential()["level"] == pytest.approx(0.05 * (1 - 0.75**3))
    assert any("stopped at look 4 of 4 (100 of 100 episodes per task)" in n for n in doc["notes"])
    for level in (0.3, 0.049, 0.0289):
        bad = _write(tmp_path / "bad.json", act | {"sequential": _sequential(level)})
        out = portable("compare", ref, bad)
        assert out.returncode == 4 and out.stdout == "", (level, out.stdout)
        expected = _sequential()["level"]
        assert out.stderr.splitlines()[0] == (
            f"error: {bad} is malformed evidence: sequential.level is {level!r}, but look 4 of the looks [25, 50, 75, "
            f"100] spends {expected!r} of alpha 0.05 (sequential.spend): the level must be the stopping look's spend "
            "(a run's evidence cannot choose its own test level; was the file edited?)"
        )
    # a spend that is no alpha t^rho, and a record without what its level is computed from
    wrong = _sequential() | {"spend": [0.3, 0.1, 0.05, 0.0289]}
    for record, field in ((wrong, "sequential.spend"), ({"level": 0.0289, "alpha": 0.05}, "sequential.looks")):
        with pytest.raises(InvalidInputError) as err:
            check_evidence(act | {"sequential": record}, where="act.json")
        assert err.value.exit_code == 4 and err.value.field == field, str(err.value)


def test_a_sequential_run_is_tested_at_its_looks_share_of_the_comparisons_alpha_never_above_it(tmp_path):
    """The record's alpha (the reference's when the run looked) is no licence: compared at a smaller alpha, the
    stopping look gets its share of that alpha; a record spending alpha 0.45 still gets no more than 0.05."""
    from reproduction.run.comparison import compare_evidence

    ref = _evidence({"t": "01" * 50}, name="ref", margins={"success_once": 0.1})
    act = _evidence({"t": "01" * 50}, name="act")
    share = 1 - 0.75**3
    stricter = compare_evidence(act | {"sequential": _sequential()}, ref | {"alpha": 0.01})
    assert stricter.alpha == pytest.approx(0.01 * share) and stricter.alpha < 0.01
    assert any("this comparison's alpha 0.01 gives that look" in n for n in stricter.notes), stricter.notes
    greedy = _sequential(alpha=0.45, looks=(100,), stop=1)
    assert greedy["level"] == 0.45
    assert compare_evidence(act | {"sequential": greedy}, ref).alpha == 0.05
    assert compare_evidence(act | {"sequential": greedy}, ref, alpha=0.01).alpha == 0.01
    assert compare_evidence(act | {"sequential": _sequential()}, ref).alpha == _sequential()["level"]


def test_a_record_the_eval_stage_writes_compares_as_before_and_an_edited_one_is_refused(tmp_path, monkeypatch):
    """The eval stage's own code path (recipes/recap/policy.py's evaluate_exports with eval.sequential, the
    simulator's scripted expert against a reference that never succeeds: it stops at look 1 of 2)."""
    pytest.importorskip("gymnasium_robotics", reason="the simulator extra (recap-portable[sim]) is not installed")
    import test_run_sequential as seq

    monkeypatch.setattr("reproduction.recap.policy.export.PolicyFactory", seq.ScriptedFactory)
    monkeypatch.setattr("reproduction.recap.policy.export.read_export", lambda path: {"execute_steps": 1})
    reference = seq._reference(tmp_path, successes=0)
    path, _ = seq._run(tmp_path, seq._config("eval.sequential.enabled=true", f"eval.reference={reference}"))
    doc = json.loads(path.read_text())
    record = doc["sequential"]
    assert record["stopped_at_look"] == 1 and record["looks"] == [25, 50]
    out = portable("compare", str(reference), str(path), "--json")
    assert out.returncode == 60, out.stderr
    assert json.loads(out.stdout)["alpha"] == record["level"] == record["spend"][0]
    stricter = portable("compare", str(reference), str(path), "--json", "--alpha", "0.01")
    assert json.loads(stricter.stdout)["alpha"] == pytest.approx(record["level"] / 5)
    edited = _write(tmp_path / "edited.json", doc | {"sequential": record | {"level": 0.3}})
    out = portable("compare", str(reference), edited)
    assert out.returncode == 4 and "sequential.level is 0.3, but look 1 of the looks [25, 50] spends" in out.stderr


# -- F2: a task only the run evaluated ------------------------------------------------------------------------


def test_a_task_the_reference_lacks_is_left_out_of_the_overall_rows_and_named_in_a_note(tmp_path):
    """The audit's case: the reference's task rerun exactly (paired, 0 discordant) plus a task `u` the reference
    does not have, 0/1000. Pooled, the overall rows read 50.0% (100/200) against 8.3% (100/1200): `differs` (exit
    60), unpaired, and no note said why."""
    text = "01" * 100
    ref = _write(tmp_path / "ref.json", _evidence({"t": text}, name="ref"))
    act = _write(tmp_path / "act.json", _evidence({"t": text, "u": "0" * 1000}, name="act"))
    out = portable("compare", ref, act, "--json")
    assert out.returncode == 0, out.stdout[-2000:]
    doc = json.loads(out.stdout)
    overall = {r["metric"]: r for r in doc["rows"] if r["metric"].count("/") == 1}
    assert set(overall) == {"recap/success_once", "recap/success_at_end"}
    for row in overall.values():
        assert row["actual_counts"] == [100, 200] and row["method"] == "tango-paired" and row["verdict"] == "reproduced"
    note = (
        "recap: this run also evaluated 'u', which the reference does not have: no row compares it, and recap's "
        "overall rates here are over the reference's tasks only (like with like), not the run's own overall counts"
    )
    assert note in doc["notes"]
    text_out = portable("compare", ref, act)
    assert text_out.returncode == 0 and f"note: {note}" in text_out.stdout.splitlines()
    # without an extra task nothing changes: the run's own overall counts are compared
    same = _write(tmp_path / "same.json", _evidence({"t": text}, name="act"))
    assert not any("does not have" in n for n in json.loads(portable("compare", ref, same, "--json").stdout)["notes"])


# -- F4: the plan's paired hint -------------------------------------------------------------------------------


def test_the_plans_paired_hint_is_the_first_n_compare_reproduces_identical_paired_reruns_at(tmp_path):
    """The hint said 52 at margin 0.05 (the uncalibrated n > z^2 (1 - m) / m); compare's calibrated paired test
    says `inconclusive` at 52-58 identical pairs and `reproduced` first at 59."""
    out = portable("eval", "--plan", "--rate", "0.8")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == (
        "paired by reset seed (evaluating the reference's own initial states): identical reruns (no "
        "discordant episode) are first `reproduced` at 59 episodes at margin 0.05, alpha 0.05 (compare's calibrated "
        "paired test)"
    )
    for n, code in ((52, 61), (58, 61), (59, 0)):
        text = "1" * n
        ref = _write(tmp_path / f"ref{n}.json", _evidence({"t": text}, name="ref"))
        act = _write(tmp_path / f"act{n}.json", _evidence({"t": text}, name="act"))
        assert portable("compare", ref, act).returncode == code, n
    assert (
        "at 29 episodes at margin 0.1, alpha 0.05"
        in portable("eval", "--plan", "--rate", "0.8", "--margin", "0.1").stdout
    )
