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
# The kernels `portable` pins before torch loads, pinned here before any test imports torch: otherwise the first
# in-process `portable` call pins them for the Ray workers started later while this process keeps the CPU's native
# kernels, and "the workers' values equal the in-process ones, bit for bit" depends on which test ran first.
from reproduction.numerics import pin_cpu_kernels  # noqa: E402  (imports no torch)

pin_cpu_kernels()


def pytest_collection_modifyitems(config, items):
    """Files that hold a slow test first, in their order, then the rest: the two xdist workers take whole files in this
    order (pyproject's --dist loadfile), and a long file taken last would run alone while the other worker idles.
    pyproject also passes --no-loadscope-reorder: xdist 3.8 otherwise re-sorts the files by their number of tests,
    which put the two-test demo file last (it ran alone for the suite's last ~3 minutes)."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)  # stable: each file's tests keep their order


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


def _session_cache_root(tmp_path_factory) -> Path:
    """A folder this session's test processes share: under xdist the workers' base temp folders sit side by side in
    one per-session folder; without xdist the session's own base temp (its parent holds earlier sessions)."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "session-cache"
    root.mkdir(exist_ok=True)
    return root


@pytest.fixture(scope="session")
def session_build(tmp_path_factory):
    """`build(key, make)`: the folder `make(folder)` fills for `key` (a JSON-able value naming every input), made
    once per test session and shared by every test and xdist worker that asks with an equal key; the others wait on
    a lock and get the finished folder. Callers copy it before changing anything in it."""
    import fcntl
    import hashlib
    import json
    import shutil
    import time

    root = _session_cache_root(tmp_path_factory)

    def build(key, make) -> Path:
        name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
        done = root / name
        with open(root / f"{name}.lock", "w") as lock:
            deadline = time.monotonic() + 1200  # bounded: a maker stuck past 20 min fails the waiter, not the suite
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released when the file closes (a crash too)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        pytest.fail(f"session_build: {name} still being built by another worker after 1200 s")
                    time.sleep(0.5)
            if not done.is_dir():
                partial = root / f"{name}.partial"
                shutil.rmtree(partial, ignore_errors=True)
                make(partial)
                partial.rename(done)  # complete or absent: a failed make is retried by the next caller
        return done

    return build


@pytest.fixture(scope="session")
def libero_sft_32(session_build):
    """`copy_to(folder)`: one scripted-expert LIBERO-10 task-0 demonstration rendered with upstream's two cameras at
    32 px (LiberoGenConfig(kind="sft", episodes=1, image_size=32, max_steps=340): ~300 rendered steps), generated
    once per session and copied into `folder`. tests/test_grpo_libero.py (GRPO with a camera) and
    tests/test_libero_release.py (the release config) both start from it."""
    import shutil

    from reproduction.sim.libero.generate import LiberoGenConfig, close_envs, generate_libero_dataset
    from reproduction.ui import UiOptions

    config = LiberoGenConfig(kind="sft", episodes=1, image_size=32, max_steps=340)  # sft: every episode the expert's

    def make(out: Path) -> None:
        try:
            generate_libero_dataset(config, out, ui=UiOptions(progress=False))
        finally:
            close_envs()

    def copy_to(folder: Path) -> Path:
        shutil.copytree(session_build(["libero_sft", config.to_dict()], make), folder)
        return folder

    return copy_to


@pytest.fixture
def terminal_sigint():
    """SIGINT handled as in a terminal, for a test that sends it to a child: a shell that starts the suite as a
    background job (`cmd &` in a script, some CI runners) starts it with SIGINT ignored, every child inherits that
    across exec, and a Ctrl-C sent to a child then does nothing. A Python handler here is reset to the default in an
    exec'd child, which then installs Python's own. The test process's handler is put back after."""
    import signal

    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
