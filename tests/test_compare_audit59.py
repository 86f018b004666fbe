"""audit59 C1-C7: compare's note on a run side too small for `differs`, `eval --plan`'s signed --difference, Holm
counting success_at_end with success_once's counts as its own test (C3 reverted), a 0-episode row's null difference, a
missing task's note, a value row's digits, and per-task details refused when not finite."""

from __future__ import annotations

import json
import math

import pytest
from evidence_fixtures import control_plane_cli, write_json

from reproduction.errors import InvalidInputError
from reproduction.run.comparison import compare_evidence, holm_differs
from reproduction.run.evidence import EvalRecord, build_evidence, load_evidence


def _result(tasks: dict[str, tuple[list[int], list[int]]]) -> dict:
    """An EvalResult.to_dict() of {task: (reset seeds, 0/1 outcomes)}, success_at_end = success_once."""
    out: dict = {"tasks": {}, "per_episode": {}}
    for task, (seeds, outcomes) in tasks.items():
        k = sum(outcomes)
        out["tasks"][task] = {"episodes": len(outcomes), "success_once": k, "success_at_end": k}
        out["per_episode"][task] = [
            {"episode": j, "reset_seed": s, "success_once": bool(c), "success_at_end": bool(c)}
            for j, (s, c) in enumerate(zip(seeds, outcomes, strict=True))
        ]
    return out


def _evidence(name: str, tasks: dict[str, tuple[list[int], list[int]]], **record: object) -> dict:
    return build_evidence(
        EvalRecord(result=_result(tasks), label="recap", mode="recap", **record),
        name=name,
        run_id="r",
        seeds={"eval": 1},
        settings={},
    )


def _ref200() -> dict:
    return _evidence("ref", {"t": (list(range(200)), [1] * 20 + [0] * 180)})


# -- C1: one run episode against 200 ---------------------------------------------------------------------------------


def test_a_run_side_too_small_for_differs_is_noted_and_the_verdict_kept():
    act = _evidence("act", {"t": ([10**6], [1])})  # unpaired: no seed shared
    c = compare_evidence(act, _ref200())
    assert c.verdict == "differs"  # kept: the note says why it may not be an alpha-level claim
    assert (
        "this run is too small for a `differs` at alpha on 4 of 4 rows: e.g. recap/success_at_end has 1 episodes "
        "against the reference's 200, and an unpaired row's test of `differs` exceeds alpha with fewer than about "
        "15 episodes a side or sides more than 10 times apart (evidence/README.md); evaluating more episodes, or the "
        "reference's reset seeds (paired), lets the verdict keep alpha"
    ) in c.notes


def test_a_run_of_balanced_size_that_differs_has_no_run_size_note():
    ref = _evidence("ref", {"t": (list(range(100)), [1] * 90 + [0] * 10)})
    act = _evidence("act", {"t": (list(range(10**6, 10**6 + 100)), [1] * 40 + [0] * 60)})
    c = compare_evidence(act, ref)
    assert c.verdict == "differs"
    assert not [n for n in c.notes if n.startswith("this run is too small")]


# -- C2: --difference is signed ----------------------------------------------------------------------------------------


def test_plan_says_the_difference_is_signed_and_gives_the_other_sign():
    out = control_plane_cli("eval", "--plan", "--rate", "0.9", "--margin", "0.1", "--difference", "0.03")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "true difference 0.03 (this run's rate minus the reference's: the run better); exact" in lines[0]
    assert lines[1].split()[-1] == "212"
    assert lines[2] == (
        "the other sign, --difference -0.03 (the run worse by as much), needs 267 per side for rate 0.9 (p=0.900): "
        "plan for the larger if either sign may hold"
    )
    help_text = " ".join(control_plane_cli("eval", "--help").stdout.split())
    assert "signed: this run's rate minus the reference's (default 0); the other sign can need more" in help_text


# -- C3 (reverted, review59 S1): success_at_end with success_once's counts stays its own test ----------------------


def test_success_at_end_equal_to_success_once_stays_two_holm_tests():
    """Merging them by their counts (a data-dependent family) let the overall `differs` exceed alpha at a true
    difference of the margin (0.071 at n 18): Holm counts them as two tests, and here holds neither."""
    ref = _evidence("ref", {"t": (list(range(500)), [1] * 450 + [0] * 50)})
    act = _evidence("act", {"t": (list(range(10**6, 10**6 + 500)), [1] * 488 + [0] * 12)})
    c = compare_evidence(act, ref)
    assert [r.verdict for r in c.rows] == ["differs"] * 4
    assert 0.025 < c.rows[0].p_differs < 0.05
    assert holm_differs(c.rows, 0.05) == {}
    assert c.verdict == "inconclusive"
    assert "Holm's step-down over the 2 distinct rate tests (4 rate rows; 2 per-task rows" in c.render()


# -- C4, C5: no episodes, no task ------------------------------------------------------------------------------------


def test_a_row_of_no_episodes_has_no_rate_and_no_difference():
    ref = _evidence("ref", {"t": (list(range(100)), [1] * 100), "u": (list(range(100)), [1] * 100)})
    act = _evidence("act", {"t": (list(range(100)), [1] * 100), "u": ([], [])})
    c = compare_evidence(act, ref)
    rows = {r["metric"]: r for r in c.to_dict()["rows"]}
    row = rows["recap/u/success_once"]
    assert (row["verdict"], row["actual"], row["difference"]) == ("inconclusive", None, None)
    assert row["actual_counts"] == [0, 0]
    line = next(x for x in c.render().splitlines() if x.startswith("recap/u/success_once"))
    assert "-1.000" not in line and line.split()[-5:-3] == ["(0/0)", "-"]
    assert c.verdict == "inconclusive"
    assert "recap: this run evaluated 0 episodes of 'u', so that task is left out" in " ".join(c.notes)


def test_a_task_the_run_lacks_differs_and_its_note_says_lacks():
    ref = _evidence("ref", {"t": (list(range(100)), [1] * 100), "u": (list(range(100)), [1] * 100)})
    act = _evidence("act", {"t": (list(range(100)), [1] * 100)})
    c = compare_evidence(act, ref)
    assert c.verdict == "differs"  # README: a policy, task or metric the run lacks differs
    assert not [n for n in c.notes if "evaluated 0 episodes" in n]
    assert (
        "recap: this run lacks 'u' (a task the run lacks differs: its rows say `missing`), so that task is left out "
        "of recap's overall rates on both sides (like with like: the reference's overall counts here are over the "
        "other tasks)"
    ) in c.notes


# -- C6: a value row's digits ------------------------------------------------------------------------------------------


def test_a_value_row_off_by_2e9_shows_the_digits_that_differ():
    seeds = (list(range(100)), [1] * 90 + [0] * 10)
    ref = _evidence("ref", {"t": seeds}, extra_metrics={"mean_len": 0.5})
    act = _evidence("act", {"t": seeds}, extra_metrics={"mean_len": 0.5 + 2e-9})
    c = compare_evidence(act, ref)
    line = next(x for x in c.render().splitlines() if x.startswith("recap/mean_len"))
    assert line.split()[1:4] == ["0.5", "0.500000002", "+2e-09"]
    assert line.split()[-1] == "differs"
    same = compare_evidence(_evidence("act", {"t": seeds}, extra_metrics={"mean_len": 0.5}), ref)
    line = next(x for x in same.render().splitlines() if x.startswith("recap/mean_len"))
    assert line.split()[1:4] == ["0.5", "0.5", "+0.000"]


# -- C7: details must be finite --------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_details_are_refused_when_built(bad):
    result = _result({"t": (list(range(10)), [1] * 10)})
    result["tasks"]["t"]["detours_per_episode"] = bad
    with pytest.raises(InvalidInputError) as err:
        build_evidence(
            EvalRecord(result=result, label="recap", mode="recap"), name="x", run_id="r", seeds={}, settings={}
        )
    assert err.value.field == "details['detours_per_episode']"
    assert f"details['detours_per_episode'] is {bad!r}, not a finite number or null" in str(err.value)


def test_non_finite_details_are_refused_when_read(tmp_path):
    doc = _evidence("x", {"t": (list(range(10)), [1] * 10)})
    doc["tasks"]["t"]["details"] = {"detours_per_episode": math.nan}
    path = tmp_path / "nan.json"
    path.write_text(json.dumps(doc))  # a bare NaN, as build_evidence wrote it before
    with pytest.raises(InvalidInputError, match=r"details\['detours_per_episode'\] is nan, not a finite number"):
        load_evidence(path)
    ref = write_json(tmp_path / "ref.json", _evidence("ref", {"t": (list(range(10)), [1] * 10)}))
    out = control_plane_cli("compare", ref, str(path))
    assert out.returncode == 4, out.stderr
    assert "details['detours_per_episode'] is nan" in out.stderr
