"""Audit 51 F: `portable check` wordings that sent the user to the wrong place.

F3: ASCEND_HOME_PATH set to a missing folder was reported as "ASCEND_TOOLKIT_HOME/ASCEND_HOME_PATH unset"."""

from __future__ import annotations

import shutil

from reproduction.checks.report import collect_report
from tests.fixtures.checks.fakes import ascend_context


def test_a_cann_variable_set_to_a_missing_folder_is_named_with_its_value(tmp_path):
    ctx, _, home = ascend_context(tmp_path, env_set=False)
    shutil.rmtree(tmp_path / "Ascend")
    ctx.env["ASCEND_HOME_PATH"] = str(tmp_path / "nonexistent")
    (tmp_path / "empty").mkdir()
    ctx.env["ASCEND_TOOLKIT_HOME"] = str(tmp_path / "empty")
    report = collect_report(ctx=ctx)
    row = {r.name: r for r in report.results}["npu.cann"]
    assert row.status == "fail" and report.exit_code == 20
    assert row.finding == (
        f"no CANN toolkit found (ASCEND_TOOLKIT_HOME={tmp_path / 'empty'} holds no CANN version file; "
        f"ASCEND_HOME_PATH={tmp_path / 'nonexistent'} does not exist; nothing under {tmp_path / 'Ascend'})"
    )
    assert "unset" in row.fix and "point the variable at the CANN toolkit" in row.fix


def test_no_cann_variable_set_still_says_unset(tmp_path):
    ctx, _, _ = ascend_context(tmp_path, env_set=False)
    shutil.rmtree(tmp_path / "Ascend")
    row = {r.name: r for r in collect_report(ctx=ctx).results}["npu.cann"]
    assert (
        row.finding
        == f"no CANN toolkit found (ASCEND_TOOLKIT_HOME/ASCEND_HOME_PATH unset; nothing under {tmp_path / 'Ascend'})"
    )
