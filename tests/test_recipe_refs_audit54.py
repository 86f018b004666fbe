"""audit54 A3, A7, A8: a `files` key naming a folder or a missing path, a stage module with a missing dependency, and
recipe references whose error hints repeated what the user wrote."""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from reproduction.digest_cache import DigestCache
from reproduction.errors import ConfigError, InputNotFoundError, MissingDependencyError
from reproduction.recipe import Recipe, StageContext, StageOutput, StageSpec
from reproduction.run.lineage import tree_sha256
from reproduction.run.resolve import resolve_recipe
from reproduction.run.runner import RunOptions, read_state, run_recipe
from reproduction.run.stage_call import call_stage
from reproduction.run.stage_keys import key_parts

ARE_RUN: list[str] = []  # the stages that ran, in order


@dataclass(kw_only=True, slots=True)
class Cfg:
    data: str = ""


def first(ctx: StageContext) -> StageOutput:
    ARE_RUN.append("first")
    out = ctx.out_dir / "out.txt"
    out.write_text("first\n")
    return StageOutput(files=[out])


def reads(ctx: StageContext) -> StageOutput:
    ARE_RUN.append("reads")
    out = ctx.out_dir / "out.txt"
    out.write_text(f"{ctx.config.data}\n")
    return StageOutput(files=[out])


def _recipe(fn: str = f"{__name__}:reads", **kw) -> Recipe:
    return Recipe(
        name="a54",
        stages=(
            StageSpec(name="first", fn=f"{__name__}:first", inputs=False),
            StageSpec(name="second", fn=fn, needs=("first",), inputs=False, **kw),
        ),
    )


@pytest.fixture(autouse=True)
def _clean():
    ARE_RUN.clear()
    yield
    for name in [m for m in sys.modules if m.startswith("a54mod")]:
        del sys.modules[name]


# -- A3: files naming a folder, or a path that does not exist ---------------------------------------------------


def test_a_files_key_naming_a_folder_is_keyed_by_its_tree_digest_and_a_change_is_seen(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "x.txt").write_text("aaaa\n")
    spec = StageSpec(name="g", fn=f"{__name__}:reads", inputs=False, files=("data",))
    before = key_parts(spec, {"data": str(folder)}, {}, {}, digests=DigestCache())["files"]
    assert before == {"data": tree_sha256(folder)}  # the digest lineage records for the folder
    (folder / "x.txt").write_text("aaaa\nmore bytes here\n")
    after = key_parts(spec, {"data": str(folder)}, {}, {}, digests=DigestCache())["files"]
    assert after == {"data": tree_sha256(folder)} and after != before


def test_a_files_key_naming_a_file_keeps_its_key_bytes(tmp_path):
    """A file value's key part is its sha256, as before audit54: existing runs' stage keys do not change."""
    ref = tmp_path / "ref.json"
    ref.write_bytes(b'{"a": 1}\n')
    spec = StageSpec(name="g", fn=f"{__name__}:reads", inputs=False, files=("data",))
    parts = key_parts(spec, {"data": str(ref)}, {}, {}, digests=DigestCache())
    assert parts["files"] == {"data": hashlib.sha256(b'{"a": 1}\n').hexdigest()}
    assert key_parts(spec, {"data": ""}, {}, {})["files"] == {"data": None}  # unset: the stage's to handle


def test_a_files_path_that_does_not_exist_is_refused_before_anything_runs(tmp_path):
    missing = tmp_path / "nonexistent"
    run = tmp_path / "run"
    with pytest.raises(InputNotFoundError) as err:
        run_recipe(_recipe(files=("data",)), Cfg(data=str(missing)), run)
    assert err.value.exit_code == 3
    assert str(err.value) == f"recipe a54: stage second reads data={str(missing)!r}, which does not exist"
    assert err.value.hint.startswith("set data to the path the stage reads")
    assert ARE_RUN == [] and not run.exists()


def preflight_other(config, run_dir, opened, stages):
    return ["tokenizer: /nowhere/tok is not a folder"]


def preflight_same(config, run_dir, opened, stages):
    return [f"data: {config.data} is not a file"]


@pytest.mark.parametrize(("check", "listed"), [("preflight_other", 2), ("preflight_same", 1)])
def test_a_missing_files_path_is_listed_with_the_recipes_own_preflight_problems(tmp_path, check, listed):
    """Review R6: a missing path was raised alone, before the recipe's preflight, hiding the problems it lists
    beside it (exit 3 instead of 56 listing both); a key the recipe's preflight names itself is listed once."""
    import dataclasses

    from reproduction.errors import PreflightError

    missing = tmp_path / "nonexistent"
    recipe = dataclasses.replace(_recipe(files=("data",)), preflight=f"{__name__}:{check}")
    with pytest.raises((PreflightError, ConfigError)) as err:
        run_recipe(recipe, Cfg(data=str(missing)), tmp_path / "run")
    if listed == 2:
        assert err.value.exit_code == 56 and "preflight found 2 problems" in str(err.value)
        assert "tokenizer: /nowhere/tok" in str(err.value) and "which does not exist" in str(err.value)
    else:
        assert err.value.exit_code == 4 and str(err.value) == f"preflight: data: {missing} is not a file"
    assert ARE_RUN == []


def test_a_files_placeholder_is_left_to_the_generic_preflight(tmp_path):
    with pytest.raises(ConfigError) as err:
        run_recipe(_recipe(files=("data",)), Cfg(data="/path/to/data"), tmp_path / "run")
    assert err.value.exit_code == 4 and "still holds a /path/to/ placeholder" in str(err.value)


def test_a_missing_files_path_of_a_stage_not_selected_is_not_refused(tmp_path):
    run_recipe(
        _recipe(files=("data",)),
        Cfg(data=str(tmp_path / "nonexistent")),
        tmp_path / "run",
        RunOptions(stages=["first"]),
    )
    assert ARE_RUN == ["first"]


def test_an_unset_files_value_runs_as_before(tmp_path):
    run_recipe(_recipe(files=("data",)), Cfg(data=""), tmp_path / "run")
    assert ARE_RUN == ["first", "reads"]
    assert read_state(tmp_path / "run")["stages"]["second"]["key_parts"]["files"] == {"data": None}


# -- A7: a stage module whose import is not installed --------------------------------------------------------


def _module(tmp_path: Path, monkeypatch, source: str, name: str = "a54mod_dep") -> str:
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_a_stage_module_importing_a_missing_package_is_exit_10_before_anything_runs(tmp_path, monkeypatch):
    mod = _module(tmp_path, monkeypatch, "import a54_not_installed_pkg\n\ndef g(ctx):\n    pass\n")
    run = tmp_path / "run"
    with pytest.raises(MissingDependencyError) as err:
        run_recipe(_recipe(fn=f"{mod}:g"), Cfg(), run)
    assert err.value.exit_code == 10
    assert str(err.value) == (
        f"recipe a54: stage second's module {mod!r} imports 'a54_not_installed_pkg', which is not installed in this "
        "environment"
    )
    assert err.value.hint == "install the package that provides 'a54_not_installed_pkg' (pip install ...) and run again"
    assert ARE_RUN == [] and not run.exists()


def test_a_finished_resume_needs_no_package_of_its_complete_stages(tmp_path, monkeypatch):
    """The up-front check asks only of the stages the run will call: a finished --resume of a torch recipe on a
    machine without torch still finishes (the module's signature is read from its source, as before)."""
    _module(tmp_path, monkeypatch, f"from {__name__} import first as g\n", "a54mod_dep0")
    mod = _module(tmp_path, monkeypatch, "import a54mod_dep0\n\ndef g(ctx):\n    return a54mod_dep0.g(ctx)\n")
    run = tmp_path / "run"
    run_recipe(_recipe(fn=f"{mod}:g"), Cfg(), run)
    (tmp_path / "a54mod_dep0.py").unlink()  # the package gone, the stage module's source as it was
    del sys.modules[mod], sys.modules["a54mod_dep0"]
    run_recipe(_recipe(fn=f"{mod}:g"), Cfg(), run, RunOptions(resume=True))
    assert ARE_RUN == ["first", "first"] and mod not in sys.modules
    assert read_state(run)["stages"]["second"]["status"] == "complete"


def test_a_missing_dependency_found_only_when_the_stage_is_called_is_exit_10(tmp_path, monkeypatch):
    """A package of the recipe's own that imports the missing one: the source scan does not see it; the call does."""
    (tmp_path / "a54mod_pkg").mkdir()
    (tmp_path / "a54mod_pkg" / "__init__.py").write_text("import a54_not_installed_pkg\n")
    mod = _module(tmp_path, monkeypatch, "from a54mod_pkg import x\n\ndef g(ctx):\n    pass\n", "a54mod_caller")
    spec = StageSpec(name="g", fn=f"{mod}:g", inputs=False)
    with pytest.raises(MissingDependencyError) as err:
        call_stage(spec, None, recipe="a54")
    assert err.value.exit_code == 10
    assert "imports 'a54_not_installed_pkg', which is not installed" in str(err.value)


def test_a_misspelt_stage_module_keeps_the_spelling_hint(tmp_path):
    with pytest.raises(ConfigError) as err:
        run_recipe(_recipe(fn="a54mod_no_such_module:g"), Cfg(), tmp_path / "run")
    assert err.value.exit_code == 4 and "fix the spelling of the StageSpec's fn" in err.value.hint
    assert "module 'a54mod_no_such_module' cannot be imported" in str(err.value)


# -- A8: recipe references ------------------------------------------------------------------------------------


def test_a_reference_naming_no_recipe_lists_the_modules_recipes(tmp_path, monkeypatch):
    mod = _module(
        tmp_path,
        monkeypatch,
        "from reproduction.recipe import Recipe, StageSpec\n"
        "OTHER = Recipe(name='o', stages=(StageSpec(name='s', fn='m:f'),))\nWRONG = {}\n",
        "a54mod_recipes",
    )
    with pytest.raises(ConfigError) as err:
        resolve_recipe(f"{mod}:RECIPE")
    assert err.value.hint == f"point recipe at one of the module's Recipes: {mod}:OTHER"
    with pytest.raises(ConfigError) as err:
        resolve_recipe("reproduction.errors:ConfigError")
    assert err.value.hint == (
        "module 'reproduction.errors' holds no Recipe: point recipe at package.module:ATTRIBUTE where ATTRIBUTE is a "
        "Recipe"
    )


def test_a_reference_without_a_colon_names_no_internal_module():
    with pytest.raises(ConfigError) as err:
        resolve_recipe("aud.r")
    assert err.value.exit_code == 4
    assert str(err.value) == "recipe: 'aud.r' is not a built-in recipe (built-in recipes: grpo, recap)"
    assert "reproduction.recipes" not in str(err.value) + err.value.hint
    assert err.value.hint == (
        "name a built-in recipe, or an out-of-tree one as package.module:ATTRIBUTE (e.g. aud.r:RECIPE), its package "
        "importable (PYTHONPATH)"
    )
