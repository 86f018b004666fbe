"""`portable pack` refuses what it used to write wrong with exit 0 (audit63 A):

- M1: a [[file]] (or a file of a [[file]] folder, or one in LICENSES/) at a path pack writes itself, a layer's
  `<target>.tar.zst` or `<target>.members.json` or the license index, was replaced without a word. Now exit 4,
  naming the entry and what pack writes there, and no bundle.
- M2: a [[file]] folder holding a name bundle.json refuses (a backslash) gave a bundle that every verify and restore
  called damaged. Now exit 4 naming the file and the rule; a layer member with a backslash stays allowed (restore
  extracts it, as pack's layer check agrees).

In-process through `portable.main`; small trees, fast."""

from __future__ import annotations

import pytest

from reproduction.portable import main


def _spec(tmp_path, body: str) -> object:
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True, exist_ok=True)
    (src / "a" / "x.txt").write_text("hi\n")
    (src / "f.bin").write_text("MY FILE\n")
    spec = tmp_path / "s.toml"
    spec.write_text(f'name = "pd"\nroot = "src"\n{body}')
    return spec


LAYER = '[[layer]]\nsource = "a"\nkind = "runtime"\nname = "a"\ntarget = "runtime/a"\n'


def _pack(spec, tmp_path, capsys) -> tuple[int, list[str]]:
    code = main(["pack", str(spec), "--out", str(tmp_path / "out"), "-q"])
    err = capsys.readouterr().err.strip().splitlines()
    return code, err


@pytest.mark.parametrize(
    ("dest", "what"),
    [("runtime/a.tar.zst", "the archive of layer[0]"), ("runtime/a.members.json", "the member index of layer[0]")],
)
@pytest.mark.parametrize("table", ["file", "config"])
def test_a_dest_at_a_layers_archive_or_index_is_refused(tmp_path, capsys, dest, what, table):
    spec = _spec(tmp_path, f'{LAYER}[[{table}]]\nsource = "f.bin"\ndest = "{dest}"\n')
    code, err = _pack(spec, tmp_path, capsys)
    assert code == 4, err
    assert err[0] == (
        f"error: {spec}: {table}[0].dest {dest!r} is {what} (target 'runtime/a'), which pack writes there"
    )
    assert err[1].startswith(f"hint: choose another dest for {table}[0]")
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


def test_a_file_of_a_file_folder_at_a_layers_archive_is_refused(tmp_path, capsys):
    spec = _spec(tmp_path, f'{LAYER}[[file]]\nsource = "stuff"\ndest = "runtime"\n')
    (tmp_path / "src" / "stuff").mkdir()
    (tmp_path / "src" / "stuff" / "a.tar.zst").write_text("MY FILE\n")
    code, err = _pack(spec, tmp_path, capsys)
    assert code == 4, err
    assert err[0].startswith("error: file 'runtime/a.tar.zst' (from ")
    assert "is the archive of layer[0] (target 'runtime/a'), which pack writes there" in err[0]
    assert err[1].startswith("hint: exclude it in the spec")
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


def test_a_file_at_the_license_index_is_refused(tmp_path, capsys):
    spec = _spec(tmp_path, '[[file]]\nsource = "f.bin"\ndest = "LICENSES/index.json"\n')
    code, err = _pack(spec, tmp_path, capsys)
    assert code == 4, err
    assert err[0].startswith("error: LICENSES/index.json: a [[file]] or [[config]] entry put a file there")
    assert "the license index" in err[0]
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


def test_a_file_beside_the_layer_archive_still_packs(tmp_path, capsys):
    spec = _spec(tmp_path, f'{LAYER}[[file]]\nsource = "f.bin"\ndest = "runtime/a.txt"\n')
    code, err = _pack(spec, tmp_path, capsys)
    assert code == 0, err
    assert (tmp_path / "out" / "runtime" / "a.txt").read_text() == "MY FILE\n"


def test_a_file_folder_holding_a_backslash_name_is_refused(tmp_path, capsys):
    spec = _spec(tmp_path, '[[file]]\nsource = "data"\ndest = "data"\n')
    (tmp_path / "src" / "data").mkdir()
    (tmp_path / "src" / "data" / "win\\path.txt").write_text("1\n")
    code, err = _pack(spec, tmp_path, capsys)
    assert code == 4, err
    assert err[0].startswith("error: file path 'data/win\\\\path.txt' (from ")
    assert "holds a backslash ('\\'), which bundle.json refuses" in err[0] and "nothing was packed" in err[0]
    assert err[1] == "hint: exclude it in the spec (exclude = [...]) or rename it in the source, then pack again"
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


def test_a_layer_member_with_a_backslash_still_packs_and_restores(tmp_path, capsys):
    spec = _spec(tmp_path, LAYER)
    (tmp_path / "src" / "a" / "win\\path.txt").write_text("1\n")
    code, err = _pack(spec, tmp_path, capsys)
    assert code == 0, err
    assert main(["restore", str(tmp_path / "out"), "-q"]) == 0
    assert (tmp_path / "out" / "runtime" / "a" / "win\\path.txt").read_text() == "1\n"
