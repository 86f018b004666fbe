"""audit60 N: a non-editable install (`pip install .`) carries only reproduction/; the checkout's data folders
(bundle/, evidence/, LICENSES/, weights_manifest/) stay behind. Built here by copying reproduction/ into a
tmp "site-packages" and running `python -m reproduction.portable` with PYTHONPATH pointing there."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reproduction import portable

REPO = Path(__file__).resolve().parent.parent
WHEEL_HINT = "a non-editable install (pip install .) does not carry bundle/, evidence/, LICENSES/ or weights_manifest/"
HINT = "hint: install from the recap-portable checkout with `pip install -e .` (as README shows)"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding only a copy of reproduction/, as a wheel installs it."""
    folder = tmp_path_factory.mktemp("site-packages")
    shutil.copytree(REPO / "reproduction", folder / "reproduction", ignore=shutil.ignore_patterns("__pycache__"))
    return folder


def _portable(site: Path, cwd: Path, *args: str, timeout: int = 90) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1", "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "reproduction.portable", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _have(modules: tuple[str, ...]) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in modules)


@pytest.mark.skipif(not _have(portable.DEMO_MODULES), reason="the demo's runtime is not installed")
@pytest.mark.parametrize(
    "args",
    [
        ["--quick"],
        ["--quick", "eval.episodes=4"],
        ["--recipe", "grpo", "--quick"],
        ["--world", "libero", "--quick"],
    ],
    ids=["recap", "recap-override", "grpo", "libero"],
)
def test_demo_from_a_non_editable_install_fails_at_once_naming_the_missing_folder(site, tmp_path, args):
    """N1: it generated for a minute, then exit 3 "site-packages/bundle/demo/run.yaml does not exist, rerun with
    --debug" (or a hint naming `--config`, which demo lacks). Now: one line before any work, nothing written."""
    out = tmp_path / "out"
    done = _portable(site, tmp_path, "demo", "--output", str(out), *args)
    assert done.returncode == 3, done.stderr
    assert done.stderr.splitlines() == [
        f"error: portable demo needs the checkout's bundle/ folder, and {site} has none: {WHEEL_HINT}",
        HINT,
    ]
    assert not out.exists(), "the demo failed before generating anything"
    assert "--config" not in done.stderr


def test_pack_from_a_non_editable_install_reads_the_licenses_of_the_specs_checkout(site, tmp_path):
    """N2: `pack bundle/demo.toml` looked for LICENSES/index.json in site-packages only (exit 3)."""
    done = _portable(
        site, tmp_path, "pack", str(REPO / "bundle" / "demo.toml"), "--out", str(tmp_path / "b"), "--dry-run"
    )
    assert done.returncode == 3, done.stderr  # the demo's source folders are not made here: listed, not a crash
    assert done.stderr == ""
    assert "  LICENSES/Apache-2.0.txt for policy-tiny/policy-model, recap-portable, value-tiny/value-model" in (
        done.stdout.splitlines()
    )
    assert "missing on this machine (4):" in done.stdout


def test_weights_verify_from_a_non_editable_install_reads_the_licenses_of_the_manifests_checkout(site, tmp_path):
    """N2: `weights fetch|verify weights_manifest/X.json` from a wheel failed on site-packages/LICENSES/index.json."""
    done = _portable(site, tmp_path, "weights", "verify", str(REPO / "weights_manifest" / "value_tiny.json"), "w")
    assert done.returncode == 5, done.stderr  # past the licenses: the weights folder is empty, every file missing
    assert "0 of 1 files verified; 1 missing" in done.stdout


def test_pack_of_a_spec_outside_any_checkout_names_the_missing_licenses_folder(site, tmp_path):
    """N2: no LICENSES/ beside the package nor above the spec: the one-line error, not a hint to do what one does."""
    spec = tmp_path / "elsewhere" / "demo.toml"
    spec.parent.mkdir()
    shutil.copy(REPO / "bundle" / "demo.toml", spec)
    done = _portable(site, tmp_path, "pack", str(spec), "--out", str(tmp_path / "b"), "--dry-run")
    assert done.returncode == 3, done.stderr
    assert done.stderr.splitlines() == [
        f"error: pack {spec} needs the checkout's LICENSES/ folder, and {site} has none: {WHEEL_HINT}",
        HINT,
    ]


def test_a_missing_base_package_names_its_install_not_the_runtime(monkeypatch, tmp_path):
    """N4: huggingface_hub (a base dependency) missing prescribed the multi-GB torch + sim runtime, and `.` from any
    cwd."""
    monkeypatch.chdir(tmp_path)
    err = portable.missing_runtime("huggingface_hub", "fetch")
    assert (
        err.hint
        == f"install it with `pip install huggingface_hub`, or install recap-portable: cd {REPO} && pip install -e ."
    )
    err = portable.missing_runtime("numpy", "eval")
    assert err.hint == (
        f"install the runtime (README's quick start): cd {REPO} && pip install -c constraints.txt torch==2.13.0 "
        "-e '.[sim]'; a Python without it runs only verify, restore, check, compare and lineage"
    )


def test_the_libero_demo_without_its_runtime_names_the_libero_extra(monkeypatch, capsys, tmp_path):
    """N4: `demo --world libero` named `[sim]`, so the user needed two install rounds."""
    monkeypatch.setitem(sys.modules, "torch", None)  # as if torch were not installed
    assert portable.main(["demo", "--world", "libero", "--quick", "--output", str(tmp_path / "l")]) == 10
    err = capsys.readouterr().err
    assert "-e '.[libero]'" in err and "[sim]" not in err, err
    assert not (tmp_path / "l").exists()


def test_a_built_weight_pack_cannot_build_says_how_to_get_it(monkeypatch, capsys, tmp_path):
    """N6: "get it with install torch to build it, or portable weights fetch" was garbled."""
    monkeypatch.chdir(REPO)
    monkeypatch.setitem(sys.modules, "torch", None)  # pack cannot build without torch
    portable.main(["pack", "bundle/demo.toml", "--out", str(tmp_path / "b"), "--dry-run"])
    out = capsys.readouterr()
    assert (
        "weights/value-tiny/model.safetensors: not found (the spec names no source folder); get it with torch and "
        "safetensors installed (pack then builds it from its manifest's config and seed)"
    ) in out.out + out.err


def test_the_numerics_probe_failing_for_want_of_numpy_names_numpy(tmp_path):
    """N3: on a base install (torch, no numpy) the fix said "run python -c 'import torch' to see why" (torch works)."""
    from reproduction.checks.host import probe_cpu_numerics
    from reproduction.checks.probe import CommandResult
    from tests.fixtures.checks.fakes import FakeRun, make_context

    answer = "Traceback (most recent call last):\nRuntimeError: Numpy is not available"
    run = FakeRun({"probe:cpu-numerics": CommandResult(argv=("python",), returncode=1, stdout=answer)})
    ctx = make_context(tmp_path, run=run)
    ctx.facts = {"modules": {"torch": "/site/torch/__init__.py", "numpy": None}}
    (row,) = probe_cpu_numerics(ctx)
    assert row.status == "warn"
    assert row.fix == f"install numpy into {ctx.python} (it comes with the `sim` extra: pip install -e '.[sim]')"
