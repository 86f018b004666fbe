"""audit63 K: a killed worker process is the one-line WorkerFailedError (exit 51) whose hint continues the run with
--resume and names the key of one worker (M1: a rollout worker found dead by a send; L1: eval, value inference)."""

from __future__ import annotations

import os
import signal
from types import SimpleNamespace

import pytest

from reproduction.errors import WorkerFailedError

TASK = "FetchPush-v4"


def _killed_group():
    """An EnvWorkers group of 2 whose worker 0 was SIGKILLed (and reaped): the next command's send finds it dead."""
    from reproduction.recipes.grpo.envs import EnvWorkers

    workers = EnvWorkers(TASK, 2, 2)
    workers.reset([1, 2])  # both up and answering
    victim = workers.procs[0]
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(timeout=30)
    assert victim.exitcode == -signal.SIGKILL
    return workers


def _assert_rollout_death(err: WorkerFailedError) -> None:
    assert err.exit_code == 51
    assert str(err) == "simulator worker 0 of the rollout died during 'reset'"
    assert "\n" not in str(err) and "\n" not in err.hint
    assert "--resume" in err.hint and "rl.rollout_workers=1 --resume" in err.hint
    for text in (str(err), err.hint):
        assert "Broken pipe" not in text and "cannot access a file" not in text


def test_rollout_worker_killed_before_a_send_is_exit_51():
    workers = _killed_group()
    try:
        with pytest.raises(WorkerFailedError) as caught:
            workers.reset([3, 4])
    finally:
        workers.close()
    _assert_rollout_death(caught.value)


def test_rollout_worker_killed_in_a_ray_rank_is_the_same_line(monkeypatch):
    """_ray_worker hands the typed error back as itself: the driver raises the same one line, not a bug's traceback."""
    from reproduction.train import launcher

    def body(payload, *, rank, world_size, local_rank):
        workers = _killed_group()
        try:
            return workers.reset([3, 4])
        finally:
            workers.close()

    monkeypatch.setattr(launcher, "_worker_body", body)
    payload = SimpleNamespace(spec=SimpleNamespace(kind="cpu"), config=SimpleNamespace(world_size=2), writers_lock=None)
    outcome = launcher._ray_worker(payload, 1)
    assert outcome.error_type is WorkerFailedError
    with pytest.raises(WorkerFailedError) as caught:
        outcome.unwrap()
    _assert_rollout_death(caught.value)
