"""What a Ray task started by `run_tasks` computes with: the driver's pinned CPU kernels, whatever its node's own
environment (a remote node started without them, a local Ray started before `pin_cpu_kernels`)."""

from __future__ import annotations

import os

import pytest

from reproduction.numerics import PINNED
from reproduction.train.launcher import _worker_env, run_tasks


def _kernels_seen(_payload) -> dict:
    import torch

    return {name: os.environ.get(name) for name in PINNED} | {"torch": torch.backends.cpu.get_cpu_capability()}


def test_the_worker_env_carries_the_drivers_pinned_kernels_and_only_what_is_set(monkeypatch):
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    env = _worker_env(local=False)
    assert (env["ATEN_CPU_CAPABILITY"], env["MKL_CBWR"], env["OMP_NUM_THREADS"]) == ("avx2", "COMPATIBLE", "1")
    monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    monkeypatch.delenv("MKL_CBWR")  # PORTABLE_CPU_KERNELS=native: nothing pinned, the node's own left alone
    env = _worker_env(local=False)
    assert "ATEN_CPU_CAPABILITY" not in env and "MKL_CBWR" not in env


@pytest.mark.timeout(180)
def test_a_ray_task_uses_the_drivers_kernels_not_its_nodes(ray_address, monkeypatch):
    """The module's Ray was started with this process's environment then; the driver's kernels changed since (as a
    remote node started without them differs): each task still gets the driver's."""
    from reproduction.train.device import resolve

    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    seen = run_tasks(_kernels_seen, [0, 1], spec=resolve("cpu"), ray_address=ray_address, label="kernel probe")
    assert seen == [{"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "torch": "DEFAULT"}] * 2
