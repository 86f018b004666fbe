"""Hostile layer archives are refused before any byte is written, naming the member; nothing lands outside."""

from __future__ import annotations

import os

import pytest
from bundlekit import QUIET, forge_bundle, member, run_cli, tree_snapshot

from reproduction.errors import UnsafeArchiveError
from reproduction.release import layers as layer_io
from reproduction.release.restore import restore_bundle

OK = [member("pkg", "dir", mode=0o755), member("pkg/a.py", data=b"a = 1\n")]

ATTACKS = {
    "absolute path": ([member("/tmp/portable-evil-abs", data=b"x")], "/tmp/portable-evil-abs", "has an absolute path"),
    "dot-dot": ([member("../escape.txt", data=b"x")], "../escape.txt", "contains '..'"),
    "dot-dot inside": ([member("pkg/../../escape.txt", data=b"x")], "pkg/../../escape.txt", "contains '..'"),
    "symlink escaping": ([member("out", "symlink", linkname="../../../outside")], "out", "which leaves the bundle"),
    "symlink climbing out of the targets": (
        [member("out", "symlink", linkname="../../weights")],
        "out",
        "leaves the layer targets",
    ),
    "absolute symlink": ([member("etc", "symlink", linkname="/etc")], "etc", "symlink to the absolute path '/etc'"),
    "dot-dot after a name": (
        [member("sneaky", "symlink", linkname="pkg/../../..")],
        "sneaky",
        "'..' after a folder name",
    ),
    "hard link": ([member("hl", "hardlink", linkname="/etc/passwd")], "hl", "is a hard link"),
    "hard link inside": (OK + [member("pkg/b.py", "hardlink", linkname="pkg/a.py")], "pkg/b.py", "is a hard link"),
    "char device": ([member("null", "chardev", devmajor=1)], "null", "is a chardev"),
    "block device": ([member("disk", "blockdev", devmajor=8)], "disk", "is a blockdev"),
    "fifo": ([member("pipe", "fifo")], "pipe", "is a fifo"),
    "setuid": ([member("suid", data=b"#!/bin/sh\n", mode=0o4755)], "suid", "setuid/setgid bit set (mode 4755)"),
    "setgid": ([member("sgid", data=b"#!/bin/sh\n", mode=0o2755)], "sgid", "setuid/setgid bit set (mode 2755)"),
    "write through own symlink": (
        [member("sub", "dir"), member("d", "symlink", linkname="sub"), member("d/f", data=b"x")],
        "d/f",
        "written through the symlink 'source/app/d'",
    ),
    "newline in a name": ([member("pkg/evil\nname.py", data=b"x")], "pkg/evil\nname.py", "a control character"),
    "escape and CR in a name": ([member("\x1b[31mred\r.py", data=b"x")], "\x1b[31mred\r.py", "a control character"),
    "C1 NEL in a name": ([member("pkg/evil\x85name.py", data=b"x")], "pkg/evil\x85name.py", "a control character"),
    "C1 CSI in link text": ([member("lnk", "symlink", linkname="pkg/\x9b31ma.py")], "lnk", "a control character"),
    "control character in link text": (
        [member("lnk", "symlink", linkname="pkg/a\x1b]0;x\x07.py")],
        "lnk",
        "a control character",
    ),
    "too deep": ([member("d/" * 300 + "f", data=b"x")], "d/" * 300 + "f", "folders deep, more than the 256"),
    "replace own symlink": (
        [member("d", "symlink", linkname="pkg"), member("d", data=b"x")],
        "d",
        "would replace (and write through) the symlink",
    ),
}


def _outside_snapshot(root):
    return {k: v for k, v in tree_snapshot(root).items() if not k.startswith("bundle")}


@pytest.fixture
def no_extraction(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("extraction started although validation should have refused the archive")

    monkeypatch.setattr(layer_io, "extract_stream", refuse)


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_each_attack_is_refused_before_writing(tmp_path, name, no_extraction):
    members, bad, why = ATTACKS[name]
    bundle = forge_bundle(tmp_path / "bundle", [("source/app.tar.zst", "source/app", "source", OK + members)])
    before = _outside_snapshot(tmp_path)
    with pytest.raises(UnsafeArchiveError) as info:
        restore_bundle(bundle, ui=QUIET)
    assert info.value.exit_code == 6
    assert (info.value.archive, info.value.member) == ("source/app.tar.zst", bad)
    message = str(info.value)
    assert message.startswith(f"unsafe layer archive, nothing was extracted: source/app.tar.zst: member {bad!r} ")
    assert why in message
    assert not (bundle / "source" / "app").exists()
    assert sorted(os.listdir(bundle / ".portable")) == ["lock"]  # no receipt, no staging
    assert _outside_snapshot(tmp_path) == before
    assert not os.path.lexists("/tmp/portable-evil-abs")


def test_two_archive_attack_is_refused_naming_both_layers(tmp_path, no_extraction):
    """Layer 1 plants a symlink (legal on its own); layer 2, same target, writes through it."""
    first = [member("lnk", "symlink", linkname="../victim")]
    second = [member("lnk/pwned.txt", data=b"gotcha")]
    bundle = forge_bundle(
        tmp_path / "bundle",
        [
            ("source/a1.tar.zst", "source/app", "source", first),
            ("source/a2.tar.zst", "source/app", "source", second),
            ("source/victim.tar.zst", "source/victim", "source", OK),
        ],
    )
    with pytest.raises(UnsafeArchiveError) as info:
        restore_bundle(bundle, ui=QUIET)
    assert (info.value.archive, info.value.member) == ("source/a2.tar.zst", "lnk/pwned.txt")
    assert "written through the symlink 'source/app/lnk' planted by source/a1.tar.zst" in str(info.value)
    assert not any((bundle / "source" / t).exists() for t in ("app", "victim"))


def test_every_refusal_is_listed_once_and_the_cli_exits_6(tmp_path):
    members = [member("../a", data=b"x"), member("/b", data=b"y"), member("c", "fifo")]
    bundle = forge_bundle(tmp_path / "bundle", [("runtime/r.tar.zst", "runtime/r", "runtime", members)])
    done = run_cli("restore", bundle)
    assert done.returncode == 6
    first = done.stderr.splitlines()[0]
    assert first.startswith(
        "error: unsafe layer archive, nothing was extracted: runtime/r.tar.zst: member '../a' contains '..'"
    )
    assert "member '/b' has an absolute path" in first and "member 'c' is a fifo" in first
    assert done.stderr.splitlines()[1].startswith("hint: do not use this bundle")
    assert not (bundle / "runtime" / "r").exists()


def test_legitimate_links_inside_and_across_layers_are_restored(tmp_path):
    lib = [
        member("lib", "dir", mode=0o755),
        member("lib/libz.so.1", data=b"ELF"),
        member("lib/libz.so", "symlink", linkname="libz.so.1"),
    ]
    venv = [
        member("bin", "dir", mode=0o755),
        member("bin/python", "symlink", linkname="../../py/bin/python3"),
        member("lib64", "symlink", linkname="lib"),
        member("lib", "dir", mode=0o700),
    ]
    py = [member("bin", "dir"), member("bin/python3", data=b"#!", mode=0o755)]
    bundle = forge_bundle(
        tmp_path / "bundle",
        [
            ("runtime/z.tar.zst", "runtime/z", "runtime", lib),
            ("runtime/py.tar.zst", "runtime/py", "runtime", py),
            ("runtime/venv.tar.zst", "runtime/venv", "runtime", venv),
        ],
    )
    report = restore_bundle(bundle, ui=QUIET)
    assert report.extracted == ["runtime/z", "runtime/py", "runtime/venv"]
    assert os.readlink(bundle / "runtime" / "venv" / "bin" / "python") == "../../py/bin/python3"
    assert (bundle / "runtime" / "venv" / "bin" / "python").read_bytes() == b"#!"
    assert (bundle / "runtime" / "z" / "lib" / "libz.so").read_bytes() == b"ELF"
    assert os.stat(bundle / "runtime" / "venv" / "lib").st_mode & 0o777 == 0o700


def test_overlapping_layer_targets_are_refused_by_field(tmp_path):
    from reproduction.errors import InvalidInputError

    bundle = forge_bundle(
        tmp_path / "bundle",
        [("runtime/a.tar.zst", "runtime/a", "runtime", OK), ("runtime/b.tar.zst", "runtime/a/inner", "runtime", OK)],
    )
    with pytest.raises(InvalidInputError) as info:
        restore_bundle(bundle, ui=QUIET)
    assert info.value.field == "layers[0].target" and "nests with layer target 'runtime/a/inner'" in str(info.value)
    bundle = forge_bundle(tmp_path / "b2", [("runtime/a.tar.zst", "reproduction", "runtime", OK)])
    with pytest.raises(InvalidInputError, match="would overwrite reproduction"):
        restore_bundle(bundle, ui=QUIET)


# -- layers with a member index: validated from the index, extracted in one pass ---------------------


def _packed_with_index(tmp_path):
    from bundlekit import small_bundle

    return small_bundle(tmp_path)


def _repin(bundle, rel):
    """Make bundle.json pin the current bytes of `rel` (what an attacker who controls both would do)."""
    import hashlib
    import json

    data = json.loads((bundle / "bundle.json").read_text())
    blob = (bundle / rel).read_bytes()
    for entry in data["files"]:
        if entry["path"] == rel:
            entry["size"], entry["sha256"] = len(blob), hashlib.sha256(blob).hexdigest()
    (bundle / "bundle.json").write_text(json.dumps(data))


def test_hostile_member_index_is_refused_before_extraction(tmp_path, no_extraction):
    import json

    bundle = _packed_with_index(tmp_path)
    index = bundle / "runtime" / "rt.members.json"
    data = json.loads(index.read_text())
    data["members"].append(["../../evil", "file", 0o644, 1, ""])
    index.write_text(json.dumps(data))
    _repin(bundle, "runtime/rt.members.json")
    with pytest.raises(UnsafeArchiveError) as info:
        restore_bundle(bundle, ui=QUIET)
    assert (info.value.archive, info.value.member) == ("runtime/rt.tar.zst", "../../evil")
    assert not (bundle / "runtime" / "rt").exists() and not (bundle / "source" / "project").exists()


def test_archive_that_differs_from_its_validated_index_stops_before_the_member(tmp_path):
    """The archive is swapped for a hostile one (re-pinned), the index left as validated: the first
    header that differs from the index is refused before it is written, and staging is discarded."""
    from bundlekit import tar_zst

    bundle = _packed_with_index(tmp_path)
    (bundle / "runtime" / "rt.tar.zst").write_bytes(
        tar_zst([member("bin", "dir", mode=0o755), member("bin/../../../escape", data=b"x")])
    )
    _repin(bundle, "runtime/rt.tar.zst")
    with pytest.raises(UnsafeArchiveError) as info:
        restore_bundle(bundle, ui=QUIET)
    assert "changed since it was validated" in str(info.value) and info.value.archive == "runtime/rt.tar.zst"
    assert not (bundle / "runtime" / "rt").exists() and not (bundle / "source" / "project").exists()
    assert not (tmp_path / "escape").exists() and not (bundle / "escape").exists()
    assert sorted(os.listdir(bundle / ".portable")) == ["lock"]


def test_corrupt_archive_with_index_is_a_digest_problem(tmp_path):
    from bundlekit import flip_bit

    bundle = _packed_with_index(tmp_path)
    flip_bit(bundle / "runtime" / "rt.tar.zst", 200, 4)
    done = run_cli("restore", bundle)
    assert done.returncode == 5 and "digest   runtime/rt.tar.zst" in done.stderr
    assert not (bundle / "runtime" / "rt").exists() and sorted(os.listdir(bundle / ".portable")) == ["lock"]


@pytest.mark.parametrize(
    ("names", "shown", "raw"),
    [  # audit48 F1: a newline or ESC in a member name was extracted, then printed raw by a later error
        (("pkg/evil\nname.py", "\x1b[31mred\r.py"), ("pkg/evil\\nname.py", "\\x1b[31mred\\r.py"), "\x1b\r"),
        # U+0085 (NEL) is a line break to some readers, U+009B (CSI) starts an escape sequence on some terminals
        (("pkg/evil\x85name.py", "\x9b31mred.py"), ("pkg/evil\\x85name.py", "\\x9b31mred.py"), "\x85\x9b"),
    ],
    ids=["c0", "c1"],
)
def test_control_characters_in_member_names_stay_escaped_on_one_line(tmp_path, names, shown, raw):
    members = [member(names[0], data=b"x"), member(names[1], data=b"y")]
    bundle = forge_bundle(tmp_path / "bundle", [("source/app.tar.zst", "source/app", "source", OK + members)])
    done = run_cli("restore", bundle)
    assert done.returncode == 6, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 2 and lines[1].startswith("hint: ")
    assert f"member 'source/app/{shown[0]}'" not in lines[0]  # named as in the archive, escaped
    for name in shown:
        assert f"member '{name}' has a control character" in lines[0]
    assert not any(c in done.stderr for c in raw)
    assert not (bundle / "source" / "app").exists()
