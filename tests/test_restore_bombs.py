"""Decompression bombs are refused while streaming, never after decompressing them whole.

A layer's archive is pinned by its sha256, so its bytes are the publisher's; what bounds the work
restore does on them is what bundle.json declares: `unpacked_size` (the files), `tar_size` (the
decompressed stream) and, always, tarscan.MAX_TRAILER after the end-of-archive block. Each bomb here
is small (a few MiB, or a header that only declares a huge size), and each test failed before its fix.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import tarfile
import time
from pathlib import Path

import pytest
import zstandard
from bundlekit import QUIET, pax_record, raw_bundle, raw_member, run_cli, small_bundle

from reproduction.errors import UnsafeArchiveError, WriteFailedError
from reproduction.release import layers as layer_io
from reproduction.release import zstdio
from reproduction.release.manifest import load_manifest
from reproduction.release.restore import restore_bundle
from reproduction.release.tarscan import MAX_TRAILER, StreamSource, _parse_pax, iter_members

MiB = 1 << 20


def _one_error(done, code: int, needle: str) -> None:
    lines = done.stderr.splitlines()
    assert done.returncode == code, done.stderr
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("hint: "), done.stderr
    assert needle in lines[0], done.stderr


def _set_layer(bundle: Path, **fields) -> None:
    """Edit the layer's declared sizes in bundle.json (it pins the archive, not itself)."""
    data = json.loads((bundle / "bundle.json").read_text())
    data["layers"][0].update(fields)
    (bundle / "bundle.json").write_text(json.dumps(data))


def _tar(*members: bytes) -> bytes:
    """A complete tar: the members, the end-of-archive block pair, padded to a 10240-byte record."""
    body = b"".join(members) + bytes(1024)
    return body + bytes(-len(body) % tarfile.RECORDSIZE)


def _bundle(tmp_path: Path, tar: bytes, *, index: bool, name: str = "b", rows: list | None = None) -> Path:
    """A one-layer source bundle whose archive decompresses to exactly `tar` (with a member index or not).

    The index rows are tarfile's reading of `tar` unless given."""
    root = raw_bundle(tmp_path / name, b"", index=[] if index else None)
    blob = zstandard.ZstdCompressor(level=3).compress(tar)
    (root / "source/app.tar.zst").write_bytes(blob)
    if index:
        if rows is None:
            with tarfile.open(fileobj=io.BytesIO(tar)) as t:
                rows = [[i.name, "file", i.mode, i.size, ""] for i in t.getmembers()]
        text = json.dumps({"format": "recap-portable-members", "format_version": "1.0", "members": rows}).encode()
        (root / "source/app.members.json").write_bytes(text)
    data = json.loads((root / "bundle.json").read_text())
    for entry in data["files"]:
        rel = entry["path"]
        got = (root / rel).read_bytes()
        entry["size"], entry["sha256"] = len(got), hashlib.sha256(got).hexdigest()
    data["layers"][0]["members"] = len(rows or []) if index else 1
    data["layers"][0]["tar_size"] = 0  # undeclared: these tests bound the stream by other means
    (root / "bundle.json").write_text(json.dumps(data))
    return root


@pytest.fixture
def counted(monkeypatch):
    """Count the decompressed bytes layers.py reads (the work a bomb costs)."""
    seen = [0]
    real = layer_io.open_decompressed

    class Counting:
        def __init__(self, stream):
            self.stream = stream

        def readinto(self, buf):
            n = self.stream.readinto(buf)
            seen[0] += n or 0
            return n

    @contextlib.contextmanager
    def counting(path, *, hasher=None):
        with real(path, hasher=hasher) as stream:
            yield Counting(stream)

    monkeypatch.setattr(layer_io, "open_decompressed", counting)
    return seen


# -- (a) unpacked_size: refused while listing, before the member's data is decompressed ---------------


def _huge_member(size: int) -> bytes:
    """A member whose header declares `size` bytes (a pax size record), followed by 1 MiB of its zeros only."""
    info = tarfile.TarInfo("bomb.bin")
    info.size, info.mode, info.mtime = size, 0o644, 1577836800
    return info.tobuf(tarfile.PAX_FORMAT) + bytes(MiB)


def test_a_member_declaring_64_gib_is_refused_by_its_header_alone(tmp_path):
    """Before the fix the listing read on into the member's data (here the stream ends: 'truncated')."""
    bundle = _bundle(tmp_path, _huge_member(64 << 30), index=False)
    _set_layer(bundle, unpacked_size=4096)
    done = run_cli("restore", bundle)
    _one_error(
        done,
        6,
        "source/app.tar.zst: its files add up to at least 64.0 GiB (68719476736 bytes), more than the 4096 bytes "
        "bundle.json declares as its unpacked_size; nothing was extracted",
    )
    assert not (bundle / "source" / "app").exists()
    assert sorted(os.listdir(bundle / ".portable")) == ["lock"]


def test_listing_stops_at_the_header_that_passes_unpacked_size(tmp_path, counted):
    tar = _tar(raw_member("small.txt", b"ok\n"), raw_member("bomb.bin", bytes(32 * MiB)))
    bundle = _bundle(tmp_path, tar, index=False)
    _set_layer(bundle, unpacked_size=4096)
    entry = load_manifest(bundle).layers[0]
    sha = hashlib.sha256((bundle / entry.archive).read_bytes()).hexdigest()
    needle = r"add up to at least 32\.0 MiB \(33554435 bytes\), more than the 4096 bytes"
    with pytest.raises(UnsafeArchiveError, match=needle):
        layer_io.load_layer(bundle, entry, sha)
    assert counted[0] <= 4 * MiB + 4096  # one window, not the 32 MiB before the fix


def test_with_no_unpacked_size_declared_the_free_space_bounds_the_listing(tmp_path, counted, monkeypatch):
    """A bundle.json declaring neither size (0) left the listing unbounded: a 64 TiB header was decompressed until
    the stream ended, then the space check refused it. Now the listing stops at the header that passes the free
    space (exit 8, the space check's message) and reads no further."""
    bundle = _bundle(
        tmp_path, _tar(raw_member("small.txt", b"ok\n"), raw_member("bomb.bin", bytes(32 * MiB))), index=False
    )
    _set_layer(bundle, unpacked_size=0, tar_size=0)
    entry = load_manifest(bundle).layers[0]
    sha = hashlib.sha256((bundle / entry.archive).read_bytes()).hexdigest()
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=MiB))
    with pytest.raises(WriteFailedError, match=r"the layers need 32\.0 MiB, 1\.0 MiB is free"):
        layer_io.load_layer(bundle, entry, sha)
    assert counted[0] <= 4 * MiB + 4096  # one window, not the 32 MiB of the member
    monkeypatch.undo()
    bundle = _bundle(tmp_path, _huge_member(64 << 40), index=False, name="c")  # more than any disk here
    _set_layer(bundle, unpacked_size=0, tar_size=0)
    done = run_cli("restore", bundle)
    _one_error(done, 8, "the layers need 64.0 TiB")
    assert not (bundle / "source" / "app").exists()


# -- (b) what follows the end-of-archive block --------------------------------------------------------


@pytest.mark.parametrize("index", [False, True], ids=["listed", "indexed"])
def test_data_after_the_end_of_archive_is_bounded(tmp_path, index):
    """Listed: load_layer's drain; indexed: extract_stream's drain (one pass). Both read it all before."""
    tar = _tar(raw_member("a.txt", b"hello\n")) + bytes(4 * MiB)
    bundle = _bundle(tmp_path, tar, index=index)
    done = run_cli("restore", bundle)
    _one_error(
        done,
        6,
        f"source/app.tar.zst: more than {MAX_TRAILER} bytes follow the tar's end-of-archive block (tar pads to "
        "10240 bytes); nothing was changed",
    )
    assert not (bundle / "source" / "app").exists()
    assert sorted(os.listdir(bundle / ".portable")) == ["lock"]


@pytest.mark.parametrize("backend", ["module", "cli"])
def test_the_trailer_bound_stops_decompressing_and_a_damaged_bomb_is_still_a_digest_problem(
    tmp_path, counted, monkeypatch, backend
):
    if backend == "cli":
        monkeypatch.setattr(zstdio, "_module", lambda: None)
        if zstdio.backend() != "cli":
            pytest.skip("no zstd command")
    tar = _tar(raw_member("a.txt", b"hello\n")) + bytes(32 * MiB)
    bundle = _bundle(tmp_path, tar, index=False)
    entry = load_manifest(bundle).layers[0]
    sha = hashlib.sha256((bundle / entry.archive).read_bytes()).hexdigest()
    with pytest.raises(UnsafeArchiveError, match="follow the tar's end-of-archive block"):
        layer_io.load_layer(bundle, entry, sha)
    assert counted[0] <= 4 * MiB + MAX_TRAILER + 1  # the 4 MiB window's first fill, then MAX_TRAILER + 1; not 32 MiB
    wrong = layer_io.load_layer(bundle, entry, "0" * 64)  # the whole file hashed (sha256_file), not decompressed
    assert (wrong.ok, wrong.digest, wrong.members) == (False, sha, [])


def test_tar_padding_and_a_little_more_after_the_end_is_accepted(tmp_path):
    tar = _tar(raw_member("a.txt", b"hello\n")) + bytes(MAX_TRAILER - 2 * tarfile.RECORDSIZE)
    bundle = _bundle(tmp_path, tar, index=False)
    report = restore_bundle(bundle, ui=QUIET)
    assert report.extracted == ["source/app"]
    assert (bundle / "source/app/a.txt").read_bytes() == b"hello\n"


@pytest.mark.parametrize("index", [False, True], ids=["listed", "indexed"])
@pytest.mark.parametrize("extra", [1, MiB, 2 * MiB + MiB // 2])  # trailers of 1 MiB + 1 byte, 2 and 3.5 MiB
def test_the_trailer_bound_counts_what_the_window_already_holds(tmp_path, index, extra):
    """audit45 F6: a trailer that fit in the 4 MiB window when the end-of-archive block was met was never counted
    (2 and 3.5 MiB were accepted, only 6 MiB refused). Exactly MAX_TRAILER after the end block is still accepted."""
    body = raw_member("a.txt", b"hello\n") + bytes(tarfile.BLOCKSIZE)  # the end-of-archive block the parser stops at
    ok = _bundle(tmp_path, body + bytes(MAX_TRAILER), index=index, name="ok")
    assert restore_bundle(ok, ui=QUIET).extracted == ["source/app"]
    bundle = _bundle(tmp_path, body + bytes(MAX_TRAILER + extra), index=index)
    done = run_cli("restore", bundle)
    _one_error(done, 6, f"more than {MAX_TRAILER} bytes follow the tar's end-of-archive block")
    assert not (bundle / "source" / "app").exists()


# -- (d) pax headers: what they cost is bounded by the keys the parser reads --------------------------


def _pax_header(kind: bytes, payload: bytes) -> bytes:
    info = tarfile.TarInfo("././@PaxHeader")
    info.type, info.size = kind, len(payload)
    return info.tobuf(tarfile.USTAR_FORMAT) + payload + bytes(-len(payload) % tarfile.BLOCKSIZE)


def _distinct_keys(size: int) -> bytes:
    """Pax records of distinct unknown keys, about `size` bytes of them (one ~1 MiB header holds ~100k)."""
    out, n = [], 0
    while n < size:
        out.append(pax_record(f"k{len(out):x}", ""))
        n += len(out[-1])
    return b"".join(out)


def _scan(tar: bytes) -> tuple[int, float]:
    start = time.perf_counter()
    n = sum(1 for _ in iter_members(StreamSource(io.BytesIO(tar))))
    return n, time.perf_counter() - start


def test_pax_headers_keep_only_the_keys_the_parser_reads():
    """audit45 F2: every distinct key of every 'g' header was kept (a 972 KB .zst took 501 MB)."""
    payload = _distinct_keys(64 << 10) + pax_record("path", "a.txt") + pax_record("SCHILY.xattr.user.x", "y")
    payload += (
        pax_record("mtime", "1.5") + pax_record("size", "3") + pax_record("linkpath", "b") + pax_record("uid", "0")
    )
    assert _parse_pax(payload) == {"path": "a.txt", "mtime": "1.5", "size": "3", "linkpath": "b"}
    with pytest.raises(UnsafeArchiveError, match="not key=value"):  # dropped keys are still checked for form
        _parse_pax(_distinct_keys(1024) + b"11 novalue\n")


def test_a_global_pax_header_costs_each_member_nothing(tmp_path):
    """audit45 F2: each member copied the whole pax_global dict ({**pax_global, **pending}), so one 1 MiB 'g'
    header of ~100k keys and 10,000 empty members took 22.6 s (keys x members). Timed against the same members
    without it, in this test, so the machine's load cancels out."""
    members = b"".join(raw_member(f"f{i}") for i in range(2000)) + bytes(1024)
    glob = _pax_header(tarfile.XGLTYPE, _distinct_keys(MiB - 4096))
    _scan(members)  # warm up
    n, plain = _scan(members)
    m, with_global = _scan(glob + members)
    parse_only = _scan(glob + bytes(1024))[1]
    assert n == m == 2000
    assert with_global < 3 * (plain + parse_only) + 0.2, (plain, parse_only, with_global)


# -- (c) tar_size: the decompressed stream is no longer than declared ---------------------------------


@pytest.mark.parametrize("index", [False, True], ids=["listed", "indexed"])
def test_a_stream_longer_than_its_tar_size_is_refused(tmp_path, index):
    tar = _tar(raw_member("a.txt", b"hello\n"), raw_member("big.bin", bytes(2 * MiB)))
    bundle = _bundle(tmp_path, tar, index=index)
    _set_layer(bundle, tar_size=10240)
    done = run_cli("restore", bundle)
    if index:  # the index's sizes already say the files cannot fit in tar_size (audit60 A2): refused before reading
        needle = "member 'big.bin' declares a size of 2097152 bytes, so its files add up to at least 2097158 bytes, "
        needle += "more than the 10240-byte tar stream bundle.json declares (tar_size) can hold; nothing was extracted"
    else:
        needle = "decompresses to more than the 10240 bytes bundle.json declares as its tar_size; nothing was changed"
    _one_error(done, 6, f"source/app.tar.zst: {needle}")
    assert not (bundle / "source" / "app").exists()


def test_tar_size_is_enforced_while_streaming(tmp_path, counted):
    tar = _tar(raw_member("big.bin", bytes(32 * MiB)))
    bundle = _bundle(tmp_path, tar, index=False)
    _set_layer(bundle, tar_size=MiB)
    entry = load_manifest(bundle).layers[0]
    sha = hashlib.sha256((bundle / entry.archive).read_bytes()).hexdigest()
    with pytest.raises(UnsafeArchiveError, match=f"more than the {MiB} bytes bundle.json declares as its tar_size"):
        layer_io.load_layer(bundle, entry, sha)
    assert counted[0] <= 4 * MiB + 4096


@pytest.mark.parametrize("declared", ["exact", "larger"])
def test_a_stream_at_or_under_its_tar_size_restores(tmp_path, declared):
    """Exact is what `portable pack` records; shorter than declared is accepted (an upper bound on work)."""
    tar = _tar(raw_member("a.txt", b"hello\n"))
    bundle = _bundle(tmp_path, tar, index=True)
    _set_layer(bundle, tar_size=len(tar) if declared == "exact" else len(tar) + MiB)
    assert restore_bundle(bundle, ui=QUIET).extracted == ["source/app"]


def test_packed_bundles_record_their_exact_tar_size_and_restore(tmp_path):
    bundle = small_bundle(tmp_path)
    manifest = load_manifest(bundle)
    for layer in manifest.layers:
        with zstdio.open_decompressed(bundle / layer.archive) as stream:
            assert layer.tar_size == len(stream.read()) > 0, layer.archive
    report = restore_bundle(bundle, ui=QUIET)
    assert sorted(report.extracted) == sorted(x.target for x in manifest.layers)


# -- (e) headers only: the member count, and a stream bound when no tar_size is declared (audit45 F3) ---


def test_a_listed_layer_declaring_neither_tar_size_nor_members_is_refused(tmp_path):
    """Nothing bounded an archive of headers only: 999k empty members (a 43 KB .zst, 488 MiB of tar) listed for 18 s."""
    bundle = raw_bundle(tmp_path / "b", raw_member("a.txt", b"hello\n"))
    _set_layer(bundle, tar_size=0, members=0)
    done = run_cli("restore", bundle)
    _one_error(done, 4, "layer source/app.tar.zst has no member index and declares neither tar_size nor members")
    assert not (bundle / "source" / "app").exists()
    _set_layer(bundle, members=1)  # either one bounds it
    assert restore_bundle(bundle, ui=QUIET).extracted == ["source/app"]


@pytest.mark.parametrize("index", [False, True], ids=["listed", "indexed"])
def test_more_members_than_declared_are_refused_at_the_header_that_passes_them(tmp_path, index, counted):
    tar = _tar(*(raw_member(f"f{i}") for i in range(3000)))  # 1.5 MiB of empty members
    bundle = _bundle(tmp_path, tar, index=index)
    _set_layer(bundle, members=10)
    with pytest.raises(
        UnsafeArchiveError, match=r"holds more than the 10 members bundle.json declares \(member 11: 'f10'\)"
    ):
        restore_bundle(bundle, ui=QUIET)
    assert not (bundle / "source" / "app").exists()
    _set_layer(bundle, members=3000)
    assert restore_bundle(bundle, ui=QUIET).extracted == ["source/app"]


@pytest.mark.parametrize("index", [False, True], ids=["listed", "indexed"])
def test_with_no_tar_size_the_stream_is_bounded_by_what_is_declared(tmp_path, index, counted):
    """Extended headers are no members: 24 'x' headers of 1 MiB before one 6-byte file were read whole."""
    one = _pax_header(tarfile.XHDTYPE, pax_record("comment", "x" * (MiB - 64)))
    rows = [["a.txt", "file", 0o644, 6, ""]] if index else None
    bundle = _bundle(tmp_path, _tar(one * 24 + raw_member("a.txt", b"hello\n")), index=index, rows=rows)
    _set_layer(bundle, unpacked_size=6)
    needle = (
        "decompresses to more than the [0-9]+ bytes that its (1 members and its unpacked_size|listed members) allow"
    )
    with pytest.raises(UnsafeArchiveError, match=needle):
        restore_bundle(bundle, ui=QUIET)
    assert counted[0] <= 10 * MiB  # tarscan.stream_bound(6, 1) (5 MiB) and a window; not the 24 MiB
    assert not (bundle / "source" / "app").exists()
    fine = _bundle(tmp_path, _tar(one * 2 + raw_member("a.txt", b"hello\n")), index=index, rows=rows, name="c")
    _set_layer(fine, unpacked_size=6)
    assert restore_bundle(fine, ui=QUIET).extracted == ["source/app"]


def test_verify_does_not_decompress_so_a_pinned_bomb_passes_it(tmp_path):
    """`portable verify` hashes files only (exit 0 here); restore is what refuses the bomb (exit 6)."""
    bundle = _bundle(tmp_path, _tar(raw_member("a.txt", b"hello\n")) + bytes(4 * MiB), index=False)
    assert run_cli("verify", bundle).returncode == 0
    assert run_cli("restore", bundle).returncode == 6


# -- (f) short: a layer without a member index that ends before what it declares (audit48 F6) -------------


@pytest.mark.parametrize(
    "case, tar, fields, needle",
    [
        ("empty stream", b"", {"members": 1}, "holds 0 members, fewer than the 1 members"),
        ("end-of-archive only", _tar(), {"members": 5}, "holds 0 members, fewer than the 5 members"),
        ("fewer members", _tar(raw_member("a.txt", b"hi\n")), {"members": 3}, "holds 1 members, fewer than the 3"),
        (
            "short stream",
            _tar(raw_member("a.txt", b"hi\n")),
            {"tar_size": MiB},
            f"decompresses to 10240 bytes, fewer than the tar_size of {MiB}",
        ),
    ],
    ids=["empty stream", "end-of-archive only", "fewer members", "short stream"],
)
def test_a_layer_shorter_than_declared_is_refused_not_restored_empty(tmp_path, case, tar, fields, needle):
    """It restored as an empty (or partial) target with exit 0; now exit 6 naming the layer and both numbers."""
    bundle = _bundle(tmp_path, tar, index=False)
    _set_layer(bundle, **fields)
    done = run_cli("restore", bundle)
    _one_error(done, 6, f"error: source/app.tar.zst: {needle}")
    assert not (bundle / "source" / "app").exists()
    assert not (bundle / ".portable" / "staging").exists() or not os.listdir(bundle / ".portable" / "staging")


def test_a_zero_byte_layer_archive_declaring_a_member_is_refused(tmp_path):
    bundle = _bundle(tmp_path, _tar(raw_member("a.txt", b"hi\n")), index=False)
    (bundle / "source/app.tar.zst").write_bytes(b"")
    data = json.loads((bundle / "bundle.json").read_text())
    for entry in data["files"]:
        if entry["path"] == "source/app.tar.zst":
            entry["size"], entry["sha256"] = 0, hashlib.sha256(b"").hexdigest()
    (bundle / "bundle.json").write_text(json.dumps(data))
    done = run_cli("restore", bundle)
    _one_error(done, 6, "error: source/app.tar.zst: holds 0 members, fewer than the 1 members bundle.json declares")
    assert not (bundle / "source" / "app").exists()
