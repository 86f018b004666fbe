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


def test_killed_eval_pool_worker_hint_names_resume_and_the_callers_key():
    """A pool worker SIGKILLed while running a unit: exit 51, and the hint is what the caller passed (the eval stage:
    --resume and eval.workers=1, not the unknown key `workers`); without one a plain rerun, with no key."""
    from reproduction.errors import killed_worker_hint
    from reproduction.sim.workers import run_units

    hint = killed_worker_hint("eval.workers")
    with pytest.raises(WorkerFailedError) as caught:
        list(run_units(signal.raise_signal, [signal.SIGKILL, signal.SIGKILL], workers=2, killed_hint=hint))
    err = caught.value
    assert err.exit_code == 51 and str(err).startswith("simulator worker")
    assert err.hint == hint
    assert "rerun the same `portable run` with --resume" in hint and "add eval.workers=1 --resume" in hint
    assert "rerun with workers=1" not in hint
    plain = killed_worker_hint(resume=False)
    assert plain.endswith("rerun the same command") and "workers" not in plain
    assert killed_worker_hint("eval.workers", resume=False).endswith(
        "add eval.workers=1 (one process, where a failure shows)"
    )


def test_killed_value_inference_worker_hint_names_resume_and_value_infer_workers(monkeypatch):
    """value inference's killed Ray worker (run_tasks' label form): the hint continues the run with --resume (a plain
    rerun is refused: the folder holds a run) and names value.infer.workers=1, passed in by the advantages stage."""
    from reproduction.recap.value import infer, stage
    from reproduction.train.launcher import WorkerFailure

    died = WorkerFailure(rank=1, died=True, summary="WorkerCrashedError: gone", traceback="gone")
    seen = {}

    def fake_ray(*args, killed_hint=None, **kw):
        seen["hint"] = killed_hint
        raise died.error(infer.LABEL, killed_hint)

    monkeypatch.setattr(infer, "infer_dataset_ray", fake_ray)
    fake_stage = SimpleNamespace(plan=None)
    fake_data = SimpleNamespace(fingerprint="f", name="d")
    with pytest.raises(WorkerFailedError) as caught:
        stage.infer_values(fake_stage, fake_data, "out.parquet", workers=2)
    err = caught.value
    assert err.exit_code == 51 and str(err) == "value inference shard 1 died: WorkerCrashedError: gone"
    assert err.hint == seen["hint"]
    assert "rerun the same `portable run` with --resume" in err.hint
    assert "add value.infer.workers=1 --resume" in err.hint
    assert not err.hint.endswith("; rerun")
    # without a caller's hint: a plain rerun, naming no key
    assert died.error(infer.LABEL).hint.endswith("rerun the same command")


class _Stop(Exception):
    pass


def test_eval_stages_pass_eval_workers_and_resume_only_for_a_run(monkeypatch, tmp_path):
    """GRPO's and RECAP's evaluation hand their own key (eval.workers) to the pool, with --resume for the run's eval
    stage and a plain rerun for `portable eval` (resume=False)."""
    import reproduction.sim.evaluate as sim_eval
    from reproduction.recipes.grpo import stages as grpo
    from reproduction.recipes.recap import policy as recap

    seen = []

    def fake(*args, killed_hint=None, **kw):
        seen.append(killed_hint)
        raise _Stop

    monkeypatch.setattr(grpo, "_run_fetch", lambda config, exports, out, ui, killed: fake(killed_hint=killed))
    monkeypatch.setattr(sim_eval, "evaluate_many", fake)
    grpo_cfg = SimpleNamespace(eval=SimpleNamespace(tasks=["FetchPush-v4"]))
    recap_cfg = SimpleNamespace(
        eval=SimpleNamespace(tasks=["FetchPush-v4"], sequential=SimpleNamespace(enabled=False)),
        policy=SimpleNamespace(modes=[]),
    )
    for resume in (True, False):
        for evaluate_exports, cfg in ((grpo.evaluate_exports, grpo_cfg), (recap.evaluate_exports, recap_cfg)):
            with pytest.raises(_Stop):
                evaluate_exports(cfg, {}, tmp_path / "eval", tmp_path, resume=resume)
    run_grpo, run_recap, cmd_grpo, cmd_recap = seen
    assert run_grpo == run_recap and "--resume" in run_grpo and "add eval.workers=1 --resume" in run_grpo
    assert cmd_grpo == cmd_recap and "--resume" not in cmd_grpo and "add eval.workers=1 " in cmd_grpo


def test_a_peer_lost_error_gives_way_to_the_ranks_own_portable_error(monkeypatch):
    """Rank 0's collective failed because rank 1 returned its WorkerFailedError (a killed simulator worker) and
    exited; even when the driver sees rank 0 first, the report is rank 1's one line, not rank 0's gloo traceback."""
    import ray

    from reproduction.train import launcher

    peer = launcher._WorkerFailed(
        launcher.WorkerFailure(
            rank=0, died=False, summary="RuntimeError: gloo", traceback="RuntimeError: Connection closed by peer"
        )
    )
    own = WorkerFailedError("simulator worker 0 of the rollout died during 'step'", rank=0, hint="h")

    def outcome(ref, rank):
        raise own

    monkeypatch.setattr(ray, "wait", lambda refs, num_returns, timeout: (list(refs), []))
    monkeypatch.setattr(launcher, "_outcome", outcome)
    with pytest.raises(WorkerFailedError) as caught:
        launcher._root_cause(peer, ["ref1"], {"ref1": 1})
    assert caught.value is own
