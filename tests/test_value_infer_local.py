"""Stage-3 inference on a Ray the call starts itself, on CPU: the driver infers while Ray comes up,
and it and the Ray workers claim batch-aligned chunks as they are free. The values equal one
worker's bit for bit, a claimed chunk is inferred by its claimer only, and a failure on either side
is one line, exit 51, with nothing written.

Each test starts and stops a private local Ray bound to 127.0.0.1 (what `portable` does without
--ray-address); none is left running. This module uses no `ray_address` fixture: with a Ray already
initialised in this process the call joins it and every shard goes to Ray (tests/test_value_task.py).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_value_task import CAMS, _count_forwards, _infer_args, _write_stage, stage_main
from value_synth import write_value_dataset

from reproduction.recap.value.data import ValueSource
from reproduction.recap.value.task import ValueConfig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def stage_dir(tmp_path_factory):
    """An untrained 2-fold value stage (value/) over `ds`, as tests/test_value_task.py builds it."""
    root = tmp_path_factory.mktemp("vlocal")
    runs = write_value_dataset(root / "ds", episodes=8, seed=2)
    train = [ValueSource(path=str(root / "ds"), type="rollout", returns=str(runs))]
    _write_stage(root / "value", ValueConfig(cameras=CAMS, folds=2, fold_seed=1), train)
    return root


def test_the_driver_infers_beside_ray_and_the_values_match_one_worker_bit_for_bit(
    stage_dir, tmp_path, monkeypatch, capsys
):
    import pyarrow.parquet as pq
    import ray

    from reproduction.train import launcher

    shipped = []
    real = launcher.run_tasks
    monkeypatch.setattr(launcher, "run_tasks", lambda fn, jobs, **kw: shipped.append(len(jobs)) or real(fn, jobs, **kw))
    forwards = _count_forwards(monkeypatch)  # this process's models only
    one, three = tmp_path / "one.parquet", tmp_path / "three.parquet"
    assert stage_main(_infer_args(stage_dir, one, 1)) == 0
    alone = json.loads(capsys.readouterr().out)
    in_driver = sum(forwards.values())
    rc = stage_main(_infer_args(stage_dir, three, 3))
    got = capsys.readouterr()
    assert rc == 0, got.err
    assert shipped == [2]  # two of the three shards went to Ray
    driver_rows = sum(forwards.values()) - in_driver
    assert 0 < driver_rows <= alone["frames"]  # the driver inferred chunks (how many: whoever claimed first)
    assert not ray.is_initialized()  # the Ray it started is stopped
    a, b = pq.read_table(one), pq.read_table(three)
    for key in ("episode_index", "frame_index"):
        assert b.column(key).to_pylist() == a.column(key).to_pylist()
    np.testing.assert_array_equal(b.column("value").to_numpy(), a.column("value").to_numpy())  # bit for bit
    assert json.loads(got.out)["frames_per_model"] == alone["frames_per_model"]


@pytest.mark.parametrize("rank, where", [(1, "the driver"), (0, "a Ray worker")])
def test_a_failing_shard_on_either_side_is_exit_51_and_writes_nothing(
    stage_dir, tmp_path, monkeypatch, capsys, rank, where
):
    import ray
    from value_synth import FaultyShardTask

    from reproduction.recap.value import infer

    monkeypatch.setattr(infer, "infer_job", FaultyShardTask("raise", rank))  # the driver is worker 1
    out = tmp_path / "values.parquet"
    rc = stage_main(_infer_args(stage_dir, out, 2))
    # the last two lines: whatever Ray itself logs comes first (in this process, through a handler bound to an
    # earlier test's captured stream, as a logging error)
    lines = capsys.readouterr().err.splitlines()[-2:]
    words = f"error: value inference shard {rank} raised RuntimeError: injected failure in value inference shard {rank}"
    assert rc == 51 and lines[0] == words and lines[1].startswith("hint: "), (where, lines)
    assert not out.exists() and list(tmp_path.iterdir()) == []
    assert not ray.is_initialized()


def test_a_cancelled_shard_stops_before_its_next_batch(stage_dir):
    """The driver's shard asks `cancelled()` before each batch: a Ray worker's failure stops it there."""
    from reproduction.data.reader import open_dataset
    from reproduction.recap.sharding import Shard
    from reproduction.recap.value.infer import InferenceCancelled, ShardJob, infer_job
    from reproduction.train.device import resolve

    asked = []
    job = ShardJob(
        stage_dir=str(stage_dir / "value"),
        dataset_root=str(stage_dir / "ds"),
        fingerprint=open_dataset(stage_dir / "ds").fingerprint,
        shard=Shard(rank=0, start=0, stop=12, infer_stop=12),
        spec=resolve("cpu"),
        batch_size=4,
    )
    with pytest.raises(InferenceCancelled):
        infer_job(job, cancelled=lambda: asked.append(1) or len(asked) > 2)  # two batches, then cancelled
    assert len(asked) == 3
    assert infer_job(job, cancelled=lambda: False).num_rows == 12


def test_a_worker_infers_only_the_chunks_it_claims(stage_dir, tmp_path):
    """Claims are files created exclusively: chunks claimed by another process are skipped, and a
    second pass over the same claims infers nothing (exactly one process infers each chunk)."""
    from reproduction.data.reader import open_dataset
    from reproduction.recap.sharding import Shard, plan_shards
    from reproduction.recap.value.infer import ShardJob, infer_job, sorted_frames
    from reproduction.train.device import resolve

    ds = open_dataset(stage_dir / "ds")
    _, ep, fr = sorted_frames(ds)
    ends = np.searchsorted(ep, ep, side="right")
    chunks = tuple(plan_shards(ends, 4, 0, align=4))
    claims = tmp_path / "claims"
    claims.mkdir()
    (claims / "1").touch()  # chunk 1: claimed by another process
    job = ShardJob(
        stage_dir=str(stage_dir / "value"),
        dataset_root=str(stage_dir / "ds"),
        fingerprint=ds.fingerprint,
        shard=Shard(rank=0, start=0, stop=0, infer_stop=0),
        spec=resolve("cpu"),
        batch_size=4,
        claims=str(claims),
        chunks=chunks,
    )
    mine = infer_job(job)
    want = np.r_[0 : chunks[1].start, chunks[1].stop : ep.size]
    assert mine.column("episode_index").to_pylist() == ep[want].tolist()
    assert mine.column("frame_index").to_pylist() == fr[want].tolist()
    assert sorted(p.name for p in claims.iterdir()) == ["0", "1", "2", "3"]
    assert infer_job(job).num_rows == 0  # everything claimed: nothing left to infer
