"""An error a recipe's stage function raises reaches the terminal as README promises: one `error: ...` line and one
`hint: ...` line (audit59 B4). A typed error keeps its first line and exit code, its newlines are folded as run.json
folds them, its `path` is shown when the message does not name it, and without a hint of its own the hint names the
stage, that it is recorded failed, and what reruns it. A plain exception's message is folded too; an error the runner
raises (not the stage) is unchanged. A toy recipe through the CLI, in-process; fast."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from reproduction import errors
from reproduction.recipe import Recipe, StageContext, StageOutput, StageSpec


@dataclass(kw_only=True)
class Par:
    fail: str = "none"


@dataclass(kw_only=True)
class ToyConfig:
    RUN: str = ""
    par: Par = field(default_factory=Par)


def prep_stage(ctx: StageContext) -> StageOutput:
    out = ctx.out_dir / "prep.json"
    out.write_text("{}\n")
    return StageOutput(files=[out], summary={})


def par_stage(ctx: StageContext) -> StageOutput:
    how = ctx.config.par.fail
    if how == "typed":
        raise errors.ConfigError("par.fail asked for a typed error", field="par.fail")
    if how == "typedmulti":
        raise errors.ConfigError("typed first\ntyped  second", field="par.fail", hint="hint one\nhint two")
    if how == "notfound":
        raise errors.InputNotFoundError("the thing is missing", path="/nope")
    if how == "named":
        raise errors.InputNotFoundError("/nope is missing", path="/nope", hint="put it back")
    if how == "multi":
        raise ValueError("first line\nsecond line\nthird")
    out = ctx.out_dir / "par.json"
    out.write_text("{}\n")
    return StageOutput(files=[out], summary={})


RECIPE = Recipe(
    name="toy59b4",
    config_schema=f"{__name__}:ToyConfig",
    stages=(
        StageSpec(name="prep", fn=f"{__name__}:prep_stage", inputs=False),
        StageSpec(name="par", fn=f"{__name__}:par_stage", config=("par",), needs=("prep",), inputs=False),
    ),
)

RERUN = (
    "hint: stage par raised it and is recorded failed in run.json (stages already complete are kept); fix the cause, "
    "then `portable run` with --resume reruns it (or --restart-stage par)"
)


@pytest.fixture
def cli(tmp_path, capsys):
    """portable(*overrides) -> (exit code, stderr lines, run.json) of `portable run` of the toy recipe."""
    from reproduction.portable import main

    (tmp_path / "run.yaml").write_text(f"recipe: {__name__}:RECIPE\n")

    def portable(*args: str) -> tuple[int, list[str], dict]:
        run = tmp_path / "run"
        capsys.readouterr()
        code = main(["run", "--config", str(tmp_path / "run.yaml"), "--output", str(run), *args])
        state = json.loads((run / "run.json").read_text()) if (run / "run.json").exists() else {}
        return code, capsys.readouterr().err.splitlines(), state

    return portable


@pytest.mark.parametrize(
    ("how", "code", "lines"),
    [
        ("typed", 4, ["error: par.fail asked for a typed error", RERUN]),
        ("typedmulti", 4, ["error: typed first typed second", "hint: hint one hint two"]),
        ("notfound", 3, ["error: the thing is missing (/nope)", RERUN]),
        ("named", 3, ["error: /nope is missing", "hint: put it back"]),  # the path already in it: not repeated
    ],
)
def test_a_typed_error_a_stage_raises_is_two_lines_with_its_exit_code(cli, how, code, lines):
    rc, err, state = cli(f"par.fail={how}")
    assert (rc, err) == (code, lines)
    assert state["stages"]["prep"]["status"] == "complete" and state["stages"]["par"]["status"] == "failed"


def test_a_plain_exception_a_stage_raises_is_folded_to_one_line(cli):
    rc, err, state = cli("par.fail=multi")
    assert rc == 1 and len(err) == 2, err
    assert err[0] == "error: ValueError: first line second line third"
    assert err[1].startswith(f"hint: raised at {__file__}:") and "(par_stage)" in err[1]
    assert state["stages"]["par"]["error"] == "ValueError: first line second line third"


def test_the_failed_stage_reruns_as_the_hint_says(cli):
    assert cli("par.fail=typed")[0] == 4
    rc, err, state = cli("--resume", "par.fail=none")
    assert rc == 0, err
    assert state["stages"]["par"]["status"] == "complete"


def test_an_error_the_runner_raises_is_unchanged(cli):
    """A stage name --restart-stage does not know: the runner's ConfigError, not the stage's; no stage hint."""
    rc, err, _ = cli("--restart-stage", "nope")
    assert rc == 4 and len(err) <= 2 and err[0] == "error: no stage 'nope' in recipe toy59b4", err
    assert not any("recorded failed" in line for line in err)


def test_a_path_with_a_newline_is_folded_into_the_one_line(capsys):
    """review59 T3: the path added to a stage error's line was not folded: a newline in it made three lines."""
    from reproduction.errors import InputNotFoundError, render_error

    exc = InputNotFoundError("the thing is missing", path="/tmp/a\nb")
    exc.raised_in_stage = "par"
    assert render_error(exc) == 3
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "error: the thing is missing (/tmp/a b)"
    assert len(lines) == 2 and lines[1].startswith("hint: stage par raised it")
