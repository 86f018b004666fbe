"""A package in a stage's key (review of audit50_B F2's fix): a package StageSpec.code names is keyed by every module
under it, but the module a stage function is defined in stays that module's file (a package: its `__init__.py`), and
a run folder recorded when a `code` package was keyed by its `__init__.py` alone still resumes; StageSpec.outputs
takes every glob pathlib takes (`../evidence/*.json` included), refusing only those pathlib refuses."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from recipe_cli import run_portable

from reproduction.digests import sha256_file
from reproduction.errors import ConfigError
from reproduction.recipe import Recipe, StageSpec
from reproduction.run.stage_keys import digest

INIT = """
import json
from dataclasses import dataclass

from reproduction.fsio import atomic_write_text
from reproduction.recipe import Recipe, StageOutput, StageSpec


@dataclass
class Cfg:
    n: int = 3


def make(ctx):
    out = ctx.out_dir / "n.json"
    atomic_write_text(out, json.dumps({"n": ctx.config.n}))
    return StageOutput(files=[out])


def use(ctx):
    out = ctx.run_dir / "evidence" / "eval_n.json"
    atomic_write_text(out, (ctx.run_dir / "make" / "n.json").read_text())
    return StageOutput(files=[out])


RECIPE = Recipe(
    name="pk",
    config_schema="pkgrec:Cfg",
    stages=(
        StageSpec(name="make", fn="pkgrec:make", config=("n",), inputs=False),
        StageSpec(name="use", fn="pkgrec.stages:use", needs=("make",), inputs=False, code=("pkgrec",),
                  outputs=("../evidence/*.json",)),
    ),
)
"""


@pytest.fixture
def folder(tmp_path):
    pkg = tmp_path / "pkgrec"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(INIT)
    (pkg / "stages.py").write_text("from pkgrec import use  # noqa: F401\n")
    (pkg / "util.py").write_text("X = 1\n")
    (tmp_path / "c.yaml").write_text("recipe: pkgrec:RECIPE\nn: 3\n")
    return tmp_path


def portable(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return run_portable(cwd, *args)


def actions(proc: subprocess.CompletedProcess) -> dict[str, str]:
    assert proc.returncode == 0, proc.stderr
    return {s["stage"]: s["action"] for s in json.loads(proc.stdout)["stages"]}


RUN = ("run", "--config", "c.yaml", "--output", "r", "--json")


def test_a_function_defined_in_a_package_keys_its_init_and_a_code_package_keys_every_module(folder):
    assert actions(portable(folder, *RUN)) == {"make": "ran", "use": "ran"}
    parts = json.loads((folder / "r/run.json").read_text())["stages"]
    # make's function lives in pkgrec/__init__.py: that file is its module, as before packages were keyed whole
    assert parts["make"]["key_parts"]["code"] == {"pkgrec": sha256_file(folder / "pkgrec/__init__.py")}
    assert set(parts["use"]["key_parts"]["code"]) == {"pkgrec.stages", "pkgrec"}
    (folder / "pkgrec/util.py").write_text("X = 2\n")  # in the package `use` names, not in make's module
    changed = portable(folder, *RUN, "--resume")
    assert changed.returncode == 52, changed.stderr
    assert "stage use: its inputs changed" in changed.stderr and "code.pkgrec" in changed.stderr
    assert "stage make" not in changed.stderr


def test_a_run_that_keyed_a_code_package_by_its_init_resumes(folder):
    assert actions(portable(folder, *RUN)) == {"make": "ran", "use": "ran"}
    state_file = folder / "r/run.json"
    state = json.loads(state_file.read_text())
    rec = state["stages"]["use"]
    rec["key_parts"]["code"]["pkgrec"] = sha256_file(folder / "pkgrec/__init__.py")  # as 36153bf recorded it
    rec["key"] = digest(rec["key_parts"])
    state_file.write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")
    assert actions(portable(folder, *RUN, "--resume")) == {"make": "skipped", "use": "skipped"}
    (folder / "pkgrec/__init__.py").write_text(INIT + "\n# edited\n")  # the file the old key did pin: seen
    assert portable(folder, *RUN, "--resume").returncode == 52


@pytest.mark.parametrize("glob", ["../evidence/*.json", "./*.txt", "a/./b", "export//*.json", "**/*", "x/**"])
def test_an_outputs_glob_pathlib_takes_is_accepted(glob):
    Recipe(name="g", stages=(StageSpec(name="s", fn="m:f", outputs=(glob,)),))


@pytest.mark.parametrize("glob", ["", "/abs*", "a**b"])
def test_an_outputs_glob_pathlib_refuses_is_refused_when_the_recipe_is_built(glob):
    with pytest.raises(ConfigError, match="stage s's outputs") as caught:
        Recipe(name="g", stages=(StageSpec(name="s", fn="m:f", outputs=(glob,)),))
    assert caught.value.field == "stages.s.outputs"
