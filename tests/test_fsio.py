"""Atomic writes: whole-or-nothing, and the file mode a plain open() would give."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reproduction.fsio import atomic_write_bytes, atomic_write_text


def test_new_file_gets_umask_mode_and_existing_mode_is_kept(tmp_path: Path):
    old = os.umask(0o022)
    try:
        target = tmp_path / "a.json"
        atomic_write_text(target, "one")
        assert target.stat().st_mode & 0o777 == 0o644
        target.chmod(0o600)
        atomic_write_text(target, "two")
        assert target.stat().st_mode & 0o777 == 0o600
        assert target.read_text() == "two"
    finally:
        os.umask(old)


def test_failed_write_keeps_old_file_and_leaves_no_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    target = tmp_path / "b.bin"
    atomic_write_bytes(target, b"old")

    def boom(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError):
        atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.bin"]


def test_orphaned_staging_folders_of_dead_processes_are_removed_live_ones_kept(tmp_path):
    """A SIGKILL during a stage's tokenizer setup left <stage>/.tokenizer.<pid>.partial/ for good (the kill sweep)."""
    import subprocess
    import sys

    from reproduction.fsio import remove_orphaned_staging

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = tmp_path / f".tokenizer.{int(dead.stdout)}.partial"
    mine = tmp_path / f".tokenizer.{os.getpid()}.partial"
    other = tmp_path / ".cache.123.partial"
    for folder in (gone, mine, other):
        (folder / "sub").mkdir(parents=True)
    assert remove_orphaned_staging(tmp_path, ".tokenizer") == [gone]
    assert not gone.exists() and mine.is_dir() and other.is_dir()
