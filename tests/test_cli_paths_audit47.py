"""audit47's CLI findings on path arguments and exit codes: an empty path is refused (exit 2, naming the argument)
before anything is written, every path argument is normalised once at the entry (`~` expanded, absolute) and that
form is what the command uses, `check --json` under a file is refused before the probes, `--debug` keeps the exit
code, and a name too long to look up is an input error (exit 3), not a failed write."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bundlekit import small_bundle

from reproduction import portable
from reproduction.release.noop import parse_argv


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    """An empty current folder, and a HOME beside it."""
    here = tmp_path / "cwd"
    here.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.chdir(here)
    monkeypatch.setenv("HOME", str(home))
    return here


def _file(tmp_path: Path, name: str = "x.json", text: str = "{}\n") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# (argv builder, the argument the error names)
EMPTY = [
    (lambda t: ["pack", _file(t, "s.toml", ""), "--out", ""], "--out"),
    (lambda t: ["pack", "", "--out", str(t / "o")], "SPEC"),
    (lambda t: ["pack", _file(t, "s.toml", ""), "--out", str(t / "o"), "--root", ""], "--root"),
    (lambda t: ["run", "--output", "", "--stages", "returns"], "--output"),
    (lambda t: ["run", "", "--output", str(t / "o")], "BUNDLE"),
    (lambda t: ["run", "--output", str(t / "o"), "--config", ""], "--config"),
    (lambda t: ["eval", "--checkpoint", "1", "--output", ""], "--output"),
    (lambda t: ["weights", "fetch", _file(t), ""], "DIR"),
    (lambda t: ["weights", "verify", _file(t), ""], "DIR"),
    (lambda t: ["weights", "pin", "a/b", "--manifest", ""], "--manifest"),
    (lambda t: ["fetch", "a/b", ""], "DIR"),
    (lambda t: ["verify", ""], "BUNDLE"),
    (lambda t: ["restore", ""], "BUNDLE"),
    (lambda t: ["check", "--json", ""], "--json"),
    (lambda t: ["lineage", ""], "RUN_DIR"),
    (lambda t: ["compare", "", _file(t)], "REFERENCE"),
    (lambda t: ["compare", _file(t), _file(t), "--out", ""], "--out"),
    (lambda t: ["demo", "--output", ""], "--output"),
]


@pytest.mark.parametrize("argv, flag", EMPTY, ids=[f"{i}:{flag}" for i, (_, flag) in enumerate(EMPTY)])
def test_an_empty_path_argument_is_a_usage_error_and_nothing_is_written(argv, flag, cwd, tmp_path, capsys):
    assert portable.main(argv(tmp_path)) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"error: {flag} is empty: an empty path would mean the current folder"
    assert err[1].startswith(f"hint: give {flag} a path") and len(err) == 2
    assert list(cwd.iterdir()) == []


def test_the_script_restore_shortcut_leaves_an_empty_bundle_to_the_cli():
    assert parse_argv(["restore", ""]) is None
    assert parse_argv(["restore", "b"]) == ("b", False)


# (command argv with ~ paths, the attributes that must come out expanded and absolute)
TILDE = [
    ("cmd_pack", ["pack", "~/s.toml", "--out", "~/b", "--root", "~"], {"spec": "s.toml", "out": "b", "root": ""}),
    ("cmd_weights", ["weights", "fetch", "~/m.json", "~/w"], {"manifest": "m.json", "dir": "w"}),
    ("cmd_weights", ["weights", "verify", "~/m.json", "~/w"], {"manifest": "m.json", "dir": "w"}),
    ("cmd_compare", ["compare", "~/a.json", "~/b.json", "--out", "~/c.json"], {"reference": "a.json", "out": "c.json"}),
    ("cmd_fetch", ["fetch", "a/b", "~/d"], {"dir": "d"}),
    ("cmd_verify", ["verify", "~/b"], {"bundle": "b"}),
    ("cmd_lineage", ["lineage", "~/r"], {"run_dir": "r"}),
    ("cmd_run", ["run", "~/b", "--output", "~/r", "--config", "~/c.yaml"], {"bundle": "b", "output": "r"}),
    ("cmd_eval", ["eval", "--checkpoint", "~/e", "--output", "~/r"], {"checkpoint": "e", "output": "r"}),
]


@pytest.mark.parametrize("handler, argv, want", TILDE, ids=[" ".join(a[:2]) for _, a, _ in TILDE])
def test_every_path_argument_reaches_the_command_expanded_and_absolute(handler, argv, want, cwd, monkeypatch):
    home = Path.home().resolve()
    seen = {}
    monkeypatch.setattr(portable, handler, lambda args: seen.update(vars(args)) or 0)
    assert portable.main(argv) == 0
    for name, rel in want.items():
        assert seen[name] == str(home / rel if rel else home), name
    if handler == "cmd_run":
        assert seen["config"] == [str(home / "c.yaml")]


def test_what_is_not_a_path_is_left_alone(cwd, monkeypatch):
    seen = {}
    monkeypatch.setattr(portable, "cmd_compare", lambda args: seen.update(vars(args)) or 0)
    monkeypatch.setattr(portable, "cmd_eval", lambda args: seen.update(vars(args)) or 0)
    monkeypatch.setattr(portable, "cmd_run", lambda args: seen.update(vars(args)) or 0)
    assert portable.main(["compare", "hub:me/x", "hub:me/y@v1"]) == 0
    assert (seen["reference"], seen["actual"]) == ("hub:me/x", "hub:me/y@v1")
    assert portable.main(["eval", "--checkpoint", "1000", "--output", "r"]) == 0
    assert seen["checkpoint"] == "1000" and seen["output"] == str(cwd.resolve() / "r")
    assert portable.main(["run", "--output", "r", "a.b=1", "c.d=2"]) == 0  # no BUNDLE: the first is an override
    assert seen["bundle"] is None and seen["overrides"] == ["a.b=1", "c.d=2"]


def test_pack_out_with_a_tilde_packs_into_home_not_into_a_folder_named_tilde(cwd, tmp_path, capsys):
    source = small_bundle(tmp_path / "src").parent / "small.toml"
    assert portable.main(["pack", str(source), "--out", "~/b", "-q"]) == 0
    assert (Path.home() / "b" / "bundle.json").is_file()
    assert list(cwd.iterdir()) == []


def test_check_json_under_a_file_is_refused_before_any_probe(tmp_path, monkeypatch, capsys):
    import reproduction.checks.report as report

    monkeypatch.setattr(report, "run_checks", lambda **kw: pytest.fail("probes ran"))
    afile = tmp_path / "afile"
    afile.write_text("x")
    target = afile / "sub" / "c.json"
    assert portable.main(["check", "--json", str(target)]) == 8  # a report that cannot be written, as it always was
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"error: cannot write the check report to {target}: {afile} is a file, not a folder"
    assert err[1].startswith("hint: ") and afile.read_text() == "x"


def test_debug_adds_the_traceback_and_keeps_the_exit_code(tmp_path, capsys):
    assert portable.main(["--debug", "verify", str(tmp_path / "nope")]) == 3
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "InputNotFoundError" in err
    assert err.splitlines()[-2] == f"error: {tmp_path / 'nope'} does not exist"


@pytest.mark.parametrize(
    "argv, flag",
    [(["verify"], "BUNDLE"), (["lineage"], "RUN_DIR"), (["run", "--output"], "--output")],
)
def test_a_name_too_long_to_look_up_is_an_input_error_naming_the_argument(argv, flag, tmp_path, capsys):
    long = str(tmp_path / ("a" * 300))
    assert portable.main([*argv, long]) == 3
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"error: {flag} {long} cannot be looked up: a name in it is longer than this filesystem allows"
    assert err[1].startswith("hint: ") and [p.name for p in tmp_path.iterdir()] == []


def test_check_json_file_still_written(tmp_path, monkeypatch):
    target = tmp_path / "new" / "c.json"
    portable.main(["check", "--device", "cpu", "--json", str(target), "-q"])  # its verdict is this machine's
    assert json.loads(target.read_text())["format"] == "recap-portable-check"


REPO = Path(__file__).resolve().parent.parent


def test_weights_verify_of_a_dir_that_is_a_file_is_exit_3_naming_it(tmp_path, capsys):
    target = tmp_path / "w"
    target.write_text("x")
    manifest = REPO / "weights_manifest" / "value_tiny.json"
    assert portable.main(["weights", "verify", str(manifest), str(target)]) == 3
    out, err = capsys.readouterr()
    assert err.splitlines()[0] == f"error: DIR {target} is a file, not a folder" and err.splitlines()[1].startswith(
        "hint"
    )
    assert out == "" and [p.name for p in tmp_path.iterdir()] == ["w"]


def test_weights_verify_of_a_missing_dir_says_why_every_file_is_missing(tmp_path, capsys):
    target = tmp_path / "w"
    manifest = REPO / "weights_manifest" / "value_tiny.json"
    assert portable.main(["weights", "verify", str(manifest), str(target)]) == 5  # the report, as before
    out, err = capsys.readouterr()
    assert "1 missing" in out and err.startswith(f"warning: DIR {target} does not exist, so every pinned file counts")
    assert list(tmp_path.iterdir()) == []


def test_run_print_config_with_json_prints_one_json_document(tmp_path, capsys):
    run = tmp_path / "run"
    assert portable.main(["run", "--output", str(run), "--print-config", "--json", "eval.seed=7"]) == 0
    config = json.loads(capsys.readouterr().out)
    assert config["RUN"] == str(run) and config["eval"]["seed"] == 7 and config["recipe"] == "recap"
    assert not run.exists()


def test_eval_refuses_an_override_it_would_not_use_before_anything_is_written(tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["eval", "--checkpoint", "1000", "--output", str(run), "eval.seed=3", "value.train.max_steps=5"]
    assert portable.main(argv) == 4
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (
        "error: `portable eval` takes only eval.* overrides (and recipe=...): value.train.max_steps is not used by "
        "an evaluation"
    )
    assert err[1].startswith("hint: drop value.train.max_steps=5") and not run.exists()


def test_eval_overrides_it_uses_pass_the_refusal():
    from reproduction.run.cli import refuse_non_eval_overrides

    refuse_non_eval_overrides(["eval.seed=3", "eval.tasks=[a]", "recipe=grpo", "no-equals-is-the-loader's"])


# a bad value typed on the command line is a usage error (exit 2), as argparse's own (--jobs 0, --margin 5)
BAD_VALUES = [
    (lambda t: ["run", "--output", str(t / "r"), "--target-step", "-1", "--print-config"], "--target-step -1 must be"),
    (lambda t: ["fetch", "notarepo", str(t / "d")], "repo 'notarepo' is not OWNER/NAME"),
    (lambda t: ["publish", str(t), "--repo", "bad repo"], "--repo 'bad repo' is not OWNER/NAME"),
    (lambda t: ["weights", "pin", "not a repo"], "REPO 'not a repo' is not OWNER/NAME"),
    (lambda t: ["demo", "--seed", "3", "--output", str(t / "d")], "--seed is an option of the LIBERO tier only"),
]


@pytest.mark.parametrize("argv, words", BAD_VALUES, ids=[w.split()[0] for _, w in BAD_VALUES])
def test_a_bad_command_line_value_is_a_usage_error(argv, words, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert portable.main(argv(tmp_path)) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"error: {words}") and err[1].startswith("hint: ") and len(err) == 2
    assert list(tmp_path.iterdir()) == []


# a folder where a file is expected is exit 3 (errors.py, README's `--config` row), naming the argument
def test_a_folder_for_a_spec_or_a_compare_out_is_exit_3_naming_it(tmp_path, capsys):
    folder = tmp_path / "f"
    folder.mkdir()
    assert portable.main(["pack", str(folder), "--out", str(tmp_path / "o")]) == 3
    assert capsys.readouterr().err.splitlines()[0] == f"error: SPEC {folder} is a folder, not a spec file"
    evidence = _file(tmp_path, "e.json")
    assert portable.main(["compare", evidence, evidence, "--out", str(folder)]) == 3
    err = capsys.readouterr().err.splitlines()[0]
    assert err == f"error: --out {folder} is a folder, not a file to write the comparison to"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.json", "f"] and list(folder.iterdir()) == []


def test_eval_plan_reference_folder_is_read_as_compare_reads_it(tmp_path, capsys):
    from evidence_fixtures import make_evidence

    empty = tmp_path / "empty"
    empty.mkdir()
    assert portable.main(["eval", "--plan", "--reference", str(empty)]) == 3
    assert capsys.readouterr().err.splitlines()[0] == f"error: {empty} holds no eval_*.json evidence"
    (tmp_path / "ev").mkdir()
    (tmp_path / "ev" / "eval_policy_4.json").write_text(json.dumps(make_evidence()))
    # a wide margin keeps the exact searches short: the folder's reading is what this checks, not the plan's numbers
    assert portable.main(["eval", "--plan", "--reference", str(tmp_path / "ev"), "--json", "--margin", "0.2"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["metric"] == "recap/success_once" and rows[0]["reference_episodes"] == 40, rows[0]


def test_an_unreadable_lineage_statement_is_exit_3_naming_it(tmp_path, capsys):
    statement = tmp_path / "lineage" / "returns.intoto.json"
    statement.parent.mkdir()
    statement.symlink_to(statement)  # a loop
    assert portable.main(["lineage", str(tmp_path)]) == 3
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"error: cannot read the lineage statement {statement}: ") and "symbolic" in err[0]
    assert err[1] == "hint: rerun the stage with `portable run --resume --restart-stage NAME` to write it again"


@pytest.mark.parametrize(
    "argv, first",
    [
        (["run", "--output", "{t}/afile/sub", "--print-config"], "--output {t}/afile/sub cannot be created: "),
        (["eval", "--checkpoint", "1", "--output", "{t}/afile/sub"], "--output {t}/afile/sub cannot be created: "),
        (["compare", "{t}/e.json", "{t}/e.json", "--out", "{t}/afile/x.json"], "cannot write --out {t}/afile/x.json: "),
    ],
    ids=["run", "eval", "compare"],
)
def test_an_output_under_a_file_is_exit_3_naming_the_argument_before_any_work(argv, first, tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    _file(tmp_path, "e.json")
    assert portable.main([a.format(t=tmp_path) for a in argv]) == 3
    out, err = capsys.readouterr()
    assert err.splitlines()[0] == "error: " + first.format(t=tmp_path) + f"{tmp_path}/afile is a file, not a folder"
    assert out == "" and sorted(p.name for p in tmp_path.iterdir()) == ["afile", "e.json"]


@pytest.mark.parametrize("override", ["=3", ".value=3", "eval..seed=3"])
def test_an_override_with_no_key_is_refused_as_not_key_path_value(override, tmp_path, capsys):
    assert portable.main(["run", "--output", str(tmp_path / "r"), "--print-config", override]) == 4
    err = capsys.readouterr().err.splitlines()
    assert err == [f"error: override {override!r} is not key.path=value", "hint: write overrides as key.path=value"]


def test_an_interpolation_of_no_key_names_the_key_holding_it(tmp_path, capsys):
    config = _file(tmp_path, "bad.yaml", "eval:\n  seed: ${nosuch.key}\n")
    assert portable.main(["run", "--config", config, "--output", str(tmp_path / "r"), "--print-config"]) == 4
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"error: {config}: config key `eval.seed`: Interpolation key 'nosuch.key' not found"
    assert err[1].startswith("hint: an interpolation names a config key") and not (tmp_path / "r").exists()
