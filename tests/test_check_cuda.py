"""CUDA probe: real-format nvidia-smi CSV through the live parser; torch's answers injected at the subprocess seam."""

from __future__ import annotations

from reproduction.checks.accelerator_cuda import parse_compute_apps, parse_query_gpu
from reproduction.checks.report import collect_report
from tests.fixtures.checks.fakes import TORCH_OK, FakeRun, fixture, make_context, out


def _run(
    apps: str = "nvidia_smi_compute_apps_none.csv", gpus: str = "nvidia_smi_query_gpu_h100x8.csv", torch=None
) -> FakeRun:
    return FakeRun(
        {
            "nvidia-smi --query-gpu": out(fixture(gpus)),
            "nvidia-smi --query-compute-apps": out(fixture(apps)),
            "probe:torch-cuda": out(torch if torch is not None else TORCH_OK),
        }
    )


def _rows(report):
    return {r.name: r for r in report.results}


def test_query_gpu_csv_parses_every_field():
    gpus = parse_query_gpu(fixture("nvidia_smi_query_gpu_h100x8.csv"))
    assert len(gpus) == 8
    assert gpus[0] == {
        "index": 0,
        "uuid": "GPU-3f9a4c2e-8b1d-4e6a-9f0c-1d2e3f4a5b60",
        "name": "NVIDIA H100 80GB HBM3",
        "memory_total_mib": 81559,
        "memory_used_mib": 70735,
        "driver": "550.54.15",
        "capability": "9.0",
    }
    assert [g["index"] for g in gpus] == list(range(8))


def test_compute_apps_csv_parses_pids_memory_and_na():
    apps = parse_compute_apps(fixture("nvidia_smi_compute_apps_busy.csv"))
    assert [(a["pid"], a["process"], a["memory_mib"]) for a in apps] == [
        (48213, "/usr/bin/python3", 70211),
        (1907, "/usr/lib/xorg/Xorg", 312),
    ]
    assert parse_compute_apps(fixture("nvidia_smi_compute_apps_none.csv")) == []
    assert parse_compute_apps(fixture("nvidia_smi_compute_apps_na.csv"))[0]["memory_mib"] is None


def test_idle_gpus_pass_with_devices_driver_and_torch_reported(tmp_path):
    run = _run()
    report = collect_report(ctx=make_context(tmp_path, run=run, dev_nodes=["nvidiactl", "nvidia0"]))
    rows = _rows(report)
    assert report.device["selected"] == "cuda"
    assert rows["cuda"].status == "ok"
    assert "8 x NVIDIA H100 80GB HBM3" in rows["cuda"].finding and "driver 550.54.15" in rows["cuda"].finding
    assert rows["cuda.skew"].status == "ok" and rows["cuda.processes"].status == "ok"
    assert report.exit_code == 0
    # nvidia-smi runs before torch, so the probe's own CUDA context is never counted as "another process".
    keys = run.keys()
    assert keys.index("nvidia-smi --query-compute-apps") < keys.index("probe:torch-cuda")


def test_gpu_held_by_another_job_fails_with_exit_20(tmp_path):
    report = collect_report(
        ctx=make_context(tmp_path, run=_run("nvidia_smi_compute_apps_busy.csv"), dev_nodes=["nvidiactl"])
    )
    row = _rows(report)["cuda.processes"]
    assert row.status == "fail" and row.failure == "accelerator"
    assert "GPU 0: pid 48213 /usr/bin/python3 70211 MiB" in row.finding
    assert "GPU 1: pid 1907 /usr/lib/xorg/Xorg 312 MiB" in row.finding
    assert "CUDA_VISIBLE_DEVICES" in row.fix
    assert report.exit_code == 20


def test_small_holder_only_warns_and_exit_stays_0(tmp_path):
    report = collect_report(
        ctx=make_context(tmp_path, run=_run("nvidia_smi_compute_apps_small.csv"), dev_nodes=["nvidiactl"])
    )
    row = _rows(report)["cuda.processes"]
    assert row.status == "warn" and "pid 1907" in row.finding
    assert report.exit_code == 0


def test_unknown_process_memory_counts_as_busy(tmp_path):
    report = collect_report(
        ctx=make_context(tmp_path, run=_run("nvidia_smi_compute_apps_na.csv"), dev_nodes=["nvidiactl"])
    )
    assert _rows(report)["cuda.processes"].status == "fail"
    assert "GPU 3: pid 77120 python ? MiB" in _rows(report)["cuda.processes"].finding


def test_cuda_visible_devices_hides_the_busy_gpu(tmp_path):
    ctx = make_context(
        tmp_path,
        run=_run("nvidia_smi_compute_apps_busy.csv"),
        env={"CUDA_VISIBLE_DEVICES": "2,3"},
        dev_nodes=["nvidiactl"],
    )
    report = collect_report(ctx=ctx)
    assert _rows(report)["cuda.processes"].status == "ok"
    assert "2 visible GPU(s)" in _rows(report)["cuda.processes"].finding


def test_driver_older_than_torch_cuda_major_is_skew_exit_21(tmp_path):
    torch = dict(TORCH_OK, driver_cuda="11.8")
    report = collect_report(
        ctx=make_context(
            tmp_path, run=_run(gpus="nvidia_smi_query_gpu_a100x2.csv", torch=torch), dev_nodes=["nvidiactl"]
        )
    )
    row = _rows(report)["cuda.skew"]
    assert row.status == "fail" and row.failure == "skew"
    assert row.finding == "driver supports CUDA 11.8 but torch was built for CUDA 12.4"
    assert report.exit_code == 21


def test_driver_older_minor_only_warns(tmp_path):
    torch = dict(TORCH_OK, driver_cuda="12.2")
    report = collect_report(ctx=make_context(tmp_path, run=_run(torch=torch), dev_nodes=["nvidiactl"]))
    assert _rows(report)["cuda.skew"].status == "warn"
    assert report.exit_code == 0


def test_cpu_only_torch_on_gpu_host_is_skew(tmp_path):
    torch = {"torch": "2.13.0+cpu", "cuda_runtime": None, "available": False, "driver_cuda": None, "devices": []}
    report = collect_report(ctx=make_context(tmp_path, run=_run(torch=torch), dev_nodes=["nvidiactl"]))
    row = _rows(report)["cuda"]
    assert row.failure == "skew" and row.finding == "nvidia-smi sees 8 GPU(s) but torch 2.13.0+cpu is a CPU-only build"
    assert report.exit_code == 21


def test_torch_that_cannot_see_the_gpus_is_accelerator_failure(tmp_path):
    torch = {"torch": "2.5.1+cu124", "cuda_runtime": "12.4", "available": False, "driver_cuda": None, "devices": []}
    report = collect_report(ctx=make_context(tmp_path, run=_run(torch=torch), dev_nodes=["nvidiactl"]))
    row = _rows(report)["cuda"]
    assert row.failure == "accelerator" and "torch.cuda.is_available() is False" in row.finding
    assert report.exit_code == 20


def test_cuda_requested_on_this_cpu_machine_runs_real_torch_and_fails_20(tmp_path):
    # No fixture: nvidia-smi and torch really run here (torch 2.13.0+cpu, no nvidia-smi).
    report = collect_report(device="cuda", ctx=make_context(tmp_path))
    row = _rows(report)["cuda"]
    assert row.status == "fail" and row.failure == "accelerator"
    assert "nvidia-smi not found" in row.finding and "is built without CUDA" in row.finding
    assert report.exit_code == 20


def test_the_driver_lineage_records_is_the_one_the_probe_reads(tmp_path):
    from reproduction.checks.accelerator_cuda import driver_version

    assert driver_version(make_context(tmp_path, run=_run())) == "550.54.15"
    from reproduction.checks.probe import CommandResult

    absent = FakeRun({"nvidia-smi --query-gpu": CommandResult(argv=("nvidia-smi",), returncode=127)})
    assert driver_version(make_context(tmp_path, run=absent)) is None
