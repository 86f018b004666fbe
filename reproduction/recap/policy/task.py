"""Stage 4: `train_policy` (setup, then the trainer), `make_policy_task` for the trainer, the loss and the export.

    <out>/policy_setup.json    stage config, model config, normalisation stats, tasks, fingerprints, data summary
    <out>/frames.npz           the flat training arrays (recap/policy/data.py)
    <out>/tokenizer/           the prompt tokenizer (trained in-process for `tiny`)
    <out>/checkpoints/ metrics.jsonl tensorboard/   the trainer's (reproduction/train)
    <out>/export/              model.safetensors, model_config.json, policy.json, tokenizer/  (load_policy reads it)

The policy's config is config.py's (the mode and the trainer's TrainConfig come beside it), the driver's setup
setup.py's (written once, checked on resume), the workers' samples and batches batches.py's. Camera frames (when
the preset reads images) are read in the workers from the dataset paths, after checking the fingerprint. Prompt
routing draws from the trainer's per-sample uniforms, flow-matching noise and time from torch's RNG, which
checkpoints save: a resumed run is bit-identical.
"""

from __future__ import annotations

import functools
import json
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reproduction.errors import ConfigError
from reproduction.fsio import atomic_write_text
from reproduction.recap.policy.batches import PolicyBatcher, PolicyCollator, PolicySamples, RouteAugment
from reproduction.recap.policy.config import (  # noqa: F401 (re-exported: callers outside the tree import them here)
    ARRAYS_NAME,
    EXPORT_FORMAT,
    EXPORT_META,
    SETUP_NAME,
    PolicyConfig,
    check_policy_values,
)
from reproduction.recap.policy.setup import prepare_policy_setup


@dataclass(kw_only=True)
class PolicyResult:
    """What stage 4 produced."""

    export_dir: Path
    checkpoint_dir: Path
    step: int
    resumed_from: int | None
    train_metrics: dict[str, float]
    resumed_from_dir: Path | None = None
    """The checkpoint folder it loaded (TrainResult.resumed_from_dir)."""
    resumed_from_sha256: str | None = None
    """Its tree digest as loaded (TrainResult.resumed_from_sha256)."""
    samples_per_s: float
    summary: dict[str, Any]
    """Data summary: frames, episodes, successes and positive fractions per dataset."""
    files: list[Path] = field(default_factory=list)
    """Files written that the runner records (setup, arrays, export files)."""


def train_policy(
    inputs: Sequence[Any],
    config: PolicyConfig,
    out_dir: Path,
    *,
    mode: str,
    train: Any,
    resume: bool = False,
    ray_address: str | None = None,
    ui: Any = None,
    writers_lock: Path | None = None,
    batch_key: str = "global_batch",
) -> PolicyResult:
    """Train the `mode` policy (recap, bc or filtered_bc) of `config` with the trainer's `train` (a TrainConfig) on
    the opened `inputs` (data.open_policy_input) into `out_dir`.

    `resume=True` continues from the newest complete checkpoint; a setup that changed since (mode,
    preset, model, data, labels, normalisation, training knobs) is refused with CheckpointError
    (exit 50) naming what changed, before anything is written. `resume=False` over existing
    checkpoints is refused the same way. Raises DatasetError (40) for inputs without what the mode
    needs, and what the trainer raises (ConfigError, CheckpointError, WorkerFailedError). A training set smaller than
    one global batch (filtered_bc keeps only the successful episodes' frames) is a ConfigError naming the mode and
    `batch_key`, the run config's key of train.global_batch (RECAP's `policy.train.global_batch`), before training.
    """
    from reproduction.train.api import train as run_trainer

    out_dir = Path(out_dir)
    setup = prepare_policy_setup(inputs, config, out_dir, mode=mode, train=train, resume=resume)
    samples = int(setup["summary"]["frames"])
    if samples < train.global_batch:  # the trainer's own refusal names no stage and no section (audit65_E M1)
        kept = " (the frames of successful episodes)" if mode == "filtered_bc" else ""
        stage = batch_key.split(".")[0] if "." in batch_key else "policy"  # GRPO's sft stage trains it too
        raise ConfigError(
            f"{stage} stage ({mode}): the training set has {samples} samples{kept}, fewer than "
            f"{batch_key}={train.global_batch}",
            field=batch_key,
            hint=f"lower {batch_key} to at most {samples} (a multiple of the micro batch x world_size), or add data",
        )
    result = run_trainer(
        functools.partial(make_policy_task, setup_path=str((out_dir / SETUP_NAME).resolve())),
        train,
        out_dir=out_dir,
        resume=resume,
        ray_address=ray_address,
        ui=ui,
        writers_lock=writers_lock,
    )
    files = [out_dir / SETUP_NAME, out_dir / ARRAYS_NAME] + sorted(
        p for p in result.export_dir.rglob("*") if p.is_file()
    )
    return PolicyResult(
        export_dir=result.export_dir,
        checkpoint_dir=result.checkpoint_dir,
        step=result.step,
        resumed_from=result.resumed_from,
        resumed_from_dir=result.resumed_from_dir,
        resumed_from_sha256=result.resumed_from_sha256,
        train_metrics=result.train_metrics,
        samples_per_s=result.samples_per_s,
        summary=setup["summary"],
        files=files,
    )


def policy_loss(model: Any, batch: Mapping[str, Any], *, image_augment: bool = False) -> tuple[Any, dict[str, float]]:
    """pi0 flow matching (flow.py): noise and time from torch's RNG; metrics by prompt kind. `image_augment`: the
    batch's camera images first go through openpi's train-time augmentation (augment.py; drawn before the noise and
    time, as openpi's forward draws them)."""
    import torch

    from reproduction.recap.policy.flow import interpolate, sample_time

    if image_augment and batch.get("images"):
        from reproduction.recap.policy.augment import with_augmented_images

        batch = with_augmented_images(dict(batch))
    actions = batch["actions"]
    noise = torch.randn(actions.shape, dtype=actions.dtype, device=actions.device)
    t = sample_time(actions.shape[0], device=actions.device)
    x_t, target = interpolate(actions, noise, t)
    v = model(batch, x_t, t)
    per = (v.float() - target.float()).pow(2).mean(dim=(1, 2))
    loss = per.mean()
    kind = batch["kind"]
    metrics = {
        "conditioned_fraction": float((kind != 0).float().mean()),
        "positive_label_fraction": float(batch["label"].float().mean()),
    }
    return loss, metrics


def make_policy_task(rank: int, world_size: int, *, setup_path: str) -> Any:
    """The trainer's factory (bind with functools.partial): the TrainTask of the setup at `setup_path`."""
    from reproduction.recap.policy.data import PolicyArrays
    from reproduction.recap.policy.model import PolicyModelConfig, build_policy_model
    from reproduction.recap.policy.pi05 import prompt_style
    from reproduction.recap.tokenizer import load_tokenizer
    from reproduction.train.task import TrainTask

    setup = json.loads(Path(setup_path).read_text(encoding="utf-8"))
    stage = dict(setup["stage"])
    mode = stage.pop("mode")
    stage.pop("train")
    stage = PolicyConfig.from_dict(stage)
    mcfg = PolicyModelConfig.from_dict(setup["model_config"])
    arrays = PolicyArrays.load(Path(setup_path).parent / ARRAYS_NAME)
    model = build_policy_model(mcfg, seed=stage.model_seed)
    if stage.pretrained_manifest:  # e.g. the demo's bundled tiny weights; a resume then loads its checkpoint
        from reproduction.recap.value.weights import load_pretrained

        load_pretrained(model, Path(stage.pretrained_manifest), Path(stage.weights_dir or "."))
    data = PolicySamples(
        arrays,
        setup["stats"],
        cameras=stage.cameras,
        sources=setup["sources"],
        fingerprints=setup["fingerprints"],
        image_size=mcfg.image_size,
    )
    collate = PolicyCollator(
        load_tokenizer(Path(setup["tokenizer_dir"])),
        setup["tasks"],
        cameras=mcfg.cameras,
        image_size=mcfg.image_size,
        action_dim=mcfg.action_dim,
        prompt=prompt_style(mcfg.preset, stage.discrete_state_input),
    )
    augment = (
        RouteAugment(mode=mode, dropout=stage.condition_dropout, positive_only=stage.positive_only)
        if mode == "recap"
        else None
    )
    fast = not mcfg.cameras and mcfg.preset != "pi05"
    return TrainTask(
        model=model,
        train_dataset=data,
        collate=collate,
        loss=_loss(stage, mcfg),
        augment=augment,
        make_batch=PolicyBatcher(samples=data, collator=collate, augment=augment) if fast else None,
        fsdp_units=policy_blocks,
        export_extras=functools.partial(write_export_extras, setup=setup),
        model_config=mcfg.to_dict(),
    )


def _loss(stage: PolicyConfig, mcfg: Any) -> Any:
    """policy_loss, with openpi's image augmentation when the policy reads cameras and `image_augment` (None: the
    preset's default, augment.py) says so; policy_loss itself otherwise (tiny's default: the loss it always ran)."""
    from reproduction.recap.policy.augment import default_image_augment

    on = stage.image_augment if stage.image_augment is not None else default_image_augment(mcfg.preset)
    return functools.partial(policy_loss, image_augment=True) if on and mcfg.cameras else policy_loss


def policy_blocks(model: Any) -> list[Any]:
    """FSDP2 units: transformer layers of every tower (vision, prefix language, expert)."""
    if hasattr(model, "fsdp_units"):
        return model.fsdp_units()
    units = list(model.language.layers) + list(model.expert)
    if model.vision is not None:
        units = list(model.vision.encoder.layers) + units
    return units


def export_metadata(setup: Mapping[str, Any]) -> dict[str, Any]:
    """`policy.json`: what load_policy needs besides the weights (the normalisation rides in `stats`: normalize.py)."""
    from reproduction.recap.policy.pi05 import prompt_style

    stage = setup["stage"]
    return (
        {
            "format_version": EXPORT_FORMAT,
            "preset": setup["model_config"]["preset"],
            "mode": stage["mode"],
            "positive_only": stage["positive_only"],
            "condition_dropout": stage["condition_dropout"],
            "chunk": stage["chunk"],
            "execute_steps": stage["execute_steps"],
            "num_steps": stage["num_steps"],
            "cameras": dict(stage["cameras"]),
            "stats": setup["stats"],
            "tasks": setup["tasks"],
            "tokenizer": "tokenizer",
            "fingerprints": setup["fingerprints"],
        }
        | (  # only when set, so an export reading observation.state ++ observation.goal keeps its bytes
            {"state_keys": list(stage["state_keys"]), "state_dims": stage.get("state_dims")}
            if stage.get("state_keys")
            else {}
        )
        | (  # pi05 only (tiny exports keep their bytes); absent in a pi05 export = pi05_state_clipped (pi05.PROMPTS)
            {"prompt": prompt_style("pi05", bool(stage.get("discrete_state_input", False)))}
            if setup["model_config"]["preset"] == "pi05"
            else {}
        )
    )


def write_export_extras(folder: Path, *, setup: Mapping[str, Any]) -> None:
    atomic_write_text(Path(folder) / EXPORT_META, json.dumps(export_metadata(setup), indent=1, sort_keys=True))
    shutil.copytree(setup["tokenizer_dir"], Path(folder) / "tokenizer", dirs_exist_ok=True)
