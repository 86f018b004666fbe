"""audit60 L: the output contract of publish's bars (L1), check's --json combinations (L3), lineage --verify's hints
and field errors (L8, L9) and weights fetch's digest error (L10)."""

from __future__ import annotations

import io
import json
import sys

import pytest
from hubserver import Fault
from test_lineage_audit51 import _edit, _set, _two_stage_run
from test_weights_hub import hub, run, unpinned_manifest  # noqa: F401 - `hub` is the fixture

from reproduction.portable import main as portable
from reproduction.run.lineage_check import verify_lineage
from reproduction.ui import UiOptions


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("stderr", "options", "disabled"),
    [
        (io.StringIO, UiOptions(), True),  # a pipe or a log file: no tqdm `\r` rewrites or cursor codes (L1)
        (_Tty, UiOptions(), False),  # a terminal: huggingface_hub's upload bars, as the project's own
        (_Tty, UiOptions(progress=False), True),
        (_Tty, UiOptions(quiet=True), True),
    ],
)
def test_hub_bars_show_only_where_the_projects_own_bars_do(monkeypatch, stderr, options, disabled):
    from huggingface_hub.utils import are_progress_bars_disabled, enable_progress_bars

    from reproduction.release.hub import _client
    from reproduction.release.hub_transfer import HubSettings

    for name in ("FORCE_TERMINAL", "TTY_COMPATIBLE", "PORTABLE_NO_PROGRESS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sys, "stderr", stderr())
    try:
        _client(HubSettings(endpoint="http://127.0.0.1:9"), options)
        assert are_progress_bars_disabled() is disabled
    finally:
        enable_progress_bars()  # huggingface_hub's state is per process


def test_check_json_file_with_another_json_is_a_usage_error(tmp_path, capsys):
    report = tmp_path / "c.json"
    for argv in (
        ["check", "--device", "cpu", "--json", str(report), "--json"],  # the FILE was dropped, stdout won
        ["--json", "check", "--device", "cpu", "--json", str(report)],  # stdout was empty, the FILE won
        ["check", "--device", "cpu", "--json", str(report), "--json", str(tmp_path / "d.json")],
    ):
        assert portable(argv) == 2
        out, err = capsys.readouterr()
        assert out == "" and not report.exists() and not (tmp_path / "d.json").exists()
        lines = err.splitlines()
        assert len(lines) == 2 and "asks for the check report in more than one place" in lines[0]
        assert lines[1] == f"hint: give --json {report} alone to write that file, or --json alone for stdout"
    # --json before and after the command agree (stdout), and a FILE alone is still written
    assert portable(["--json", "check", "--device", "cpu", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "ok"
    assert portable(["check", "--device", "cpu", "--json", str(report)]) == 0
    assert capsys.readouterr().out == "" and json.loads(report.read_text())["status"] == "ok"


def test_lineage_verify_exit_14_says_what_to_do(tmp_path, capsys):
    run_dir, again = _two_stage_run(tmp_path)
    with open(run_dir / "first/out.txt", "a") as fh:
        fh.write("X")
    hint = (
        "hint: first/out.txt changed after the run recorded it: put the recorded bytes back (a copy of the run "
        f"folder), or `portable run --resume --restart-stage first` on {run_dir} redoes the stage and writes its "
        "statement again"
    )
    assert portable(["lineage", str(run_dir), "--verify"]) == 14
    assert capsys.readouterr().err.splitlines()[-1] == hint
    again(resume=True, restart=["first"])  # what the hint says makes --verify pass
    assert verify_lineage(run_dir).exit_code == 0


def test_a_statement_field_of_the_wrong_type_names_the_file_and_field(tmp_path, capsys):
    run_dir, _ = _two_stage_run(tmp_path)
    _edit(run_dir, "lineage/second.intoto.json", _set("subject", 5))
    assert portable(["lineage", str(run_dir), "--verify", "--json"]) == 4
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines()[0] == f"error: {run_dir / 'lineage/second.intoto.json'}: subject is 5, not a list"


def test_weights_fetch_names_the_manifest_that_pins_the_digest(hub, tmp_path):  # noqa: F811
    manifest = unpinned_manifest(tmp_path)
    assert run(hub, tmp_path, "pin", str(manifest)).returncode == 0
    hub.add_fault(Fault(method="GET", path=r"/resolve/.*/model\.safetensors", kind="corrupt", times=100))
    proc = run(hub, tmp_path, "fetch", str(manifest), str(tmp_path / "w"))
    assert proc.returncode == 34, proc.stderr
    assert f"upstream/model.safetensors: downloaded bytes do not match {manifest} (expected sha256" in proc.stderr
    assert "bundle.json" not in proc.stderr


@pytest.mark.parametrize(
    ("argv", "error", "prog"),
    [
        (["bogus"], "error: argument COMMAND: invalid choice: 'bogus' (choose from ", "portable"),
        (["verify", "--jobs", "0", "b"], "error: argument --jobs: 0 is not a positive number", "portable verify"),
        (["compare"], "error: the following arguments are required: REFERENCE.json, ACTUAL.json", "portable compare"),
        (["verify", "b", "--bogus"], "error: unrecognized arguments: --bogus", "portable verify"),
        (
            ["weights", "verify"],
            "error: the following arguments are required: MANIFEST, DIR",
            "portable weights verify",
        ),
    ],
)
def test_a_usage_error_is_an_error_and_a_hint_line(capsys, argv, error, prog):
    """L4: argparse's own errors printed a usage block and `portable X: error: ...` with no hint line."""
    with pytest.raises(SystemExit) as done:
        portable(argv)
    assert done.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 2 and lines[0].startswith(error)
    assert lines[1] == f"hint: see `{prog} --help`"
