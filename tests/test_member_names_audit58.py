"""Audit 58 / A5: names holding a Unicode format character (category Cf: the bidi overrides and isolates, zero-width
characters, U+FEFF) show as another name (`evil\\u202eyp.txt` reads as `evilpy.txt` reversed, `a\\u200b.py` as
`a.py`). Like a control character they are refused in archive members (pack exit 4, restore exit 6) and in
bundle.json's paths, and every message line that names a file prints them escaped."""

from __future__ import annotations

import hashlib
import json

import pytest
from bundlekit import QUIET, forge_bundle, member, write_tree

from reproduction import portable
from reproduction.errors import InvalidInputError, UnsafeArchiveError
from reproduction.release.manifest import check_relative_path, has_format, shown_name
from reproduction.release.pack import pack_bundle
from reproduction.release.restore import restore_bundle

FORMAT_CHARACTERS = ["\u202e", "\u200b", "\u2066", "\u2069", "\ufeff", "\u200e"]
JOINERS = ["\u200d", "\u200c", "\U000e0067"]  # ZWJ, ZWNJ, a tag character: names need them (review58 R3)
SPEC = 'name = "names"\nroot = "src"\n[[layer]]\nsource = "app"\nkind = "source"\nname = "app"\n'


def test_has_format_and_shown_name():
    for ch in FORMAT_CHARACTERS:
        assert has_format(f"a{ch}.py")
        assert shown_name(f"a{ch}.py") == f"a\\u{ord(ch):04x}.py"
    assert not has_format("café/naïve.py") and not has_format("plain.py")
    for ch in JOINERS:
        assert not has_format(f"a{ch}b.py")
        assert shown_name(f"a{ch}b.py") == f"a{repr(ch)[1:-1]}b.py"  # accepted, but printed escaped
    assert check_relative_path("\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645.md", where="files[0]")
    assert shown_name("café.py") == "café.py"  # printable non-ASCII stays as is
    assert shown_name("a\nb\x9b\udcff") == "a\\nb\\x9b\\udcff"  # control characters and undecodable bytes too


@pytest.mark.parametrize("ch", FORMAT_CHARACTERS)
def test_pack_refuses_a_source_name_holding_a_format_character(tmp_path, ch):
    write_tree(tmp_path / "src" / "app", {"a.py": b"1\n", f"evil{ch}yp.txt": b"x\n"})
    (tmp_path / "s.toml").write_text(SPEC, encoding="utf-8")
    with pytest.raises(InvalidInputError) as caught:
        pack_bundle(tmp_path / "s.toml", tmp_path / "B", ui=QUIET)
    assert caught.value.exit_code == 4
    assert f"source path 'evil\\u{ord(ch):04x}yp.txt' has a Unicode format character" in str(caught.value)
    assert ch not in str(caught.value)  # printed escaped, never raw
    assert not (tmp_path / "B").exists()


def test_restore_refuses_a_member_that_would_show_as_its_neighbour(tmp_path):
    """forge.py case zw: `a\\u200b.py` next to `a.py` restored both, two files that list as one name."""
    bundle = forge_bundle(
        tmp_path / "b",
        [("source/app.tar.zst", "source/app", "source", [member("a\u200b.py", data=b"1"), member("a.py")])],
    )
    with pytest.raises(UnsafeArchiveError) as caught:
        restore_bundle(bundle, ui=QUIET)
    assert caught.value.exit_code == 6
    assert "member 'a\\u200b.py' has a Unicode format character" in str(caught.value)
    assert "\u200b" not in str(caught.value)
    assert not (bundle / "source" / "app").exists()


def test_a_bundle_json_path_holding_a_format_character_is_refused(tmp_path, capsys):
    with pytest.raises(InvalidInputError, match=r"path 'x\\u202etxt.py' holds a Unicode format character"):
        check_relative_path("x\u202etxt.py", where="files[0]")
    bundle = forge_bundle(tmp_path / "b", [], plain={"ok.txt": b"1\n"})
    (bundle / "x\u202etxt.py").write_bytes(b"1\n")
    doc = json.loads((bundle / "bundle.json").read_text(encoding="utf-8"))
    doc["files"].append({"path": "x\u202etxt.py", "size": 2, "sha256": hashlib.sha256(b"1\n").hexdigest()})
    (bundle / "bundle.json").write_text(json.dumps(doc), encoding="utf-8")
    assert portable.main(["verify", str(bundle)]) == InvalidInputError.exit_code
    err = capsys.readouterr().err
    assert "'x\\u202etxt.py' holds a Unicode format character" in err and "\u202e" not in err


def test_the_restore_summary_prints_a_name_it_did_not_write_escaped(tmp_path, capsys):
    """A file the bundle does not list (the user's, so never refused) is named in the summary with U+202E visible."""
    write_tree(tmp_path / "src" / "app", {"a.py": b"1\n"})
    (tmp_path / "s.toml").write_text(SPEC, encoding="utf-8")
    pack_bundle(tmp_path / "s.toml", tmp_path / "B", ui=QUIET)
    assert portable.main(["restore", str(tmp_path / "B")]) == 0
    (tmp_path / "B" / "notes\u202etxt.md").write_bytes(b"mine\n")
    capsys.readouterr()
    assert portable.main(["restore", str(tmp_path / "B")]) == 0
    err = capsys.readouterr().err
    assert "notes\\u202etxt.md" in err and "\u202e" not in err, err


@pytest.mark.parametrize("name", ["m\u200b.bin", "m\tx.bin"])
def test_pack_refuses_a_plain_file_name_bundle_json_would_refuse(tmp_path, name):
    """A [[file]] folder holding such a name was packed (exit 0) into a bundle.json that verify and restore refuse."""
    write_tree(tmp_path / "src", {"app/a.py": b"1\n", f"w/{name}": b"2\n"})
    (tmp_path / "s.toml").write_text(SPEC + '[[file]]\nsource = "w"\ndest = "w"\n', encoding="utf-8")
    with pytest.raises(InvalidInputError) as caught:
        pack_bundle(tmp_path / "s.toml", tmp_path / "B", ui=QUIET)
    assert str(caught.value).startswith(f"file path {'w/' + name!r} holds a control or Unicode format character")
    assert not (tmp_path / "B").exists()


def test_verify_names_an_extra_file_escaped(tmp_path, capsys):
    bundle = forge_bundle(tmp_path / "b", [], plain={"ok.txt": b"1\n"})
    (bundle / "notes\u202etxt.md").write_bytes(b"mine\n")
    assert portable.main(["verify", str(bundle)]) == 12
    err = capsys.readouterr()
    assert "extra    notes\\u202etxt.md" in err.out + err.err and "\u202e" not in err.out + err.err
