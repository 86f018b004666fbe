"""Find other CPython interpreters for the tests that need them (never at fixed paths).

Looked for, in order: under `pyenv root`/versions (the `pyenv` command, else $PYENV_ROOT, else
~/.pyenv), then `pythonX.Y` on PATH. A candidate counts only when it runs and reports the version
asked for (a pyenv shim for a version that is not selected does not). Tests skip with
`missing_reason(...)`, which says where they looked.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path


@functools.cache
def pyenv_root() -> Path | None:
    exe = shutil.which("pyenv")
    if exe:
        try:
            out = subprocess.run([exe, "root"], capture_output=True, text=True, timeout=20)
            if out.returncode == 0 and out.stdout.strip():
                return Path(out.stdout.strip())
        except (OSError, subprocess.SubprocessError):
            pass
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    return root if root.is_dir() else None


def _version_of(python: Path) -> str | None:
    try:
        out = subprocess.run(
            [str(python), "-c", "import sys; print('.'.join(map(str, sys.version_info[:3])))"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


@functools.cache
def find_python(minor: str) -> tuple[Path, str] | None:
    """(interpreter, full version) of a CPython `minor` ("3.12"), or None when none is found."""
    candidates: list[Path] = []
    root = pyenv_root()
    if root is not None:
        versions = sorted((root / "versions").glob(f"{minor}.*"), reverse=True)
        candidates += [v / "bin" / f"python{minor}" for v in versions if v.name.replace(".", "").isdigit()]
    on_path = shutil.which(f"python{minor}")
    if on_path:
        candidates.append(Path(on_path))
    for python in candidates:
        version = _version_of(python) if python.is_file() else None
        if version and version.rsplit(".", 1)[0] == minor:
            return python, version
    return None


def other_pythons(*minors: str) -> list[Path]:
    """The interpreters found among `minors`, skipping this interpreter's own version."""
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    return [found[0] for m in minors if m != here and (found := find_python(m)) is not None]


def missing_reason(minor: str) -> str:
    root = pyenv_root()
    where = f"{root}/versions/{minor}.*" if root else "no pyenv root"
    return f"no working Python {minor} found (looked under {where} and for python{minor} on PATH)"
