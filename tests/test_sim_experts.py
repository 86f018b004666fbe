"""Scripted experts, behaviour modes and the trajectory metrics that detect harm in a policy's episodes."""

from __future__ import annotations

import numpy as np
import pytest

from reproduction.sim.behaviours import BehaviourConfig, Event, Mode, draw_plan
from reproduction.sim.env import FetchSim
from reproduction.sim.episode import run_scripted
from reproduction.sim.generate import mode_counts
from reproduction.sim.metrics import _runs, episode_metrics
from reproduction.sim.seeds import episode_rng, reset_seed

TASKS = ("FetchPickAndPlace-v4", "FetchPush-v4")


def _episode(sim: FetchSim, mode: Mode, i: int, cfg: BehaviourConfig | None = None):
    task = sim.task.env_id
    return run_scripted(
        sim,
        reset_seed=reset_seed(0, "rollout", task, i),
        mode=mode,
        config=cfg or BehaviourConfig(),
        rng=episode_rng(0, "rollout", task, i),
    )


def _positions(frames: dict, sim: FetchSim) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    st = frames["observation.state"]
    grip = np.vstack([st[:, 0:3], sim.grip_pos])
    cube = np.vstack([st[:, 5:8], sim.object_pos])
    return grip, cube, np.append(st[:, 3] + st[:, 4], sim.fingers.sum())


@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS)
def test_expert_succeeds_on_every_seed_and_holds(task):
    firsts = []
    with FetchSim(task, cameras=()) as sim:
        for i in range(20):
            frames, out = _episode(sim, Mode.EXPERT, i)
            assert out.success, f"{task} expert failed on episode {i}"
            assert frames["is_success"][out.first_success - 1 :].all(), "the expert lets the cube leave the goal"
            assert not frames["sim.harm"].any()
            firsts.append(out.first_success)
    assert np.mean(firsts) < 25  # about 14 steps: leaves most of the 50 for holding at the goal


@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS)
def test_failure_modes_fail_and_messy_episodes_carry_harm(task):
    with FetchSim(task, cameras=()) as sim:
        for mode in (Mode.GIVE_UP, Mode.SHORT_CARRY, Mode.WRONG_PLACE):
            wins = sum(_episode(sim, mode, i)[1].success for i in range(6))
            assert wins <= 2, f"{mode.name} succeeded {wins}/6 on {task}"
        harm = [_episode(sim, Mode.MESSY, i) for i in range(6)]
    assert all(frames["sim.mode"][0] == Mode.MESSY for frames, _ in harm)
    assert sum(frames["sim.harm"].sum() for frames, _ in harm) > 20
    assert any(out.success and out.harm_frames > 0 for _, out in harm), "no successful episode with harm in it"


def test_plans_are_deterministic_and_bounded():
    cfg = BehaviourConfig()
    a = draw_plan(Mode.MESSY, cfg, np.random.default_rng(5))
    b = draw_plan(Mode.MESSY, cfg, np.random.default_rng(5))
    assert a.timed == b.timed and a.regrasps == b.regrasps
    for seed in range(50):
        plan = draw_plan(Mode.MESSY, cfg, np.random.default_rng(seed))
        detours = [n for ev, n in plan.timed.values() if ev == Event.DETOUR]
        assert len(detours) <= cfg.detours[1] and all(4 <= n <= 8 for n in detours)
        spans = sorted((s, s + n) for s, (_, n) in plan.timed.items())
        assert all(e1 < s2 for (_, e1), (s2, _) in zip(spans, spans[1:])), "events overlap"
    assert draw_plan(Mode.EXPERT, cfg, np.random.default_rng(0)).noise == 0.0
    assert draw_plan(Mode.GOOD, cfg, np.random.default_rng(0)).noise == cfg.good_noise


def test_mode_counts_are_exact():
    counts = mode_counts({"good": 0.2, "messy": 0.5, "give_up": 0.15, "short_carry": 0.15}, 300)
    assert counts == {Mode.GOOD: 60, Mode.MESSY: 150, Mode.GIVE_UP: 45, Mode.SHORT_CARRY: 45}
    counts = mode_counts({"good": 1, "messy": 1, "pause": 1}, 7)
    assert sum(counts.values()) == 7 and max(counts.values()) - min(counts.values()) <= 1


def test_runs_and_detour_detection_on_synthetic_tracks():
    assert _runs(np.array([1, 1, 1, 0, 1, 1, 0, 1, 1, 1, 1], bool), 3) == 2
    t = 21
    goal = np.array([1.4, 0.8, 0.5])
    cube = np.tile([1.3, 0.7, 0.425], (t, 1))
    grip = np.tile([1.3, 0.7, 0.6], (t, 1))
    grip[5:10, 2] += np.arange(1, 6) * 0.04  # 5 steps straight up at 4 cm/step: away from the cube
    grip[10:, 2] = grip[9, 2]
    m = episode_metrics(grip, cube, np.full(t, 0.1), goal, lifts=True, table_z=0.425)
    assert m["detours"] == 1 and not m["success_once"] and m["stalls"] >= 1


@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS)
def test_detour_detector_agrees_with_the_generator_labels(task):
    labelled = found = 0
    with FetchSim(task, cameras=()) as sim:
        for i in range(8):
            frames, out = _episode(sim, Mode.MESSY, i)
            grip, cube, fingers = _positions(frames, sim)
            m = episode_metrics(grip, cube, fingers, sim.goal, lifts=sim.task.lifts, table_z=sim.table_z)
            assert m["success_at_end"] == out.success
            labelled += out.events.get("detour", 0)
            found += m["detours"]
        for i in range(4):
            frames, _ = _episode(sim, Mode.EXPERT, i)
            grip, cube, fingers = _positions(frames, sim)
            assert (
                episode_metrics(grip, cube, fingers, sim.goal, lifts=sim.task.lifts, table_z=sim.table_z)["detours"]
                == 0
            )
    assert labelled > 5 and abs(found - labelled) <= 0.25 * labelled
