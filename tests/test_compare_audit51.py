"""audit51 G6, G7, G10: compare's summaries count what the overall (Holm) rule holds to differ, Holm counts a
one-task run's per-task rows once, and evidence sharing no task or policy label with the reference is refused."""

from __future__ import annotations

import re

import pytest
from evidence_fixtures import PICK, PUSH, control_plane_cli, eval_result, make_evidence, write_json

from reproduction.errors import InvalidInputError
from reproduction.run.comparison import DIFFERS_ALONE, Comparison, compare_evidence, holm_differs, same_as_overall
from reproduction.run.evidence import EvalRecord, build_evidence
from reproduction.run.report import render_report_html


def _one_task(recap: int, bc: int | None = None, *, seed: int = 1, at_end: tuple[int, ...] = ()) -> dict:
    """Evidence of one task (PICK, 100 episodes a policy): recap at `recap` successes, bc (if given) at `bc`;
    success_at_end `at_end` (recap's, bc's), else success_once's counts (then one Holm test with it, audit59 C3)."""

    def record(label: str, k: int, end: int) -> EvalRecord:
        return EvalRecord(result=eval_result({PICK: (k, 100)}, {PICK: end}), label=label, mode=label)

    ends = (at_end + (recap, bc)[len(at_end) :])[:2]
    baselines = [record("bc", bc, ends[1])] if bc is not None else []
    return build_evidence(
        record("recap", recap, ends[0]),
        baselines=baselines,
        name=f"k{recap}",
        run_id="r",
        seeds={"eval": seed},
        settings={},
    )


def _evidence(name: str, tasks: tuple[str, ...], labels: tuple[str, ...] = ("recap", "bc")) -> dict:
    """Evidence of policies `labels` (the first primary), each 15/20 on every task of `tasks`."""
    records = [EvalRecord(result=eval_result({t: (15, 20) for t in tasks}), label=x, mode=x) for x in labels]
    return build_evidence(records[0], baselines=records[1:], name=name, run_id="r", seeds={"eval": 1}, settings={})


def _closing(comparison: Comparison) -> str:
    return comparison.render().splitlines()[-1]


def _banner(comparison: Comparison, evidence: dict) -> str:
    html = render_report_html(title="t", run_id="x", evidence=evidence, comparison=comparison)
    found = re.search(r'<div id="verdict" class="banner (\w+)">\s*(.*?)\s*</div>', html, re.S)
    assert found is not None
    return found.group(1) + ": " + re.sub(r"<[^>]+>", "", found.group(2))


def test_rows_that_differ_alone_but_not_after_holm_are_counted_apart_g6():
    # 64/100 (at end 63/100) against 80/100: each of the 4 rate rows differs alone (p 0.042, 0.030), none after
    # Holm (0.030 > 0.05 / 2); success_at_end apart from success_once, or the two are one test (audit59 C3)
    actual = _one_task(64, at_end=(63,))
    weak = compare_evidence(actual, _one_task(80, seed=0))
    assert weak.verdict == "inconclusive" and {r.verdict for r in weak.rows} == {"differs"}
    assert weak.counts() == {"differs": 0, "differs_alone": 4, "inconclusive": 0, "reproduced": 0, "metrics": 4}
    assert _closing(weak).endswith(
        "): inconclusive (0 differ, 4 differ alone but not after Holm, 0 inconclusive of 4 metrics)"
    )
    assert _closing(weak).startswith("every policy vs the reference's of the same label (")
    table = weak.render().splitlines()[1:5]
    assert all(line.endswith(DIFFERS_ALONE) for line in table), table
    assert [r["verdict"] for r in weak.to_dict()["rows"]] == ["differs"] * 4  # the file keeps each row's own test
    html = render_report_html(title="t", run_id="x", evidence=actual, comparison=weak)
    assert html.count(f">{DIFFERS_ALONE}</span>") == 4 and ">differs</span>" not in html
    assert _banner(weak, actual) == (
        "inconclusive: Inconclusive: none of 4 metrics is held to differ from the reference evidence k80: 4 differ "
        "alone but not after Holm's step-down over the rate rows."
    )


def test_a_differs_verdict_counts_only_the_rows_holm_holds_g6():
    # recap 58/100, at end 57 (p 0.0047, 0.0031) survives Holm over the 4 distinct tests; bc 64/100, at end 63
    # (p 0.042, 0.030 > 0.05 / 2) does not (success_at_end apart, or each policy's two are one test: audit59 C3)
    actual = _one_task(58, 64, at_end=(57, 63))
    mixed = compare_evidence(actual, _one_task(80, 80, seed=0))
    assert mixed.verdict == "differs"
    assert mixed.held_differs() == {f"recap/{m}" for m in ("success_once", "success_at_end")} | {
        f"recap/{PICK}/{m}" for m in ("success_once", "success_at_end")
    }
    assert mixed.counts() == {"differs": 4, "differs_alone": 4, "inconclusive": 0, "reproduced": 0, "metrics": 8}
    assert _closing(mixed).endswith(
        ": differs (4 differ, 4 differ alone but not after Holm, 0 inconclusive of 8 metrics)"
    )
    assert mixed.shown_verdicts() == ["differs"] * 4 + [DIFFERS_ALONE] * 4
    assert _banner(mixed, actual) == (
        "differs: Differs: 4 of 8 metrics differ from the reference evidence k80 by more than their margins, 4 more "
        "differ alone but not after Holm's step-down over the rate rows."
    )
    # the run's compare stage states the same counts (run.json's verdict, the headline's last line)
    assert Comparison.from_dict(mixed.to_dict()).verdict_text() == (
        "differs (4 differ, 4 differ alone but not after Holm, 0 inconclusive of 8 metrics)"
    )


def test_without_rows_that_differ_alone_the_summaries_read_as_before_g6():
    actual = make_evidence("eval_a", recap=(20, 40), bc=(20, 40))
    comparison = compare_evidence(actual, make_evidence("eval_ref"))
    c = comparison.counts()
    assert c["differs_alone"] == 0
    assert _closing(comparison).endswith(
        f": {comparison.verdict} ({c['differs']} differ, {c['inconclusive']} inconclusive of {c['metrics']} metrics)"
    )


def test_holm_counts_a_one_task_rows_per_task_test_once_g10():
    # 62/100 (at end 61/100) against 80/100 (p 0.021): one task, so 2 distinct tests (success_once,
    # success_at_end), not 4; at 0.05 / 2 = 0.025 both survive, and the per-task rows share their overall row's
    # decision and level (success_at_end apart from success_once, or the two are one test: audit59 C3)
    comparison = compare_evidence(_one_task(62, at_end=(61,)), _one_task(80, seed=0))
    assert same_as_overall(comparison.rows) == {
        f"recap/{PICK}/success_once": "recap/success_once",
        f"recap/{PICK}/success_at_end": "recap/success_at_end",
    }
    assert holm_differs(comparison.rows, 0.05) == {
        "recap/success_once": 0.05,
        "recap/success_at_end": 0.025,  # at end 61: the smaller p
        f"recap/{PICK}/success_once": 0.05,
        f"recap/{PICK}/success_at_end": 0.025,
    }
    assert comparison.verdict == "differs"  # over 4 tests (0.0125 < 0.021) it was inconclusive
    assert "over the 2 distinct rate tests (4 rate rows; 2 per-task rows are the same test" in comparison.render()


def test_two_tasks_keep_every_rate_row_in_holms_family_g10():
    comparison = compare_evidence(make_evidence("eval_a", recap=(20, 40)), make_evidence("eval_ref"))
    assert same_as_overall(comparison.rows) == {}


def test_evidence_with_no_task_in_common_is_refused_g7(tmp_path):
    ref = write_json(tmp_path / "ref.json", _evidence("eval_ref", ("OtherTask-v1",)))
    act = write_json(tmp_path / "act.json", make_evidence("eval_a"))
    out = control_plane_cli("compare", ref, act)
    assert out.returncode == 4, out.stderr
    error = out.stderr.splitlines()[0]
    assert error == (
        f"error: {ref} and {act} share no task: reference ['OtherTask-v1'], this run [{PICK!r}, {PUSH!r}], so "
        "nothing can be compared"
    )
    assert out.stdout == "" and "Traceback" not in out.stderr and "hint:" in out.stderr


def test_evidence_with_no_policy_label_in_common_is_refused_g7(tmp_path):
    ref = write_json(tmp_path / "ref.json", _evidence("eval_ref", (PICK,), ("grpo", "sft")))
    act = write_json(tmp_path / "act.json", make_evidence("eval_a"))
    out = control_plane_cli("compare", ref, act)
    assert out.returncode == 4, out.stderr
    assert out.stderr.splitlines()[0] == (
        f"error: {ref} and {act} share no policy label: reference ['grpo', 'sft'], this run ['bc', 'recap'], so "
        "nothing can be compared"
    )


def test_the_compare_stage_refuses_disjoint_evidence_naming_both_files_g7(tmp_path):
    from reproduction.recipes.recap.policy import compare_with_reference

    ref = write_json(tmp_path / "ref.json", _evidence("eval_ref", ("OtherTask-v1",)))
    act = write_json(tmp_path / "eval_a.json", make_evidence("eval_a"))
    with pytest.raises(InvalidInputError) as caught:
        compare_with_reference(act, ref, tmp_path / "comparison.json")
    assert caught.value.exit_code == 4
    assert str(caught.value).startswith(f"{ref} and {act} share no task: reference ['OtherTask-v1']")
    assert not (tmp_path / "comparison.json").exists()


def test_a_partial_overlap_is_still_compared_g7(tmp_path):
    # the reference's PICK is shared, its extra task is a `missing` row as before: differs, not refused
    ref_doc = _evidence("eval_ref", (PICK, PUSH, "OtherTask-v1"))
    comparison = compare_evidence(_evidence("eval_a", (PICK, PUSH)), ref_doc)
    assert comparison.verdict == "differs"
    assert {r.actual_display for r in comparison.rows if "OtherTask-v1" in r.metric} == {"missing"}
