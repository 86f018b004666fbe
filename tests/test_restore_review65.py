"""Restore, review65: the bundle's state folder `.portable` is reached through the fd restore opened it with (a
`.portable` swapped for a symlink while restore runs is refused, exit 6, and nothing outside the bundle is removed or
written: H1); a shebang trampoline is relocated in and out of a path holding `'` (M1); a file name of any valid length
is relocated (L1); a folder above a layer target this user cannot search is exit 3 naming it (L2). In-process through
`portable.main`, the planting done by wrapping the step that runs just before the moment of the race."""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from bundlekit import QUIET, write_tree
from test_restore_audit65 import _deny  # as `chmod 000` (emulated for root)
from test_restore_audit65 import after_call as _after

import reproduction.release.lock as lock_mod
import reproduction.release.restore as restore_mod
from reproduction.portable import main
from reproduction.release.pack import pack_bundle


def _tool(prefix: str) -> bytes:
    return f"#!{prefix}/bin/python3\nprint(1)\n".encode()


def _pack(root: Path, files: dict[str, bytes], kind: str = "runtime", *, out: Path | None = None) -> Path:
    """A one-layer relocatable bundle packed from `root/src/a` (target `<kind>/a`) at `out` (default root/bundle)."""
    write_tree(root / "src" / "a", files, modes=dict.fromkeys(files, 0o755))
    spec = f'name = "r"\nroot = "src"\n[[layer]]\nsource = "a"\nkind = "{kind}"\nrelocatable = true\n'
    (root / "r.toml").write_text(spec)
    out = out or root / "bundle"
    pack_bundle(root / "r.toml", out, ui=QUIET)
    return out


def _snap(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(folder.rglob("*"))
    }


# -- H1: `.portable` swapped for a symlink while restore runs ---------------------------------------------------------


def _state_victim(tmp_path: Path) -> Path:
    """A folder outside the bundle shaped like a state folder: what a `.portable` link to it would have restore remove
    (staging/, trash/, reloc/) or write (receipt.json, lock)."""
    victim = tmp_path / "victim"
    for name in ("staging", "trash", "reloc"):
        (victim / name).mkdir(parents=True)
        (victim / name / "precious.txt").write_text(f"the victim's {name}\n")
    (victim / "staging" / "0").mkdir()  # restore's first staging folder's name
    (victim / "receipt.json").write_text("the victim's own receipt.json\n")
    return victim


def _plant_state(bundle: Path, victim: Path) -> None:
    if not os.path.islink(bundle / ".portable"):
        os.rename(bundle / ".portable", bundle / ".portable.moved")
        os.symlink(victim, bundle / ".portable")


def _state_back(bundle: Path) -> None:
    if os.path.islink(bundle / ".portable"):
        os.unlink(bundle / ".portable")
    if os.path.isdir(bundle / ".portable.moved"):
        os.rename(bundle / ".portable.moved", bundle / ".portable")


@pytest.mark.parametrize(
    "step",
    ["_free_space_check", "preflight", "swap_into_place", "_relocate"],
    ids=["before extraction", "before the swap", "after the swap", "after relocation"],
)
def test_a_state_folder_swapped_for_a_symlink_is_refused_and_nothing_outside_is_changed(
    tmp_path, monkeypatch, capsys, step
):
    bundle = _pack(tmp_path, {"bin/tool": _tool(str(tmp_path / "src" / "a"))})
    victim = _state_victim(tmp_path)
    before = _snap(victim)
    _after(monkeypatch, restore_mod, step, lambda: _plant_state(bundle, victim))
    code = main(["restore", str(bundle), "-q"])
    err = capsys.readouterr().err.strip().splitlines()
    # main: the victim's staging/, trash/ and reloc/ removed and its receipt.json overwritten (after relocation: rc 0)
    assert _snap(victim) == before
    assert code == 6, err
    state = bundle / ".portable"
    assert err == [
        f"error: the bundle's state folder .portable was replaced while restore ran ({state} is now a symlink): "
        "refusing to restore through it",
        f"hint: remove {state} (the bundle's state folder is the tool's own, never a link; the next restore makes it "
        "afresh) and run the command again; nothing outside the bundle was changed",
    ]
    monkeypatch.undo()  # the link gone and the folder back, the next restore finishes the job
    _state_back(bundle)
    assert main(["restore", str(bundle), "-q"]) == 0
    assert (bundle / "runtime" / "a" / "bin" / "tool").read_bytes() == _tool(str(bundle / "runtime" / "a"))
    assert _snap(victim) == before


def test_the_lock_file_is_opened_in_the_state_folder_checked_never_through_a_link(tmp_path, monkeypatch, capsys):
    bundle = _pack(tmp_path, {"bin/tool": _tool(str(tmp_path / "src" / "a"))})
    victim = _state_victim(tmp_path)
    before = _snap(victim)
    _after(monkeypatch, lock_mod, "state_dir", lambda: _plant_state(bundle, victim))  # right after its lstat
    code = main(["restore", str(bundle), "-q"])
    err = capsys.readouterr().err.strip().splitlines()
    assert _snap(victim) == before  # main: the victim's lock file created (and locked), its leftovers removed
    assert code == 6, err
    state = bundle / ".portable"
    assert err == [
        f"error: {state} is a symlink or not a folder: refusing to restore through it",
        f"hint: {state}: remove it (the bundle's state folder is the tool's own, never a link) and run the command "
        "again",
    ]
    monkeypatch.undo()
    _state_back(bundle)
    assert main(["restore", str(bundle), "-q"]) == 0


# -- M1: the trampoline relocated in and out of a path holding `'` ---------------------------------------------------


def _trampoline(prefix: str) -> bytes:
    """What relocation writes for `_tool(prefix)` when the path needs the sh + exec form (a space in it)."""
    quoted = shlex.quote(f"{prefix}/bin/python3")
    return f"#!/bin/sh\n'''exec' {quoted} \"$0\" \"$@\"\n' '''\nprint(1)\n".encode()


def _runs(target: Path) -> str:
    """Run `target/bin/tool` with a stand-in python3 that says what it was run as (sh's syntax and the path used)."""
    fake = target / "bin" / "python3"
    fake.write_text('#!/bin/sh\necho "ran $0 with $1"\n')
    fake.chmod(0o755)
    try:
        done = subprocess.run(
            [str(target / "bin" / "tool")], capture_output=True, text=True, timeout=30, check=False, cwd=target
        )
    finally:
        fake.unlink()
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize("kind", ["runtime", "source"])
def test_a_trampoline_is_relocated_into_and_out_of_a_path_with_a_quote(tmp_path, capsys, kind):
    bundle = _pack(tmp_path, {"bin/tool": _tool(str(tmp_path / "src" / "a"))}, kind, out=tmp_path / "my bundles" / "b")
    for place in ("my bundles", "Bob's bundles", "o'b rien", "new place"):  # each with a space: the trampoline
        if bundle.parent.name != place:
            (tmp_path / place).mkdir()
            bundle = Path(shutil.move(bundle, tmp_path / place / "b"))
        capsys.readouterr()
        assert main(["restore", str(bundle), "-q"]) == 0, capsys.readouterr().err
        target = bundle / kind / "a"
        # main: moving in, the new path written raw in the old quotes (sh: "Unterminated quoted string"); moving out,
        # the quoted old path never matched, so the tool kept running the other folder's interpreter
        assert (target / "bin" / "tool").read_bytes() == _trampoline(str(target)), place
        assert _runs(target) == f"ran {target}/bin/python3 with {target}/bin/tool"
    bundle = Path(shutil.move(bundle, tmp_path / "plain"))  # no space, short: the plain shebang comes back
    assert main(["restore", str(bundle), "-q"]) == 0
    assert (bundle / kind / "a" / "bin" / "tool").read_bytes() == _tool(str(bundle / kind / "a"))


# -- L1: a file name of any valid length relocated ---------------------------------------------------------------------


@pytest.mark.parametrize("length", [236, 239, 255])
def test_a_file_whose_name_is_up_to_name_max_bytes_is_relocated(tmp_path, capsys, length):
    name = "n" * (length - 3) + ".py"
    build = str(tmp_path / "src" / "a")
    bundle = _pack(tmp_path, {f"lib/{name}": f"P = {build!r}\n".encode(), "bin/tool": _tool(build)})
    code = main(["restore", str(bundle), "-q"])
    err = capsys.readouterr().err
    assert code == 0, err  # main: exit 8, "a name is longer than this filesystem allows (.nnn….py.<hex>.reloc)"
    assert (bundle / "runtime" / "a" / "lib" / name).read_text() == f"P = {str(bundle / 'runtime' / 'a')!r}\n"
    assert not os.path.lexists(bundle / ".portable" / "reloc")  # its temp files gone with it
    moved = Path(shutil.move(bundle, tmp_path / "moved"))  # relocated in place too
    assert main(["restore", str(moved), "-q"]) == 0
    assert (moved / "runtime" / "a" / "lib" / name).read_text() == f"P = {str(moved / 'runtime' / 'a')!r}\n"


# -- L2: a folder above a layer target this user cannot search ---------------------------------------------------------


@pytest.mark.parametrize("kind", ["runtime", "source"])
def test_a_folder_above_a_target_restore_cannot_search_is_exit_3_naming_it(tmp_path, monkeypatch, capsys, kind):
    bundle = _pack(tmp_path, {"lib/x.txt": b"restored\n", "bin/tool": _tool(str(tmp_path / "src" / "a"))}, kind)
    assert main(["restore", str(bundle), "-q"]) == 0
    before = (bundle / ".portable" / "receipt.json").read_bytes()
    folder = bundle / kind
    capsys.readouterr()
    try:
        _deny(monkeypatch, folder)
        code = main(["restore", str(bundle), "-q"])
    finally:
        monkeypatch.undo()
        os.chmod(folder, 0o755)
    out, err = capsys.readouterr()
    # main: "error: cannot access a file: permission denied (…)" with "hint: rerun with --debug …"
    assert code == 3, out + err
    assert err.strip().splitlines() == [
        f"error: cannot access {folder}/a to check the layer target's path: permission denied",
        f"hint: fix the permissions of {folder} (e.g. `chmod u+rwx {folder}`) and of the folders above it, then run "
        "the command again; nothing was changed",
    ]
    assert (bundle / ".portable" / "receipt.json").read_bytes() == before
    assert main(["restore", str(bundle), "-q"]) == 0  # permissions back: nothing to do
