"""audit58 B3: an out-of-tree Recipe defined in a module that holds no stage function (stage functions in
`declb3.stages`, RECIPE in `declb3.recipe`). Editing a stage's declaration there (`needs`, `outputs`) between runs
changed no key, and `--resume` skipped every stage, exit 0, without a word. Each stage record now keeps its
declaration (`declaration`), compared on `--resume`: a changed one is exit 52 naming the stage and the field (old ->
new); a recipe module edited without changing any declaration resumes with a `note:`; a record written before
declarations were kept resumes as before."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from recipe_cli import run_portable

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


def left(ctx):
    out = ctx.out_dir / "left.json"
    atomic_write_text(out, "1")
    return StageOutput(files=[out])


def train(ctx):
    out = ctx.out_dir / "weights.json"
    atomic_write_text(out, "2")
    return StageOutput(files=[out])
"""

RECIPE = """\
from reproduction.recipe import Recipe, StageSpec

RECIPE = Recipe(
    name="declb3",
    config_schema="declb3.stages:Cfg",
    stages=(
        StageSpec(name="prep", fn="declb3.stages:prep", inputs=False, outputs=("rows.json",)),
        StageSpec(name="left", fn="declb3.stages:left", needs=("prep",), inputs=False, outputs=("left.json",)),
        StageSpec(name="train", fn="declb3.stages:train", needs=("prep", "left"), inputs=False,
                  outputs=("weights.json",)),
    ),
)
"""


def _setup(tmp_path: Path) -> Path:
    pkg = tmp_path / "declb3"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "stages.py").write_text(STAGES)
    (pkg / "recipe.py").write_text(RECIPE)
    (tmp_path / "run.yaml").write_text("recipe: declb3.recipe:RECIPE\n")
    done = run_portable(tmp_path, "run", "--config", "run.yaml", "--output", "run", "-q")
    assert done.returncode == 0, done.stderr
    return pkg / "recipe.py"


def _resume(tmp_path: Path):
    return run_portable(tmp_path, "run", "--config", "run.yaml", "--output", "run", "--resume", "--json")


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1
    path.write_text(text.replace(old, new))


def _actions(done) -> dict[str, str]:
    return {s["stage"]: s["action"] for s in json.loads(done.stdout)["stages"]}


def test_a_stage_whose_needs_were_edited_in_the_recipe_module_is_exit_52_naming_it(tmp_path):
    recipe = _setup(tmp_path)
    _edit(recipe, 'needs=("prep", "left")', 'needs=("prep",)')
    done = _resume(tmp_path)
    assert done.returncode == 52, done.stderr
    assert done.stderr.splitlines() == [
        'error: stage train: its declaration in the recipe changed since it ran: needs: ["left", "prep"] -> ["prep"]',
        "hint: put the recipe back, or pass --restart-stage train to redo it (and what follows)",
    ]
    # the same set in another order: no change
    _edit(recipe, 'train", needs=("prep",)', 'train", needs=("left", "prep")')
    done = _resume(tmp_path)
    assert done.returncode == 0, done.stderr
    assert _actions(done) == {"prep": "skipped", "left": "skipped", "train": "skipped"}


def test_a_stage_whose_outputs_were_edited_is_exit_52_and_restart_stage_records_the_new_declaration(tmp_path):
    recipe = _setup(tmp_path)
    _edit(recipe, 'outputs=("left.json",)', 'outputs=("left.json", "extra/*.json")')
    done = _resume(tmp_path)
    assert done.returncode == 52, done.stderr
    assert done.stderr.splitlines()[0] == (
        'error: stage left: its declaration in the recipe changed since it ran: outputs: ["left.json"] -> '
        '["extra/*.json", "left.json"]'
    )
    assert "--restart-stage left" in done.stderr.splitlines()[1]
    redo = run_portable(tmp_path, "run", "--config", "run.yaml", "--output", "run", "--restart-stage", "left", "-q")
    assert redo.returncode == 0, redo.stderr
    state = json.loads((tmp_path / "run" / "run.json").read_text())
    assert state["stages"]["left"]["declaration"]["outputs"] == ["extra/*.json", "left.json"]
    done = _resume(tmp_path)
    assert done.returncode == 0, done.stderr
    assert _actions(done) == {"prep": "skipped", "left": "skipped", "train": "skipped"}


def test_a_comment_only_edit_of_the_recipe_module_resumes_with_a_note(tmp_path):
    recipe = _setup(tmp_path)
    before = json.loads((tmp_path / "run" / "run.json").read_text())["recipe_module"]["sha256"]
    recipe.write_text(recipe.read_text() + "# a comment\n")
    done = _resume(tmp_path)
    assert done.returncode == 0, done.stderr
    assert _actions(done) == {"prep": "skipped", "left": "skipped", "train": "skipped"}
    notes = [line for line in done.stderr.splitlines() if line.startswith("note:")]
    after = hashlib.sha256(recipe.read_bytes()).hexdigest()
    assert notes == [
        f"note: recipe module declb3.recipe ({recipe.resolve()}) changed since this run recorded it (sha256 "
        f"{before[:12]}... -> {after[:12]}...); no stage's declaration (needs, outputs, training, ...) changed, so "
        "its stages are decided by their keys as before"
    ]


def test_a_record_without_a_declaration_resumes_as_before_even_after_an_edit(tmp_path):
    """Run folders written before stop 58 hold no `declaration`: the edit cannot be told, and the run resumes as it
    did (every stage skipped, no refusal)."""
    recipe = _setup(tmp_path)
    path = tmp_path / "run" / "run.json"
    state = json.loads(path.read_text())
    for rec in state["stages"].values():
        del rec["declaration"]
    path.write_text(json.dumps(state, indent=2))
    _edit(recipe, 'outputs=("left.json",)', 'outputs=("left.json", "extra/*.json")')
    done = _resume(tmp_path)
    assert done.returncode == 0, done.stderr
    assert _actions(done) == {"prep": "skipped", "left": "skipped", "train": "skipped"}
    assert done.stderr == ""  # no refusal, and no note: the records cannot tell what they were made under


def test_a_config_key_named_by_a_newer_recipe_is_left_to_the_key(tmp_path):
    """review58 S1: a newer recipe version that names a config key (its value unchanged) must resume a run folder
    this one wrote: the key decides (a config key the record lacks reads as the config the stage ran with), not the
    declaration, which keeps only what no key covers (needs, inputs, outputs, training, target)."""
    recipe = _setup(tmp_path)
    _edit(recipe, 'fn="declb3.stages:prep", inputs=False', 'fn="declb3.stages:prep", config=("n",), inputs=False')
    done = _resume(tmp_path)
    assert done.returncode == 0, done.stderr
    assert _actions(done) == {"prep": "skipped", "left": "skipped", "train": "skipped"}
    state = json.loads((tmp_path / "run" / "run.json").read_text())
    assert sorted(state["stages"]["prep"]["declaration"]) == ["inputs", "needs", "outputs", "target", "training"]
