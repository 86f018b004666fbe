"""Stage 2's functions: train the value model(s), one per cross-fitting fold, and infer every frame's value.

`train_value` trains through the project's trainer (ValueConfig, TrainConfig and the training datasets); `infer_values`
writes every frame's value (episode_index, frame_index, value), each episode labelled by the model
that did not train on it, as the parquet stage 3 reads; `workers` > 1 runs the shards concurrently,
one Ray worker (one device) each. The runner (`portable run --stages value,advantages`) calls them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from reproduction.errors import ConfigError
from reproduction.recap.value.task import SETUP_NAME, ValueConfig, ValueSetup, make_value_task, prepare_value_setup


@dataclass(kw_only=True)
class ValueStageResult:
    """What stage 2 produced: the setup and one trainer result per fold."""

    setup: ValueSetup
    results: list[Any]
    """reproduction.train.task.TrainResult per fold, in fold order."""

    @property
    def export_dirs(self) -> list[Path]:
        return [r.export_dir for r in self.results]

    def summary(self) -> dict[str, Any]:
        return {
            "folds": self.setup.plan.folds,
            "return_range": self.setup.return_range.to_dict(),
            "models": [
                {
                    "fold": k,
                    "step": r.step,
                    "export": str(r.export_dir),
                    "eval": r.eval_metrics,
                    "samples_per_s": r.samples_per_s,
                }
                for k, r in enumerate(self.results)
            ],
        }


def train_value(
    config: ValueConfig,
    train_config: Any,
    out_dir: Path,
    *,
    sources: list[Any],
    eval_sources: list[Any] | None = None,
    datasets: Any = None,
    resume: bool = False,
    ray_address: str | None = None,
    ui: Any = None,
    writers_lock: Path | None = None,
) -> ValueStageResult:
    """Prepare the setup (tokenizer, return range, folds) and train one model per fold into
    `out_dir/model_<k>/`: the value model of `config`, trained by the trainer's `train_config` (a TrainConfig) on
    the datasets `sources` (recap/value/config.py's ValueSource), evaluated on `eval_sources` too; `datasets`
    ({source name: opened Dataset}) are those the caller opened, which the driver reads rather than reopening them.
    Fold k trains without fold k's episodes and evaluates on them.

    `resume=True` continues each fold from its newest complete checkpoint, and raises
    CheckpointError (exit 50) naming what changed when the return range, bins, model config, fold
    plan, tokenizer or training datasets differ from what those checkpoints were trained with.
    Raises what the data plane and the trainer raise (ConfigError, DatasetError,
    FingerprintMismatchError, CheckpointError, WorkerFailedError), all PortableErrors. Ray workers hold
    `writers_lock` (StageContext.writers_lock) while they write (train()).
    """
    from reproduction.train.api import train

    out_dir = Path(out_dir)
    # refuses a resume whose setup changed
    setup = prepare_value_setup(
        config, out_dir, sources=sources, eval_sources=eval_sources, datasets=datasets, resume=resume
    )
    results = []
    for fold in range(setup.plan.folds):
        make = functools.partial(make_value_task, setup_path=str((out_dir / SETUP_NAME).resolve()), fold=fold)
        results.append(
            train(
                make,
                train_config,
                out_dir=out_dir / f"model_{fold}",
                resume=resume,
                ray_address=ray_address,
                ui=ui,
                writers_lock=writers_lock,
            )
        )
    return ValueStageResult(setup=setup, results=results)


def infer_values(
    stage: Any,
    dataset: Any,
    out: Path,
    *,
    workers: int = 1,
    batch_size: int = 64,
    ray_address: str | None = None,
    ui: Any = None,
    writers_lock: Path | None = None,
) -> dict[str, Any]:
    """Infer every frame of the opened `dataset` with the opened value `stage`'s models (cross-fitted;
    `reproduction.recap.value.infer.open_value_stage`, on the device it resolved) and write `out` atomically.

    `workers` == 1 runs in this process with the stage's models (loaded once, on first use, and reused by
    the next call); > 1 runs the plan's shards concurrently on Ray workers, one device each, which open the
    stage again by path (`ray_address` joins a cluster, else a local Ray is started and stopped), with the
    same values bit for bit. A worker that raises or dies is a WorkerFailedError (exit 51); on any error
    `out` is not written. A progress line over shards goes to stderr (reproduction.ui options `ui`).

    The parquet holds episode_index, frame_index (int64) and value (float64), sorted by (episode,
    frame), with the fingerprint of the dataset the shards read in its metadata. Returns a small summary,
    including how many frames each fold's model labelled and whether the models trained on folds of this
    dataset (False: every model is held out for it, e.g. trained on sft data, labelling rollouts).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from reproduction import ui as ui_mod
    from reproduction.errors import killed_worker_hint
    from reproduction.fsio import atomic_write_bytes
    from reproduction.recap.value.infer import infer_dataset, infer_dataset_ray

    if workers < 1:
        raise ConfigError(
            f"value.infer.workers {workers}: needs at least one worker",
            field="value.infer.workers",
            value=workers,
            hint="set value.infer.workers=1 (in this process) or the number of devices to use",
        )
    # Read before inference: the parquet is stamped with the version the shards were planned on.
    fingerprint = dataset.fingerprint
    plan = stage.plan
    with ui_mod.progress(ui) as prog:
        shards = prog.task("value infer (shards)", total=workers)
        shards.show(rate="")  # units are shards, not the bar's default bytes/s
        if workers == 1:
            table = infer_dataset(stage, dataset, world_size=1, batch_size=batch_size)
            shards.advance(1)
        else:
            table = infer_dataset_ray(
                stage,
                dataset,
                world_size=workers,
                batch_size=batch_size,
                ray_address=ray_address,
                on_done=lambda _: shards.advance(1),
                writers_lock=writers_lock,
                killed_hint=killed_worker_hint("value.infer.workers"),  # the advantages stage of a run
            )
    which = plan.models_for(dataset.name, table.column("episode_index").to_numpy())
    table = table.replace_schema_metadata(
        {**(table.schema.metadata or {}), b"recap_portable.dataset_fingerprint": fingerprint.encode()}
    )
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    atomic_write_bytes(Path(out), sink.getvalue().to_pybytes())
    values = table.column("value").to_numpy()
    return {
        "values": str(out),
        "frames": table.num_rows,
        "dataset_fingerprint": fingerprint,
        "value_mean": float(values.mean()) if values.size else None,
        "frames_per_model": np.bincount(which, minlength=plan.folds).tolist(),
        "dataset_in_fold_plan": plan.covers(dataset.name),
    }
