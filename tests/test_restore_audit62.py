"""Audit62: restores killed part-way through an update, and relocation of binary files it cannot rewrite safely.

M1: an update restore killed (SIGKILL) after it saved the receipt but before every target was swapped left
targets with no record in the receipt, so every later restore refused the old tree's files as "not ones restore
wrote there" (exit 4). The next restore must finish the job.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from bundlekit import QUIET, REPO, run_cli, tree_snapshot, write_tree

from reproduction.release.pack import pack_bundle

SPEC = """name = "up"
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

# SIGKILL itself at the Nth call of restore's swap_into_place, before or after the swap (argv: bundle, N, when).
KILL_AT_SWAP = """
import os, signal, sys
import reproduction.release.restore as R
nth, when, calls, real = int(sys.argv[2]), sys.argv[3], [], R.swap_into_place
def swap(*args, **kwargs):
    calls.append(1)
    if len(calls) == nth and when == "before":
        os.kill(os.getpid(), signal.SIGKILL)
    out = real(*args, **kwargs)
    if len(calls) == nth and when == "after":
        os.kill(os.getpid(), signal.SIGKILL)
    return out
R.swap_into_place = swap
from reproduction.portable import main
sys.exit(main(["restore", sys.argv[1]]))
"""


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("upd")
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


@pytest.mark.parametrize("nth,when", [(1, "before"), (1, "after"), (2, "after")])
def test_an_update_killed_between_its_swaps_is_finished_by_the_next_restore(packed, tmp_path, nth, when):
    d = tmp_path / "D"
    shutil.copytree(packed["1"], d, symlinks=True)
    assert run_cli("restore", d).returncode == 0
    _bring_v2(d, packed)
    env = {**os.environ, "PYTHONPATH": str(REPO), "PORTABLE_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1"}
    killed = subprocess.run(
        [sys.executable, "-c", KILL_AT_SWAP, str(d), str(nth), when], env=env, capture_output=True, timeout=120
    )
    assert killed.returncode == -9, killed.stderr
    receipt = json.loads((d / ".portable/receipt.json").read_text())
    assert run_cli("verify", d).returncode == 0  # the bundle's own files are intact; restore agrees below

    done = run_cli("restore", d)
    assert done.returncode == 0, done.stderr  # was 4: "... not ones restore wrote there (common.py, onlyA.py)"
    assert not receipt["layers"]  # the killed restore's receipt vouched for nothing being replaced ...
    assert sorted(receipt["replacing"]) == ["runtime/rt.tar.zst", "source/app.tar.zst"]  # ... but knew the files
    assert "overwrote" not in done.stderr and "kept" not in done.stderr, done.stderr
    assert {t: tree_snapshot(d / t) for t in TARGETS} == packed["fresh"]
    assert "replacing" not in json.loads((d / ".portable/receipt.json").read_text())
    again = run_cli("restore", d)  # and the receipt now vouches for v2's trees
    assert again.returncode == 0 and "extracted" not in again.stderr, again.stderr


def test_a_file_edited_after_the_kill_is_still_refused(packed, tmp_path):
    """The killed restore's old records count a file as restore's own only while it is as restore wrote it."""
    d = tmp_path / "D"
    shutil.copytree(packed["1"], d, symlinks=True)
    assert run_cli("restore", d).returncode == 0
    _bring_v2(d, packed)
    env = {**os.environ, "PYTHONPATH": str(REPO), "PORTABLE_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1"}
    killed = subprocess.run(
        [sys.executable, "-c", KILL_AT_SWAP, str(d), "1", "before"], env=env, capture_output=True, timeout=120
    )
    assert killed.returncode == -9, killed.stderr
    (d / "source/app/onlyA.py").write_bytes(b"mine\n")
    done = run_cli("restore", d)
    assert done.returncode == 4, done.stderr
    assert done.stderr.splitlines()[0] == (
        "error: source/app: restore would replace this layer target, and 1 file(s) in it are not ones restore "
        "wrote there (onlyA.py)"
    )
    assert (d / "source/app/onlyA.py").read_bytes() == b"mine\n"


# -- M3: relocation rewrites a build prefix in place only in a format made of C strings --------------------


@pytest.mark.parametrize("where", ["shorter", "longer"])
def test_a_pickle_holding_the_build_prefix_is_left_intact_and_named(tmp_path, where):
    """The pickle's string was shifted and NUL-padded as if a C string (exit 0, no note, pickle.load failed);
    a longer bundle path was refused (exit 9) for a "C string" that is none. Now it is kept, and named."""
    import pickle

    src = tmp_path / ("build" + "x" * 40) / "src" / "rt"
    value = {"path": f"home={src}/lib/data", "n": [0, 1, 2, 3, 4]}  # "home=": a length byte that is a letter hides it
    files = {"lib/cache.pkl": pickle.dumps(value, protocol=4), "lib/cfg.txt": f"home = {src}\n".encode()}
    if where == "shorter":  # a longer path than the build prefix would not fit an ELF file's C string (exit 9)
        files["lib/libx.so"] = b"\x7fELF\x02\x01\x01\0" + f"{src}/lib\0".encode() + b"tail\0"
    write_tree(src, files)
    (src.parent.parent / "r.toml").write_text(
        'name = "r"\nroot = "src"\n[[layer]]\nsource = "rt"\nkind = "runtime"\nrelocatable = true\n'
    )
    pack_bundle(src.parent.parent / "r.toml", src.parent.parent / "bundle", ui=QUIET)
    bundle = tmp_path / ("b" if where == "shorter" else "b" * 80) / "bundle"
    shutil.copytree(src.parent.parent / "bundle", bundle, symlinks=True)
    shutil.rmtree(src.parent.parent)  # the build folder is gone, as on another machine

    done = run_cli("restore", bundle)
    assert done.returncode == 0, done.stderr
    tree = bundle / "runtime" / "rt"
    assert pickle.loads((tree / "lib/cache.pkl").read_bytes()) == value  # was: UnicodeDecodeError
    lines = done.stderr.splitlines()
    assert (
        "warning: relocation left 1 binary file(s) as they were, still naming the folder they were built in: "
        "runtime/rt/lib/cache.pkl (neither ELF nor a static library, so the path in them cannot be rewritten in "
        "place without corrupting them; rebuild them where they now are, or pack the layer without them)"
    ) in lines, done.stderr
    assert (tree / "lib/cfg.txt").read_text() == f"home = {tree}\n"  # text relocation as before
    if where == "shorter":  # an ELF file's C strings still are rewritten in place
        assert f"{tree}/lib\0".encode() in (tree / "lib/libx.so").read_bytes()
    assert run_cli("verify", bundle).returncode == 0

    moved = bundle.rename(bundle.parent / "m")  # relocating again names it again, and still keeps it intact
    again = run_cli("restore", moved)
    assert again.returncode == 0, again.stderr
    assert "runtime/rt/lib/cache.pkl (neither ELF" in again.stderr
    assert pickle.loads((moved / "runtime/rt/lib/cache.pkl").read_bytes()) == value


def test_pack_names_the_binary_files_relocation_will_leave(tmp_path, capsys):
    import pickle

    from reproduction.ui import UiOptions

    src = tmp_path / "src" / "rt"
    write_tree(
        src,
        {
            "lib/cache.pkl": pickle.dumps({"p": f"home={src}/x"}),
            "lib/libx.so": b"\x7fELF\x02\x01\x01\0" + f"{src}/lib\0".encode(),
            "lib/libx.a": b"!<arch>\n" + f"{src}/lib\0".encode(),
            "lib/cfg.txt": f"{src}\n".encode(),
        },
    )
    (tmp_path / "r.toml").write_text(
        'name = "r"\nroot = "src"\n[[layer]]\nsource = "rt"\nkind = "runtime"\nrelocatable = true\n'
    )
    capsys.readouterr()
    pack_bundle(tmp_path / "r.toml", tmp_path / "bundle", ui=UiOptions(progress=False))
    err = capsys.readouterr().err
    assert (
        "warning: layer runtime/rt.tar.zst: 1 binary file(s) hold a build prefix that restore cannot rewrite "
        "(neither ELF nor a static library), so they will keep naming the build folder: lib/cache.pkl\n"
    ) in err, err


# -- L5, L6, L7 -------------------------------------------------------------------------------------------


def test_a_receipt_that_is_a_folder_is_refused_up_front_with_remove_it(packed, tmp_path):
    """L5: restore extracted everything, then failed at its last write (exit 8, "free some space"), every time."""
    d = tmp_path / "D"
    shutil.copytree(packed["1"], d, symlinks=True)
    (d / ".portable" / "receipt.json").mkdir(parents=True)
    done = run_cli("restore", d)
    assert done.returncode == 6, done.stderr
    receipt = d / ".portable" / "receipt.json"
    assert done.stderr.splitlines() == [
        f"error: {receipt} is a folder, where the restore receipt (a file) goes: refusing to restore",
        f"hint: remove it (`rm -r {receipt}`: the receipt is the tool's own file) and run the command again",
    ]
    assert not any((d / t).exists() for t in TARGETS)
    receipt.rmdir()
    assert run_cli("restore", d).returncode == 0


@pytest.mark.parametrize("field", ["mode", "size"])
def test_an_index_differing_in_mode_or_size_names_the_field_and_both_values(tmp_path, field):
    """L6: "member 'd/b' is not what its member index lists next ('d/b')" named the same member twice."""
    from test_archive_safety import _packed_with_index, _repin

    from reproduction.errors import UnsafeArchiveError
    from reproduction.release.restore import restore_bundle

    bundle = _packed_with_index(tmp_path)
    index = bundle / "runtime" / "rt.members.json"
    data = json.loads(index.read_text())
    row = next(m for m in data["members"] if m[1] == "file" and m[3] > 0)
    mode, size = row[2], row[3]
    if field == "mode":
        row[2] = 0o600 if mode != 0o600 else 0o640
        says = f"its mode is {row[2]:o} in the index and {mode:o} in the archive"
    else:  # smaller: a larger size is refused before extraction (more than the layer's unpacked_size)
        row[3] = size - 1
        says = f"its size is {size - 1} bytes in the index and {size} bytes in the archive"
    index.write_text(json.dumps(data))
    _repin(bundle, "runtime/rt.members.json")
    with pytest.raises(UnsafeArchiveError) as info:
        restore_bundle(bundle, ui=QUIET)
    assert str(info.value).startswith(
        f"runtime/rt.tar.zst: member {row[0]!r} is not what its member index lists next (the same name, but {says}): "
    ), str(info.value)


@pytest.mark.parametrize("own", [True, False])
def test_a_member_index_that_is_a_layer_archive_is_refused_by_verify_and_restore_alike(packed, tmp_path, own):
    """L7: verify said "all match" (exit 0) where restore refused the index as unreadable (exit 4)."""
    d = tmp_path / "D"
    shutil.copytree(packed["1"], d, symlinks=True)
    data = json.loads((d / "bundle.json").read_text())
    i = next(i for i, x in enumerate(data["layers"]) if x["target"] == "runtime/rt")
    other = next(x["archive"] for x in data["layers"] if x["target"] != "runtime/rt")
    index = data["layers"][i]["archive"] if own else other
    data["layers"][i]["members_index"] = index
    (d / "bundle.json").write_text(json.dumps(data))
    for command in ("verify", "restore"):
        done = run_cli(command, d)
        assert done.returncode == 4, (command, done.stderr)
        assert done.stderr.splitlines()[0] == (
            f"error: layers[{i}].members_index {index!r} is a layer archive, not a member index"
        ), (command, done.stderr)
    assert not any((d / t).exists() for t in TARGETS)
