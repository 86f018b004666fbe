"""audit63 A L6: out of inodes on a tmpfs, restore said "the disk is full at f289.txt (55.7 GiB were free)": the bare
name of a write by dir_fd, and the free space of the current folder's disk, not the bundle's. A full disk's error now
names the member's path in staging, gives the free space only of a path it knows, and says when no inode is left."""

from __future__ import annotations

import errno
import io
import os
import tarfile

import pytest

from reproduction.errors import WriteFailedError, os_error
from reproduction.release import extract
from reproduction.release.extract import extract_stream
from reproduction.release.tarscan import Member


def test_a_bare_file_name_gets_no_free_space_figure_of_the_current_folders_disk():
    err = os_error(OSError(errno.ENOSPC, "No space left on device", "f289.txt"), "the staging folder /x/staging/0")
    assert isinstance(err, WriteFailedError) and err.exit_code == 8
    assert err.message == "cannot write the staging folder /x/staging/0: the disk is full at f289.txt"


def test_a_full_disk_with_bytes_free_says_no_inode_is_left(tmp_path, monkeypatch):
    from reproduction import fsio

    monkeypatch.setattr(fsio, "out_of_inodes", lambda path: True)
    monkeypatch.setattr(fsio, "free_bytes", lambda path: 19 << 20)
    err = os_error(OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "f.txt")), "the bundle")
    assert err.message == (
        f"cannot write the bundle: the disk is full at {tmp_path / 'f.txt'} (no free inodes: the filesystem holds "
        "as many files as it can, 19.0 MiB were free)"
    )
    assert err.hint.startswith("remove files there (or use a filesystem with more inodes)")


def test_an_extraction_that_fills_the_disk_names_the_members_path_in_staging(tmp_path, monkeypatch):
    names = ["d/a.txt", "d/b.txt"]
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in names:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = 2, 1577836800
            tar.addfile(info, io.BytesIO(b"ok"))
    expected = [Member(name=n, raw_name=n, kind="file", mode=0o644, size=2, mtime=0) for n in names]
    real = extract._write_file

    def full(dirs, m, *args, **kwargs):  # the second file finds no inode: its open() names the bare name
        if m.name == "d/b.txt":
            raise OSError(errno.ENOSPC, "No space left on device", "b.txt")
        return real(dirs, m, *args, **kwargs)

    monkeypatch.setattr(extract, "_write_file", full)
    dest = tmp_path / "staging" / "0"
    with pytest.raises(WriteFailedError) as info:
        extract_stream(io.BytesIO(raw.getvalue()), expected, dest, archive="x.tar.zst")
    assert info.value.message.startswith(
        f"cannot write the staging folder {dest}: the disk is full at {dest / 'd' / 'b.txt'} ("
    )
    assert os.path.isabs(info.value.message.split(" at ", 1)[1].split(" (")[0])
