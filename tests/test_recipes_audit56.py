"""audit56 B: an out-of-tree recipe in a nested namespace package is recorded and checked against a bundle (B2), one
named like a built-in does not pass as a built-in run (B3), a stage returning another stage's file is told whose
(B5)."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
from recipe_cli import run_portable

from reproduction.errors import IntegrityError
from reproduction.run.recipe_source import check_recipe_source

MODULE = """\
import os
from dataclasses import dataclass

from reproduction.fsio import atomic_write_text
from reproduction.recipe import Recipe, StageOutput, StageSpec


@dataclass(kw_only=True)
class Cfg:
    mode: str = "ok"


def first(ctx):
    out = ctx.out_dir / "a.json"
    atomic_write_text(out, "{}")
    return StageOutput(files=[out])


def second(ctx):
    out = ctx.out_dir / "b.json"
    atomic_write_text(out, "{}")
    if ctx.config.mode == "otherstage":  # rewrites and returns stage first's file
        other = ctx.run_dir / "first" / "a.json"
        atomic_write_text(other, '{"x": 1}')
        return StageOutput(files=[out, other])
    return StageOutput(files=[out])


RECIPE = Recipe(
    name=os.environ.get("RNAME", "toy56"),
    config_schema="ns56.sub.m:Cfg",
    stages=(
        StageSpec(name="first", fn="ns56.sub.m:first", config=("mode",), inputs=False),
        StageSpec(name="second", fn="ns56.sub.m:second", needs=("first",), config=("mode",), inputs=False),
    ),
)
"""


def _recipe(folder: Path) -> Path:
    """ns56.sub.m: a module two namespace packages deep (no __init__.py at either level)."""
    (folder / "ns56" / "sub").mkdir(parents=True)
    (folder / "ns56" / "sub" / "m.py").write_text(MODULE)
    (folder / "c.yaml").write_text("recipe: ns56.sub.m:RECIPE\n")
    return folder


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_nested_namespace_module_is_located_recorded_and_compared_with_the_bundle(tmp_path, monkeypatch):
    mine = _recipe(tmp_path / "mine")
    (tmp_path / "b" / "source" / "l" / "ns56" / "sub").mkdir(parents=True)
    (tmp_path / "b" / "bundle.json").write_text('{"layers": [{"kind": "source", "target": "source/l", "order": 1}]}')
    shipped = tmp_path / "b" / "source" / "l" / "ns56" / "sub" / "m.py"
    shipped.write_text(MODULE)
    monkeypatch.syspath_prepend(str(mine))
    path = (mine / "ns56" / "sub" / "m.py").resolve()
    want = {"module": "ns56.sub.m", "path": str(path), "sha256": _sha(path)}
    # was None without a bundle, and ConfigError "cannot be imported" (exit 4, a looping hint) with one
    assert check_recipe_source("ns56.sub.m:RECIPE", None) == want
    assert check_recipe_source("ns56.sub.m:RECIPE", tmp_path / "b") == want
    assert not [m for m in sys.modules if m.startswith("ns56")]  # located, nothing imported
    shipped.write_text(MODULE + "# doctored\n")
    with pytest.raises(IntegrityError, match=r"would run .*m\.py \(sha256 [0-9a-f]{12}\), not the bundle's copy"):
        check_recipe_source("ns56.sub.m:RECIPE", tmp_path / "b")


def test_a_run_of_a_nested_namespace_recipe_records_its_module(tmp_path):
    mine = _recipe(tmp_path)
    done = run_portable(mine, "run", "--config", "c.yaml", "--output", "run")
    assert done.returncode == 0, done.stderr
    path = (mine / "ns56" / "sub" / "m.py").resolve()
    recorded = json.loads((mine / "run" / "run.json").read_text())["recipe_module"]
    assert recorded == {"module": "ns56.sub.m", "path": str(path), "sha256": _sha(path)}


def test_an_out_of_tree_recipe_named_recap_does_not_pass_as_a_recap_run(tmp_path):
    mine = _recipe(tmp_path)
    done = run_portable(mine, "run", "--config", "c.yaml", "--output", "run", RNAME="recap")
    assert done.returncode == 0, done.stderr
    assert json.loads((mine / "run" / "run.json").read_text())["recipe"] == "recap"
    again = run_portable(mine, "run", "--output", "run", "--resume")  # no config: the built-in recap
    assert again.returncode == 55, again.stderr  # was exit 4 "datasets: the run names no dataset"
    assert again.stderr.splitlines() == [
        f"error: {mine / 'run'} holds a run of recipe 'ns56.sub.m:RECIPE' (named 'recap'), not of 'recap'",
        "hint: choose a new --output for the 'recap' run (a run folder keeps one recipe), or resume this one with a "
        "config whose recipe is 'ns56.sub.m:RECIPE'",
    ]
    resumed = run_portable(mine, "run", "--config", "c.yaml", "--output", "run", "--resume", RNAME="recap")
    assert resumed.returncode == 0, resumed.stderr  # its own recipe still resumes it


def test_a_stage_returning_another_stages_file_names_that_stage(tmp_path):
    mine = _recipe(tmp_path)
    done = run_portable(mine, "run", "--config", "c.yaml", "--output", "run", "mode=otherstage")
    assert done.returncode == 54, done.stderr
    run = mine / "run"
    assert done.stderr.splitlines()[0] == (
        f"error: stage second: output {run / 'first' / 'a.json'} is stage first's file, outside its folder "
        f"{run / 'second'}"
    )
