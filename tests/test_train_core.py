"""Training core, in one process (world size 1, gloo): config rules, data order, loop, checkpoints."""

from __future__ import annotations

import functools
import gc
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import train_tiny

from reproduction.errors import CheckpointError, ConfigError
from reproduction.train import checkpoint, data_order
from reproduction.train.api import train
from reproduction.train.config import TrainConfig
from reproduction.train.metrics import read_records


def _inproc(**kw) -> TrainConfig:
    return train_tiny.config(world_size=1, launcher="inprocess", **kw)


def _losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["metrics"]["loss"] for r in read_records(out / "metrics.jsonl") if r["split"] == "train"}


def _weights(out: Path) -> dict[str, torch.Tensor]:
    return checkpoint.load_export(out / "export")


# -- config ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw, field, words",
    [
        (dict(global_batch=6, micro_batch=2, world_size=2), "global_batch", "2 x 2 = 4"),
        (dict(save_interval=3, eval_interval=2), "save_interval", "not a multiple of eval_interval=2"),
        (dict(launcher="inprocess", world_size=2), "launcher", "world_size=2"),
        (dict(device="tpu"), "device", "'tpu'"),
        (dict(mixed_precision="fp16"), "mixed_precision", "'fp16'"),
        (dict(micro_batch=0), "micro_batch", "micro_batch=0"),
        (dict(cpu_threads=-1), "cpu_threads", "cpu_threads=-1"),
    ],
)
def test_config_rejects_and_names_the_field(kw, field, words):
    with pytest.raises(ConfigError) as info:
        TrainConfig(max_steps=1, **kw)
    assert info.value.field == field and words in str(info.value)
    assert info.value.exit_code == 4


def test_config_round_trip_and_unknown_field():
    cfg = TrainConfig(max_steps=5, global_batch=16, micro_batch=4, world_size=2, betas=(0.8, 0.9))
    assert cfg.grad_accum == 2
    assert TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    with pytest.raises(ConfigError, match="unknown training config field.*: lr_max"):
        TrainConfig.from_dict({"max_steps": 1, "lr_max": 1.0})


# -- data order -----------------------------------------------------------------------------------


def test_data_order_is_world_size_invariant_and_covers_each_epoch_once():
    n, gb = 50, 8
    per_epoch = data_order.steps_per_epoch(n, gb)
    assert per_epoch == 6
    for step in (0, 5, 6, 13):
        one = np.concatenate(
            [
                i
                for i, _ in data_order.micro_batches(
                    step, seed=1, n=n, global_batch=gb, micro_batch=2, rank=0, world_size=1
                )
            ]
        )
        ranks = [
            data_order.micro_batches(step, seed=1, n=n, global_batch=gb, micro_batch=2, rank=r, world_size=2)
            for r in range(2)
        ]
        two = np.concatenate([ranks[r][a][0] for a in range(2) for r in range(2)])
        assert np.array_equal(one, two), step  # the same global batch in the same order
    epoch0 = np.concatenate(
        [
            i
            for s in range(per_epoch)
            for i, _ in data_order.micro_batches(s, seed=1, n=n, global_batch=gb, micro_batch=4, rank=0, world_size=1)
        ]
    )
    assert len(set(epoch0.tolist())) == per_epoch * gb  # no sample twice within an epoch
    assert not np.array_equal(data_order.epoch_order(1, 0, n), data_order.epoch_order(1, 1, n))
    assert np.array_equal(data_order.epoch_order(1, 0, n, shuffle=False), np.arange(n))
    a = data_order.sample_rng(1, 2, 3).normal(size=4)
    assert np.array_equal(a, data_order.sample_rng(1, 2, 3).normal(size=4))
    assert not np.array_equal(a, data_order.sample_rng(1, 2, 4).normal(size=4))
    with pytest.raises(ConfigError, match="fewer than global_batch=8"):
        data_order.steps_per_epoch(5, 8)


def test_eval_shards_partition_the_eval_set_without_padding():
    from reproduction.train.task import EvalContext

    for world in (1, 2, 3, 7):
        parts = [
            list(
                EvalContext(rank=r, world_size=world, device=torch.device("cpu"), step=0, all_gather=lambda a: a).shard(
                    20
                )
            )
            for r in range(world)
        ]
        assert sum(parts, []) == list(range(20)), world


# -- the loop, in process --------------------------------------------------------------------------


def test_run_logs_evaluates_saves_exports(tmp_path):
    result = train(
        functools.partial(train_tiny.make_task, dropout=0.1),
        _inproc(max_steps=10, keep_last=2),
        out_dir=tmp_path,
        resume=False,
    )
    assert result.step == 10 and result.resumed_from is None and result.skipped_steps == 0
    root = tmp_path / "checkpoints"
    assert checkpoint.complete_steps(root) == [8, 10]  # save_interval 4 + the last step; keep_last 2
    assert (root / "LATEST").read_text() == "step_10\n"
    manifest = checkpoint.read_manifest(root / "step_10")
    assert manifest["world_size"] == 1 and manifest["step"] == 10
    assert manifest["data_cursor"] == {"next_step": 10, "epoch": 0, "position": 80, "samples_seen": 80}
    assert manifest["config_digest"] == _inproc().digest() and len(manifest["rng"]) == 1
    assert set(manifest["files"]) >= {".metadata", "__0_0.distcp"}
    records = read_records(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records if r["split"] == "eval"] == [2, 4, 6, 8, 10]
    assert [r["step"] for r in records if r["split"] == "checkpoint"] == [4, 8, 10]
    assert result.eval_metrics["count"] == train_tiny.N_EVAL
    tb_loss = train_tiny.tb_scalars(tmp_path, "train/loss")  # TensorBoard's own reader: every logged step once
    assert [s for s, _ in tb_loss] == list(range(1, 11))
    assert [v for _, v in tb_loss] == pytest.approx(
        [r["metrics"]["loss"] for r in records if r["split"] == "train"], rel=1e-6
    )  # stored as float32
    assert [s for s, _ in train_tiny.tb_scalars(tmp_path, "eval/mse")] == [2, 4, 6, 8, 10]
    assert [s for s, _ in train_tiny.tb_scalars(tmp_path, "checkpoint/save_s")] == [4, 8, 10]
    warm = [r["metrics"]["lr_factor"] for r in records if r["split"] == "train"][:4]
    assert warm == pytest.approx([1 / 3, 2 / 3, 1.0, 1.0])
    export = sorted(p.name for p in result.export_dir.iterdir())
    assert export == ["model.safetensors", "model_config.json", "task.json", "train_config.json"]
    weights = _weights(tmp_path)
    assert set(weights) == {
        "body.0.weight",
        "body.0.bias",
        "body.3.weight",
        "body.3.bias",
        "value_head.weight",
        "value_head.bias",
    }
    model = train_tiny.MLP(0.0, 1.0)
    checkpoint.load_strict(model, weights)
    with pytest.raises(CheckpointError, match=r"missing \['value_head.bias'\].*unexpected \['extra'\]"):
        checkpoint.load_strict(
            model, {**{k: v for k, v in weights.items() if k != "value_head.bias"}, "extra": torch.zeros(1)}
        )


def test_cpu_threads_hold_inside_the_worker_and_are_put_back_after(tmp_path):
    """`cpu_threads` sets torch's intra-op threads for the training only: every loss call sees the
    count, and the in-process caller gets its own count back (0 leaves it alone)."""
    seen: list[int] = []

    def make(rank: int, world: int):
        task = train_tiny.make_task(rank, world)
        loss = task.loss

        def counted(model, batch):
            seen.append(torch.get_num_threads())
            return loss(model, batch)

        task.loss = counted
        return task

    before = torch.get_num_threads()
    want = before + 1
    train(make, _inproc(max_steps=2, cpu_threads=want), out_dir=tmp_path / "a", resume=False)
    assert seen and set(seen) == {want}
    assert torch.get_num_threads() == before
    seen.clear()
    train(make, _inproc(max_steps=2), out_dir=tmp_path / "b", resume=False)
    assert set(seen) == {before}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])  # bf16 goes through FSDP2's MixedPrecisionPolicy
def test_resume_continues_bit_identically_in_process(tmp_path, precision):
    task = functools.partial(train_tiny.make_task, dropout=0.2)  # dropout: the torch RNG must carry over
    train(task, _inproc(max_steps=12, mixed_precision=precision), out_dir=tmp_path / "straight", resume=False)
    first = train(
        task, _inproc(max_steps=6, save_interval=2, mixed_precision=precision), out_dir=tmp_path / "cut", resume=True
    )
    assert first.resumed_from is None
    # drop step 6 so the resume starts from step 4 and must cut steps 5-6 out of the log
    shutil.rmtree(tmp_path / "cut" / "checkpoints" / "step_6")
    (tmp_path / "cut" / "checkpoints" / "step_8.partial").mkdir()  # a stale partial from "a kill"
    second = train(task, _inproc(max_steps=12, mixed_precision=precision), out_dir=tmp_path / "cut", resume=True)
    assert second.resumed_from == 4 and second.step == 12
    assert not (tmp_path / "cut" / "checkpoints" / "step_8.partial").exists()
    assert _losses(tmp_path / "cut") == _losses(tmp_path / "straight")
    assert list(_losses(tmp_path / "cut")) == list(range(1, 13))
    # TensorBoard: the first run's steps 5-6 are purged by the resume, not shown twice
    cut_tb, straight_tb = (train_tiny.tb_scalars(tmp_path / d, "train/loss") for d in ("cut", "straight"))
    assert [s for s, _ in cut_tb] == list(range(1, 13)) and cut_tb == straight_tb
    a, b = _weights(tmp_path / "straight"), _weights(tmp_path / "cut")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_non_finite_gradients_skip_the_step_and_are_counted(tmp_path):
    task = functools.partial(train_tiny.make_task, nan_at_call=9, fault_rank=0)  # 4 micro batches/step: step 3
    result = train(task, _inproc(max_steps=4, save_interval=0, eval_interval=0), out_dir=tmp_path, resume=False)
    assert result.skipped_steps == 1
    records = [r for r in read_records(tmp_path / "metrics.jsonl") if r["split"] == "train"]
    assert [r["metrics"]["skipped_steps"] for r in records] == [0, 0, 1, 1]
    assert np.isnan(records[2]["metrics"]["loss"]) and np.isfinite(records[3]["metrics"]["loss"])


def _freeze_probe(frozen: list[int], rank: int, world_size: int):
    task = train_tiny.make_task(rank, world_size)
    inner = task.loss

    def loss(model, batch):
        if model.training:
            frozen.append(gc.get_freeze_count())
        return inner(model, batch)

    task.loss = loss
    return task


def test_setup_heap_is_frozen_during_the_loop_and_released_after(tmp_path):
    """A full collection over the import-time heap stalled a Ray worker's step ~160 for 0.2 s; the
    loop keeps that heap out of the collector while it runs, and hands the caller's heap back."""
    before = gc.get_freeze_count()
    frozen: list[int] = []
    train(
        functools.partial(_freeze_probe, frozen),
        _inproc(max_steps=3, save_interval=0, eval_interval=0),
        out_dir=tmp_path,
        resume=False,
    )
    assert len(frozen) == 12  # 3 steps x 4 micro batches
    assert min(frozen) > 10_000  # torch alone leaves far more long-lived objects than this
    assert gc.get_freeze_count() == before
    assert gc.isenabled()


def test_resume_refusals_name_the_problem(tmp_path):
    task = train_tiny.make_task
    train(task, _inproc(max_steps=4, save_interval=0), out_dir=tmp_path, resume=False)
    with pytest.raises(CheckpointError, match="already holds checkpoints and resume is off"):
        train(task, _inproc(max_steps=4), out_dir=tmp_path, resume=False)
    with pytest.raises(CheckpointError, match=r"config changed \(lr: 0.001 -> 0.002\)") as info:
        train(task, _inproc(max_steps=6, lr=2e-3), out_dir=tmp_path, resume=True)
    assert info.value.exit_code == 50
    with pytest.raises(CheckpointError, match="canary loss after loading .*step_4"):
        train(functools.partial(task, scale=1.5), _inproc(max_steps=6), out_dir=tmp_path, resume=True)
    blob = tmp_path / "checkpoints" / "step_4" / "__0_0.distcp"
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0xFF
    blob.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"does not match its manifest: digest __0_0.distcp"):
        train(task, _inproc(max_steps=6), out_dir=tmp_path, resume=True)


def test_canary_check_tolerance():
    checkpoint.check_canary(1.0, 1.0 + 5e-5, rtol=1e-4, folder=Path("x"))
    with pytest.raises(CheckpointError, match="canary loss after loading x is 1.001"):
        checkpoint.check_canary(1.0, 1.001, rtol=1e-4, folder=Path("x"))
    with pytest.raises(CheckpointError):
        checkpoint.check_canary(1.0, float("nan"), rtol=1e-4, folder=Path("x"))


# -- progress: samples/s and ETA on the training bar ----------------------------------------------


class _FakeBar:
    """A ui.Task that remembers what the view told it."""

    def __init__(self) -> None:
        self.completed, self.fields = 0.0, {}

    def advance(self, n: float = 1) -> None:
        self.completed += n

    def set_total(self, total: float) -> None:
        pass

    def show(self, **fields: str) -> None:
        self.fields.update(fields)


def _train_record(step: int, t: float, **metrics) -> dict:
    return {"step": step, "split": "train", "time": t, "metrics": {"loss": 0.5, **metrics}}


def test_progress_bar_shows_samples_per_s_and_eta_from_records(tmp_path, capsys):
    from reproduction.train.api import _ProgressView
    from reproduction.ui import UiOptions

    bar = _FakeBar()
    view = _ProgressView(bar, tmp_path / "metrics.jsonl", _inproc(max_steps=10), UiOptions())
    assert bar.fields == {"rate": "? samples/s", "eta": "-:--:--"}
    view.record(_train_record(2, 100.0, samples_per_s=40.0))  # one record: ETA from its own speed, 8 steps / 5 per s
    assert (bar.completed, bar.fields) == (2, {"rate": "40 samples/s", "eta": "0:00:02"})
    view.record(_train_record(4, 104.0, samples_per_s=32.0))  # 2 steps in 4 s of wall time: 6 left -> 12 s
    assert (bar.completed, bar.fields) == (4, {"rate": "32 samples/s", "eta": "0:00:12"})
    view.record({"step": 4, "split": "eval", "time": 104.5, "metrics": {"mse": 0.25, "count": 20.0}})
    # the eval line's ETA is as of the eval record: 2 steps in 4.5 s, 6 left -> 13.5 s
    assert capsys.readouterr().err == "step 4/10: loss 0.5, 32 samples/s, eta 0:00:14; eval mse 0.25, count 20\n"
    view.record(_train_record(6, 108.0))  # no samples_per_s (an older log): from record times, 4 steps in 8 s x 8
    assert bar.fields == {"rate": "4.0 samples/s", "eta": "0:00:08"}
    view.record(_train_record(10, 116.0, samples_per_s=30.0))
    assert (bar.completed, bar.fields) == (10, {"rate": "30 samples/s", "eta": "0:00:00"})


def test_progress_view_tails_the_jsonl_of_a_ray_run(tmp_path):
    """The Ray path polls the log: only complete lines written after the view started count, and a
    resumed run's bar starts at the step it continues from."""
    from reproduction.train.api import _ProgressView

    log = tmp_path / "metrics.jsonl"
    log.write_text(json.dumps(_train_record(7, 1.0, samples_per_s=99.0)) + "\n")  # the killed run's record
    bar = _FakeBar()
    view = _ProgressView(bar, log, _inproc(max_steps=24), None)
    t = view.started
    lines = [
        json.dumps(_train_record(9, t + 1, samples_per_s=16.0)),
        json.dumps(_train_record(10, t + 3, samples_per_s=8.0)),
    ]
    with open(log, "a") as fh:
        fh.write(lines[0] + "\n" + lines[1][:25])  # the second record is half-written
    view.poll()
    assert (bar.completed, bar.fields) == (9, {"rate": "16 samples/s", "eta": "0:00:08"})  # 15 left at 2 steps/s
    with open(log, "a") as fh:
        fh.write(lines[1][25:] + "\n")
    view.poll()
    assert (bar.completed, bar.fields) == (10, {"rate": "8.0 samples/s", "eta": "0:00:28"})  # 14 left at 1 step per 2 s
    view.poll()
    assert bar.completed == 10


def test_progress_columns_prefer_the_task_fields_and_keep_bytes_otherwise():
    from rich.progress import Task as RichTask
    from rich.progress import TimeRemainingColumn, TransferSpeedColumn

    from reproduction.ui import _field_or

    def task(**fields) -> RichTask:
        return RichTask(0, "t", 100.0, 50.0, _get_time=lambda: 0.0, fields=fields)

    rate, eta = _field_or(TransferSpeedColumn, "rate", "x")(), _field_or(TimeRemainingColumn, "eta", "x")()
    trained = task(rate="32 samples/s", eta="0:00:12")
    assert (rate.render(trained).plain, eta.render(trained).plain) == ("32 samples/s", "0:00:12")
    plain = task()  # restore/verify/fetch set no fields: rich's own bytes/s and time remaining
    assert rate.render(plain).plain == TransferSpeedColumn().render(plain).plain
    assert eta.render(plain).plain == TimeRemainingColumn().render(plain).plain


_KILLED_LOGGER = """
import os, signal, sys
from pathlib import Path
from reproduction.train.metrics import MetricsLog
log = MetricsLog(Path(sys.argv[1]), resume_step=None)
for step in range(1, 301):
    log.log(step, "train", {"loss": step / 8})
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_kill_right_after_logging_loses_no_tensorboard_scalar(tmp_path):
    """kill -9 straight after the last record: TensorBoard holds every step the JSONL holds (the
    writer's queue is flushed per record, as the JSONL is)."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parent.parent
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_LOGGER, str(tmp_path)],
        cwd=repo,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(repo)},
        capture_output=True,
        text=True,
    )
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert [r["step"] for r in read_records(tmp_path / "metrics.jsonl")] == list(range(1, 301))
    assert train_tiny.tb_scalars(tmp_path, "train/loss") == [(s, s / 8) for s in range(1, 301)]


def test_a_resumed_event_file_sorts_after_the_earlier_ones(tmp_path):
    """TensorBoard reads event files in name order (`...<second>.<host>.<pid>.<counter>`, not zero-padded):
    a resume's file made in the same second as one numbered 9 would sort before it, and its purge would
    then hide the earlier steps. The new file waits for a later second instead (at most one)."""
    import socket
    import time

    from reproduction.train.metrics import MetricsLog

    tb = tmp_path / "tensorboard"
    tb.mkdir()
    earlier = tb / f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.9"
    earlier.touch()
    log = MetricsLog(tmp_path, resume_step=0)
    log.log(1, "train", {"loss": 1.0})
    log.close()
    names = sorted(p.name for p in tb.iterdir())
    assert len(names) == 2 and names[0] == earlier.name  # the resumed run's file is read last


def test_a_start_from_step_0_removes_a_killed_attempts_event_files(tmp_path):
    """A training stage killed before its first checkpoint is continued by --resume from step 0: the JSONL log was
    emptied, but the killed attempt's event file stayed beside the new one, and nothing purged its steps
    (TensorBoard showed steps 0.. twice). A start from step 0 now leaves only its own event file."""
    from reproduction.train.metrics import MetricsLog

    tb = tmp_path / "tensorboard"
    killed = MetricsLog(tmp_path, resume_step=None)
    killed.log(1, "train", {"loss": 2.0})
    killed.close()
    (first,) = tb.iterdir()
    log = MetricsLog(tmp_path, resume_step=None)
    log.log(1, "train", {"loss": 1.0})
    log.close()
    names = [p.name for p in tb.iterdir()]
    assert len(names) == 1 and names[0] != first.name and names[0].startswith("events.out.tfevents.")
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 1
