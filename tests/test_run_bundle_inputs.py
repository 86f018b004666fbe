"""`portable run` on a bundle checks what it reads from it before any worker starts.

- every bundle file the run reads (the datasets, the entry config, anything a config path names inside
  the bundle) against `bundle.json`, like `portable verify` and with its exit code (14 a flipped bit,
  13 a truncated file, 12 a file bundle.json does not list, 11 a missing one), stat-stamped so an
  unchanged bundle is not rehashed;
- a bundle with layers must be restored first (exit 57, naming `portable restore BUNDLE`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from reproduction.portable import main

FEATURES = {"observation.state": {"dtype": "float32", "shape": [2]}, "is_success": {"dtype": "bool", "shape": [1]}}
RUNTIME = {"bin/tool": b"#!/bin/sh\necho tool\n", "share/data.txt": b"x" * 500}


def _dataset(root: Path) -> Path:
    from reproduction.data.writer import EpisodeData, write_dataset

    rng = np.random.default_rng(0)
    eps = [
        EpisodeData(
            episode_index=e,
            task="t",
            frames={"observation.state": rng.normal(size=(4, 2)).astype(np.float32), "is_success": np.full(4, e == 0)},
        )
        for e in range(3)
    ]
    return write_dataset(root, eps, fps=10, features=FEATURES)


def _pack(root: Path, name: str, *, layer: bool) -> Path:
    from bundlekit import QUIET, write_tree

    from reproduction.release.pack import pack_bundle

    src = root / f"src-{name}"
    ds = _dataset(src / "roll")
    (src / "run.yaml").write_text('datasets:\n  - {path: "${BUNDLE}/data/roll", type: rollout}\n')
    spec = f'name = "{name}"\nroot = "."\nentry_config = "config/run.yaml"\n'
    spec += (
        f'[[file]]\nsource = "{ds}"\ndest = "data/roll"\n[[config]]\nsource = "run.yaml"\ndest = "config/run.yaml"\n'
    )
    if layer:
        write_tree(src / "runtime", RUNTIME)
        spec += '[[layer]]\nsource = "runtime"\nkind = "runtime"\nname = "rt"\n'
    (src / "spec.toml").write_text(spec)
    pack_bundle(src / "spec.toml", root / name, ui=QUIET)
    return root / name


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return _pack(tmp_path_factory.mktemp("bundles"), "plain", layer=False)


@pytest.fixture
def bundle(packed, tmp_path, monkeypatch):
    monkeypatch.setenv("PORTABLE_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "b"
    shutil.copytree(packed, out)
    return out


def _data_file(bundle: Path) -> Path:
    return sorted((bundle / "data" / "roll" / "data").rglob("*.parquet"))[0]


def _run(bundle: Path, out: Path, capsys) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(["-q", "run", str(bundle), "--output", str(out), "--stages", "returns"])
    return rc, capsys.readouterr().err


def _one_line(err: str, words: str) -> None:
    lines = err.strip().splitlines()
    assert lines[0].startswith("error: ") and words in lines[0], err
    assert len(lines) == 2 and lines[1].startswith("hint: "), err
    assert "Traceback" not in err


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 1
    path.write_bytes(bytes(data))


def test_a_flipped_bit_in_a_bundled_dataset_stops_the_run_with_verifys_code(bundle, tmp_path, capsys):
    rel = _data_file(bundle).relative_to(bundle).as_posix()
    _flip(_data_file(bundle), 40)
    rc, err = _run(bundle, tmp_path / "out", capsys)
    assert rc == 14, err
    head = f"bundle files: 1 file(s) the run reads differ from {bundle.resolve()}/bundle.json"
    _one_line(err, f"{head}: digest {rel}: expected sha256")
    assert not (tmp_path / "out").exists()  # nothing started, nothing written
    assert main(["-q", "verify", str(bundle)]) == 14  # the same code verify gives


@pytest.mark.parametrize(
    "damage, code, words",
    [
        (lambda p: p.write_bytes(p.read_bytes()[:-1]), 13, "size data/roll/data/"),
        (lambda p: p.unlink(), 11, "missing data/roll/data/"),
        (
            lambda p: (p.parent / "x.parquet").write_bytes(p.read_bytes()),
            12,
            "extra data/roll/data/chunk-000/x.parquet",
        ),
    ],
    ids=["truncated", "missing", "extra"],
)
def test_other_damage_to_a_bundled_dataset_gives_verifys_code(bundle, tmp_path, capsys, damage, code, words):
    damage(_data_file(bundle))
    rc, err = _run(bundle, tmp_path / "out", capsys)
    assert rc == code, err
    _one_line(err, words)


def test_the_bundles_entry_config_is_checked_too(bundle, tmp_path, capsys):
    cfg = bundle / "config" / "run.yaml"
    cfg.write_text(cfg.read_text().replace("rollout", "rollout"[:7]) + "# edited\n")
    rc, err = _run(bundle, tmp_path / "out", capsys)
    assert rc == 13, err
    _one_line(err, "size config/run.yaml")


def test_a_clean_check_is_stamped_and_a_later_change_is_still_caught(bundle, tmp_path, capsys):
    rc, err = _run(bundle, tmp_path / "out", capsys)
    assert rc == 0, err
    stamps = list((tmp_path / "cache" / "fingerprints").glob("files-*.txt"))
    assert len(stamps) == 1 and "data/roll" in stamps[0].read_text()
    assert "config/run.yaml" in stamps[0].read_text()
    # the stamp is what lets a finished --resume skip the rehash: with it, a finished resume reads no data file
    rc, err = _run_resume(bundle, tmp_path / "out", capsys)
    assert rc == 0, err
    _flip(_data_file(bundle), 40)  # a new mtime: the stamp no longer matches, the file is rehashed
    rc, err = _run_resume(bundle, tmp_path / "out", capsys)
    assert rc == 14, err


def _run_resume(bundle: Path, out: Path, capsys) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(["-q", "run", str(bundle), "--output", str(out), "--stages", "returns", "--resume"])
    return rc, capsys.readouterr().err


def test_the_stamp_shortcut_skips_hashing(bundle, tmp_path, capsys, monkeypatch):
    assert _run(bundle, tmp_path / "out", capsys)[0] == 0
    import reproduction.release.verify as verify

    hashed: list[str] = []
    real = verify.hash_entries
    monkeypatch.setattr(
        verify,
        "hash_entries",
        lambda b, entries, **kw: hashed.extend(e.path for e in entries) or real(b, entries, **kw),
    )
    rc, err = _run_resume(bundle, tmp_path / "out", capsys)
    assert rc == 0, err
    assert hashed == []


def test_a_packed_bundle_with_layers_must_be_restored_first(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PORTABLE_CACHE_DIR", str(tmp_path / "cache"))
    bundle = _pack(tmp_path, "layered", layer=True)
    rc, err = _run(bundle, tmp_path / "out", capsys)
    assert rc == 57, err
    _one_line(err, f"bundle {bundle.resolve()} has 1 layer(s), not restored: no receipt at")
    assert f"hint: run `portable restore {bundle.resolve()}` first" in err
    assert not (tmp_path / "out").exists()
    assert main(["-q", "restore", str(bundle)]) == 0
    rc, err = _run(bundle, tmp_path / "out", capsys)
    assert rc == 0, err
    assert json.loads((tmp_path / "out" / "run.json").read_text())["stages"]["returns"]["status"] == "complete"


def test_a_config_path_into_a_restored_layer_is_left_to_restores_receipt(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PORTABLE_CACHE_DIR", str(tmp_path / "cache"))
    bundle = _pack(tmp_path, "layered", layer=True)
    assert main(["-q", "restore", str(bundle)]) == 0
    capsys.readouterr()
    rc = main(
        ["-q", "run", str(bundle), "--output", str(tmp_path / "out"), "--stages", "returns"]
        + [f"policy.model.tokenizer={bundle}/runtime/rt/share", f"eval.reference={bundle}/runtime"]
    )
    assert rc == 0, capsys.readouterr().err  # the layer's files are not in bundle.json's file list: not "extra"


@pytest.mark.parametrize("damage", ["deleted", "a folder"])
def test_a_bundle_without_its_manifest_is_refused_and_a_run_without_bundle_still_works(
    bundle, tmp_path, capsys, damage
):
    """audit47 F3: with bundle.json deleted (an interrupted fetch writes it last) or a folder, `run BUNDLE` checked
    nothing and ran the stage (exit 0), where the same bundle with its manifest is checked. Exit 3, as verify says it
    of the same folder, before anything is written. A run with --config and no BUNDLE is no bundle's run."""
    manifest = bundle / "bundle.json"
    manifest.unlink()
    if damage == "a folder":
        manifest.mkdir()
    else:  # what fetch and restore leave in a folder they worked in
        (bundle / ".portable" / "partial").mkdir(parents=True, exist_ok=True)
    rc, err = _run(bundle, tmp_path / "out", capsys)
    state = "is a folder, not a file" if damage == "a folder" else "does not exist"
    assert rc == 3, err
    assert err.splitlines() == [
        f"error: bundle {bundle} has no readable manifest: {manifest} {state}, so nothing it holds can be checked",
        "hint: an interrupted `portable fetch` leaves a folder like this: run the same fetch again, then "
        f"`portable restore {bundle}`; or run with --config alone, without BUNDLE",
    ]
    assert not (tmp_path / "out").exists()
    config = tmp_path / "run.yaml"
    config.write_text(f'datasets:\n  - {{path: "{bundle}/data/roll", type: rollout}}\n')
    rc = main(["-q", "run", "--config", str(config), "--output", str(tmp_path / "out"), "--stages", "returns"])
    assert rc == 0, capsys.readouterr().err


@pytest.mark.parametrize("how", ["override", "config file"])
def test_a_bundle_named_by_bundle_key_is_checked_for_its_manifest_as_the_positional_one(bundle, tmp_path, capsys, how):
    """audit47 F3 at stop 48a: `BUNDLE=DIR` (an override, or `BUNDLE:` in a --config file) ran a folder whose
    bundle.json was missing (fetch's leftovers) unchecked, where `run DIR` refuses it (exit 3)."""
    manifest = bundle / "bundle.json"
    manifest.unlink()
    (bundle / ".portable" / "partial").mkdir(parents=True, exist_ok=True)
    config = tmp_path / "run.yaml"
    config.write_text(
        (f"BUNDLE: {bundle}\n" if how == "config file" else "")
        + 'datasets:\n  - {path: "${BUNDLE}/data/roll", type: rollout}\n'
    )
    extra = [f"BUNDLE={bundle}"] if how == "override" else []
    capsys.readouterr()
    rc = main(["-q", "run", "--config", str(config), "--output", str(tmp_path / "out"), "--stages", "returns", *extra])
    err = capsys.readouterr().err
    assert rc == 3, err
    assert err.splitlines()[0] == (
        f"error: bundle {bundle} has no readable manifest: {manifest} does not exist, "
        "so nothing it holds can be checked"
    )
    assert not (tmp_path / "out").exists()


def test_a_folder_no_tool_made_a_bundle_of_runs_as_before(bundle, tmp_path, capsys):
    """A BUNDLE folder of configs and data written by hand (no bundle.json, no .portable/, no runner copy: no fetch,
    restore or pack worked in it) runs as before: there is no manifest to check it against."""
    (bundle / "bundle.json").unlink()
    shutil.rmtree(bundle / ".portable", ignore_errors=True)
    shutil.rmtree(bundle / "reproduction")
    rc = main(["-q", "run", str(bundle), "--output", str(tmp_path / "out"), "--stages", "returns"])
    assert rc == 0, capsys.readouterr().err


@pytest.mark.parametrize("layer", [False, True])
def test_a_packed_bundle_whose_manifest_was_deleted_is_refused_before_any_restore(tmp_path, capsys, layer):
    """audit59 H10: a bundle as `pack` (or a fetch) left it, never restored, so with no .portable/, ran unchecked
    (exit 0, the run folder written) once its bundle.json was deleted, where README's table says exit 3. What pack
    writes into every bundle (the runner's copy, a layer's member index) now marks it as one."""
    bundle = _pack(tmp_path, "packed", layer=layer)
    assert not (bundle / ".portable").exists()
    if layer:  # the layer's member index alone marks it
        shutil.rmtree(bundle / "reproduction")
        assert sorted(p.name for p in bundle.glob("*/*.members.json")) == ["rt.members.json"]
    manifest = bundle / "bundle.json"
    manifest.unlink()
    rc, err = _run(bundle, tmp_path / "out", capsys)
    assert rc == 3, err
    assert err.splitlines()[0] == (
        f"error: bundle {bundle} has no readable manifest: {manifest} does not exist, "
        "so nothing it holds can be checked"
    )
    assert not (tmp_path / "out").exists()
