"""Evaluation evidence JSON, its schema, and the comparison with reference evidence under tolerances."""

from __future__ import annotations

import json
import math

import pytest
from evidence_fixtures import PICK, PUSH, eval_result, make_evidence, schema_errors

from reproduction.errors import InputNotFoundError, InvalidInputError, UnsupportedFormatError
from reproduction.run.evidence import (
    EvalRecord,
    binomial_tolerance,
    build_evidence,
    compare_evidence,
    compare_files,
    count_metric,
    load_evidence,
    write_eval_evidence,
)


def test_counts_read_like_release_notes():
    assert count_metric(386, 500) == {"successes": 386, "episodes": 500, "rate": 0.772, "display": "77.2% (386/500)"}
    assert count_metric(0, 0)["display"] == "0.0% (0/0)"
    with pytest.raises(ValueError):
        count_metric(501, 500)


def test_evidence_holds_counts_seeds_digests_guidance_and_baselines(tmp_path):
    doc = make_evidence(recap=(38, 40), bc=(20, 40))
    assert schema_errors("evaluation", doc) == []
    assert doc["metrics"]["success_once"]["display"] == "95.0% (38/40)"
    assert doc["tasks"][PICK]["success_once"] == count_metric(19, 20)
    assert doc["tasks"][PUSH]["episodes"] == 20
    assert doc["policy"]["guidance_scale"] == 1.5 and doc["policy"]["checkpoint"]["sha256"] == "ab" * 32
    assert doc["seeds"] == {"eval": 1000, "train": 0}
    assert [b["policy"]["label"] for b in doc["baselines"]] == ["bc"]
    assert doc["baselines"][0]["metrics"]["success_once"]["display"] == "50.0% (20/40)"
    path = write_eval_evidence(
        tmp_path / "evidence/eval_policy_4.json",
        EvalRecord(result=eval_result({PICK: (3, 4)}), label="recap", mode="recap", guidance_scale=1.0),
        name="eval_policy_4",
        run_id="r",
        seeds={"eval": 1},
        settings={"episodes_per_task": 4, "hf_token": "hf_" + "a" * 34},
    )
    loaded = load_evidence(path)
    assert loaded["settings"]["hf_token"] == "<redacted>"
    assert schema_errors("evaluation", loaded) == []


def test_result_shapes_accepted_and_refused():
    rows = {"tasks": [{"task": PICK, "episodes": 10, "success_once": 7}]}
    doc = build_evidence(
        EvalRecord(result=rows, label="bc", mode="bc", extra_metrics={"mean_steps": 31.5}),
        name="n",
        run_id="r",
        seeds={},
        settings={},
    )
    assert doc["tasks"][PICK]["success_at_end"]["successes"] == 7  # defaults to success_once
    assert doc["metrics"]["mean_steps"] == {"value": 31.5}
    assert schema_errors("evaluation", doc) == []
    with pytest.raises(InvalidInputError, match="no per-task counts"):
        build_evidence(
            EvalRecord(result={"tasks": {}}, label="x", mode="bc"), name="n", run_id="r", seeds={}, settings={}
        )
    with pytest.raises(ValueError, match="unique"):
        build_evidence(
            EvalRecord(result=rows, label="x", mode="bc"),
            baselines=[EvalRecord(result=rows, label="x", mode="bc")],
            name="n",
            run_id="r",
            seeds={},
            settings={},
        )


def test_the_simulators_summary_shape_is_read():
    """reproduction.sim's EvalResult.to_dict(): per-task "k/n" texts, rates and mechanism metrics."""
    result = {
        "episodes": 40,
        "success_once_rate": 0.9,
        "seconds": 12.3,
        "tasks": {
            PICK: {
                "episodes": 20,
                "success_once": "19/20",
                "success_at_end": "18/20",
                "success_once_rate": 0.95,
                "success_at_end_rate": 0.9,
                "mean_first_success_step": 31.5,
                "detours_per_episode": 0.1,
                "stalls_per_episode": 0.0,
                "drops_per_episode": None,
            },
            PUSH: {"episodes": 20, "success_once": "17/20", "success_at_end": "17/20"},
        },
    }
    doc = build_evidence(
        EvalRecord(result=result, label="recap", mode="recap"), name="n", run_id="r", seeds={}, settings={}
    )
    assert doc["metrics"]["success_once"]["display"] == "90.0% (36/40)"
    assert doc["metrics"]["success_at_end"]["display"] == "87.5% (35/40)"
    assert doc["tasks"][PICK]["details"] == {
        "detours_per_episode": 0.1,
        "drops_per_episode": None,
        "mean_first_success_step": 31.5,
        "stalls_per_episode": 0.0,
    }
    assert "details" not in doc["tasks"][PUSH] and "seconds" not in json.dumps(doc)  # timings are not evidence
    assert schema_errors("evaluation", doc) == []
    for bad in ("19/21", "x/20", 19.5):
        broken = json.loads(json.dumps(result))
        broken["tasks"][PICK]["success_once"] = bad
        with pytest.raises(InvalidInputError, match="success count"):
            build_evidence(
                EvalRecord(result=broken, label="r", mode="recap"), name="n", run_id="r", seeds={}, settings={}
            )


def test_schema_catches_broken_evidence():
    good = make_evidence()
    for breaks in (
        lambda d: d.update(format_version="2.0"),
        lambda d: d["metrics"].pop("success_once"),
        lambda d: d["metrics"]["success_once"].update(rate=1.5),
        lambda d: d["tasks"][PICK]["success_once"].update(display="lots"),
        lambda d: d["policy"]["checkpoint"].update(sha256="short"),
        lambda d: d["policy"].update(mode="magic"),
        lambda d: d.update(tasks={}),
    ):
        broken = json.loads(json.dumps(good))
        breaks(broken)
        assert schema_errors("evaluation", broken), broken


def test_identical_evidence_is_reproduced_on_every_metric():
    doc = make_evidence()
    result = compare_evidence(doc, make_evidence(name="reference"))
    assert result.reproduced and result.differing == []
    # 2 policies x (2 overall + 2 tasks x 2) metrics
    assert len(result.rows) == 12
    assert all(r.verdict == "reproduced" and r.difference == 0 for r in result.rows)
    assert schema_errors("comparison", result.to_dict()) == []
    table = result.render()
    assert table.splitlines()[0].split() == ["metric", "reference", "this", "run", "diff", "tolerance", "verdict"]
    assert table.count("reproduced") == 13 and "differs" not in table


def test_binomial_tolerance_is_three_standard_errors_of_the_difference():
    ref, act = count_metric(386, 500), count_metric(386, 500)
    p = 773 / 1002
    assert binomial_tolerance(ref, act) == pytest.approx(3 * math.sqrt(p * (1 - p) * (2 / 500)))
    assert binomial_tolerance(ref, act) == pytest.approx(0.0797, abs=1e-4)
    # More episodes, tighter tolerance; a perfect score still has a non-zero one (smoothed p).
    assert binomial_tolerance(count_metric(50, 100), count_metric(50, 100)) > binomial_tolerance(
        count_metric(500, 1000), count_metric(500, 1000)
    )
    assert binomial_tolerance(count_metric(20, 20), count_metric(20, 20)) > 0


def test_a_real_drop_differs_and_noise_is_reproduced():
    reference = make_evidence(name="reference", recap=(386, 500), bc=(300, 500))
    noisy = make_evidence(recap=(380, 500), bc=(310, 500))
    assert compare_evidence(noisy, reference).reproduced
    dropped = make_evidence(recap=(300, 500), bc=(300, 500))
    result = compare_evidence(dropped, reference)
    assert not result.reproduced
    differing = {r.metric for r in result.differing}
    assert "recap/success_once" in differing and not any(m.startswith("bc/") for m in differing)
    line = next(x for x in result.render().splitlines() if x.startswith("recap/success_once "))
    assert "77.2% (386/500)" in line and "60.0% (300/500)" in line and line.rstrip().endswith("differs")
    assert result.render().splitlines()[-1].endswith("differs (6 of 12 metrics)")


def test_declared_tolerances_override_the_binomial_one():
    reference = make_evidence(name="reference", recap=(386, 500))
    reference["tolerances"] = {"success_once": 0.001, "recap/success_at_end": 0.5}
    near = make_evidence(recap=(384, 500))
    result = compare_evidence(near, reference)
    rows = {r.metric: r for r in result.rows}
    assert rows["recap/success_once"].basis == "declared" and rows["recap/success_once"].verdict == "differs"
    assert rows["recap/success_at_end"].tolerance == 0.5 and rows["recap/success_at_end"].verdict == "reproduced"
    assert rows["bc/success_once"].tolerance == 0.001  # "success_once" applies to every policy
    assert rows[f"recap/{PICK}/success_once"].tolerance == 0.001
    # The caller's tolerances win over the reference's.
    assert compare_evidence(near, reference, tolerances={"success_once": 0.1}).rows[0].verdict == "reproduced"
    assert schema_errors("evaluation", reference) == []


def test_missing_policy_task_or_metric_differs():
    reference = make_evidence(name="reference")
    reference["metrics"]["mean_steps"] = {"value": 30.0}
    actual = make_evidence()
    actual["baselines"] = []
    del actual["tasks"][PUSH]
    result = compare_evidence(actual, reference)
    rows = {r.metric: r for r in result.rows}
    assert rows["bc/success_once"].actual is None and rows["bc/success_once"].verdict == "differs"
    assert rows[f"recap/{PUSH}/success_once"].actual_display == "missing"
    assert rows["recap/mean_steps"].verdict == "differs" and rows["recap/mean_steps"].basis == "exact"
    actual["metrics"]["mean_steps"] = {"value": 30.0}
    assert compare_evidence(actual, reference).rows[2].verdict == "reproduced"
    assert schema_errors("comparison", result.to_dict()) == []


def test_files_round_trip_and_bad_files_are_refused(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(make_evidence()))
    (tmp_path / "ref.json").write_text(json.dumps(make_evidence(name="reference")))
    result = compare_files(tmp_path / "a.json", tmp_path / "ref.json", out=tmp_path / "comparison.json")
    saved = json.loads((tmp_path / "comparison.json").read_text())
    assert saved["reproduced"] is True and saved == result.to_dict()
    with pytest.raises(InputNotFoundError):
        load_evidence(tmp_path / "absent.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(InvalidInputError):
        load_evidence(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text('{"format": "something"}')
    with pytest.raises(InvalidInputError, match="not recap-portable-evaluation"):
        load_evidence(tmp_path / "other.json")
    newer = make_evidence()
    newer["format_version"] = "2.0"
    (tmp_path / "newer.json").write_text(json.dumps(newer))
    with pytest.raises(UnsupportedFormatError) as exc:
        load_evidence(tmp_path / "newer.json")
    assert exc.value.exit_code == 4 and exc.value.hint


def test_evidence_is_deterministic_unless_stamped():
    from datetime import datetime, timezone

    assert json.dumps(make_evidence()) == json.dumps(make_evidence())
    assert "created" not in make_evidence()
    stamped = build_evidence(
        EvalRecord(result=eval_result({PICK: (1, 2)}), label="bc", mode="bc"),
        name="n",
        run_id="r",
        seeds={},
        settings={},
        created=datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc),
    )
    assert stamped["created"] == "2026-01-02T03:04:05Z" and schema_errors("evaluation", stamped) == []
