"""Regression tests for the audit of restored trees (audit45): what a restored layer target may have become
since, and what modes restore gives it. Each test names the finding it pins and failed before its fix.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import threading

import pytest
from bundlekit import QUIET, forge_bundle, member, run_cli, small_bundle, tree_snapshot, write_tree

from reproduction.errors import UnsafeArchiveError
from reproduction.release.manifest import PrefixOccurrence
from reproduction.release.pack import pack_bundle
from reproduction.release.receipt import LayerReceipt
from reproduction.release.relocate import relocate_tree
from reproduction.release.restore import restore_bundle

RELOCATABLE_SPEC = """\
name = "reloc"
root = "src"

[[layer]]
source = "rt"
kind = "runtime"
name = "rt"
relocatable = true
"""


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return small_bundle(tmp_path_factory.mktemp("tree"))


@pytest.fixture
def bundle(packed, tmp_path):
    out = tmp_path / "case" / "bundle"
    shutil.copytree(packed, out, symlinks=True)
    return out


def _restore(bundle, path: str):
    """`portable restore` by the no-change fast path (plain argv) or the full path (--jobs 1 skips it)."""
    done = run_cli("restore", bundle) if path == "fast" else run_cli("restore", "--jobs", "1", bundle)
    assert done.returncode == 0, done.stderr
    return done.stderr


def _link_out(folder, outside) -> None:
    """Move `folder` (mtimes kept) to `outside` and leave a symlink to it: the same files, sizes and mtimes."""
    outside.parent.mkdir(parents=True, exist_ok=True)
    os.rename(folder, outside)
    os.symlink(outside, folder)


# -- F1: a folder of a restored target swapped for a symlink ---------------------------------------


@pytest.mark.parametrize("path", ["fast", "full"])
def test_a_runtime_folder_swapped_for_a_link_is_extracted_again(bundle, tmp_path, path):
    restore_bundle(bundle, ui=QUIET)
    _link_out(bundle / "runtime" / "rt" / "lib", tmp_path / "outside" / "lib")
    before = tree_snapshot(tmp_path / "outside")
    assert "extracted runtime/rt" in _restore(bundle, path)
    lib = bundle / "runtime" / "rt" / "lib"
    assert stat.S_ISDIR(os.lstat(lib).st_mode) and (lib / "python" / "site.py").read_bytes() == b"import os\n" * 100
    assert tree_snapshot(tmp_path / "outside") == before
    assert "unchanged source/project, runtime/rt" in _restore(bundle, path)  # and then it is the bundle's again


@pytest.mark.parametrize("path", ["fast", "full"])
def test_a_source_folder_swapped_for_a_link_is_named_as_an_edit(bundle, tmp_path, path):
    restore_bundle(bundle, ui=QUIET)
    _link_out(bundle / "source" / "project" / "recap" / "stages", tmp_path / "outside" / "stages")
    said = _restore(bundle, path)
    assert "kept 1 locally edited file(s) in source/project: recap/stages " in said, said


def _relocatable(tmp_path):
    src = tmp_path / "src" / "rt"
    write_tree(src, {"etc/conf.txt": f"home={src}/share\n".encode(), "bin/tool": b"#!/bin/sh\necho tool\n"})
    (tmp_path / "spec.toml").write_text(RELOCATABLE_SPEC, encoding="utf-8")
    bundle = tmp_path / "bundle"
    pack_bundle(tmp_path / "spec.toml", bundle, ui=QUIET)
    return bundle


@pytest.mark.parametrize("path", ["fast", "full"])
def test_a_runtime_empty_folder_deleted_by_hand_is_extracted_again(tmp_path, path):
    """Before (left as found at stop 45): an empty folder the archive lists had no file whose absence would tell, so
    its deletion was "unchanged" and the runtime stayed without it (a runtime may need its empty `var/run/`)."""
    src = tmp_path / "src" / "rt"
    write_tree(src, {"bin/tool": b"#!/bin/sh\necho tool\n"})
    (src / "var" / "run").mkdir(parents=True)
    (tmp_path / "spec.toml").write_text(RELOCATABLE_SPEC.replace("relocatable = true\n", ""), encoding="utf-8")
    bundle = tmp_path / "bundle"
    pack_bundle(tmp_path / "spec.toml", bundle, ui=QUIET)
    restore_bundle(bundle, ui=QUIET)
    empty = bundle / "runtime" / "rt" / "var" / "run"
    assert empty.is_dir()
    empty.rmdir()
    assert "extracted runtime/rt" in _restore(bundle, path)
    assert empty.is_dir() and not os.listdir(empty)
    assert "unchanged runtime/rt" in _restore(bundle, path)


def test_relocation_after_a_move_never_writes_through_a_linked_folder(tmp_path):
    bundle = _relocatable(tmp_path)
    restore_bundle(bundle, ui=QUIET)
    outside = tmp_path / "outside" / "etc"
    _link_out(bundle / "runtime" / "rt" / "etc", outside)
    before = tree_snapshot(outside)
    moved = tmp_path / "moved"
    os.rename(bundle, moved)
    done = run_cli("restore", moved)
    assert done.returncode == 0, done.stderr
    assert tree_snapshot(outside) == before  # the copy outside still names the old bundle
    conf = moved / "runtime" / "rt" / "etc" / "conf.txt"
    assert not os.path.islink(conf.parent) and conf.read_text() == f"home={moved}/runtime/rt/share\n"


def test_relocate_tree_refuses_a_linked_folder_before_writing_anything(tmp_path):
    root, outside = tmp_path / "tree", tmp_path / "outside"
    write_tree(root, {"bin/tool": b"#!/old/p/bin/sh\n"})
    write_tree(outside, {"etc/conf.txt": b"home=/old/p/share\n"})
    os.symlink(outside / "etc", root / "etc")
    occ = [PrefixOccurrence(path="bin/tool", mode="text"), PrefixOccurrence(path="etc/conf.txt", mode="text")]
    with pytest.raises(UnsafeArchiveError) as err:
        relocate_tree(root, occ, "/old/p", "/new/p", fsync=False)
    assert err.value.exit_code == 6 and "its folder etc (above etc/conf.txt) is a symlink" in str(err.value)
    assert (outside / "etc" / "conf.txt").read_bytes() == b"home=/old/p/share\n"
    assert (root / "bin" / "tool").read_bytes() == b"#!/old/p/bin/sh\n"  # nothing was changed


# -- F4: `restore --deep` over a source file replaced by a FIFO or a link to a device ---------------


@pytest.mark.parametrize("kind", ["fifo", "devzero"])
def test_deep_restore_names_a_file_replaced_by_a_fifo_or_a_device_link_and_finishes(bundle, kind):
    restore_bundle(bundle, ui=QUIET)
    victim = bundle / "source" / "project" / "recap" / "stages" / "returns.py"
    victim.unlink()
    if kind == "fifo":
        os.mkfifo(victim)
    else:
        os.symlink("/dev/zero", victim)
    done = run_cli("restore", "--deep", bundle, timeout=60)  # it hung for ever before
    assert done.returncode == 0, done.stderr
    assert "kept 1 locally edited file(s) in source/project: recap/stages/returns.py " in done.stderr


def test_changed_contents_never_opens_what_is_not_a_regular_file(tmp_path):
    root = tmp_path / "tree"
    write_tree(root, {"a.txt": b"a\n", "b.txt": b"b\n"})
    digest = {"a.txt": hashlib.sha256(b"a\n").hexdigest(), "b.txt": hashlib.sha256(b"b\n").hexdigest()}
    (root / "a.txt").unlink()
    os.mkfifo(root / "a.txt")
    (root / "b.txt").unlink()
    os.symlink("/dev/zero", root / "b.txt")
    rec = LayerReceipt(sha256="0" * 64, target="t", prefix=str(root), digests=digest)
    found: list[list[str]] = []
    worker = threading.Thread(target=lambda: found.append(rec.changed_contents(root)), daemon=True)
    worker.start()
    worker.join(20)  # a plain open() blocks on the FIFO, and reads /dev/zero for ever
    assert found == [["a.txt", "b.txt"]]


# -- F7: archive modes never override the umask -----------------------------------------------------


def _restore_with_umask(bundle, mask: int, *args: str) -> str:
    done = run_cli("restore", *args, bundle, preexec_fn=lambda: os.umask(mask))
    assert done.returncode == 0, done.stderr
    return done.stderr


def _modes(root, rels) -> dict[str, int]:
    return {rel: os.lstat(root / rel).st_mode & 0o7777 for rel in rels}


@pytest.mark.parametrize(("mask", "want"), [(0o022, (0o755, 0o644, 0o755)), (0o077, (0o700, 0o600, 0o700))])
def test_modes_are_the_archives_less_the_umask_and_a_restored_tree_stays_unchanged(tmp_path, mask, want):
    src = tmp_path / "src" / "rt"
    write_tree(src, {"bin/tool": b"#!/bin/sh\n", "lib/x.py": b"x = 1\n"}, modes={"bin/tool": 0o777, "lib/x.py": 0o666})
    os.chmod(src / "lib", 0o777)
    (tmp_path / "spec.toml").write_text(RELOCATABLE_SPEC, encoding="utf-8")
    bundle = tmp_path / "bundle"
    pack_bundle(tmp_path / "spec.toml", bundle, ui=QUIET)
    assert "extracted runtime/rt" in _restore_with_umask(bundle, mask)
    assert tuple(_modes(bundle / "runtime" / "rt", ["bin/tool", "lib/x.py", "lib"]).values()) == want
    assert "unchanged runtime/rt" in _restore_with_umask(bundle, mask)  # the fast path
    assert "unchanged runtime/rt" in _restore_with_umask(bundle, mask, "--jobs", "1")  # the full path


@pytest.mark.parametrize(("mask", "want"), [(0o022, 0o1755), (0o002, 0o1775), (0, 0o1777)])
def test_a_sticky_folder_keeps_its_sticky_bit_under_the_umask(tmp_path, mask, want):
    members = [member("tmp", "dir", mode=0o1777), member("tmp/a", data=b"a")]
    bundle = forge_bundle(tmp_path / "b", [("runtime/py.tar.zst", "runtime/py", "runtime", members)])
    _restore_with_umask(bundle, mask)
    assert _modes(bundle / "runtime" / "py", ["tmp"]) == {"tmp": want}
