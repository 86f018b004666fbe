"""`portable demo` in a folder whose earlier demo ran other code or config: a stage whose key changed is
redone with what follows (the demo's inputs are its own), where `portable run --resume` refuses (exit 52).
The runner is replaced by a fake so the test is fast; tests/test_run_demo.py runs the real demo."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from reproduction.errors import StageKeyChangedError
from reproduction.recipes.recap import demo
from reproduction.run import runner

REPO = Path(__file__).resolve().parent.parent


def _restored(tmp_path: Path) -> Path:
    restored = tmp_path / "restored"
    (restored / "config").mkdir(parents=True)
    shutil.copy(REPO / "bundle" / "demo" / "quick.yaml", restored / "config" / "run.yaml")
    return restored


def _fake_runner(monkeypatch, fail_on: dict[str, int]) -> list[list[str]]:
    """run_recipe raising StageKeyChangedError for each stage in `fail_on` (that many times) unless restarted."""
    calls: list[list[str]] = []

    def run_recipe(recipe, config, run_dir, opts):
        calls.append(list(opts.restart))
        for stage, times in fail_on.items():
            if stage not in opts.restart and calls.count(list(opts.restart)) <= times:
                raise StageKeyChangedError(
                    f"stage {stage}: its inputs changed since it ran: x", stage=stage, changes=[]
                )
        return "ran"

    monkeypatch.setattr(runner, "run_recipe", run_recipe)
    monkeypatch.setattr(runner, "read_state", lambda run_dir: {"format_version": 1})
    return calls


def test_a_changed_stage_is_redone_with_what_follows(tmp_path, monkeypatch, capsys):
    calls = _fake_runner(monkeypatch, {"value": 1, "policy": 1})
    (tmp_path / "run").mkdir()
    assert demo._run(_restored(tmp_path), tmp_path / "run", [], ui=None) == "ran"
    assert calls == [[], ["value"], ["value", "policy"]]
    err = capsys.readouterr().err
    assert "demo: stage value: its inputs changed since it ran: x; redoing value and what follows" in err


def test_a_stage_that_still_differs_after_its_redo_is_an_error(tmp_path, monkeypatch):
    def run_recipe(recipe, config, run_dir, opts):
        raise StageKeyChangedError("stage eval: its outputs changed after it completed: y", stage="eval", changes=[])

    monkeypatch.setattr(runner, "run_recipe", run_recipe)
    monkeypatch.setattr(runner, "read_state", lambda run_dir: {"format_version": 1})
    (tmp_path / "run").mkdir()
    with pytest.raises(StageKeyChangedError) as info:
        demo._run(_restored(tmp_path), tmp_path / "run", [], ui=None)
    assert info.value.exit_code == 52


def test_first_run_lines_state_imports_env_ray_and_worker_starts():
    costs = {"torch": 1.46, "transformers": None, "mujoco+gymnasium": 0.64, "one FetchPickAndPlace-v4 env": 0.28}
    lines = demo.first_run_lines(costs, workers={"generate": 2, "eval": 2}, ray_starts=[3.25])
    assert lines == [
        "first-run costs inside the steps (this process, measured): torch 1.5 s, transformers (already loaded), "
        "mujoco+gymnasium 0.6 s, one FetchPickAndPlace-v4 env 0.3 s; total 2.4 s; Ray start 3.2 s (1x)",
        "  plus 4 simulator worker processes (generate 2, eval 2), each paying its own start, imports and env again",
    ]
    assert demo.first_run_lines({"torch": 0.5}, workers={}, ray_starts=[]) == [
        "first-run costs inside the steps (this process, measured): torch 0.5 s; total 0.5 s; Ray not started"
    ]


def test_first_run_costs_measures_each_import_once_and_one_env():
    costs = demo._first_run_costs("FetchPickAndPlace-v4")
    assert list(costs) == [label for label, _ in demo.FIRST_RUN_IMPORTS] + ["one FetchPickAndPlace-v4 env"]
    assert all(v is None or v >= 0 for v in costs.values())
    assert demo._first_run_costs("FetchPickAndPlace-v4")["torch"] is None  # loaded now: not paid twice


@pytest.mark.parametrize(
    "argv, key",
    [
        (["demo", "--quick"], "value.trian"),
        (["demo", "--recipe", "grpo", "--quick"], "sft.trian"),
        (["demo"], "value.trian"),
    ],
    ids=["recap-quick", "grpo-quick", "recap-full"],
)
def test_a_typo_in_a_demo_override_is_refused_before_any_work(argv, key, tmp_path, capsys):
    """audit46 newcomer F19: `portable demo --quick value.trian.lr=1` was refused (exit 4) only after generate, pack,
    restore and check. Now before the demo folder is made."""
    from reproduction.portable import main

    out = tmp_path / "demo"
    assert main([*argv, "--output", str(out), f"{key}.lr=1"]) == 4
    good = key.replace("trian", "train")
    assert capsys.readouterr().err.splitlines() == [
        f"error: command line: unknown config key `{key}`",
        f"hint: did you mean `{good}`?",
    ]
    assert not out.exists()
