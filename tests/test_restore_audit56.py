"""Audit 56 / A: unreadable files in a restored tree (A1, A2) and a build-prefix string that ends its file (A3).

Permission cases need an ordinary user's permission checks: as root they run the CLI without capabilities
(`setpriv --inh-caps=-all --bounding-set=-all`), or are skipped when setpriv cannot do that here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from bundlekit import QUIET, SCRIPT, forge_bundle, member, write_tree

from reproduction.release.pack import pack_bundle
from reproduction.release.restore import restore_bundle

NO_CAPS = ["setpriv", "--inh-caps=-all", "--bounding-set=-all"]


def _as_user() -> list[str]:
    """The command prefix that runs the CLI with an ordinary user's permission checks (skips when none)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root and setpriv is not installed: permission bits would not apply")
    if subprocess.run([*NO_CAPS, "true"], capture_output=True, timeout=30).returncode != 0:
        pytest.skip("running as root and setpriv cannot drop capabilities here: permission bits would not apply")
    return NO_CAPS


def _restore(*args: str | os.PathLike) -> subprocess.CompletedProcess:
    env = {**os.environ, "PORTABLE_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [*_as_user(), sys.executable, str(SCRIPT), "restore", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_a_mode_000_member_restores_again_and_an_unreadable_file_is_a_permission_error(tmp_path):
    """A1: restore reads back what it wrote (this forged layer has no member index, so every restore compares the
    tree with a fresh extraction): a file is written readable by its owner, so the second restore works too; a
    file made unreadable afterwards is exit 3 naming it and `chmod u+r`, not exit 8 "free some space"."""
    bundle = forge_bundle(
        tmp_path / "b", [("source/app.tar.zst", "source/app", "source", [member("secret", data=b"s", mode=0o000)])]
    )
    secret = bundle / "source" / "app" / "secret"
    for _ in range(2):
        done = _restore(bundle)
        assert done.returncode == 0, done.stderr
        assert "extracted source/app" in done.stderr
        assert secret.read_bytes() == b"s"
        assert secret.stat().st_mode & 0o777 == 0o400  # the archive's 000 plus u+r, nothing else

    secret.chmod(0)
    done = _restore(bundle)
    assert done.returncode == 3, done.stderr
    assert f"error: cannot read {secret} to compare it with the bundle's copy: permission denied" in done.stderr
    assert f"chmod u+r {secret}" in done.stderr
    assert "free some space" not in done.stderr
    secret.chmod(0o400)
    assert _restore(bundle).returncode == 0  # nothing was changed: fixing the permission is enough


def test_deep_restore_reports_an_unreadable_file_instead_of_calling_it_locally_edited(tmp_path):
    """A2, decided: `--deep` rehashes a source tree; a file it cannot open for lack of permission is its own
    one-line error (exit 3, naming the file and `chmod u+r`), never "locally edited" (no one edited it, and
    unread it is not known to be the same either). A plain restore looks at stat only and still succeeds."""
    write_tree(tmp_path / "src" / "app", {"ok.py": b"hi\n", "noread.txt": b"secret\n"})
    (tmp_path / "s.toml").write_text(
        'name = "p"\nroot = "src"\n[[layer]]\nsource = "app"\nkind = "source"\nname = "app"\n', encoding="utf-8"
    )
    bundle = tmp_path / "B"
    pack_bundle(tmp_path / "s.toml", bundle, ui=QUIET)
    assert _restore(bundle).returncode == 0
    noread = bundle / "source" / "app" / "noread.txt"
    noread.chmod(0)

    done = _restore("--deep", bundle)
    assert done.returncode == 3, done.stderr
    assert f"error: cannot read {noread} to check its contents: permission denied" in done.stderr
    assert f"chmod u+r {noread}" in done.stderr
    assert "locally edited" not in done.stderr
    assert noread.stat().st_mode & 0o777 == 0
    done = _restore(bundle)
    assert done.returncode == 0, done.stderr
    assert "unchanged source/app" in done.stderr

    noread.chmod(0o644)
    done = _restore("--deep", bundle)
    assert done.returncode == 0, done.stderr
    assert "locally edited" not in done.stderr


def test_a_prefix_string_that_ends_the_file_keeps_its_room_across_relocations(tmp_path):
    """A3: the second copy of the build prefix ends the file (no NUL after it). The first relocation pads it with
    NULs up to the end of the file; the next relocation must count that padding as room (it needed one NUL more,
    so the room shrank to the string's length and a move to a longer path, far under the prefix, was exit 9)."""
    build = "/opt/" + "p" * 195  # longer than any path the bundle gets here
    data = b"\x7fELF\0\1" + build.encode() + b"/lib\0\0\0\0" + build.encode()  # ELF: C strings (audit62 M3)
    write_tree(tmp_path / "src" / "rt", {"lib/eof.bin": data})
    (tmp_path / "s.toml").write_text(
        'name = "rel"\nroot = "src"\n[[layer]]\nsource = "rt"\nkind = "runtime"\nname = "rt"\n'
        f'relocatable = true\nbuild_prefix = "{build}"\n',
        encoding="utf-8",
    )
    first = tmp_path / "L1" / "B"
    pack_bundle(tmp_path / "s.toml", first, ui=QUIET)

    def expected(bundle):
        new = str(bundle / "runtime" / "rt").encode()
        pad = b"\0" * (len(build) - len(new))
        return b"\x7fELF\0\1" + new + b"/lib" + pad + b"\0\0\0\0" + new + pad

    assert restore_bundle(first, ui=QUIET).extracted == ["runtime/rt"]
    assert (first / "runtime" / "rt" / "lib" / "eof.bin").read_bytes() == expected(first)

    moved = tmp_path / "L22" / "B"  # one character longer
    moved.parent.mkdir()
    first.rename(moved)
    report = restore_bundle(moved, ui=QUIET)
    assert report.relocated == ["runtime/rt"] and report.extracted == []
    assert (moved / "runtime" / "rt" / "lib" / "eof.bin").read_bytes() == expected(moved)
    assert len(expected(moved)) == len(data)

    back = tmp_path / "B"  # and shorter again: the room is still the build prefix's
    moved.rename(back)
    assert restore_bundle(back, ui=QUIET).relocated == ["runtime/rt"]
    assert (back / "runtime" / "rt" / "lib" / "eof.bin").read_bytes() == expected(back)


def _restored_bundle(tmp_path):
    write_tree(tmp_path / "src" / "rt", {"lib/a.bin": b"a" * 1000, "lib/b.bin": b"b" * 1000})
    (tmp_path / "s.toml").write_text(
        'name = "ro"\nroot = "src"\n[[layer]]\nsource = "rt"\nkind = "runtime"\nname = "rt"\n', encoding="utf-8"
    )
    pack_bundle(tmp_path / "s.toml", tmp_path / "B", ui=QUIET)
    restore_bundle(tmp_path / "B", ui=QUIET)
    return tmp_path / "B"


def test_an_unchanged_restored_bundle_on_a_read_only_filesystem_restores_as_unchanged(tmp_path, monkeypatch, capsys):
    """A4 (through a seam: the lock file's filesystem refuses writes): nothing can change the bundle there, so the
    no-change check runs without the holder line and answers exit 0; anything else still goes the full way."""
    from reproduction.release import noop

    bundle = _restored_bundle(tmp_path)
    lock = str(bundle / ".portable" / "lock")
    real_open = os.open

    def read_only_open(path, flags, *args, **kwargs):
        if str(path) == lock and flags & (os.O_RDWR | os.O_WRONLY):
            raise OSError(30, "Read-only file system", str(path))  # EROFS
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only_open)
    assert noop.try_noop_restore(["restore", str(bundle)], "") == 0
    assert "unchanged runtime/rt" in capsys.readouterr().err
    (bundle / "runtime" / "rt" / "lib" / "a.bin").write_bytes(b"edited")
    assert noop.try_noop_restore(["restore", str(bundle)], "") is None  # the full path reports (its lock: exit 8)


def test_restore_on_a_read_only_mount_of_a_restored_bundle(tmp_path):
    """A4 for real (root only: a tmpfs remounted read-only): plain restore 0, `--deep` (which may write) 8."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    bundle = _restored_bundle(tmp_path)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        shutil.copytree(bundle, mnt / "b", symlinks=True)
        env = {**os.environ, "PORTABLE_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1"}
        cli = [sys.executable, str(SCRIPT), "restore"]
        assert subprocess.run([*cli, str(mnt / "b")], env=env, capture_output=True, timeout=120).returncode == 0
        assert subprocess.run(["mount", "-o", "remount,ro", str(mnt)], capture_output=True).returncode == 0
        done = subprocess.run([*cli, str(mnt / "b")], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "unchanged runtime/rt" in done.stderr
        done = subprocess.run([*cli, "--deep", str(mnt / "b")], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 8, done.stderr
        assert "the filesystem is read-only" in done.stderr
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
