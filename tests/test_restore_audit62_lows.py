"""Audit62 A, Lows: `restore --deep` over unchanged runtime targets (L2), a lost receipt over edited runtime files
(L3), and a copy that reset every mtime (L8)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from bundlekit import QUIET, flip_bit, run_cli, tree_snapshot, write_tree

from reproduction.release.pack import pack_bundle

SPEC = """name = "lows"
root = "src"
[[layer]]
source = "proj"
kind = "source"
name = "proj"
[[layer]]
source = "rtA"
kind = "runtime"
name = "a"
relocatable = true
[[layer]]
source = "rtB"
kind = "runtime"
name = "b"
"""


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """Three targets: source/proj, runtime/a (relocatable: two files hold the build prefix), runtime/b."""
    root = tmp_path_factory.mktemp("lows") / ("build" + "x" * 30)
    src = root / "src"
    rt_a = src / "rtA"
    files_a = {f"lib/f{i}.txt": f"a {i}\n".encode() * 20 for i in range(5)}
    files_a["bin/tool"] = f"#!{rt_a}/bin/python3\nprint('hi')\n".encode()
    files_a["lib/cfg.txt"] = f"home = {rt_a}\n".encode()
    files_a["lib/libx.so"] = b"\x7fELF\x02\x01\x01\0" + f"{rt_a}/lib\0".encode() + b"tail\0"
    write_tree(rt_a, files_a)
    (rt_a / "bin" / "tool").chmod(0o755)
    write_tree(src / "rtB", {f"share/f{i}.txt": f"b {i}\n".encode() * 20 for i in range(5)})
    write_tree(src / "proj", {"a.py": b"v = 1\n", "b.py": b"w = 2\n"})
    (root / "s.toml").write_text(SPEC, encoding="utf-8")
    pack_bundle(root / "s.toml", root / "bundle", ui=QUIET)
    data = json.loads((root / "bundle" / "bundle.json").read_text())
    assert {o["path"] for x in data["layers"] for o in x.get("prefix_files", [])} >= {"lib/cfg.txt", "lib/libx.so"}
    return root / "bundle"


@pytest.fixture
def restored(packed, tmp_path):
    bundle = tmp_path / "b"
    shutil.copytree(packed, bundle, symlinks=True)
    done = run_cli("restore", bundle)
    assert done.returncode == 0, done.stderr
    return bundle


def _same_stat(path, change) -> None:
    st = os.stat(path)
    change(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size and mtime: only --deep's check can tell


# -- L2: `--deep` extracts again only a runtime target found changed, as --help and the README say ----------------


def test_deep_keeps_unchanged_runtime_targets_and_the_files_added_inside(restored):
    """It extracted every runtime target again and removed a file added inside, though nothing had changed."""
    added = restored / "runtime" / "a" / "lib" / "pip-installed.txt"
    added.write_text("mine\n")
    before = tree_snapshot(restored / "runtime")
    done = run_cli("restore", "--deep", restored)
    assert done.returncode == 0, done.stderr
    assert "unchanged source/proj, runtime/a, runtime/b" in done.stderr
    assert "extracted" not in done.stderr
    assert added.read_text() == "mine\n"
    assert tree_snapshot(restored / "runtime") == before
    assert not (restored / ".portable" / "staging").exists()


@pytest.mark.parametrize("victim", ["runtime/a/lib/f1.txt", "runtime/a/lib/cfg.txt", "runtime/b/share/f2.txt"])
def test_deep_extracts_again_a_runtime_target_found_changed_and_keeps_the_others(restored, victim):
    """A change the stat pass cannot see (same size and mtime), in a plain file or in one relocation rewrote."""
    path = restored / victim
    good = path.read_bytes()
    _same_stat(path, lambda p: flip_bit(p, 2, 0))
    other = "runtime/b" if victim.startswith("runtime/a") else "runtime/a"
    (restored / other / "mine.txt").write_text("mine\n")
    assert run_cli("restore", restored).returncode == 0 and path.read_bytes() != good  # stat pass: unchanged
    done = run_cli("restore", "--deep", restored)
    assert done.returncode == 0, done.stderr
    target = "/".join(victim.split("/")[:2])
    assert f"; extracted {target}; unchanged" in done.stderr, done.stderr
    assert f"unchanged source/proj, {other}" in done.stderr
    assert path.read_bytes() == good
    assert (restored / other / "mine.txt").read_text() == "mine\n"


def test_deep_extracts_again_a_runtime_target_whose_file_lost_its_exec_bit(restored):
    tool = restored / "runtime" / "a" / "bin" / "tool"
    mode = tool.stat().st_mode & 0o777
    assert mode & 0o100
    tool.chmod(mode & ~0o111)
    done = run_cli("restore", "--deep", restored)
    assert done.returncode == 0, done.stderr
    assert "; extracted runtime/a; unchanged source/proj, runtime/b" in done.stderr, done.stderr
    assert tool.stat().st_mode & 0o777 == mode


def test_deep_extracts_again_a_runtime_target_whose_folder_mode_changed(restored):
    """review62 R2: `chmod 700 runtime/a/lib` was put back by --deep at fc528c2 (it re-extracted every runtime
    target), and kept after L2 (only files and links were compared)."""
    lib = restored / "runtime" / "a" / "lib"
    mode = lib.stat().st_mode & 0o7777
    lib.chmod(0o700)
    done = run_cli("restore", "--deep", restored)
    assert done.returncode == 0, done.stderr
    assert "; extracted runtime/a; unchanged source/proj, runtime/b" in done.stderr, done.stderr
    assert lib.stat().st_mode & 0o7777 == mode


def test_deep_after_a_move_relocates_an_unchanged_runtime_target(restored, tmp_path):
    """A moved bundle: the prefix files no longer match a fresh relocation for the old folder; extracted again."""
    moved = restored.rename(tmp_path / "moved")
    assert run_cli("restore", moved).returncode == 0
    done = run_cli("restore", "--deep", moved)
    assert done.returncode == 0, done.stderr
    assert (moved / "runtime/a/lib/cfg.txt").read_text() == f"home = {moved / 'runtime/a'}\n"
    assert run_cli("verify", moved).returncode == 0


# -- L3: with the receipt lost, a runtime target's local edits are refused and named, as the README says -----------


def test_a_lost_receipt_and_an_edited_runtime_file_is_refused_naming_it(restored):
    """It was overwritten without a word (exit 0)."""
    (restored / ".portable" / "receipt.json").unlink()
    edited = restored / "runtime" / "b" / "share" / "f1.txt"
    edited.write_text("MY EDIT\n")
    done = run_cli("restore", restored)
    assert done.returncode == 4, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0] == (
        "error: runtime/b: restore would replace this layer target, and 1 file(s) in it are not ones restore "
        "wrote there (share/f1.txt)"
    )
    hint = f"hint: save any edits of yours elsewhere, move your files out of {restored / 'runtime/b'} "
    assert lines[1].startswith(hint)
    assert edited.read_text() == "MY EDIT\n"
    assert not (restored / ".portable" / "staging").exists()
    edited.unlink()  # the way out the hint gives: the file goes, restore puts the bundle's back
    done = run_cli("restore", restored)
    assert done.returncode == 0, done.stderr
    assert edited.read_bytes() == b"b 1\n" * 20


def test_a_lost_receipt_over_unedited_targets_restores_them_again(restored):
    """No edit: every file matches the bundle's (those relocation rewrote are not compared), exit 0."""
    (restored / ".portable" / "receipt.json").unlink()
    before = tree_snapshot(restored / "runtime")
    done = run_cli("restore", restored)
    assert done.returncode == 0, done.stderr
    assert "extracted source/proj, runtime/a, runtime/b" in done.stderr
    assert tree_snapshot(restored / "runtime") == before


def test_a_folder_of_ones_own_at_a_runtime_target_with_the_layers_file_names_is_refused(packed, tmp_path):
    """Same names as the layer's files, other bytes: it was replaced silently."""
    bundle = tmp_path / "b"
    shutil.copytree(packed, bundle, symlinks=True)
    write_tree(bundle / "runtime" / "b", {"share/f0.txt": b"mine\n"})
    done = run_cli("restore", bundle)
    assert done.returncode == 4, done.stderr
    assert "error: runtime/b: restore would replace this layer target, and 1 file(s) in it are not ones " in done.stderr
    assert "(share/f0.txt)" in done.stderr
    assert (bundle / "runtime" / "b" / "share" / "f0.txt").read_bytes() == b"mine\n"


# -- L8: a copy that resets every mtime (`cp -r`) is no local edit: the recorded digest decides -------------------


def _copy_resetting_mtimes(restored, tmp_path):
    """`cp -r`: every file gets a new mtime; .portable/receipt.json travels with the tree."""
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(restored), str(copy)], check=True, timeout=60)
    for path in copy.rglob("*"):
        if path.is_file() and not path.is_symlink():
            os.utime(path, ns=(1_000_000_000, 1_000_000_000))  # unmistakably another time than the receipt's
    return copy


@pytest.mark.parametrize("deep", [False, True])
def test_byte_identical_source_files_after_a_copy_are_not_locally_edited(restored, tmp_path, deep):
    """`restore` (and `--deep`, which rehashed them) said "kept 2 locally edited file(s) in source/proj" for ever."""
    copy = _copy_resetting_mtimes(restored, tmp_path)
    done = run_cli("restore", *(["--deep"] if deep else []), copy)
    assert done.returncode == 0, done.stderr
    assert "locally edited" not in done.stderr
    assert "unchanged source/proj" in done.stderr
    receipt = json.loads((copy / ".portable" / "receipt.json").read_text())
    files = receipt["layers"]["source/proj.tar.zst"]["files"]
    assert files["a.py"] == [6, os.stat(copy / "source/proj/a.py").st_mtime_ns]  # the stat refreshed, saved
    again = run_cli("restore", copy)
    assert again.returncode == 0 and "unchanged source/proj, runtime/a, runtime/b" in again.stderr, again.stderr


def test_an_edit_after_a_copy_is_still_an_edit(restored, tmp_path):
    copy = _copy_resetting_mtimes(restored, tmp_path)
    (copy / "source/proj/b.py").write_text("w = 3\n")
    done = run_cli("restore", copy)
    assert done.returncode == 0, done.stderr
    assert "kept 1 locally edited file(s) in source/proj: b.py" in done.stderr
    assert (copy / "source/proj/b.py").read_text() == "w = 3\n"


def test_an_update_after_a_copy_is_not_refused_for_byte_identical_source_files(restored, packed, tmp_path):
    """A newer bundle brought into the copy: 'restore would replace this layer target, and 2 file(s) in it are not
    ones restore wrote there (a.py, b.py)', exit 4."""
    copy = _copy_resetting_mtimes(restored, tmp_path)
    data = json.loads((copy / "bundle.json").read_text())
    layers = {x["target"]: x for x in data["layers"]}
    src = tmp_path / "v2" / "src"
    write_tree(src / "proj", {"a.py": b"v = 2\n"})  # b.py dropped, a.py changed
    shutil.copytree(restored / "runtime/a", src / "rtA", symlinks=True)
    shutil.copytree(restored / "runtime/b", src / "rtB", symlinks=True)
    (tmp_path / "v2" / "s.toml").write_text(SPEC.replace("relocatable = true\n", ""), encoding="utf-8")
    pack_bundle(tmp_path / "v2" / "s.toml", tmp_path / "v2" / "B", ui=QUIET)
    assert layers["source/proj"]["archive"] == "source/proj.tar.zst"
    (copy / "bundle.json").unlink()
    for folder in ("source", "runtime"):
        for p in (copy / folder).iterdir():
            if p.is_file():
                p.unlink()
    shutil.copytree(tmp_path / "v2" / "B", copy, symlinks=True, dirs_exist_ok=True)
    done = run_cli("restore", copy)
    assert done.returncode == 0, done.stderr
    assert (copy / "source/proj/a.py").read_text() == "v = 2\n"
    assert not (copy / "source/proj/b.py").exists()


def test_an_update_after_a_copy_replaces_runtime_files_the_new_bundle_changed(restored, tmp_path):
    """review62 R1: after `cp -r` (every mtime new, the receipt intact), an update whose runtime layer changed was
    refused, "runtime/b: restore would replace this layer target, and 5 file(s) in it are not ones restore wrote
    there", exit 4, even under --refresh-source: runtime files carry no digests, and L3's comparison (meant for a
    lost receipt) ran under a receipt that records the target. At fc528c2 and now: the update goes through."""
    copy = _copy_resetting_mtimes(restored, tmp_path)
    src = tmp_path / "v2" / "src"
    write_tree(src / "proj", {"a.py": b"v = 1\n", "b.py": b"w = 2\n"})
    shutil.copytree(restored / "runtime/a", src / "rtA", symlinks=True)
    write_tree(src / "rtB", {f"share/f{i}.txt": f"b {i} v2\n".encode() * 20 for i in range(6)})  # changed, + f5
    (tmp_path / "v2" / "s.toml").write_text(SPEC.replace("relocatable = true\n", ""), encoding="utf-8")
    pack_bundle(tmp_path / "v2" / "s.toml", tmp_path / "v2" / "B", ui=QUIET)
    (copy / "bundle.json").unlink()
    for folder in ("source", "runtime"):
        for p in (copy / folder).iterdir():
            if p.is_file():
                p.unlink()
    shutil.copytree(tmp_path / "v2" / "B", copy, symlinks=True, dirs_exist_ok=True)
    done = run_cli("restore", copy)
    assert done.returncode == 0, done.stderr
    assert (copy / "runtime/b/share/f0.txt").read_bytes() == b"b 0 v2\n" * 20
    assert (copy / "runtime/b/share/f5.txt").exists()
