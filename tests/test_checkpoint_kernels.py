"""A checkpoint records the CPU kernels its steps were computed with; a resume under other kernels is refused
(audit52 T1): one stage's steps are never computed with two kernels under one lineage record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import train_tiny

from reproduction.errors import CheckpointError
from reproduction.numerics import cpu_kernels
from reproduction.train import checkpoint
from reproduction.train.api import train
from reproduction.train.config import TrainConfig

AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}


def _inproc(**kw) -> TrainConfig:
    return train_tiny.config(world_size=1, launcher="inprocess", save_interval=2, eval_interval=0, **kw)


def _kernels(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> str:
    """Set the kernels as a pipeline command leaves them in the environment (numerics.pin_cpu_kernels); returns
    what lineage records for them."""
    for name in AVX2:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return cpu_kernels()


def _manifest(out: Path, step: int) -> dict:
    return json.loads((out / "checkpoints" / f"step_{step}" / "manifest.json").read_text())


@pytest.fixture
def stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A value stage's trainer folder in a run folder, trained 2 steps under the pinned (avx2) kernels."""
    (tmp_path / "run.json").write_text("{}")
    out = tmp_path / "value" / "model_0"
    _kernels(monkeypatch, AVX2)
    train(train_tiny.make_task, _inproc(max_steps=2), out_dir=out, resume=False)
    return out


def test_the_manifest_records_the_kernels_and_world_sizes(stage, monkeypatch):
    manifest = _manifest(stage, 2)
    assert manifest["versions"]["cpu_kernels"] == _kernels(monkeypatch, AVX2)
    assert manifest["versions"]["cpu_kernels"].startswith("ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2")
    assert manifest["world_sizes"] == [1]


def test_a_resume_under_other_kernels_is_refused_naming_both(stage, monkeypatch):
    saved = _kernels(monkeypatch, AVX2)
    native = _kernels(monkeypatch, {})  # PORTABLE_CPU_KERNELS=native: neither variable set
    assert native.startswith("native")
    with pytest.raises(CheckpointError) as info:
        train(train_tiny.make_task, _inproc(max_steps=4), out_dir=stage, resume=True)
    err = info.value
    folder = stage / "checkpoints" / "step_2"
    assert err.exit_code == 52
    assert str(err) == (
        f"stage value: cannot resume {folder}: cpu_kernels changed since its steps were computed: "
        f"{saved!r} -> {native!r} (the CPU kernels change the trained bits)"
    )
    assert "\n" not in str(err)
    assert err.hint == (
        "continue with PORTABLE_CPU_KERNELS=avx2 (the default: unset PORTABLE_CPU_KERNELS), "
        "or pass --restart-stage value to train it anew under these kernels"
    )
    assert (err.field, err.expected, err.actual) == ("cpu_kernels", saved, native)
    assert checkpoint.complete_steps(stage / "checkpoints") == [2]  # nothing trained on


def test_a_resume_under_the_same_kernels_trains_on(stage, monkeypatch):
    kernels = _kernels(monkeypatch, AVX2)
    result = train(train_tiny.make_task, _inproc(max_steps=4), out_dir=stage, resume=True)
    assert (result.resumed_from, result.step) == (2, 4)
    assert _manifest(stage, 4)["versions"]["cpu_kernels"] == kernels
    assert _manifest(stage, 4)["world_sizes"] == [1]


def test_a_manifest_without_the_kernels_field_resumes_as_before(stage, monkeypatch):
    path = stage / "checkpoints" / "step_2" / "manifest.json"
    manifest = json.loads(path.read_text())
    del manifest["versions"]["cpu_kernels"], manifest["world_sizes"]  # as the code before audit52 T1 wrote it
    path.write_text(json.dumps(manifest, indent=1))
    native = _kernels(monkeypatch, {})
    result = train(train_tiny.make_task, _inproc(max_steps=4), out_dir=stage, resume=True)
    assert (result.resumed_from, result.step) == (2, 4)
    assert _manifest(stage, 4)["versions"]["cpu_kernels"] == native
    assert _manifest(stage, 4)["world_sizes"] == [1]  # its `world_size` stands for the steps before


def test_which_kernel_records_differ():
    folder = Path("/nowhere/checkpoints/step_2")  # no run.json above: the trainer's own hint
    pinned = "ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2"
    manifest = {"versions": {"cpu_kernels": f"{pinned} cpu=AVX-512"}}
    checkpoint.check_kernels(folder, manifest, f"{pinned} cpu=AVX2")  # pinned: the same bits on either CPU
    checkpoint.check_kernels(folder, manifest, None)  # an accelerator run: the CPU kernels do not train
    assert checkpoint.kernels_for(torch.device("cuda")) is None
    assert checkpoint.kernels_for(torch.device("cpu")) == cpu_kernels()
    with pytest.raises(CheckpointError) as info:  # native kernels follow the CPU
        checkpoint.check_kernels(folder, {"versions": {"cpu_kernels": "native cpu=AVX-512"}}, "native cpu=AVX2")
    assert info.value.exit_code == 52
    assert str(info.value).startswith(f"cannot resume {folder}: cpu_kernels changed")
    assert info.value.hint == (
        "continue with PORTABLE_CPU_KERNELS=native on a CPU with AVX-512, "
        "or start over in a new out_dir (resume=False) under these kernels"
    )
    with pytest.raises(CheckpointError, match="'ATEN_CPU_CAPABILITY=default MKL_CBWR=AVX2' -> ") as info:
        checkpoint.check_kernels(
            folder, {"versions": {"cpu_kernels": "ATEN_CPU_CAPABILITY=default MKL_CBWR=AVX2"}}, pinned
        )
    assert info.value.hint.startswith("continue with ATEN_CPU_CAPABILITY=default MKL_CBWR=AVX2, or")


def test_world_sizes_of_a_manifest():
    assert checkpoint.trained_world_sizes({"world_size": 2, "world_sizes": [2, 1]}) == [2, 1]
    assert checkpoint.trained_world_sizes({"world_size": 2}) == [2]
    assert checkpoint._with_world([2], 1) == [2, 1]  # trained on 2 ranks, resumed on 1
    assert checkpoint._with_world([2, 1], 1) == [2, 1]
    assert checkpoint._with_world([], 2) == [2]
