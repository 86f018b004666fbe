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
