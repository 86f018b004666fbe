"""Restore refuses a GNU sparse member (audit63 A M3). GNU tar's pax sparse formats carry `GNU.sparse.*` records
and a sparse map in the data; format 1.0 stores the member as `GNUSparseFile.<pid>/<name>`. tarscan dropped the keys,
so restore wrote the placeholder file holding the map, exit 0. Now each is exit 6 naming the member, as the old GNU
sparse type 'S' is, and nothing is extracted. Hand-made tars (and GNU tar's own, where tar is installed), restored
in-process through `portable.main`."""

from __future__ import annotations

import shutil
import subprocess
import tarfile

import pytest
from bundlekit import pax_record, raw_bundle, raw_member

from reproduction.portable import main

SPARSE_MAP = b"1\n0\n4\n"
"""A 1.0 sparse map (one chunk: offset 0, 4 bytes), as GNU tar writes it before the data."""

CASES = {
    "pax 1.0": (
        pax_record("GNU.sparse.major", "1")
        + pax_record("GNU.sparse.minor", "0")
        + pax_record("GNU.sparse.name", "sp.bin")
        + pax_record("GNU.sparse.realsize", "1048580"),
        "GNUSparseFile.17/sp.bin",
        "sp.bin",
    ),
    "pax 0.1": (
        pax_record("GNU.sparse.size", "1048580")
        + pax_record("GNU.sparse.numblocks", "1")
        + pax_record("GNU.sparse.map", "0,4"),
        "sp.bin",
        "sp.bin",
    ),
}


def _restore(bundle, capsys) -> tuple[int, list[str]]:
    code = main(["restore", str(bundle), "-q"])
    return code, capsys.readouterr().err.strip().splitlines()


def _refused(bundle, capsys, name: str) -> None:
    code, err = _restore(bundle, capsys)
    assert code == 6, err
    assert err == [
        f"error: source/app.tar.zst: member {name!r} is a sparse file (GNU tar --sparse), an unsupported tar type",
        "hint: layers may hold only files, folders and symlinks",
    ]
    assert not (bundle / "source" / "app").exists()


@pytest.mark.parametrize("with_index", [False, True], ids=["no index", "member index"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_pax_sparse_member_is_refused_naming_it(tmp_path, capsys, case, with_index):
    record, stored, name = CASES[case]
    data = SPARSE_MAP.ljust(512, b"\0") + b"head"
    tar = raw_member("plain.txt", b"plain\n") + raw_member(stored, data, pax=record)
    index = [["plain.txt", "file", 0o644, 6, ""], [stored, "file", 0o644, len(data), ""]] if with_index else None
    _refused(raw_bundle(tmp_path / "bundle", tar, index=index), capsys, name)


def test_an_old_gnu_sparse_member_is_refused_the_same_way(tmp_path, capsys):
    tar = raw_member("sp.bin", b"head", kind=tarfile.GNUTYPE_SPARSE, fmt=tarfile.GNU_FORMAT)
    _refused(raw_bundle(tmp_path / "bundle", tar), capsys, "sp.bin")


@pytest.mark.skipif(shutil.which("tar") is None, reason="needs GNU tar")
def test_gnu_tars_own_sparse_archive_is_refused(tmp_path, capsys):
    src = tmp_path / "t"
    src.mkdir()
    with open(src / "sp.bin", "wb") as fh:
        fh.write(b"head")
        fh.truncate(1 << 20)
        fh.seek(0, 2)
        fh.write(b"tail")
    done = subprocess.run(
        ["tar", "--sparse", "--format=pax", "-cf", "-", "sp.bin"], cwd=src, capture_output=True, timeout=60
    )
    if done.returncode != 0 or b"GNU.sparse" not in done.stdout:
        pytest.skip(f"this tar writes no pax sparse members: {done.stderr[-200:]!r}")
    _refused(raw_bundle(tmp_path / "bundle", done.stdout), capsys, "sp.bin")
