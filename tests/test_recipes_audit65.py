"""audit65_B: an out-of-tree recipe package through `portable run` as a first-time user writes it: a SyntaxError in
a stage's or the config schema's module is the user's file and line, exit 4, not "internal error" (H1); one problem
per module that cannot be imported (L1); the recipe module's own exception names its line (L5)."""

from __future__ import annotations

import json
from pathlib import Path

from recipe_cli import run_portable

CONFIG = """\
from dataclasses import dataclass, field


@dataclass(kw_only=True)
class Train:
    steps: int = 3


@dataclass(kw_only=True)
class Cfg:
    train: Train = field(default_factory=Train)
"""

STAGES = """\
import json

from reproduction.fsio import atomic_write_text
from reproduction.recipe import StageOutput


def train(ctx):
    checkpoint = ctx.out_dir / "state.json"
    step = json.loads(checkpoint.read_text())["step"] if ctx.resume and checkpoint.is_file() else 0
    started = step
    target = ctx.target_step or ctx.config.train.steps
    while step < target:
        step += 1
        atomic_write_text(checkpoint, json.dumps({"step": step}))
    return StageOutput(files=[checkpoint], step=step, resumed_from=started or None)


def score(ctx):
    out = ctx.out_dir / "score.json"
    atomic_write_text(out, (ctx.run_dir / "train" / "state.json").read_text())
    return StageOutput(files=[out])
"""

RECIPE = """\
from reproduction.recipe import Recipe, StageSpec

RECIPE = Recipe(
    name="r65",
    config_schema="r65.config:Cfg",
    stages=(
        StageSpec(name="train", fn="r65.stages:train", config=("train",), training="train.steps", inputs=False,
                  outputs=("state.json",), code=("r65",)),
        StageSpec(name="score", fn="r65.stages:score", needs=("train",), inputs=False, code=("r65",)),
    ),
)
"""


def _package(folder: Path, **edits: tuple[str, str]) -> Path:
    """The r65 package (config.py, stages.py, recipe.py) and c.yaml in `folder`; `edits`: {module: (old, new)}, one
    replacement each, asserted to apply."""
    (folder / "r65").mkdir(parents=True)
    (folder / "r65" / "__init__.py").write_text("")
    for name, text in {"config": CONFIG, "stages": STAGES, "recipe": RECIPE}.items():
        if name in edits:
            old, new = edits[name]
            assert old in text, old
            text = text.replace(old, new, 1)
        (folder / "r65" / f"{name}.py").write_text(text)
    (folder / "c.yaml").write_text("recipe: r65.recipe:RECIPE\n")
    return folder


def _run(folder: Path, *args: str):
    return run_portable(folder, "run", "--config", "c.yaml", "--output", "run", *args)


def _lines(proc) -> list[str]:
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.stderr.strip().splitlines()


def test_the_package_runs(tmp_path):
    done = _run(_package(tmp_path))
    assert done.returncode == 0, done.stderr


def test_a_syntax_error_in_a_stage_module_names_the_file_and_line_exit_4(tmp_path):
    """H1: was `error: internal error: SyntaxError: expected ':' (stages.py, line 7)`, `hint: this is a bug in
    recap-portable`, exit 1."""
    folder = _package(tmp_path, stages=("def train(ctx):", "def train(ctx)"))
    proc = _run(folder)
    path = folder / "r65" / "stages.py"
    assert proc.returncode == 4, proc.stderr
    assert _lines(proc) == [
        f"error: recipe r65: stage train's module 'r65.stages' cannot be imported: SyntaxError: expected ':' "
        f"(at {path}:7)",
        f"hint: fix {path}:7, then run again; python -c 'import r65.stages' (with the same PYTHONPATH) shows the "
        "traceback",
    ]  # one problem for the module both stages' functions live in (audit65_B L1)
    assert not (folder / "run").exists()


def test_a_syntax_error_in_the_config_schema_module_names_the_file_and_line_exit_4(tmp_path):
    folder = _package(tmp_path, config=("class Train:", "class Train"))
    proc = _run(folder)
    assert proc.returncode == 4, proc.stderr
    assert _lines(proc)[0] == (
        "error: recipe 'r65': config_schema 'r65.config:Cfg' cannot be imported: SyntaxError: expected ':' "
        f"(at {folder / 'r65' / 'config.py'}:5)"
    )


def test_an_exception_at_a_stage_modules_top_level_names_the_file_and_line(tmp_path):
    """open_inputs in the stages' module imports it before anything runs: exit 4 naming the line, as for the recipe
    module."""
    folder = _package(
        tmp_path,
        stages=(
            "def train(ctx):",
            "X = undefined_name\n\n\ndef open_inputs(config):\n    return {}\n\n\ndef train(ctx):",
        ),
        recipe=('    name="r65",', '    name="r65",\n    open_inputs="r65.stages:open_inputs",'),
    )
    proc = _run(folder)
    assert proc.returncode == 4, proc.stderr
    assert _lines(proc)[0] == (
        "error: recipe r65: open_inputs module 'r65.stages' cannot be imported: NameError: name 'undefined_name' is "
        f"not defined (at {folder / 'r65' / 'stages.py'}:7)"
    )


def test_a_syntax_error_in_a_module_a_stage_imports_when_it_runs_is_the_users_line(tmp_path):
    """A helper the stage imports inside its function: the stage raised it (exit 1, recorded failed), named by the
    SyntaxError's own file and line, not "internal error"."""
    folder = _package(tmp_path, stages=("    checkpoint = ", "    import r65.helper  # noqa\n    checkpoint = "))
    (folder / "r65" / "helper.py").write_text("x = (\n")
    proc = _run(folder)
    assert proc.returncode == 1, proc.stderr
    lines = _lines(proc)
    assert lines[0].startswith("error: SyntaxError: '(' was never closed"), lines
    assert lines[1].startswith(f"hint: raised at {folder / 'r65' / 'helper.py'}:1, outside recap-portable"), lines


def test_a_missing_package_in_the_stages_module_is_one_problem_with_its_install_hint(tmp_path):
    """L1: was exit 56, the same problem once per stage and once for open_inputs, no install hint."""
    folder = _package(tmp_path, stages=("import json\n", "import json\nimport sklearn_nonexistent65\n"))
    proc = _run(folder)
    assert proc.returncode == 10, proc.stderr
    assert _lines(proc) == [
        "error: recipe r65: stage train's module 'r65.stages' imports 'sklearn_nonexistent65', which is not "
        "installed in this environment",
        "hint: install the package that provides 'sklearn_nonexistent65' (pip install ...) and run again",
    ]


def test_a_misspelt_code_module_shared_by_stages_is_one_problem(tmp_path):
    folder = _package(tmp_path)
    folder_recipe = (folder / "r65" / "recipe.py").read_text().replace('code=("r65",)', 'code=("r65x",)')
    (folder / "r65" / "recipe.py").write_text(folder_recipe)
    proc = _run(folder)
    assert proc.returncode == 4, proc.stderr
    assert _lines(proc)[0] == "error: recipe r65: stages train, score declare code module 'r65x', which cannot be found"


def test_an_exception_at_the_top_of_the_recipe_module_names_its_line(tmp_path):
    """L5: was `... NameError: name 'undefined_name' is not defined`, hint `python -c 'import ...'`."""
    folder = _package(tmp_path, recipe=("RECIPE = Recipe(", "X = undefined_name\nRECIPE = Recipe("))
    proc = _run(folder)
    path = folder / "r65" / "recipe.py"
    assert proc.returncode == 4, proc.stderr
    assert _lines(proc) == [
        f"error: recipe: 'r65.recipe:RECIPE' cannot be imported: NameError: name 'undefined_name' is not defined "
        f"(at {path}:3)",
        f"hint: fix {path}:3, then run again; python -c 'import r65.recipe' (with the same PYTHONPATH) shows the "
        "traceback",
    ]


def test_a_target_step_no_selected_stage_trains_to_is_refused_before_anything_runs(tmp_path):
    """M2 (a): `training=` forgotten, `--target-step 7` trained to the step count (3) without a word, exit 0."""
    folder = _package(tmp_path, recipe=(' training="train.steps",', ""))
    proc = _run(folder, "--target-step", "7")
    assert proc.returncode == 2, proc.stderr
    assert _lines(proc) == [
        "error: --target-step 7: none of the selected stages (train, score) of recipe r65 declares "
        "StageSpec.training, so it would train nothing",
        "hint: declare the step-count key of the stage that trains (StageSpec(training='SECTION.steps'), "
        "docs/recipes.md), or leave --target-step out",
    ]
    assert not (folder / "run").exists()


def test_a_target_step_with_stages_selecting_no_training_stage_is_refused_with_a_hint_that_works(tmp_path):
    """M2 (b): `--resume --target-step 5 --stages score` said `score skipped`, exit 0; the hint's --stages works."""
    folder = _package(tmp_path)
    assert _run(folder).returncode == 0
    before = (folder / "run" / "run.json").read_bytes()
    proc = _run(folder, "--resume", "--target-step", "5", "--stages", "score")
    assert proc.returncode == 2, proc.stderr
    assert _lines(proc) == [
        "error: --target-step 5: none of the selected stages (score) of recipe r65 declares StageSpec.training, so "
        "it would train nothing",
        "hint: select a training stage of it (train), e.g. --stages train,score, or leave --target-step out",
    ]
    assert (folder / "run" / "run.json").read_bytes() == before
    done = _run(folder, "--resume", "--target-step", "5", "--stages", "train,score")
    assert done.returncode == 0, done.stderr
    assert json.loads((folder / "run" / "score" / "score.json").read_text()) == {"step": 5}


def _printing(tmp_path: Path) -> Path:
    """The package whose recipe module prints when imported and whose train stage prints three ways: print(), a
    write to fd 1, and a child process writing to its inherited stdout."""
    return _package(
        tmp_path,
        recipe=("RECIPE = Recipe(", 'print("recipe imported")\nRECIPE = Recipe('),
        stages=(
            "    started = step\n",
            "    started = step\n"
            '    print("training from", step)\n'
            '    __import__("os").write(1, b"fd one\\n")\n'
            '    __import__("subprocess").run(["echo", "from a child"], check=True)\n'
            "    if ctx.config.train.steps == 2:\n"
            '        raise ValueError("stage failed")\n',
        ),
    )


def test_a_stage_printing_to_stdout_leaves_json_one_document(tmp_path):
    """M3: stdout was `training from 0` then the JSON (json.loads failed)."""
    folder = _printing(tmp_path)
    proc = _run(folder, "--json")
    assert proc.returncode == 0, proc.stderr
    assert [s["action"] for s in json.loads(proc.stdout)["stages"]] == ["ran", "ran"]
    for line in ("recipe imported", "training from 0", "fd one", "from a child"):
        assert line in proc.stderr.splitlines(), proc.stderr
    printed = run_portable(folder, "run", "--config", "c.yaml", "--print-config", "--json")
    assert printed.returncode == 0 and json.loads(printed.stdout)["train"] == {"steps": 3}, printed.stdout
    failed = run_portable(folder, "run", "--config", "c.yaml", "--output", "r2", "--json", "train.steps=2")  # raises
    assert failed.returncode == 1, failed.stderr
    assert failed.stdout == "" and "training from 0" in failed.stderr and "fd one" in failed.stderr


def test_stdout_to_stderr_puts_fd_1_back_when_the_code_inside_raises(capfd):
    import os
    import sys

    import pytest

    from reproduction.ui import stdout_to_stderr

    with pytest.raises(KeyboardInterrupt), stdout_to_stderr():
        print("talk")
        os.write(1, b"fd talk\n")
        raise KeyboardInterrupt
    print("data", flush=True)
    os.write(1, b"fd data\n")
    out, err = capfd.readouterr()
    assert (out, err) == ("data\nfd data\n", "talk\nfd talk\n")
    assert sys.stdout is sys.__stdout__ or sys.stdout is not sys.stderr


def test_a_training_stage_ignoring_its_target_step_is_refused_not_recorded_at_the_target(tmp_path):
    """M1: a loop that trains to its step count only said `train continued` to --target-step 5, run.json recording
    step 3 with lineage.target_step 5, and `lineage --verify` passed."""
    folder = _package(tmp_path, stages=("ctx.target_step or ctx.config.train.steps", "ctx.config.train.steps"))
    assert _run(folder).returncode == 0
    proc = _run(folder, "--resume", "--target-step", "5")
    assert proc.returncode == 54, proc.stderr
    assert _lines(proc) == [
        "error: recipe r65: stage train was asked to train to step 5 (ctx.target_step) but returned step 3",
        "hint: a training stage trains to ctx.target_step when it is set, else to its step count (train.steps), and "
        "returns the step it reached (docs/recipes.md); fix it, then `portable run` with --resume continues it",
    ]
    train = json.loads((folder / "run" / "run.json").read_text())["stages"]["train"]
    assert (train["status"], train["step"], "target_step" in train["lineage"]) == ("complete", 3, False)
    statement = json.loads((folder / "run" / "lineage" / "train.intoto.json").read_text())
    assert "target_step" not in statement["predicate"]["buildDefinition"]["externalParameters"]
    fresh = run_portable(folder, "run", "--config", "c.yaml", "--output", "r2", "--target-step", "5")
    assert fresh.returncode == 54, fresh.stderr  # a fresh run to a target alike: recorded failed, not complete
    assert json.loads((folder / "r2" / "run.json").read_text())["stages"]["train"]["status"] == "failed"


def test_a_dot_for_the_colon_in_recipe_suggests_the_reference_that_works(tmp_path):
    """L2: `recipe: r65.recipe.RECIPE` suggested `r65.recipe.RECIPE:RECIPE`, which fails."""
    folder = _package(tmp_path)
    proc = _run(folder, "recipe=r65.recipe.RECIPE")
    assert proc.returncode == 4, proc.stderr
    assert "(e.g. r65.recipe:RECIPE)" in _lines(proc)[1], proc.stderr
    assert _run(folder, "recipe=r65.recipe:RECIPE").returncode == 0
    other = _run(folder, "recipe=r65.nosuch")  # no Recipe found that way: the form, as before
    assert other.returncode == 4 and "(e.g. r65.nosuch:RECIPE)" in other.stderr, other.stderr


def test_a_negative_training_count_is_refused_naming_the_key(tmp_path):
    """L7: `train.steps=-3` ran and recorded train complete at step 0."""
    folder = _package(tmp_path)
    proc = _run(folder, "train.steps=-3")
    assert proc.returncode == 4, proc.stderr
    assert _lines(proc) == [
        "error: config key `train.steps` is -3: it is stage train's step count (StageSpec.training of recipe r65), "
        "which cannot be negative",
        "hint: set train.steps to the number of steps to train (>= 0)",
    ]
    assert not (folder / "run").exists()


def test_a_misspelt_report_is_refused_before_anything_runs(tmp_path):
    """L3: found only after every stage had run, as a warning that every --resume repeated."""
    folder = _package(tmp_path, recipe=('    name="r65",', '    name="r65",\n    report="r65.stages:write_reprt",'))
    proc = _run(folder)
    assert proc.returncode == 4, proc.stderr
    assert _lines(proc) == [
        "error: recipe r65: its report 'r65.stages:write_reprt' cannot be loaded: module 'r65.stages' has no "
        "attribute 'write_reprt'",
        "hint: fix the spelling of the Recipe's report ('module:function' taking the run folder)",
    ]
    assert not (folder / "run").exists()


def test_an_out_of_tree_recipes_config_error_names_its_schema_not_docs_config_md(tmp_path):
    """L4: `hint: see docs/config.md for its type`, a page of the built-in recipes' keys."""
    folder = _package(tmp_path)
    proc = _run(folder, "train.steps=2.5")
    assert proc.returncode == 4, proc.stderr
    assert _lines(proc)[1] == "hint: see its schema r65.config:Cfg for its type"
    (folder / "c.yaml").write_text("recipe: r65.recipe:RECIPE\ntrain: 20\n")
    proc = _run(folder)
    assert proc.returncode == 4, proc.stderr
    assert _lines(proc)[1] == "hint: set its fields (train.NAME=...; its schema r65.config:Cfg lists them)"


def test_an_eval_record_without_counts_names_the_result_shape_for_any_recipe(tmp_path):
    """L6: the hint sent a recipe with its own evaluation to the simulator's EvalResult.to_dict() (no tasks), or
    was the generic stage hint (rates instead of counts)."""
    import pytest

    from reproduction.errors import InvalidInputError
    from reproduction.run.evidence import EvalRecord, write_eval_evidence

    for result in ({"taskz": {"g": {}}}, {"tasks": {"g": {"episodes": 5, "success_once_rate": 0.2}}}):
        with pytest.raises(InvalidInputError) as err:
            write_eval_evidence(
                tmp_path / "e.json",
                EvalRecord(result=result, label="mine", mode="mine"),
                name="e",
                run_id="x",
                seeds={},
                settings={},
            )
        assert err.value.exit_code == 4
        assert "{'episodes': N, 'success_once': K, 'success_at_end': K}" in err.value.hint, err.value.hint
    assert not (tmp_path / "e.json").exists()
