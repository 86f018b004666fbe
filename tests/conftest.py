"""Shared pytest setup: one BLAS/OpenMP thread per process, and the repo root importable."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("GOMP_SPINCOUNT", "1000")  # as `portable` sets it: short spins on a busy CI machine
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("PORTABLE_NO_PROGRESS", "1")
if sys.platform.startswith("linux"):
    # Headless rendering for every test: mujoco reads MUJOCO_GL once, at its first import, and a test
    # module that imports mujoco (through gymnasium) before reproduction.sim would otherwise get GLFW.
    os.environ.setdefault("MUJOCO_GL", "egl")

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


@pytest.fixture(scope="module")
def ray_address():
    """One private local Ray per test module (2 CPUs, no dashboard, loopback only), stopped at the module's end;
    yields its GCS address for `--ray-address` / `ray_address=`."""
    import ray

    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=200 * 1024 * 1024,
        log_to_driver=False,
        _node_ip_address="127.0.0.1",
    )
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


@pytest.fixture(scope="session")
def quick_demo(tmp_path_factory):
    """One `portable demo --quick` for the session, run with tokens planted in its environment (tests/planted.py):
    tests/test_run_demo.py checks it and reruns it, tests/test_run_secrets.py scans every file it wrote (a quick demo
    costs ~100 s on 2 cores). Returns (its --output folder, the CompletedProcess, its seconds)."""
    import subprocess
    import time

    from planted import planted_env

    root = tmp_path_factory.mktemp("quick-demo")
    out = root / "demo"
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "reproduction.portable", "demo", "--quick", "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=1400,
        env=planted_env(),
        cwd=root,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out, proc, time.perf_counter() - t0


@pytest.fixture
def recorded_progress(monkeypatch):
    """`install(module)` replaces the module's `progress` (reproduction.ui's) with a recorder and returns the
    list it fills: ("task", description, total), ("advance", n) and ("show", fields), in call order."""

    def install(module) -> list:
        seen: list = []

        class Bar:
            def task(self, description, total=None):
                seen.append(("task", description, total))
                return self

            def advance(self, n=1):
                seen.append(("advance", n))

            def show(self, **fields):
                seen.append(("show", fields))

        @contextmanager
        def fake_progress(ui=None):
            yield Bar()

        monkeypatch.setattr(module, "progress", fake_progress)
        return seen

    return install
