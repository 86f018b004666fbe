"""Evaluation evidence JSON, its schema, and the comparison with reference evidence under tolerances."""

from __future__ import annotations

import json

import pytest
from evidence_fixtures import PICK, PUSH, eval_result, make_evidence, schema_errors

from reproduction.errors import InputNotFoundError, InvalidInputError, UnsupportedFormatError
from reproduction.run.evidence import (
    Comparison,
    EvalRecord,
    build_evidence,
    compare_evidence,
    compare_files,
    count_metric,
    load_evidence,
    write_eval_evidence,
)


def test_counts_read_like_release_notes():
    assert count_metric(386, 500) == {
        "successes": 386,
        "episodes": 500,
        "rate": 0.772,
        "display": "77.2% (386/500)",
        "wilson95": [0.733234, 0.806618],  # Wilson 1927 score interval
    }
    assert count_metric(0, 10)["wilson95"] == [0.0, 0.277533] and count_metric(10, 10)["wilson95"][1] == 1.0
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
        lambda d: d.update(format_version="3.0"),
        lambda d: d["metrics"]["success_once"].update(wilson95=[0.1]),
        lambda d: d.update(margins={"success_once": 0}),
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


def test_identical_evidence_is_reproduced_only_with_enough_episodes():
    # 38/40 against 38/40 unpaired: the 90% Newcombe interval is about +-0.09, wider than the 0.05 margin.
    small = compare_evidence(make_evidence(), make_evidence(name="reference"))
    assert small.verdict == "inconclusive" and not small.reproduced
    assert len(small.rows) == 12  # 2 policies x (2 overall + 2 tasks x 2) metrics
    assert {r.verdict for r in small.rows} == {"inconclusive"} and all(r.difference == 0 for r in small.rows)
    assert schema_errors("comparison", small.to_dict()) == []
    # 1900/2000 against 1900/2000 (p = 0.95): the interval is +-0.0114, inside +-0.05.
    big = compare_evidence(
        make_evidence(recap=(1900, 2000), bc=(1000, 2000)), make_evidence(recap=(1900, 2000), bc=(1000, 2000))
    )
    rows = {r.metric: r for r in big.rows}
    assert rows["recap/success_once"].verdict == "reproduced"
    assert rows["recap/success_once"].high == pytest.approx(-rows["recap/success_once"].low, abs=1e-12)
    assert rows["recap/success_once"].high == pytest.approx(0.0114, abs=5e-4)
    assert rows["bc/success_once"].verdict == "reproduced"  # p = 0.5 on 2000: +-0.026
    table = big.render()
    assert table.splitlines()[0].split()[:6] == ["metric", "reference", "this", "run", "diff", "[90%"]
    line = next(x for x in table.splitlines() if x.startswith("recap/success_once "))
    assert "95.0% (1900/2000)" in line and "+0.000 [-0.011, +0.011]" in line and "±0.050 (newcombe-10)" in line


def test_three_verdicts_of_the_equivalence_test():
    reference = make_evidence(name="reference", recap=(1800, 2000), bc=(1000, 2000))
    rows = lambda actual: {r.metric: r for r in compare_evidence(actual, reference).rows}  # noqa: E731
    far = rows(make_evidence(recap=(1500, 2000), bc=(1000, 2000)))  # -0.15: the whole interval below -0.05
    assert far["recap/success_once"].verdict == "differs" and far["recap/success_once"].high < -0.05
    assert far["recap/success_once"].reference_counts == (1800, 2000)
    assert far["recap/success_once"].actual_counts == (1500, 2000)
    near = rows(make_evidence(recap=(1730, 2000), bc=(1000, 2000)))  # -0.035 [-0.052, -0.018]: straddles -0.05
    assert near["recap/success_once"].verdict == "inconclusive"
    assert near["recap/success_once"].low < -0.05 < near["recap/success_once"].high
    # The example: 36/40 against 45/50 passed the old rule's +-0.19 band; now it is "inconclusive".
    from reproduction.run.stats import equivalence_independent

    old_pass = equivalence_independent(45, 50, 36, 40, margin=0.05, alpha=0.05)
    assert old_pass.verdict == "inconclusive" and old_pass.low < -0.1 and old_pass.high > 0.1
    overall = compare_evidence(make_evidence(recap=(1500, 2000), bc=(1000, 2000)), reference)
    assert overall.verdict == "differs" and overall.render().splitlines()[-1].endswith(
        "differs (6 differ, 0 inconclusive of 12 metrics)"
    )


def test_declared_margins_override_the_default_and_old_tolerances_read_as_margins():
    reference = make_evidence(name="reference", recap=(1800, 2000))
    reference["tolerances"] = {"success_once": 0.001, "recap/success_at_end": 0.3}  # 1.x field
    result = compare_evidence(make_evidence(recap=(1790, 2000)), reference)
    rows = {r.metric: r for r in result.rows}
    assert rows["recap/success_once"].margin == 0.001 and rows["recap/success_once"].verdict == "inconclusive"
    assert rows["recap/success_at_end"].margin == 0.3 and rows["recap/success_at_end"].verdict == "reproduced"
    assert rows["bc/success_once"].margin == 0.001  # "success_once" applies to every policy
    assert rows[f"recap/{PICK}/success_once"].margin == 0.001
    assert rows["bc/success_at_end"].margin == 0.05  # the default
    reference["margins"] = {"success_once": 0.2}  # 2.x field wins over 1.x tolerances
    assert compare_evidence(make_evidence(recap=(1790, 2000)), reference).rows[0].margin == 0.2
    # The caller's margin wins over the reference's.
    assert compare_evidence(make_evidence(recap=(1790, 2000)), reference, margin=0.1).rows[0].margin == 0.1
    assert schema_errors("evaluation", reference) == []


def test_paired_by_reset_seed_when_both_sides_carry_the_same_initial_states():
    def with_outcomes(flips: int = 0, seed0: int = 0) -> dict:
        per_episode = {
            PICK: [
                {
                    "episode": i,
                    "reset_seed": seed0 + 2 * i + 1,
                    "success_once": (i % 10 != 0) != (i < flips),
                    "success_at_end": i % 10 != 0,
                }
                for i in range(100)
            ]
        }
        once = sum(e["success_once"] for e in per_episode[PICK])
        result = {
            "tasks": {PICK: {"episodes": 100, "success_once": once, "success_at_end": 90}},
            "per_episode": per_episode,
        }
        return build_evidence(
            EvalRecord(result=result, label="recap", mode="recap"),
            name="n",
            run_id="r",
            seeds={"eval": seed0},
            settings={},
        )

    reference = with_outcomes()
    assert reference["tasks"][PICK]["outcomes"]["success_at_end"] == ("0" + "1" * 9) * 10
    assert schema_errors("evaluation", reference) == []
    same = compare_evidence(with_outcomes(), reference)
    # 0 discordant of 100: Tango's 90% interval is +-0.0263 (n d / (1 - d) = z^2), inside +-0.05.
    assert same.verdict == "reproduced", same.render()
    row = same.rows[0]
    assert row.method == "tango-paired" and row.high == pytest.approx(0.026343, abs=1e-5)
    assert "paired by reset seed: 100 episodes, 0 succeeded only in the reference, 0 only here" in row.note
    # Unpaired, the same 90/100 against 90/100 cannot say reproduced.
    for o in (reference, same_ := with_outcomes()):
        del o["tasks"][PICK]["outcomes"]
    assert compare_evidence(same_, reference).rows[0].verdict == "inconclusive"
    # Other initial states (another eval seed): unpaired, and the summary says why.
    other = compare_evidence(with_outcomes(seed0=1000), with_outcomes())
    assert other.rows[0].method == "newcombe-10" and other.verdict == "inconclusive"
    assert any("evaluation seeds differ" in n for n in other.notes)
    assert "note: seed 'eval' differs: reference 0, this run 1000" in other.render()


def test_exact_match_values_keep_their_tolerance():
    reference = make_evidence(name="reference", recap=(1800, 2000))
    reference["metrics"]["detours_per_episode"] = {"value": 0.05}
    actual = make_evidence(recap=(1800, 2000))
    actual["metrics"]["detours_per_episode"] = {"value": 0.06}
    row = next(r for r in compare_evidence(actual, reference).rows if r.metric == "recap/detours_per_episode")
    assert (row.kind, row.method, row.verdict, row.interval_text()) == ("value", "exact", "differs", "")
    reference["margins"] = {"detours_per_episode": 0.02}
    row = next(r for r in compare_evidence(actual, reference, margin=0.3).rows if r.kind == "value")
    assert (row.method, row.margin, row.verdict) == ("declared", 0.02, "reproduced")  # --margin is for rates only
    assert "(value, declared)" in compare_evidence(actual, reference).render()


def test_old_comparison_and_evidence_files_are_still_read(tmp_path):
    old = {
        "format": "recap-portable-comparison",
        "format_version": "1.0",
        "actual": "a",
        "reference": "r",
        "reproduced": False,
        "rows": [
            {
                "metric": "recap/success_once",
                "reference": 0.9,
                "actual": 0.8,
                "difference": -0.1,
                "tolerance": 0.19,
                "basis": "binomial 3 SE",
                "reference_display": "90.0% (45/50)",
                "actual_display": "80.0% (32/40)",
                "verdict": "differs",
            }
        ],
    }
    back = Comparison.from_dict(old)
    assert back.verdict == "differs" and back.rows[0].margin == 0.19 and back.rows[0].kind == "rate"
    assert back.rows[0].method == "binomial 3 SE" and back.rows[0].low is None
    v1 = make_evidence()
    v1["format_version"] = "1.0"
    for entry in (v1, *v1["baselines"]):
        for m in entry["metrics"].values():
            m.pop("wilson95", None)
    (tmp_path / "v1.json").write_text(json.dumps(v1))
    assert compare_files(tmp_path / "v1.json", tmp_path / "v1.json").verdict == "inconclusive"


def test_missing_policy_task_or_metric_differs():
    reference = make_evidence(name="reference")
    reference["metrics"]["mean_steps"] = {"value": 30.0}
    actual = make_evidence()
    actual["baselines"] = []
    del actual["tasks"][PUSH]
    # the overall counts are the remaining task's (an overall count must be the sum of its tasks', audit46 F3)
    actual["metrics"] |= {m: actual["tasks"][PICK][m] for m in ("success_once", "success_at_end")}
    result = compare_evidence(actual, reference)
    rows = {r.metric: r for r in result.rows}
    assert rows["bc/success_once"].actual is None and rows["bc/success_once"].verdict == "differs"
    assert rows[f"recap/{PUSH}/success_once"].actual_display == "missing"
    assert rows["recap/mean_steps"].verdict == "differs" and rows["recap/mean_steps"].method == "exact"
    actual["metrics"]["mean_steps"] = {"value": 30.0}
    assert compare_evidence(actual, reference).rows[2].verdict == "reproduced"
    assert schema_errors("comparison", result.to_dict()) == []


def test_files_round_trip_and_bad_files_are_refused(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(make_evidence()))
    (tmp_path / "ref.json").write_text(json.dumps(make_evidence(name="reference")))
    result = compare_files(tmp_path / "a.json", tmp_path / "ref.json", out=tmp_path / "comparison.json")
    saved = json.loads((tmp_path / "comparison.json").read_text())
    assert saved["verdict"] == "inconclusive" and saved["reproduced"] is False and saved == result.to_dict()
    with pytest.raises(InputNotFoundError):
        load_evidence(tmp_path / "absent.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(InvalidInputError):
        load_evidence(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text('{"format": "something"}')
    with pytest.raises(InvalidInputError, match="not recap-portable-evaluation"):
        load_evidence(tmp_path / "other.json")
    newer = make_evidence()
    newer["format_version"] = "3.0"
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


def _one_task(outcomes: str, seeds: list[int], name: str = "n") -> dict:
    """Evidence of one policy on one task whose episodes started from `seeds` with these 0/1 outcomes."""
    per_episode = {
        PICK: [
            {"episode": i, "reset_seed": s, "success_once": ch == "1", "success_at_end": ch == "1"}
            for i, (s, ch) in enumerate(zip(seeds, outcomes))
        ]
    }
    k = outcomes.count("1")
    result = {"tasks": {PICK: {"episodes": len(seeds), "success_once": k, "success_at_end": k}}}
    return build_evidence(
        EvalRecord(result=result | {"per_episode": per_episode}, label="recap", mode="recap"),
        name=name,
        run_id="r",
        seeds={"eval": 0},
        settings={},
    )


def test_repeated_reset_seeds_are_compared_unpaired_not_collapsed():
    # The audit's case: every seed evaluated twice; the reference 60/120, this run 120/120. Keyed by seed, the
    # repeats collapsed onto one outcome each and the paired test said `reproduced` (exit 0).
    seeds = list(range(60)) * 2
    reference = _one_task("0" * 60 + "1" * 60, seeds, name="reference")
    result = compare_evidence(_one_task("1" * 120, seeds), reference)
    assert result.verdict == "differs", result.render()
    row = result.rows[0]
    assert row.method == "newcombe-10" and row.reference_counts == (60, 120) and row.actual_counts == (120, 120)
    assert "initial state repeats" in row.note
    # Equal counts on repeated seeds: never `differs` (the collapse made 60/120 vs 60/120 look discordant).
    swapped = compare_evidence(_one_task("1" * 60 + "0" * 60, seeds), reference)
    assert {r.verdict for r in swapped.rows} == {"inconclusive"}


def _bad(doc: dict, path: str, value) -> dict:
    """A copy of `doc` with the field at `path` ("a.b.0.c") set to value (or deleted when value is ...)."""
    doc = json.loads(json.dumps(doc))
    *parents, last = [int(k) if k.isdigit() else k for k in path.split(".")]
    where = doc
    for k in parents:
        where = where[k]
    if value is ...:
        del where[last]
    else:
        where[last] = value
    return doc


@pytest.mark.parametrize(
    "path, value, field",
    [
        ("metrics.success_once.successes", -5, "metrics.success_once.successes"),
        ("metrics.success_once.successes", 41, "metrics.success_once"),
        ("metrics.success_once.successes", float("nan"), "metrics.success_once.successes"),
        ("metrics.success_once.successes", 37.5, "metrics.success_once.successes"),
        ("metrics.success_once.successes", True, "metrics.success_once.successes"),
        ("metrics.success_once.successes", "38", "metrics.success_once.successes"),
        ("metrics.success_once.successes", ..., "metrics.success_once.successes"),
        ("metrics.success_once.episodes", float("inf"), "metrics.success_once.episodes"),
        ("metrics.success_once.display", ..., "metrics.success_once.display"),
        ("metrics.success_once.rate", 0.1, "metrics.success_once.rate"),
        ("metrics.success_once", None, "metrics.success_once"),
        ("metrics", ..., "metrics"),
        ("policy", ..., "policy.label"),
        ("baselines.0.metrics.success_at_end.episodes", -1, "baselines[0].metrics.success_at_end.episodes"),
        (f"tasks.{PICK}.success_once.successes", 25, f"tasks[{PICK!r}].success_once"),
        ("alpha", 0.7, "alpha"),
        ("alpha", "x", "alpha"),
        ("margins", {"success_once": -0.1}, "margins['success_once']"),
        ("margins", {"success_once": 2}, "margins['success_once']"),
        ("sequential", {"level": 0.9}, "sequential.level"),
    ],
)
def test_malformed_evidence_is_refused_naming_the_field(tmp_path, path, value, field):
    doc = _bad(make_evidence(), path, value)
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(InvalidInputError) as exc:
        load_evidence(tmp_path / "bad.json")
    assert exc.value.exit_code == 4 and exc.value.field == field and "bad.json" in exc.value.hint
    with pytest.raises(InvalidInputError):  # documents built in memory are checked the same way
        compare_evidence(make_evidence(), doc)


def test_outcomes_must_add_up_to_the_counts_and_a_reference_needs_episodes():
    good = _one_task("1" * 90 + "0" * 10, list(range(1, 200, 2)))
    lying = _bad(good, f"tasks.{PICK}.outcomes.success_once", "1" * 100)  # outcomes 100/100, counts 90/100
    with pytest.raises(InvalidInputError, match="holds 100 successes in 100 episodes"):
        compare_evidence(lying, good)
    short = _bad(good, f"tasks.{PICK}.outcomes.reset_seeds", list(range(50)))
    with pytest.raises(InvalidInputError, match="reset_seeds"):
        compare_evidence(good, short)
    texts = _bad(good, f"tasks.{PICK}.outcomes.reset_seeds", [str(s) for s in range(100)])
    with pytest.raises(InvalidInputError, match="list of whole numbers"):
        compare_evidence(good, texts)
    empty = make_evidence(recap=(0, 0), bc=(0, 0))
    with pytest.raises(InvalidInputError, match="the reference has 0 episodes"):
        compare_evidence(make_evidence(), empty)
    # this run has none: nothing was measured, so inconclusive (it was differs until audit46 stats F7)
    none = compare_evidence(empty, make_evidence())
    assert none.verdict == "inconclusive" and {r.verdict for r in none.rows} == {"inconclusive"}


def test_the_verdict_line_says_policies_are_paired_by_label_not_primary_against_primary():
    """audit46 newcomer F18: the line read "recap w=1 after 1000 steps vs reference recap w=2 after 1000 steps:
    differs", as if those two had been compared; each side's name is its own primary (recap at its best w), and the
    rows pair policies by label."""
    result = compare_evidence(
        make_evidence(name="recap w=1 after 10 steps"), make_evidence(name="recap w=2 after 10 steps")
    )
    assert result.render().splitlines()[-1] == (
        "every policy vs the reference's of the same label (this run's primary: recap w=1 after 10 steps; the "
        "reference's: recap w=2 after 10 steps): inconclusive (0 differ, 12 inconclusive of 12 metrics)"
    )
