"""The preflight refuses a reference evidence that shares no task (or no policy label) with what the run evaluates,
before any stage trains (exit 4): `portable compare` refused such evidence since stop 51, but only at the compare
stage, after all the training. RECAP through `portable run` on tests/fixtures/run_v1_recap's tiny dataset (nothing
trains: the refusal comes first), RECAP's and GRPO's preflight functions, and one shared answer (comparison.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from reproduction.errors import InvalidInputError
from reproduction.recipes.grpo.config import GrpoRunConfig
from reproduction.recipes.recap.config import load_config as load_recap
from reproduction.run.config import load_config

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "tests" / "fixtures" / "run_v1_recap"
REFERENCE = REPO / "evidence" / "demo" / "eval_policy_1000.json"  # recap w=2, recap w=1, bc, filtered_bc on Pick
STAGES = ["returns", "value", "advantages", "policy", "eval", "compare"]


def _portable(home: Path, *args: str) -> subprocess.CompletedProcess:
    """`portable ARGS` in the fixture folder (its relative dataset path), with caches under `home`, not there."""
    return subprocess.run(
        [sys.executable, "-m", "reproduction.portable", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=FIXTURE,
        env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "HOME": str(home)},
    )


def test_portable_run_refuses_a_reference_of_other_tasks_before_anything_runs(tmp_path):
    out = tmp_path / "run"
    proc = _portable(
        tmp_path,
        "run",
        "--config",
        "run.yaml",
        "--output",
        str(out),
        "datasets=[{path: data/rollouts, type: rollout, policy: false}]",
        "eval.tasks=[FetchPush-v4]",
        f"eval.reference={REFERENCE}",
        "value.train.global_batch=8",  # the fixture's 15 frames fill no default batch of 32 (audit65_E M1)
        "value.train.micro_batch=8",
    )
    assert proc.returncode == 4, proc.stderr
    assert proc.stderr.splitlines() == [
        f"error: eval.reference: {REFERENCE} shares no task with eval.tasks: reference ['FetchPickAndPlace-v4'], "
        "eval.tasks ['FetchPush-v4'], so its compare stage could compare nothing",
        "hint: set eval.tasks=[FetchPickAndPlace-v4] to evaluate the reference's tasks, or set eval.reference to "
        "evidence evaluated on FetchPush-v4",
    ]
    assert not out.exists()  # nothing was started or written


def _recap_problems(tmp_path, *overrides: str, stages=STAGES) -> list:
    from reproduction.recipes.recap.recipe import preflight

    config = load_recap(None, [f"eval.reference={REFERENCE}", *overrides])
    return [p for p in preflight(config, tmp_path / "run", {}, stages) if "eval.reference" in str(p)]


def test_recap_preflight_refuses_a_reference_that_shares_no_policy_label(tmp_path):
    (problem,) = _recap_problems(tmp_path, "policy.modes=[recap]", "eval.guidance_scales=[3]")
    assert isinstance(problem, InvalidInputError) and problem.exit_code == 4
    assert problem.message == (
        f"eval.reference: {REFERENCE} shares no policy label with the policies this run evaluates: reference "
        "['bc', 'filtered_bc', 'recap w=1', 'recap w=2'], this run ['recap w=3'], so its compare stage could "
        "compare nothing"
    )


def test_recap_preflight_passes_a_reference_that_overlaps_and_skips_what_does_not_compare(tmp_path):
    assert _recap_problems(tmp_path) == []  # the defaults evaluate the reference's task and labels
    assert _recap_problems(tmp_path, "policy.modes=[bc]", "eval.guidance_scales=[3]") == []  # one label shared
    # no compare stage selected (and no sequential eval): the reference is not read
    assert _recap_problems(tmp_path, "eval.tasks=[FetchPush-v4]", stages=["returns", "value"]) == []


def test_recap_preflight_reports_a_reference_that_is_not_evidence(tmp_path):
    bad = tmp_path / "ref.json"
    bad.write_text('{"format": "something else"}\n')
    (problem,) = _recap_problems(tmp_path, f"eval.reference={bad}")
    assert problem.exit_code == 4 and problem.message.startswith(f"eval.reference: {bad} is not ")


def test_grpo_preflight_refuses_a_reference_of_other_tasks(tmp_path):
    from reproduction.recipes.grpo.preflight import preflight

    over = [f"eval.reference={REFERENCE}"]  # GRPO's tasks are FetchPush-v4
    cfg = load_config([REPO / "bundle/grpo/config.yaml"], over, bundle=tmp_path, run_dir=tmp_path, schema=GrpoRunConfig)
    problems = [p for p in preflight(cfg, tmp_path / "run", {}, ["sft", "rl", "eval", "compare"]) if "shares" in str(p)]
    assert [p.message for p in problems] == [
        f"eval.reference: {REFERENCE} shares no task with eval.tasks: reference ['FetchPickAndPlace-v4'], "
        "eval.tasks ['FetchPush-v4'], so its compare stage could compare nothing"
    ]
    assert [p.exit_code for p in problems] == [4]


@pytest.mark.parametrize("tasks", [["libero_spatial/*"], ["libero_10/some_task_name"]])
def test_tasks_libero_resolves_at_eval_time_are_not_judged_by_name(tasks):
    from reproduction.run.comparison import reference_overlap_problem

    assert reference_overlap_problem(REFERENCE, tasks) is None
    assert reference_overlap_problem(REFERENCE, ["libero_10/0"]) is not None  # suite/index is the evidence's key


def _reference_of(tmp_path: Path, task: str) -> Path:
    """The demo reference with its one task renamed `task` (the key the evaluation writes for it)."""
    ref = tmp_path / f"ref_{task.replace('/', '_').replace(':', '_')}.json"
    ref.write_text(REFERENCE.read_text().replace('"FetchPickAndPlace-v4"', f'"{task}"'))
    return ref


@pytest.mark.parametrize(
    "tasks", [["pick_place"], ["pick up the cube and place it at the target"], ["FetchPush-v4", "pick_place"]]
)
def test_recap_preflight_matches_tasks_named_as_the_evaluation_keys_them(tmp_path, tasks):
    """audit52 review R1: a short name or description is evaluated (and keyed in the evidence) as its env id."""
    assert _recap_problems(tmp_path, f"eval.tasks=[{','.join(tasks)}]") == []
    (problem,) = _recap_problems(tmp_path, "eval.tasks=[push]")  # truly disjoint, by its short name: refused
    assert problem.exit_code == 4 and problem.message == (
        f"eval.reference: {REFERENCE} shares no task with eval.tasks: reference ['FetchPickAndPlace-v4'], "
        "eval.tasks ['push'], so its compare stage could compare nothing"
    )


@pytest.mark.parametrize("tasks", ["[push]", "[push the cube to the target]", "[push:heavy]"])
def test_grpo_preflight_matches_tasks_named_as_the_evaluation_keys_them(tmp_path, tasks):
    from reproduction.recipes.grpo.preflight import preflight

    ref = _reference_of(tmp_path, "FetchPush-v4")
    over = [f"eval.reference={ref}", f"eval.tasks={tasks}"]
    cfg = load_config([REPO / "bundle/grpo/config.yaml"], over, bundle=tmp_path, run_dir=tmp_path, schema=GrpoRunConfig)
    problems = [str(p) for p in preflight(cfg, tmp_path / "run", {}, ["sft", "rl", "eval", "compare"])]
    shares = [p for p in problems if "shares no task" in p]
    # push:heavy is evaluated (and keyed) as FetchPush-v4:heavy: another task than the reference's
    assert len(shares) == (tasks == "[push:heavy]"), problems


def test_overlap_canonicalises_variants_and_libero_indices(tmp_path):
    from reproduction.run.comparison import reference_overlap_problem

    heavy = _reference_of(tmp_path, "FetchPush-v4:heavy")
    assert reference_overlap_problem(heavy, ["push:heavy"]) is None
    assert reference_overlap_problem(heavy, ["push the cube to the target:heavy"]) is None
    assert "shares no task" in str(reference_overlap_problem(heavy, ["push"]))  # another variant: refused
    libero = _reference_of(tmp_path, "libero_10/0")
    assert reference_overlap_problem(libero, ["libero_10/00"]) is None
    assert reference_overlap_problem(libero, ["libero_10/ 0"]) is None
    assert "shares no task" in str(reference_overlap_problem(libero, ["libero_10/1"]))


@pytest.mark.parametrize("tasks", [["no_such_task"], ["push:no_such_variant"], ["libero_10/99"], ["libero10/0"]])
def test_overlap_leaves_a_task_that_does_not_parse_to_the_config_check(tasks):
    from reproduction.run.comparison import reference_overlap_problem

    assert reference_overlap_problem(REFERENCE, tasks) is None
