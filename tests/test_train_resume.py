"""Exact resume and worker failures through the Ray launcher: kill -9 a 2-worker CPU run, resume it.

One Ray cluster serves the module (started and stopped by a fixture); the uninterrupted reference
run starts and stops its own local Ray in a child process, as a user's run would.
"""

from __future__ import annotations

import functools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import train_tiny

from reproduction.errors import CheckpointError, WorkerFailedError
from reproduction.train import checkpoint
from reproduction.train.api import train
from reproduction.train.metrics import read_records

pytestmark = pytest.mark.slow
TINY = Path(train_tiny.__file__)
DROPOUT, SLEEP = 0.1, 0.03


def _child(out: Path, *, ray_address: str | None, env: dict | None = None, args: tuple = ()) -> subprocess.Popen:
    cmd = [sys.executable, str(TINY), str(out), "--dropout", str(DROPOUT), "--step-sleep", str(SLEEP), *args]
    if ray_address:
        cmd += ["--ray-address", ray_address]
    out.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        cmd,
        stdout=open(out / "child.out", "w"),
        stderr=open(out / "child.err", "w"),
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )


def _wait_until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)


def _kill_run(proc: subprocess.Popen, out: Path) -> None:
    """kill -9 the driver's whole session and every worker it started, then wait until all are gone."""
    pids = [int(p.read_text()) for p in (out / "pids").glob("rank*.pid")]
    os.killpg(proc.pid, signal.SIGKILL)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)
    _wait_gone(pids)


def _wait_gone(pids: list[int]) -> None:
    def gone() -> bool:
        return all(
            not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
            for pid in pids
        )

    _wait_until(gone, 30, f"workers {pids} to exit")


def _train_steps(out: Path) -> int:
    return max([r["step"] for r in read_records(out / "metrics.jsonl") if r["split"] == "train"], default=0)


def _log(out: Path, split: str) -> dict[int, dict]:
    return {r["step"]: r["metrics"] for r in read_records(out / "metrics.jsonl") if r["split"] == split}


@pytest.fixture(scope="module")
def reference(tmp_path_factory, ray_address) -> Path:
    """The uninterrupted 2-worker run; its child starts and stops a local Ray of its own.

    The driver's shell asks for 3 OpenMP threads: the launcher must still give every worker 1."""
    out = tmp_path_factory.mktemp("reference")
    proc = _child(out, ray_address=None, env={"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "3"})
    assert proc.wait(timeout=240) == 0, (out / "child.err").read_text()[-3000:]
    assert '"step": 24' in (out / "child.out").read_text()
    assert '"local_rays": 1' in (out / "child.out").read_text()
    for rank in (0, 1):
        env = json.loads((out / "pids" / f"rank{rank}.env.json").read_text())
        assert env == {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}, rank
    return out


def _resume_and_compare(out: Path, reference: Path) -> None:
    result = train(
        functools.partial(train_tiny.make_task, dropout=DROPOUT), train_tiny.config(), out_dir=out, resume=True
    )
    assert result.step == 24
    assert not list((out / "checkpoints").glob("*.partial"))
    ref_loss, got_loss = _log(reference, "train"), _log(out, "train")
    assert list(got_loss) == list(range(1, 25))
    assert {s: m["loss"] for s, m in got_loss.items()} == {s: m["loss"] for s, m in ref_loss.items()}
    assert _log(out, "eval") == _log(reference, "eval")
    a, b = checkpoint.load_export(reference / "export"), checkpoint.load_export(out / "export")
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
    # TensorBoard, as it reads the killed run's and the resumed run's event files together: every
    # step once (the steps after the checkpoint purged), none lost to an unflushed writer.
    for tag in ("train/loss", "eval/mse"):
        got, ref = train_tiny.tb_scalars(out, tag), train_tiny.tb_scalars(reference, tag)
        assert [s for s, _ in ref] == (list(range(1, 25)) if tag == "train/loss" else list(range(2, 25, 2)))
        assert got == ref, tag


@pytest.mark.timeout(240)
@pytest.mark.parametrize("trial", [0, 1])
def test_kill_at_a_random_step_then_resume_is_bit_identical(tmp_path, ray_address, reference, trial):
    kill_after = random.Random(100 + trial).randint(3, 21)
    proc = _child(tmp_path, ray_address=ray_address)
    _wait_until(lambda: _train_steps(tmp_path) >= kill_after or proc.poll() is not None, 120, f"step {kill_after}")
    assert proc.poll() is None, "the run finished before it could be killed"
    _kill_run(proc, tmp_path)
    killed_at = _train_steps(tmp_path)
    assert 3 <= killed_at < 24
    _resume_and_compare(tmp_path, reference)
    assert _log(tmp_path, "resume")  # it did continue from a checkpoint (or from scratch if killed before step 4)


@pytest.mark.timeout(240)
def test_kill_during_a_save_then_resume_is_bit_identical(tmp_path, ray_address, reference):
    proc = _child(tmp_path, ray_address=ray_address, args=("--sleep-in-save", "3"))
    partial = tmp_path / "checkpoints" / "step_12.partial" / "manifest.json"
    _wait_until(lambda: partial.exists() or proc.poll() is not None, 180, "the save of step 12")
    _kill_run(proc, tmp_path)
    assert partial.exists() and checkpoint.complete_steps(tmp_path / "checkpoints") == [4, 8]
    _resume_and_compare(tmp_path, reference)
    assert sorted(_log(tmp_path, "resume")) == [8]


@pytest.mark.timeout(240)
def test_kill_during_the_shard_write_then_resume_is_bit_identical(tmp_path, ray_address, reference):
    """Rank 1 is SIGKILLed inside DCP's write of step 12, right after its shard hit the disk."""
    proc = _child(tmp_path, ray_address=ray_address, args=("--die-in-save", "12"))
    assert proc.wait(timeout=180) == 1
    err = (tmp_path / "child.err").read_text()
    assert "WorkerFailedError" in err and ("worker rank 1 died" in err or "worker rank 0 raised" in err), err[-2000:]
    _wait_gone([int(p.read_text()) for p in (tmp_path / "pids").glob("rank*.pid")])
    partial = tmp_path / "checkpoints" / "step_12.partial"
    names = sorted(p.name for p in partial.iterdir())
    assert "__1_0.distcp" in names and (partial / "__1_0.distcp").stat().st_size > 0
    assert "manifest.json" not in names and ".metadata" not in names
    assert checkpoint.complete_steps(tmp_path / "checkpoints") == [4, 8]
    assert _train_steps(tmp_path) == 12  # the killed run had logged step 12 before saving it
    _resume_and_compare(tmp_path, reference)
    assert sorted(_log(tmp_path, "resume")) == [8]


@pytest.mark.timeout(240)
def test_resume_on_another_world_size_reshards(tmp_path, ray_address):
    task = train_tiny.make_task  # no dropout: per-rank RNG streams cannot carry across world sizes
    two = tmp_path / "two"
    train(task, train_tiny.config(max_steps=16), out_dir=two, resume=False)
    one = tmp_path / "one"
    shutil.copytree(two, one)
    for step in (12, 16):
        shutil.rmtree(one / "checkpoints" / f"step_{step}")
    result = train(task, train_tiny.config(max_steps=16, world_size=1, launcher="inprocess"), out_dir=one, resume=True)
    assert result.resumed_from == 8
    got, ref = _log(one, "train"), _log(two, "train")
    assert list(got) == list(range(1, 17))
    assert _log(two, "eval")[16]["count"] == train_tiny.N_EVAL  # all_gather over 2 ranks: no padding
    # Stated tolerance: the same global batches; only the gradient summation order differs
    # (2 ranks x 2 micro batches vs 1 rank x 4), so losses agree to 1e-5 relative, weights to 1e-5.
    for step in range(9, 17):
        assert got[step]["loss"] == pytest.approx(ref[step]["loss"], rel=1e-5, abs=1e-7), step
    a, b = checkpoint.load_export(two / "export"), checkpoint.load_export(one / "export")
    assert all(torch.allclose(a[k], b[k], rtol=0, atol=1e-5) for k in a)
    manifest = checkpoint.read_manifest(one / "checkpoints" / "step_16")
    assert manifest["world_size"] == 1 and len(manifest["rng"]) == 1
    # and back: the world-size-1 checkpoint (an unsharded model) loads into 2 FSDP2 workers
    back = train(task, train_tiny.config(max_steps=20), out_dir=one, resume=True)
    assert back.resumed_from == 16 and checkpoint.read_manifest(one / "checkpoints" / "step_20")["world_size"] == 2
    assert np.isfinite(_log(one, "train")[20]["loss"])
    # through Ray, a worker's CheckpointError arrives as itself (exit 50), not as a worker failure
    with pytest.raises(CheckpointError, match="canary loss after loading .*step_20") as info:
        train(functools.partial(task, scale=1.5), train_tiny.config(max_steps=24), out_dir=one, resume=True)
    assert info.value.exit_code == 50


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault", ["raise", "die"])
def test_a_failing_worker_fails_the_run_promptly(tmp_path, ray_address, fault):
    kw = {"raise_at_step": 5} if fault == "raise" else {"die_at_step": 5}
    with pytest.raises(WorkerFailedError) as info:
        train(
            functools.partial(train_tiny.make_task, **kw),
            train_tiny.config(collective_timeout_s=300),
            out_dir=tmp_path,
            resume=False,
        )
    assert info.value.exit_code == 51 and info.value.rank == 1
    if fault == "raise":
        assert "injected failure on rank 1 at call 5" in str(info.value)
        assert 'train_tiny.py", line' in str(info.value) and "\x1b[" not in str(info.value)  # the worker's frames
    else:
        assert "worker rank 1 died" in str(info.value)
    assert not checkpoint.complete_steps(tmp_path / "checkpoints")


@pytest.mark.timeout(60)
def test_workers_ray_cannot_place_fail_within_start_timeout(tmp_path, ray_address):
    """start_timeout_s bounds the wait for Ray's placement (the module's cluster has 2 CPUs, 3 asked)."""
    # collective_timeout_s is far above this test's 60 s limit: only start_timeout_s can end the wait
    cfg = train_tiny.config(world_size=3, global_batch=12, start_timeout_s=2, collective_timeout_s=600)
    with pytest.raises(WorkerFailedError, match=r"Ray could not place 3 workers of \{'CPU': 1.0\} within 2 s") as info:
        train(train_tiny.make_task, cfg, out_dir=tmp_path, resume=False)
    assert info.value.exit_code == 51 and "raise start_timeout_s" in info.value.hint
    assert not (tmp_path / "checkpoints").exists()
