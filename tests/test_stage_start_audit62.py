"""On a terminal the runner says each stage's start, for every recipe (audit62 B6): an out-of-tree recipe's stages
printed nothing until the closing table. One line a stage that runs, none for one skipped, none under -q and none on
a pipe (a run's stderr in a log stays its errors and its table)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.recipe_cli import run_portable

RECIPE = textwrap.dedent(
    """
    from dataclasses import dataclass
    from reproduction.recipe import Recipe, StageOutput, StageSpec

    @dataclass
    class Cfg:
        n: int = 3

    def one(ctx):
        (ctx.out_dir / "x.txt").write_text(str(ctx.config.n))
        return StageOutput(files=[])

    def two(ctx):
        (ctx.out_dir / "y.txt").write_text("y")
        return StageOutput(files=[])

    RECIPE = Recipe(
        name="toy",
        stages=(StageSpec(name="one", fn="toyrec:one"), StageSpec(name="two", fn="toyrec:two", needs=("one",))),
        config_schema=Cfg,
    )
    """
)


def _folder(tmp_path: Path) -> Path:
    (tmp_path / "toyrec.py").write_text(RECIPE)
    (tmp_path / "run.yaml").write_text("recipe: toyrec:RECIPE\nn: 4\n")
    return tmp_path


TERMINAL = {"TTY_COMPATIBLE": "1", "PORTABLE_NO_PROGRESS": ""}  # rich's terminal test; conftest sets NO_PROGRESS


def _starts(stderr: str) -> list[str]:
    return [line.strip() for line in stderr.splitlines() if line.strip().startswith("stage ") and ":" in line]


def test_on_a_terminal_each_stage_that_runs_says_it_started(tmp_path):
    folder = _folder(tmp_path)
    done = run_portable(folder, "run", "--config", "run.yaml", "--output", "out", **TERMINAL)
    assert done.returncode == 0, done.stderr
    assert _starts(done.stderr) == ["stage one: running", "stage two: running"], done.stderr
    again = run_portable(folder, "run", "--config", "run.yaml", "--output", "out", "--resume", **TERMINAL)
    assert again.returncode == 0 and _starts(again.stderr) == [], again.stderr  # skipped: nothing starts


def test_a_pipe_quiet_or_no_progress_says_no_start(tmp_path):
    folder = _folder(tmp_path)
    cases = (
        ((), {"TTY_COMPATIBLE": "", "PORTABLE_NO_PROGRESS": ""}),  # a pipe
        (("-q",), TERMINAL),
        (("--no-progress",), TERMINAL),
        ((), {**TERMINAL, "PORTABLE_NO_PROGRESS": "1"}),
    )
    for n, (args, env) in enumerate(cases):
        out = f"out{n}"
        done = run_portable(folder, *args, "run", "--config", "run.yaml", "--output", out, **env)
        assert done.returncode == 0 and "running" not in done.stderr, (args, env, done.stderr)
