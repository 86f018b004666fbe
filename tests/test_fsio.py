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


def test_atomic_writes_name_their_temp_by_pid_and_orphans_of_dead_writers_are_removed(tmp_path, monkeypatch):
    """A SIGKILL in the middle of atomic_write_bytes skips its `finally`: the kill sweep found `.run.json.<x>.tmp`,
    evidence and lineage temps left in run folders for good. The temp carries the writer's pid, so a leftover
    whose writer is gone can be told from one being written now (a lingering worker's, or this process's)."""
    import re
    import subprocess
    import sys

    from reproduction import fsio
    from reproduction.fsio import TEMP_NAME, remove_orphaned_temps

    seen = []
    real = os.replace
    monkeypatch.setattr(fsio.os, "replace", lambda src, dst: (seen.append(Path(src).name), real(src, dst)))
    atomic_write_text(tmp_path / "run.json", "{}\n")
    monkeypatch.undo()
    assert re.fullmatch(rf"\.run\.json\.{os.getpid()}\.[a-z0-9_]{{8}}\.portable-tmp", seen[0]) and TEMP_NAME.fullmatch(
        seen[0]
    )

    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True).stdout)
    gone = [
        tmp_path / f".run.json.{dead}.abcd_123.portable-tmp",
        tmp_path / "evidence" / f".e.json.{dead}.zzzzzzzz.portable-tmp",
    ]
    kept = [
        tmp_path / f".run.json.{os.getpid()}.abcd_123.portable-tmp",  # a live writer's
        tmp_path / ".notes.tmp",  # not fsio's name: a user's file
        tmp_path / f".notes.{dead}.abcdefgh.tmp",  # shaped like one but .tmp: a user's (audit45 recipes F1)
        tmp_path / f".run.json.{dead}.short.portable-tmp",
        tmp_path / ".x.99999999999999999999.abcdefgh.portable-tmp",  # no pid is that large (was an OverflowError)
        tmp_path / f".out.{dead}.abcdefgh.portable-tmp",  # a recorded output: kept
    ]
    for path in gone + kept:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("half")
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / f".x.{dead}.abcdefgh.portable-tmp").write_text("not under root")
    (tmp_path / "linked").symlink_to(outside)  # links are not followed
    assert sorted(remove_orphaned_temps(tmp_path, keep=[tmp_path / f".out.{dead}.abcdefgh.portable-tmp"])) == sorted(
        gone
    )
    assert all(p.is_file() for p in kept) and not any(p.exists() for p in gone)
    assert (outside / f".x.{dead}.abcdefgh.portable-tmp").is_file()


def test_a_zombie_writer_is_gone_and_its_temp_removed(tmp_path):
    """A process killed together with its parent stays a zombie until init reaps it; the kill sweep's `--resume`
    right after such a kill found the killed run's temp file kept as a live writer's."""
    import signal
    import subprocess
    import sys
    import time

    from reproduction.fsio import pid_alive, remove_orphaned_temps

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert pid_alive(child.pid)
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while open(f"/proc/{child.pid}/stat").read().rpartition(")")[2].split()[0] != "Z":  # not reaped: a zombie
            assert time.monotonic() < deadline
            time.sleep(0.01)
        temp = tmp_path / f".run.json.{child.pid}.abcdefgh.portable-tmp"
        temp.write_text("half")
        assert not pid_alive(child.pid) and remove_orphaned_temps(tmp_path) == [temp]
    finally:
        child.kill()
        child.wait()
    assert not pid_alive(child.pid)


def test_errors_name_one_file_and_print_no_second_name(tmp_path, monkeypatch):
    """A rename's OSError names the temp and the target; the error atomic_write_bytes raises names the target alone,
    and remove_tree's names the entry: neither prints ' -> None' (a second name set to None does)."""
    import errno

    from reproduction.fsio import atomic_write_bytes, remove_tree

    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device", src, dst)

    with monkeypatch.context() as m:
        m.setattr(os, "replace", full)
        with pytest.raises(OSError) as err:
            atomic_write_bytes(tmp_path / "f.json", b"{}")
    target = str(tmp_path / "f.json")
    assert str(err.value) == f"[Errno 28] No space left on device: {target!r}" and err.value.errno == errno.ENOSPC
    assert getattr(err.value, "need_bytes", None) == 2
    (tmp_path / "t" / "d").mkdir(parents=True)
    (tmp_path / "t" / "d" / "busy").write_text("x")

    def busy(name, *, dir_fd=None):
        raise OSError(errno.EBUSY, "Device or resource busy", name)

    monkeypatch.setattr(os, "unlink", busy)
    with pytest.raises(OSError) as err:
        remove_tree(tmp_path / "t")
    assert str(err.value) == f"[Errno 16] Device or resource busy: {str(tmp_path / 't' / 'd' / 'busy')!r}"
