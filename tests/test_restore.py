"""`portable restore`: the round trip, skipping via the receipt, --deep, --refresh-source, moves,
Pythons, zstd paths."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from bundlekit import QUIET, RUNTIME_FILES, flip_bit, run_cli, small_bundle, tree_snapshot
from interpreters import find_python, missing_reason

from reproduction.errors import InvalidInputError
from reproduction.release.receipt import load_receipt
from reproduction.release.restore import restore_bundle

ZSTD_DIR = str(Path(shutil.which("zstd") or "/usr/bin/zstd").parent)


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return small_bundle(tmp_path_factory.mktemp("restore"))


@pytest.fixture
def bundle(packed, tmp_path):
    out = tmp_path / "elsewhere" / "bundle"
    shutil.copytree(packed, out, symlinks=True)
    return out


def _expected_source(packed: Path) -> dict:
    snap = tree_snapshot(packed.parent / "src" / "project")
    return {k: v for k, v in snap.items() if "__pycache__" not in k}


def test_round_trip_restores_exact_trees_elsewhere(packed, bundle):
    done = run_cli("restore", script=bundle / "reproduction" / "portable.py")  # BUNDLE defaults to the runner's folder
    assert done.returncode == 0, done.stderr
    assert "extracted source/project, runtime/rt" in done.stderr
    assert tree_snapshot(bundle / "source" / "project") == _expected_source(packed)
    assert tree_snapshot(bundle / "runtime" / "rt") == tree_snapshot(packed.parent / "src" / "runtime")
    assert os.stat(bundle / "runtime" / "rt" / "bin" / "tool").st_mode & 0o777 == 0o755
    assert os.readlink(bundle / "runtime" / "rt" / "bin" / "tool-link") == "tool"
    assert sorted(os.listdir(bundle / ".portable")) == ["lock", "receipt.json"]  # no staging or trash left
    receipt = load_receipt(bundle)
    assert receipt.bundle_path == str(bundle.resolve())
    assert set(receipt.layers) == {"source/project.tar.zst", "runtime/rt.tar.zst"}
    assert receipt.layers["runtime/rt.tar.zst"].files["lib/libthing.so"][0] == len(RUNTIME_FILES["lib/libthing.so"])
    assert run_cli("verify", bundle).returncode == 0


def test_second_restore_skips_by_receipt_and_stat(bundle):
    restore_bundle(bundle, ui=QUIET)
    inode = os.stat(bundle / "runtime" / "rt" / "lib" / "libthing.so").st_ino
    report = restore_bundle(bundle, ui=QUIET)
    assert (report.extracted, report.unchanged) == ([], ["source/project", "runtime/rt"])
    assert os.stat(bundle / "runtime" / "rt" / "lib" / "libthing.so").st_ino == inode


def test_damaged_runtime_file_is_extracted_again(bundle):
    restore_bundle(bundle, ui=QUIET)
    (bundle / "runtime" / "rt" / "share" / "data.txt").write_text("oops")
    (bundle / "runtime" / "rt" / "lib" / "python" / "site.py").unlink()
    report = restore_bundle(bundle, ui=QUIET)
    assert (report.extracted, report.unchanged) == (["runtime/rt"], ["source/project"])
    assert (bundle / "runtime" / "rt" / "share" / "data.txt").read_bytes() == RUNTIME_FILES["share/data.txt"]
    assert (bundle / "runtime" / "rt" / "lib" / "python" / "site.py").read_bytes() == RUNTIME_FILES[
        "lib/python/site.py"
    ]


def test_source_edits_are_kept_then_refresh_source_overwrites_and_names_them(bundle, packed):
    restore_bundle(bundle, ui=QUIET)
    edited = bundle / "source" / "project" / "recap" / "stages" / "value.py"
    edited.write_text("# my experiment\n")
    (bundle / "source" / "project" / "scratch.py").write_text("new file\n")
    kept = run_cli("restore", bundle)
    assert kept.returncode == 0
    assert "kept 1 locally edited file(s) in source/project: recap/stages/value.py" in kept.stderr
    assert "--refresh-source" in kept.stderr
    assert edited.read_text() == "# my experiment\n"
    refreshed = run_cli("restore", "--refresh-source", bundle)
    assert refreshed.returncode == 0, refreshed.stderr
    assert (
        "--refresh-source overwrote 2 locally edited file(s) in source/project: recap/stages/value.py, scratch.py"
        in refreshed.stderr
    )
    assert tree_snapshot(bundle / "source" / "project") == _expected_source(packed)
    again = run_cli("restore", bundle)
    assert "locally edited" not in again.stderr and "unchanged source/project, runtime/rt" in again.stderr


def test_deep_rehashes_what_the_stat_pass_trusts(bundle):
    restore_bundle(bundle, ui=QUIET)
    weight = bundle / "weights" / "model.safetensors"
    st = os.stat(weight)
    flip_bit(weight, 12345, 2)
    os.utime(weight, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size and mtime: only a rehash can tell
    assert run_cli("restore", bundle).returncode == 0
    deep = run_cli("restore", "--deep", bundle)
    assert deep.returncode == 5
    assert "digest   weights/model.safetensors" in deep.stderr


def test_deep_re_extracts_only_runtime_layers_found_changed(bundle):
    restore_bundle(bundle, ui=QUIET)
    report = restore_bundle(bundle, deep=True, ui=QUIET)  # audit62 L2: it re-extracted every runtime target
    assert report.extracted == [] and report.unchanged == ["source/project", "runtime/rt"]
    lib = bundle / "runtime" / "rt" / "lib" / "libthing.so"
    st = os.stat(lib)
    flip_bit(lib, 3, 1)
    os.utime(lib, ns=(st.st_atime_ns, st.st_mtime_ns))
    report = restore_bundle(bundle, deep=True, ui=QUIET)
    assert report.extracted == ["runtime/rt"] and report.unchanged == ["source/project"]
    assert lib.read_bytes() == RUNTIME_FILES["lib/libthing.so"]


def test_restore_after_moving_the_bundle(bundle, tmp_path):
    restore_bundle(bundle, ui=QUIET)
    moved = tmp_path / "moved" / "again"
    moved.parent.mkdir()
    shutil.move(bundle, moved)
    done = run_cli("restore", moved)
    assert done.returncode == 0, done.stderr
    receipt = load_receipt(moved)
    assert receipt.bundle_path == str(moved.resolve())
    assert {r.prefix for r in receipt.layers.values()} == {
        str(moved.resolve() / "source/project"),
        str(moved.resolve() / "runtime/rt"),
    }
    assert run_cli("verify", moved).returncode == 0


def test_new_source_archive_over_local_edits_needs_refresh_source(bundle):
    restore_bundle(bundle, ui=QUIET)
    (bundle / "source" / "project" / "README.md").write_text("edited\n")
    receipt = json.loads((bundle / ".portable" / "receipt.json").read_text())
    receipt["layers"]["source/project.tar.zst"]["sha256"] = "0" * 64  # as if the bundle had been updated
    (bundle / ".portable" / "receipt.json").write_text(json.dumps(receipt))
    with pytest.raises(InvalidInputError) as info:
        restore_bundle(bundle, ui=QUIET)
    assert info.value.field == "--refresh-source" and "README.md" in str(info.value)
    assert (bundle / "source" / "project" / "README.md").read_text() == "edited\n"
    assert restore_bundle(bundle, refresh_source=True, ui=QUIET).overwritten == {"source/project": ["README.md"]}


@pytest.mark.parametrize("version", ["3.10", "3.12", "3.13"])
def test_bare_pythons_restore_with_the_zstd_command(packed, tmp_path, version):
    found = find_python(version)
    if found is None:
        pytest.skip(missing_reason(version))
    python = found[0]
    bundle = tmp_path / "b"
    shutil.copytree(packed, bundle, symlinks=True)
    env = {"PATH": f"{ZSTD_DIR}:/usr/bin:/bin", "PYTHONNOUSERSITE": "1"}
    done = run_cli("restore", python=str(python), script=bundle / "reproduction" / "portable.py", env=env)
    assert done.returncode == 0, done.stderr
    assert tree_snapshot(bundle / "runtime" / "rt") == tree_snapshot(packed.parent / "src" / "runtime")
    verified = run_cli("verify", python=str(python), script=bundle / "reproduction" / "portable.py", env=env)
    assert verified.returncode == 0, verified.stderr


def _python_without_zstandard() -> Path | None:
    for minor in ("3.10", "3.12", "3.13", "3.11"):
        found = find_python(minor)
        if found and subprocess.run([str(found[0]), "-c", "import zstandard"], capture_output=True).returncode != 0:
            return found[0]
    return None


def test_without_any_zstd_the_error_says_what_to_install(packed, tmp_path):
    python = _python_without_zstandard()
    if python is None:
        pytest.skip("needs a Python 3.10-3.13 without the zstandard module; every one found has it")
    bundle = tmp_path / "b"
    shutil.copytree(packed, bundle, symlinks=True)
    empty = tmp_path / "empty-path"
    empty.mkdir()
    done = run_cli("restore", bundle, python=str(python), env={"PATH": str(empty)})
    assert done.returncode == 10
    assert done.stderr.splitlines()[0].endswith(
        "neither the Python module 'zstandard' nor the 'zstd' command is available"
    )
    assert "pip install zstandard" in done.stderr and "apt-get install zstd" in done.stderr
    assert not (bundle / "runtime" / "rt").exists() and not (bundle / "source" / "project").exists()


def test_zstandard_module_and_zstd_command_restore_the_same_bytes(packed, tmp_path):
    empty = tmp_path / "empty-path"
    empty.mkdir()
    with_module = tmp_path / "m"
    shutil.copytree(packed, with_module, symlinks=True)
    done = run_cli("restore", with_module, env={"PATH": str(empty)})  # this Python has zstandard; no CLI on PATH
    assert done.returncode == 0, done.stderr
    with_cli = tmp_path / "c"
    shutil.copytree(packed, with_cli, symlinks=True)
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "zstandard.py").write_text("raise ImportError('hidden for the test')\n")
    done = run_cli("restore", with_cli, env={"PYTHONPATH": str(hide)})
    assert done.returncode == 0, done.stderr
    for target in ("source/project", "runtime/rt"):
        assert tree_snapshot(with_module / target) == tree_snapshot(with_cli / target)


def test_deep_finds_source_edits_that_kept_size_and_mtime(bundle):
    restore_bundle(bundle, ui=QUIET)
    readme = bundle / "source" / "project" / "README.md"
    st = os.stat(readme)
    readme.write_bytes(readme.read_bytes().upper())
    os.utime(readme, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert restore_bundle(bundle, ui=QUIET).kept_edits == {}  # the stat pass cannot see it
    deep = restore_bundle(bundle, deep=True, ui=QUIET)
    assert deep.kept_edits == {"source/project": ["README.md"]}
    assert readme.read_bytes() == b"# THE PROJECT\n"
    receipt = load_receipt(bundle).layers["source/project.tar.zst"]
    assert set(receipt.digests) == set(receipt.files) and len(receipt.digests) == 4


def test_fetch_provenance_survives_restores(bundle):
    from reproduction.release.receipt import record_fetch

    record_fetch(bundle, repo="lab/recap-demo", repo_type="model", revision="v1", commit="c0ffee" * 6 + "abcd")
    restore_bundle(bundle, ui=QUIET)
    restore_bundle(bundle, deep=True, ui=QUIET)
    fetch = load_receipt(bundle).fetch
    assert {k: fetch[k] for k in ("repo", "repo_type", "revision", "commit")} == {
        "repo": "lab/recap-demo",
        "repo_type": "model",
        "revision": "v1",
        "commit": "c0ffee" * 6 + "abcd",
    }
    assert fetch["time"].endswith("Z")
    assert run_cli("verify", bundle).returncode == 0  # .portable/ is local state, never "extra"
