"""Ascend probe: real-format `npu-smi info` and CANN version files through the live parsers; torch_npu faked.

torch-npu is never installed here: a fake `torch_npu` package on PYTHONPATH makes the real facts
script find it, and the torch_npu subprocess's JSON answer is injected at the command seam.
"""

from __future__ import annotations

import re
from pathlib import Path

from reproduction.checks.accelerator_ascend import (
    TORCH_NPU_SCRIPT,
    cann_key,
    cann_version_from,
    find_cann,
    parse_npu_smi,
)
from reproduction.checks.report import collect_report
from tests.fixtures.checks.fakes import FIXTURES, fixture
from tests.fixtures.checks.fakes import TORCH_NPU_OK as NPU_OK
from tests.fixtures.checks.fakes import ascend_context as _ctx


def _rows(report):
    return {r.name: r for r in report.results}


def test_npu_smi_info_idle_parses_npus_and_hbm():
    smi = parse_npu_smi(fixture("npu_smi_info_910b_idle.txt"))
    assert smi["version"] == "24.1.0.3"
    assert [(n["npu"], n["name"], n["health"], n["hbm_used_mb"], n["hbm_total_mb"]) for n in smi["npus"]] == [
        (0, "910B2", "OK", 3407, 65536),
        (1, "910B2", "OK", 3399, 65536),
        (2, "910B2", "OK", 3396, 65536),
        (3, "910B2", "OK", 3395, 65536),
    ]
    assert smi["processes"] == []


def test_npu_smi_info_busy_parses_processes():
    smi = parse_npu_smi(fixture("npu_smi_info_910b_busy.txt"))
    assert smi["version"] == "23.0.2.1"
    assert smi["npus"][0]["hbm_used_mb"] == 20701
    assert smi["processes"] == [{"npu": 0, "pid": 124528, "process": "python3.8", "memory_mb": 17400}]


def test_cann_version_files_and_ordering():
    assert cann_version_from(FIXTURES / "ascend_toolkit_install.info") == "8.0.RC2"
    assert cann_version_from(FIXTURES / "version.cfg") == "8.0.0"
    ordered = ["7.0.0", "8.0.RC1", "8.0.RC2.alpha002", "8.0.RC3", "8.0.0", "8.1.RC1", "8.5.0"]
    assert sorted(ordered, key=cann_key) == ordered


def test_find_cann_prefers_env_then_default_roots(tmp_path):
    ctx, _, home = _ctx(tmp_path)
    cann = find_cann(ctx)
    assert cann.home == home and cann.version == "8.0.RC2" and cann.set_env == home / "set_env.sh"


def test_all_good_ascend_host(tmp_path):
    ctx, run, _ = _ctx(tmp_path)
    report = collect_report(ctx=ctx)
    rows = _rows(report)
    assert report.device["selected"] == "npu"
    assert (
        rows["npu"].status == "ok"
        and "4 x Ascend910B2" in rows["npu"].finding
        and "npu-smi 24.1.0.3 sees 4 NPU(s)" in rows["npu"].finding
    )
    assert rows["npu.cann"].status == "ok" and "CANN 8.0.RC2" in rows["npu.cann"].finding
    assert rows["npu.skew"].status == "ok" and rows["npu.processes"].status == "ok"
    assert rows["hazard.torch_npu"].status == "ok"
    assert report.exit_code == 0
    # torch_npu is only ever imported in a subprocess with autoload off, and never via transfer_to_npu.
    assert run.env_of("probe:torch-npu")["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "0"


def test_probe_scripts_never_import_transfer_to_npu():
    sources = [
        TORCH_NPU_SCRIPT,
        *(p.read_text() for p in (Path(__file__).parent.parent / "reproduction" / "checks").glob("*.py")),
    ]
    pattern = re.compile(r"^\s*(from\s+torch_npu\.contrib\s+import|import\s+torch_npu\.contrib)", re.MULTILINE)
    assert not [s for s in sources if pattern.search(s)]


def test_cann_not_sourced_fails_20_with_set_env_fix(tmp_path):
    ctx, _, home = _ctx(tmp_path, env_set=False)
    report = collect_report(ctx=ctx)
    row = _rows(report)["npu.cann"]
    assert row.status == "fail" and row.failure == "accelerator"
    assert "libhccl.so" in row.finding and f"CANN 8.0.RC2 at {home}" in row.finding
    assert row.fix == f"source {home / 'set_env.sh'} before the run"
    assert report.exit_code == 20


def test_torch_npu_newer_than_cann_is_skew_21(tmp_path):
    ctx, _, _ = _ctx(tmp_path, torch_npu={**NPU_OK, "torch": "2.4.0", "torch_npu": "2.4.0.post2"})  # CANN 8.0.RC2
    report = collect_report(ctx=ctx)
    row = _rows(report)["npu.skew"]
    assert row.status == "fail" and row.failure == "skew"
    assert (
        row.finding == "torch_npu 2.4.0.post2 needs CANN >= 8.0.RC3, found CANN 8.0.RC2 (undefined symbols at import)"
    )
    assert report.exit_code == 21


def test_cann_from_version_cfg_satisfies_newer_torch_npu(tmp_path):
    ctx, _, _ = _ctx(tmp_path, info="version.cfg", torch_npu={**NPU_OK, "torch": "2.5.1", "torch_npu": "2.5.1"})
    row = _rows(collect_report(ctx=ctx))["npu.skew"]
    assert row.status == "ok" and row.finding == "torch 2.5.1 / torch_npu 2.5.1 / CANN 8.0.0 (>= 8.0.0)"


def test_torch_and_torch_npu_versions_must_match(tmp_path):
    ctx, _, _ = _ctx(tmp_path, torch_npu={**NPU_OK, "torch": "2.5.1", "torch_npu": "2.4.0.post2"})
    report = collect_report(ctx=ctx)
    row = _rows(report)["npu.skew"]
    assert row.failure == "skew" and "torch 2.5.1 with torch_npu 2.4.0.post2" in row.finding
    assert row.fix.startswith("install torch==2.4.0 ")
    assert report.exit_code == 21


def test_busy_npu_fails_20(tmp_path):
    ctx, _, _ = _ctx(tmp_path, smi="npu_smi_info_910b_busy.txt")
    report = collect_report(ctx=ctx)
    row = _rows(report)["npu.processes"]
    assert row.status == "fail" and "NPU 0: pid 124528 python3.8 17400 MB" in row.finding
    assert report.exit_code == 20


def test_torch_npu_import_error_is_reported(tmp_path):
    error = {
        "torch": "2.4.0",
        "error": "ImportError: libhccl.so: cannot open shared object file: No such file or directory",
    }
    ctx, _, _ = _ctx(tmp_path, torch_npu=error)
    row = _rows(collect_report(ctx=ctx))["npu"]
    assert row.failure == "accelerator" and "libhccl.so: cannot open shared object file" in row.finding
