"""LIBERO task ids and bad input, without LIBERO installed: parse/validate errors, the not-installed error."""

from __future__ import annotations

import numpy as np
import pytest

from reproduction.errors import MissingDependencyError, SimError
from reproduction.sim.libero import _runtime, tasks
from reproduction.sim.libero.env import check_action, quat2axisangle
from reproduction.sim.libero.protocol import _chunk_of


def test_task_ids_parse_index_name_and_star():
    assert tasks.parse_task_id("libero_10/0") == tasks.TaskRef("libero_10", index=0)
    assert tasks.parse_task_id("libero_spatial/*") == tasks.TaskRef("libero_spatial", every=True)
    assert tasks.parse_task_id("libero_goal/open_the_drawer") == tasks.TaskRef("libero_goal", name="open_the_drawer")
    assert str(tasks.parse_task_id("libero_90/89")) == "libero_90/89"
    assert tasks.is_libero_id("libero_10/0") and not tasks.is_libero_id("FetchPickAndPlace-v4")
    assert [s.max_steps for s in tasks.SUITES.values()] == [240, 280, 320, 520, 512]


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("libero_11/0", "unknown LIBERO suite 'libero_11'"),
        ("libero_10/10", "task index 10 out of range in 'libero_10/10': libero_10 has tasks 0..9"),
        ("libero_10/-1", "task index -1 out of range"),
        ("libero_10", "is not <suite>/<task>"),
        ("libero_10/", "has an empty task"),
    ],
)
def test_bad_task_ids_are_one_line_sim_errors(spec, needle):
    with pytest.raises(SimError) as info:
        tasks.parse_task_ids([spec])
    assert needle in str(info.value) and "\n" not in str(info.value)
    assert info.value.exit_code == 45 and info.value.hint


def test_not_installed_names_the_extra(monkeypatch):
    monkeypatch.setattr(_runtime, "available", lambda: False)
    monkeypatch.setattr(_runtime, "_imported", {})
    with pytest.raises(MissingDependencyError) as info:
        tasks.resolve_tasks(["libero_10/0"])
    assert info.value.exit_code == 10
    assert "pip install -e '.[libero]'" in info.value.hint


def test_bad_ids_fail_before_libero_is_needed(monkeypatch):
    monkeypatch.setattr(_runtime, "available", lambda: False)
    with pytest.raises(SimError, match="unknown LIBERO suite"):
        tasks.resolve_tasks(["libero_10/0", "nope/1"])


def test_action_checks():
    assert check_action([0, 0, 0, 0, 0, 0, 1]).shape == (7,)
    with pytest.raises(SimError, match=r"shape \(4,\), expected \(7,\)") as info:
        check_action([0, 0, 0, 1])  # a Fetch action
    assert "Fetch" in info.value.hint
    with pytest.raises(SimError, match="not finite"):
        check_action([0, 0, np.nan, 0, 0, 0, 1])
    assert _chunk_of(np.zeros((1, 5, 7))).shape == (5, 7)
    assert _chunk_of(np.zeros(7)).shape == (1, 7)
    with pytest.raises(SimError, match="batch of 2 chunks"):
        _chunk_of(np.zeros((2, 5, 7)))
    with pytest.raises(SimError, match=r"expected \(1, H, 7\)"):
        _chunk_of(np.zeros((1, 5, 4)))


def test_quat2axisangle_matches_robosuite_formula_and_does_not_mutate():
    angle = 0.7
    q = np.array([0.0, 0.0, np.sin(angle / 2), np.cos(angle / 2)])
    before = q.copy()
    np.testing.assert_allclose(quat2axisangle(q), [0, 0, angle], atol=1e-12)
    assert np.array_equal(q, before)
    assert np.array_equal(quat2axisangle(np.array([0.0, 0, 0, 1])), np.zeros(3))


def test_importing_the_package_imports_no_libero():
    import subprocess
    import sys

    code = (
        "import sys, reproduction.sim.libero.protocol, reproduction.sim.libero.expert;"
        "bad=[m for m in ('libero','robosuite','numba','reproduction.recap','reproduction.train','reproduction.run')"
        " if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_evidence_counts_refuse_episodes_stopped_at_their_first_success():
    """audit46 eval F5: with stop_on_success an episode's success_at_end is None, and evidence counted it False."""
    from reproduction.errors import SimError
    from reproduction.sim.libero.protocol import EpisodeOutcome, LiberoEvalResult

    def outcome(i, once, end):
        return EpisodeOutcome(
            task_id="libero_spatial/0",
            init_index=i,
            success_once=once,
            success_at_end=end,
            steps=10,
            first_success_step=4 if once else None,
        )

    run_to_limit = LiberoEvalResult(
        episodes=[outcome(0, True, True), outcome(1, True, False), outcome(2, False, False)],
        chunk=5,
        settle_steps=10,
        cameras=False,
    )
    assert run_to_limit.evidence_counts() == {
        "tasks": {"libero_spatial/0": {"episodes": 3, "success_once": 2, "success_at_end": 1}},
        "per_episode": {
            "libero_spatial/0": [
                {"episode": 0, "init_state": 0, "success_once": True, "success_at_end": True},
                {"episode": 1, "init_state": 1, "success_once": True, "success_at_end": False},
                {"episode": 2, "init_state": 2, "success_once": False, "success_at_end": False},
            ]
        },
    }
    stopped = LiberoEvalResult(
        episodes=[outcome(0, True, None), outcome(1, False, False), outcome(2, True, None)],
        chunk=5,
        settle_steps=10,
        cameras=False,
    )
    with pytest.raises(SimError) as err:
        stopped.evidence_counts()
    assert str(err.value) == (
        "success_at_end was not measured for 2 of 3 episodes (first: libero_spatial/0 init state 0): "
        "they stopped at their first success (stop_on_success)"
    )
    assert err.value.field == "success_at_end" and "stop_on_success=False" in err.value.hint
