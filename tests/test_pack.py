"""`portable pack`: reproducible layers, excludes, ${BUNDLE} configs, the runner copy, bundle.json last."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import pytest
import zstandard
from bundlekit import QUIET, SMALL_SPEC, run_cli, small_bundle, small_sources, tree_snapshot

from reproduction.errors import InputNotFoundError, InvalidInputError
from reproduction.release.archive import FIXED_MTIME
from reproduction.release.manifest import load_manifest
from reproduction.release.pack import pack_bundle, rewrite_config


def _members(archive):
    with open(archive, "rb") as fh, zstandard.ZstdDecompressor().stream_reader(fh) as stream:
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            return [(m.name, m.type, m.mode, m.mtime, m.uid, m.gid, m.uname, m.gname, m.linkname) for m in tar]


def test_packing_the_same_tree_twice_gives_identical_archives(tmp_path):
    first = small_bundle(tmp_path, name="one")
    os.utime(tmp_path / "src" / "project" / "README.md", (1, 1))  # mtimes and owners must not matter
    second = small_bundle(tmp_path, name="two")
    a, b = load_manifest(first), load_manifest(second)
    assert [(e.path, e.size, e.sha256) for e in a.files] == [(e.path, e.size, e.sha256) for e in b.files]
    assert [x.to_dict() for x in a.layers] == [x.to_dict() for x in b.layers]


def test_layer_members_are_sorted_with_fixed_owner_and_time(tmp_path):
    bundle = small_bundle(tmp_path)
    members = _members(bundle / "source" / "project.tar.zst")
    names = [m[0] for m in members]
    assert names == sorted(names, key=lambda n: n.encode())
    assert names == [
        ".",  # the layer's own folder, for its mode (audit63 A L9)
        "README.md",
        "recap",
        "recap/__init__.py",
        "recap/latest.py",
        "recap/stages",
        "recap/stages/returns.py",
        "recap/stages/value.py",
    ]  # __pycache__ and *.pyc excluded
    assert {(m[3], m[4], m[5], m[6], m[7]) for m in members} == {(FIXED_MTIME, 0, 0, "", "")}
    link = [m for m in members if m[0] == "recap/latest.py"][0]
    assert (link[1], link[8]) == (tarfile.SYMTYPE, "stages/returns.py")
    rt = {m[0]: m[2] for m in _members(bundle / "runtime" / "rt.tar.zst")}
    assert rt["bin/tool"] == 0o755 and rt["share/data.txt"] == 0o644


def test_manifest_lists_every_file_and_is_written_last(tmp_path):
    bundle = small_bundle(tmp_path)
    manifest = load_manifest(bundle)
    on_disk = sorted(str(p.relative_to(bundle)) for p in bundle.rglob("*") if p.is_file())
    assert on_disk == sorted([e.path for e in manifest.files] + ["bundle.json"])
    assert not (tmp_path / "bundle.partial").exists()
    assert {
        "weights/model.safetensors",
        "weights/tokenizer.json",
        "data/episodes.parquet",
        "config/run.json",
        "reproduction/portable.py",
        "reproduction/release/restore.py",
    } <= {e.path for e in manifest.files}
    assert not any("__pycache__" in e.path for e in manifest.files)
    assert [(x.archive, x.target, x.kind, x.members) for x in manifest.layers] == [
        ("source/project.tar.zst", "source/project", "source", 8),  # each with its own folder `./` (audit63 A L9)
        ("runtime/rt.tar.zst", "runtime/rt", "runtime", 10),
    ]
    assert manifest.layers[1].unpacked_size == sum(len(v) for v in __import__("bundlekit").RUNTIME_FILES.values())
    assert manifest.entry_config == "config/run.json"
    assert oct(os.stat(bundle / "bundle.json").st_mode & 0o777) == oct(0o644)


def test_configs_get_bundle_placeholders_for_packed_paths_only(tmp_path):
    bundle = small_bundle(tmp_path)
    config = json.loads((bundle / "config" / "run.json").read_text())
    assert config == {
        "weights": "${BUNDLE}/weights/model.safetensors",
        "data": "${BUNDLE}/data",
        "elsewhere": "/usr/share/dict",
    }


def test_rewrite_config_matches_whole_path_components_longest_first():
    mapping = {"/a/b": "${BUNDLE}/x", "/a/b/c": "${BUNDLE}/y"}
    assert (
        rewrite_config("p=/a/b/c/d q=/a/b r=/a/bc s=/a/b/e", mapping)
        == "p=${BUNDLE}/y/d q=${BUNDLE}/x r=/a/bc s=${BUNDLE}/x/e"
    )


def test_absolute_symlink_into_a_layer_becomes_relative(tmp_path):
    src = tmp_path / "tree"
    (src / "lib").mkdir(parents=True)
    (src / "lib" / "real.so").write_bytes(b"so")
    os.symlink(src / "lib" / "real.so", src / "lib" / "alias.so")
    (tmp_path / "s.toml").write_text(f'name = "s"\n[[layer]]\nsource = "{src}"\nkind = "runtime"\nname = "t"\n')
    pack_bundle(tmp_path / "s.toml", tmp_path / "b", ui=QUIET)
    assert ("lib/alias.so", tarfile.SYMTYPE) in [
        (m[0], m[1]) for m in _members(tmp_path / "b" / "runtime" / "t.tar.zst")
    ]
    link = [m for m in _members(tmp_path / "b" / "runtime" / "t.tar.zst") if m[0] == "lib/alias.so"][0]
    assert link[8] == "real.so"


def test_absolute_symlink_out_of_every_layer_is_refused(tmp_path):
    src = tmp_path / "tree"
    src.mkdir()
    os.symlink("/etc/hostname", src / "host")
    (tmp_path / "s.toml").write_text(f'name = "s"\n[[layer]]\nsource = "{src}"\n')
    with pytest.raises(InvalidInputError, match="points to '/etc/hostname', outside every packed layer"):
        pack_bundle(tmp_path / "s.toml", tmp_path / "b", ui=QUIET)
    assert not (tmp_path / "b").exists() and not (tmp_path / "b.partial").exists()


def test_fifo_in_a_layer_is_refused_naming_it(tmp_path):
    src = tmp_path / "tree"
    src.mkdir()
    os.mkfifo(src / "pipe")
    (tmp_path / "s.toml").write_text(f'name = "s"\n[[layer]]\nsource = "{src}"\n')
    with pytest.raises(InvalidInputError, match="pipe is a special file"):
        pack_bundle(tmp_path / "s.toml", tmp_path / "b", ui=QUIET)


@pytest.mark.parametrize(
    "spec, field",
    [
        ('[[layer]]\nsource = "x"\n', "spec.name"),
        ('name = "n"\n[[layer]]\nkind = "runtime"\n', "layer[0].source"),
        ('name = "n"\n[[layer]]\nsource = "."\nkind = "weird"\n', "layer[0].kind"),
        ('name = "n"\n[[file]]\nsource = "."\ndest = "../up"\n', "file[0].dest"),
        ("name = 3\n", "spec.name"),
    ],
)
def test_spec_errors_name_the_field(tmp_path, spec, field):
    (tmp_path / "s.toml").write_text(spec)
    with pytest.raises(InvalidInputError) as info:
        pack_bundle(tmp_path / "s.toml", tmp_path / "b", ui=QUIET)
    assert info.value.field == field


def test_cli_pack_errors_are_one_line_with_exit_codes(tmp_path):
    missing = run_cli("pack", tmp_path / "nope.toml", "--out", tmp_path / "b")
    assert missing.returncode == InputNotFoundError.exit_code == 3
    assert missing.stderr.startswith(f"error: {tmp_path / 'nope.toml'}: spec not found\nhint: ")
    small_sources(tmp_path)
    (tmp_path / "small.toml").write_text(SMALL_SPEC)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "f").write_text("x")
    taken = run_cli("pack", tmp_path / "small.toml", "--out", tmp_path / "taken")
    assert taken.returncode == 4 and "already exists and is not empty" in taken.stderr
    ok = run_cli("pack", tmp_path / "small.toml", "--out", tmp_path / "fresh")
    assert ok.returncode == 0, ok.stderr
    assert "packed small: " in ok.stderr and ok.stdout == ""


def test_pack_out_that_is_a_file_is_exit_3_as_in_every_command(tmp_path):
    """audit46 newcomer F12: `pack --out FILE` was exit 4 "already exists and is not empty" (of an empty file);
    fetch, restore and check call a file where a folder goes exit 3 "is a file, not a folder"."""
    small_sources(tmp_path)
    (tmp_path / "small.toml").write_text(SMALL_SPEC)
    (tmp_path / "f").write_text("")
    for out, first in (
        (tmp_path / "f", f"error: {tmp_path / 'f'} is a file, not a folder"),
        (
            tmp_path / "f" / "b",
            f"error: cannot create {tmp_path / 'f' / 'b'}: {tmp_path / 'f'} is a file, not a folder",
        ),
    ):
        done = run_cli("pack", tmp_path / "small.toml", "--out", out)
        assert done.returncode == 3
        assert done.stderr.splitlines() == [first, "hint: pass a new or empty folder with --out"]
    assert (tmp_path / "f").read_text() == ""


def test_pack_out_among_the_sources_is_refused_before_anything_is_written(tmp_path):
    """audit47 F1: `--out` inside a layer's source folder packed pack's own half-written `<out>.partial/` into the
    layer (exit 0, and verify passed it), and each later pack the whole previous bundle. A staging folder that holds
    a source was deleted with the user's files in it by pack's cleanup."""
    small_sources(tmp_path)
    (tmp_path / "small.toml").write_text(SMALL_SPEC)
    src = tmp_path / "src"
    before = tree_snapshot(src)
    hint = "hint: pack into a folder outside every source the spec names, e.g. --out /tmp/small-bundle"
    cases = {
        src / "project" / "inner": f"error: --out {src / 'project' / 'inner'} lies inside layer[0].source "
        f"{src / 'project'}: pack would read its own half-written bundle as a source",
        src / "weights": f"error: --out {src / 'weights'} is file[0].source: pack would read its own half-written "
        "bundle as a source",
        src / "configs" / "run.json": f"error: --out {src / 'configs' / 'run.json'} is config[0].source: pack would "
        "read its own half-written bundle as a source",
    }
    for out, first in cases.items():
        done = run_cli("pack", tmp_path / "small.toml", "--out", out)
        assert done.returncode == 4, done.stderr
        assert done.stderr.splitlines() == [first, hint]
        assert not os.path.lexists(f"{out}.partial")
    assert tree_snapshot(src) == before, "nothing written into the sources"


def test_pack_whose_staging_folder_holds_a_source_is_refused_and_the_source_kept(tmp_path):
    """audit47 F1: `<out>.partial` is removed before and after a pack; a source inside it went with it."""
    small_sources(tmp_path)
    (tmp_path / "b.partial").mkdir()
    os.rename(tmp_path / "src", tmp_path / "b.partial" / "src")
    (tmp_path / "small.toml").write_text(SMALL_SPEC.replace('root = "src"', 'root = "b.partial/src"'))
    before = tree_snapshot(tmp_path / "b.partial")
    done = run_cli("pack", tmp_path / "small.toml", "--out", tmp_path / "b")
    assert done.returncode == 4, done.stderr
    assert done.stderr.splitlines()[0] == (
        f"error: --out's staging folder {tmp_path / 'b'}.partial holds layer[0].source "
        f"{tmp_path / 'b.partial' / 'src' / 'project'}: pack would read its own half-written bundle as a source"
    )
    assert tree_snapshot(tmp_path / "b.partial") == before and not (tmp_path / "b").exists()


@pytest.mark.parametrize(
    "spec, lines",
    [
        (
            'name = "n"\nbogus = 1\n',
            [
                "unknown key 'bogus' in the top level",
                "hint: the keys of the top level are name, description, root, entry_config, layer, file, config, "
                "paths, weights, licenses (`portable pack --help` shows the format)",
            ],
        ),
        (
            'name = "n"\n[[file]]\nsource = "data"\nexclud = ["*.txt"]\n',
            [
                "unknown key 'exclud' in file[0]",
                "hint: did you mean 'exclude'? the keys of file[0] are source, dest, exclude, origin (`portable pack "
                "--help` shows the format)",
            ],
        ),
        (
            'name = "n"\n[[layer]]\nsource = "data"\nrelocateable = true\n',
            [
                "unknown key 'relocateable' in layer[0]",
                "hint: did you mean 'relocatable'? the keys of layer[0] are source, kind, name, target, exclude, "
                "relocatable, build_prefix, order, origin (`portable pack --help` shows the format)",
            ],
        ),
        (
            'name = "../../x"\n',
            [
                "spec.name '../../x' is not a usable name (empty, '.', '..', a '/' or '\\', a control character or "
                "surrounding spaces)",
                "hint: use letters, digits, '-', '_' and '.', e.g. name = \"recap-demo\"",
            ],
        ),
        (
            'name = ""\n',
            [
                "spec.name '' is not a usable name (empty, '.', '..', a '/' or '\\', a control character or "
                "surrounding spaces)",
                "hint: use letters, digits, '-', '_' and '.', e.g. name = \"recap-demo\"",
            ],
        ),
        (
            'name = "n"\n[[layer]]\nsource = "data"\nname = ".."\n',
            [
                "layer[0].name '..' is not a usable name (empty, '.', '..', a '/' or '\\', a control character or "
                "surrounding spaces)",
                "hint: use letters, digits, '-', '_' and '.', e.g. name = \"recap-demo\"",
            ],
        ),
        (
            'name = "n"\n[[file]]\nsource = "data"\ndest = "runs"\n',
            [
                "file dest 'runs' is left to runs (verify and restore ignore it)",
                "hint: choose another dest: none may start with bundle.json, .portable, reproduction, runs",
            ],
        ),
        (
            'name = "n"\n[[layer]]\nsource = "data"\ntarget = "runs/x"\n',
            [
                "layer target 'runs/x' is left to runs (verify and restore ignore it)",
                "hint: choose another target: none may start with bundle.json, .portable, reproduction, runs",
            ],
        ),
    ],
    ids=["top-key", "file-typo", "layer-typo", "name-dotdot", "name-empty", "layer-name", "dest-runs", "target-runs"],
)
def test_spec_unknown_keys_bad_names_and_runs_are_refused_before_anything_is_written(tmp_path, spec, lines):
    """audit47 F4: a typo'd key was ignored (`exclud` packed the files it meant to leave out), `../../x` and `` went
    into bundle.json as the name, and a dest under `runs/` (left to runs) was packed. Exit 4, file and key named."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "d.txt").write_text("d")
    (tmp_path / "s.toml").write_text(spec)
    for argv in (["--out", tmp_path / "b"], ["--out", tmp_path / "b", "--dry-run"]):
        done = run_cli("pack", tmp_path / "s.toml", *argv)
        assert done.returncode == 4, done.stderr
        assert done.stderr.splitlines() == [f"error: {tmp_path / 's.toml'}: {lines[0]}", lines[1]]
        assert not os.path.lexists(tmp_path / "b") and not os.path.lexists(tmp_path / "b.partial")


@pytest.mark.parametrize("spec", ["demo.toml", "demo_libero.toml", "grpo.toml", "libero10.toml"])
def test_the_repository_specs_still_load(spec):
    """The stricter spec reading (audit47 F4) accepts every spec the repository ships."""
    from reproduction.release.spec import load_spec

    loaded = load_spec(Path(__file__).resolve().parent.parent / "bundle" / spec, missing=[])
    assert loaded.name and (loaded.layers or loaded.files)


def test_relative_symlink_leaving_the_bundle_is_refused_in_packs_own_words(tmp_path):
    """audit48 F8: pack said restore's "nothing was extracted ... ask its publisher to re-pack", exit 6."""
    src = tmp_path / "tree"
    src.mkdir()
    os.symlink("../../../outside", src / "out")
    (tmp_path / "s.toml").write_text(f'name = "s"\n[[layer]]\nsource = "{src}"\nkind = "runtime"\nname = "rt"\n')
    done = run_cli("pack", tmp_path / "s.toml", "--out", tmp_path / "b")
    assert done.returncode == InvalidInputError.exit_code == 4, done.stderr
    first, hint = done.stderr.splitlines()[-2:]  # after the progress line
    assert first.startswith("error: a layer holds what restore would refuse, so nothing was packed: ")
    assert "runtime/rt.tar.zst: source path 'out' is a symlink to '../../../outside', which leaves the bundle" in first
    assert hint.startswith("hint: exclude it in the spec") and "publisher" not in hint
    assert "extracted" not in done.stderr
    assert not (tmp_path / "b").exists() and not (tmp_path / "b.partial").exists()


def test_a_source_tree_deeper_than_restore_allows_is_refused_not_an_internal_error(tmp_path):
    """audit48 F9: a ~1000-deep source was exit 1 RecursionError; now exit 4 naming the depth limit."""
    src = tmp_path / "tree"
    deep = src
    for _ in range(1100):  # os.makedirs recurses too
        deep = deep / "d"
        deep.mkdir(parents=deep.parent == src)
    (deep / "f").write_text("x")
    (tmp_path / "s.toml").write_text(f'name = "s"\n[[layer]]\nsource = "{src}"\nkind = "runtime"\nname = "rt"\n')
    try:
        done = run_cli("pack", tmp_path / "s.toml", "--out", tmp_path / "b")
    finally:  # removed bottom-up here: pytest's own clean-up of old temp folders is a recursive rmtree, which this
        (deep / "f").unlink()  # depth would crash (RecursionError) in a later session on this machine
        while deep != src:
            deep.rmdir()
            deep = deep.parent
    assert done.returncode == 4, done.stderr
    assert done.stderr.splitlines()[-2].startswith("error: ") and "Traceback" not in done.stderr
    assert "folders deep, more than the 256 restore allows" in done.stderr
    assert not (tmp_path / "b").exists() and not (tmp_path / "b.partial").exists()
