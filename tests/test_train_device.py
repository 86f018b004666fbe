"""Device choice for training: `train.device.resolve` through `portable check`'s probes on faked hosts.

The hosts are faked at check's seams only (an isolated /dev, the command runner answering with
real-format nvidia-smi / npu-smi output and the torch probes' JSON, a fake torch_npu package), so
the same parsing and selection code as `portable check` runs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from reproduction.errors import ConfigError
from reproduction.train.device import DeviceSpec, resolve
from tests.fixtures.checks.fakes import TORCH_OK, FakeRun, ascend_context, fixture, make_context, out

NO_CUDA_TORCH = {"torch": "2.13.0+cpu", "cuda_runtime": None, "available": False, "driver_cuda": None, "devices": []}


def _gpu_host(tmp_path: Path, torch: dict = TORCH_OK):
    run = FakeRun(
        {
            "nvidia-smi --query-gpu": out(fixture("nvidia_smi_query_gpu_h100x8.csv")),
            "nvidia-smi --query-compute-apps": out(fixture("nvidia_smi_compute_apps_none.csv")),
            "probe:torch-cuda": out(torch),
        }
    )
    return make_context(tmp_path, run=run, dev_nodes=["nvidiactl", "nvidia0"]), run


def _cpu_host(tmp_path: Path):
    run = FakeRun(
        {
            "nvidia-smi --query-gpu": out("", returncode=127),
            "npu-smi info": out("", returncode=127),
            "probe:torch-cuda": out(NO_CUDA_TORCH),
        }
    )
    return make_context(tmp_path, run=run), run


def test_cpu_probes_nothing_even_on_a_gpu_host(tmp_path):
    ctx, run = _gpu_host(tmp_path)
    assert resolve("cpu", ctx=ctx) == DeviceSpec(kind="cpu", backend="gloo", ray_resource=None)
    assert run.calls == []


def test_auto_on_a_cpu_host_is_cpu_without_running_a_probe(tmp_path):
    ctx, run = _cpu_host(tmp_path)
    assert resolve("auto", ctx=ctx) == DeviceSpec(kind="cpu", backend="gloo", ray_resource=None)
    assert run.calls == []  # check's selection reads device nodes only


def test_auto_on_a_gpu_host_is_cuda_after_checks_torch_probe(tmp_path):
    ctx, run = _gpu_host(tmp_path)
    assert resolve("auto", ctx=ctx) == DeviceSpec(kind="cuda", backend="nccl", ray_resource="GPU")
    assert "probe:torch-cuda" in run.keys() and "probe:torch-npu" not in run.keys()
    assert resolve("cuda", ctx=ctx).backend == "nccl"


def test_auto_on_an_ascend_host_is_npu_without_importing_torch_npu_here(tmp_path):
    ctx, run, _ = ascend_context(tmp_path)
    assert resolve("auto", ctx=ctx) == DeviceSpec(kind="npu", backend="hccl", ray_resource="NPU")
    assert run.env_of("probe:torch-npu")["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "0"  # probed in a subprocess
    assert "torch_npu" not in sys.modules
    assert resolve("npu", ctx=ctx).ray_resource == "NPU"  # Ray does not detect NPUs: workers reserve `NPU`


def test_requested_cuda_without_a_gpu_names_the_device_and_the_probe_finding(tmp_path):
    ctx, _ = _cpu_host(tmp_path)
    with pytest.raises(ConfigError) as info:
        resolve("cuda", ctx=ctx)
    err = info.value
    assert (err.field, err.exit_code, err.value) == ("device", 4, "cuda")
    assert str(err).startswith("device='cuda', but `portable check`'s cuda probe fails: no CUDA device")
    assert "torch 2.13.0+cpu is built without CUDA" in str(err)
    assert err.hint.endswith("or set device to cpu")


def test_requested_npu_without_torch_npu_names_the_device(tmp_path):
    ctx, _ = _cpu_host(tmp_path)
    with pytest.raises(ConfigError) as info:
        resolve("npu", ctx=ctx)
    assert info.value.field == "device" and info.value.exit_code == 4
    assert str(info.value).startswith("device='npu', but `portable check`'s npu probe fails:")
    assert f"torch_npu is not installed in {sys.executable}" in str(info.value)


def test_auto_refuses_a_gpu_host_whose_torch_cannot_use_the_gpus(tmp_path):
    """The device nodes say cuda but torch sees none: an error, never a silent CPU run on a GPU box."""
    ctx, _ = _gpu_host(tmp_path, torch=dict(TORCH_OK, available=False, devices=[]))
    with pytest.raises(ConfigError) as info:
        resolve("auto", ctx=ctx)
    assert str(info.value).startswith(
        f"device='auto' chose cuda ({ctx.dev_dir}/nvidia* present), but `portable "
        "check`'s cuda probe fails: nvidia-smi sees 8 GPU(s) but torch"
    )
    assert "torch.cuda.is_available() is False" in str(info.value) and info.value.field == "device"


def test_unknown_device_is_refused():
    with pytest.raises(ConfigError, match="device='tpu' is not one of cpu, cuda, npu, auto") as info:
        resolve("tpu")
    assert info.value.field == "device"


@pytest.mark.skipif(Path("/dev/nvidiactl").exists(), reason="this machine has an NVIDIA device")
def test_live_machine_without_a_gpu(tmp_path):
    """The real probes on this machine (no accelerator): auto is cpu; cuda is refused by the real
    torch probe run in a subprocess of this interpreter."""
    assert resolve("auto").kind == "cpu"
    with pytest.raises(ConfigError, match=r"^device='cuda', but `portable check`'s cuda probe fails: no CUDA device"):
        resolve("cuda")
