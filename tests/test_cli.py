"""The CLI's contract: fast --help, no pipeline imports in the control plane, one-line errors."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "reproduction" / "portable.py"

CONTROL_MODULES = [
    "reproduction.portable",
    "reproduction.release.manifest",
    "reproduction.release.pack",
    "reproduction.release.verify",
    "reproduction.release.restore",
    "reproduction.release.hub",
    "reproduction.checks.report",
]
HEAVY = ["torch", "ray", "transformers", "pyarrow", "numpy"]


def test_control_plane_imports_no_pipeline_library():
    code = (
        "import importlib, sys\n"
        f"for m in {CONTROL_MODULES!r}:\n"
        "    try:\n        importlib.import_module(m)\n"
        "    except ModuleNotFoundError as e:\n"
        "        if not e.name.startswith('reproduction'): raise\n"
        f"bad = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"control plane imported {out.stdout.strip()}"


def test_help_is_fast_and_lists_commands():
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        out = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, check=True)
        best = min(best, time.perf_counter() - start)
    for command in ("pack", "verify", "restore", "check", "publish", "fetch", "run", "demo"):
        assert command in out.stdout
    assert best < 0.5, f"portable --help took {best:.2f}s"


def test_script_and_console_entry_are_the_same_program():
    from reproduction import portable

    out = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, check=True)
    assert (
        out.stdout == portable.build_parser().format_help().replace("portable.py", "portable")
        or "usage: portable" in out.stdout
    )


def test_usage_error_exit_code_is_2():
    out = subprocess.run([sys.executable, str(SCRIPT), "pack"], capture_output=True, text=True)
    assert out.returncode == 2
    assert "SPEC.toml" in out.stderr
