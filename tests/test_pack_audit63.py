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


def test_two_layers_at_one_target_are_refused_naming_both_not_as_a_damaged_bundle(tmp_path, capsys):
    """audit63 A L4: pack names a layer's archive by its target, so the second overwrote the first and the bundle.json
    check then called the bundle "damaged or hostile"; now the spec's own error, before anything is written."""
    (tmp_path / "src" / "b").mkdir(parents=True)
    (tmp_path / "src" / "b" / "y.txt").write_text("ho\n")
    second = LAYER.replace('source = "a"', 'source = "b"').replace('name = "a"', 'name = "b"')
    spec = _spec(tmp_path, LAYER + second)
    code, err = _pack(spec, tmp_path, capsys)
    assert code == 4, err
    assert err[0] == (
        f"error: {spec}: layer[1].target 'runtime/a' is layer[0]'s too, and pack writes one archive per target "
        "(runtime/a.tar.zst)"
    )
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


@pytest.mark.parametrize(
    ("source", "dest"), [("f.bin", "runtime"), ("f.bin", "runtime/a/f.bin"), ("stuff", "runtime/a/more")]
)
def test_a_file_dest_and_a_layer_target_one_inside_the_other_are_refused(tmp_path, capsys, source, dest):
    """audit63 A L4: a layer target under a [[file]] that is one file stopped pack with "File exists" and a free-space
    hint (exit 8); a [[file]] inside a layer target made a bundle verify refuses. Both: exit 4 naming the two."""
    spec = _spec(tmp_path, f'{LAYER}[[file]]\nsource = "{source}"\ndest = "{dest}"\n')
    (tmp_path / "src" / "stuff").mkdir()
    (tmp_path / "src" / "stuff" / "z.txt").write_text("z\n")
    code, err = _pack(spec, tmp_path, capsys)
    assert code == 4, err
    assert err[0] == f"error: {spec}: file[0].dest {dest!r} and layer[0].target 'runtime/a' lie one inside the other"
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


def test_a_file_folder_beside_a_layer_target_under_the_same_parent_still_packs(tmp_path, capsys):
    spec = _spec(tmp_path, f'{LAYER}[[file]]\nsource = "stuff"\ndest = "runtime"\n')
    (tmp_path / "src" / "stuff").mkdir()
    (tmp_path / "src" / "stuff" / "z.txt").write_text("z\n")
    code, err = _pack(spec, tmp_path, capsys)
    assert code == 0, err
    assert (tmp_path / "out" / "runtime" / "z.txt").read_text() == "z\n"


@pytest.mark.parametrize("dest", ["runtime/a.tar.zst/x", "runtime/a.members.json/y/z"])
def test_a_dest_inside_a_layers_archive_path_is_refused_not_a_disk_error(tmp_path, capsys, dest):
    """review63 R M1: only the exact archive/index path was caught; a dest inside one stopped pack with "File exists"
    and a free-space hint (exit 8)."""
    spec = _spec(tmp_path, f'{LAYER}[[file]]\nsource = "f.bin"\ndest = "{dest}"\n')
    code, err = _pack(spec, tmp_path, capsys)
    assert code == 4, err
    assert err[0].startswith(f"error: {spec}: file[0].dest {dest!r} and 'runtime/a.") and "lie one inside" in err[0]
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


def test_two_weights_manifests_of_one_file_name_are_refused_naming_both(tmp_path, capsys):
    """review63 R M2: pack copies each manifest to weights_manifest/<its name>: the second replaced the first (exit 0
    at 340bfc1), then was refused blaming a [[file]] entry the spec did not have."""
    for sub in ("m1", "m2"):
        (tmp_path / "src" / sub).mkdir(parents=True)
        (tmp_path / "src" / sub / "tiny.json").write_text("{}\n")
    body = "".join(f'[[weights]]\nmanifest = "src/{sub}/tiny.json"\ndest = "weights/{sub}"\n' for sub in ("m1", "m2"))
    spec = _spec(tmp_path, body)
    code, err = _pack(spec, tmp_path, capsys)
    assert code == 4, err
    assert err[0].startswith(f"error: {spec}: weights[1].manifest ") and "weights_manifest/tiny.json" in err[0]


@pytest.mark.parametrize("dest", ["./data", "data/", "data//x", "../data", "a\\\\b"])
def test_a_spec_dest_that_is_no_clean_bundle_path_gets_the_specs_error_not_a_damaged_bundles(tmp_path, capsys, dest):
    """review63 R L3: the error did not name the spec, and its hint said "the manifest is damaged or hostile; do not
    use this bundle" of a bundle not packed yet."""
    spec = _spec(tmp_path, f'[[file]]\nsource = "f.bin"\ndest = "{dest}"\n')
    code, err = _pack(spec, tmp_path, capsys)
    assert code == 4, err
    assert err[0].startswith(f"error: {spec}: file[0].dest: path ")
    assert err[1].startswith("hint: write it as a plain relative path inside the bundle") and "damaged" not in err[1]
