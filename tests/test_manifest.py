"""bundle.json: round trip, and every malformed or unknown manifest refused with the field named (exit 4)."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from bundlekit import QUIET, flip_bit, run_cli, small_bundle

from reproduction.errors import InputNotFoundError, InvalidInputError, UnsupportedFormatError
from reproduction.release.manifest import (
    FileEntry,
    LayerEntry,
    Manifest,
    PrefixOccurrence,
    load_manifest,
    write_manifest,
)

SHA = "ab" * 32


def _manifest() -> Manifest:
    return Manifest(
        name="m",
        files=[
            FileEntry(path="runtime/py.tar.zst", size=10, sha256=SHA),
            FileEntry(path="a/b.bin", size=0, sha256=SHA),
        ],
        layers=[
            LayerEntry(
                archive="runtime/py.tar.zst",
                target="runtime/py",
                kind="runtime",
                order=0,
                build_prefix="/opt/py",
                prefix_files=(PrefixOccurrence(path="bin/x", mode="text"),),
                members=3,
                unpacked_size=7,
                tar_size=10240,
            )
        ],
        entry_config="a/b.bin",
        metadata={"description": "d"},
    )


def test_round_trip_and_sorted_files(tmp_path):
    write_manifest(tmp_path, _manifest())
    back = load_manifest(tmp_path)
    assert back.to_dict() == _manifest().to_dict()
    assert [e.path for e in back.files] == ["a/b.bin", "runtime/py.tar.zst"]
    assert back.layers[0].prefix_files == (PrefixOccurrence(path="bin/x", mode="text"),)


def _write(tmp_path, mutate) -> None:
    data = _manifest().to_dict()
    mutate(data)
    (tmp_path / "bundle.json").write_text(json.dumps(data))


@pytest.mark.parametrize(
    "mutate, field, text",
    [
        (lambda d: d.update(format_version="2.0"), "format_version", "format_version '2.0' is not supported"),
        (lambda d: d.update(format_version="banana"), "format_version", "is not supported"),
        (lambda d: d.update(format="something-else"), "format", "field 'format' is 'something-else'"),
        (lambda d: d.pop("files"), "manifest.files", "missing field 'files'"),
        (lambda d: d.pop("name"), "manifest.name", "missing field 'name'"),
        (lambda d: d["files"][0].update(size="10"), "files[0].size", "should be int"),
        (
            lambda d: d["files"][0].update(sha256="xyz"),
            "files[0].sha256",
            "files[0].sha256: 'xyz' for 'a/b.bin' is not",
        ),
        (lambda d: d["files"][0].update(size=-1), "files[0].size", "files[0].size: -1 for 'a/b.bin' is negative"),
        (lambda d: d["files"][1].update(path="../../etc/passwd"), "files[1].path", "not a clean relative path"),
        (lambda d: d["files"][1].update(path="/etc/passwd"), "files[1].path", "not a clean relative path"),
        (lambda d: d["files"][0].update(path="runs/x.txt"), "files[0].path", "'runs/x.txt', under runs/, which"),
        (lambda d: d["files"][0].update(path="runs"), "files[0].path", "lists 'runs', under runs/, which is left"),
        (lambda d: d["layers"][0].update(kind="kernel"), "layers[0].kind", "kind 'kernel'"),
        (lambda d: d["layers"][0].update(target="../out"), "layers[0].target", "not a clean relative path"),
        (lambda d: d["layers"][0].update(build_prefix="relative"), "layers[0].build_prefix", "absolute path"),
        (lambda d: d["layers"][0].update(build_prefix="/"), "layers[0].build_prefix", "'/' is the root folder"),
        (lambda d: d["layers"][0].update(build_prefix="/o\nb"), "layers[0].build_prefix", "'/o\\nb' holds a control"),
        (lambda d: d["layers"][0].update(build_prefix="/o\x1b["), "layers[0].build_prefix", "holds a control char"),
        (lambda d: d["layers"][0].update(build_prefix="/o\x9b"), "layers[0].build_prefix", "'/o\\x9b' holds a control"),
        (lambda d: d["files"][1].update(path="a/\x85b"), "files[1].path", "path 'a/\\x85b' holds a control char"),
        (lambda d: d["layers"][0].update(members=-1), "layers[0].members", "non-negative integer"),
        (
            lambda d: d["layers"][0]["prefix_files"][0].update(mode="magic"),
            "layers[0].prefix_files[0].mode",
            "mode 'magic'",
        ),
        (lambda d: d["layers"][0].update(archive="not/listed.tar.zst"), "layers.archive", "is not in files"),
    ],
)
def test_malformed_manifest_names_the_field(tmp_path, mutate, field, text):
    _write(tmp_path, mutate)
    with pytest.raises(InvalidInputError) as info:
        load_manifest(tmp_path)
    assert info.value.field == field and info.value.exit_code == 4
    assert text in str(info.value)


@pytest.mark.parametrize(
    "mutate, field, where",
    [
        (lambda d: d.update(format_version=1), "format_version", "manifest"),
        (lambda d: d.update(name=7), "name", "manifest"),
        (lambda d: d["files"][0].update(path=5), "files[0].path", "files[0]"),
    ],
)
def test_a_string_field_given_an_integer_asks_for_a_string(tmp_path, mutate, field, where):
    """audit62 L1: these said "should be an integer from -9223372036854775807 to ..., got int 1"."""
    _write(tmp_path, mutate)
    with pytest.raises(InvalidInputError) as info:
        load_manifest(tmp_path)
    key = field.rsplit(".", 1)[-1]
    assert info.value.exit_code == 4
    assert f"{where}: field '{key}' should be str, got int " in str(info.value)
    assert "integer" not in str(info.value)


def test_newer_major_is_an_unsupported_format_with_the_fix(tmp_path):
    _write(tmp_path, lambda d: d.update(format_version="2.0"))
    with pytest.raises(UnsupportedFormatError) as info:
        load_manifest(tmp_path)
    assert "reproduction/portable.py" in info.value.hint
    _write(tmp_path, lambda d: d.update(format_version="1.7"))  # a newer minor of our major is fine
    assert load_manifest(tmp_path).format_version == "1.7"


def test_not_json_and_missing(tmp_path):
    with pytest.raises(InputNotFoundError):
        load_manifest(tmp_path)
    (tmp_path / "bundle.json").write_text('{"format": ')
    with pytest.raises(InvalidInputError, match="not valid JSON \\(line 1, column 12"):
        load_manifest(tmp_path)


@pytest.mark.parametrize("command", ["verify", "restore"])
def test_cli_refuses_unknown_version_with_exit_4_naming_the_field(tmp_path, command):
    bundle = small_bundle(tmp_path)
    data = json.loads((bundle / "bundle.json").read_text())
    data["format_version"] = "9.1"
    (bundle / "bundle.json").write_text(json.dumps(data))
    done = run_cli(command, bundle)
    assert done.returncode == 4, done.stderr
    first = done.stderr.splitlines()[0]
    assert first == "error: manifest: format_version '9.1' is not supported (this portable reads 1.x)"
    assert done.stderr.splitlines()[1].startswith("hint: use the runner shipped inside the bundle")
    assert not (bundle / "source" / "project").exists()


def test_flipped_bit_in_bundle_json_is_detected(tmp_path):
    bundle = small_bundle(tmp_path)
    text = (bundle / "bundle.json").read_text()
    pristine = tmp_path / "pristine.json"
    shutil.copy(bundle / "bundle.json", pristine)
    # A digit of a size field: the manifest still parses, the file no longer matches it.
    at = text.index(",", text.index('"size": ')) - 1  # its last digit: flipping bit 0 keeps it a digit
    flip_bit(bundle / "bundle.json", at, 0)
    done = run_cli("restore", bundle)
    assert done.returncode == 5 and "size" in done.stderr, done.stderr
    assert not (bundle / "source" / "project").exists() and not (bundle / "runtime" / "rt").exists()
    # A structural character: the manifest no longer parses.
    shutil.copy(pristine, bundle / "bundle.json")
    flip_bit(bundle / "bundle.json", text.index("{"), 1)
    done = run_cli("restore", bundle)
    assert done.returncode == 4 and "bundle.json: not valid JSON" in done.stderr
    assert not (bundle / "runtime" / "rt").exists()


@pytest.mark.parametrize("command", ["verify", "restore"])
def test_cli_refuses_a_bundle_json_that_is_a_fifo_without_waiting_on_it(tmp_path, command):
    # audit48 F2: both commands opened the FIFO and hung forever (restore in its no-change path too)
    from reproduction.release.restore import restore_bundle

    bundle = small_bundle(tmp_path)
    restore_bundle(bundle, ui=QUIET)
    (bundle / "bundle.json").unlink()
    os.mkfifo(bundle / "bundle.json")
    done = run_cli(command, bundle, timeout=30)
    assert done.returncode == 3, done.stderr
    lines = done.stderr.splitlines()
    assert (
        lines[0] == f"error: {bundle / 'bundle.json'}: not a regular file (a folder, a FIFO or a device), so it "
        "holds no bundle manifest"
    )
    assert lines[1].startswith("hint: ") and len(lines) == 2 and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "digest, shown, why",
    [
        ("AB" * 32, repr("AB" * 32), "(64 characters, upper-case)"),
        ("ab" * 31, repr("ab" * 31), "(62 characters)"),
        ("a" * 5000, repr("a" * 70) + "...", "(5000 characters)"),
    ],
    ids=["upper", "short", "long"],
)
def test_a_bad_sha256_names_the_field_the_value_and_the_rule(tmp_path, digest, shown, why):
    # audit48 F5: was "files[0]: bad size or sha256 for 'a/b.bin'", naming neither which field nor what is wrong
    _write(tmp_path, lambda d: d["files"][0].update(sha256=digest))
    with pytest.raises(InvalidInputError) as info:
        load_manifest(tmp_path)
    assert str(info.value) == f"files[0].sha256: {shown} for 'a/b.bin' is not 64 lower-case hex digits {why}"
    assert info.value.field == "files[0].sha256" and info.value.exit_code == 4 and "damaged" in info.value.hint


@pytest.mark.parametrize("command", ["verify", "restore"])
def test_cli_refuses_a_manifest_listing_a_file_under_runs(tmp_path, command):
    # audit48 F4: runs/ is the user's (README); a listed runs/ file made the user's own outputs integrity failures
    import hashlib

    bundle = small_bundle(tmp_path)
    (bundle / "runs").mkdir()
    (bundle / "runs" / "planted.txt").write_bytes(b"planted\n")
    data = json.loads((bundle / "bundle.json").read_text())
    data["files"].append({"path": "runs/planted.txt", "size": 8, "sha256": hashlib.sha256(b"planted\n").hexdigest()})
    (bundle / "bundle.json").write_text(json.dumps(data))
    done = run_cli(command, bundle)
    assert done.returncode == 4, done.stderr
    lines = done.stderr.splitlines()
    i = len(data["files"]) - 1
    assert lines[0] == (
        f"error: files[{i}]: lists 'runs/planted.txt', under runs/, which is left to the user's runs (pack never "
        "writes there)"
    )
    assert lines[1] == "hint: the manifest is damaged or hostile; do not use this bundle" and len(lines) == 2
    assert not (bundle / "source" / "project").exists()


@pytest.mark.parametrize("prefix", ["/", "/opt/a\nb"], ids=["root", "newline"])
def test_restore_refuses_a_build_prefix_relocation_cannot_use_as_a_manifest_error(tmp_path, prefix):
    # audit48 F7: passed the manifest check, then the relocator refused it (exit 9, a hint about a folder to pass)
    bundle = small_bundle(tmp_path)
    data = json.loads((bundle / "bundle.json").read_text())
    i = next(i for i, layer in enumerate(data["layers"]) if layer["kind"] == "runtime")
    data["layers"][i]["build_prefix"] = prefix
    (bundle / "bundle.json").write_text(json.dumps(data))
    done = run_cli("restore", bundle)
    assert done.returncode == 4, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0].startswith(f"error: layers[{i}].build_prefix: {prefix!r} ") and len(lines) == 2
    assert lines[1] == "hint: the manifest is damaged or hostile; do not use this bundle"
    assert not any((bundle / layer["target"]).exists() for layer in data["layers"])
