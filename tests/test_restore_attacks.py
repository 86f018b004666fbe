"""Regression tests for issue 10 (restore under attack) and the release-plane items of issue 11.

Each test names the finding it pins; each failed on the code before the fix (see the commit notes).
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import shutil
import tarfile
import time

import pytest
import zstandard
from bundlekit import (
    QUIET,
    SMALL_SPEC,
    member,
    pax_record,
    raw_bundle,
    raw_member,
    run_cli,
    small_bundle,
    small_sources,
    tar_zst,
    tree_snapshot,
)

from reproduction.errors import (
    InputNotFoundError,
    InvalidInputError,
    PortableError,
    ReadFailedError,
    RelocationError,
    UnsafeArchiveError,
    WriteFailedError,
)
from reproduction.release import restore as restore_mod
from reproduction.release.extract import extract_stream
from reproduction.release.manifest import check_relative_path, load_manifest
from reproduction.release.pack import pack_bundle
from reproduction.release.receipt import receipt_path
from reproduction.release.restore import restore_bundle
from reproduction.release.tarscan import Member
from reproduction.release.verify import verify_bundle

TARGETS = ("source/project", "runtime/rt")


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return small_bundle(tmp_path_factory.mktemp("attacks"))


@pytest.fixture
def bundle(packed, tmp_path):
    out = tmp_path / "case" / "bundle"
    shutil.copytree(packed, out, symlinks=True)
    return out


def _pin(files: list, rel: str, blob: bytes) -> None:
    files.append({"path": rel, "size": len(blob), "sha256": hashlib.sha256(blob).hexdigest()})


# -- critical: one archive under two targets ---------------------------------------------------


def _two_target_attack(root):
    """The issue's escape: archive A at `s` and at the deeper `d/e/f/g`; validated only at the deeper
    one, its symlink a/b/l climbs out of the bundle from the shallow staging folder, and B writes
    a/b/l/pwned through it."""
    bundle = root / "bundle"
    (root / "other").mkdir()  # the sentinel tree beside the bundle
    (root / "other" / "keep.txt").write_text("untouched")
    a = tar_zst(
        [member("a", "dir", mode=0o755), member("a/b", "dir", mode=0o755)]
        + [member("a/b/l", "symlink", linkname="../../../../../../other")]
    )
    b = tar_zst([member("a/b/l/pwned", data=b"outside!")])
    c = tar_zst([member("x", data=b"c")])
    files: list = []
    for rel, blob in (("A.tar.zst", a), ("B.tar.zst", b), ("C.tar.zst", c)):
        (bundle / rel).parent.mkdir(parents=True, exist_ok=True)
        (bundle / rel).write_bytes(blob)
        _pin(files, rel, blob)
    layers = [
        {"archive": "A.tar.zst", "target": "s", "kind": "source", "order": 0},
        {"archive": "A.tar.zst", "target": "d/e/f/g", "kind": "source", "order": 1},
        {"archive": "B.tar.zst", "target": "s", "kind": "source", "order": 2},
        {"archive": "C.tar.zst", "target": "other", "kind": "source", "order": 3},
    ]
    manifest = {"format": "recap-portable-bundle", "format_version": "1.0", "name": "x", "files": files}
    (bundle / "bundle.json").write_text(json.dumps({**manifest, "layers": layers}))
    return bundle


def test_an_archive_listed_under_two_targets_is_refused_and_nothing_lands_outside(tmp_path):
    bundle = _two_target_attack(tmp_path)
    done = run_cli("restore", bundle)
    assert done.returncode == 4, done.stderr
    assert "'A.tar.zst' is listed in more than one layer" in done.stderr
    assert sorted(os.listdir(tmp_path / "other")) == ["keep.txt"]
    assert not any((bundle / t).exists() for t in ("s", "d", "other"))


def test_the_writer_never_follows_a_symlink_even_when_validation_missed_it(tmp_path):
    """Second line of defence: members are written through folder fds opened with O_NOFOLLOW."""
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "staging"
    (dest / "a").mkdir(parents=True)
    os.symlink(outside, dest / "a" / "l")  # planted (as an earlier layer would)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("a/l/pwned")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"bad"))
    expected = [Member(name="a/l/pwned", raw_name="a/l/pwned", kind="file", mode=0o644, size=3, mtime=0)]
    with pytest.raises(UnsafeArchiveError, match="symlink or a file, not a folder"):
        extract_stream(io.BytesIO(raw.getvalue()), expected, dest, archive="x.tar.zst")
    assert os.listdir(outside) == []


# -- high: parser loops make progress ----------------------------------------------------------


PAX_CASES = {
    "zero-length record": (b"0 path=x\n", "bad length 0"),
    "negative size": (pax_record("size", "-5"), "not a non-negative integer"),
    "mtime inf": (pax_record("mtime", "inf"), "out of range"),
    "mtime nan": (pax_record("mtime", "nan"), "out of range"),
    "mtime huge": (pax_record("mtime", "1e300"), "out of range"),
    "no length": (b"path=x\n", "has no length"),
    "length past the end": (b"99 path=x\n", "bad length 99"),
    "no equals sign": (b"8 pathx\n", "not key=value"),
}


@pytest.mark.parametrize("with_index", [False, True], ids=["no index", "member index"])
@pytest.mark.parametrize("case", sorted(PAX_CASES))
def test_hostile_pax_headers_are_corrupt_archives_exit_6(tmp_path, case, with_index):
    record, why = PAX_CASES[case]
    index = [["f", "file", 0o644, 3, ""]] if with_index else None
    bundle = raw_bundle(tmp_path / "bundle", raw_member("f", b"abc", pax=record), index=index)
    started = time.monotonic()
    done = run_cli("restore", bundle, timeout=60)
    assert time.monotonic() - started < 30
    assert done.returncode == 6, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 2 and "corrupt tar header" in lines[0] and why in lines[0], done.stderr
    assert not (bundle / "source" / "app").exists()


def test_negative_base256_size_is_corrupt(tmp_path):
    head = bytearray(raw_member("f", b"abc"))
    head[124:136] = b"\xff" + b"\xff" * 11  # GNU base-256, negative
    head[148:156] = b"        "
    head[148:156] = b"%06o\0 " % sum(head[:512])
    bundle = raw_bundle(tmp_path / "bundle", bytes(head))
    done = run_cli("restore", bundle, timeout=60)
    assert done.returncode == 6 and "is negative" in done.stderr, done.stderr


def test_a_member_name_longer_than_the_filesystem_allows_is_refused_before_writing(tmp_path):
    long = "d/" + "x" * 300
    bundle = raw_bundle(
        tmp_path / "bundle", raw_member("d", kind=tarfile.DIRTYPE) + raw_member(long, b"a", fmt=tarfile.GNU_FORMAT)
    )
    done = run_cli("restore", bundle)
    assert done.returncode == 6, done.stderr
    assert "longer than filesystems allow" in done.stderr
    assert not (bundle / "source" / "app").exists()


# -- medium/low: hostile bundle.json values are exit 4 one-liners ------------------------------


def _edit(bundle, fn):
    data = json.loads((bundle / "bundle.json").read_text())
    fn(data)
    (bundle / "bundle.json").write_text(json.dumps(data))


def _deep(bundle):
    _edit(bundle, lambda d: d.update(metadata="@@"))
    text = (bundle / "bundle.json").read_text()
    (bundle / "bundle.json").write_text(text.replace('"@@"', "[" * 200000 + "]" * 200000))


MANIFEST_CASES = {
    "integer of 5000 digits": lambda b: (b / "bundle.json").write_text(
        (b / "bundle.json").read_text().replace('"size": ', '"size": ' + "1" * 5000, 1)
    ),
    "nesting 200k deep": _deep,
    "metadata a string": lambda b: _edit(b, lambda d: d.update(metadata="oops")),
    "a number in files": lambda b: _edit(b, lambda d: d["files"].append(5)),
    "a string in layers": lambda b: _edit(b, lambda d: d["layers"].append("runtime/rt.tar.zst")),
    "a list as a prefix occurrence": lambda b: _edit(b, lambda d: d["layers"][0].update(prefix_files=[[1]])),
    "target '.'": lambda b: _edit(b, lambda d: d["layers"][1].update(target=".")),
    "a file under .portable/": lambda b: _edit(
        b,
        lambda d: d["files"].append(
            {"path": ".portable/receipt.json", "size": 0, "sha256": hashlib.sha256(b"").hexdigest()}
        ),
    ),
    "entry_config escaping": lambda b: _edit(b, lambda d: d.update(entry_config="../../etc/passwd")),
    "entry_config not a file": lambda b: _edit(b, lambda d: d.update(entry_config="config/nope.json")),
    "a size above 2**63": lambda b: _edit(b, lambda d: d["files"][0].update(size=2**64)),
    "a NUL in a path": lambda b: _edit(b, lambda d: d["layers"][0].update(target="source/a\0b")),
}


@pytest.mark.parametrize("case", sorted(MANIFEST_CASES))
def test_hostile_manifest_values_are_invalid_input_exit_4(bundle, case):
    MANIFEST_CASES[case](bundle)
    with pytest.raises(InvalidInputError) as info:
        restore_bundle(bundle, ui=QUIET)
    assert info.value.exit_code == 4 and "\n" not in info.value.message and info.value.hint
    assert not any((bundle / t).exists() for t in TARGETS)


def test_hostile_manifest_through_the_cli_is_one_line(bundle):
    MANIFEST_CASES["nesting 200k deep"](bundle)
    for command in ("restore", "verify"):
        done = run_cli(command, bundle)
        assert "maximum recursion depth" in done.stderr
        assert done.returncode == 4 and "Traceback" not in done.stderr, done.stderr
        assert [line.split(":")[0] for line in done.stderr.splitlines()] == ["error", "hint"]


def test_a_member_index_with_a_non_normalised_name_is_refused(tmp_path):
    bundle = raw_bundle(tmp_path / "bundle", raw_member("f", b"abc"), index=[["./f", "file", 0o644, 3, ""]])
    with pytest.raises(InvalidInputError, match="not normalised"):
        restore_bundle(bundle, ui=QUIET)


LONE = {
    "files[].path": lambda d: d["files"].append({"path": "data/x\ud800", "size": 1, "sha256": "0" * 64}),
    "layers[].target": lambda d: d["layers"][0].update(target="source/p\ud800"),
}


@pytest.mark.parametrize("case", sorted(LONE))
def test_a_lone_surrogate_in_a_manifest_path_is_exit_4_naming_the_field(bundle, case):
    """audit45 F5: verify and restore ended in `internal error: UnicodeEncodeError` (exit 1), or verify passed."""
    _edit(bundle, LONE[case])
    for command in ("verify", "restore"):
        done = run_cli(command, bundle)
        assert done.returncode == 4, done.stderr
        assert [line.split(":")[0] for line in done.stderr.splitlines()] == ["error", "hint"], done.stderr
        assert "lone surrogate" in done.stderr and case.split("[")[0] in done.stderr, done.stderr
    assert not any((bundle / t).exists() for t in TARGETS)


@pytest.mark.parametrize(
    "row, tar",
    [
        (["a\ud800", "file", 0o644, 0, ""], raw_member("a\udcff")),
        (["l", "symlink", 0o777, 0, "x\ud800"], raw_member("l", kind=tarfile.SYMTYPE)),
    ],
    ids=["name", "link"],
)
def test_a_lone_surrogate_in_a_member_index_row_is_exit_4(tmp_path, row, tar):
    """audit45 F5: restore ended in `internal error: UnicodeEncodeError` (exit 1)."""
    bundle = raw_bundle(tmp_path / "bundle", tar, index=[row])
    done = run_cli("restore", bundle)
    assert done.returncode == 4, done.stderr
    assert [line.split(":")[0] for line in done.stderr.splitlines()] == ["error", "hint"], done.stderr
    assert "source/app.members.json" in done.stderr and "lone surrogate" in done.stderr, done.stderr
    assert not (bundle / "source/app").exists()


def test_a_name_of_undecodable_bytes_is_still_a_name(tmp_path):
    """\\udc80-\\udcff stand for bytes that are not UTF-8 (surrogateescape): real file names, still restored."""
    assert check_relative_path("data/x\udcff", where="files[0].path") == "data/x\udcff"
    bundle = raw_bundle(tmp_path / "bundle", raw_member("a\udcff", b"hi"), index=[["a\udcff", "file", 0o644, 2, ""]])
    restore_bundle(bundle, ui=QUIET)
    assert (bundle / "source/app").joinpath("a\udcff").read_bytes() == b"hi"


# -- bundle given as a file -----------------------------------------------------------------------


@pytest.mark.parametrize("command", ["verify", "restore"])
def test_a_plain_file_given_as_the_bundle_is_a_one_line_not_found(tmp_path, command):
    path = tmp_path / "bundle.tar"
    path.write_bytes(b"not a folder")
    done = run_cli(command, path)
    assert done.returncode == InputNotFoundError.exit_code == 3, done.stderr
    assert done.stderr.splitlines()[0] == f"error: {path} is a file, not a bundle folder"
    assert len(done.stderr.splitlines()) == 2


# -- swap, relocation and receipt failures keep the previous state ------------------------------


def _restored_then_damaged(bundle):
    restore_bundle(bundle, ui=QUIET)
    (bundle / "runtime" / "rt" / "share" / "data.txt").unlink()  # forces re-extraction of the runtime
    (bundle / "source" / "project" / "README.md").write_text("edited")  # refresh_source re-extracts it
    return {t: tree_snapshot(bundle / t) for t in TARGETS}, receipt_path(bundle).read_bytes()


def _assert_previous_state(bundle, before):
    trees, receipt = before
    assert {t: tree_snapshot(bundle / t) for t in TARGETS} == trees
    assert receipt_path(bundle).read_bytes() == receipt
    assert sorted(os.listdir(bundle / ".portable")) == ["lock", "receipt.json"]


def test_read_only_target_parent_fails_before_any_swap(bundle, monkeypatch):
    before = _restored_then_damaged(bundle)
    real = os.access
    monkeypatch.setattr(restore_mod.os, "access", lambda p, m: False if str(p).endswith("runtime") else real(p, m))
    with pytest.raises(WriteFailedError, match="permission denied") as info:
        restore_bundle(bundle, ui=QUIET, refresh_source=True)
    assert info.value.exit_code == 8 and "nothing was changed" in info.value.hint
    _assert_previous_state(bundle, before)


@pytest.mark.parametrize("err", [errno.EXDEV, errno.EACCES])
def test_a_swap_failing_half_way_swaps_back_and_keeps_the_receipt(bundle, monkeypatch, err):
    before = _restored_then_damaged(bundle)
    real, calls = restore_mod.swap_into_place, []

    def swap(staging, final, trash, **kwargs):
        calls.append(final)
        if len(calls) == 2:
            raise OSError(err, os.strerror(err), str(final))
        real(staging, final, trash, **kwargs)

    monkeypatch.setattr(restore_mod, "swap_into_place", swap)
    with pytest.raises(WriteFailedError) as info:
        restore_bundle(bundle, ui=QUIET, refresh_source=True)
    assert info.value.exit_code == 8 and len(calls) == 2
    _assert_previous_state(bundle, before)
    report = restore_bundle(bundle, ui=QUIET, refresh_source=True)  # and a rerun finishes the job
    assert report.extracted == list(TARGETS)


def test_relocation_error_after_the_swap_keeps_the_previous_state(bundle, monkeypatch):
    before = _restored_then_damaged(bundle)

    def refuse(*args, **kwargs):
        raise RelocationError("cannot relocate (injected)", hint="h")

    monkeypatch.setattr(restore_mod, "_relocate", refuse)
    with pytest.raises(RelocationError):
        restore_bundle(bundle, ui=QUIET, refresh_source=True)
    _assert_previous_state(bundle, before)


def test_disk_full_at_the_final_receipt_write_keeps_the_previous_state(bundle, monkeypatch):
    before = _restored_then_damaged(bundle)
    real, calls = restore_mod.save_receipt, []

    def save(b, receipt, **kwargs):  # restore passes the state folder's fd (dir_fd=)
        calls.append(1)
        if len(calls) == 2:  # 1: the receipt that stops vouching for the targets; 2: the final one
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(receipt_path(b)))
        real(b, receipt, **kwargs)

    monkeypatch.setattr(restore_mod, "save_receipt", save)
    with pytest.raises(WriteFailedError, match="the disk is full") as info:
        restore_bundle(bundle, ui=QUIET, refresh_source=True)
    assert "previous state is kept" in info.value.hint
    _assert_previous_state(bundle, before)


# -- extra files ----------------------------------------------------------------------------------


def test_extra_files_outside_the_targets_do_not_block_restore(bundle):
    (bundle / "notes.txt").write_text("mine")
    (bundle / "weights" / "stray.bin").write_bytes(b"?")
    done = run_cli("restore", bundle)
    assert done.returncode == 0, done.stderr
    assert "warning: left alone 2 file(s) bundle.json does not list: notes.txt, weights/stray.bin" in done.stderr
    assert (bundle / "notes.txt").read_text() == "mine"
    verify = run_cli("verify", bundle)
    assert verify.returncode == 12
    assert verify.stderr.splitlines()[-1].startswith("hint: remove the files bundle.json does not list")
    assert "fetch the bundle again" not in verify.stderr


def test_runs_folder_is_ignored_by_verify_and_restore(bundle):
    (bundle / "runs" / "demo-1").mkdir(parents=True)
    (bundle / "runs" / "demo-1" / "run.json").write_text("{}")
    assert verify_bundle(bundle).ok
    assert restore_bundle(bundle, ui=QUIET).extras == []


def test_an_extra_file_where_a_target_goes_still_blocks(bundle):
    (bundle / "runtime" / "rt").write_text("in the way")
    done = run_cli("restore", bundle)
    assert done.returncode == 5, done.stderr
    assert "extra    runtime/rt" in done.stderr


# -- pack: one OSError mapping, deterministic bundle.json ----------------------------------------


def test_pack_twice_gives_byte_identical_bundles(tmp_path):
    small_sources(tmp_path)
    (tmp_path / "small.toml").write_text(SMALL_SPEC, encoding="utf-8")
    pack_bundle(tmp_path / "small.toml", tmp_path / "one", ui=QUIET)
    time.sleep(1.1)  # the wall clock moves on; bundle.json must not
    pack_bundle(tmp_path / "small.toml", tmp_path / "two", ui=QUIET)
    assert (tmp_path / "one" / "bundle.json").read_bytes() == (tmp_path / "two" / "bundle.json").read_bytes()
    assert tree_snapshot(tmp_path / "one") == tree_snapshot(tmp_path / "two")


def test_pack_created_follows_source_date_epoch(tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    bundle = small_bundle(tmp_path)
    assert load_manifest(bundle).created == "2023-11-14T22:13:20Z"


def test_pack_names_an_unreadable_source_file_as_a_read_error(tmp_path, monkeypatch):
    small_sources(tmp_path)
    (tmp_path / "small.toml").write_text(SMALL_SPEC, encoding="utf-8")
    real = shutil.copyfile

    def copyfile(src, dst, **kw):
        if str(src).endswith("tokenizer.json"):
            raise PermissionError(errno.EACCES, "Permission denied", str(src))
        return real(src, dst, **kw)

    monkeypatch.setattr(shutil, "copyfile", copyfile)
    with pytest.raises(ReadFailedError) as info:
        pack_bundle(tmp_path / "small.toml", tmp_path / "out", ui=QUIET)
    assert info.value.exit_code == 3
    assert info.value.message.startswith("cannot read a source file the spec names: Permission denied (")
    assert "tokenizer.json" in info.value.message and "cannot write" not in info.value.message
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


def test_every_os_error_goes_through_one_mapping():
    from reproduction.errors import os_error

    full = os_error(OSError(errno.ENOSPC, "No space left on device", "/b/x"), "the bundle")
    assert isinstance(full, WriteFailedError) and full.message.startswith(
        "cannot write the bundle: the disk is full at /b/x ("
    )
    assert full.message.endswith(" were free)") and full.exit_code == 8  # where, and how much room there was
    exdev = os_error(OSError(errno.EXDEV, "Invalid cross-device link", "/b/t"), "the target")
    assert "another filesystem" in exdev.message and exdev.exit_code == 8
    gone = os_error(FileNotFoundError(errno.ENOENT, "No such file", "/s/a"), "a source", op="read")
    assert isinstance(gone, InputNotFoundError) and gone.exit_code == 3
    already = WriteFailedError("x")
    assert os_error(already, "y") is already
    assert all(isinstance(e, PortableError) for e in (full, exdev, gone))


def test_pax_record_helper_is_well_formed():
    assert pax_record("path", "x") == b"9 path=x\n" and pax_record("k", "v" * 6) == b"12 k=vvvvvv\n"
    assert zstandard  # the forged archives need it


def test_many_folders_extract_with_a_bounded_number_of_open_folder_fds(tmp_path):
    names = [f"d{i % 7}/e{i}/f.txt" for i in range(300)]
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in names:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = 2, 1577836800
            tar.addfile(info, io.BytesIO(b"ok"))
    expected = [Member(name=n, raw_name=n, kind="file", mode=0o644, size=2, mtime=0) for n in names]
    open_before = len(os.listdir("/proc/self/fd"))
    written = extract_stream(io.BytesIO(raw.getvalue()), expected, tmp_path / "out", archive="many.tar.zst")
    assert len(os.listdir("/proc/self/fd")) == open_before  # every folder fd closed again
    assert sorted(written.files) == sorted(names)
    assert all((tmp_path / "out" / n).read_bytes() == b"ok" for n in names)
