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


def test_cache_folders_that_cannot_be_created_warn_with_a_fix(tmp_path):
    """F2: TRITON_CACHE_DIR / XDG_CACHE_HOME / HOME under a regular file (never creatable) were reported
    "ok ... (local)"; an unusable TMPDIR was not mentioned."""
    from pathlib import Path

    from reproduction.checks.filesystems import probe_filesystems
    from tests.fixtures.checks.fakes import make_context

    afile = tmp_path / "afile"
    afile.write_text("x")
    mounts = tmp_path / "mounts"
    mounts.write_text("/dev/sda1 / ext4 rw 0 0\n")
    env = {"TRITON_CACHE_DIR": str(afile / "t"), "XDG_CACHE_HOME": str(afile / "c"), "TMPDIR": str(afile / "sub")}
    rows = {r.name: r for r in probe_filesystems(make_context(tmp_path, env=env, mounts_file=mounts))}
    assert rows["fs.triton_cache"].status == "warn"
    assert (
        rows["fs.triton_cache"].finding
        == f"TRITON_CACHE_DIR is unusable: cannot create {afile / 't'}: {afile} is not a folder"
    )
    assert rows["fs.triton_cache"].fix.startswith("export TRITON_CACHE_DIR=/tmp/triton-$USER")
    assert rows["fs.home_cache"].status == "warn" and rows["fs.home_cache"].fix.startswith("export XDG_CACHE_HOME=")
    assert rows["fs.tmpdir"].status == "warn"
    assert rows["fs.tmpdir"].finding == f"TMPDIR is unusable: cannot create {afile / 'sub'}: {afile} is not a folder"

    env = {"XDG_CACHE_HOME": "", "TMPDIR": str(tmp_path)}
    rows = {r.name: r for r in probe_filesystems(make_context(tmp_path, env=env, mounts_file=mounts, home=afile))}
    assert rows["fs.home_cache"].finding.endswith(f"cannot create {afile / '.cache'}: {afile} is not a folder")
    assert rows["fs.tmpdir"].status == "ok" and rows["fs.tmpdir"].finding == f"TMPDIR {tmp_path} is on ext4 (local)"
    assert isinstance(rows["fs.tmpdir"].details["path"], str) and Path(rows["fs.tmpdir"].details["path"]) == tmp_path

    # audit51 review R5: a TMPDIR that is not there (its parent writable) was "ok": nothing creates it
    env = {"TMPDIR": str(tmp_path / "gone")}
    rows = {r.name: r for r in probe_filesystems(make_context(tmp_path, env=env, mounts_file=mounts))}
    assert (rows["fs.tmpdir"].status, rows["fs.tmpdir"].finding) == (
        "warn",
        f"TMPDIR is unusable: {tmp_path / 'gone'} does not exist (tempfile quietly uses /tmp instead; mktemp fails)",
    )
