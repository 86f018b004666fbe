"""Stage 4's setup, written by the driver before training: the flat arrays, normalisation stats, tokenizer and
model config (policy_setup.json, frames.npz, tokenizer/), and the check that refuses to resume over a changed one.

The driver reads the opened inputs once (labels joined and checked there) and writes the arrays; workers only load
them (batches.py), so every rank trains on exactly what was checked.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from reproduction.config_fields import added_defaults, resume_free_fields
from reproduction.errors import CheckpointError
from reproduction.fsio import atomic_write_text, remove_orphaned_staging
from reproduction.recap.policy.config import ARRAYS_NAME, EXPORT_FORMAT, SETUP_NAME, PolicyConfig, check_mode
from reproduction.train.config import RESUME_KEY_FIELDS, trained_with


def prepare_policy_setup(
    inputs: Sequence[Any], config: PolicyConfig, out_dir: Path, *, mode: str, train: Any, resume: bool
) -> dict:
    """Arrays, stats, tokenizer and model config of the `mode` policy of `config` trained by `train` (a TrainConfig)
    on the opened `inputs`, written to `out_dir` (module docstring); returns the setup. Its `stage` holds config's
    fields, `mode` and `train` (TrainConfig's fields), as when they were one config.

    Checks against an existing run first (see `train_policy`); on refusal nothing is written. ConfigError for a mode
    that is not one of conditioning.MODES.
    """
    from reproduction.recap.policy.data import build_arrays, state_stats
    from reproduction.recap.policy.model import tiny_config
    from reproduction.train.checkpoint import complete_steps

    check_mode(mode)
    out_dir = Path(out_dir)
    trained = bool(complete_steps(out_dir / "checkpoints"))
    if trained and not resume:
        raise CheckpointError(
            f"{out_dir / 'checkpoints'} already holds checkpoints and resume is off",
            path=out_dir / "checkpoints",
            hint="`portable run --resume` continues it; `--restart-stage policy` trains it again from scratch",
        )
    arrays, summary = build_arrays(inputs, mode=mode, chunk=config.chunk, hold_labels=config.hold_labels)
    stats = _stats(config, arrays, state_stats(arrays))
    staging = out_dir / f".tokenizer.{os.getpid()}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    remove_orphaned_staging(out_dir, ".tokenizer")  # a killed run's (its `finally` never ran)
    try:
        tok = _tokenizer(config, arrays.tasks, staging)
        if config.preset == "pi05":
            from reproduction.recap.policy.pi05 import pi05_config

            mcfg = pi05_config(
                state_dim=arrays.state.shape[1],
                action_dim=arrays.action.shape[1],
                chunk=config.chunk,
                cameras=tuple(config.cameras),
            )
        else:
            mcfg = tiny_config(
                vocab_size=len(tok),
                state_dim=arrays.state.shape[1],
                action_dim=arrays.action.shape[1],
                chunk=config.chunk,
                cameras=tuple(config.cameras),
                image_size=config.image_size,
                width=config.width,
                prefix_layers=config.prefix_layers,
                expert_layers=config.expert_layers,
            )
        setup = {
            "format_version": EXPORT_FORMAT,
            # JSON's own types (TrainConfig's betas a list), as the resume check reads them back
            # of the trainer only what changes what is trained (its resume key, and max_steps): a same_outputs() one
            # (intervals, workers, device) made this output's bytes follow it (audit62 K); the guard reads no other
            "stage": json.loads(json.dumps({"mode": mode, **config.to_dict(), "train": trained_with(train)})),
            "model_config": mcfg.to_dict(),
            "stats": stats,
            "tasks": list(arrays.tasks),
            "sources": [
                {"name": i.source.name, "path": str(Path(i.source.path).resolve()), "type": i.source.type}
                for i in inputs
            ],
            "fingerprints": {i.source.name: i.fingerprint for i in inputs},
            "arrays_sha256": _arrays_digest(arrays),
            "summary": summary,
            "tokenizer_dir": str((out_dir / "tokenizer").resolve()),
        }
        if trained:
            _refuse_changed(out_dir, setup, staging)
        tok_dir = out_dir / "tokenizer"
        shutil.rmtree(tok_dir, ignore_errors=True)
        os.replace(staging, tok_dir)
        arrays.save(out_dir / ARRAYS_NAME)
        atomic_write_text(out_dir / SETUP_NAME, json.dumps(setup, indent=1, sort_keys=True))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return setup


def _stats(config: PolicyConfig, arrays: Any, zscore: dict[str, Any]) -> dict[str, Any]:
    """The setup's normalisation stats (normalize.py): the z-score ones alone (tiny: as always), or with the quantile
    norm also `norm` and q01/q99 from `config.norm_stats` (openpi's norm_stats.json) or the training frames."""
    from reproduction.recap.policy.normalize import default_norm, quantile_stats, read_norm_stats

    if (config.norm or default_norm(config.preset)) != "quantile":
        return zscore
    if config.norm_stats:
        q = read_norm_stats(config.norm_stats, state_dim=arrays.state.shape[1], action_dim=arrays.action.shape[1])
    else:
        q = quantile_stats(arrays.state, arrays.action[np.unique(arrays.chunk)])
    return {**zscore, "norm": "quantile", **q}


def _tokenizer(config: PolicyConfig, tasks: list[str], out: Path) -> Any:
    from reproduction.recap.policy.conditioning import KINDS, prompt_text
    from reproduction.recap.tokenizer import load_tokenizer, train_tokenizer

    if config.tokenizer:
        tok = load_tokenizer(Path(config.tokenizer))
        tok.save_pretrained(str(out))
        return tok
    return train_tokenizer([prompt_text(t, k) for t in tasks for k in range(len(KINDS))], out)


def _arrays_digest(arrays: Any) -> str:
    h = hashlib.sha256()
    for name in ("state", "chunk", "action", "label", "task_id", "source", "row"):
        h.update(np.ascontiguousarray(getattr(arrays, name)).tobytes())
    h.update(json.dumps(arrays.tasks).encode())
    return h.hexdigest()


RESUME_FREE = resume_free_fields(PolicyConfig)
"""Config fields a resume may change (they shape neither the model nor the data stream): declared
`same_outputs()` (with or without on_resume) on PolicyConfig. Of the trainer's fields only its resume key counts
(train/config.py's RESUME_KEY_FIELDS: those not declared `same_outputs()`, and not max_steps, which a resume raises).
"""


def _refuse_changed(out_dir: Path, new: dict, new_tokenizer: Path) -> None:
    path = out_dir / SETUP_NAME
    if not path.is_file():
        raise CheckpointError(
            f"cannot resume {out_dir}: it holds checkpoints but no {SETUP_NAME}",
            path=path,
            hint="`portable run --restart-stage policy` trains it again from scratch",
        )
    old = json.loads(path.read_text(encoding="utf-8"))
    changes = []
    if old["model_config"].get("preset") != new["model_config"].get("preset"):
        changes.append(f"preset {old['model_config'].get('preset')!r} -> {new['model_config'].get('preset')!r}")
    for key in ("model_config", "stats", "tasks", "fingerprints", "arrays_sha256"):
        if key == "model_config" and changes:
            continue
        if old.get(key) != new.get(key):
            changes.append(f"{key} differs")
    if old["model_config"].get("preset") == "pi05" and "discrete_state_input" not in old["stage"]:
        # written before openpi's prompt: its checkpoints read the state text (clipped bins), which no field gives now
        changes.append("pi05 prompt: the checkpoints were trained on the state text this version no longer writes")
    # a setup written before a field was added ran its default (config_fields.added_field)
    old_stage = {k: v for k, v in {**added_defaults(PolicyConfig), **old["stage"]}.items() if k not in RESUME_FREE}
    new_stage = {k: v for k, v in new["stage"].items() if k not in RESUME_FREE}
    old_train = {k: v for k, v in old_stage.pop("train").items() if k in RESUME_KEY_FIELDS}
    new_train = {k: v for k, v in new_stage.pop("train").items() if k in RESUME_KEY_FIELDS}
    for key in sorted(set(old_stage) | set(new_stage)):
        if old_stage.get(key) != new_stage.get(key):
            changes.append(f"{key} {old_stage.get(key)!r} -> {new_stage.get(key)!r}")
    for key in sorted(set(old_train) | set(new_train)):
        if old_train.get(key) != new_train.get(key):
            changes.append(f"train.{key} {old_train.get(key)!r} -> {new_train.get(key)!r}")
    old_tok, new_tok = out_dir / "tokenizer" / "tokenizer.json", new_tokenizer / "tokenizer.json"
    if old_tok.is_file() and new_tok.is_file() and old_tok.read_bytes() != new_tok.read_bytes():
        changes.append("tokenizer differs")
    if changes:
        raise CheckpointError(
            f"cannot resume {out_dir}: the policy setup changed since its checkpoints were written "
            f"({'; '.join(changes)})",
            path=path,
            hint="restore those settings, or `portable run --restart-stage policy` to train it again with the new ones",
        )
