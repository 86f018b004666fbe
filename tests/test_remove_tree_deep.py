"""remove_tree removes trees of any depth without recursion (audit48 F9: a ~1100-deep staging leftover made every
later restore exit 1 with RecursionError), with at most a few folders open, and never leaves the tree it started in.

Every deep tree here is built and, when a test fails, removed through folder descriptors one level at a time: its
paths are longer than PATH_MAX, and pytest's own clean-up of old temp folders is a recursive rmtree that such a tree
would crash in a later session.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from bundlekit import REPO, run_cli, small_bundle

from reproduction import fsio
from reproduction.fsio import remove_tree

DEPTH = 1500
NAME = "dir"  # 1500 * len("dir/") = 6000 bytes: deeper than any path the OS takes whole (PATH_MAX 4096)
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


def build_deep(root, depth=DEPTH, *, outside=None) -> None:
    """`root`/dir/dir/.../dir (`depth` folders below `root`) with a file every 100 levels and the deepest level, and,
    given `outside`, a symbolic link to it every 250 levels (removing the tree must unlink it, never follow it)."""
    os.mkdir(root)
    fd = os.open(root, _DIR)
    try:
        for level in range(1, depth + 1):
            os.mkdir(NAME, dir_fd=fd)
            deeper = os.open(NAME, _DIR, dir_fd=fd)
            os.close(fd)
            fd = deeper
            if level % 100 == 0 or level == depth:
                os.close(os.open("f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
            if outside is not None and level % 250 == 0:
                os.symlink(outside, "link", dir_fd=fd)
    finally:
        os.close(fd)


def remove_deep(root) -> None:
    """Remove what build_deep made (or what is left of it), without recursion and without long paths."""
    if not os.path.lexists(root):
        return
    fd = os.open(root, _DIR)
    depth = 0
    while True:  # down to the deepest folder there is
        try:
            deeper = os.open(NAME, _DIR, dir_fd=fd)
        except FileNotFoundError:
            break
        os.close(fd)
        fd, depth = deeper, depth + 1
    while True:  # then up, emptying and removing each
        for name in os.listdir(fd):
            os.unlink(name, dir_fd=fd)
        if depth == 0:
            break
        parent = os.open("..", _DIR, dir_fd=fd)
        os.close(fd)
        os.rmdir(NAME, dir_fd=parent)
        fd, depth = parent, depth - 1
    os.close(fd)
    os.rmdir(root)


@pytest.fixture
def outside(tmp_path):
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "x").write_text("mine")
    return keep


def test_remove_tree_removes_a_1500_deep_tree_and_follows_no_link(tmp_path, outside):
    root = tmp_path / "deep"
    build_deep(root, outside=outside)
    try:
        remove_tree(root)
        assert not os.path.lexists(root)
        assert (outside / "x").read_text() == "mine"
    finally:
        remove_deep(root)


def test_remove_tree_holds_only_a_few_folders_open_at_any_depth(tmp_path):
    """A process may hold 1024 descriptors (a common default): one open folder a level would run out of them."""
    root = tmp_path / "deep"
    build_deep(root)
    limit = "import resource; resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))"
    code = f"{limit}; import sys; from reproduction.fsio import remove_tree; remove_tree(sys.argv[1])"
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, str(root)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        assert done.returncode == 0, done.stderr
        assert not os.path.lexists(root)
    finally:
        remove_deep(root)


def test_remove_tree_reopens_closed_parents_for_their_other_folders(tmp_path, monkeypatch):
    """With two folders open at most, every way back up reopens a closed parent through `..`; siblings at every
    level (and read-only folders) are still all removed."""
    monkeypatch.setattr(fsio, "_OPEN_FOLDERS", 2)
    root = tmp_path / "tree"
    for a in "ab":
        for b in "cd":
            for c in "ef":
                leaf = root / a / b / c / "g" / "h"
                leaf.mkdir(parents=True)
                (leaf / "f").write_text("x")
                (root / a / b / "file").write_text("y")
    os.chmod(root / "a" / "c", 0o555)
    remove_tree(root)
    assert not os.path.lexists(root)


def test_a_folder_moved_out_of_the_tree_meanwhile_stops_the_removal_at_its_edge(tmp_path, monkeypatch):
    """A parent reopened through `..` must be the folder it closed: when a folder of the tree was moved elsewhere
    meanwhile, what is above it in its new place is never touched (OSError naming the moved folder)."""
    monkeypatch.setattr(fsio, "_OPEN_FOLDERS", 2)
    root = tmp_path / "tree"
    (root / "a" / "b" / "c" / "d").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "mine.txt").write_text("mine")
    real = fsio._empty_files

    def move_then_empty(stack):
        if stack[-1].name == "d":  # "a" is closed by now; move "b" (with "c" and "d") under another folder
            os.rename(root / "a" / "b", elsewhere / "b")
        real(stack)

    monkeypatch.setattr(fsio, "_empty_files", move_then_empty)
    with pytest.raises(OSError, match="moved while it was being removed") as info:
        remove_tree(root)
    assert info.value.filename == os.path.join(root, "a", "b")
    assert (elsewhere / "mine.txt").read_text() == "mine" and os.listdir(elsewhere / "b") == []
    assert (root / "a").is_dir()


def test_a_deep_staging_leftover_no_longer_wedges_restore(tmp_path):
    """audit48 F9: an older version left a 1100-deep copy in `.portable/staging/`; every restore after it exited 1
    (RecursionError in its clean-up) until the user removed the folder by hand. Now it is removed, and restore
    succeeds."""
    bundle = small_bundle(tmp_path)
    staging = bundle / ".portable" / "staging"
    staging.mkdir(parents=True)
    build_deep(staging / "0")
    try:
        done = run_cli("restore", bundle)
        assert done.returncode == 0, done.stderr
        assert not os.path.lexists(staging)
    finally:
        remove_deep(staging / "0")
    assert (bundle / "runtime" / "rt" / "bin" / "tool").is_file()
