"""Restore and fetch, review65 S: an error of a write done by the state folder's fd names the full path and keeps
the free-space note (M2); `portable fetch` writes and removes in `.portable` through the fd bundle_lock opened (a
`.portable` swapped for a link after verification is exit 6, nothing outside touched: M1); a receipt temp left by a
kill is removed by the next restore (L2). In-process through `portable.main`."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from bundlekit import QUIET, write_tree

from reproduction.portable import main
from reproduction.release.pack import pack_bundle


def _pack(root: Path) -> Path:
    files = {"bin/tool": b"#!/bin/sh\necho tool\n", "share/data.txt": b"x" * 100}
    write_tree(root / "src" / "a", files, modes=dict.fromkeys(files, 0o755))
    (root / "r.toml").write_text('name = "r"\nroot = "src"\n[[layer]]\nsource = "a"\nkind = "runtime"\n')
    pack_bundle(root / "r.toml", root / "bundle", ui=QUIET)
    return root / "bundle"


def _refuse(monkeypatch, name: str, func: str, code: int) -> None:
    """os.<func> (mkdir or open) of the bare `name` by a folder fd fails with `code` (a full or read-only disk)."""
    real = getattr(os, func)

    def refused(path, *args, **kwargs):
        if path == name and kwargs.get("dir_fd") is not None:
            raise OSError(code, os.strerror(code), path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, func, refused)


# -- M2: errors of writes by the state folder's fd name the full path ------------------------------------------------


@pytest.mark.parametrize(
    ("name", "func", "shown"),
    [
        ("staging", "mkdir", ".portable/staging"),
        ("staging", "open", ".portable/staging"),
        ("0", "mkdir", ".portable/staging/0"),
        ("0", "open", ".portable/staging/0"),
        ("trash", "mkdir", ".portable/trash"),
        ("bin", "mkdir", ".portable/staging/0/bin"),  # a layer's folder (extract._make_dirs), named in full too
    ],
)
def test_a_full_disk_in_the_state_folder_names_the_full_path(tmp_path, monkeypatch, capsys, name, func, shown):
    bundle = _pack(tmp_path)
    _refuse(monkeypatch, name, func, errno.ENOSPC)
    assert main(["restore", str(bundle), "-q"]) == 8
    err = capsys.readouterr().err
    assert f"the disk is full at {bundle / shown} (" in err, err
    assert "were free" in err, err  # the free-space note of the right filesystem


def test_a_read_only_lock_file_names_its_full_path(tmp_path, monkeypatch, capsys):
    bundle = _pack(tmp_path)
    _refuse(monkeypatch, "lock", "open", errno.EROFS)
    assert main(["restore", str(bundle), "-q", "--deep"]) == 8
    err = capsys.readouterr().err
    assert f"cannot write the lock file {bundle / '.portable' / 'lock'}: " in err, err
    assert f"read-only ({bundle / '.portable' / 'lock'})" in err, err


def test_a_full_disk_at_the_staging_folder_on_a_tmpfs_without_inodes_says_so(tmp_path, capsys):
    """The reproducer itself where a tmpfs can be mounted (root, `unshare -m`): the inode note is kept."""
    import shutil
    import subprocess
    import sys

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare -m to mount a tmpfs")
    bundle = _pack(tmp_path)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = (
        f"mount -t tmpfs -o size=20m,nr_inodes=400 tmpfs {mnt} || exit 99; cp -a {bundle} {mnt}/b; "
        f"{sys.executable} -m reproduction.portable restore {mnt}/b -q || exit 98; rm -rf {mnt}/b/runtime/a; "
        f"mkdir {mnt}/fill; "
        f"i=0; while touch {mnt}/fill/$i 2>/dev/null; do i=$((i+1)); done; "
        f"{sys.executable} -m reproduction.portable restore {mnt}/b -q; echo rc=$?"
    )
    proc = subprocess.run(
        ["unshare", "-m", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parent.parent,
    )
    if "rc=" not in proc.stdout:
        pytest.skip(f"no tmpfs here: {proc.stderr.strip()[:200]}")
    assert "rc=8" in proc.stdout, proc.stdout + proc.stderr
    assert f"the disk is full at {mnt}/b/.portable/staging (no free inodes" in proc.stderr, proc.stderr


# -- M1: `portable fetch` writes and removes in `.portable` through the fd its lock opened ----------------------------

_FETCH_RACE = """
import os, sys
from pathlib import Path
import reproduction.release.verify as vmod
from reproduction.portable import main
dest, victim = Path(sys.argv[1]), sys.argv[2]
real = vmod.raise_for_report
def swapped(*a, **k):  # right after fetch's verification passed: `.portable` swapped for a link to `victim`
    out = real(*a, **k)
    os.rename(dest / ".portable", dest / ".portable.moved")
    os.symlink(victim, dest / ".portable")
    return out
vmod.raise_for_report = swapped
sys.exit(main(["fetch", "alice/r", str(dest)]))
"""


def test_fetch_never_writes_through_a_state_folder_swapped_for_a_link(tmp_path):
    import subprocess
    import sys

    from hubserver import HubServer, make_bundle, portable_env

    token = "hf_x_secret_1234"
    hub = HubServer(tmp_path / "hub", tokens={token: ("alice", "write")}).start()
    try:
        bundle = make_bundle(tmp_path / "src", {"a.txt": b"a" * 1000, "w/b.bin": os.urandom(5000)})
        hub.seed_repo("model/alice/r", bundle, owner="alice")
        victim = tmp_path / "victim"
        (victim / "partial").mkdir(parents=True)
        (victim / "partial" / "precious.txt").write_text("the victim's\n")
        (victim / "receipt.json").write_text("the victim's receipt\n")
        dest = tmp_path / "dest"
        proc = subprocess.run(
            [sys.executable, "-c", _FETCH_RACE, str(dest), str(victim)],
            env=portable_env(hub, tmp_path / "hfhome", token=token),
            cwd=Path(__file__).resolve().parent.parent,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        hub.stop()
    assert proc.returncode == 6, proc.stdout + proc.stderr
    assert "state folder .portable was replaced while fetch ran" in proc.stderr, proc.stderr
    assert f"{dest / '.portable'} is now a symlink" in proc.stderr, proc.stderr
    assert (victim / "receipt.json").read_text() == "the victim's receipt\n"
    assert (victim / "partial" / "precious.txt").read_text() == "the victim's\n"
    assert not (dest / "bundle.json").exists()  # never reported or left as a complete fetch


# -- L2: a receipt temp left by a kill is removed by the next restore ------------------------------------------------


def test_restore_removes_a_receipt_temp_a_killed_writer_left(tmp_path, capsys):
    import shutil

    bundle = _pack(tmp_path)
    assert main(["restore", str(bundle), "-q"]) == 0
    state = bundle / ".portable"
    import subprocess

    gone = subprocess.Popen(["true"])
    gone.wait(timeout=30)  # a writer that is gone
    orphan = state / f".receipt.json.{gone.pid}.abcd1234.portable-tmp"  # what a kill -9 inside atomic_write_at leaves
    orphan.write_text("{}")
    live = state / f".receipt.json.{os.getpid()}.abcd1234.portable-tmp"  # a running writer's: left alone
    live.write_text("{}")
    other = state / "notes.portable-tmp"  # not a temp file's name: left alone
    other.write_text("mine")
    shutil.rmtree(bundle / "runtime" / "a")
    assert main(["restore", str(bundle), "-q"]) == 0, capsys.readouterr().err
    assert not orphan.exists()
    assert live.exists() and other.exists()
    assert (bundle / "runtime" / "a" / "bin" / "tool").is_file()


# -- L1: a trampoline whose interpreter is outside the bundle, with an argument naming it ----------------------------


def test_a_trampoline_whose_argument_names_the_bundle_relocates_through_a_quote(tmp_path, capsys):
    import shutil
    import subprocess
    import sys

    build = tmp_path / "src" / "a"
    tool = f"#!{sys.executable} -Xpycache_prefix={build}/cache\nimport sys; print('ok', sys.pycache_prefix)\n"
    write_tree(build, {"bin/tool": tool.encode()}, modes={"bin/tool": 0o755})
    (tmp_path / "r.toml").write_text(
        'name = "r"\nroot = "src"\n[[layer]]\nsource = "a"\nkind = "runtime"\nrelocatable = true\n'
    )
    bundle = tmp_path / "b0"
    pack_bundle(tmp_path / "r.toml", bundle, ui=QUIET)
    for place in ["L" * 120, "Bob's " + "L" * 120]:  # a line over 127 bytes (the trampoline), then a `'` in it
        (tmp_path / place).mkdir()
        bundle = Path(shutil.move(bundle, tmp_path / place / "b"))
        assert main(["restore", str(bundle), "-q"]) == 0, capsys.readouterr().err
        script = bundle / "runtime" / "a" / "bin" / "tool"
        assert script.read_bytes().startswith(b"#!/bin/sh\n")
        for how in (["sh", str(script)], [str(script)]):
            run = subprocess.run(how, capture_output=True, text=True, timeout=60)
            assert run.returncode == 0, run.stderr
            assert run.stdout.strip() == f"ok {bundle}/runtime/a/cache"
