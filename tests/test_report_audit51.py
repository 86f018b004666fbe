"""report.html of a run whose run.json says more than its stages' status (audit51 G9, G11, G14): a policy stage
resumed from a checkpoint says so in the stages table; after `--stages policy --target-step N` the stale evaluation
and comparison are not headlined as the run's (a stale banner where the verdict was, their rows marked as of the
earlier policy); a GRPO run whose compare stage had no reference says it compared with nothing and shows the paired
grpo - sft difference per task. Rendered from small run folders (evidence_fixtures), no training."""

from __future__ import annotations

import json
import re
from html import unescape
from pathlib import Path

from evidence_fixtures import eval_result, make_evidence, make_run

from reproduction.run.evidence import EvalRecord, build_evidence, compare_evidence, write_comparison
from reproduction.run.stale import outputs_digest

POLICY_OUT = {"policy/model.json": [1, 2, "a" * 64]}
EVAL_OUT = {"evidence/eval.json": [1, 2, "b" * 64]}
STALE_BANNER = (
    "Stale: eval and compare ran before policy changed (policy is now at step 30), so their results below are of the "
    "earlier policy, not this run's; `portable run ... --resume` (without --stages) redoes them."
)
LINEAGE = {
    "argv": ["portable", "run"],
    "config_sha256": "c" * 64,
    "world_size": 1,
    "device": "cpu",
    "resumed_from_path": None,
    "versions": None,
}


def _stage(outputs: dict, upstream: dict, **more) -> dict:
    return {
        "status": "complete",
        "key": "k" * 64,
        "outputs": outputs,
        "key_parts": {"upstream": upstream},
        "summary": {},
        "seconds": 1.5,
        "lineage": LINEAGE,
        **more,
    }


def _run_json(run: Path, recipe: str, train: str, *, stale: bool, compare_summary: dict | None = None) -> None:
    """run.json of train -> eval -> compare, with `train` resumed from step 20 at step 30; eval recorded the
    digest of another `train` output when `stale`."""
    seen = "0" * 64 if stale else outputs_digest(POLICY_OUT)
    stages = {
        train: _stage(POLICY_OUT, {}, step=30, resumed_from=20),
        "eval": _stage(EVAL_OUT, {train: seen}),
        "compare": _stage({}, {"eval": outputs_digest(EVAL_OUT)}, summary=compare_summary or {}),
    }
    doc = {"format_version": 1, "recipe": recipe, "run_id": "run-test", "stages": stages}
    (run / "run.json").write_text(json.dumps(doc))


def _text(html: str) -> str:
    body = html.partition("<body>")[2]
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", body)).split())


def _stage_notes(html: str) -> dict[str, str]:
    table = re.search(r'<table id="stages">.*?</table>', html, re.S).group(0)
    rows = re.findall(r"<tr><td>([^<]*)</td><td>[^<]*</td><td[^>]*>[^<]*</td><td>([^<]*)</td></tr>", table)
    return dict(rows)


def test_recap_report_of_a_stale_evaluation_shows_a_stale_banner_not_the_verdict(tmp_path):
    from reproduction.recipes.recap.report import write_run_report

    fake = make_run(tmp_path)
    (fake.run / "advantages/meta/advantages_sft.parquet").unlink()  # fake bytes, not a table to plot
    write_comparison(
        fake.run / "evidence/comparison.json",
        compare_evidence(json.loads(fake.evidence.read_text()), make_evidence(name="reference")),
    )
    _run_json(fake.run, "recap", "policy", stale=True)
    html = write_run_report(fake.run).read_text()
    text = _text(html)
    assert re.findall(r'<div id="(\w+)" class="banner ([\w ]+)"', html) == [("stale", "stale")]
    assert STALE_BANNER in text and "Inconclusive: 12 of 12" not in text
    # The summary's evaluations (recap and its bc baseline) and the comparison are marked, not shown as the run's.
    assert text.count("stale (earlier policy)") == 2
    assert "Stale: these evaluations are of the earlier policy" in text
    assert "Comparison with the reference evidence (stale: of the earlier policy)" in text
    stale_note = "stale: ran before policy changed; its results here are of the earlier policy (--resume redoes it)"
    assert _stage_notes(html) == {"policy": "resumed from step 20", "eval": stale_note, "compare": stale_note}

    _run_json(fake.run, "recap", "policy", stale=False)  # after --resume redid eval and compare
    html = write_run_report(fake.run).read_text()
    text = _text(html)
    assert re.findall(r'<div id="(\w+)" class="banner ([\w ]+)"', html) == [("verdict", "inconclusive")]
    assert "Inconclusive: 12 of 12 metrics" in text and "Stale:" not in text and "stale (earlier" not in text
    assert _stage_notes(html) == {"policy": "resumed from step 20", "eval": "", "compare": ""}


def _grpo_evidence(run: Path) -> None:
    """eval_grpo_30.json: grpo solves 3 of 4 held-out episodes, its sft baseline 1, the same reset seeds."""

    def record(label: str, mode: str, k: int) -> EvalRecord:
        return EvalRecord(
            result=eval_result({"FetchPush-v4": (k, 4)}),
            label=label,
            mode=mode,
            checkpoint=f"{label}/export",
            checkpoint_sha256=label[0] * 64,
            step=30,
        )

    doc = build_evidence(
        record("grpo", "other", 3),
        name="grpo after 30 steps",
        run_id="run-test",
        seeds={"eval": 1000, "train": 0},
        settings={"episodes_per_task": 4},
        baselines=[record("sft", "bc", 1)],
    )
    for d, won in ((doc, "1101"), (doc["baselines"][0], "0100")):
        d["tasks"]["FetchPush-v4"]["outcomes"] = {
            "reset_seeds": [11, 12, 13, 14],
            "success_once": won,
            "success_at_end": won,
        }
    (run / "evidence").mkdir(parents=True, exist_ok=True)
    (run / "evidence/eval_grpo_30.json").write_text(json.dumps(doc))


def test_grpo_report_says_it_compared_with_nothing_and_shows_the_paired_difference(tmp_path):
    from reproduction.recipes.grpo.report import write_run_report

    run = tmp_path / "run"
    _grpo_evidence(run)
    _run_json(run, "grpo", "rl", stale=False, compare_summary={"evidence": "x", "reference": None, "verdict": None})
    html = write_run_report(run).read_text()
    text = _text(html)
    assert re.search(r'<p id="no-reference">No reference evidence: compared with nothing \(eval.reference', html)
    assert 'id="verdict"' not in html and 'id="stale"' not in html
    assert "grpo - sft, success at end, paired by reset seed" in text
    assert re.findall(r'<ul id="paired"><li>([^<]*)</li></ul>', html) == [
        "FetchPush-v4: +0.50 on 4 episodes (2 solved only by grpo, 0 only by sft; 95% CI -0.23 to +0.85)"
    ]
    assert _stage_notes(html) == {"rl": "resumed from step 20", "eval": "", "compare": ""}

    _run_json(run, "grpo", "rl", stale=True, compare_summary={"evidence": "x", "reference": None, "verdict": None})
    html = write_run_report(run).read_text()
    text = _text(html)
    assert STALE_BANNER.replace("policy", "rl") in text
    assert "(stale: of the earlier rl)" in text and text.count("stale (earlier rl)") == 2


def test_stage_note_reads_only_what_run_json_records():
    from reproduction.run.report import stage_note

    assert stage_note({"resumed_from": 20}, None) == "resumed from step 20"
    assert stage_note({"resumed_from": None}, None) == "" and stage_note({}, None) == ""
    assert stage_note({"resumed_from": True}, None) == ""  # not a step a run records
    assert stage_note({"resumed_from": 0}, "value").startswith("resumed from step 0; stale: ran before value changed")
