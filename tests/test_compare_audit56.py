"""audit56 F3: what `compare` and `eval --plan` say on stderr about a run folder's evaluations: -q silences the
choice line, --plan gives no verdict so warns of none, and the stale branch of the warning says its exact line."""

from __future__ import annotations

import json
from pathlib import Path

from evidence_fixtures import make_evidence

from reproduction.run.stale import outputs_digest


def _run(tmp_path: Path, *, names=("eval_policy_100", "eval_policy_30"), status: str = "complete") -> Path:
    """A run folder whose evidence/ holds `names` (the last recap 10/40, another 38/40); run.json's eval record (of
    `status`) lists the last of them."""
    run = tmp_path / "run"
    (run / "evidence").mkdir(parents=True)
    for name, recap in zip(names, [(38, 40)] * (len(names) - 1) + [(10, 40)]):
        (run / "evidence" / f"{name}.json").write_text(json.dumps(make_evidence(name=name, recap=recap)))
    outputs = {f"../evidence/{names[-1]}.json": [1, 2, "b" * 64]}
    stages = {"eval": {"status": status, "outputs": outputs, "seconds": 1.0}}
    (run / "run.json").write_text(json.dumps({"format_version": 1, "run_id": "r", "stages": stages}))
    return run


def _reference(tmp_path: Path) -> Path:
    ref = tmp_path / "reference.json"
    ref.write_text(json.dumps(make_evidence(name="reference", recap=(10, 40))))
    return ref


def _main(capsys, *argv: str) -> tuple[int, str, str]:
    from reproduction.portable import main

    capsys.readouterr()
    try:
        rc = main(list(argv))
    except SystemExit as exc:
        rc = exc.code
    out, err = capsys.readouterr()
    return rc, out, err


def test_compare_quiet_leaves_out_which_evaluation_it_chose(tmp_path, capsys):
    run, ref = _run(tmp_path), _reference(tmp_path)
    rc, out, err = _main(capsys, "compare", str(ref), str(run))
    assert err.startswith("compare: using ") and rc == 61
    for argv in (["compare", "-q"], ["-q", "compare"], ["compare", "--quiet"]):
        rc_q, out_q, err_q = _main(capsys, *argv, str(ref), str(run))
        assert (rc_q, out_q, err_q) == (61, out, ""), argv  # the same table and verdict, no talk


def test_compare_quiet_still_warns_of_an_evaluation_that_did_not_complete(tmp_path, capsys):
    run, ref = _run(tmp_path, names=("eval_policy_30",), status="failed"), _reference(tmp_path)
    rc, out, err = _main(capsys, "-q", "compare", str(ref), str(run))
    assert rc == 61 and "25.0% (10/40)" in out
    assert err == (
        f"warning: {run}: its eval stage is failed, not complete, so this is the evaluation it last completed; "
        "`portable run ... --resume` evaluates the current one\n"
    )


def test_compare_warns_of_a_stale_evaluation_with_its_exact_line(tmp_path, capsys):
    """The stale branch: eval completed, then `--target-step N --stages policy` moved the policy on."""
    run, ref = _run(tmp_path, names=("eval_policy_30",)), _reference(tmp_path)
    state = json.loads((run / "run.json").read_text())
    policy_outputs = {"../policy/checkpoints/step_8/model.safetensors": [5, 6, "c" * 64]}
    state["stages"]["policy"] = {"status": "complete", "outputs": policy_outputs}
    state["stages"]["eval"]["key_parts"] = {"upstream": {"policy": outputs_digest({"old": [1, 2, "d" * 64]})}}
    (run / "run.json").write_text(json.dumps(state))
    rc, out, err = _main(capsys, "compare", str(ref), str(run))
    assert rc == 61 and "25.0% (10/40)" in out
    assert err == (
        f"warning: {run}: its eval stage ran before stage policy's outputs changed, so this evidence is of the "
        "earlier policy; `portable run ... --resume` evaluates the current one\n"
    )
    state["stages"]["eval"]["key_parts"]["upstream"]["policy"] = outputs_digest(policy_outputs)
    (run / "run.json").write_text(json.dumps(state))
    assert _main(capsys, "compare", str(ref), str(run))[2] == ""  # current again: nothing to say


def test_plan_of_a_run_folder_gives_no_verdict_so_warns_of_none(tmp_path, capsys):
    run = _run(tmp_path, status="failed")
    rc, out, err = _main(capsys, "eval", "--plan", "--reference", str(run))
    assert rc == 0 and out.startswith("episodes per side for 80% power")
    assert err == (
        f"eval --plan: using {run / 'evidence/eval_policy_30.json'}, the evaluation {run / 'run.json'} records "
        "(also there: eval_policy_100.json)\n"
    )
    rc_q, out_q, err_q = _main(capsys, "-q", "eval", "--plan", "--reference", str(run))
    assert (rc_q, out_q, err_q) == (0, out, "")
