"""Layers extracted in child processes (several large layers at once): the same trees, receipts and
errors as in-thread extraction, progress relayed, and no writer left behind when restore is killed.

`extract_child.MIN_MEMBERS` is set to 0 so the small test bundles take the child path."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from bundlekit import QUIET, REPO, flip_bit, member, repin, small_bundle, tar_zst, tree_snapshot
from interpreters import find_python, missing_reason

from reproduction.errors import IntegrityError, UnsafeArchiveError, WriteFailedError
from reproduction.release import extract_child
from reproduction.release import layers as layer_io
from reproduction.release.manifest import load_manifest
from reproduction.release.restore import restore_bundle

TARGETS = ("source/project", "runtime/rt")

DRIVER = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from reproduction.errors import PortableError
from reproduction.release import extract_child
from reproduction.release.restore import restore_bundle
from reproduction.ui import UiOptions
extract_child.MIN_MEMBERS = 0
if len(sys.argv) > 3:
    extract_child._BOOT = sys.argv[3]
started = []
real = extract_child.extract_layer_in_child
extract_child.extract_layer_in_child = lambda *a, **k: (started.append(1), real(*a, **k))[1]
try:
    restore_bundle(Path(sys.argv[2]), ui=UiOptions(quiet=True, progress=False))
except PortableError as exc:
    print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
    sys.exit(exc.exit_code)
finally:
    print(f"children: {len(started)}")
"""
"""Restore a bundle with every layer in a child (argv: repo, bundle[, the child's boot code]); prints
how many children it started."""


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return small_bundle(tmp_path_factory.mktemp("children"))


@pytest.fixture
def bundle(packed, tmp_path):
    out = tmp_path / "b"
    subprocess.run(["cp", "-a", str(packed), str(out)], check=True)
    return out


@pytest.fixture
def children(monkeypatch):
    """Every layer through a child; returns the archives each extracted (counted in the parent)."""
    seen: list[str] = []
    real = extract_child.extract_layer_in_child

    def counted(bundle, layer, dest, **kwargs):
        seen.append(layer.entry.archive)
        return real(bundle, layer, dest, **kwargs)

    monkeypatch.setattr(extract_child, "MIN_MEMBERS", 0)
    monkeypatch.setattr(extract_child, "extract_layer_in_child", counted)
    return seen


def _receipt(bundle: Path) -> dict:
    data = json.loads((bundle / ".portable" / "receipt.json").read_text())
    for rec in data["layers"].values():
        rec.pop("prefix")
    return {k: data[k] for k in ("layers", "manifest_sha256")}


def test_children_write_what_threads_write(packed, tmp_path, children):
    """Same trees (bytes, links, modes via a second snapshot), same receipt (sizes, mtimes, source digests)."""
    threads, kids = tmp_path / "threads", tmp_path / "kids"
    for out in (threads, kids):
        subprocess.run(["cp", "-a", str(packed), str(out)], check=True)
    extract_child.MIN_MEMBERS = 10**9  # this restore: threads (the monkeypatch restores it after the test)
    restore_bundle(threads, ui=QUIET)
    assert children == []
    extract_child.MIN_MEMBERS = 0
    restore_bundle(kids, ui=QUIET)
    assert sorted(children) == ["runtime/rt.tar.zst", "source/project.tar.zst"]
    for t in TARGETS:
        assert tree_snapshot(kids / t) == tree_snapshot(threads / t)
        modes = {p.relative_to(kids / t): p.lstat().st_mode for p in (kids / t).rglob("*")}
        assert modes == {p.relative_to(threads / t): p.lstat().st_mode for p in (threads / t).rglob("*")}
    assert _receipt(kids) == _receipt(threads)
    assert _receipt(kids)["layers"]["source/project.tar.zst"]["digests"]  # source layers record digests


def test_one_job_extracts_one_target_at_a_time_in_threads(bundle, children):
    restore_bundle(bundle, ui=QUIET, jobs=1)
    assert children == []  # nothing runs beside it, so there is no GIL to share
    restore_bundle(bundle, ui=QUIET, jobs=2, deep=True)
    assert children == []  # unchanged targets: nothing to extract
    (bundle / "runtime" / "rt" / "share" / "data.txt").unlink()
    (bundle / "source" / "project" / "README.md").write_text("edited")
    restore_bundle(bundle, ui=QUIET, jobs=2, refresh_source=True)
    assert sorted(children) == ["runtime/rt.tar.zst", "source/project.tar.zst"]


def test_progress_is_relayed_and_the_result_matches_extract_layer(packed, tmp_path):
    manifest = load_manifest(packed)
    entry = next(e for e in manifest.layers if e.target == "runtime/rt")
    members = layer_io.read_index(packed / entry.members_index, rel=entry.members_index)
    layer = layer_io.LoadedLayer(entry=entry, digest=manifest.file(entry.archive).sha256, members=members)
    got: list[int] = []
    written = extract_child.extract_layer_in_child(packed, layer, tmp_path / "kid", digests=True, on_bytes=got.append)
    direct = layer_io.extract_layer(packed, layer, tmp_path / "direct", digests=True)
    assert sum(got) == entry.unpacked_size > 0
    assert (written.files, written.links, written.digests) == (direct.files, direct.links, direct.digests)
    assert tree_snapshot(tmp_path / "kid") == tree_snapshot(tmp_path / "direct")


def test_a_corrupt_archive_in_a_child_is_a_digest_problem(bundle, children):
    flip_bit(bundle / "runtime" / "rt.tar.zst", 60, 3)
    with pytest.raises(IntegrityError) as info:
        restore_bundle(bundle, ui=QUIET)
    assert info.value.exit_code == 5 and "digest   runtime/rt.tar.zst" in str(info.value)
    assert "runtime/rt.tar.zst" in children
    assert not any((bundle / t).exists() for t in TARGETS)
    assert sorted(os.listdir(bundle / ".portable")) == ["lock"]


def test_an_archive_that_differs_from_its_index_is_refused_by_the_child(bundle, tmp_path, children):
    (bundle / "runtime" / "rt.tar.zst").write_bytes(
        tar_zst([member("bin", "dir", mode=0o755), member("bin/../../../escape", data=b"x")])
    )
    repin(bundle, "runtime/rt.tar.zst")
    with pytest.raises(UnsafeArchiveError) as info:
        restore_bundle(bundle, ui=QUIET)
    assert info.value.exit_code == 6 and info.value.archive == "runtime/rt.tar.zst"
    assert "changed since it was validated" in str(info.value)
    assert not any((bundle / t).exists() for t in TARGETS)
    assert not (tmp_path / "escape").exists() and not (bundle / "escape").exists()
    assert sorted(os.listdir(bundle / ".portable")) == ["lock"]


def test_a_full_disk_in_a_child_is_exit_8_and_keeps_the_previous_state(bundle):
    import resource

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # the children inherit it

    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(REPO), str(bundle)],
        capture_output=True,
        text=True,
        preexec_fn=limited,
        timeout=120,
    )
    assert done.returncode == 8, done.stderr
    assert done.stdout == "children: 2\n"
    assert done.stderr.startswith("WriteFailedError: cannot write ") and "file size limit" in done.stderr
    assert not any((bundle / t).exists() for t in TARGETS)
    assert sorted(os.listdir(bundle / ".portable")) == ["lock"]


def test_a_bare_python_3_10_extracts_in_children_with_the_zstd_command(bundle, packed, tmp_path):
    """The oldest Python restore supports, with zstandard hidden: the children (which inherit the
    environment) decompress with the `zstd` command and write the trees this Python's threads write."""
    found = find_python("3.10")
    if found is None:
        pytest.skip(missing_reason("3.10"))
    zstd = shutil.which("zstd")
    if zstd is None:
        pytest.skip("needs the zstd command")
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "zstandard.py").write_text("raise ImportError('hidden for the test')\n")
    env = {"PATH": f"{Path(zstd).parent}:/usr/bin:/bin", "PYTHONNOUSERSITE": "1", "PYTHONPATH": str(hide)}
    done = subprocess.run(
        [str(found[0]), "-c", DRIVER, str(REPO), str(bundle)], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "children: 2\n"
    reference = tmp_path / "reference"
    subprocess.run(["cp", "-a", str(packed), str(reference)], check=True)
    restore_bundle(reference, ui=QUIET)
    for t in TARGETS:
        assert tree_snapshot(bundle / t) == tree_snapshot(reference / t)


def test_a_killed_child_is_a_one_line_exit_8(bundle, monkeypatch, children):
    monkeypatch.setattr(extract_child, "_BOOT", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    with pytest.raises(WriteFailedError) as info:
        restore_bundle(bundle, ui=QUIET)
    assert info.value.exit_code == 8
    assert "its extracting process was killed by signal 9 before it finished" in str(info.value)
    assert "\n" not in str(info.value)
    assert not any((bundle / t).exists() for t in TARGETS)


def test_errors_keep_their_type_fields_and_exit_code():
    exc = UnsafeArchiveError("a: bad", archive="a.tar.zst", member="x/../y", hint="do not use it")
    back = extract_child._error_from(json.loads(json.dumps(extract_child._error_to(exc))))
    assert type(back) is UnsafeArchiveError and back.exit_code == 6
    assert (str(back), back.hint, back.archive, back.member) == ("a: bad", "do not use it", "a.tar.zst", "x/../y")
    mismatch = extract_child._error_from(extract_child._error_to(layer_io.DigestMismatch("a.tar.zst", "ab" * 32)))
    assert isinstance(mismatch, layer_io.DigestMismatch) and (mismatch.archive, mismatch.actual) == (
        "a.tar.zst",
        "ab" * 32,
    )
    try:
        raise KeyError("boom")
    except KeyError as bug:
        report = extract_child._error_to(bug)
    back = extract_child._error_from(report)
    assert type(back) is RuntimeError and "KeyError: 'boom'" in str(back)


def _children_of(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                out.append(int(entry))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def test_killing_restore_kills_its_extracting_children(bundle, packed, tmp_path):
    """kill -9 of restore while both children are mid-job (held there after they registered for their
    parent's death): the kernel kills them, nothing is left writing, and the next restore is complete."""
    held = tmp_path / "held"
    held.mkdir()
    hold = (
        "import os, sys, time; sys.path.insert(0, sys.argv[1]); from reproduction.release import extract_child as c; "
        f"die = c._die_with_parent; c._die_with_parent = lambda p: (die(p), open(f'{held}/{{os.getpid()}}', 'w'), "
        "time.sleep(60)); c.main()"
    )
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(REPO), str(bundle), hold], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while len(os.listdir(held)) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        kids = sorted(int(name) for name in os.listdir(held))
        assert len(kids) == 2 and sorted(_children_of(proc.pid)) == kids
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    deadline = time.monotonic() + 10
    while any(_alive(k) for k in kids) and time.monotonic() < deadline:
        time.sleep(0.02)
    outlived = [k for k in kids if _alive(k)]
    for k in outlived:
        os.kill(k, signal.SIGKILL)
    assert not outlived, "an extracting child outlived the killed restore"
    restore_bundle(bundle, ui=QUIET)
    reference = tmp_path / "reference"
    subprocess.run(["cp", "-a", str(packed), str(reference)], check=True)
    restore_bundle(reference, ui=QUIET)
    for t in TARGETS:
        assert tree_snapshot(bundle / t) == tree_snapshot(reference / t)
