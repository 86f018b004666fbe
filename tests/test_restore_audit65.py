"""Restore after the swap, audit65: relocation and the receipt's re-stat reach the swapped-in target's files from folder
fds opened without following a link (a symlink planted in a parent folder after the swap is refused, exit 6, never
followed out of the bundle), and a recorded file the receipt check cannot reach for lack of permission is a one-line
error (exit 3), not a local edit. In-process through `portable.main`, the planting done by wrapping the step that runs
just before the moment of the race."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
from pathlib import Path

import pytest
from bundlekit import QUIET, write_tree

import reproduction.release.restore as restore_mod
from reproduction.portable import main
from reproduction.release.pack import pack_bundle
from reproduction.release.receipt import load_receipt


def _tool(prefix: str) -> bytes:
    return f"#!{prefix}/bin/python3\nprint(1)\n".encode()


def _victim_bytes(prefix: str) -> bytes:
    return f"#!{prefix}/bin/python3\nprint('the victim file outside the bundle, longer than the bundle one')\n".encode()


def _pack(root: Path, files: dict[str, bytes], kind: str, *, relocatable: bool = True) -> Path:
    """A one-layer bundle packed from `root/src/a` (target `<kind>/a`), with its member index."""
    write_tree(root / "src" / "a", files, modes=dict.fromkeys(files, 0o755))
    spec = f'name = "r"\nroot = "src"\n[[layer]]\nsource = "a"\nkind = "{kind}"\n'
    (root / "r.toml").write_text(spec + ("relocatable = true\n" if relocatable else ""))
    pack_bundle(root / "r.toml", root / "bundle", ui=QUIET)
    return root / "bundle"


def _reloc_bundle(root: Path, kind: str) -> tuple[Path, str]:
    """(a bundle whose `<kind>/a/bin/tool` holds its build prefix, relocated at every restore; that prefix)."""
    build = str(root / "src" / "a")
    return _pack(root, {"bin/tool": _tool(build)}, kind), build


def _victim(tmp_path: Path, build: str) -> Path:
    """A folder outside the bundle shaped like the target's parent: a/bin/tool holding the build prefix too."""
    victim = tmp_path / "victim"
    (victim / "a" / "bin").mkdir(parents=True)
    (victim / "a" / "bin" / "tool").write_bytes(_victim_bytes(build))
    return victim


def _plant(bundle: Path, victim: Path, rel: str = "runtime") -> None:
    """A second local user's move: the folder `rel` of the bundle moved aside, a symlink to `victim` in its place."""
    os.rename(bundle / rel, bundle / f"{rel}.moved")
    os.symlink(victim, bundle / rel)


def _put_back(bundle: Path, rel: str = "runtime") -> None:
    """Undo `_plant` (what of it a failed restore's clean-up left: it may have taken the whole target away)."""
    if os.path.islink(bundle / rel):
        os.unlink(bundle / rel)
    if os.path.isdir(bundle / f"{rel}.moved"):
        os.rename(bundle / f"{rel}.moved", bundle / rel)


def after_call(monkeypatch, module, name: str, then) -> None:
    """Wrap `module.name`: `then()` runs right after it returns."""
    real = getattr(module, name)

    def wrapped(*args, **kwargs):
        out = real(*args, **kwargs)
        then()
        return out

    monkeypatch.setattr(module, name, wrapped)


def _after(monkeypatch, name: str, then) -> None:
    """Wrap restore's `name` (a step of `_finish`): `then()` runs right after it returns."""
    after_call(monkeypatch, restore_mod, name, then)


# -- 1: relocation after the swap -----------------------------------------------------------------------------------


@pytest.mark.parametrize("again", [False, True], ids=["first restore", "moved bundle, relocated in place"])
def test_relocation_never_writes_through_a_symlink_planted_in_a_targets_parent(tmp_path, monkeypatch, capsys, again):
    bundle, build = _reloc_bundle(tmp_path, "runtime")
    # the victim holds the prefix relocation looks for: the build prefix, or where the tree was last relocated for
    victim = _victim(tmp_path, str(bundle / "runtime" / "a") if again else build)
    last = os.fsdecode((victim / "a" / "bin" / "tool").read_bytes())
    if again:  # restored, then the bundle moved: the kept target is relocated in place, no swap (planted at preflight)
        assert main(["restore", str(bundle), "-q"]) == 0
        bundle = Path(shutil.move(bundle, tmp_path / "moved"))
    capsys.readouterr()
    _after(monkeypatch, "preflight" if again else "swap_into_place", lambda: _plant(bundle, victim))
    code = main(["restore", str(bundle), "-q"])
    err = capsys.readouterr().err.strip().splitlines()
    # main: the victim outside the bundle relocated for the bundle's path
    assert os.fsdecode((victim / "a" / "bin" / "tool").read_bytes()) == last
    assert sorted(p.name for p in (victim / "a" / "bin").iterdir()) == ["tool"]
    assert code == 6, err
    assert err == [
        "error: layer target runtime/a lies under the symlink runtime, which appeared while restore ran: refusing to "
        "restore through it",
        f"hint: remove {bundle / 'runtime'} (a bundle holds no symlinked folders), put its folder back, and restore "
        "again; nothing outside the bundle was changed",
    ]
    monkeypatch.undo()  # the link gone and the folder back, the next restore finishes the job
    _put_back(bundle)
    assert main(["restore", str(bundle), "-q"]) == 0
    assert (bundle / "runtime" / "a" / "bin" / "tool").read_bytes() == _tool(str(bundle / "runtime" / "a"))
    assert os.fsdecode((victim / "a" / "bin" / "tool").read_bytes()) == last


def test_relocation_never_writes_its_temp_files_through_a_symlinked_state_folder(tmp_path, monkeypatch, capsys):
    outside = tmp_path / "outside"
    outside.mkdir()
    bundle, _ = _reloc_bundle(tmp_path, "runtime")

    def plant() -> None:  # the state folder's reloc/ (relocation's temp files) swapped for a link after the swap
        shutil.rmtree(bundle / ".portable" / "reloc", ignore_errors=True)
        os.symlink(outside, bundle / ".portable" / "reloc")

    _after(monkeypatch, "swap_into_place", plant)
    seen: list[str] = []
    real_replace = os.replace

    def replace(src, dst, *args, **kwargs):  # where relocation's rename takes its temp file from
        if kwargs.get("src_dir_fd") is None:
            seen.append(os.path.realpath(os.fsdecode(src)))
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    code = main(["restore", str(bundle), "-q"])
    err = capsys.readouterr().err.strip().splitlines()
    assert not [s for s in seen if s.startswith(f"{outside}/")], seen  # main: the temp file was written there
    assert code == 6, err
    assert err[0] == (
        "error: relocation's temp folder .portable/reloc is a symlink or not a folder, which appeared while restore "
        "ran: refusing to restore through it"
    )
    assert err[1].startswith(f"hint: remove {bundle / '.portable' / 'reloc'} ")
    assert os.listdir(outside) == []


# -- 1: the receipt's re-stat after relocation --------------------------------------------------------------------


def test_the_receipts_restat_never_reads_through_a_symlink_planted_after_relocation(tmp_path, monkeypatch, capsys):
    bundle, build = _reloc_bundle(tmp_path, "source")  # a source layer: its digests are recorded (read) too
    victim = _victim(tmp_path, build)
    _after(monkeypatch, "_relocate", lambda: _plant(bundle, victim / "a" / "bin", "source/a/bin"))
    code = main(["restore", str(bundle), "-q"])
    err = capsys.readouterr().err.strip().splitlines()
    receipt = load_receipt(bundle)
    recs = [*receipt.layers.values(), *receipt.replacing.values()]
    # main: the victim's size and digest, read outside the bundle, recorded as the restored file's
    assert not [r for r in recs if r.files.get("bin/tool", [0])[0] == len(_victim_bytes(build))], recs
    assert not [r for r in recs if r.digests.get("bin/tool") == hashlib.sha256(_victim_bytes(build)).hexdigest()]
    assert code == 6, err
    assert err == [
        "error: the restored file source/a/bin/tool lies under the symlink source/a/bin, which appeared while restore "
        "ran: refusing to restore through it",
        f"hint: remove {bundle / 'source' / 'a' / 'bin'} (a bundle holds no symlinked folders), put its folder back, "
        "and restore again; nothing outside the bundle was changed",
    ]
    assert (victim / "a" / "bin" / "tool").read_bytes() == _victim_bytes(build)
    monkeypatch.undo()
    _put_back(bundle, "source/a/bin")
    assert main(["restore", str(bundle), "-q"]) == 0


# -- 2: a recorded file the receipt check cannot reach -------------------------------------------------------------


def _deny(monkeypatch, folder: Path) -> None:
    """Make everything below `folder` unreachable, as `chmod 000 folder` does for a user other than root: for root
    (who bypasses permission checks) emulated, os.lstat/os.stat/os.open of a path below it raising PermissionError."""
    if os.geteuid() != 0:
        os.chmod(folder, 0)
        return
    below = f"{folder}/"

    def guard(real):
        def call(path, *args, **kwargs):
            if kwargs.get("dir_fd") is None and isinstance(path, (str, os.PathLike)):
                if os.fspath(path).startswith(below):
                    raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
            return real(path, *args, **kwargs)

        return call

    for name in ("lstat", "stat", "open", "readlink"):
        monkeypatch.setattr(os, name, guard(getattr(os, name)))


@pytest.mark.parametrize("kind", ["source", "runtime"])
def test_a_recorded_file_restore_cannot_reach_is_a_permission_error_not_an_edit(tmp_path, monkeypatch, capsys, kind):
    bundle = _pack(tmp_path, {"lib/x.txt": b"restored\n", "top.txt": b"t"}, kind, relocatable=False)
    assert main(["restore", str(bundle), "-q"]) == 0
    before = (bundle / ".portable" / "receipt.json").read_bytes()
    folder = bundle / kind / "a" / "lib"
    inode = os.lstat(bundle / kind / "a").st_ino
    capsys.readouterr()
    try:
        _deny(monkeypatch, folder)
        code = main(["restore", str(bundle), "-q"])
    finally:
        monkeypatch.undo()
        os.chmod(folder, 0o755)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    # main: counted as changed (a source target: "kept 1 locally edited file(s)"; a runtime one: extracted again)
    assert "locally edited" not in out + err, out + err
    assert os.lstat(bundle / kind / "a").st_ino == inode  # not replaced
    assert code == 3, out + err
    assert lines == [
        f"error: cannot access {folder}/x.txt to check it against the restore receipt: permission denied",
        f"hint: fix the permissions of {folder} (e.g. `chmod u+rwx {folder}`) and of the folders above it, then run "
        "the command again; nothing was changed",
    ]
    assert (bundle / ".portable" / "receipt.json").read_bytes() == before
    assert (folder / "x.txt").read_bytes() == b"restored\n"
    assert main(["restore", str(bundle), "-q"]) == 0  # permissions back: nothing to do
