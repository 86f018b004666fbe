"""Audit 58 / A4: a full disk must not fail a restore that writes nothing, and a full disk met by a write on an open
file (no file name in the OSError) is exit 8 naming the folder, not "(a file)".

The full disk enters through a seam (os.pwrite raising ENOSPC), so these run without root or a tmpfs; the real
tmpfs case is /work/audit58_A/repro_A4.sh.
"""

from __future__ import annotations

import errno
import os

import pytest
from bundlekit import QUIET, write_tree

from reproduction import portable
from reproduction.errors import LockHeldError
from reproduction.release.lock import folder_lock
from reproduction.release.pack import pack_bundle
from reproduction.release.restore import restore_bundle


def _restored_bundle(tmp_path):
    write_tree(tmp_path / "src" / "app", {"a.py": b"print(1)\n", "lib/b.py": b"x = 2\n"})
    (tmp_path / "s.toml").write_text(
        'name = "full"\nroot = "src"\n[[layer]]\nsource = "app"\nkind = "source"\nname = "app"\n', encoding="utf-8"
    )
    pack_bundle(tmp_path / "s.toml", tmp_path / "B", ui=QUIET)
    restore_bundle(tmp_path / "B", ui=QUIET)
    return tmp_path / "B"


def _disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")  # as os.pwrite raises it: no file name


def test_an_unchanged_restored_bundle_restores_with_exit_0_when_the_lock_note_cannot_be_written(
    tmp_path, monkeypatch, capsys
):
    """The pid note in .portable/lock is informational (the flock excludes): on a full disk it was exit 8."""
    bundle = _restored_bundle(tmp_path)
    monkeypatch.setattr(os, "pwrite", _disk_full)
    assert portable.main(["restore", str(bundle)]) == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    assert "error" not in err and "unchanged source/app" in err
    assert (bundle / ".portable" / "lock").read_bytes() == b""  # no note, and no stale one either
    for code in (errno.EDQUOT, errno.EROFS):

        def refused(*args, code=code, **kwargs):
            raise OSError(code, os.strerror(code))

        monkeypatch.setattr(os, "pwrite", refused)
        assert portable.main(["restore", str(bundle)]) == 0, capsys.readouterr().err


def test_a_lock_without_its_note_still_excludes_a_second_holder(tmp_path, monkeypatch):
    """No note written: the lock holds all the same, and the refused process names no holder rather than failing."""
    lock = tmp_path / "lock"
    monkeypatch.setattr(os, "pwrite", _disk_full)
    with folder_lock(tmp_path, lock, what="restore", subject="this bundle"):
        with pytest.raises(LockHeldError) as caught:
            with folder_lock(tmp_path, lock, what="restore", subject="this bundle"):
                pass
    assert str(caught.value) == (
        f"{tmp_path}: another portable process is working on this bundle; refusing to restore at the same time"
    )


def test_a_nameless_full_disk_names_the_folder_the_command_writes_to(tmp_path, monkeypatch, capsys):
    """A write on an open file (os.write, os.pwrite) names no file: the error said "the disk is full (a file)"."""
    from reproduction.release import restore

    bundle = _restored_bundle(tmp_path)
    monkeypatch.setattr(restore, "restore_bundle", _disk_full)
    assert portable.main(["restore", "--deep", str(bundle)]) == 8
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"error: cannot write a file: the disk is full at {bundle} (")
    assert lines[0].endswith(" were free)") and "(a file)" not in lines[0]
    # the fault is raised from this file, so the hint starts "raised at ...test_restore_full_disk_audit58.py:N"
    assert lines[1].startswith("hint: raised at ") and lines[1].endswith(
        f"; free some space at {bundle}, then run the command again (--debug shows which write it was)"
    )
