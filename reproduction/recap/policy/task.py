"""Stage 4 wiring: `PolicyStageConfig`, the driver's setup, `make_policy_task` for the trainer and `train_policy`.

    <out>/policy_setup.json    stage config, model config, normalisation stats, tasks, fingerprints, data summary
    <out>/frames.npz           the flat training arrays (recap/policy/data.py)
    <out>/tokenizer/           the prompt tokenizer (trained in-process for `tiny`)
    <out>/checkpoints/ metrics.jsonl tensorboard/   the trainer's (reproduction/train)
    <out>/export/              model.safetensors, model_config.json, policy.json, tokenizer/  (load_policy reads it)

The driver reads the opened inputs once (labels joined and checked there) and writes the arrays;
workers only load them, so every rank trains on exactly what was checked. Camera frames (when the
preset reads images) are read in the workers from the dataset paths, after checking the fingerprint.
Prompt routing (conditioning.py) draws from the trainer's per-sample uniforms (seed, epoch, position),
flow-matching noise and time from torch's RNG, which checkpoints save: a resumed run is bit-identical.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from reproduction.config_fields import reject_unknown_fields, resume_free_fields, same_outputs
from reproduction.errors import CheckpointError, ConfigError
from reproduction.fsio import atomic_write_text
from reproduction.recap.policy.conditioning import MODES

SETUP_NAME = "policy_setup.json"
ARRAYS_NAME = "frames.npz"
EXPORT_META = "policy.json"
EXPORT_FORMAT = 1


@dataclass(kw_only=True, slots=True)
class PolicyStageConfig:
    """What stage 4 trains and how; the trainer's knobs are `train` (a TrainConfig dict)."""

    mode: str = "recap"
    """recap (advantage-conditioned, CFG at inference), bc (no conditioning, all data), filtered_bc
    (no conditioning, successful episodes only). Same model, same steps."""
    preset: str = "tiny"
    """tiny (CPU) or pi05 (lerobot PI05Policy's architecture and keys)."""
    cameras: dict[str, str] = field(default_factory=dict)
    """Model camera slot -> dataset key; empty = state + goal + prompt only (the CPU demo)."""
    chunk: int = 4
    """Action chunk length H."""
    execute_steps: int = field(default=2, metadata=same_outputs(on_resume=True))
    """Actions of each chunk the evaluator executes open-loop (stored in the export for the runner)."""
    num_steps: int = field(default=10, metadata=same_outputs(on_resume=True))
    """Euler steps at inference (load_policy may override)."""
    positive_only: bool = True
    """Condition only on positive labels (negatives train the plain prompt), upstream's yaml default."""
    condition_dropout: float = 0.1
    """Probability that a sample's advantage text is dropped (plain prompt), upstream's yaml default."""
    hold_labels: bool = True
    """Label positive every frame from the first success on in successful episodes (DEMO_LAB 4)."""
    width: int = 64
    """tiny: prefix and expert width."""
    prefix_layers: int = 2
    """tiny: Gemma3 layers of the prefix."""
    expert_layers: int = 2
    """tiny: action expert layers."""
    image_size: int = 64
    """tiny: camera resolution the SigLIP tower reads."""
    tokenizer: str | None = field(default=None, metadata=same_outputs(on_resume=True))
    """Folder with tokenizer.json; None (tiny) = train one in-process from the tasks and prompt variants."""
    model_seed: int = field(default=0, metadata=same_outputs(on_resume=True))
    """Seed of the model's random initialisation."""
    pretrained_manifest: str | None = field(default=None, metadata=same_outputs(on_resume=True))
    """weights_manifest/*.json whose files initialise the model (strict, sha256-checked); None = random init."""
    weights_dir: str | None = field(default=None, metadata=same_outputs(on_resume=True))
    """Folder the manifest's file paths are relative to (the bundle's weights/)."""
    train: dict[str, Any] = field(default_factory=lambda: {"max_steps": 1000})
    """TrainConfig fields (reproduction/train/config.py): steps, batches, lr, world size, launcher."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"policy stage: mode {self.mode!r} is not one of {', '.join(MODES)}", field="mode")
        check_policy_values(self)
        self.train_config()  # validates the trainer's fields now, naming the bad one

    def train_config(self) -> Any:
        from reproduction.train.config import TrainConfig

        return TrainConfig.from_dict(dict(self.train))

    def to_dict(self) -> dict[str, Any]:
        out = {f: getattr(self, f) for f in self.__dataclass_fields__}
        out["cameras"], out["train"] = dict(self.cameras), dict(self.train)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PolicyStageConfig:
        reject_unknown_fields(cls, data, what="policy config")
        return cls(**dict(data))


def check_policy_values(cfg: Any, key: str = "") -> None:
    """PolicyStageConfig's rules on its model fields (not `mode` or `train`, which a run sets itself) of `cfg`, a
    PolicyStageConfig or anything with those fields as attributes; the ConfigError names each field as `key.field`
    (`policy.model.chunk` when a run config's section is checked). PolicyStageConfig.__post_init__ calls it with no
    key ("policy stage: chunk")."""

    def k(name: str) -> str:
        return f"{key}.{name}" if key else name

    where = "" if key else "policy stage: "
    presets = ("tiny", "pi05")  # model.PRESETS, without importing torch
    if cfg.preset not in presets:
        raise ConfigError(
            f"{where}{k('preset')}={cfg.preset!r} is not one of {', '.join(presets)}",
            field=k("preset"),
            hint=f"set {k('preset')} to one of: {', '.join(presets)}",
        )
    if not 0.0 <= cfg.condition_dropout < 1.0:  # also refuses nan
        raise ConfigError(
            f"{where}{k('condition_dropout')}={cfg.condition_dropout} is outside [0, 1)", field=k("condition_dropout")
        )
    for name in ("chunk", "execute_steps", "num_steps", "width", "prefix_layers", "expert_layers"):
        if int(getattr(cfg, name)) < 1:
            raise ConfigError(f"{where}{k(name)}={getattr(cfg, name)} must be >= 1", field=k(name))
    if cfg.execute_steps > cfg.chunk:
        raise ConfigError(
            f"{where}{k('execute_steps')}={cfg.execute_steps} exceeds {k('chunk')}={cfg.chunk}",
            field=k("execute_steps"),
            hint=f"set {k('execute_steps')} to at most {k('chunk')}: the evaluator executes part of each chunk",
        )
    if cfg.preset == "pi05" and not cfg.cameras:
        raise ConfigError(
            f"{where}{k('preset')}='pi05' reads cameras (PaliGemma's SigLIP); `{k('cameras')}` maps none",
            field=k("cameras"),
            hint=f"map at least one slot, e.g. {k('cameras')}={{base_0_rgb: observation.images.agentview}}",
        )


@dataclass(kw_only=True)
class PolicyResult:
    """What stage 4 produced."""

    export_dir: Path
    checkpoint_dir: Path
    step: int
    resumed_from: int | None
    train_metrics: dict[str, float]
    samples_per_s: float
    summary: dict[str, Any]
    """Data summary: frames, episodes, successes and positive fractions per dataset."""
    files: list[Path] = field(default_factory=list)
    """Files written that the runner records (setup, arrays, export files)."""


def train_policy(
    inputs: Sequence[Any],
    config: PolicyStageConfig,
    out_dir: Path,
    *,
    resume: bool = False,
    ray_address: str | None = None,
    ui: Any = None,
) -> PolicyResult:
    """Train the policy of `config.mode` on the opened `inputs` (data.open_policy_input) into `out_dir`.

    `resume=True` continues from the newest complete checkpoint; a setup that changed since (mode,
    preset, model, data, labels, normalisation, training knobs) is refused with CheckpointError
    (exit 50) naming what changed, before anything is written. `resume=False` over existing
    checkpoints is refused the same way. Raises DatasetError (40) for inputs without what the mode
    needs, and what the trainer raises (ConfigError, CheckpointError, WorkerFailedError).
    """
    from reproduction.train.api import train

    out_dir = Path(out_dir)
    setup = prepare_policy_setup(inputs, config, out_dir, resume=resume)
    result = train(
        functools.partial(make_policy_task, setup_path=str((out_dir / SETUP_NAME).resolve())),
        config.train_config(),
        out_dir=out_dir,
        resume=resume,
        ray_address=ray_address,
        ui=ui,
    )
    files = [out_dir / SETUP_NAME, out_dir / ARRAYS_NAME] + sorted(
        p for p in result.export_dir.rglob("*") if p.is_file()
    )
    return PolicyResult(
        export_dir=result.export_dir,
        checkpoint_dir=result.checkpoint_dir,
        step=result.step,
        resumed_from=result.resumed_from,
        train_metrics=result.train_metrics,
        samples_per_s=result.samples_per_s,
        summary=setup["summary"],
        files=files,
    )


def prepare_policy_setup(inputs: Sequence[Any], config: PolicyStageConfig, out_dir: Path, *, resume: bool) -> dict:
    """Arrays, stats, tokenizer and model config, written to `out_dir` (module docstring); returns the setup.

    Checks against an existing run first (see `train_policy`); on refusal nothing is written.
    """
    from reproduction.recap.policy.data import build_arrays, state_stats
    from reproduction.recap.policy.model import tiny_config
    from reproduction.train.checkpoint import complete_steps

    out_dir = Path(out_dir)
    trained = bool(complete_steps(out_dir / "checkpoints"))
    if trained and not resume:
        raise CheckpointError(
            f"{out_dir / 'checkpoints'} already holds checkpoints and resume is off",
            path=out_dir / "checkpoints",
            hint="`portable run --resume` continues it; `--restart-stage policy` trains it again from scratch",
        )
    arrays, summary = build_arrays(inputs, mode=config.mode, chunk=config.chunk, hold_labels=config.hold_labels)
    stats = state_stats(arrays)
    staging = out_dir / f".tokenizer.{os.getpid()}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    out_dir.mkdir(parents=True, exist_ok=True)
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
            "stage": config.to_dict(),
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


def _tokenizer(config: PolicyStageConfig, tasks: list[str], out: Path) -> Any:
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


RESUME_FREE = resume_free_fields(PolicyStageConfig)
"""Stage fields a resume may change (they shape neither the model nor the data stream): declared
`same_outputs(on_resume=True)` on PolicyStageConfig."""
_FREE_TRAIN = (
    "max_steps",
    "micro_batch",
    "world_size",
    "launcher",
    "device",
    "eval_interval",
    "save_interval",
    "keep_last",
    "log_interval",
    "cpus_per_worker",
    "cpu_threads",
    "start_timeout_s",
    "collective_timeout_s",
)


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
    old_stage = {k: v for k, v in old["stage"].items() if k not in RESUME_FREE}
    new_stage = {k: v for k, v in new["stage"].items() if k not in RESUME_FREE}
    old_train = {k: v for k, v in old_stage.pop("train").items() if k not in _FREE_TRAIN}
    new_train = {k: v for k, v in new_stage.pop("train").items() if k not in _FREE_TRAIN}
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


# -- inside each worker ---------------------------------------------------------------------------


class PolicySamples:
    """Map-style training set over the saved arrays: normalised state, action chunk, label, task (and images)."""

    def __init__(
        self,
        arrays: Any,
        stats: Mapping[str, Any],
        *,
        cameras: Mapping[str, str] | None = None,
        sources: Sequence[Mapping[str, Any]] = (),
        fingerprints: Mapping[str, str] | None = None,
        image_size: int = 64,
    ) -> None:
        self.arrays = arrays
        s_mean, s_std = np.asarray(stats["state_mean"], np.float32), np.asarray(stats["state_std"], np.float32)
        a_mean, a_std = np.asarray(stats["action_mean"], np.float32), np.asarray(stats["action_std"], np.float32)
        self.state = ((arrays.state - s_mean) / s_std).astype(np.float32)
        self.action = ((arrays.action - a_mean) / a_std).astype(np.float32)
        self.cameras = dict(cameras or {})
        self.sources = list(sources)
        self.fingerprints = dict(fingerprints or {})
        self.image_size = image_size
        self._datasets: dict[int, Any] = {}

    def __len__(self) -> int:
        return len(self.arrays)

    def _dataset(self, d: int) -> Any:
        if d not in self._datasets:
            from reproduction.data.reader import open_dataset
            from reproduction.errors import FingerprintMismatchError

            src = self.sources[d]
            ds = open_dataset(src["path"])
            want = self.fingerprints.get(src["name"])
            if want and ds.fingerprint != want:
                raise FingerprintMismatchError(
                    f"{src['path']}: the dataset changed since the policy setup was written "
                    f"(fingerprint {want[:12]} -> {ds.fingerprint[:12]})",
                    path=src["path"],
                    expected=want,
                    actual=ds.fingerprint,
                    hint="rerun the policy stage from the start",
                )
            self._datasets[d] = ds
        return self._datasets[d]

    def __getitem__(self, i: int) -> dict[str, Any]:
        a = self.arrays
        sample = {
            "state": self.state[i],
            "actions": self.action[a.chunk[i]],
            "task_id": int(a.task_id[i]),
            "label": bool(a.label[i]),
            "kind": 0,
        }
        if self.cameras:
            from reproduction.recap.value.data import to_pixels

            ds = self._dataset(int(a.source[i]))
            present = {slot: key for slot, key in self.cameras.items() if key in ds.camera_keys}
            raw = ds.read_frames([int(a.row[i])], list(present.values())) if present else {}
            sample["images"] = {slot: to_pixels(raw[key][0], self.image_size) for slot, key in present.items()}
        return sample


@dataclass(kw_only=True)
class PolicyBatcher:
    """The trainer's batched fast path (`TrainTask.make_batch`) for a camera-free, text-state-free
    preset: gathers state and chunks by index, routes prompts with `route_batch` over the batch's
    per-sample uniforms, and tokenises through the collator's prompt table (no per-sample objects)."""

    samples: PolicySamples
    collator: PolicyCollator
    augment: RouteAugment | None

    def __call__(self, keys: Any) -> dict[str, Any]:
        from reproduction.recap.policy.conditioning import route_batch

        a, idx = self.samples.arrays, np.asarray(keys.indices, np.int64)
        label = np.asarray(a.label[idx], bool)
        if self.augment is None:
            kinds = np.zeros(len(idx), np.int64)
        else:
            aug = self.augment
            u = keys.uniforms(1)[:, 0]
            kinds = route_batch(label, u, mode=aug.mode, dropout=aug.dropout, positive_only=aug.positive_only)
        return self.collator.collate_arrays(
            state=self.samples.state[idx],
            actions=self.samples.action[a.chunk[idx]],
            task_ids=np.asarray(a.task_id[idx], np.int64),
            kinds=np.asarray(kinds, np.int64),
            labels=label,
        )


@dataclass(kw_only=True)
class RouteAugment:
    """The trainer's per-sample hook: draws u ~ U(0,1) from the sample's RNG and routes its prompt."""

    mode: str
    dropout: float
    positive_only: bool

    def __call__(self, sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        from reproduction.recap.policy.conditioning import route

        out = dict(sample)
        out["kind"] = route(
            sample["label"], float(rng.random()), mode=self.mode, dropout=self.dropout, positive_only=self.positive_only
        )
        return out


class PolicyCollator:
    """Samples -> batch: state (B,S), actions (B,H,A'), prompt tokens (B,T) by (task, kind), kinds, images.

    `state_text` (pi05) writes the state into the prompt as pi0.5's 256-bin text; `action_dim` pads
    action chunks with zeros to the model's width (pi0.5's max_action_dim). Token ids of the few
    distinct prompts are cached (the tokenizer is the slowest part of a tiny batch otherwise)."""

    def __init__(
        self,
        tokenizer: Any,
        tasks: Sequence[str],
        *,
        cameras: Sequence[str] = (),
        image_size: int = 64,
        max_token_len: int = 64,
        state_text: bool = False,
        action_dim: int | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.tasks = list(tasks)
        self.cameras = tuple(sorted(cameras))
        self.image_size = image_size
        self.max_token_len = 200 if state_text else max_token_len
        self.state_text = state_text
        self.action_dim = action_dim
        self._ids: dict[str, list[int]] = {}

    def prompts(self, task_ids: Sequence[int], kinds: Sequence[int], states: np.ndarray | None = None) -> list[str]:
        from reproduction.recap.policy.conditioning import prompt_text
        from reproduction.recap.tokenizer import format_prompt

        if self.state_text:
            from reproduction.recap.policy.pi05 import discretize_state, pi05_prompt

            texts = discretize_state(states)
            return [pi05_prompt(prompt_text(self.tasks[t], k), s) for t, k, s in zip(task_ids, kinds, texts)]
        return [format_prompt(prompt_text(self.tasks[t], k)) for t, k in zip(task_ids, kinds)]

    def encode(self, prompts: list[str]) -> tuple[Any, Any]:
        """(ids, mask) right-padded to the longest, through a per-prompt cache."""
        import torch

        todo = sorted({p for p in prompts if p not in self._ids})
        if todo:
            enc = self.tokenizer(todo, add_special_tokens=True, truncation=True, max_length=self.max_token_len)
            self._ids.update(zip(todo, enc["input_ids"]))
            if len(self._ids) > 4096:  # state text makes prompts distinct: keep the cache bounded
                self._ids = {p: self._ids[p] for p in todo}
        seqs = [self._ids[p] for p in prompts]
        longest = max((len(q) for q in seqs), default=1)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        ids = torch.full((len(seqs), longest), pad, dtype=torch.long)
        mask = torch.zeros((len(seqs), longest), dtype=torch.bool)
        for row, q in enumerate(seqs):
            ids[row, : len(q)] = torch.tensor(q, dtype=torch.long)
            mask[row, : len(q)] = True
        return ids, mask

    def prompt_table(self, task_ids: np.ndarray, kinds: np.ndarray) -> tuple[Any, Any, Any]:
        """The distinct prompts of a batch and each row's index into them: (ids (U,T), mask (U,T),
        index (B,)), without a per-row Python loop (a prompt is fixed by its (task, kind) pair)."""
        import torch

        from reproduction.recap.policy.conditioning import KINDS

        pair = np.asarray(task_ids, np.int64) * len(KINDS) + np.asarray(kinds, np.int64)
        uniq, inverse = np.unique(pair, return_inverse=True)
        ids, mask = self.encode(self.prompts((uniq // len(KINDS)).tolist(), (uniq % len(KINDS)).tolist()))
        return ids, mask, torch.from_numpy(inverse.reshape(-1).astype(np.int64))

    def collate_arrays(
        self, *, state: np.ndarray, actions: np.ndarray, task_ids: np.ndarray, kinds: np.ndarray, labels: np.ndarray
    ) -> dict[str, Any]:
        """A camera-free, text-state-free batch from arrays: the prompts go in once each as
        `prompt_ids`/`prompt_mask` with the per-row `prompt_index` (the model's prefix runs once per
        distinct prompt), and `input_ids`/`attention_mask` are their per-row gathers."""
        import torch

        if self.cameras or self.state_text:
            raise ValueError("collate_arrays serves camera-free, text-state-free presets only")
        ids, mask, index = self.prompt_table(task_ids, kinds)
        actions = np.ascontiguousarray(actions, np.float32)
        if self.action_dim and actions.shape[-1] < self.action_dim:
            pad = np.zeros((*actions.shape[:-1], self.action_dim - actions.shape[-1]), np.float32)
            actions = np.concatenate([actions, pad], -1)
        return {
            "state": torch.from_numpy(np.ascontiguousarray(state, np.float32)),
            "actions": torch.from_numpy(actions),
            "input_ids": ids[index],
            "attention_mask": mask[index],
            "prompt_ids": ids,
            "prompt_mask": mask,
            "prompt_index": index,
            "kind": torch.from_numpy(np.asarray(kinds, np.int64)),
            "label": torch.from_numpy(np.asarray(labels, bool)),
        }

    def __call__(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        kinds = [int(s["kind"]) for s in samples]
        states = np.stack([s["state"] for s in samples])
        ids, att = self.encode(self.prompts([s["task_id"] for s in samples], kinds, states))
        actions = np.stack([s["actions"] for s in samples])
        if self.action_dim and actions.shape[-1] < self.action_dim:
            actions = np.concatenate(
                [actions, np.zeros((*actions.shape[:-1], self.action_dim - actions.shape[-1]), actions.dtype)], -1
            )
        batch = {
            "state": torch.from_numpy(states),
            "actions": torch.from_numpy(actions),
            "input_ids": ids,
            "attention_mask": att,
            "kind": torch.tensor(kinds, dtype=torch.long),
            "label": torch.tensor([bool(s["label"]) for s in samples]),
        }
        if self.cameras:
            zeros = torch.full((3, self.image_size, self.image_size), -1.0)
            batch["images"], batch["image_masks"] = {}, {}
            for slot in self.cameras:
                got = [s.get("images", {}).get(slot) for s in samples]
                batch["image_masks"][slot] = torch.tensor([g is not None for g in got])
                batch["images"][slot] = torch.stack([g if g is not None else zeros for g in got])
        return batch


def policy_loss(model: Any, batch: Mapping[str, Any]) -> tuple[Any, dict[str, float]]:
    """pi0 flow matching (flow.py): noise and time from torch's RNG; metrics by prompt kind."""
    import torch

    from reproduction.recap.policy.flow import interpolate, sample_time

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
    from reproduction.recap.tokenizer import load_tokenizer
    from reproduction.train.task import TrainTask

    setup = json.loads(Path(setup_path).read_text(encoding="utf-8"))
    stage = PolicyStageConfig.from_dict(setup["stage"])
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
        state_text=mcfg.preset == "pi05",
        action_dim=mcfg.action_dim,
    )
    augment = (
        RouteAugment(mode=stage.mode, dropout=stage.condition_dropout, positive_only=stage.positive_only)
        if stage.mode == "recap"
        else None
    )
    fast = not mcfg.cameras and mcfg.preset != "pi05"
    return TrainTask(
        model=model,
        train_dataset=data,
        collate=collate,
        loss=policy_loss,
        augment=augment,
        make_batch=PolicyBatcher(samples=data, collator=collate, augment=augment) if fast else None,
        fsdp_units=policy_blocks,
        export_extras=functools.partial(write_export_extras, setup=setup),
        model_config=mcfg.to_dict(),
    )


def policy_blocks(model: Any) -> list[Any]:
    """FSDP2 units: transformer layers of every tower (vision, prefix language, expert)."""
    if hasattr(model, "fsdp_units"):
        return model.fsdp_units()
    units = list(model.language.layers) + list(model.expert)
    if model.vision is not None:
        units = list(model.vision.encoder.layers) + units
    return units


def export_metadata(setup: Mapping[str, Any]) -> dict[str, Any]:
    """`policy.json`: what load_policy needs besides the weights."""
    stage = setup["stage"]
    return {
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


def write_export_extras(folder: Path, *, setup: Mapping[str, Any]) -> None:
    atomic_write_text(Path(folder) / EXPORT_META, json.dumps(export_metadata(setup), indent=1, sort_keys=True))
    shutil.copytree(setup["tokenizer_dir"], Path(folder) / "tokenizer", dirs_exist_ok=True)
