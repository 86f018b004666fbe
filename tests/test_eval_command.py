"""`portable eval --checkpoint`: which exports it evaluates, at which step, into which evidence file; and that
it is refused (nothing evaluated) where a `portable run` works in the run folder (exit 7) or evidence/ links out
(exit 55).

Regressions: a policy export folder was labelled "after 0 steps" (its step was never read); two exports
evaluated into one --output wrote the same evidence file; `--checkpoint STEP` evaluated only the recap
policy of a run that trained recap and bc, without saying so. The simulator is swapped out at the seam
(`recipes/recap/policy.py`'s `evaluate_exports`): what is checked here is what the command asks it to evaluate."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from reproduction.portable import main


@pytest.fixture
def calls(monkeypatch):
    seen = []

    def evaluate_exports(
        config,
        exports,
        out_dir,
        run_dir,
        *,
        name="policy",
        ui=None,
        labels=None,
        export_execute_steps=False,
        resume=True,
    ):
        assert resume is False  # `portable eval`: a killed worker's hint is a plain rerun, not --resume
        step = next(iter(exports.values()))[1] or 0
        rel = f"evidence/eval_{name}_{step}.json"
        (Path(run_dir) / rel).parent.mkdir(parents=True, exist_ok=True)
        (Path(run_dir) / rel).write_text(json.dumps({m: [str(p), s] for m, (p, s) in exports.items()}))
        seen.append(
            {
                "modes": list(config.policy.modes),
                "exports": dict(exports),
                "out_dir": out_dir,
                "name": name,
                "labels": labels,
            }
        )
        return SimpleNamespace(summary={"evidence": rel})

    monkeypatch.setattr("reproduction.recipes.recap.policy.evaluate_exports", evaluate_exports)
    return seen


def _export(root: Path, mode: str, max_steps: int) -> Path:
    root.mkdir(parents=True)
    (root / "policy.json").write_text(json.dumps({"mode": mode, "format_version": 1}))
    (root / "train_config.json").write_text(json.dumps({"max_steps": max_steps, "lr": 0.001}))
    return root


def test_an_export_folder_is_evaluated_at_its_real_step(tmp_path, calls, capsys):
    export = _export(tmp_path / "a" / "export", "recap", 40)
    assert main(["-q", "eval", "--checkpoint", str(export), "--output", str(tmp_path / "run")]) == 0
    assert calls[0]["exports"] == {"recap": (export, 40)}  # not None, which the evidence showed as "after 0 steps"


def test_two_exports_into_one_output_get_two_evidence_files(tmp_path, calls):
    run = tmp_path / "run"
    a = _export(tmp_path / "a" / "export", "recap", 40)
    b = _export(tmp_path / "b" / "export", "recap", 40)  # same mode, same step, another export
    for export in (a, b):
        assert main(["-q", "eval", "--checkpoint", str(export), "--output", str(run)]) == 0
    names = sorted(p.name for p in (run / "evidence").iterdir())
    assert len(names) == 2 and calls[0]["name"] != calls[1]["name"], names
    assert all(n.startswith("eval_checkpoint_recap_") and n.endswith("_40.json") for n in names), names
    docs = [json.loads((run / "evidence" / n).read_text()) for n in names]
    assert sorted(d["recap"][0] for d in docs) == sorted([str(a), str(b)])
    assert calls[0]["out_dir"] != calls[1]["out_dir"]  # the simulator's own outputs do not collide either


def test_a_step_evaluates_every_mode_the_run_trained_and_says_so(tmp_path, calls, capsys):
    run = tmp_path / "run"
    run.mkdir()
    state = {
        "format_version": 1,
        "recipe": "recap",
        "run_id": "r",
        "stages": {
            "policy": {
                "status": "complete",
                "key": "0" * 64,
                "outputs": {},
                "step": 6,
                "summary": {"recap": {"step": 6}, "bc": {"step": 6}},
            }
        },
        "config": {},
    }
    (run / "run.json").write_text(json.dumps(state))
    capsys.readouterr()
    assert main(["eval", "--checkpoint", "6", "--output", str(run)]) == 0
    err = capsys.readouterr().err
    assert calls[0]["modes"] == ["recap", "bc"]
    assert calls[0]["exports"] == {
        "recap": (run / "policy" / "recap" / "export", 6),
        "bc": (run / "policy" / "bc" / "export", 6),
    }
    assert "evaluating 2 policy export(s): recap (step 6, " in err and ", bc (step 6, " in err
    assert (run / "evidence" / "eval_checkpoint_6.json").is_file()  # the documented name for the STEP form


def _trained_run(run: Path) -> Path:
    run.mkdir()
    state = {
        "format_version": 1,
        "recipe": "recap",
        "run_id": "r",
        "stages": {"policy": {"status": "complete", "key": "0" * 64, "outputs": {}, "step": 6, "summary": {}}},
        "config": {},
    }
    (run / "run.json").write_text(json.dumps(state))
    return run


def test_eval_into_a_run_folder_another_process_works_in_is_exit_7(tmp_path, calls, capsys):
    import os

    from reproduction.run.guards import run_lock

    run = _trained_run(tmp_path / "run")
    capsys.readouterr()
    with run_lock(run):
        assert main(["eval", "--checkpoint", "6", "--output", str(run)]) == 7
    lines = capsys.readouterr().err.strip().splitlines()
    busy = f"error: {run}: busy: another portable process (pid {os.getpid()}: run) is working on this run folder"
    assert lines[0].startswith(busy) and len(lines) <= 2, lines
    assert calls == [] and not (run / "evidence").exists()


def test_eval_into_a_run_folder_whose_evidence_links_out_is_exit_55_and_writes_nothing_there(tmp_path, calls, capsys):
    run = _trained_run(tmp_path / "run")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (run / "evidence").symlink_to(outside, target_is_directory=True)
    capsys.readouterr()
    assert main(["eval", "--checkpoint", "6", "--output", str(run)]) == 55
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0].startswith(f"error: {run / 'evidence'} is a symbolic link (to {outside})"), lines
    assert len(lines) == 2 and lines[1].startswith("hint: ")
    assert calls == [] and list(outside.iterdir()) == []


@pytest.fixture
def grpo_calls(monkeypatch):
    seen = []

    def evaluate_exports(config, exports, out_dir, run_dir, *, name="policy", ui=None, resume=True):
        assert resume is False  # `portable eval`: a killed worker's hint is a plain rerun, not --resume
        seen.append({"exports": dict(exports), "name": name})
        rel = f"evidence/eval_{name}_0.json"
        (Path(run_dir) / rel).parent.mkdir(parents=True, exist_ok=True)
        (Path(run_dir) / rel).write_text("{}")
        return SimpleNamespace(summary={"evidence": rel})

    monkeypatch.setattr("reproduction.recipes.grpo.stages.evaluate_exports", evaluate_exports)
    return seen


def test_another_recipes_export_is_refused_not_recorded_under_a_false_label(tmp_path, calls, grpo_calls, capsys):
    """audit46 newcomer F4: a GRPO rl export (policy.json algorithm grpo, mode bc) evaluated into a RECAP run was
    recorded as `bc` and compared with the reference's bc rows; a RECAP recap export into a GRPO run as `sft`. Both
    are exit 4 naming what the export is and what the run's evidence labels, before anything is evaluated."""
    grpo = tmp_path / "g" / "export"
    grpo.mkdir(parents=True)
    (grpo / "policy.json").write_text(json.dumps({"algorithm": "grpo", "mode": "bc", "format_version": 1}))
    recap = _export(tmp_path / "r" / "export", "recap", 40)
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(grpo), "--output", str(tmp_path / "recap-run")]) == 4
    assert capsys.readouterr().err.splitlines() == [
        f"error: checkpoint {grpo} is not a RECAP policy export (policy.json: algorithm grpo, mode bc); a RECAP "
        "run's evidence labels only RECAP's modes (recap, bc, filtered_bc)",
        f"hint: evaluate it into a grpo run folder: portable eval --checkpoint {grpo} --output GRPO_RUN",
    ]
    grpo_run = tmp_path / "grpo-run"
    assert main(["eval", "--checkpoint", str(recap), "--output", str(grpo_run), "recipe=grpo"]) == 4
    assert capsys.readouterr().err.splitlines() == [
        f"error: checkpoint {recap} is neither a GRPO nor a BC policy export (policy.json: mode recap); a GRPO run's "
        "evidence labels only grpo (algorithm grpo) and sft (mode bc) policies",
        f"hint: evaluate it into a RECAP run folder: portable eval --checkpoint {recap} --output RECAP_RUN",
    ]
    assert calls == [] and grpo_calls == []
    assert not (tmp_path / "recap-run").exists() and not grpo_run.exists()
    # what each run can label truthfully still evaluates: a GRPO export as grpo, a BC export as sft
    bc = _export(tmp_path / "b" / "export", "bc", 20)
    assert main(["-q", "eval", "--checkpoint", str(grpo), "--output", str(grpo_run), "recipe=grpo"]) == 0
    assert main(["-q", "eval", "--checkpoint", str(bc), "--output", str(grpo_run), "recipe=grpo"]) == 0
    assert [list(c["exports"]) for c in grpo_calls] == [["grpo"], ["sft"]]


def test_another_recipes_bc_export_is_labelled_by_the_stage_that_wrote_it_not_bc(tmp_path, calls, capsys):
    """Stop 48: GRPO's sft export (policy.json mode bc, no algorithm) evaluated into a RECAP run was labelled `bc`,
    as if it were the RECAP run's own bc policy. It is labelled by its own run's stage, `sft` (as GRPO's evidence
    labels it); a RECAP run's bc export and an export outside any run folder keep the label `bc`."""
    grpo_run = tmp_path / "grpo-run"
    sft = _export(grpo_run / "sft" / "export", "bc", 20)
    (grpo_run / "run.json").write_text(json.dumps({"recipe": "grpo", "stages": {"sft": {"status": "complete"}}}))
    recap_run = tmp_path / "recap-run"
    own_bc = _export(recap_run / "policy" / "bc" / "export", "bc", 30)
    (recap_run / "run.json").write_text(json.dumps({"recipe": "recap", "stages": {"policy": {"status": "complete"}}}))
    loose = _export(tmp_path / "loose" / "export", "bc", 40)
    out = tmp_path / "out"
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(sft), "--output", str(out)]) == 0
    assert capsys.readouterr().err.splitlines()[0] == (
        f"evaluating 1 policy export(s): sft (mode bc, step 20, {sft.resolve()})"
    )
    for export in (own_bc, loose):
        assert main(["-q", "eval", "--checkpoint", str(export), "--output", str(out)]) == 0
    assert [(c["modes"], c["labels"]) for c in calls] == [(["bc"], {"bc": "sft"}), (["bc"], {}), (["bc"], {})]


def test_the_evaluations_label_a_baseline_mode_by_the_labels_given():
    from reproduction.recipes.recap.policy import evaluations

    config = SimpleNamespace(
        policy=SimpleNamespace(modes=["recap", "bc"]), eval=SimpleNamespace(guidance_scales=[1.0, 3.0])
    )
    assert evaluations(config) == [("recap w=1", "recap", 1.0), ("recap w=3", "recap", 3.0), ("bc", "bc", 1.0)]
    assert evaluations(config, {"bc": "sft"})[-1] == ("sft", "bc", 1.0)
