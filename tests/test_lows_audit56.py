"""audit56 lows: the held-signal rule in one leaf module (review R6), a checkpointing stage's lineage line (B6), and
the note when a training stage redone afresh drops back from an earlier --target-step to its step count (B4)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from reproduction.recipe import Recipe, StageContext, StageOutput, StageSpec
from reproduction.run.lineage_check import lineage_chain
from reproduction.run.record import make_recorder
from reproduction.run.runner import RunOptions, read_state, run_recipe

REPO = Path(__file__).resolve().parents[1]

# -- R6: one copy of the rule --------------------------------------------------------------------------------------

SIM = """
from reproduction.sim.workers import sigterm_as_interrupt
guard = sigterm_as_interrupt()
"""
RUN = """
from reproduction.run.guards import interrupts_noted
guard = interrupts_noted([])
"""
BODY = """
import os, signal, sys
import reproduction.interrupts as rule
rule.HELD_SIGNALS = {held}
{guard}
with guard:
    try:
        os.kill(os.getpid(), signal.SIGTERM)
    except KeyboardInterrupt:
        for _ in range({held} + 1):
            os.kill(os.getpid(), signal.SIGTERM)
        print("not reached", flush=True)
"""
SIM_NOTE = "note: already stopping (removing what this run was writing); interrupt {held} more times to quit at once, "
SIM_NOTE += "leaving it behind"
RUN_NOTE = "note: already stopping (cleaning up after the interrupt); interrupt {held} more times to quit at once, "
RUN_NOTE += "leaving the cleanup undone"
QUIT = "error: interrupted again: quitting without finishing the cleanup"


@pytest.mark.parametrize("held", [2, 1], ids=["as-shipped", "rule-changed-once"])
@pytest.mark.parametrize("which", ["sim", "run"])
def test_sim_and_portable_hold_signals_by_the_one_rule_in_reproduction_interrupts(which, held):
    """Both handlers hold signals after the first interrupt, print their own note once and quit with exit 130 at the
    one past interrupts.HELD_SIGNALS: the messages are those shipped, and changing the one constant changes both."""
    guard, note = (SIM, SIM_NOTE) if which == "sim" else (RUN, RUN_NOTE)
    code = textwrap.dedent(BODY).format(held=held, guard=textwrap.dedent(guard))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 130, done.stderr
    assert done.stdout == ""
    assert done.stderr.splitlines() == [note.format(held=held), QUIT]


def test_the_rule_module_is_a_stdlib_leaf_and_neither_side_keeps_a_copy():
    """reproduction/interrupts.py imports nothing of reproduction/ (sim may import it, not run/); the quit line and
    HELD_SIGNALS live there only."""
    tree = ast.parse((REPO / "reproduction" / "interrupts.py").read_text(encoding="utf-8"))
    names = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    names += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [n for n in names if n.startswith("reproduction")]
    for rel in ("reproduction/run/guards.py", "reproduction/sim/workers.py"):
        text = (REPO / rel).read_text(encoding="utf-8")
        assert "interrupted again" not in text and "HELD_SIGNALS =" not in text, rel
        assert "from reproduction.interrupts import answer_held, held_note" in text, rel


# -- B6 and B4: a toy recipe with a checkpointing training stage -------------------------------------------------


@dataclass(kw_only=True)
class Prep:
    n: int = 1


@dataclass(kw_only=True)
class Train:
    steps: int = 8


@dataclass(kw_only=True)
class Cfg:
    prep: Prep = field(default_factory=Prep)
    train: Train = field(default_factory=Train)


def prep(ctx: StageContext) -> StageOutput:
    out = ctx.out_dir / "data.json"
    out.write_text(json.dumps({"n": ctx.config.prep.n}))
    return StageOutput(files=[out])


def train(ctx: StageContext) -> StageOutput:
    """Trains to --target-step (else train.steps): a checkpoint per step kept, weights.json returned."""
    steps = ctx.target_step or ctx.config.train.steps
    for step in range(1, steps + 1):
        folder = ctx.out_dir / "checkpoints" / f"step_{step}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "state.json").write_text(json.dumps({"step": step}))
    out = ctx.out_dir / "weights.json"
    out.write_text(json.dumps({"steps": steps}))
    return StageOutput(files=[out], step=steps)


RECIPE = Recipe(
    name="lows56",
    stages=(
        StageSpec(name="prep", fn=f"{__name__}:prep", config=("prep",), inputs=False),
        StageSpec(
            name="train",
            fn=f"{__name__}:train",
            needs=("prep",),
            config=("train",),
            inputs=False,
            training="train.steps",
            outputs=("weights.json", "checkpoints/**/*"),
        ),
    ),
)


def _opts(**kw) -> RunOptions:
    return RunOptions(recorder=make_recorder(None), **kw)


def test_the_lineage_line_of_a_checkpointing_stage_shows_the_file_it_returned(tmp_path):
    """audit56 B6: the train line showed `train/checkpoints/step_1/state.json` (first by path), not weights.json."""
    run = tmp_path / "run"
    run_recipe(RECIPE, Cfg(train=Train(steps=3)), run, _opts())
    (root,) = lineage_chain(run).roots
    assert (root.label, root.name, root.note.split(",")[0]) == ("train", "train/weights.json", "+3 more files")
    (upstream,) = [c for c in root.children if c.label == "prep"]
    assert upstream.name == "prep/data.json"


def test_a_training_stage_redone_afresh_says_it_drops_back_to_its_step_count(tmp_path, capsys):
    """audit56 B4: trained to --target-step 10, then redone because its upstream changed, train runs train.steps (8)
    and one `note:` line says so; a redo with a --target-step of its own, or one not below, says nothing."""
    run = tmp_path / "run"
    run_recipe(RECIPE, Cfg(), run, _opts(target_step=10))
    assert read_state(run)["stages"]["train"]["step"] == 10
    run_recipe(RECIPE, Cfg(prep=Prep(n=2)), run, _opts(stages=["prep"], restart=["prep"]))  # train now stale
    capsys.readouterr()
    run_recipe(RECIPE, Cfg(prep=Prep(n=2)), run, _opts(resume=True))
    assert read_state(run)["stages"]["train"]["step"] == 8
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note: train")]
    assert notes == [
        "note: train is redone from the start to train.steps = 8 steps, not the 10 it had trained before; pass "
        "--target-step 10 to train it that far again"
    ]
    for n, target in ((3, None), (4, 12)):  # 8 -> 8: nothing dropped; its own --target-step: said by the command
        run_recipe(RECIPE, Cfg(prep=Prep(n=n)), run, _opts(stages=["prep"], restart=["prep"]))
        run_recipe(RECIPE, Cfg(prep=Prep(n=n)), run, _opts(resume=True, target_step=target))
    assert read_state(run)["stages"]["train"]["step"] == 12
    assert "note: train" not in capsys.readouterr().err
