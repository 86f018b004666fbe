"""`portable check` end to end on this machine (CPU, no GPU), the report's shape, exit-code rules, and the
--jit-smoke paths (real skip on CPU; Triton and hccl answers injected at the command seam)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reproduction.checks.jit import TRITON_SCRIPT
from reproduction.checks.probe import EXIT_CODES, EXIT_HELP, FAIL, ProbeResult, fail, ok, warn
from reproduction.checks.report import CheckReport, collect_report, render_table
from reproduction.ui import UiOptions
from tests.fixtures.checks.fakes import (
    TORCH_OK,
    FakeRun,
    fake_package,
    fixture,
    make_context,
    out,
)
from tests.fixtures.checks.fakes import (
    ascend_context as ascend_ctx,
)

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "reproduction" / "portable.py"
EXPECTED_ROWS = {
    "toolchain",
    "cuda",
    "npu",
    "host.cpu",
    "host.cpu_kernels",
    "host.cpu_numerics",
    "host.memory",
    "host.shm",
    "host.disk",
    "host.cache",
    "host.settings",
    "fs.triton_cache",
    "fs.home_cache",
    "hazard.tensorflow",
    "hazard.torch_npu",
    "hazard.transfer_to_npu",
    "hazard.hub_offline",
    "hazard.placeholders",
    "hazard.intervals",
    "hazard.batch",
    "libero.render",
}


def _portable(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {"PORTABLE_PLAIN": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, str(SCRIPT), "check", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


NO_ACCELERATOR = (
    not any(Path("/dev").glob("nvidia[0-9]*"))
    and not Path("/dev/nvidiactl").exists()
    and not any(Path("/dev").glob("davinci*"))
)
cpu_machine = pytest.mark.skipif(not NO_ACCELERATOR, reason="asserts the CPU machine's report")


@pytest.mark.e2e
@cpu_machine
def test_real_check_on_this_machine_writes_table_and_json_and_exits_0(tmp_path):
    report_path = tmp_path / "check.json"
    proc = _portable("--json", str(report_path), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""  # stdout carries data only, and no data was asked for on stdout
    data = json.loads(report_path.read_text())
    assert data["format"] == "recap-portable-check" and data["format_version"] == "1.0"
    assert data["status"] in ("ok", "warn") and data["exit_code"] == 0
    assert data["device"]["selected"] == "cpu" and data["python"] == sys.executable and data["bundle"] is None
    assert {r["name"] for r in data["results"]} == EXPECTED_ROWS
    assert data["interpreter"]["version"] == ".".join(map(str, sys.version_info[:3]))
    for row in data["results"]:
        assert set(row) == {"name", "status", "finding", "fix", "failure", "exit_code", "seconds", "details"}
        assert row["status"] in ("ok", "warn", "skip"), row
    toolchain = next(r for r in data["results"] if r["name"] == "toolchain")
    assert toolchain["status"] == "ok" and toolchain["details"]["compile_s"] > 0
    lines = proc.stderr.splitlines()
    assert any(line.startswith("toolchain ") and " ok " in line for line in lines)
    assert lines[-1].startswith(f"check: {data['status']} (exit 0) in ") and "device cpu" in lines[-1]


@pytest.mark.e2e
@cpu_machine
def test_json_to_stdout_is_only_json(tmp_path):
    proc = _portable("--json", "-", "-q", cwd=tmp_path)
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["exit_code"] == 0


@pytest.mark.e2e
@cpu_machine
def test_jit_smoke_on_cpu_says_what_it_skipped_and_why(tmp_path):
    proc = _portable("--jit-smoke", "--json", "-", cwd=tmp_path)
    assert proc.returncode == 0
    row = next(r for r in json.loads(proc.stdout)["results"] if r["name"] == "jit")
    assert row["status"] == "skip"
    assert row["finding"].startswith(
        "skipped on CPU: the Triton vector-add needs a CUDA GPU and the hccl all_reduce an Ascend NPU"
    )
    assert row["details"]["skipped"] == ["triton-vector-add", "hccl-all-reduce"]
    assert "jit " in proc.stderr and "skipped on CPU" in proc.stderr


@pytest.mark.e2e
def test_check_on_a_missing_bundle_exits_3_on_the_cli_like_verify_and_restore(tmp_path):
    proc = _portable(str(tmp_path / "nope"), cwd=tmp_path)
    assert proc.returncode == 3
    assert proc.stderr.startswith(f"error: {tmp_path / 'nope'} does not exist")


@pytest.mark.e2e
def test_check_on_a_file_that_is_not_a_bundle_exits_24_on_the_cli(tmp_path):
    (tmp_path / "file").write_text("x")
    proc = _portable(str(tmp_path / "file"), cwd=tmp_path)
    assert proc.returncode == 24
    assert f"{tmp_path / 'file'} is not a folder" in proc.stderr and "FAIL" in proc.stderr


@pytest.mark.e2e
def test_unwritable_json_path_is_a_one_line_error_exit_8(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    proc = _portable("--json", str(blocker / "report.json"), "-q", cwd=tmp_path)
    assert proc.returncode == 8
    assert f"error: cannot write the check report to {blocker / 'report.json'}" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_help_documents_every_exit_code():
    proc = subprocess.run([sys.executable, str(SCRIPT), "check", "--help"], capture_output=True, text=True, check=True)
    assert EXIT_HELP in proc.stdout
    for cls, code in EXIT_CODES.items():
        assert f"\n  {code} " in EXIT_HELP, cls
    assert sorted(EXIT_CODES.values()) == [20, 21, 22, 23, 24]


def test_lowest_failing_code_wins_and_warnings_do_not_fail():
    rows = [
        ok("a", "fine"),
        warn("b", "meh", "fix"),
        fail("c", "hazard", "bad", "fix"),
        fail("d", "skew", "worse", "fix"),
    ]
    report = CheckReport(results=rows, python="p", bundle=None, device={}, jit_smoke=False, seconds=0.1)
    assert report.exit_code == 21 and report.status == FAIL
    assert CheckReport(results=rows[:2], python="p", bundle=None, device={}, jit_smoke=False, seconds=0).exit_code == 0


def test_probe_result_rejects_inconsistent_status():
    for bad in (
        dict(status="fail"),
        dict(status="ok", failure="hazard"),
        dict(status="fail", failure="nope"),
        dict(status="bad"),
    ):
        try:
            ProbeResult(name="x", finding="y", **bad)
        except ValueError as exc:
            assert "ProbeResult" in str(exc)
        else:
            raise AssertionError(bad)


def test_quiet_table_shows_only_problems_and_plain_has_fix_lines(monkeypatch):
    monkeypatch.setenv("PORTABLE_PLAIN", "1")
    rows = [ok("good.row", "fine"), fail("bad.row", "hazard", "broken thing", "do the fix")]
    report = CheckReport(
        results=rows, python="p", bundle=None, device={"selected": "cpu", "why": "w"}, jit_smoke=False, seconds=0
    )
    stream = io.StringIO()
    render_table(report, options=UiOptions(quiet=True), stream=stream)
    text = stream.getvalue()
    assert "good.row" not in text and "bad.row  FAIL  broken thing" in text and "fix: do the fix" in text


def test_rich_table_prints_findings_and_fixes_as_plain_text_not_markup(monkeypatch):
    """A finding or fix with square brackets (`pip install -e '.[libero]'`) reaches the table as written: rich would
    read `[libero]` as a style tag and drop it, telling the user to install the wrong thing."""
    monkeypatch.delenv("PORTABLE_PLAIN", raising=False)
    rows = [warn("libero.render", "LIBERO is not installed (the [libero] extra)", "pip install -e '.[libero]'")]
    report = CheckReport(
        results=rows, python="p", bundle=None, device={"selected": "cpu", "why": "w"}, jit_smoke=False, seconds=0
    )
    stream = io.StringIO()
    render_table(report, stream=stream)
    text = stream.getvalue()
    assert "(the [libero] extra)" in text and "pip install -e '.[libero]'" in text, text


def test_collect_report_is_json_serialisable_for_run_evidence(tmp_path):
    report = collect_report(ctx=make_context(tmp_path))
    data = json.loads(json.dumps(report.to_dict()))
    assert data["exit_code"] == report.exit_code == 0 and len(data["results"]) == len(EXPECTED_ROWS)


def test_checks_import_no_pipeline_library():
    code = (
        "import sys, pkgutil, importlib, reproduction.checks as c\n"
        "[importlib.import_module('reproduction.checks.' + m.name) for m in pkgutil.iter_modules(c.__path__)]\n"
        "print(','.join(m for m in ('torch', 'numpy', 'ray', 'transformers', 'pyarrow', "
        "'torch_npu', 'yaml') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == ""


# -- --jit-smoke on accelerators, through the command seam (not run on hardware here) -------------


def _cuda_ctx(tmp_path, triton_answer):
    fake_package(tmp_path / "site", "triton", "3.2.0")
    run = FakeRun(
        {
            "nvidia-smi --query-gpu": out(fixture("nvidia_smi_query_gpu_h100x8.csv")),
            "nvidia-smi --query-compute-apps": out(fixture("nvidia_smi_compute_apps_none.csv")),
            "probe:torch-cuda": out(TORCH_OK),
            "probe:triton-vector-add": triton_answer,
        }
    )
    return make_context(tmp_path, run=run, env={"PYTHONPATH": str(tmp_path / "site")}, dev_nodes=["nvidiactl"]), run


def test_triton_smoke_reports_cold_compile_with_a_fresh_cache(tmp_path):
    ctx, run = _cuda_ctx(tmp_path, out({"triton": "3.2.0", "compile_s": 1.84, "warm_s": 0.00004, "max_abs_error": 0.0}))
    report = collect_report(jit_smoke=True, ctx=ctx)
    row = {r.name: r for r in report.results}["jit"]
    assert (
        row.status == "ok" and row.finding == "Triton 3.2.0 vector-add: cold compile + run 1.84 s, warm 0.0 ms, exact"
    )
    cache = Path(run.env_of("probe:triton-vector-add")["TRITON_CACHE_DIR"])
    assert cache.name.startswith("portable-triton-cache-") and not cache.exists()  # fresh, node-local, removed
    assert "@triton.jit" in TRITON_SCRIPT and report.exit_code == 0


def test_triton_compile_failure_is_toolchain_22(tmp_path):
    error = {
        "triton": "3.2.0",
        "stage": "compile",
        "error": "CalledProcessError: gcc ... fatal error: Python.h: No such file or directory",
    }
    ctx, _ = _cuda_ctx(tmp_path, out(error))
    report = collect_report(jit_smoke=True, ctx=ctx)
    row = {r.name: r for r in report.results}["jit"]
    assert row.failure == "toolchain" and "failed at compile" in row.finding and "Python.h" in row.finding
    assert report.exit_code == 22


def test_hccl_all_reduce_timeout_is_accelerator_20(tmp_path):
    ctx, run, _ = ascend_ctx(tmp_path)
    run.responses = {**run.responses, "probe:hccl-all-reduce": out("", returncode=124, stderr="(killed after 120 s)")}
    report = collect_report(jit_smoke=True, ctx=ctx)
    row = {r.name: r for r in report.results}["jit"]
    assert row.failure == "accelerator" and row.finding == "hccl all_reduce did not finish in 120 s"
    assert run.env_of("probe:hccl-all-reduce")["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "0"
    assert report.exit_code == 20


def test_hccl_all_reduce_success(tmp_path):
    ctx, run, _ = ascend_ctx(tmp_path)
    run.responses = {**run.responses, "probe:hccl-all-reduce": out({"seconds": 3.2, "value": 6144.0})}
    row = {r.name: r for r in collect_report(jit_smoke=True, ctx=ctx).results}["jit"]
    assert row.status == "ok" and row.finding == "hccl all_reduce (1 process) + one NPU op in 3.20 s, correct"
