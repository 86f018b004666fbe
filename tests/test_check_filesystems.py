"""Filesystem probe: a real-format /proc/mounts with nfs4, lustre and cifs mounts through the live parser."""

from __future__ import annotations

from pathlib import Path

import pytest

from reproduction.checks import filesystems
from reproduction.checks.filesystems import mount_for, parse_mounts, probe_filesystems
from tests.fixtures.checks.fakes import FIXTURES, fixture, make_context

MOUNTS = FIXTURES / "mounts_network.txt"


def test_parse_mounts_unescapes_octal_and_picks_longest_prefix():
    mounts = parse_mounts(fixture("mounts_network.txt"))
    assert [m.fstype for m in mounts][-3:] == ["nfs4", "lustre", "cifs"]
    assert mounts[-1].mountpoint == "/mnt/team share"
    assert mount_for(Path("/mnt/team share/cache/triton"), mounts).fstype == "cifs"
    assert mount_for(Path("/scratch/u1/triton"), mounts).fstype == "xfs"
    assert mount_for(Path("/opt/x"), mounts).fstype == "ext4"


@pytest.mark.parametrize(
    "triton,fstype", [("/lustre/proj/u1/triton", "lustre"), ("/mnt/team share/triton", "cifs"), ("/home/u1/tc", "nfs4")]
)
def test_triton_cache_on_network_filesystem_warns(tmp_path, triton, fstype, monkeypatch):
    # /scratch/u1 is a fictional home (the mount table is a fixture): as a user who may not create /scratch it
    # would be "unusable" here; whether a path can be created is test_check_audit51's subject, not this one's
    monkeypatch.setattr(filesystems, "unusable", lambda path: None)
    ctx = make_context(tmp_path, env={"TRITON_CACHE_DIR": triton}, mounts_file=MOUNTS, home=Path("/scratch/u1"))
    rows = {r.name: r for r in probe_filesystems(ctx)}
    row = rows["fs.triton_cache"]
    assert row.status == "warn" and row.details["fstype"] == fstype
    assert row.finding.startswith(f"TRITON_CACHE_DIR {triton} is on {fstype}")
    assert row.fix.startswith("export TRITON_CACHE_DIR=/tmp/triton-$USER")
    assert rows["fs.home_cache"].status == "ok" and "on xfs (local)" in rows["fs.home_cache"].finding


def test_home_on_nfs_warns_for_default_triton_and_home_cache(tmp_path):
    ctx = make_context(tmp_path, mounts_file=MOUNTS, home=Path("/home/u1"))
    rows = {r.name: r for r in probe_filesystems(ctx)}
    assert (
        rows["fs.triton_cache"].status == "warn"
        and "/home/u1/.triton/cache is on nfs4 (/home)" in rows["fs.triton_cache"].finding
    )
    assert rows["fs.home_cache"].status == "warn" and "XDG_CACHE_HOME" in rows["fs.home_cache"].fix


def test_unreadable_mount_table_warns(tmp_path):
    rows = probe_filesystems(make_context(tmp_path, mounts_file=tmp_path / "missing"))
    assert rows[0].status == "warn" and "cannot read" in rows[0].finding
