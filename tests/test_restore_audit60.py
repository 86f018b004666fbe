"""audit60 A1, A2, A5, A6: impossible size claims, a member index listing a path twice, integers past 2**63-1 and
layer targets that verify called "all match" while restore refused them; each refused with one error line."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from bundlekit import forge_bundle, member, pax_record, raw_bundle, raw_member, run_cli, tree_snapshot

HOSTILE = "hint: the manifest is damaged or hostile; do not use this bundle; ask its publisher to re-pack it"


def _one_error(done, code: int, line: str, hint: str) -> None:
    assert done.returncode == code, done.stderr
    assert done.stderr.splitlines() == [line, hint], done.stderr


def _edit(bundle, **fields) -> None:
    data = json.loads((bundle / "bundle.json").read_text())
    data["layers"][0].update(fields)
    (bundle / "bundle.json").write_text(json.dumps(data))


# -- A2: a size the archive cannot hold is a hostile bundle (6 or 4), not "free some space" (8) ----------------


def test_a_member_larger_than_the_declared_tar_size_is_refused_not_a_space_shortage(tmp_path):
    bundle = raw_bundle(tmp_path / "b", raw_member("f", b"abc", pax=pax_record("size", str(2**63))))
    done = run_cli("restore", bundle)
    _one_error(
        done,
        6,
        "error: source/app.tar.zst: member 'f' declares a size of 9223372036854775808 bytes, so its files add up to "
        "at least 9223372036854775808 bytes, more than the 3072-byte tar stream bundle.json declares (tar_size) can "
        "hold; nothing was extracted",
        "hint: do not use this bundle; ask its publisher to re-pack it with `portable pack`",
    )
    assert not (bundle / "source/app").exists()


def test_an_index_row_larger_than_the_declared_tar_size_is_refused_not_a_space_shortage(tmp_path):
    bundle = raw_bundle(tmp_path / "b", raw_member("f", b"abc"), index=[["f", "file", 0o644, 2**62, ""]])
    done = run_cli("restore", bundle)
    _one_error(
        done,
        6,
        "error: source/app.tar.zst: member 'f' declares a size of 4611686018427387904 bytes, so its files add up to "
        "at least 4611686018427387904 bytes, more than the 2048-byte tar stream bundle.json declares (tar_size) can "
        "hold; nothing was extracted",
        "hint: do not use this bundle; ask its publisher to re-pack it with `portable pack`",
    )
    assert not (bundle / "source/app").exists()


@pytest.mark.parametrize("command", ["verify", "restore"])
def test_an_unpacked_size_beyond_the_tar_size_is_refused_in_bundle_json(tmp_path, command):
    bundle = forge_bundle(tmp_path / "b", [("source/app.tar.zst", "source/app", "source", [member("x", data=b"x")])])
    _edit(bundle, tar_size=30720, unpacked_size=2**63 - 1)
    done = run_cli(command, bundle)
    _one_error(
        done,
        4,
        "error: layers[0]: field 'unpacked_size' is 9223372036854775807, more than its tar_size of 30720 bytes, "
        "which holds every byte of the layer's files",
        HOSTILE,
    )


# -- A5: a member index listing one path twice is refused, as bundle.json is -----------------------------------


def test_a_member_index_listing_a_path_twice_is_refused(tmp_path):
    row = ["f", "file", 0o644, 3, ""]
    bundle = raw_bundle(tmp_path / "b", raw_member("f", b"abc") + raw_member("f", b"xyz"), index=[row, row])
    done = run_cli("restore", bundle)
    _one_error(
        done,
        4,
        "error: source/app.members.json: 'f' is listed twice",
        "hint: the bundle is damaged or hostile; do not use this bundle; ask its publisher to re-pack it",
    )
    assert not (bundle / "source/app").exists()


# -- A1: an integer past 2**63-1 is refused naming the limit ----------------------------------------------------


@pytest.mark.parametrize(
    "where, field, line",
    [
        (
            "files",
            "size",
            "error: files[0]: field 'size' should be an integer from -9223372036854775807 to 9223372036854775807 "
            "(2**63-1), got int 9223372036854775808",
        ),
        (
            "layers",
            "tar_size",
            "error: layers[0]: field 'tar_size' should be a non-negative integer of at most 9223372036854775807 "
            "(2**63-1), got 9223372036854775808",
        ),
    ],
)
def test_an_integer_past_the_limit_names_the_limit(tmp_path, where, field, line):
    bundle = forge_bundle(tmp_path / "b", [("source/app.tar.zst", "source/app", "source", [member("x", data=b"x")])])
    data = json.loads((bundle / "bundle.json").read_text())
    data[where][0][field] = 2**63
    (bundle / "bundle.json").write_text(json.dumps(data))
    _one_error(run_cli("verify", bundle), 4, line, "hint: the manifest is damaged; fetch or pack the bundle again")


# -- A6: verify refuses the layer targets restore refuses, with the same line -----------------------------------


@pytest.mark.parametrize(
    "target, line",
    [
        ("source", "error: layers[0].target 'source' overlaps the bundle file 'source/app.tar.zst'"),
        (".portable/x", "error: layers[0].target '.portable/x' would overwrite .portable"),
        ("reproduction", "error: layers[0].target 'reproduction' would overwrite reproduction"),
    ],
)
def test_verify_refuses_the_layer_targets_restore_refuses(tmp_path, target, line):
    bundle = forge_bundle(tmp_path / "b", [("source/app.tar.zst", target, "source", [member("x.txt", data=b"x\n")])])
    before = tree_snapshot(bundle)
    for command in ("verify", "restore"):
        _one_error(run_cli(command, bundle), 4, line, HOSTILE)
    assert tree_snapshot(bundle) == before


# -- A3: the relocation room is in bytes, and the refusal says so ------------------------------------------------


def test_the_relocation_refusal_counts_the_build_prefix_in_bytes(tmp_path):
    build = tmp_path / "sé" / "rt"  # one character more in bytes than in characters
    (build / "lib").mkdir(parents=True)
    (build / "lib" / "b.bin").write_bytes(b"\x7fELF prefix=" + os.fsencode(build) + b"\0")  # ELF: C strings (M3)
    spec = 'name = "m"\nroot = "sé"\n[[layer]]\nsource = "rt"\nkind = "runtime"\nname = "rt"\nrelocatable = true\n'
    (tmp_path / "spec.toml").write_text(spec)
    assert run_cli("-q", "pack", tmp_path / "spec.toml", "--out", tmp_path / "B").returncode == 0
    dest = tmp_path / "ééé" / "B"
    dest.parent.mkdir()
    shutil.copytree(tmp_path / "B", dest, symlinks=True)
    done = run_cli("restore", dest)
    room = len(os.fsencode(build))
    assert room == len(str(build)) + 1
    assert done.returncode == 9, done.stderr
    line, hint = done.stderr.splitlines()
    assert f"(room {room}: 1 x the {room}-byte build prefix {str(build)!r})" in line, line
    assert hint.startswith(f"hint: restore to a folder whose layer path is at most {room} bytes long (UTF-8) "), hint
