"""Stage-3 value inference: load the value exports strictly, infer V per frame over the sharding plan.

    <value stage out>/crossfit.json              which model labels which episode
    <value stage out>/model_<k>/export/          model.safetensors, value_head.json, tokenizer/

Everything the model needs (architecture, bins, v_min/v_max, return range, camera map, tokenizer)
is read from the export; nothing is retyped in stage 3's config. Each frame of a shard's inferred
range goes through exactly one forward of exactly one model: the one that did not train on its
episode (cross-fitting), the single model when folds == 1, and for a dataset no model trained on
(e.g. rollouts after training on sft data) a per-episode pick among the K models, all of which are
held out for it (CrossFitPlan.models_for). A token id past the model's embedding is a one-line
ConfigError (value_task.VocabGuard). Values are keyed by (episode_index, frame_index), never by position.

Stage 3 opens the value stage once (`open_value_stage`: the fold plan and every fold's head, read and
checked now; the models loaded on first use, once) and passes it, with the opened dataset, to each
call; Ray workers, which are other processes, open it again by path.

`infer_dataset` runs the plan's shards one after another in this process; `infer_dataset_ray` runs
them concurrently, one Ray worker (one device) per shard (`reproduction.train.launcher.run_tasks`):
each worker loads the models on its device, opens the dataset by path, checks its fingerprint and
returns only its owned rows' (episode_index, frame_index, value). On CPU with a Ray the call starts
itself, the driver is one of the workers: it infers while Ray comes up and its workers import, and
all of them claim batch-aligned chunks as they are free (the same batches, so the same values). The
worker body is a seam:
`infer_dataset_ray(task=...)` runs another picklable callable on each ShardJob (the fault tests
pass one that raises or dies).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from reproduction.errors import CheckpointError, FingerprintMismatchError, InputNotFoundError
from reproduction.recap.normalize import ReturnRange
from reproduction.recap.sharding import Shard
from reproduction.recap.value.crossfit import CrossFitPlan
from reproduction.train.device import DeviceSpec
from reproduction.value_export import ValueHead


@dataclass(kw_only=True)
class ValueExport:
    """One trained value model, ready for inference (eval mode, on its device)."""

    folder: Path
    model: Any
    tokenizer: Any
    head: dict[str, Any]
    """The export's value_head.json."""
    return_range: ReturnRange

    @property
    def cameras(self) -> dict[str, str]:
        return dict(self.head["cameras"])


def load_value_export(folder: Path, *, device: str = "cpu", head: ValueHead | None = None) -> ValueExport:
    """Rebuild the model from `value_head.json` and load `model.safetensors` strictly. `head` is the
    export's head when the caller has already read it (`open_value_stage` did), so it is not read twice.

    Raises InputNotFoundError (no export there), UnsupportedFormatError (newer export format),
    CheckpointError (weights that do not fit the stored architecture, naming the keys).
    """
    from reproduction.recap.tokenizer import load_tokenizer
    from reproduction.recap.value.model import ValueModelConfig, build_value_model
    from reproduction.recap.value.weights import load_safetensors_strict
    from reproduction.value_export import read_value_head

    folder = Path(folder)
    checked = head if head is not None else read_value_head(folder)  # the one reader: format, return range, bins
    doc = checked.doc
    model = build_value_model(ValueModelConfig.from_dict(doc["model_config"]))
    load_safetensors_strict(model, folder / "model.safetensors")
    model.to(device).eval()
    return ValueExport(
        folder=folder,
        model=model,
        tokenizer=load_tokenizer(folder / doc.get("tokenizer", "tokenizer")),
        head=doc,
        return_range=checked.return_range,
    )


AGREE = ("return_range", "num_bins", "v_min", "v_max", "folds", "cameras", "state_keys", "state_dims")
"""What every fold's export of one value stage must share."""


@dataclass(kw_only=True)
class ValueStage:
    """A stage-2 output folder opened once: its fold plan and every fold's head (read and checked when
    opened), and its models, loaded on first use, once, on the device `spec` names."""

    folder: Path
    plan: CrossFitPlan
    heads: list[ValueHead]
    """One per fold, in fold order; they agree on AGREE."""
    spec: DeviceSpec
    _models: list[ValueExport] | None = field(default=None, repr=False)

    @property
    def head(self) -> ValueHead:
        """What every fold shares (fold 0's head): the return range and bins stage 3 computes with."""
        return self.heads[0]

    @property
    def models(self) -> list[ValueExport]:
        if self._models is None:
            from reproduction.train.device import local_device

            device = str(local_device(self.spec, 0))
            self._models = [
                load_value_export(self.folder / f"model_{k}" / "export", device=device, head=h)
                for k, h in enumerate(self.heads)
            ]
        return self._models


def open_value_stage(stage_dir: Path, *, device: str = "cpu", spec: DeviceSpec | None = None) -> ValueStage:
    """Open a value stage's folder for inference: read `crossfit.json` and each fold's export head, check
    that they agree, and resolve the device (`device` as training resolves it: an absent or broken
    accelerator is a ConfigError naming it; or `spec`, already resolved, as a worker gets it). No model is
    loaded yet, so a wrong device or folder fails before any weights are read.

    Raises InputNotFoundError (not a value stage folder), UnsupportedFormatError (newer export format),
    CheckpointError (folds that disagree, or a plan whose fold count is not the exports')."""
    from reproduction.train.device import resolve
    from reproduction.value_export import read_value_head

    stage_dir = Path(stage_dir)
    plan_path = stage_dir / "crossfit.json"
    if not plan_path.is_file():
        raise InputNotFoundError(
            f"{plan_path} does not exist: not a value stage folder",
            path=plan_path,
            hint="run the value stage first (`portable run --stages value`, or `--restart-stage value`)",
        )
    spec = spec if spec is not None else resolve(device)
    plan = CrossFitPlan.from_dict(json.loads(plan_path.read_text(encoding="utf-8")))
    heads = [read_value_head(stage_dir / f"model_{k}" / "export") for k in range(plan.folds)]
    for h in heads[1:]:
        for key in AGREE:
            if h.doc.get(key) != heads[0].doc.get(key):
                raise CheckpointError(
                    f"{h.path}: {key} {h.doc.get(key)!r} differs from {heads[0].path}'s {heads[0].doc.get(key)!r}",
                    path=h.path,
                    hint="all folds must come from one value-stage run; `portable run --restart-stage value`",
                )
    if heads[0].doc.get("folds") != plan.folds:
        raise CheckpointError(
            f"{plan_path}: {plan.folds} folds, but the exports were trained with {heads[0].doc.get('folds')}",
            path=plan_path,
            hint="`portable run --restart-stage value` trains the value stage again",
        )
    return ValueStage(folder=stage_dir, plan=plan, heads=heads, spec=spec)


def infer_rows(
    models: Sequence[ValueExport],
    plan: CrossFitPlan,
    dataset: Any,
    dataset_name: str,
    rows: np.ndarray,
    *,
    batch_size: int = 64,
    cancelled: Callable[[], bool] | None = None,
) -> np.ndarray:
    """V (float64, value space) for dataset `rows` (reader positions), one forward per frame.

    `dataset` is an opened reader (reproduction.data.reader.Dataset). `rows` are cut into chunks of
    `batch_size` in the given order; each chunk's rows go through the model that labels their
    episode, one batch per model present. A chunk's frames alone decide its batches, so rows cut at
    the same chunk boundaries get bit-identical values however the work was split between workers
    (plan_shards(..., align=batch_size) puts shard starts on those boundaries). `cancelled()` is
    asked before each chunk; True raises InferenceCancelled.
    """
    import torch

    from reproduction.recap.tokenizer import format_prompt
    from reproduction.recap.value.data import ValueCollator, to_pixels
    from reproduction.recap.value.task import VocabGuard

    rows = np.asarray(rows, dtype=np.int64)
    meta = dataset.read_frames(rows, ["episode_index", "frame_index", "task_index"]) if rows.size else {}
    which = plan.models_for(dataset_name, meta["episode_index"]) if rows.size else np.zeros(0, np.int64)
    out = np.full(rows.size, np.nan, dtype=np.float64)
    prepared: dict[int, tuple[Any, dict[str, str], Any]] = {}

    def prepare(k: int) -> tuple[Any, dict[str, str], Any]:
        if k not in prepared:
            vm = models[k]
            cfg = vm.model.config
            collate = VocabGuard(
                collate=ValueCollator(
                    tokenizer=vm.tokenizer,
                    slots=cfg.cameras,
                    image_size=cfg.image_size,
                    max_token_len=int(vm.head["max_token_len"]),
                ),
                vocab_size=int(cfg.text["vocab_size"]),
                tokenizer_file=str(vm.folder / vm.head.get("tokenizer", "tokenizer") / "tokenizer.json"),
            )
            present = {slot: key for slot, key in vm.cameras.items() if key in dataset.camera_keys}
            prepared[k] = (vm, present, collate)
        return prepared[k]

    from reproduction.recap.value.data import read_state

    keys = list(models[0].head.get("state_keys") or []) if models else []
    state = read_state(dataset, keys, models[0].head.get("state_dims"), rows) if keys and rows.size else None
    for lo in range(0, rows.size, batch_size):
        if cancelled is not None and cancelled():
            raise InferenceCancelled
        chunk = np.arange(lo, min(lo + batch_size, rows.size))
        for k in np.unique(which[chunk]):
            vm, present, collate = prepare(int(k))
            cfg = vm.model.config
            device = next(vm.model.parameters()).device
            sel = chunk[which[chunk] == k]
            frames = dataset.read_frames(rows[sel], list(present.values())) if present else {}
            samples = [
                {
                    "images": {s: to_pixels(frames[key][i], cfg.image_size) for s, key in present.items()},
                    "prompt": format_prompt(dataset.tasks.get(int(meta["task_index"][j]), "perform the task")),
                    "target": 0.0,
                    "episode_index": 0,
                    "frame_index": 0,
                    "source": 0,
                }
                for i, j in enumerate(sel)
            ]
            batch = collate(samples)
            with torch.no_grad():
                logits = vm.model(
                    images={s: t.to(device) for s, t in batch["images"].items()},
                    image_masks={s: t.to(device) for s, t in batch["image_masks"].items()},
                    input_ids=batch["input_ids"].to(device),
                    attention_mask=batch["attention_mask"].to(device),
                    state=None if state is None else torch.from_numpy(state[sel]).to(device),
                )
            out[sel] = vm.model.expected_value(logits).double().cpu().numpy()
    return out


def sorted_frames(dataset: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dataset rows, episode_index, frame_index) in (episode, frame) order: the sharding plan's rows."""
    from reproduction.recap.returns import sort_frames

    table = dataset.frame_table(["episode_index", "frame_index"])
    ep = table.column("episode_index").to_numpy().astype(np.int64)
    fr = table.column("frame_index").to_numpy().astype(np.int64)
    order = sort_frames(ep, fr)
    order = np.arange(ep.size, dtype=np.int64) if order is None else np.asarray(order, dtype=np.int64)
    return order, ep[order], fr[order]


def infer_shard(
    models: Sequence[ValueExport],
    plan: CrossFitPlan,
    dataset: Any,
    shard: Any,
    *,
    dataset_name: str | None = None,
    batch_size: int = 64,
    frames: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> pa.Table:
    """Values of a shard's inferred range [start, infer_stop) of the (episode, frame)-sorted rows:
    a table (episode_index, frame_index, value, owned); `owned` marks the rows this shard reports.
    `frames` is `sorted_frames(dataset)` when the caller already has it; `cancelled` as in infer_rows."""
    order, ep, fr = frames if frames is not None else sorted_frames(dataset)
    part = slice(shard.start, shard.infer_stop)
    values = infer_rows(
        models, plan, dataset, dataset_name or dataset.name, order[part], batch_size=batch_size, cancelled=cancelled
    )
    owned = np.arange(shard.infer_stop - shard.start) < (shard.stop - shard.start)
    return pa.table(
        {
            "episode_index": pa.array(ep[part], pa.int64()),
            "frame_index": pa.array(fr[part], pa.int64()),
            "value": pa.array(values),
            "owned": pa.array(owned),
        }
    )


def infer_dataset(
    stage: ValueStage,
    dataset: Any,
    *,
    world_size: int = 1,
    batch_size: int = 64,
    dataset_name: str | None = None,
) -> pa.Table:
    """Every frame's value of the opened `dataset`, sorted by (episode, frame): run each shard of the plan
    in turn with the opened stage's models (the single-process form of what stage 3's workers do one shard
    each) and merge them.

    Each frame goes through exactly one forward: each shard infers only the rows it owns (a frame's V(t+N)
    is another frame's V(t), labelled by whichever shard owns it; no lookahead rows). A dataset the models
    never trained on is labelled per `CrossFitPlan.models_for`. Shards start on multiples of `batch_size`,
    so every inference batch, and with it every value, is the same bit for bit whatever `world_size` (and in
    `infer_dataset_ray`).
    """
    from reproduction.recap.sharding import merge_values, plan_shards

    frames = sorted_frames(dataset)
    parts = [
        _infer_owned(
            stage.models, stage.plan, dataset, shard, dataset_name=dataset_name, batch_size=batch_size, frames=frames
        )
        for shard in plan_shards(_row_ends(frames[1]), world_size, 0, align=batch_size)
    ]
    return merge_values(parts)


def _row_ends(ep: np.ndarray) -> np.ndarray:
    """Each sorted row's episode end (exclusive): what `plan_shards` cuts by."""
    return np.searchsorted(ep, ep, side="right").astype(np.int64)


def _infer_owned(
    models: Sequence[ValueExport],
    plan: CrossFitPlan,
    dataset: Any,
    shard: Shard,
    *,
    dataset_name: str | None,
    batch_size: int,
    frames: tuple[np.ndarray, np.ndarray, np.ndarray],
    cancelled: Callable[[], bool] | None = None,
) -> pa.Table:
    """(episode_index, frame_index, value) of the shard's owned rows only: the merge has every shard's
    owned rows, so the lookahead rows would be a second forward of a frame another shard labels."""
    owned_only = dataclasses.replace(shard, infer_stop=shard.stop)
    t = infer_shard(
        models,
        plan,
        dataset,
        owned_only,
        dataset_name=dataset_name,
        batch_size=batch_size,
        frames=frames,
        cancelled=cancelled,
    )
    return t.drop_columns(["owned"])


@dataclass(kw_only=True, frozen=True)
class ShardJob:
    """One Ray worker's share of stage 3, all by path (pickled to the worker; no model, no frames)."""

    stage_dir: str
    dataset_root: str
    fingerprint: str
    """The dataset fingerprint the driver planned with; the worker's copy must match."""
    shard: Shard
    spec: DeviceSpec
    """The worker computes on its one visible device of this kind (Ray narrows GPUs/NPUs to one)."""
    batch_size: int
    dataset_name: str | None = None
    claims: str | None = None
    """A folder on this machine through which the driver and local workers share `chunks`: each
    infers the chunks it claims there (None: the job infers `shard`, which then only names it)."""
    chunks: tuple[Shard, ...] = ()


def infer_job(
    job: ShardJob, cancelled: Callable[[], bool] | None = None, opened: tuple[ValueStage, Any] | None = None
) -> pa.Table:
    """Ray worker body: the job's owned rows' values, computed on this worker's device: its shard's,
    or with `claims` those of every chunk it claims (the models load once). `opened` is the (value stage,
    dataset) the driver already opened, when the driver takes a share itself.

    Raises FingerprintMismatchError when the dataset at `dataset_root` is not the one the driver
    planned with (edited meanwhile, or another copy on this node), and what `open_value_stage`
    and `infer_rows` raise (InferenceCancelled once `cancelled()`).
    """
    from reproduction.data.reader import open_dataset
    from reproduction.recap.sharding import merge_values

    if opened is not None:
        stage, ds = opened
    else:
        stage, ds = open_value_stage(Path(job.stage_dir), spec=job.spec), open_dataset(Path(job.dataset_root))
    if ds.fingerprint != job.fingerprint:
        raise FingerprintMismatchError(
            f"{job.dataset_root}: fingerprint {ds.fingerprint} on this worker, {job.fingerprint} when stage 3 planned "
            f"its shards",
            path=job.dataset_root,
            hint="the dataset changed (or differs on this node); rerun stage 3",
        )
    models, plan = stage.models, stage.plan
    frames = sorted_frames(ds)
    shards = [job.shard] if job.claims is None else _claimed(Path(job.claims), job.chunks)
    parts = [
        _infer_owned(
            models,
            plan,
            ds,
            shard,
            dataset_name=job.dataset_name,
            batch_size=job.batch_size,
            frames=frames,
            cancelled=cancelled,
        )
        for shard in shards
    ]
    return parts[0] if job.claims is None else merge_values(parts)


def _claimed(folder: Path, chunks: Sequence[Shard]) -> Iterator[Shard]:
    """The chunks this process claims, each claimed just before it is inferred (so a faster process
    takes more): a claim is a file created exclusively, which exactly one process can do."""
    import os

    for chunk in chunks:
        try:
            os.close(os.open(folder / str(chunk.rank), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            continue
        yield chunk


def infer_dataset_ray(
    stage: ValueStage,
    dataset: Any,
    *,
    world_size: int,
    batch_size: int = 64,
    dataset_name: str | None = None,
    ray_address: str | None = None,
    on_done: Callable[[int], None] | None = None,
    task: Callable[[ShardJob], pa.Table] | None = None,
    writers_lock: Path | None = None,
    killed_hint: str | None = None,
) -> pa.Table:
    """What `infer_dataset` returns, with the plan's `world_size` shards run concurrently on Ray
    workers, one device (the stage's `spec`: cpu slot, GPU or NPU) each; `on_done(rank)` as each
    finishes. Workers open the stage and the dataset again by path. On CPU, when Ray is neither given
    nor running (a local one is started), this process is the last worker, with the stage and dataset
    it already opened, and the workers share the rows as chunks claimed as they are free
    (`_infer_beside_ray`). `task` replaces the worker body (default `infer_job`); it must be picklable
    by reference. Each worker holds `writers_lock` (StageContext.writers_lock) while it runs (run_tasks).
    `killed_hint`: the hint under a killed worker (run_tasks; the caller's command and key for the worker count).

    Ray is started locally and stopped unless `ray_address` (or an initialised Ray) is given. A
    worker that raises or dies is a one-line WorkerFailedError (exit 51, its traceback in
    `.traceback`); a PortableError in a worker (bad export, changed dataset) arrives as itself.
    """
    from reproduction.recap.sharding import merge_values, plan_shards
    from reproduction.train.launcher import run_tasks

    spec = stage.spec
    _, ep, _ = sorted_frames(dataset)
    jobs = [
        ShardJob(
            stage_dir=str(Path(stage.folder).resolve()),
            dataset_root=str(Path(dataset.root).resolve()),
            fingerprint=dataset.fingerprint,
            shard=shard,
            spec=spec,
            batch_size=batch_size,
            dataset_name=dataset_name,
        )
        for shard in plan_shards(_row_ends(ep), world_size, 0, align=batch_size)
    ]
    if task is None and len(jobs) > 1 and _starts_local_cpu_ray(spec, ray_address):
        chunks = plan_shards(
            _row_ends(ep), min(CHUNKS_PER_WORKER * world_size, -(-ep.size // batch_size) or 1), 0, align=batch_size
        )
        parts = _infer_beside_ray(
            jobs,
            chunks,
            spec=spec,
            on_done=on_done,
            opened=(stage, dataset),
            writers_lock=writers_lock,
            killed_hint=killed_hint,
        )
    else:
        parts = run_tasks(
            task or infer_job,
            jobs,
            spec=spec,
            ray_address=ray_address,
            on_done=on_done,
            label=LABEL,
            writers_lock=writers_lock,
            killed_hint=killed_hint,
        )
    return merge_values(parts)


LABEL = "value inference shard"
CHUNKS_PER_WORKER = 8
"""With the driver inferring beside local Ray workers, the rows are cut into this many batch-aligned
chunks per worker, claimed one at a time: fine enough that who started late takes less."""


class InferenceCancelled(Exception):
    """Raised inside a shard's inference when its caller cancelled it (another shard failed)."""


def _starts_local_cpu_ray(spec: DeviceSpec, ray_address: str | None) -> bool:
    """True when `run_tasks` would start a Ray of its own, on this machine, for CPU workers."""
    if spec.kind != "cpu" or ray_address:
        return False
    import ray

    return not ray.is_initialized()


def _infer_beside_ray(
    jobs: list[ShardJob],
    chunks: list[Shard],
    *,
    spec: DeviceSpec,
    on_done: Callable[[int], None] | None,
    opened: tuple[ValueStage, Any],
    writers_lock: Path | None = None,
    killed_hint: str | None = None,
) -> list[pa.Table]:
    """Every chunk's values, inferred by this process and Ray workers for the other jobs, each
    claiming the next chunk as it is free (`ShardJob.claims`, in a temporary folder: a Ray this call
    started runs on this machine).

    A Ray started for the call needs seconds to come up, and each worker seconds more to import
    torch and load the models (about 18 s of fixed cost measured on 2 cores), while the driver
    would wait idle: here it infers meanwhile, and the workers take what is left when they are
    ready. The driver runs at the workers' one intra-op thread and chunks start on multiples of the
    batch size, so every batch, and with it every value, is the same bit for bit. A failure on
    either side stops the other: the driver within a batch, the Ray tasks within a poll.
    """
    import shutil
    import tempfile
    import threading
    import traceback
    from concurrent.futures import ThreadPoolExecutor

    from reproduction.errors import PortableError
    from reproduction.train.launcher import WorkerFailure, cpu_threads, run_tasks

    claims = tempfile.mkdtemp(prefix="recap-value-claims-")
    jobs = [dataclasses.replace(job, claims=claims, chunks=tuple(chunks)) for job in jobs]
    stop = threading.Event()

    def here(job: ShardJob) -> pa.Table:
        try:
            with cpu_threads(1):
                return infer_job(job, cancelled=stop.is_set, opened=opened)
        except (PortableError, InferenceCancelled):
            raise
        except Exception as exc:  # as a Ray worker's would: one line naming the shard, exit 51
            summary, text = f"{type(exc).__name__}: {exc}", traceback.format_exc()
            raise WorkerFailure(rank=job.shard.rank, died=False, summary=summary, traceback=text).error(LABEL) from None

    try:
        with ThreadPoolExecutor(1, thread_name_prefix="driver-infer") as pool:
            mine = pool.submit(here, jobs[-1])

            def driver_failed() -> None:
                if mine.done() and mine.exception() is not None:
                    raise mine.exception()

            try:
                rest = run_tasks(
                    infer_job,
                    jobs[:-1],
                    spec=spec,
                    ray_address=None,
                    on_done=on_done,
                    on_poll=driver_failed,
                    label=LABEL,
                    writers_lock=writers_lock,
                    killed_hint=killed_hint,
                )
            except BaseException:
                stop.set()
                raise
            last = mine.result()
    finally:
        shutil.rmtree(claims, ignore_errors=True)
    if on_done is not None:
        on_done(len(jobs) - 1)
    return [*rest, last]
