"""The statistics audit of `portable compare` with simulated truth, round 2 (audit54 B1, B3, B4): overall rows that
weighted the tasks differently on the two sides (a task of 0 or fewer episodes in the run), `seeds` / `settings`
that are no objects, and a task's `episodes` / a count's `wilson95` that were never checked. Each test fails on the
code before its fix."""

from __future__ import annotations

import json
import random

import pytest
from evidence_fixtures import control_plane_cli as portable
from evidence_fixtures import write_json as _write

from reproduction.errors import InvalidInputError
from reproduction.run.comparison import NOT_COUNTED, UNEVEN, Comparison, compare_evidence
from reproduction.run.evidence import EvalRecord, build_evidence
from reproduction.run.evidence_check import check_evidence


def _evidence(counts: dict[str, tuple[int, int]], name: str, seed: int = 1) -> dict:
    """Evidence of policy `recap` with per-task counts {task: (successes, episodes)} and no outcomes (unpaired)."""
    result = {"tasks": {t: {"episodes": n, "success_once": k, "success_at_end": k} for t, (k, n) in counts.items()}}
    record = EvalRecord(result=result, label="recap", mode="recap")
    return build_evidence(record, name=name, run_id="r", seeds={"eval": seed}, settings={})


REF = {"A": (90, 100), "B": (10, 100)}


# -- B4: overall rows that mix the tasks in each side's own proportions -------------------------------------------


def test_a_task_of_0_episodes_is_left_out_of_both_overall_rows_not_differs(tmp_path):
    """Reference A 90/100 + B 10/100, the run A 90/100 + B 0/0: every task's rate equal, the overall row read
    50.0% vs 90.0% `differs` (exit 60)."""
    ref, act = _evidence(REF, "ref"), _evidence({"A": (90, 100), "B": (0, 0)}, "act", seed=2)
    c = compare_evidence(act, ref)
    overall = {r.metric: r for r in c.rows if r.metric.count("/") == 1}
    assert {m: (r.reference_counts, r.actual_counts, r.verdict) for m, r in overall.items()} == {
        "recap/success_once": ((90, 100), (90, 100), "inconclusive"),
        "recap/success_at_end": ((90, 100), (90, 100), "inconclusive"),
    }
    assert c.verdict == "inconclusive" and not any(r.verdict == "differs" for r in c.rows)
    assert (
        "recap: this run evaluated 0 episodes of 'B', so that task is left out of recap's overall rates on both sides "
        "(like with like: the reference's overall counts here are over the other tasks)"
    ) in c.notes
    out = portable("compare", _write(tmp_path / "ref.json", ref), _write(tmp_path / "act.json", act))
    assert out.returncode == 61, out.stdout + out.stderr


@pytest.mark.parametrize("act", [{"A": (90, 100), "B": (2, 20)}, {"A": (18, 20), "B": (10, 100)}])
def test_uneven_task_counts_make_the_overall_rows_not_counted_with_a_note(tmp_path, act):
    """B at 2/20 (the reference's 10%, fewer episodes) read 50.0% vs 76.7% `differs`, exit 60. Now the overall rows
    are shown but not counted, and the per-task rows (inconclusive at these counts) decide: exit 61."""
    ref, doc = _evidence(REF, "ref"), _evidence(act, "act", seed=2)
    c = compare_evidence(doc, ref)
    overall = [r for r in c.rows if r.metric.count("/") == 1]
    assert [(r.verdict, r.note, r.p_differs) for r in overall] == [("inconclusive", UNEVEN, None)] * 2
    assert c.shown_verdicts()[:2] == [NOT_COUNTED] * 2
    assert c.verdict == "inconclusive"
    assert c.counts()["inconclusive"] == sum(r.verdict == "inconclusive" for r in c.rows) - 2
    assert " of 6 metrics; 2 shown but not counted (uneven task mix))" in c.verdict_text()
    (note,) = [n for n in c.notes if "same proportion" in n]
    (a_ref, a_act), (b_ref, b_act) = (REF["A"][1], act["A"][1]), (REF["B"][1], act["B"][1])
    assert note.startswith(
        f"recap: the tasks' episode counts are not in the same proportion on both sides ('A' reference {a_ref}, this "
        f"run {a_act}; 'B' reference {b_ref}, this run {b_act}), so recap's overall success_once and success_at_end "
        "rows would weight the tasks differently (by more than 0.1 of the margin at the reference's task rates) and "
        "are shown but not counted: the verdict follows the per-task rows"
    )
    out = portable("compare", _write(tmp_path / "ref.json", ref), _write(tmp_path / "act.json", doc))
    assert out.returncode == 61, out.stdout + out.stderr


def test_proportional_task_counts_keep_the_pooled_overall_test():
    """Half the reference's episodes on every task weights the tasks alike: the overall rows are tested as before."""
    c = compare_evidence(_evidence({"A": (45, 50), "B": (5, 50)}, "act", seed=2), _evidence(REF, "ref"))
    overall = [r for r in c.rows if r.metric.count("/") == 1]
    assert [(r.reference_counts, r.actual_counts, r.method, r.note) for r in overall] == [
        ((100, 200), (50, 100), "newcombe-10", "")
    ] * 2
    assert not any("same proportion" in n or "left out of" in n for n in c.notes)


def test_one_episode_short_on_one_task_is_still_tested_pooled_and_reproduced(tmp_path):
    """Review R1: 100/999 against 100/1000 on B, every task reproduced, was `inconclusive` (exit 61) under the exact
    proportionality test; the mixture bias is 0.0002, under a tenth of the margin 0.05, so the pooled test stands."""
    ref = _evidence({"A": (900, 1000), "B": (100, 1000)}, "ref")
    act = _evidence({"A": (900, 1000), "B": (100, 999)}, "act", seed=2)
    c = compare_evidence(act, ref)
    overall = [r for r in c.rows if r.metric.count("/") == 1]
    assert [(r.reference_counts, r.actual_counts, r.verdict, r.note) for r in overall] == [
        ((1000, 2000), (1000, 1999), "reproduced", "")
    ] * 2
    assert c.verdict == "reproduced" and not any("same proportion" in n for n in c.notes)
    out = portable("compare", _write(tmp_path / "ref.json", ref), _write(tmp_path / "act.json", act))
    assert out.returncode == 0, out.stdout + out.stderr


# a reference of unequal per-task counts (A 1,000, B 500): the run's 1,000 a task weights them 1/2, 1/2, not 2/3, 1/3
UNEQUAL_REF = {"A": (900, 1000), "B": (50, 500)}


def test_uneven_counts_with_every_task_reproduced_is_reproduced(tmp_path):
    """Review R1: such a reference could never give `reproduced` (the overall rows were inconclusive whatever the
    tasks); every task within the margin puts any mix of them within it, so the per-task rows decide: exit 0."""
    ref = _evidence(UNEQUAL_REF, "ref")
    act = _evidence({"A": (900, 1000), "B": (100, 1000)}, "act", seed=2)
    c = compare_evidence(act, ref)
    assert [(r.metric, r.verdict, r.note) for r in c.rows[:2]] == [
        ("recap/success_once", "inconclusive", UNEVEN),
        ("recap/success_at_end", "inconclusive", UNEVEN),
    ]
    assert [r.verdict for r in c.rows[2:]] == ["reproduced"] * 4
    assert c.verdict == "reproduced" and c.to_dict()["verdict"] == "reproduced"
    out = portable("compare", _write(tmp_path / "ref.json", ref), _write(tmp_path / "act.json", act))
    assert out.returncode == 0, out.stdout + out.stderr
    # the pooled rows read 63.3% vs 50.0%, -0.133: `differs` from the mix alone, so shown but not counted
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("recap/success_once ")]
    assert "63.3% (950/1500)  50.0% (1000/2000)  -0.133 [-0.161, -0.106]" in line and line.endswith(NOT_COUNTED)


def test_uneven_counts_with_one_task_differing_differs(tmp_path):
    """B at 30% against the reference's 10%: that per-task row differs (and survives Holm over the counted rows)."""
    ref = _evidence(UNEQUAL_REF, "ref")
    act = _evidence({"A": (900, 1000), "B": (300, 1000)}, "act", seed=2)
    c = compare_evidence(act, ref)
    assert [r.note for r in c.rows[:2]] == [UNEVEN] * 2
    assert [r.verdict for r in c.rows[2:]] == ["reproduced", "reproduced", "differs", "differs"]
    assert c.verdict == "differs" and c.held_differs() == {"recap/B/success_once", "recap/B/success_at_end"}
    assert (
        c.verdict_text() == "differs (2 differ, 0 inconclusive of 6 metrics; 2 shown but not counted (uneven task mix))"
    )
    out = portable("compare", _write(tmp_path / "ref.json", ref), _write(tmp_path / "act.json", act))
    assert out.returncode == 60, out.stdout + out.stderr
    assert out.stdout.rstrip().endswith(": " + c.verdict_text())
    banner = _banner(c)
    assert banner == (
        "Differs: 2 of 6 metrics differ from the reference evidence <code>ref</code> by more than their margins; "
        "2 shown but not counted (uneven task mix)."
    )


def _banner(c) -> str:
    """report.html's verdict banner for comparison `c`, whitespace folded."""
    import re

    from reproduction.run.report import render_report_html

    html = render_report_html(title="t", run_id="r", comparison=c)
    (div,) = re.findall(r'<div id="verdict"[^>]*>(.*?)</div>', html, re.S)
    return " ".join(div.split())


def test_every_summary_of_a_reproduced_uneven_comparison_names_the_rows_not_counted(tmp_path):
    """Review RV1: report.html said "all 6 metrics equivalent" and the closing line a bare `reproduced` while 2 of
    the 6 rows (63.3% vs 50.0%, beyond the margin) were shown but not counted."""
    ref = _evidence(UNEQUAL_REF, "ref")
    act = _evidence({"A": (900, 1000), "B": (100, 1000)}, "act", seed=2)
    c = compare_evidence(act, ref)
    assert c.counts() == {"differs": 0, "differs_alone": 0, "inconclusive": 0, "reproduced": 4, "metrics": 6}
    text = "reproduced (4 metrics equivalent; 2 shown but not counted (uneven task mix))"
    assert c.verdict_text() == text
    assert _banner(c) == (
        "Reproduced: 4 metrics equivalent to the reference evidence <code>ref</code> within their margins; 2 shown "
        "but not counted (uneven task mix)."
    )
    out = portable("compare", _write(tmp_path / "ref.json", ref), _write(tmp_path / "act.json", act))
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.rstrip().splitlines()[-1] == (
        f"every policy vs the reference's of the same label (this run's primary: act; the reference's: ref): {text}"
    )


def test_a_comparison_with_every_row_counted_keeps_its_summaries():
    """Equal or proportional counts: no row is marked, the closing line and banner read as before RV1."""
    c = compare_evidence(_evidence({"A": (45, 50), "B": (5, 50)}, "act", seed=2), _evidence(REF, "ref"))
    assert c.not_counted_aside() == ""
    assert all("counted" not in row for row in c.to_dict()["rows"])
    if c.verdict == "reproduced":
        assert c.verdict_text() == "reproduced"
        assert _banner(c).startswith(f"Reproduced: all {len(c.rows)} metrics equivalent")
    else:
        assert "shown but not counted" not in c.verdict_text() + _banner(c)


def test_rows_not_counted_carry_an_explicit_field_read_back_before_the_note(tmp_path):
    """Review RV5: such a row was known only by its note's exact wording. It now writes `"counted": false` (only
    on such rows), `--json` carries it, and the verdict read back from comparison.json follows the field."""
    ref = _evidence(UNEQUAL_REF, "ref")
    act = _evidence({"A": (900, 1000), "B": (100, 1000)}, "act", seed=2)
    doc = compare_evidence(act, ref).to_dict()
    assert [row.get("counted", "absent") for row in doc["rows"]] == [False, False] + ["absent"] * 4
    out = portable("compare", _write(tmp_path / "ref.json", ref), _write(tmp_path / "act.json", act), "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    assert [row.get("counted", "absent") for row in json.loads(out.stdout)["rows"]][:3] == [False, False, "absent"]
    reworded = json.loads(json.dumps(doc))
    for row in reworded["rows"][:2]:
        row["note"] = "not counted: worded otherwise"
    back = Comparison.from_dict(reworded)
    assert back.verdict == "reproduced" and [r.counted for r in back.rows[:3]] == [False, False, True]
    # comparison.json of this stop's earlier code (no field): the note still tells
    old = json.loads(json.dumps(doc))
    for row in old["rows"]:
        row.pop("counted", None)
    assert Comparison.from_dict(old).verdict == "reproduced"
    assert Comparison.from_dict(old).to_dict() == doc


@pytest.mark.parametrize("b_episodes", [0, 20])
def test_false_differs_at_equal_truth_stays_under_alpha(b_episodes):
    """Known truth: A 0.9 and B 0.1 on both sides, the reference 100 episodes a task, the run 100 on A and
    `b_episodes` on B. P(`differs`) was 1.000 (B 0) and 0.987 (B 20) in the audit; the claim is <= alpha 0.05
    (bound 0.1: alpha plus 3 binomial SE at 300 draws)."""
    rng = random.Random(54)

    def draw(p: float, n: int) -> int:
        return sum(rng.random() < p for _ in range(n))

    differs, draws = 0, 300
    for _ in range(draws):
        ref = _evidence({"A": (draw(0.9, 100), 100), "B": (draw(0.1, 100), 100)}, "ref")
        act = _evidence({"A": (draw(0.9, 100), 100), "B": (draw(0.1, b_episodes), b_episodes)}, "act", seed=2)
        differs += compare_evidence(act, ref, margin=0.05).verdict == "differs"
    assert differs / draws < 0.1, differs


# -- B1: seeds / settings that are no objects -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "text"),
    [
        ("settings", "x", "settings is 'x', not an object of name -> value"),
        ("settings", [1], "settings is [1], not an object of name -> value"),
        ("settings", 3, "settings is 3, not an object of name -> value"),
        ("seeds", "x", "seeds is 'x', not an object of name -> value"),
        ("seeds", [1, 2], "seeds is [1, 2], not an object of name -> value"),
        ("seeds", 5, "seeds is 5, not an object of name -> value"),
        ("settings", {"tasks": "t"}, "settings.tasks is 't', not a list of task names"),
    ],
)
@pytest.mark.parametrize("side", ["reference", "actual"])
def test_seeds_or_settings_that_are_no_object_are_malformed_evidence(tmp_path, field, value, text, side):
    """They were `internal error: AttributeError ...` (exit 1, "this is a bug")."""
    docs = {"reference": _evidence(REF, "ref"), "actual": _evidence(REF, "act")}
    docs[side][field] = value
    ref, act = _write(tmp_path / "ref.json", docs["reference"]), _write(tmp_path / "act.json", docs["actual"])
    out = portable("compare", ref, act)
    bad = ref if side == "reference" else act
    assert out.returncode == 4 and out.stdout == "", out.stderr
    assert out.stderr.splitlines()[0] == f"error: {bad} is malformed evidence: {text}"
    assert out.stderr.splitlines()[1].startswith(f"hint: fix {text.split(' ')[0]} in {bad} ")


def test_null_seeds_and_settings_are_still_accepted():
    doc = _evidence(REF, "ref")
    doc["seeds"] = doc["settings"] = None
    check_evidence(doc, where="x")


# -- B3: a task's own episodes and a count's wilson95 -----------------------------------------------------------


@pytest.mark.parametrize("value", ["7", [100], None, True, 100.0, -1])
def test_a_tasks_episodes_must_be_a_whole_number(value):
    doc = _evidence({"t": (74, 100)}, "act")
    doc["tasks"]["t"]["episodes"] = value
    with pytest.raises(InvalidInputError) as err:
        check_evidence(doc, where="act.json")
    assert err.value.exit_code == 4 and err.value.field == "tasks['t'].episodes"
    assert f"tasks['t'].episodes is {value!r}, not a whole number >= 0" in err.value.message


@pytest.mark.parametrize("value", ["x", [0.9, 0.1], [float("nan"), 1], [0.1], [0.1, 1.5], [True, 1]])
@pytest.mark.parametrize("where", ["metrics.success_once", "tasks['t'].success_at_end"])
def test_wilson95_must_be_an_ordered_interval_of_rates(value, where):
    doc = _evidence({"t": (74, 100)}, "act")
    count = doc["metrics"]["success_once"] if where.startswith("metrics") else doc["tasks"]["t"]["success_at_end"]
    count["wilson95"] = value
    with pytest.raises(InvalidInputError) as err:
        check_evidence(doc, where="act.json")
    assert err.value.exit_code == 4 and err.value.field == f"{where}.wilson95"
    assert f"{where}.wilson95 is {value!r}, not an interval [low, high] with 0 <= low <= high <= 1" in err.value.message


def test_the_wilson95_evidence_writes_is_accepted():
    """What build_evidence writes (rounded to 6 places, 0/10 gives [0.0, ...]) passes; so does a count without one."""
    for counts in ({"t": (0, 10)}, {"t": (10, 10)}, {"t": (74, 100)}):
        doc = _evidence(counts, "act")
        check_evidence(json.loads(json.dumps(doc)), where="x")
        del doc["metrics"]["success_once"]["wilson95"]
        check_evidence(doc, where="x")


def test_a_sequential_evaluation_does_not_wait_on_an_uneven_overall_row(tmp_path, monkeypatch):
    """Review R1: against a reference of unequal per-task counts (A 1,000, B 500) the run's equal looks are never
    in proportion, so the overall rows were `inconclusive` at every look and the evaluation never stopped early.
    At look 1 (50 of 100 episodes a task, margin 0.3) both tasks reproduce: it stops there."""
    from types import SimpleNamespace

    from reproduction.recipes.recap.policy import evaluate_sequentially

    ref = _evidence(UNEQUAL_REF, "ref")
    ref["margins"] = {"success_once": 0.3, "success_at_end": 0.3}
    path = _write(tmp_path / "ref.json", ref)
    config = SimpleNamespace(episodes_per_task=100, batch_size=25, tasks=("A", "B"))
    asked = []

    def looks_of(jobs, ui=None, looks=None, go_on=None, killed_hint=None):
        for k, n in enumerate(looks):
            outcome = [SimpleNamespace(tasks={t: SimpleNamespace(episodes=n) for t in config.tasks})]
            asked.append(n)
            if not go_on(k, outcome):
                break
        return outcome

    def evidence_of(outcome):
        n = outcome[0].tasks["A"].episodes
        return _evidence({"A": (n * 9 // 10, n), "B": (n // 10, n)}, "act", seed=2)

    monkeypatch.setattr("reproduction.sim.evaluate.evaluate_many", looks_of)
    _, record = evaluate_sequentially([SimpleNamespace(config=config)], evidence_of, path, looks=2, rho=3.0)
    assert asked == [50] and record["stopped_at_look"] == 1 and record["stopped_early"] is True, record
    assert record["verdict"] == "reproduced" and record["rates"] == {"reproduced": 4, "differs": 0, "inconclusive": 0}
