"""review58 S2: a run folder written before stop 58 can hold a complete training record beside files its globs match
that the record lacks: the old runner put the complete record back over a `--target-step` continuation stopped by
Ctrl-C or an exception after it wrote them (a GRPO live evaluation rl/evidence/eval_rl_N.json, a checkpoint). Such a
record has no `declaration` (stop 58 added both it and the check for added files). Continuing it rewrites and
re-records those files, so `--resume` continues it as the old runner did; a record made by today's runner, and an
old one that is not continued, still refuse an addition (audit58 B2)."""

from __future__ import annotations

import json
from pathlib import Path

from test_outputs_added_audit58 import _portable


def _old_state(run: Path) -> None:
    """What the pre-58 runner left: the stage complete at step 2, and step_3 written by a stopped continuation."""
    state = json.loads((run / "run.json").read_text())
    del state["stages"]["train"]["declaration"]
    (run / "run.json").write_text(json.dumps(state, indent=2))
    (run / "train" / "checkpoints" / "step_3.json").write_text(json.dumps({"step": 3}))


def test_an_old_complete_record_with_a_stopped_continuations_file_is_continued(tmp_path, capsys):
    run = tmp_path / "run"
    assert _portable(capsys, tmp_path, "TRAINING", "--output", str(run)) == (0, [])
    _old_state(run)
    code, err = _portable(capsys, tmp_path, "TRAINING", "--output", str(run), "--resume", "train.steps=4")
    assert code == 0, err
    rec = json.loads((run / "run.json").read_text())["stages"]["train"]
    assert (rec["status"], rec["step"], rec["resumed_from"]) == ("complete", 4, 3)  # from the stopped one's step_3
    assert sorted(rec["outputs"]) == [f"checkpoints/step_{i}.json" for i in range(1, 5)] + ["weights.json"]
    assert "declaration" in rec  # recorded afresh: the next addition is refused
    assert json.loads((run / "train" / "weights.json").read_text()) == {"step": 4}


def test_an_old_record_that_is_not_continued_and_a_new_one_still_refuse_an_addition(tmp_path, capsys):
    run = tmp_path / "run"
    assert _portable(capsys, tmp_path, "TRAINING", "--output", str(run)) == (0, [])
    _old_state(run)
    refused = (
        52,
        [
            "error: stage train: its outputs changed after it completed: checkpoints/step_3.json was added",
            "hint: pass --restart-stage train to redo it",
        ],
    )
    assert _portable(capsys, tmp_path, "TRAINING", "--output", str(run), "--resume") == refused
    new = tmp_path / "new"
    assert _portable(capsys, tmp_path, "TRAINING", "--output", str(new)) == (0, [])
    (new / "train" / "checkpoints" / "step_3.json").write_text(json.dumps({"step": 3}))
    code, err = _portable(capsys, tmp_path, "TRAINING", "--output", str(new), "--resume", "train.steps=4")
    assert (code, err) == refused
