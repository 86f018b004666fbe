"""audit58 B4: `portable compare REF RUN` of a run with two evaluating stages (evala, evalb: one policy label each).
run.json lists two current evidence files; compare uses the one whose policy labels the reference shares and says
which, with its stage. None or several sharing, or no reference to tell them apart (`eval --plan`), is exit 2
naming run.json's stages and their current files only, never the earlier files kept beside them. The warning that
an evaluation is not the run's current one follows the stage that lists the file compared. Run folders by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from evidence_fixtures import PICK, eval_result

from reproduction.run.evidence import EvalRecord, build_evidence
from reproduction.run.stale import outputs_digest

TRAIN_OUTPUTS = {"weights.json": [7, 8, "c" * 64]}


def _evidence(labels: tuple[str, ...], counts: tuple[int, int], name: str) -> dict:
    """Evidence of one task, one policy per label (the first the primary), each `counts` (successes, episodes)."""
    k, n = counts
    records = [
        EvalRecord(
            result=eval_result({PICK: (k, n)}), label=label, mode=label, checkpoint="train/weights.json", step=10
        )
        for label in labels
    ]
    return build_evidence(records[0], name=name, run_id="r", seeds={"eval": 1000}, settings={}, baselines=records[1:])


def _run(tmp_path: Path, *, alpha=(200, 200), beta=(200, 200), evala: dict | None = None) -> Path:
    """A run whose evala stage lists eval_alpha_10.json (label alpha, `alpha` counts) and evalb eval_beta_10.json
    (label beta, `beta`), beside the earlier eval_alpha_8.json and eval_beta_8.json (0 of 200) a `--resume` after
    `--target-step 10 --stages train` keeps. `evala`: fields that replace evala's record's."""
    run = tmp_path / "run"
    (run / "evidence").mkdir(parents=True)
    files = {"eval_alpha_10": (("alpha",), alpha), "eval_beta_10": (("beta",), beta)}
    files |= {"eval_alpha_8": (("alpha",), (0, 200)), "eval_beta_8": (("beta",), (0, 200))}
    for name, (labels, counts) in files.items():
        (run / "evidence" / f"{name}.json").write_text(json.dumps(_evidence(labels, counts, name)))
    current = {"train": outputs_digest(TRAIN_OUTPUTS)}
    stages = {"train": {"status": "complete", "outputs": TRAIN_OUTPUTS, "seconds": 1.0}}
    for stage, name in (("evala", "eval_alpha_10"), ("evalb", "eval_beta_10")):
        outputs = {f"../evidence/{name}.json": [1, 2, "b" * 64]}
        stages[stage] = {"status": "complete", "outputs": outputs, "seconds": 1.0, "key_parts": {"upstream": current}}
    stages["evala"] |= evala or {}
    (run / "run.json").write_text(json.dumps({"format_version": 1, "run_id": "r", "stages": stages}))
    return run


def _reference(tmp_path: Path, labels: tuple[str, ...], counts=(200, 200)) -> Path:
    ref = tmp_path / "reference.json"
    ref.write_text(json.dumps(_evidence(labels, counts, "reference")))
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


@pytest.mark.parametrize(
    ("alpha", "rc", "verdict"),
    [((200, 200), 0, "reproduced"), ((100, 200), 60, "differs"), ((10, 20), 61, "inconclusive")],
)
def test_the_current_file_sharing_the_references_label_is_compared_and_named_with_its_stage(
    tmp_path, capsys, alpha, rc, verdict
):
    run = _run(tmp_path, alpha=alpha)
    ref = _reference(tmp_path, ("alpha",), counts=(10, 20) if verdict == "inconclusive" else (200, 200))
    for where in (run, run / "evidence"):
        got_rc, out, err = _main(capsys, "compare", str(ref), str(where), "--json")
        assert got_rc == rc and json.loads(out)["verdict"] == verdict
        assert err == (
            f"compare: using {run / 'evidence/eval_alpha_10.json'}, the evaluation stage evala of {run / 'run.json'} "
            "records, the current one sharing policy labels (alpha) with the reference (also there: "
            "eval_alpha_8.json, eval_beta_10.json, eval_beta_8.json)\n"
        )
    assert _main(capsys, "-q", "compare", str(ref), str(run))[::2] == (rc, "")  # -q: no talk
    # the other label picks the other stage's file (beta 200/200 against a reference of 200/200)
    rc_b, _, err_b = _main(capsys, "compare", str(_reference(tmp_path, ("beta",))), str(run))
    assert rc_b == 0 and err_b.startswith(f"compare: using {run / 'evidence/eval_beta_10.json'}, the evaluation stage ")


def test_two_current_files_sharing_the_references_labels_is_exit_2_naming_only_current_files(tmp_path, capsys):
    run = _run(tmp_path)
    rc, out, err = _main(capsys, "compare", str(_reference(tmp_path, ("alpha", "beta"))), str(run))
    assert (rc, out) == (2, "")
    assert err == (
        f"error: {run / 'run.json'}'s stages evala, evalb list several current evidence files (evala: "
        "eval_alpha_10.json; evalb: eval_beta_10.json), and more than one shares a policy label with the reference "
        "(eval_alpha_10.json: alpha; eval_beta_10.json: beta)\n"
        f"hint: name one of them, e.g. {run / 'evidence/eval_alpha_10.json'}\n"
    )
    rc_file, _, err_file = _main(
        capsys, "compare", str(_reference(tmp_path, ("alpha", "beta"))), str(run / "evidence/eval_beta_10.json")
    )
    assert rc_file == 60 and err_file == ""  # the file named, as the hint says: compared (alpha missing there)


def test_no_current_file_sharing_the_references_labels_is_exit_2(tmp_path, capsys):
    run = _run(tmp_path)
    rc, out, err = _main(capsys, "compare", str(_reference(tmp_path, ("gamma",))), str(run / "evidence"))
    assert (rc, out) == (2, "")
    assert err == (
        f"error: {run / 'run.json'}'s stages evala, evalb list several current evidence files (evala: "
        "eval_alpha_10.json; evalb: eval_beta_10.json), and none has a policy label of the reference (gamma)\n"
        f"hint: name one of them, e.g. {run / 'evidence/eval_alpha_10.json'}\n"
    )


def test_plan_of_a_run_with_two_current_files_names_them_and_their_stages(tmp_path, capsys):
    run = _run(tmp_path)
    rc, out, err = _main(capsys, "eval", "--plan", "--reference", str(run))
    assert (rc, out) == (2, "")
    assert err == (
        f"error: {run / 'run.json'}'s stages evala, evalb list several current evidence files (evala: "
        "eval_alpha_10.json; evalb: eval_beta_10.json)\n"
        f"hint: name one of them, e.g. {run / 'evidence/eval_alpha_10.json'}\n"
    )


def test_the_warning_follows_the_stage_that_lists_the_compared_file(tmp_path, capsys):
    """evala stale (train's outputs changed after it ran): compare against evala's file warns of it, even with -q;
    against evalb's (current) file nothing is said of evala."""
    run = _run(tmp_path, evala={"key_parts": {"upstream": {"train": outputs_digest({"old": [1, 2, "d" * 64]})}}})
    rc, _, err = _main(capsys, "-q", "compare", str(_reference(tmp_path, ("alpha",))), str(run))
    assert rc == 0 and err == (
        f"warning: {run}: its evala stage ran before stage train's outputs changed, so this evidence is of the "
        "earlier train; `portable run ... --resume` evaluates the current one\n"
    )
    assert _main(capsys, "-q", "compare", str(_reference(tmp_path, ("beta",))), str(run))[::2] == (0, "")


def test_an_incomplete_stage_warns_only_when_its_file_is_compared(tmp_path, capsys):
    run = _run(tmp_path, evala={"status": "failed"})
    rc, _, err = _main(capsys, "-q", "compare", str(_reference(tmp_path, ("alpha",))), str(run))
    assert rc == 0 and err == (
        f"warning: {run}: its evala stage is failed, not complete, so this is the evaluation it last completed; "
        "`portable run ... --resume` evaluates the current one\n"
    )
    assert _main(capsys, "-q", "compare", str(_reference(tmp_path, ("beta",))), str(run))[::2] == (0, "")
