"""The no-change re-restore fast path (reproduction/release/noop.py): says yes only when the full
restore would do nothing, and prints what the full path prints."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys

import pytest
from bundlekit import QUIET, run_cli, small_bundle

from reproduction.release import lock, manifest, noop, receipt, verify
from reproduction.release.restore import restore_bundle


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return small_bundle(tmp_path_factory.mktemp("noop"))


@pytest.fixture
def restored(packed, tmp_path):
    out = tmp_path / "b"
    shutil.copytree(packed, out, symlinks=True)
    restore_bundle(out, ui=QUIET)
    return out


def test_constants_agree_with_the_modules_they_mirror():
    assert noop.MANIFEST_NAME == manifest.MANIFEST_NAME
    assert noop.STATE_DIR == manifest.STATE_DIR
    assert noop.RECEIPT_NAME == receipt.RECEIPT_NAME
    assert noop.RECEIPT_FORMAT == receipt.FORMAT
    assert noop.RECEIPT_MAJOR == receipt.FORMAT_VERSION.split(".")[0]
    assert noop.LOCK_NAME == lock.LOCK_NAME
    assert noop.RUNS_DIR == verify.RUNS_DIR


@pytest.mark.parametrize(
    ("argv", "want"),
    [
        (["restore"], (None, False)),
        (["restore", "B"], ("B", False)),
        (["-q", "restore", "B", "--no-progress"], ("B", True)),
        (["restore", "--quiet"], (None, True)),
        (["restore", "B", "--json"], None),
        (["restore", "B", "--deep"], None),
        (["restore", "--refresh-source", "B"], None),
        (["restore", "B", "--jobs", "2"], None),
        (["restore", "B", "C"], None),
        (["verify", "B"], None),
        (["--debug", "restore", "B"], None),
    ],
)
def test_only_a_plain_restore_takes_the_fast_path(argv, want):
    assert noop.parse_argv(argv) == want


def test_unchanged_bundle_is_answered_and_prints_the_full_summary(restored, capsys):
    assert noop.try_noop_restore(["restore", str(restored)], "/nowhere") == 0
    fast = capsys.readouterr().err
    full = restore_bundle(restored, ui=QUIET).summary()
    assert fast.split(" in ")[0] == full.split(" in ")[0]
    assert fast.strip().split("s: ", 1)[1] == full.split("s: ", 1)[1]
    assert noop.try_noop_restore(["restore", "-q", str(restored)], "/nowhere") == 0
    assert capsys.readouterr().err == ""


def _touch_runtime(b):
    path = b / "runtime" / "rt" / "lib" / "libthing.so"
    os.utime(path, ns=(1, 1))


def _edit_source(b):
    path = next(p for p in (b / "source" / "project").rglob("*") if p.is_file())
    path.write_bytes(path.read_bytes() + b"#")


def _extra_file(b):
    (b / "notes.txt").write_text("mine")


def _staging_left(b):
    (b / ".portable" / "staging").mkdir()


def _plain_touched(b):
    os.utime(b / "reproduction" / "portable.py", ns=(1, 1))


def _link_changed(b):
    link = b / "runtime" / "rt" / "bin" / "tool-link"
    link.unlink()
    link.symlink_to("elsewhere")


def _receipt_gone(b):
    (b / ".portable" / "receipt.json").unlink()


def _runtime_file_gone(b):
    (b / "runtime" / "rt" / "lib" / "libthing.so").unlink()


@pytest.mark.parametrize(
    "change",
    [
        _touch_runtime,
        _edit_source,
        _extra_file,
        _staging_left,
        _plain_touched,
        _link_changed,
        _receipt_gone,
        _runtime_file_gone,
    ],
)
def test_any_difference_falls_back_to_the_full_path(restored, change):
    change(restored)
    assert noop.try_noop_restore(["restore", str(restored)], "/nowhere") is None


def test_moved_bundle_falls_back(restored, tmp_path):
    moved = tmp_path / "moved"
    os.rename(restored, moved)
    assert noop.try_noop_restore(["restore", str(moved)], "/nowhere") is None


def test_a_held_lock_falls_back_so_the_full_path_reports_it(restored):
    fd = os.open(restored / ".portable" / "lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert noop.try_noop_restore(["restore", str(restored)], "/nowhere") is None
    finally:
        os.close(fd)


def test_cli_script_second_restore_is_the_fast_path_and_exits_0(restored):
    script = restored / "reproduction" / "portable.py"
    done = subprocess.run(
        [sys.executable, "-X", "importtime", str(script), "restore"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "unchanged source/project, runtime/rt" in done.stderr
    assert "argparse" not in done.stderr and "reproduction.release.restore" not in done.stderr  # answered early
    assert sorted(os.listdir(restored / ".portable")) == ["lock", "receipt.json"]


def test_a_receipt_that_is_a_fifo_is_no_receipt_and_never_waited_on(restored):
    # audit48 F2: restore (plain and --deep) hung opening it; now it is read as a corrupt receipt is: re-extract
    state = restored / manifest.STATE_DIR
    (state / receipt.RECEIPT_NAME).unlink()
    os.mkfifo(state / receipt.RECEIPT_NAME)
    done = run_cli("restore", restored, timeout=30)
    assert done.returncode == 0, done.stderr
    assert "extracted" in done.stderr and "Traceback" not in done.stderr
    assert (state / receipt.RECEIPT_NAME).is_file()
