"""audit55 I1, I4, I5: after `--resume --target-step N` (or `portable eval --checkpoint`) evidence/ keeps the earlier
eval_*.json beside the current one. The report's Summary and per-task tables show only the evaluation run.json's eval
record lists (by numeric step without a record) and list the others apart under "Earlier evaluations"; `portable
compare REF RUN` uses the recorded one (saying so on stderr) instead of exit 2. The demos' closing table never cuts a
path, and every report table scrolls sideways on a phone. Small run folders from evidence_fixtures, no training."""

from __future__ import annotations

import json
import re
from html import unescape
from pathlib import Path

import pytest
from evidence_fixtures import make_evidence

from reproduction.run.report import write_run_report

REF = "reference.json"


def _evidence(run: Path, name: str, *, recap: tuple[int, int], sha: str) -> Path:
    path = run / "evidence" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(make_evidence(name=name, recap=recap, sha=sha)))
    return path


def _run(tmp_path: Path, current: str | None, names=("eval_policy_100", "eval_policy_30")) -> Path:
    """A run folder whose evidence/ holds eval_policy_30 (recap 10/40) and eval_policy_100 (recap 38/40); run.json's
    eval record lists `current` (None: no run.json at all)."""
    run = tmp_path / "run"
    _evidence(run, names[0], recap=(38, 40), sha="1" * 64)
    _evidence(run, names[1], recap=(10, 40), sha="3" * 64)
    if current is not None:
        outputs = {f"../evidence/{current}.json": [1, 2, "b" * 64]}
        stages = {"eval": {"status": "complete", "outputs": outputs, "seconds": 1.0}}
        (run / "run.json").write_text(json.dumps({"format_version": 1, "run_id": "r", "stages": stages}))
    return run


def _text(html: str, table: str) -> str:
    part = re.search(rf'<table id="{table}">.*?</table>', html, re.S).group(0)
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", part)).split())


def test_report_summary_holds_the_recorded_evaluation_only(tmp_path):
    run = _run(tmp_path, "eval_policy_30")
    html = write_run_report(run, title="t", run_id="r").read_text()
    summary = _text(html, "summary")
    # one recap row and its bc baseline, of the recorded file only (eval_policy_100 sorts first by name)
    assert summary.count("policy/checkpoints/step_4") == 1 and "sha256:333333333333" in summary
    assert "sha256:111111111111" not in summary and "25.0% (10/40)" in summary and "95.0%" not in summary
    assert _text(html, "per-task").split()[:4] == ["task", "recap", "bc", "pick"]  # two columns, not four
    assert (
        _text(html, "earlier") == "file name policies step episodes eval_policy_100.json eval_policy_100 recap, bc 4 40"
    )
    assert "<h2>Earlier evaluations</h2>" in html


def test_without_a_record_the_highest_step_numerically_is_current(tmp_path):
    from reproduction.run.report import current_evidence

    run = _run(tmp_path, None)
    current, others = current_evidence(run)
    assert [p.name for p in current] == ["eval_policy_100.json"]  # not eval_policy_30 (lexicographically last)
    assert [p.name for p in others] == ["eval_policy_30.json"]
    html = write_run_report(run, title="t", run_id="r").read_text()
    assert "95.0% (38/40)" in _text(html, "summary") and "(10/40)" not in _text(html, "summary")


def test_without_a_record_a_checkpoint_evaluation_of_the_same_step_is_not_current(tmp_path):
    """audit55 review: `portable eval --checkpoint 100` beside the run's eval_policy_100, no run.json: the run's own
    evaluation is current, the checkpoint one is listed apart; alone, a checkpoint evaluation is still shown."""
    from reproduction.run.report import current_evidence

    run = _run(tmp_path, None, names=("eval_policy_100", "eval_checkpoint_100"))
    current, others = current_evidence(run)
    assert ([p.name for p in current], [p.name for p in others]) == (
        ["eval_policy_100.json"],
        ["eval_checkpoint_100.json"],
    )
    (run / "evidence" / "eval_policy_100.json").unlink()
    assert [p.name for p in current_evidence(run)[0]] == ["eval_checkpoint_100.json"]


def test_one_evaluation_lists_no_earlier_section(tmp_path):
    run = tmp_path / "run"
    _evidence(run, "eval_policy_4", recap=(38, 40), sha="1" * 64)
    html = write_run_report(run, title="t", run_id="r").read_text()
    assert "Earlier evaluations" not in html and 'id="earlier"' not in html


def test_recap_success_plot_reads_the_recorded_evaluation(tmp_path, monkeypatch):
    from reproduction.recipes.recap import report as recap_report
    from reproduction.run import plots

    run = _run(tmp_path, "eval_policy_100")  # eval_policy_30 sorts last by name
    seen = []
    monkeypatch.setattr(plots, "plot_success_rates", lambda doc, out, metric, **_: seen.append(doc["name"]) or out)
    recap_report.write_plots(run)
    assert seen == ["eval_policy_100"]


def test_grpo_newest_evidence_is_the_recorded_one(tmp_path):
    from reproduction.recipes.grpo.report import newest_evidence

    run = _run(tmp_path, "eval_grpo_4", names=("eval_grpo_8", "eval_grpo_4"))
    assert newest_evidence(run).name == "eval_grpo_4.json"
    (run / "run.json").unlink()
    assert newest_evidence(run).name == "eval_grpo_8.json"


def _compare(capsys, ref: Path, actual: Path) -> tuple[int, str, str]:
    from reproduction.portable import main

    capsys.readouterr()
    try:
        rc = main(["compare", str(ref), str(actual)])
    except SystemExit as exc:
        rc = exc.code
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("where", ["run", "run/evidence"])
def test_compare_of_a_run_folder_uses_the_recorded_evaluation(tmp_path, capsys, where):
    run = _run(tmp_path, "eval_policy_30")
    ref = tmp_path / REF
    ref.write_text(json.dumps(make_evidence(name="reference", recap=(10, 40))))
    rc, out, err = _compare(capsys, ref, tmp_path / where)
    assert err == (
        f"compare: using {run / 'evidence/eval_policy_30.json'}, the evaluation {run / 'run.json'} records "
        "(also there: eval_policy_100.json)\n"
    )
    assert rc == 61 and "25.0% (10/40)" in out and "95.0%" not in out


@pytest.mark.parametrize("status", ["running", "failed"])
def test_compare_of_a_run_whose_eval_did_not_complete_says_so(tmp_path, capsys, status):
    """audit55 K2: a run killed in its eval stage was compared silently, on the evaluation of an earlier policy."""
    run = _run(tmp_path, "eval_policy_30")
    state = json.loads((run / "run.json").read_text())
    state["stages"]["eval"]["status"] = status
    (run / "run.json").write_text(json.dumps(state))
    (run / "evidence" / "eval_policy_100.json").unlink()  # the one file there: no choice to announce
    ref = tmp_path / REF
    ref.write_text(json.dumps(make_evidence(name="reference", recap=(10, 40))))
    rc, out, err = _compare(capsys, ref, run)
    assert err == (
        f"warning: {run}: its eval stage is {status}, not complete, so this is the evaluation it last completed; "
        "`portable run ... --resume` evaluates the current one\n"
    )
    assert rc == 61 and "25.0% (10/40)" in out  # compare still answers
    state["stages"]["eval"]["status"] = "complete"
    (run / "run.json").write_text(json.dumps(state))
    assert _compare(capsys, ref, run)[2] == ""  # complete and current: nothing to say


def test_compare_without_run_json_stays_ambiguous(tmp_path, capsys):
    run = _run(tmp_path, None)
    ref = tmp_path / REF
    ref.write_text(json.dumps(make_evidence(name="reference")))
    rc, out, err = _compare(capsys, ref, run)
    assert rc == 2 and out == ""
    assert err == (
        f"error: {run / 'evidence'} holds several evidence files (eval_policy_100.json, eval_policy_30.json)\n"
        "hint: name one of them\n"
    )


def test_demo_step_table_never_cuts_a_path():
    from reproduction.recipes.recap.demo import step_table

    path = "/work/audit55_I/demo-grpo/run/report.html (and plots/)"
    lines = step_table([("train", "done", 1.0), ("plots and report", path, 2.25)])
    assert lines == [
        "",
        f"step              {'result':<{len(path)}}  seconds",
        f"train             {'done':<{len(path)}}      1.0",
        f"plots and report  {path}      2.2",
    ]
    short = step_table([("a", "x", 1.0)])
    assert short[1] == f"step  {'result':<40}  seconds"


def test_every_report_table_scrolls_sideways(tmp_path):
    run = _run(tmp_path, "eval_policy_30")
    html = write_run_report(run, title="t", run_id="r").read_text()
    tables = re.findall(r"<table id=\"(\w[\w-]*)\">", html)
    assert tables == ["summary", "per-task", "earlier"]
    wrapped = re.findall(r'<div class="scroll">\s*<table id="([\w-]+)">', html)
    assert wrapped == tables and ".scroll { overflow-x: auto; max-width: 100%; }" in html
    assert "<script" not in html
