"""The command lines after audit53 V: an empty `--out` of the data-generation CLIs (V15), negative episode counts
(V16), `lineage --verify` with every statement gone (V4), an override missing its `=value` (V12), the `${BUNDLE}`
hint (V11), `demo --output A --workdir B` (V17) and the help texts of `--jobs` (V6)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from evidence_fixtures import make_run

from reproduction.portable import main as portable
from reproduction.run.lineage_check import verify_lineage

EMPTY_OUT = [
    "error: --out is empty: an empty path would mean the current folder",
    "hint: give --out a path (an unset shell variable expands to nothing; use . for this folder)",
]


def test_sim_generate_refuses_an_empty_out_and_writes_nothing_here(tmp_path, capsys, monkeypatch):
    """V15: `Path("")` is `.`, so sft/ and rollout/ were written into the folder the user stood in, exit 0."""
    from reproduction.sim import generate
    from reproduction.sim.__main__ import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(generate, "generate_mix", lambda *a, **k: pytest.fail("generation started"))
    assert main(["generate", "--tasks", "push", "--out", ""]) == 2
    assert capsys.readouterr().err.splitlines() == EMPTY_OUT
    assert list(tmp_path.iterdir()) == []


def test_libero_generate_refuses_an_empty_out_and_writes_nothing_here(tmp_path, capsys, monkeypatch):
    from reproduction.sim.libero import generate as gen

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(gen, "generate_libero_data", lambda *a, **k: pytest.fail("generation started"))
    assert gen.main(["--out", "", "--sft", "1", "--rollouts", "0", "--eval", "0", "--no-cameras"]) == 2
    assert capsys.readouterr().err.splitlines() == EMPTY_OUT
    assert list(tmp_path.iterdir()) == []


def test_sim_generate_hands_on_the_normalised_out(tmp_path, monkeypatch):
    """The check normalises as `portable` does (absolute, `~` expanded), so what was checked is what is written."""
    from reproduction.sim import generate
    from reproduction.sim.__main__ import main

    seen = []
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(generate, "generate_mix", lambda mix, out, **k: seen.append(out) or {})
    assert main(["generate", "--tasks", "push", "--out", "d"]) == 0
    assert seen == [tmp_path.resolve() / "d"]


@pytest.mark.parametrize("flag", ["--sft", "--rollouts", "--eval"])
def test_sim_generate_refuses_a_negative_count_naming_the_flag(tmp_path, capsys, monkeypatch, flag):
    """V16: `--tasks push --sft -1` was taken silently (the counts are LIBERO's; Fetch does not read them). Exit 4
    with the LIBERO generator's line since audit56 (was argparse's exit 2)."""
    from reproduction.sim import generate
    from reproduction.sim.__main__ import main

    monkeypatch.setattr(generate, "generate_mix", lambda *a, **k: pytest.fail("generation started"))
    assert main(["generate", "--tasks", "push", "--out", str(tmp_path / "o"), flag, "-3"]) == 4
    assert capsys.readouterr().err.splitlines()[0] == f"error: {flag} -3 must be >= 0 (0 skips that set)"
    assert not (tmp_path / "o").exists()


def _gone(tmp_path: Path, what: str) -> Path:
    run = make_run(tmp_path).run
    if what == "lineage/":
        shutil.rmtree(run / "lineage")
    else:
        for path in (run / "lineage").glob("*.intoto.json"):
            path.unlink()
    return run


@pytest.mark.parametrize("what", ["every statement", "lineage/"])
def test_lineage_verify_with_every_statement_gone_is_exit_11_with_the_hint(tmp_path, capsys, what):
    """V4: with no statement left, `lineage --verify` was exit 3 "no lineage statements", no hint, though run.json
    records the stages complete: as with one statement of several gone, it is exit 11 naming each."""
    run = _gone(tmp_path, what)
    stages = [n for n, r in json.loads((run / "run.json").read_text())["stages"].items() if r["status"] == "complete"]
    assert len(stages) == 5
    report = verify_lineage(run)
    assert report.exit_code == 11
    assert [str(p) for p in report.problems] == [
        f"missing: lineage/{n}.intoto.json (stage {n} is complete in run.json, its statement is gone)" for n in stages
    ]
    assert report.notes == [f"hint: `portable run --resume` on {run} writes a lost statement again from run.json"]
    assert portable(["lineage", str(run), "--verify"]) == 11
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "lineage differs: 5 problems (no statement left to check)" and err[-1] == report.notes[0]
    assert portable(["--json", "lineage", str(run), "--verify"]) == 11
    doc = json.loads(capsys.readouterr().out)
    assert doc["chain"] is None and doc["verify"]["exit_code"] == 11


def test_lineage_verify_partial_loss_gives_the_same_hint(tmp_path):
    fake = make_run(tmp_path)
    (fake.run / "lineage/eval.intoto.json").unlink()
    report = verify_lineage(fake.run)
    assert report.exit_code == 11
    assert f"hint: `portable run --resume` on {fake.run} writes a lost statement again from run.json" in report.notes


def test_lineage_with_no_statements_and_no_complete_stage_says_what_to_do(tmp_path, capsys):
    run = _gone(tmp_path, "every statement")
    (run / "run.json").unlink()
    assert portable(["lineage", str(run), "--verify"]) == 3
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"error: no lineage statements (*.intoto.json) in {run / 'lineage'}",
        "hint: a run writes one per stage as it completes: give the folder `portable run --output` wrote, after "
        "a stage completed",
    ]


def test_plain_lineage_of_a_run_that_lost_every_statement_points_at_verify_and_resume(tmp_path, capsys):
    """review R3: its hint said to give a folder "after a stage completed", though run.json records them complete."""
    run = _gone(tmp_path, "every statement")
    assert portable(["lineage", str(run)]) == 3
    assert capsys.readouterr().err.splitlines()[1] == (
        f"hint: `portable lineage {run} --verify` names the completed stages whose statements were lost, and "
        "`portable run --resume` writes them again from run.json"
    )


def test_an_override_missing_its_value_in_the_bundle_place_is_exit_4(tmp_path, capsys, monkeypatch):
    """V12: `portable run --output D eval.episodes_per_task` said "bundle .../eval.episodes_per_task does not
    exist" (exit 3)."""
    monkeypatch.chdir(tmp_path)
    for key in ("eval.episodes_per_task", "datasets[0].path"):
        assert portable(["run", "--output", str(tmp_path / "r"), key]) == 4
        assert capsys.readouterr().err.splitlines() == [
            f"error: {key!r} is no folder and reads as a config key: an override missing its =value",
            f"hint: write it as {key}=VALUE (a BUNDLE must be an existing folder)",
        ]
    assert portable(["run", "--output", str(tmp_path / "r"), "nobundle"]) == 3  # no dot: a mistyped folder
    assert "does not exist" in capsys.readouterr().err
    # a dotted bundle name whose first part is no config section stays a missing bundle (review R2)
    assert portable(["run", "--output", str(tmp_path / "r"), "my_bundle.v2"]) == 3
    assert (
        capsys.readouterr().err.splitlines()[0] == f"error: bundle {tmp_path.resolve() / 'my_bundle.v2'} does not exist"
    )
    assert not (tmp_path / "r").exists()


def test_demo_refuses_output_and_workdir_together_naming_both(tmp_path, capsys):
    """V17: `--workdir` is an alias of --output; given both, the last one silently won."""
    a, b = tmp_path.resolve() / "a", tmp_path.resolve() / "b"
    assert portable(["demo", "--output", str(a), "--workdir", str(b)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"error: --output {a} and --workdir {b} name the demo folder twice"
    assert err[1].startswith("hint: ")
    assert not a.exists() and not b.exists()
    assert portable(["demo", "--output", str(a), "--workdir", ""]) == 2  # an empty alias is refused as --output
    assert capsys.readouterr().err.startswith("error: --workdir is empty")


@pytest.mark.parametrize(
    ("command", "text"),
    [
        ("pack", "compression/hash threads (default: all cores)"),
        ("verify", "hash threads (default: all cores)"),
        ("restore", "extraction/hash threads (default: all cores)"),
    ],
)
def test_jobs_has_a_help_text(command, text, capsys):
    """V6: `verify --jobs` and `restore --jobs` had none."""
    with pytest.raises(SystemExit):
        portable([command, "--help"])
    assert f"--jobs JOBS {text}" in " ".join(capsys.readouterr().out.split())


def test_readme_documents_the_flags_help_shows():
    """V5, V6, V17: flags `--help` lists that no doc named, and `eval --plan`'s synopsis showing both as optional."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    for text in (
        "`portable pack SPEC.toml --out DIR [--root SRC] [--jobs N]`",
        "`portable verify [BUNDLE] [--jobs N]`",
        "`portable restore [BUNDLE] [--deep] [--refresh-source] [--jobs N]`",
        "`portable weights pin REPO\\|MANIFEST [--license ID]`",
        "`portable eval --plan (--reference FILE \\| --rate P) [--margin M] [--alpha A] [--power 0.8] "
        "[--difference D]`",
        "`portable demo [--output DIR] [--quick] [key.path=value ...]`",
        "`--workdir DIR` is the older name of `--output`",
    ):
        assert text in readme, text
