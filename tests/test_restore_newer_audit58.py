"""Audit58 A2: a newer bundle whose file list changed, restored over an older restore in the same folder.

What `portable fetch` of a new revision into an earlier fetch's folder leaves: v2's bundle files over v1's
restored trees and receipt. The files v1's restore wrote and nobody touched are restore's own (README: only
files "restore did not write there" are refused); a hand-edited one is still refused or kept as before.
"""

from __future__ import annotations

import os
import shutil

import pytest
from bundlekit import QUIET, run_cli, tree_snapshot, write_tree

from reproduction.release.pack import pack_bundle

SPEC = """name = "sw"
root = "src{v}"
[[layer]]
source = "app"
kind = "source"
name = "app"
[[layer]]
source = "rt"
kind = "runtime"
name = "rt"
"""
V1 = {"app/common.py": b"a1\n", "app/onlyA.py": b"onlyA\n", "rt/lib/r.txt": b"ra\n", "rt/lib/onlyA.so": b"rA\n"}
V2 = {"app/common.py": b"b1\n", "app/onlyB.py": b"onlyB\n", "rt/lib/r.txt": b"rb\n"}
TARGETS = ("source/app", "runtime/rt")


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("newer")
    out = {}
    for v, files in (("1", V1), ("2", V2)):
        write_tree(root / f"src{v}", files)
        (root / f"v{v}.toml").write_text(SPEC.format(v=v), encoding="utf-8")
        pack_bundle(root / f"v{v}.toml", root / f"B{v}", ui=QUIET)
        out[v] = root / f"B{v}"
    fresh = root / "fresh2"
    shutil.copytree(out["2"], fresh, symlinks=True)
    assert run_cli("restore", fresh).returncode == 0
    out["fresh"] = {t: tree_snapshot(fresh / t) for t in TARGETS}
    return out


@pytest.fixture
def restored_v1(packed, tmp_path):
    d = tmp_path / "D"
    shutil.copytree(packed["1"], d, symlinks=True)
    done = run_cli("restore", d)
    assert done.returncode == 0, done.stderr
    return d


def _bring_v2(d, packed) -> None:
    """Swap v1's bundle files for v2's, leaving the restored trees and .portable (as a fetch would)."""
    shutil.rmtree(d / "reproduction")
    shutil.rmtree(d / "LICENSES", ignore_errors=True)
    (d / "bundle.json").unlink()
    for folder in ("source", "runtime"):
        for p in (d / folder).iterdir():
            if p.is_file():
                p.unlink()
    shutil.copytree(packed["2"], d, symlinks=True, dirs_exist_ok=True)


def _error(done, code: int) -> str:
    lines = done.stderr.splitlines()
    assert done.returncode == code, done.stderr
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("hint: "), done.stderr
    return lines[0]


@pytest.mark.parametrize("flags", [(), ("--refresh-source",)])
def test_a_newer_bundle_with_a_changed_file_list_restores_over_the_older_restore(restored_v1, packed, flags):
    _bring_v2(restored_v1, packed)
    done = run_cli("restore", *flags, restored_v1)
    assert done.returncode == 0, done.stderr
    assert {t: tree_snapshot(restored_v1 / t) for t in TARGETS} == packed["fresh"]
    assert not (restored_v1 / "source/app/onlyA.py").exists()
    assert not (restored_v1 / "runtime/rt/lib/onlyA.so").exists()
    assert "overwrote" not in done.stderr and "kept" not in done.stderr
    again = run_cli("restore", restored_v1)  # and the receipt now vouches for v2's trees
    assert again.returncode == 0 and "extracted" not in again.stderr, again.stderr


@pytest.mark.parametrize("rel", ["onlyA.py", "common.py"])
def test_a_hand_edited_source_file_is_still_refused_then_overwritten_with_refresh_source(restored_v1, packed, rel):
    path = restored_v1 / "source/app" / rel
    path.write_bytes(b"mine\n")
    _bring_v2(restored_v1, packed)
    before = tree_snapshot(restored_v1 / "source/app")
    line = _error(run_cli("restore", restored_v1), 4)
    assert line == (
        "error: source/app: restore would replace this layer target, and 1 file(s) in it are not ones restore "
        f"wrote there ({rel})"
    )
    assert tree_snapshot(restored_v1 / "source/app") == before
    done = run_cli("restore", "--refresh-source", restored_v1)
    assert done.returncode == 0, done.stderr
    assert f"--refresh-source overwrote 1 locally edited file(s) in source/app: {rel}" in done.stderr
    assert {t: tree_snapshot(restored_v1 / t) for t in TARGETS} == packed["fresh"]


def test_a_source_edit_that_keeps_size_and_mtime_is_caught_by_its_digest(restored_v1, packed):
    path = restored_v1 / "source/app/onlyA.py"
    st = os.stat(path)
    path.write_bytes(b"MINE!\n")  # same size as "onlyA\n"
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    _bring_v2(restored_v1, packed)
    assert _error(run_cli("restore", restored_v1), 4).endswith(
        "1 file(s) in it are not ones restore wrote there (onlyA.py)"
    )
    assert path.read_bytes() == b"MINE!\n"


@pytest.mark.parametrize("edit", ["edited", "added"])
def test_a_runtime_target_holding_a_file_restore_did_not_write_is_still_refused(restored_v1, packed, edit):
    rel = "lib/onlyA.so" if edit == "edited" else "lib/mine.txt"
    (restored_v1 / "runtime/rt" / rel).write_bytes(b"my own bytes\n")
    _bring_v2(restored_v1, packed)
    before = tree_snapshot(restored_v1 / "runtime/rt")
    for flags in ((), ("--refresh-source",)):
        line = _error(run_cli("restore", *flags, restored_v1), 4)
        assert line == (
            "error: runtime/rt: restore would replace this layer target, and 1 file(s) in it are not ones restore "
            f"wrote there ({rel})"
        )
        assert tree_snapshot(restored_v1 / "runtime/rt") == before


RELOC_SPEC = """name = "sw"
root = "src{v}"
[[layer]]
source = "rt"
kind = "runtime"
name = "rt"
relocatable = true
build_prefix = "/build/rt"
[[layer]]
source = "app"
kind = "source"
name = "app"
relocatable = true
build_prefix = "/build/app"
"""


@pytest.mark.parametrize("moved", [False, True])
def test_a_source_file_the_older_restore_relocated_is_restores_own(tmp_path, moved):
    """review58 R2: the receipt kept a relocated source file's digest as extracted, so once a newer bundle dropped
    it (v1's env.sh names the runtime's build prefix) it was "not one restore wrote there", exit 4; also after the
    bundle folder moved between the restores (its prefix rewritten again)."""
    for v, extra in (("1", {"app/env.sh": b"RT=/build/rt/bin/tool\n"}), ("2", {})):
        write_tree(tmp_path / f"src{v}", {"app/common.py": f"common {v}\n".encode(), "rt/bin/tool": b"/build/rt/lib\n"})
        write_tree(tmp_path / f"src{v}", extra)
        (tmp_path / f"v{v}.toml").write_text(RELOC_SPEC.format(v=v), encoding="utf-8")
        pack_bundle(tmp_path / f"v{v}.toml", tmp_path / f"B{v}", ui=QUIET)
    d = tmp_path / "D"
    shutil.copytree(tmp_path / "B1", d, symlinks=True)
    assert run_cli("restore", d).returncode == 0
    assert (d / "source/app/env.sh").read_text() == f"RT={d}/runtime/rt/bin/tool\n"
    if moved:
        d = d.rename(tmp_path / "moved")
    _bring_v2(d, {"2": tmp_path / "B2"})
    done = run_cli("restore", d)
    assert done.returncode == 0, done.stderr
    assert not (d / "source/app/env.sh").exists()
    assert (d / "source/app/common.py").read_text() == "common 2\n"
    assert (d / "runtime/rt/bin/tool").read_text() == f"{d}/runtime/rt/lib\n"
