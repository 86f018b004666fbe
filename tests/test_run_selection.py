"""What `portable run` does with the stages it is asked for, through the CLI on a toy chain recipe (a -> b -> c -> d,
and e needing a; no training, fast):

- a selected stage needing stages that are neither selected nor complete is refused before anything runs, naming
  every stage it lacks (transitively), with one --stages hint that works when followed (audit46 newcomer F6: the
  check ran mid-walk, after earlier stages, and its hint named only the immediate stage, so following it looped);
- `--stages ''` is a usage error naming the recipe's stages (F8: it ran every stage);
- `--resume` into an empty or missing folder says in one line that there was nothing to resume (F11)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from reproduction.recipe import Recipe, StageContext, StageOutput, StageSpec


@dataclass(kw_only=True)
class Chain:
    text: str = "x"


@dataclass(kw_only=True)
class ChainConfig:
    RUN: str = ""
    chain: Chain = field(default_factory=Chain)


def link(ctx: StageContext) -> StageOutput:
    out = ctx.out_dir / "out.txt"
    out.write_text(ctx.config.chain.text + "".join(sorted(ctx.upstream)))
    return StageOutput(files=[out])


def _stage(name: str, *needs: str) -> StageSpec:
    return StageSpec(name=name, fn=f"{__name__}:link", needs=needs, config=("chain",))


RECIPE = Recipe(
    name="chain",
    config_schema=f"{__name__}:ChainConfig",
    stages=(_stage("a"), _stage("b", "a"), _stage("c", "b"), _stage("d", "c"), _stage("e", "a")),
)


@pytest.fixture
def cli(tmp_path, capsys):
    (tmp_path / "run.yaml").write_text(f"recipe: {__name__}:RECIPE\n")

    def portable(run: Path, *args: str, quiet: bool = True) -> tuple[int, str]:
        from reproduction.portable import main

        capsys.readouterr()
        argv = ["-q"] if quiet else []
        code = main([*argv, "run", "--config", str(tmp_path / "run.yaml"), "--output", str(run), *args])
        return code, capsys.readouterr().err

    return portable


def _ran(run: Path) -> list[str]:
    return sorted(p.name for p in run.iterdir() if p.is_dir() and len(p.name) == 1) if run.is_dir() else []


# -- F6: every missing stage named before anything runs ----------------------------------------------------------


def test_a_missing_chain_is_named_whole_before_anything_runs_and_its_hint_works(tmp_path, cli):
    run = tmp_path / "run"
    assert cli(run, "--stages", "c") == (
        55,
        f"error: stage c needs stages a, b, which have not completed in {run}\n"
        "hint: run with --stages a,b,c (or without --stages)\n",
    )
    assert not run.exists()
    # the audit's second step: a selected `a` no longer runs before the refusal
    assert cli(run, "--stages", "a,c") == (
        55,
        f"error: stage c needs stage b, which has not completed in {run}\n"
        "hint: run with --stages a,b,c (or without --stages)\n",
    )
    assert not run.exists()
    assert cli(run, "--stages", "a,b,c") == (0, "")  # the hint, followed
    assert _ran(run) == ["a", "b", "c"]


def test_each_selected_stage_lacking_stages_is_named_in_one_refusal(tmp_path, cli):
    run = tmp_path / "run"
    assert cli(run, "--stages", "b,d,e") == (
        55,
        f"error: stage b needs stage a; stage d needs stage c; stage e needs stage a, which have not completed in "
        f"{run}\nhint: run with --stages a,b,c,d,e (or without --stages)\n",
    )
    assert not run.exists()


def test_complete_stages_satisfy_a_need_and_the_hint_names_only_what_is_missing(tmp_path, cli):
    run = tmp_path / "run"
    assert cli(run, "--stages", "a") == (0, "")
    before = (run / "run.json").read_bytes()
    assert cli(run, "--resume", "--stages", "d") == (
        55,
        f"error: stage d needs stages b, c, which have not completed in {run}\n"
        "hint: run with --stages b,c,d (or without --stages)\n",
    )
    assert (run / "run.json").read_bytes() == before and _ran(run) == ["a"]
    assert cli(run, "--resume", "--stages", "b,c,d") == (0, "")
    assert _ran(run) == ["a", "b", "c", "d"]
    assert cli(run, "--resume", "--stages", "e") == (0, "")  # a complete: e runs alone
    assert _ran(run) == ["a", "b", "c", "d", "e"]


# -- F8: an empty --stages ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["", ",", " , "])
def test_stages_naming_no_stage_is_a_usage_error_naming_the_recipes_stages(tmp_path, cli, value):
    run = tmp_path / "run"
    assert cli(run, "--stages", value) == (
        4,
        f"error: --stages {value!r} names no stage (recipe chain's stages: a, b, c, d, e)\n"
        "hint: name the stages to run, comma-separated, or leave --stages out to run every stage\n",
    )
    assert not run.exists()


# -- F11: --resume with nothing to resume ------------------------------------------------------------------------


@pytest.mark.parametrize("made", [False, True], ids=["missing folder", "empty folder"])
def test_resume_into_a_folder_without_a_run_says_it_starts_a_new_one(tmp_path, cli, made):
    run = tmp_path / "typo"
    if made:
        run.mkdir()
    code, err = cli(run, "--resume", quiet=False)
    assert code == 0 and err.splitlines()[0] == f"nothing to resume in {run} (no run.json there): starting a new run"
    assert _ran(run) == ["a", "b", "c", "d", "e"]
    code, err = cli(run, "--resume", quiet=False)  # now there is a run: no such line
    assert code == 0 and "nothing to resume" not in err
    code, err = cli(tmp_path / "fresh", quiet=False)  # no --resume: no line either
    assert code == 0 and "nothing to resume" not in err
