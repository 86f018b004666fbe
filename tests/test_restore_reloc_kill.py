"""A kill -9 during relocation (right after a layer target is swapped in, as a rewritten file is about to be
renamed over the original) leaves nothing inside the restored tree that bundle.json and the receipt do not
know: relocation's temp files live in `.portable/reloc/`, which the next restore removes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from bundlekit import QUIET, REPO, run_cli, tree_snapshot, write_tree

from reproduction.release.pack import pack_bundle
from reproduction.release.restore import restore_bundle

KILL_AT_RELOC_RENAME = """
import os, signal, sys
real = os.replace
def replace(src, dst, *args, **kwargs):
    if str(src).endswith(".reloc"):  # the rewritten file is complete, the rename has not happened
        os.kill(os.getpid(), signal.SIGKILL)
    return real(src, dst, *args, **kwargs)
os.replace = replace
from reproduction.portable import main
sys.exit(main(["restore", sys.argv[1]]))
"""


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """A runtime layer whose scripts hold their build prefix (restore must relocate them)."""
    root = tmp_path_factory.mktemp("reloc")
    src = root / "src" / "rt"
    files = {f"bin/tool{i}": f'#!/bin/sh\nexec "{src}/lib/run{i}.sh" "$@"\n'.encode() for i in range(3)}
    files.update({f"lib/run{i}.sh": b"echo ok\n" for i in range(3)})
    write_tree(src, files, modes=dict.fromkeys(files, 0o755))
    (root / "r.toml").write_text(
        'name = "r"\nroot = "src"\n[[layer]]\nsource = "rt"\nkind = "runtime"\nrelocatable = true\n'
    )
    pack_bundle(root / "r.toml", root / "bundle", ui=QUIET)
    return root / "bundle"


def test_a_kill_between_a_relocated_write_and_its_rename_leaves_no_stray_file_in_the_tree(packed, tmp_path):
    bundle = tmp_path / "moved here"
    shutil.copytree(packed, bundle, symlinks=True)
    reference = tmp_path / "reference"
    shutil.copytree(packed, reference, symlinks=True)
    assert restore_bundle(reference, ui=QUIET).extracted == ["runtime/rt"]
    assert str(reference / "runtime" / "rt") in (reference / "runtime" / "rt" / "bin" / "tool0").read_text()

    env = {**os.environ, "PYTHONPATH": str(REPO), "PORTABLE_NO_PROGRESS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", KILL_AT_RELOC_RENAME, str(bundle)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == -9, done.stderr  # killed at the first rename of a relocated file
    tree = bundle / "runtime" / "rt"
    assert tree.is_dir()  # the target was swapped in
    names = sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*"))
    assert names == sorted(tree_snapshot(reference / "runtime" / "rt")), names  # the tree's files, nothing else
    assert not [n for n in names if n.endswith(".reloc")]
    assert list((bundle / ".portable" / "reloc").iterdir())  # the temp is where restore cleans up

    again = run_cli("restore", bundle)
    assert again.returncode == 0, again.stderr
    assert not (bundle / ".portable" / "reloc").exists()
    assert str(tree) in (tree / "bin" / "tool0").read_text()  # relocated for where it is now
    assert run_cli("verify", bundle).returncode == 0
    assert subprocess.run([str(tree / "bin" / "tool1")], capture_output=True, text=True).stdout == "ok\n"
