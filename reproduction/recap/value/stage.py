"""Stage 2's functions: train the value model(s), one per cross-fitting fold, and infer every frame's value.

`train_value` trains through the project's trainer (ValueStageConfig + TrainConfig); `infer_values`
writes every frame's value (episode_index, frame_index, value), each episode labelled by the model
that did not train on it, as the parquet stage 3 reads; `workers` > 1 runs the shards concurrently,
one Ray worker (one device) each. The runner (`portable run --stages value,advantages`) calls them.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reproduction.errors import ConfigError, InputNotFoundError
from reproduction.recap.value.task import SETUP_NAME, ValueSetup, ValueStageConfig, make_value_task, prepare_value_setup


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
    stage: ValueStageConfig,
    train_config: Any,
    out_dir: Path,
    *,
    resume: bool = False,
    ray_address: str | None = None,
    ui: Any = None,
) -> ValueStageResult:
    """Prepare the setup (tokenizer, return range, folds) and train one model per fold into
    `out_dir/model_<k>/`. Fold k trains without fold k's episodes and evaluates on them.

    `resume=True` continues each fold from its newest complete checkpoint, and raises
    CheckpointError (exit 50) naming what changed when the return range, bins, model config, fold
    plan, tokenizer or training datasets differ from what those checkpoints were trained with.
    Raises what the data plane and the trainer raise (ConfigError, DatasetError,
    FingerprintMismatchError, CheckpointError, WorkerFailedError), all PortableErrors.
    """
    from reproduction.train.api import train

    out_dir = Path(out_dir)
    setup = prepare_value_setup(stage, out_dir, resume=resume)  # refuses a resume whose setup changed
    results = []
    for fold in range(setup.plan.folds):
        make = functools.partial(make_value_task, setup_path=str((out_dir / SETUP_NAME).resolve()), fold=fold)
        results.append(
            train(make, train_config, out_dir=out_dir / f"model_{fold}", resume=resume, ray_address=ray_address, ui=ui)
        )
    return ValueStageResult(setup=setup, results=results)


def infer_values(
    stage_dir: Path,
    dataset: Any,
    out: Path,
    *,
    lookahead: int = 10,
    workers: int = 1,
    batch_size: int = 64,
    device: str = "auto",
    ray_address: str | None = None,
    ui: Any = None,
) -> dict[str, Any]:
    """Infer every frame of `dataset` with the stage's models (cross-fitted) and write `out` atomically.

    `device` is resolved as training resolves it (`reproduction.train.device.resolve`: an absent or
    broken accelerator is a ConfigError naming it, before any model is loaded). `workers` == 1 runs
    in this process; > 1 runs the plan's shards concurrently on Ray workers, one device each
    (`ray_address` joins a cluster, else a local Ray is started and stopped), with the same values
    up to float noise. A worker that raises or dies is a WorkerFailedError (exit 51); on any error
    `out` is not written. A progress line over shards goes to stderr (reproduction.ui options `ui`).

    The parquet holds episode_index, frame_index (int64) and value (float64), sorted by (episode,
    frame), with the fingerprint of the dataset the shards read in its metadata. `dataset` is an
    opened Dataset (as the runner passes it) or a dataset root. Returns a small summary, including how
    many frames each fold's model labelled and whether the models trained on folds of this dataset
    (False: every model is held out for it, e.g. trained on sft data, labelling rollouts).
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from reproduction import ui as ui_mod
    from reproduction.data.reader import open_dataset
    from reproduction.fsio import atomic_write_bytes
    from reproduction.recap.value.crossfit import CrossFitPlan
    from reproduction.recap.value.infer import infer_dataset, infer_dataset_ray
    from reproduction.train.device import local_device, resolve

    if not (Path(stage_dir) / SETUP_NAME).is_file():
        raise InputNotFoundError(
            f"{stage_dir}: no {SETUP_NAME}; not a stage-2 output folder",
            path=stage_dir,
            hint="pass the folder given to `value train --out`",
        )
    if workers < 1:
        raise ConfigError(
            f"--workers {workers}: needs at least one worker",
            field="workers",
            value=workers,
            hint="pass --workers 1 (in this process) or the number of devices to use",
        )
    spec = resolve(device)
    # Read before inference: the parquet is stamped with the version the shards were planned on.
    ds = dataset if hasattr(dataset, "fingerprint") else open_dataset(Path(dataset))
    fingerprint = ds.fingerprint
    plan = CrossFitPlan.from_dict(json.loads((Path(stage_dir) / "crossfit.json").read_text(encoding="utf-8")))
    with ui_mod.progress(ui) as prog:
        shards = prog.task("value infer (shards)", total=workers)
        shards.show(rate="")  # units are shards, not the bar's default bytes/s
        if workers == 1:
            table = infer_dataset(
                Path(stage_dir),
                ds.root,
                world_size=1,
                lookahead=lookahead,
                batch_size=batch_size,
                device=str(local_device(spec, 0)),
            )
            shards.advance(1)
        else:
            table = infer_dataset_ray(
                Path(stage_dir),
                ds.root,
                spec=spec,
                world_size=workers,
                lookahead=lookahead,
                batch_size=batch_size,
                ray_address=ray_address,
                on_done=lambda _: shards.advance(1),
            )
    which = plan.models_for(ds.name, table.column("episode_index").to_numpy())
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
        "dataset_in_fold_plan": plan.covers(ds.name),
    }
