"""Stage 2 wiring: the value-SFT config, the per-run setup, and `make_value_task` for the trainer.

    <out>/value_setup.json       resolved sources, model config, return range, tokenizer dir, fold plan
    <out>/tokenizer/             the tokenizer every fold uses (trained in-process for `tiny`)
    <out>/crossfit.json          the fold plan stage 3 reads to pick each episode's model
    <out>/model_<k>/             one trainer out_dir per fold (checkpoints/, metrics.jsonl, export/)
    <out>/model_<k>/export/      model.safetensors, model_config.json, value_head.json, tokenizer/

The driver (`prepare_value_setup`) computes the tokenizer, the return range and the fold plan once;
workers only read them, so every rank and every fold shares one value scale. The return range comes
from the whole training datasets (not per fold), so stage 3 has a single normalisation.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from reproduction.config_fields import resume_free_fields
from reproduction.errors import CheckpointError, ConfigError
from reproduction.fsio import atomic_write_text, remove_orphaned_staging
from reproduction.recap.normalize import ReturnRange
from reproduction.recap.value.config import ValueConfig, ValueSource, check_value_sources
from reproduction.recap.value.crossfit import CrossFitPlan, split_folds
from reproduction.recap.value.data import load_source, return_range_of, state_stats
from reproduction.value_export import EXPORT_FORMAT, HEAD_NAME

SETUP_NAME = "value_setup.json"


@dataclass(kw_only=True, slots=True)
class ValueSetup:
    """Resolved once by the driver; read by every worker and fold.

    On disk (value_setup.json) the config and the dataset lists share one `stage` object, as when they were one
    config: {config fields..., "train": [sources], "eval": [eval sources]}."""

    config: ValueConfig
    """The value model's config (the run config's value.model)."""
    sources: list[ValueSource]
    """The datasets it trains on."""
    eval_sources: list[ValueSource] = field(default_factory=list)
    """Extra evaluation datasets (all their episodes); held-out folds are always evaluated."""
    model_config: dict[str, Any]
    return_range: ReturnRange
    tokenizer_dir: str
    plan: CrossFitPlan
    fingerprints: dict[str, str] = field(default_factory=dict)
    """Training dataset name -> the fingerprint its frames and returns were read at (empty in older setups)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": {
                **self.config.to_dict(),
                "train": [s.to_dict() for s in self.sources],
                "eval": [s.to_dict() for s in self.eval_sources],
            },
            "model_config": self.model_config,
            "return_range": self.return_range.to_dict(),
            "tokenizer_dir": self.tokenizer_dir,
            "plan": self.plan.to_dict(),
            "fingerprints": dict(self.fingerprints),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ValueSetup:
        config, sources, eval_sources = split_stage(data["stage"])
        return cls(
            config=config,
            sources=sources,
            eval_sources=eval_sources,
            model_config=dict(data["model_config"]),
            return_range=ReturnRange.from_dict(data["return_range"]),
            tokenizer_dir=data["tokenizer_dir"],
            plan=CrossFitPlan.from_dict(data["plan"]),
            fingerprints=dict(data.get("fingerprints", {})),
        )


def split_stage(data: Mapping[str, Any]) -> tuple[ValueConfig, list[ValueSource], list[ValueSource]]:
    """(config, training sources, extra evaluation sources) of a setup's `stage` object ({ValueConfig fields...,
    "train": [...], "eval": [...]}, value_setup.json); unknown keys are refused by name."""
    stage = dict(data)
    sources = [ValueSource.from_dict(s) for s in stage.pop("train", [])]
    eval_sources = [ValueSource.from_dict(s) for s in stage.pop("eval", [])]
    return ValueConfig.from_dict(stage), sources, eval_sources


def prepare_value_setup(
    config: ValueConfig,
    out_dir: Path,
    *,
    sources: list[ValueSource],
    eval_sources: list[ValueSource] | None = None,
    datasets: Mapping[str, Any] | None = None,
    resume: bool = False,
) -> ValueSetup:
    """Tokenizer, model config, return range and fold plan of `config` trained on `sources` (evaluated on
    `eval_sources` too); written to `out_dir` (idempotent). ConfigError when `sources` is empty or dataset names
    repeat. `datasets` ({source name: opened Dataset}) are the sources' datasets as the caller opened them, read
    here instead of opening their paths again (the training workers open the paths the setup records).

    When a fold under `out_dir` already holds a complete checkpoint, the setup it was trained with
    is the one on disk: `resume=False` raises CheckpointError (as the trainer would, but before
    anything here is overwritten), and `resume=True` raises CheckpointError naming every setting
    that changed (return range, bins and model config, folds and fold plan, tokenizer, training
    datasets and their fingerprints, training knobs; eval-only settings may change). On any error
    the previous setup and tokenizer are left as they were. Also raises the data plane's errors
    for unreadable datasets or sidecars (fingerprints checked).
    """
    eval_sources = list(eval_sources or [])
    check_value_sources(sources, eval_sources)
    out_dir = Path(out_dir)
    trained = _trained_folds(out_dir)
    if trained and not resume:
        raise CheckpointError(
            f"{trained[0]} already holds checkpoints and resume is off",
            path=trained[0],
            hint="`portable run --resume` continues it; `--restart-stage value` trains it again from scratch",
        )
    datasets = dict(datasets or {})
    frames = [
        load_source(s, state_keys=config.state_keys, state_dims=config.state_dims, dataset=datasets.get(s.name))
        for s in sources
    ]
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = out_dir / f".tokenizer.{os.getpid()}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    remove_orphaned_staging(out_dir, ".tokenizer")  # a killed run's (its `finally` never ran)
    try:
        setup = _resolve_setup(
            config, sources, eval_sources, frames, staging, final_tokenizer_dir=out_dir / "tokenizer", datasets=datasets
        )
        if trained:
            _refuse_changed_setup(out_dir, setup, staging)
        tok_dir = out_dir / "tokenizer"
        shutil.rmtree(tok_dir, ignore_errors=True)
        os.replace(staging, tok_dir)
        atomic_write_text(out_dir / SETUP_NAME, json.dumps(setup.to_dict(), indent=1, sort_keys=True))
        atomic_write_text(out_dir / "crossfit.json", json.dumps(setup.plan.to_dict(), indent=1, sort_keys=True))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return setup


def _resolve_setup(
    stage: ValueConfig,
    sources: list[ValueSource],
    eval_sources: list[ValueSource],
    frames: list[Any],
    tok_dir: Path,
    *,
    final_tokenizer_dir: Path,
    datasets: Mapping[str, Any],
) -> ValueSetup:
    """The setup of `stage` over the loaded training `frames` (of `sources`); the tokenizer is written to `tok_dir`
    (it moves to `final_tokenizer_dir` once the setup is accepted)."""
    from reproduction.data.reader import open_dataset
    from reproduction.recap.tokenizer import load_tokenizer, train_tokenizer
    from reproduction.recap.value.model import preset_config

    if stage.return_min is not None:
        rr = ReturnRange(return_min=float(stage.return_min), return_max=float(stage.return_max))
    else:
        rr = return_range_of(frames)
    if stage.tokenizer:
        tok = load_tokenizer(Path(stage.tokenizer))
        tok.save_pretrained(str(tok_dir))
    else:
        opened = [datasets.get(s.name) or open_dataset(s.path) for s in sources + eval_sources]
        tasks = [t for ds in opened for t in ds.tasks.values()]
        tok = train_tokenizer(tasks, tok_dir)
    # Only `tiny` sizes its embedding from the tokenizer. `recap` keeps the checkpoint's 262,144 rows:
    # Gemma3's tokenizer.json adds specials past them (<image_soft_token> is id 262144), so len(tok)
    # would make strict loading of the real weights fail; prompts never use those ids (VocabGuard).
    mcfg = preset_config(
        stage.preset, vocab_size=len(tok) if stage.preset == "tiny" else None, cameras=tuple(stage.cameras)
    )
    mcfg.value_dropout = stage.value_dropout
    if stage.state_keys:  # the state token's width and normalisation, from all training frames
        mean, std = state_stats(frames)
        mcfg.state_dim, mcfg.state_mean, mcfg.state_std = len(mean), tuple(mean), tuple(std)
    plan = split_folds({f.source.name: np.unique(f.episode) for f in frames}, folds=stage.folds, seed=stage.fold_seed)
    return ValueSetup(
        config=stage,
        sources=list(sources),
        eval_sources=list(eval_sources),
        model_config=mcfg.to_dict(),
        return_range=rr,
        tokenizer_dir=str(Path(final_tokenizer_dir).resolve()),
        plan=plan,
        fingerprints={f.source.name: f.fingerprint for f in frames},
    )


def _trained_folds(out_dir: Path) -> list[Path]:
    """`model_<k>/checkpoints` folders under `out_dir` that hold a complete checkpoint."""
    from reproduction.train.checkpoint import complete_steps

    return [p for p in sorted(Path(out_dir).glob("model_*/checkpoints")) if complete_steps(p)]


def _refuse_changed_setup(out_dir: Path, new: ValueSetup, new_tokenizer: Path) -> None:
    """CheckpointError naming what differs between the setup on disk and `new` (nothing if equal)."""
    path = Path(out_dir) / SETUP_NAME
    if not path.is_file():
        raise CheckpointError(
            f"cannot resume {out_dir}: it holds checkpoints but no {SETUP_NAME} says what they were trained with",
            path=path,
            hint="`portable run --restart-stage value` trains it again from scratch",
        )
    old = read_setup(path)
    changes = setup_changes(old, new, old_tokenizer=Path(out_dir) / "tokenizer", new_tokenizer=new_tokenizer)
    if changes:
        raise CheckpointError(
            f"cannot resume {out_dir}: the value setup changed since its checkpoints were written "
            f"({'; '.join(changes)})",
            path=path,
            fields_changed=[c.split(" ", 1)[0] for c in changes],
            hint="restore those settings, or `portable run --restart-stage value` to train it again with the new ones",
        )


RESUME_FREE = resume_free_fields(ValueConfig)
"""Config fields a resume may change: declared `same_outputs(on_resume=True)` on ValueConfig (they only shape
evaluation, or a fresh start's initialisation, or name where things are whose contents setup_changes compares).
Of the datasets only the training ones count (not the extra evaluation ones)."""


def setup_changes(old: ValueSetup, new: ValueSetup, *, old_tokenizer: Path, new_tokenizer: Path) -> list[str]:
    """`what old -> new` for every training-relevant difference between two setups, in a fixed order.

    Return range, model config (bins, v_min/v_max, sizes, vocab, cameras), folds and fold plan, the
    tokenizer's tokenizer.json bytes, the training datasets (name, type, weight, tag; not paths)
    and their fingerprints, and the remaining stage knobs outside `RESUME_FREE`.
    """
    from reproduction.digests import sha256_file

    changes = []
    if old.return_range != new.return_range:
        changes.append(f"return_range {old.return_range.to_dict()} -> {new.return_range.to_dict()}")
    changes += _dict_changes("model_config", old.model_config, new.model_config)
    if old.plan.folds != new.plan.folds:
        changes.append(f"folds {old.plan.folds} -> {new.plan.folds}")
    elif old.plan.seed != new.plan.seed:
        changes.append(f"fold_seed {old.plan.seed} -> {new.plan.seed}")
    else:
        moved = sorted(
            n
            for n in set(old.plan.assignment) | set(new.plan.assignment)
            if old.plan.assignment.get(n) != new.plan.assignment.get(n)
        )
        if moved:
            changes.append(f"fold_plan: the episodes of {moved} differ")
    digests = [
        sha256_file(Path(d) / "tokenizer.json") if (Path(d) / "tokenizer.json").is_file() else "missing"
        for d in (old_tokenizer, new_tokenizer)
    ]
    if digests[0] != digests[1]:
        changes.append(f"tokenizer tokenizer.json sha256 {digests[0][:12]} -> {digests[1][:12]}")
    for name in sorted(set(old.fingerprints) & set(new.fingerprints)):
        if old.fingerprints[name] != new.fingerprints[name]:
            changes.append(
                f"fingerprint of dataset {name!r} {old.fingerprints[name][:12]} -> {new.fingerprints[name][:12]}"
            )
    changes += _dict_changes("value", _resume_fields(old), _resume_fields(new))
    return changes


SOURCE_RESUME_FREE = resume_free_fields(ValueSource)
"""Training-dataset fields a resume may change: where the dataset and its returns are (declared
`same_outputs(on_resume=True)` on ValueSource: setup_changes compares the fingerprints of what they hold)."""


def _resume_fields(setup: ValueSetup) -> dict[str, Any]:
    out = {k: v for k, v in setup.config.to_dict().items() if k not in RESUME_FREE}
    out["train"] = [{k: v for k, v in s.to_dict().items() if k not in SOURCE_RESUME_FREE} for s in setup.sources]
    return out


def _dict_changes(prefix: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """`prefix.key old -> new` per differing key, recursing into nested dicts."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out += _dict_changes(f"{prefix}.{key}", a, b)
        elif a != b:
            out.append(f"{prefix}.{key} {a!r} -> {b!r}")
    return out


def read_setup(path: Path) -> ValueSetup:
    return ValueSetup.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))


def head_metadata(setup: ValueSetup, fold: int) -> dict[str, Any]:
    """`value_head.json` of an export: everything stage 3 needs besides the weights."""
    cfg = setup.model_config
    return {
        "format_version": EXPORT_FORMAT,
        "model_config": cfg,
        "return_range": setup.return_range.to_dict(),
        "num_bins": cfg["num_bins"],
        "v_min": cfg["v_min"],
        "v_max": cfg["v_max"],
        "cameras": dict(setup.config.cameras),
        "state_keys": list(setup.config.state_keys),
        "state_dims": None if setup.config.state_dims is None else list(setup.config.state_dims),
        "max_token_len": setup.config.max_token_len,
        "fold": fold,
        "folds": setup.plan.folds,
        "tokenizer": "tokenizer",
    }


def write_export_extras(folder: Path, *, setup: ValueSetup, fold: int) -> None:
    """Writes value_head.json and a copy of the tokenizer next to the trainer's model export."""
    atomic_write_text(Path(folder) / HEAD_NAME, json.dumps(head_metadata(setup, fold), indent=1, sort_keys=True))
    shutil.copytree(setup.tokenizer_dir, Path(folder) / "tokenizer", dirs_exist_ok=True)


@dataclass(kw_only=True, slots=True)
class VocabGuard:
    """Wraps a ValueCollator: its batches never hold a token id the embedding has no row for.

    A tokenizer with more tokens than the model's vocab_size (Gemma3's adds specials past the
    checkpoint's rows) is fine until a prompt encodes to one of them; then this raises a one-line
    ConfigError naming the tokenizer file, the id, its token and the vocab size, instead of an
    IndexError from inside the embedding. Checked on the CPU batch, before any device work.
    """

    collate: Any
    """The ValueCollator (has `.tokenizer`)."""
    vocab_size: int
    """Rows of the model's token embedding."""
    tokenizer_file: str
    """The tokenizer.json the ids came from (for the message)."""

    def __call__(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        batch = self.collate(samples)
        ids = batch["input_ids"]
        if ids.numel() and int(ids.max()) >= self.vocab_size:
            bad = int(ids.max())
            token = self.collate.tokenizer.convert_ids_to_tokens(bad)
            raise ConfigError(
                f"tokenizer {self.tokenizer_file}: a prompt encodes to token id {bad} ({token!r}), "
                f"outside the value model's vocab_size {self.vocab_size}",
                path=self.tokenizer_file,
                field="vocab_size",
                hint="use the tokenizer the model was trained with, or keep that token out of the prompts",
            )
        return batch

    @property
    def tokenizer(self) -> Any:
        return self.collate.tokenizer


# -- inside each worker ---------------------------------------------------------------------------


def make_value_task(rank: int, world_size: int, *, setup_path: str, fold: int = 0) -> Any:
    """The trainer's factory (bind with functools.partial): a TrainTask for fold `fold` of the setup."""
    import functools

    from reproduction.recap.tokenizer import load_tokenizer
    from reproduction.recap.value.data import ValueCollator, ValueFrames, augment_sample
    from reproduction.recap.value.model import ValueModelConfig, build_value_model
    from reproduction.recap.value.weights import load_pretrained
    from reproduction.train.task import TrainTask

    setup = read_setup(Path(setup_path))
    stage, rr = setup.config, setup.return_range
    mcfg = ValueModelConfig.from_dict(setup.model_config)
    model = build_value_model(mcfg, seed=stage.model_seed)
    if stage.pretrained_manifest:
        load_pretrained(
            model, Path(stage.pretrained_manifest), Path(stage.weights_dir or "."), allow_unpinned=stage.allow_unpinned
        )
    frames = [
        load_source(
            s,
            episodes=setup.plan.train_episodes(fold, s.name),
            state_keys=stage.state_keys,
            state_dims=stage.state_dims,
        )
        for s in setup.sources
    ]
    train_set = ValueFrames(
        frames,
        cameras=stage.cameras,
        image_size=mcfg.image_size,
        return_range=rr,
        balance_weights=stage.balance_weights,
        seed=stage.fold_seed,
    )
    collate = VocabGuard(
        collate=ValueCollator(
            tokenizer=load_tokenizer(Path(setup.tokenizer_dir)),
            slots=mcfg.cameras,
            image_size=mcfg.image_size,
            max_token_len=stage.max_token_len,
        ),
        vocab_size=int(mcfg.text["vocab_size"]),
        tokenizer_file=str(Path(setup.tokenizer_dir) / "tokenizer.json"),
    )
    eval_sets = _eval_sets(setup, fold, mcfg.image_size)
    return TrainTask(
        model=model,
        train_dataset=train_set,
        collate=collate,
        loss=functools.partial(value_batch_loss, v_min=mcfg.v_min, v_max=mcfg.v_max),
        evaluate=functools.partial(
            evaluate_value,
            sets=eval_sets,
            collate=collate,
            micro_batch=stage.eval_micro_batch,
            v_min=mcfg.v_min,
            v_max=mcfg.v_max,
        )
        if eval_sets
        else None,
        param_groups=functools.partial(value_param_groups, value_lr=stage.value_lr),
        augment=augment_sample if stage.augment else None,
        fsdp_units=transformer_blocks,
        export_extras=functools.partial(write_export_extras, setup=setup, fold=fold),
        model_config=mcfg.to_dict(),
    )


def _eval_sets(setup: ValueSetup, fold: int, image_size: int) -> dict[str, Any]:
    """name -> ValueFrames: the held-out fold of each train dataset (folds > 1) and every eval dataset."""
    from reproduction.recap.value.data import ValueFrames

    stage = setup.config
    sources = []
    if setup.plan.folds > 1:
        sources += [(f"{s.name}.heldout", s, setup.plan.heldout_episodes(fold, s.name)) for s in setup.sources]
    sources += [(s.name, s, None) for s in setup.eval_sources]
    out = {}
    for name, src, episodes in sources:
        frames = load_source(src, episodes=episodes, state_keys=stage.state_keys, state_dims=stage.state_dims)
        if len(frames) > stage.eval_max_samples:  # an evenly strided, deterministic subset
            keep = np.linspace(0, len(frames) - 1, stage.eval_max_samples).round().astype(np.int64)
            for attr in ("rows", "episode", "frame", "returns", "prompt_id", "state"):
                if getattr(frames, attr) is not None:
                    setattr(frames, attr, getattr(frames, attr)[keep])
        out[name] = ValueFrames([frames], cameras=stage.cameras, image_size=image_size, return_range=setup.return_range)
    return out


def transformer_blocks(model: Any) -> list[Any]:
    """FSDP2 units: every SigLIP encoder layer and every Gemma3 decoder layer (then the root)."""
    return list(model.vision.encoder.layers) + list(model.language.layers)


def value_param_groups(model: Any, *, value_lr: float) -> list[dict[str, Any]]:
    """RECAP.md 2.4: parameters named `value_head` (projection + query) at value_lr; everything
    else (towers, image projector) at the trainer's lr. Groups are never empty-named silently."""
    head = [p for n, p in model.named_parameters() if "value_head" in n and p.requires_grad]
    rest = [p for n, p in model.named_parameters() if "value_head" not in n and p.requires_grad]
    return [{"params": head, "lr": value_lr, "name": "value_head"}, {"params": rest, "name": "backbone"}]


def _forward(model: Any, batch: Mapping[str, Any]) -> Any:
    return model(
        images=batch["images"],
        image_masks=batch["image_masks"],
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        state=batch.get("state"),
    )


def value_batch_loss(
    model: Any, batch: Mapping[str, Any], *, v_min: float, v_max: float
) -> tuple[Any, dict[str, float]]:
    """Two-hot cross-entropy (mean over the micro batch) and upstream's per-batch metrics.

    No per-batch Spearman: over a micro batch it is noise (RECAP.md 7 item 10); eval has the real one.
    """
    from reproduction.recap.value.loss import batch_metrics, expected_value, value_loss

    logits = _forward(model, batch)
    loss = value_loss(logits, batch["target"], v_min=v_min, v_max=v_max)
    metrics = batch_metrics(logits.detach(), batch["target"], v_min=v_min, v_max=v_max)
    pred = expected_value(logits.detach(), v_min=v_min, v_max=v_max)
    metrics["predicted_value_mean"] = float(pred.mean())
    metrics["target_value_mean"] = float(batch["target"].float().mean())
    return loss, metrics


def evaluate_value(
    model: Any, ctx: Any, *, sets: Mapping[str, Any], collate: Any, micro_batch: int, v_min: float, v_max: float
) -> dict[str, float]:
    """Per eval set: loss and batch metrics averaged over frames, Spearman (tie-averaged) and
    mean/std over the WHOLE set (arrays gathered from all ranks), keys `<set>/<metric>`; plus the
    unprefixed mean over sets. Every rank runs the same number of forwards (FSDP needs it): ranks
    with fewer frames repeat their first frame and drop the result. No frame is counted twice.
    """
    import torch

    from reproduction.recap.value.loss import batch_metrics, expected_value, set_metrics, two_hot
    from reproduction.train.loop import to_device

    out: dict[str, float] = {}
    for name in sorted(sets):
        data = sets[name]
        mine = ctx.shard(len(data))
        longest = -(-len(data) // ctx.world_size)
        steps = -(-longest // micro_batch)
        preds, targets, losses, per = [], [], [], {}
        for b in range(steps):
            idx = list(mine[b * micro_batch : (b + 1) * micro_batch])
            real = len(idx)
            batch = collate([data[i] for i in (idx or [0])])
            batch = to_device(batch, ctx.device)
            logits = _forward(model, batch)[:real]
            if not real:
                continue
            target = batch["target"][:real]
            probs, _, _, _ = two_hot(target, num_bins=logits.shape[-1], v_min=v_min, v_max=v_max)
            nll = -(probs.float() * torch.log_softmax(logits.float(), -1)).sum(-1)
            losses.append(nll.cpu().numpy())
            for k, v in batch_metrics(logits, target, v_min=v_min, v_max=v_max).items():
                per[k] = per.get(k, 0.0) + v * real
            preds.append(expected_value(logits, v_min=v_min, v_max=v_max).cpu().numpy())
            targets.append(target.float().cpu().numpy())
        n_mine = len(mine)
        sums = np.array(
            [
                [per.get(k, 0.0) for k in ("cat_acc_best", "cat_acc_neighbor", "bin_distance", "value_error")]
                + [float(np.concatenate(losses).sum()) if losses else 0.0, n_mine]
            ],
            dtype=np.float64,
        )
        total = ctx.all_gather(sums).sum(axis=0)
        pred = ctx.all_gather(np.concatenate(preds).astype(np.float64) if preds else np.zeros(0))
        target = ctx.all_gather(np.concatenate(targets).astype(np.float64) if targets else np.zeros(0))
        count = max(total[-1], 1.0)
        metrics = dict(
            zip(("cat_acc_best", "cat_acc_neighbor", "bin_distance", "value_error", "loss"), total[:5] / count)
        )
        metrics.update(set_metrics(pred, target, v_min=v_min, v_max=v_max))
        metrics["num_frames"] = float(total[-1])
        out.update({f"{name}/{k}": float(v) for k, v in metrics.items()})
    for key in sorted({k.split("/", 1)[1] for k in out}):
        out[key] = float(np.mean([out[f"{n}/{key}"] for n in sets]))
    return out
