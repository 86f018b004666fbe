"""Every command's path arguments given the wrong kind of thing: a file for a folder, a folder for a file, a
symbolic link to nothing, a symbolic-link loop, an unreadable file, a run folder inside the bundle. Each is one
`error:` line naming the path (plus a hint), a documented exit code (3: not found / unreadable / not resolvable /
a folder for a file; 4: not a spec; 55: not usable as a run folder), no traceback, nothing created. Nothing trains:
each fails first."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reproduction.portable import main


@pytest.fixture
def paths(tmp_path):
    f = tmp_path / "a file.toml"
    f.write_text("x = 1\n")
    (tmp_path / "a folder").mkdir()
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "loop a").symlink_to(tmp_path / "loop b")
    (tmp_path / "loop b").symlink_to(tmp_path / "loop a")
    bundle = tmp_path / "bundle"
    (bundle / "config").mkdir(parents=True)
    (bundle / "config" / "run.yaml").write_text("datasets: []\n")
    return {
        "file": f,
        "folder": tmp_path / "a folder",
        "dangling": tmp_path / "dangling",
        "loop": tmp_path / "loop a",
        "bundle": bundle,
        "inside bundle": bundle / "data" / "x",
        "out": tmp_path / "out",
    }


# (command, kind, argv builder, exit code, words in the error line)
SWEEP = [
    ("pack SPEC", "folder", lambda p, x: ["pack", str(x), "--out", str(p["out"])], 3, "is a folder, not a spec file"),
    ("pack SPEC", "dangling", lambda p, x: ["pack", str(x), "--out", str(p["out"])], 3, "which does not exist"),
    ("pack SPEC", "loop", lambda p, x: ["pack", str(x), "--out", str(p["out"])], 3, "symbolic-link loop"),
    ("pack --out", "loop", lambda p, x: ["pack", str(p["file"]), "--out", str(x)], 3, "symbolic-link loop"),
    ("verify BUNDLE", "file", lambda p, x: ["verify", str(x)], 3, "is a file, not a bundle folder"),
    ("verify BUNDLE", "dangling", lambda p, x: ["verify", str(x)], 3, "which does not exist"),
    ("verify BUNDLE", "loop", lambda p, x: ["verify", str(x)], 3, "symbolic-link loop"),
    ("restore BUNDLE", "file", lambda p, x: ["restore", str(x)], 3, "is a file, not a bundle folder"),
    ("restore BUNDLE", "dangling", lambda p, x: ["restore", str(x)], 3, "which does not exist"),
    ("restore BUNDLE", "loop", lambda p, x: ["restore", str(x)], 3, "symbolic-link loop"),
    ("weights verify MANIFEST", "folder", lambda p, x: ["weights", "verify", str(x), str(p["out"])], 3, "directory"),
    ("weights verify MANIFEST", "loop", lambda p, x: ["weights", "verify", str(x), str(p["out"])], 3, "loop"),
    ("weights fetch DIR", "dangling", lambda p, x: ["weights", "fetch", str(p["file"]), str(x)], 3, "does not exist"),
    ("lineage RUN_DIR", "file", lambda p, x: ["lineage", str(x)], 3, "no lineage in"),
    ("lineage RUN_DIR", "dangling", lambda p, x: ["lineage", str(x)], 3, "which does not exist"),
    ("lineage RUN_DIR", "loop", lambda p, x: ["lineage", str(x)], 3, "symbolic-link loop"),
    ("run --output", "file", lambda p, x: ["run", "--output", str(x)], 55, "is a file, not a folder"),
    ("run --output", "dangling", lambda p, x: ["run", "--output", str(x)], 3, "which does not exist"),
    ("run --output", "loop", lambda p, x: ["run", "--output", str(x)], 3, "symbolic-link loop"),
    (
        "run --output",
        "inside bundle",
        lambda p, x: ["run", str(p["bundle"]), "--output", str(x)],
        55,
        "inside the bundle",
    ),
    ("run --config", "folder", lambda p, x: ["run", "--config", str(x), "--output", str(p["out"])], 3, "is a folder"),
    ("run --config", "dangling", lambda p, x: ["run", "--config", str(x), "--output", str(p["out"])], 3, "not exist"),
    ("run --config", "loop", lambda p, x: ["run", "--config", str(x), "--output", str(p["out"])], 3, "loop"),
    ("run BUNDLE", "file", lambda p, x: ["run", str(x), "--output", str(p["out"])], 3, "is not a folder"),
    ("run BUNDLE", "dangling", lambda p, x: ["run", str(x), "--output", str(p["out"])], 3, "which does not exist"),
    ("run BUNDLE", "loop", lambda p, x: ["run", str(x), "--output", str(p["out"])], 3, "symbolic-link loop"),
    ("eval --output", "file", lambda p, x: ["eval", "--checkpoint", "1", "--output", str(x)], 55, "is a file"),
    ("eval --output", "dangling", lambda p, x: ["eval", "--checkpoint", "1", "--output", str(x)], 3, "not exist"),
    ("eval --output", "loop", lambda p, x: ["eval", "--checkpoint", "1", "--output", str(x)], 3, "symbolic-link loop"),
    (
        "eval --checkpoint",
        "file",
        lambda p, x: ["eval", "--checkpoint", str(x), "--output", str(p["out"])],
        3,
        "export",
    ),
    (
        "eval --checkpoint",
        "folder",
        lambda p, x: ["eval", "--checkpoint", str(x), "--output", str(p["out"])],
        3,
        "export",
    ),
    ("eval --checkpoint", "loop", lambda p, x: ["eval", "--checkpoint", str(x), "--output", str(p["out"])], 3, "loop"),
    ("demo --output", "file", lambda p, x: ["demo", "--quick", "--output", str(x)], 55, "is a file, not a folder"),
    ("demo --output", "dangling", lambda p, x: ["demo", "--quick", "--output", str(x)], 3, "which does not exist"),
    ("demo --output", "loop", lambda p, x: ["demo", "--quick", "--output", str(x)], 3, "symbolic-link loop"),
    ("compare REFERENCE", "dangling", lambda p, x: ["compare", str(x), str(p["file"])], 3, "which does not exist"),
    ("compare REFERENCE", "loop", lambda p, x: ["compare", str(x), str(p["file"])], 3, "symbolic-link loop"),
    ("compare ACTUAL", "dangling", lambda p, x: ["compare", str(p["file"]), str(x)], 3, "which does not exist"),
    ("compare ACTUAL", "loop", lambda p, x: ["compare", str(p["file"]), str(x)], 3, "symbolic-link loop"),
    ("compare --out", "loop", lambda p, x: ["compare", str(p["file"]), str(p["file"]), "--out", str(x)], 3, "loop"),
    # check --json FILE (the report file): refused before the check runs, not exit 8 after it
    ("check --json", "loop", lambda p, x: ["check", "--device", "cpu", "--json", str(x)], 3, "symbolic-link loop"),
    ("check --json", "dangling", lambda p, x: ["check", "--device", "cpu", "--json", str(x)], 3, "does not exist"),
    (
        "check --json",
        "folder",
        lambda p, x: ["check", str(p["bundle"]), "--device", "cpu", "--json", str(x)],
        3,
        "is a folder, not a file",
    ),
    ("check BUNDLE --json", "loop", lambda p, x: ["check", str(x), "--device", "cpu", "--json"], 3, "loop"),
]


@pytest.mark.parametrize("command,kind,argv,code,words", SWEEP, ids=[f"{c} {k}" for c, k, *_ in SWEEP])
def test_a_wrong_kind_of_path_is_one_line_and_its_exit_code(paths, capsys, command, kind, argv, code, words):
    bad = paths[kind]
    where = bad.parent if bad.parent.exists() else bad.parent.parent
    before = sorted(p.name for p in where.iterdir())
    capsys.readouterr()
    rc = main(["-q", *argv(paths, bad)])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == code, err
    assert lines[0].startswith("error: ") and words in lines[0], err
    assert str(bad) in lines[0] or str(bad.name) in lines[0] or kind in ("folder", "file"), err  # the path named
    assert len(lines) <= 2 and (len(lines) == 1 or lines[1].startswith("hint: ")), err
    assert "Traceback" not in err and "internal error" not in err
    assert sorted(p.name for p in where.iterdir()) == before  # nothing created beside it (no `nowhere`)
    assert not paths["out"].exists()


def test_a_run_under_the_bundles_runs_folder_is_not_refused(paths, capsys):
    """verify and restore leave BUNDLE/runs/ to runs (README); run refused it as "inside the bundle" (exit 55)."""
    rc = main(["run", str(paths["bundle"]), "--output", str(paths["bundle"] / "runs" / "x"), "--print-config"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "datasets: []" in out and "inside the bundle" not in err


@pytest.mark.skipif(os.geteuid() == 0, reason="chmod 000 does not stop root from reading the file")
def test_an_unreadable_config_is_exit_3_naming_it(paths, capsys):
    cfg = paths["file"].with_name("run.yaml")
    cfg.write_text("datasets: []\n")
    cfg.chmod(0)
    try:
        assert main(["-q", "run", "--config", str(cfg), "--output", str(paths["out"])]) == 3
    finally:
        cfg.chmod(0o644)
    assert str(cfg) in capsys.readouterr().err


def test_the_one_normalisation_makes_every_path_absolute_and_resolved(tmp_path, monkeypatch):
    import argparse

    from reproduction.run.cli import normalise_paths

    (tmp_path / "real dir ü").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real dir ü")
    monkeypatch.chdir(tmp_path / "real dir ü")
    args = argparse.Namespace(output="../link/run", config=["a.yaml", "../link/b.yaml"], bundle=None)
    normalise_paths(args, "output", "config", "bundle")
    real = (tmp_path / "real dir ü").resolve()
    assert args.output == str(real / "run") and args.config == [str(real / "a.yaml"), str(real / "b.yaml")]
    assert args.bundle is None and all(Path(p).is_absolute() for p in [args.output, *args.config])


@pytest.mark.parametrize("kind", ["loop", "dangling", "folder"])
def test_check_json_file_is_refused_before_the_check_runs(paths, capsys, monkeypatch, kind):
    """`portable check --json PATH`: a report path that can never be written is refused up front (exit 3, one
    line naming it), like every command's path argument, instead of exit 8 after the whole check ran."""
    import reproduction.checks.report as report

    def ran(*_a, **_k):
        raise AssertionError("the check ran before its --json FILE was checked")

    monkeypatch.setattr(report, "collect_report", ran)
    rc = main(["-q", "check", str(paths["bundle"]), "--device", "cpu", "--json", str(paths[kind])])
    lines = capsys.readouterr().err.strip().splitlines()
    assert rc == 3 and lines[0].startswith("error: --json ") and str(paths[kind]) in lines[0], lines
    assert len(lines) <= 2


def test_check_json_folder_without_a_bundle_is_still_the_bundle(paths, monkeypatch):
    """`portable check --json BUNDLE` (kept for compatibility): a folder and no BUNDLE is the bundle, reported
    as JSON on stdout; only a folder next to a BUNDLE is refused as the report file."""
    import reproduction.checks.report as report

    seen = {}

    def fake(*, bundle, json_path, **_k):
        seen.update(bundle=bundle, json_path=json_path)
        return 0

    monkeypatch.setattr(report, "run_checks", fake)
    assert main(["-q", "check", "--device", "cpu", "--json", str(paths["folder"])]) == 0
    assert seen == {"bundle": paths["folder"], "json_path": Path("-")}


@pytest.mark.parametrize("kind", ["file", "under a file"])
def test_fetch_into_a_file_is_refused_before_the_hub_is_contacted(paths, capsys, monkeypatch, kind):
    """`portable fetch OWNER/NAME DIR` with DIR an existing file (or under one): exit 3 like every command given a
    file where a folder is needed (verify/restore/run BUNDLE), one line naming it, and no request to the Hub."""
    import reproduction.release.hub as hub

    def contacted(*_a, **_k):
        raise AssertionError("the Hub was contacted before DIR was checked")

    monkeypatch.setattr(hub, "_client", contacted)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # a closed port, should anything get through
    dest = paths["file"] if kind == "file" else paths["file"] / "bundle"
    rc = main(["-q", "fetch", "me/x", str(dest)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert rc == 3 and lines[0].startswith("error: ") and "is a file, not a folder" in lines[0], lines
    assert str(paths["file"]) in lines[0] and len(lines) == 2 and lines[1].startswith("hint: ")
    assert paths["file"].read_text() == "x = 1\n"


@pytest.mark.parametrize("kind", ["file", "under a file"])
def test_weights_fetch_into_a_file_is_exit_3_not_a_write_failure(paths, capsys, monkeypatch, kind):
    """`portable weights fetch MANIFEST DIR` with DIR a file: exit 3 'is a file, not a folder' (as `fetch`), not
    exit 8 'cannot write a file: File exists'."""
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # a closed port: nothing reaches a network
    manifest = Path(__file__).resolve().parent.parent / "weights_manifest" / "value_tiny.json"
    dest = paths["file"] if kind == "file" else paths["file"] / "weights"
    rc = main(["-q", "weights", "fetch", str(manifest), str(dest)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert rc == 3 and "is a file, not a folder" in lines[0] and str(paths["file"]) in lines[0], lines
    assert len(lines) == 2 and lines[1].startswith("hint: ") and paths["file"].read_text() == "x = 1\n"


def test_a_config_using_bundle_without_a_bundle_is_refused_naming_the_key(tmp_path, capsys):
    """${BUNDLE} silently resolved to "" and the run then failed with "dataset /data/sft does not exist"; then a
    warning line said so and the run went on; now (audit50 F10) it is refused, naming the key (exit 4)."""
    config = tmp_path / "run.yaml"
    config.write_text('datasets: [{path: "${BUNDLE}/data/sft", type: sft}]\n')
    assert main(["run", "--config", str(config), "--output", str(tmp_path / "out"), "--print-config"]) == 4
    err = capsys.readouterr().err
    assert err.startswith(f"error: {config}: config key `datasets[0].path` uses ${{BUNDLE}}, which is empty here"), err
    bundle = tmp_path / "b"
    bundle.mkdir()
    assert main(["run", str(bundle), "--config", str(config), "--output", str(tmp_path / "o2"), "--print-config"]) == 0
    assert "warning" not in capsys.readouterr().err
