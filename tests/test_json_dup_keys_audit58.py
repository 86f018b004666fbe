"""Audit 58 / A1: a JSON file with a repeated key is refused, not read with the last value silently winning.

A bundle.json with a second `"layers": []` verified and restored with exit 0 and restored none of the layers. Every
JSON file the release side reads from a bundle or a restored tree goes through reproduction.strict_json.
"""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
from bundlekit import QUIET, run_cli, small_bundle, tree_snapshot

from reproduction import strict_json
from reproduction.errors import InvalidInputError
from reproduction.release import noop
from reproduction.release.layers import read_index
from reproduction.release.manifest import MANIFEST_NAME
from reproduction.release.receipt import load_receipt, receipt_path
from reproduction.release.restore import restore_bundle
from reproduction.release.weights_manifest import load_license_index, load_weights_manifest

REPEAT = "JSON keeps only the last, so the others would be silently dropped"


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return small_bundle(tmp_path_factory.mktemp("dupkeys"))


@pytest.fixture
def bundle(packed, tmp_path):
    out = tmp_path / "b"
    shutil.copytree(packed, out, symlinks=True)
    return out


def _second_layers(text: str) -> str:
    return text.rstrip()[:-1] + ', "layers": []}\n'


def _second_format_version(text: str) -> str:
    assert '"format_version": "1.0"' in text
    return text.replace('"format_version": "1.0"', '"format_version": "9.9", "format_version": "1.0"', 1)


def _second_files(text: str) -> str:
    return text.rstrip()[:-1] + ', "files": []}\n'


def _second_sha256(text: str) -> str:
    data = json.loads(text)
    digest = data["files"][0]["sha256"]
    assert text.count(f'"sha256": "{digest}"') == 1
    return text.replace(f'"sha256": "{digest}"', f'"sha256": "{"0" * 64}", "sha256": "{digest}"', 1)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_second_layers, "the key 'layers' occurs 2 times in the top level"),
        (_second_format_version, "the key 'format_version' occurs 2 times in the top level"),
        (_second_files, "the key 'files' occurs 2 times in the top level"),
        (_second_sha256, "the key 'sha256' occurs 2 times in files[0]"),
    ],
)
@pytest.mark.parametrize("command", ["verify", "restore"])
def test_bundle_json_with_a_repeated_key_is_refused_by_verify_and_restore(bundle, edit, message, command):
    path = bundle / MANIFEST_NAME
    path.write_text(edit(path.read_text(encoding="utf-8")), encoding="utf-8")
    before = tree_snapshot(bundle)
    done = run_cli(command, bundle)
    assert done.returncode == 4, done.stderr
    error = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert error == [
        f"error: {path}: {message}; a manifest that JSON readers would read differently is damaged or hostile"
    ]
    assert "hint: fetch or pack the bundle again" in done.stderr
    assert tree_snapshot(bundle) == before  # nothing written: no layer, no receipt, no lock


def test_the_fast_path_does_not_answer_for_a_manifest_with_a_repeated_key(bundle):
    # A receipt that vouches for the repeated-key bytes (as one left by a portable before this fix would): the
    # no-change path must not report it restored, but leave it to the full path, which refuses it.
    restore_bundle(bundle, ui=QUIET)
    path, receipt = bundle / MANIFEST_NAME, receipt_path(bundle)
    path.write_text(_second_format_version(path.read_text(encoding="utf-8")), encoding="utf-8")
    data = json.loads(receipt.read_text(encoding="utf-8"))
    data["manifest_sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    receipt.write_text(json.dumps(data), encoding="utf-8")
    assert noop.try_noop_restore(["restore", str(bundle)], "/nowhere") is None
    done = run_cli("restore", bundle)
    assert done.returncode == 4 and "the key 'format_version' occurs 2 times in the top level" in done.stderr


def test_member_index_with_a_repeated_key_is_refused(tmp_path):
    index = tmp_path / "index.json"
    row = ["a.py", "file", 0o644, 1, ""]
    index.write_text(
        json.dumps({"format": "x", "format_version": "1.0", "members": [row]})[:-1] + ', "members": []}',
        encoding="utf-8",
    )
    with pytest.raises(InvalidInputError) as err:
        read_index(index, rel="layers/app.index.json")
    assert str(err.value) == (
        f"layers/app.index.json: not a member index this portable reads (the key 'members' occurs 2 times in the "
        f"top level; {REPEAT})"
    )
    assert err.value.exit_code == 4


def test_receipt_with_a_repeated_key_is_read_as_no_receipt(bundle):
    restore_bundle(bundle, ui=QUIET)
    path = receipt_path(bundle)
    assert load_receipt(bundle).layers  # the real receipt records the layers
    data = json.loads(path.read_text(encoding="utf-8"))
    path.write_text(json.dumps(data)[:-1] + ', "layers": {}}', encoding="utf-8")
    assert load_receipt(bundle).layers == {}
    assert load_receipt(bundle).manifest_sha256 == ""  # all of it is ignored, not just the repeated key
    assert noop.try_noop_restore(["restore", str(bundle)], "/nowhere") is None


def test_weights_manifest_with_a_repeated_key_is_refused(tmp_path):
    path = tmp_path / "wm.json"
    path.write_text('{"format": "a", "components": [], "format": "b"}', encoding="utf-8")
    with pytest.raises(InvalidInputError) as err:
        load_weights_manifest(path)
    assert str(err.value) == f"{path}: the key 'format' occurs 2 times in the top level; {REPEAT}"
    assert err.value.exit_code == 4 and err.value.field == "format"


def test_license_index_with_a_repeated_key_is_refused(tmp_path):
    (tmp_path / "index.json").write_text('{"licenses": {"a": {}, "a": {}}, "components": {}}', encoding="utf-8")
    with pytest.raises(InvalidInputError) as err:
        load_license_index(tmp_path)
    assert str(err.value) == f"{tmp_path / 'index.json'}: the key 'a' occurs 2 times in licenses; {REPEAT}"
    assert err.value.exit_code == 4


def test_strict_loads_names_every_place_and_reads_unrepeated_json_as_json_does():
    text = '{"a": [{"b": 1, "b": 2}], "t": {"x": {"c": 1, "c": 1, "c": 3}}}'
    doc, repeats = strict_json.loads_noting_repeats(text, named={"t"})
    assert doc == json.loads(text)
    assert repeats == [("a[0]", "b", 2), ("t['x']", "c", 3)]
    with pytest.raises(strict_json.RepeatedKeyError, match=r"^the key 'b' occurs 2 times in a\[0\]; JSON keeps"):
        strict_json.loads(text)
    assert strict_json.loads('{"a": {"b": [1, {"c": null}]}}') == {"a": {"b": [1, {"c": None}]}}
