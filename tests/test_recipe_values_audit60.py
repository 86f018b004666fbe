"""audit60_B B2, B7, B4: Recipe values that got no named error, and a note that misnamed a switch of recipe module.

B2: `Recipe(config_schema=LabConfig)` (the class, not a 'module:Class' str) was an internal error (`.partition` of a
type), exit 1: a dataclass given itself is now used; any other non-str (a Recipe) is exit 4 naming recipe, field and
value. B7: a dict in `stages` was a raw AttributeError on `.name`, and `Recipe(name="")` ran and left a run folder
that refused every `--resume` (exit 55): both are exit 4 naming the recipe reference and what is wrong. B4: a config
switched to another module's Recipe said the new module "changed since this run recorded it"; the note now names
both."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from recipe_cli import run_portable

from reproduction.errors import ConfigError
from reproduction.recipe import Recipe, StageSpec
from reproduction.run.resolve import recipe_schema

STAGES = """\
from dataclasses import dataclass

from reproduction.fsio import atomic_write_text
from reproduction.recipe import StageOutput


@dataclass(kw_only=True)
class Cfg:
    n: int = 3


def prep(ctx):
    out = ctx.out_dir / "rows.json"
    atomic_write_text(out, str(ctx.config.n))
    return StageOutput(files=[out])
"""

RECIPE = """\
import dataclasses

from reproduction.recipe import Recipe, StageSpec
from rv60.stages import Cfg

RECIPE = Recipe(
    name="rv60",
    config_schema="rv60.stages:Cfg",
    stages=(StageSpec(name="prep", fn="rv60.stages:prep", inputs=False, outputs=("rows.json",)),),
)
CLASS = dataclasses.replace(RECIPE, config_schema=Cfg)
"""

BAD = """\
import dataclasses

from reproduction.recipe import Recipe, StageSpec
from rv60.recipe import RECIPE

A_RECIPE = dataclasses.replace(RECIPE, config_schema=RECIPE)
"""


def _package(tmp_path: Path, **modules: str) -> Path:
    pkg = tmp_path / "rv60"
    pkg.mkdir(exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "stages.py").write_text(STAGES)
    (pkg / "recipe.py").write_text(RECIPE)
    for name, text in modules.items():
        (pkg / f"{name}.py").write_text(text)
    return pkg


def _run(tmp_path: Path, ref: str, *extra: str):
    (tmp_path / "run.yaml").write_text(f"recipe: {ref}\nn: 5\n")
    quiet = () if extra else ("-q",)  # a resume's notes are not printed under -q
    return run_portable(tmp_path, "run", "--config", "run.yaml", "--output", "run", *quiet, *extra)


# -- B2: config_schema given as the class ---------------------------------------------------------------------------


def test_a_config_schema_given_as_the_dataclass_itself_loads_the_config(tmp_path):
    _package(tmp_path)
    done = _run(tmp_path, "rv60.recipe:CLASS")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "run" / "prep" / "rows.json").read_text() == "5"
    state = json.loads((tmp_path / "run" / "run.json").read_text())
    assert (state["recipe"], state["recipe_ref"], state["config"]) == ("rv60", "rv60.recipe:CLASS", {"n": 5})


def test_a_config_schema_that_is_neither_a_str_nor_a_class_is_exit_4_naming_recipe_field_and_value(tmp_path):
    _package(tmp_path, bad=BAD)
    done = _run(tmp_path, "rv60.bad:A_RECIPE")
    assert done.returncode == 4, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0].startswith("error: recipe 'rv60': config_schema is a Recipe (Recipe(name='rv60', ")
    assert lines[0].endswith("), not a 'module:Class' str or a dataclass")
    assert lines[1:] == [
        "hint: write config_schema='module:ConfigClass' (or the @dataclass class itself) in the recipe"
    ]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("value", "shown"),
    [(print, "a builtin_function_or_method (<built-in function print>)"), (3, "an int (3)")],
)
def test_recipe_schema_names_any_other_non_str(value, shown):
    recipe = Recipe(name="toy", stages=(StageSpec(name="a", fn="m:f"),), config_schema=value)
    with pytest.raises(ConfigError) as info:
        recipe_schema(recipe)
    assert info.value.message == (f"recipe 'toy': config_schema is {shown}, not a 'module:Class' str or a dataclass")
    assert info.value.fields["field"] == "config_schema"


def test_a_class_that_is_no_dataclass_is_named_as_the_class_it_is():
    recipe = Recipe(name="toy", stages=(StageSpec(name="a", fn="m:f"),), config_schema=Path)
    with pytest.raises(ConfigError) as info:
        recipe_schema(recipe)
    assert info.value.message == "recipe 'toy': config_schema pathlib:Path is a class, not a dataclass"


# -- B7: a dict for a stage, an empty name --------------------------------------------------------------------------


def test_a_dict_for_a_stage_is_exit_4_naming_the_reference_and_the_stage(tmp_path):
    _package(
        tmp_path,
        shape='from reproduction.recipe import Recipe\n\nDICT = Recipe(name="rv60", stages=('
        '{"name": "x", "fn": "rv60.stages:prep"},))\n',
    )
    done = _run(tmp_path, "rv60.shape:DICT")
    assert done.returncode == 4, done.stderr
    assert done.stderr.splitlines() == [
        "error: recipe: 'rv60.shape:DICT' cannot be imported: recipe rv60: stage 0 is a dict, not a StageSpec "
        "({'name': 'x', 'fn': 'rv60.stages:prep'})",
        "hint: write each stage as StageSpec(name=..., fn='module:function', ...) (from reproduction.recipe import "
        "StageSpec)",
    ]


def test_an_empty_recipe_name_is_exit_4_before_anything_runs(tmp_path):
    _package(
        tmp_path,
        noname="import dataclasses\n\nfrom rv60.recipe import RECIPE\n\n"
        'NONAME = dataclasses.replace(RECIPE, name="")\n',
    )
    done = _run(tmp_path, "rv60.noname:NONAME")
    assert done.returncode == 4, done.stderr
    assert done.stderr.splitlines() == [
        "error: recipe: 'rv60.noname:NONAME' cannot be imported: recipe name '' is not a non-empty str",
        "hint: give the Recipe a name, e.g. Recipe(name='myrecipe', ...) (it is stored in run.json)",
    ]
    assert not (tmp_path / "run").exists()


def test_a_recipe_value_built_wrong_in_code_is_a_config_error():
    good = StageSpec(name="a", fn="m:f")
    with pytest.raises(ConfigError, match=r"^recipe name None is not a non-empty str$"):
        Recipe(name=None, stages=(good,))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^recipe toy: stage 1 is a str, not a StageSpec \('b'\)$"):
        Recipe(name="toy", stages=(good, "b"))  # type: ignore[arg-type]


# -- B4: the config switched to another module's Recipe -------------------------------------------------------------


def test_switching_to_another_modules_recipe_names_both_modules(tmp_path):
    pkg = _package(tmp_path)
    (pkg / "other.py").write_text(RECIPE.replace("CLASS =", "# another module\nCLASS ="))
    assert _run(tmp_path, "rv60.recipe:RECIPE").returncode == 0
    done = _run(tmp_path, "rv60.other:RECIPE", "--resume", "--json")
    assert done.returncode == 0, done.stderr
    sha = {m: hashlib.sha256((pkg / f"{m}.py").read_bytes()).hexdigest()[:12] for m in ("recipe", "other")}
    notes = [line for line in done.stderr.splitlines() if line.startswith("note:")]
    assert notes == [
        f"note: this run was recorded with recipe module rv60.recipe ({(pkg / 'recipe.py').resolve()}, sha256 "
        f"{sha['recipe']}...) and the config now names rv60.other:RECIPE, module rv60.other "
        f"({(pkg / 'other.py').resolve()}, sha256 {sha['other']}...); no stage's declaration (needs, outputs, "
        "training, ...) changed, so its stages are decided by their keys as before"
    ]
    assert json.loads(done.stdout)["stages"][0]["action"] == "skipped"


def test_the_same_module_edited_keeps_its_changed_note(tmp_path):
    pkg = _package(tmp_path)
    assert _run(tmp_path, "rv60.recipe:RECIPE").returncode == 0
    (pkg / "recipe.py").write_text(RECIPE + "# a comment\n")
    done = _run(tmp_path, "rv60.recipe:RECIPE", "--resume", "--json")
    assert done.returncode == 0, done.stderr
    notes = [line for line in done.stderr.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and notes[0].startswith(
        f"note: recipe module rv60.recipe ({(pkg / 'recipe.py').resolve()}) changed since this run recorded it"
    )
