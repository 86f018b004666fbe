"""A PORTABLE_* variable that nothing reads is said in one warning line by every command, not only by
`portable check`'s host.settings row: PORTABLE_CPU_KERNEL=native silently ran with the default kernels (audit55 H2)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _compare(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PORTABLE_")}
    return subprocess.run(
        [sys.executable, str(REPO / "reproduction" / "portable.py"), "compare", "a.json", "b.json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**clean, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **env},
        timeout=120,
    )


def test_a_misspelled_setting_is_warned_about_and_the_command_goes_on(tmp_path):
    out = _compare(tmp_path, PORTABLE_CPU_KERNEL="native", PORTABLE_NOTHING_AT_ALL="1")
    lines = out.stderr.splitlines()
    assert lines[0] == (
        "warning: set but read by nothing, so they change nothing: PORTABLE_CPU_KERNEL (did you mean "
        "PORTABLE_CPU_KERNELS?), PORTABLE_NOTHING_AT_ALL; fix the name or unset it (docs/settings.md lists every knob)"
    )
    assert out.returncode == 3 and lines[1].startswith("error: evidence file")  # the command itself still ran


def test_known_settings_say_nothing_and_quiet_silences_the_warning(tmp_path):
    assert not _compare(tmp_path, PORTABLE_CPU_KERNELS="native").stderr.startswith("warning")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PORTABLE_")}
    out = subprocess.run(
        [sys.executable, str(REPO / "reproduction" / "portable.py"), "-q", "compare", "a.json", "b.json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(REPO), "PORTABLE_CPU_KERNEL": "native"},
        timeout=120,
    )
    assert "warning" not in out.stderr and out.returncode == 3
