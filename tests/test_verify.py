"""`portable verify`: every kind of mismatch is found, named, and mapped to its exit code."""

from __future__ import annotations

import json
import os

import pytest
from bundlekit import flip_bit, run_cli, small_bundle

from reproduction.errors import IntegrityError
from reproduction.release.manifest import load_manifest
from reproduction.release.verify import verify_bundle, verify_or_raise


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return small_bundle(tmp_path_factory.mktemp("verify"))


@pytest.fixture
def bundle(packed, tmp_path):
    import shutil

    out = tmp_path / "b"
    shutil.copytree(packed, out, symlinks=True)
    return out


def test_clean_bundle_verifies_with_exit_0(bundle):
    report = verify_bundle(bundle)
    manifest = load_manifest(bundle)
    assert (report.ok, report.exit_code, report.problems, report.files) == (True, 0, [], len(manifest.files))
    assert report.bytes_checked == manifest.total_size
    assert report.summary().startswith(f"verified {bundle}: {len(manifest.files)} files")
    done = run_cli("verify", bundle)
    assert (done.returncode, done.stdout) == (0, "")


def test_each_problem_kind_is_reported_with_its_code(bundle):
    (bundle / "data" / "episodes.parquet").unlink()  # missing
    (bundle / "weights" / "stray.bin").write_bytes(b"?")  # extra
    with open(bundle / "weights" / "tokenizer.json", "ab") as fh:  # size
        fh.write(b" ")
    flip_bit(bundle / "weights" / "model.safetensors", 1000, 3)  # digest
    report = verify_bundle(bundle)
    got = [(p.kind, p.path) for p in report.problems]
    assert got == [
        ("missing", "data/episodes.parquet"),
        ("extra", "weights/stray.bin"),
        ("size", "weights/tokenizer.json"),
        ("digest", "weights/model.safetensors"),
    ]
    size = report.problems[2]
    assert size.actual == size.expected + 1
    assert report.exit_code == 11  # the lowest code present wins
    assert report.counts() == {"missing": 1, "extra": 1, "size": 1, "digest": 1}
    with pytest.raises(IntegrityError) as info:
        verify_or_raise(bundle)
    assert info.value.exit_code == 5 and len(info.value.problems) == 4
    assert "weights/model.safetensors" in str(info.value)


@pytest.mark.parametrize(
    "damage, code, kind",
    [("unlink", 11, "missing"), ("extra", 12, "extra"), ("append", 13, "size"), ("flip", 14, "digest")],
)
def test_cli_exit_code_per_kind_and_json(bundle, damage, code, kind):
    target = bundle / "weights" / "model.safetensors"
    if damage == "unlink":
        target.unlink()
    elif damage == "extra":
        (bundle / "notes.txt").write_text("mine")
    elif damage == "append":
        with open(target, "ab") as fh:
            fh.write(b"\0")
    else:
        flip_bit(target, -1)
    done = run_cli("verify", "--json", bundle)
    assert done.returncode == code, done.stderr
    data = json.loads(done.stdout)
    assert data["ok"] is False and data["exit_code"] == code
    assert [p["kind"] for p in data["problems"]] == [kind]
    assert data["problems"][0]["path"] == ("notes.txt" if damage == "extra" else "weights/model.safetensors")


def test_bookkeeping_is_not_extra(bundle):
    (bundle / "reproduction" / "__pycache__").mkdir()
    (bundle / "reproduction" / "__pycache__" / "ui.cpython-311.pyc").write_bytes(b"pyc")
    (bundle / "reproduction" / "release" / "__pycache__").mkdir()
    (bundle / "reproduction" / "release" / "__pycache__" / "x.pyc").write_bytes(b"pyc")
    (bundle / ".portable").mkdir()
    (bundle / ".portable" / "receipt.json").write_text("{}")
    (bundle / "runtime" / "rt").mkdir()
    (bundle / "runtime" / "rt" / "anything").write_text("restored content is the receipt's business")
    assert verify_bundle(bundle).ok
    (bundle / "weights" / "__pycache__").mkdir()  # only the runner's caches are ignored
    (bundle / "weights" / "__pycache__" / "x.pyc").write_bytes(b"pyc")
    assert [(p.kind, p.path) for p in verify_bundle(bundle).problems] == [("extra", "weights/__pycache__/x.pyc")]


def test_a_file_replaced_by_a_folder_is_missing(bundle):
    os.unlink(bundle / "weights" / "tokenizer.json")
    (bundle / "weights" / "tokenizer.json").mkdir()
    report = verify_bundle(bundle)
    assert [(p.kind, p.path, p.actual) for p in report.problems] == [
        ("missing", "weights/tokenizer.json", "not a regular file")
    ]


def test_verify_from_the_bundles_own_runner_by_default(bundle):
    done = run_cli("verify", script=bundle / "reproduction" / "portable.py")
    assert done.returncode == 0, done.stderr
    assert f"verified {bundle}" in done.stderr
