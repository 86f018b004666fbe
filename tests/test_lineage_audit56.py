"""`portable lineage RUN --verify` after audit56 H1: each kind of statement problem gets its own hint, and following
it makes --verify pass (an extra or edited statement got the lost statement's `--resume` hint, and --resume left it
as it was: exit 14 again)."""

from __future__ import annotations

import shutil

from test_lineage_audit51 import _edit, _set, _two_stage_run

from reproduction.portable import main as portable
from reproduction.run.lineage_check import verify_lineage

FIRST, SECOND = "lineage/first.intoto.json", "lineage/second.intoto.json"


def _hints(run):
    report = verify_lineage(run)
    assert report.exit_code == 14
    return [n for n in report.notes if n.startswith("hint:")]


def test_an_extra_statement_is_deleted_not_resumed(tmp_path, capsys):
    run, again = _two_stage_run(tmp_path)
    shutil.copy(run / SECOND, run / "lineage/zzz.intoto.json")
    hint = f"hint: no stage of run.json wrote lineage/zzz.intoto.json: delete it from {run} and verify again"
    assert _hints(run) == [hint]
    assert portable(["lineage", str(run), "--verify"]) == 14
    assert capsys.readouterr().err.splitlines()[-1] == hint
    again(resume=True)  # what the old hint said: changes nothing
    assert verify_lineage(run).exit_code == 14
    (run / "lineage/zzz.intoto.json").unlink()
    assert verify_lineage(run).exit_code == 0


def test_another_stages_statement_in_a_stages_place_is_deleted_then_resumed(tmp_path):
    run, again = _two_stage_run(tmp_path)
    shutil.copy(run / FIRST, run / SECOND)
    assert _hints(run) == [
        f"hint: {SECOND} holds another stage's statement: delete it, then `portable run --resume` on {run} (with the "
        "config it ran with) writes the stage's own again from run.json"
    ]
    (run / SECOND).unlink()
    again(resume=True)
    assert verify_lineage(run).exit_code == 0


def test_an_edited_statement_is_deleted_then_resumed_or_its_stage_restarted(tmp_path):
    run, again = _two_stage_run(tmp_path)
    lr = "predicate.buildDefinition.externalParameters.config.train.lr"
    _edit(run, FIRST, _set(lr, 0.9))
    _edit(run, FIRST, _set("predicate.buildDefinition.internalParameters.status", "failed"))
    hint = (
        f"hint: {FIRST} is not the statement written with run.json's record of its stage: delete it, then "
        f"`portable run --resume` on {run} (with the config it ran with) writes it again from run.json "
        "(or `--restart-stage first` redoes the stage)"
    )
    assert _hints(run) == [hint]  # two problems of one statement: one hint
    again(resume=True)  # what the old hint said: changes nothing
    assert verify_lineage(run).exit_code == 14
    (run / FIRST).unlink()
    again(resume=True)
    assert verify_lineage(run).exit_code == 0
    _edit(run, FIRST, _set(lr, 0.9))
    assert _hints(run) == [hint]
    again(resume=True, restart=["first"])
    assert verify_lineage(run).exit_code == 0


def test_a_lost_statement_keeps_the_resume_hint_and_each_kind_gets_its_own(tmp_path):
    run, again = _two_stage_run(tmp_path)
    shutil.copy(run / SECOND, run / "lineage/zzz.intoto.json")
    _edit(run, SECOND, _set("predicate.buildDefinition.internalParameters.status", "failed"))
    (run / FIRST).unlink()
    report = verify_lineage(run)
    assert report.exit_code == 11
    assert [n.split(":")[1].split()[0] for n in report.notes] == ["`portable", "no", "lineage/second.intoto.json"]
    assert report.notes[0] == f"hint: `portable run --resume` on {run} writes a lost statement again from run.json"
    (run / "lineage/zzz.intoto.json").unlink()
    (run / SECOND).unlink()
    again(resume=True)
    assert verify_lineage(run).exit_code == 0
