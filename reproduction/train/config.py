"""`TrainConfig`: every knob of the training core, checked up front (cross-field rules name their fields)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from reproduction.config_fields import TIMEOUT_MAX_S, changes_outputs, check_bool, check_number, same_outputs
from reproduction.errors import ConfigError

DEVICES = ("auto", "cpu", "cuda", "npu")
LAUNCHERS = ("ray", "inprocess")
PRECISIONS = ("fp32", "bf16")


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    """How to train; the task (model, data, loss) comes separately as a `TrainTask`.

    Fields declared with `same_outputs()` (world size, devices, intervals, timeouts) may change across a resume and
    are no part of a stage's key; every other field but max_steps is in the checkpoint's resume key."""

    max_steps: int
    """Optimizer steps to run in total (a resumed run continues up to this)."""
    global_batch: int = 8
    """Samples per optimizer step over all workers; gradient accumulation = global/(micro x world)."""
    # not same_outputs(): a loss draws its randomness per forward from torch's RNG (flow matching's noise and time,
    # openpi's image augmentation), so another split trains on other draws (audit56 D1: step-4 loss 1.62 vs 1.80)
    micro_batch: int = 2
    """Samples per forward/backward on one worker (changes the outputs: in the stage and resume keys)."""
    world_size: int = field(default=1, metadata=same_outputs())
    """Number of workers (one per device: a GPU, an NPU or a CPU slot)."""
    device: str = field(default="auto", metadata=same_outputs())
    """cpu, cuda, npu, or auto (npu if torch_npu imports and sees a device, else cuda, else cpu)."""
    launcher: str = field(default="ray", metadata=same_outputs())
    """ray (a placement group of one worker per device) or inprocess (world_size 1 only, no Ray)."""
    seed: int = 0
    """Seeds the data order, per-sample augmentation RNGs and each rank's RNGs at a fresh start (0..2**63-1)."""
    shuffle: bool = True
    """Shuffle the data order each epoch (a function of seed and epoch); False = dataset order."""
    lr: float = 5e-5
    """AdamW learning rate for groups that do not set their own (a finite number > 0)."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW betas."""
    eps: float = 1e-8
    """AdamW epsilon (finite, >= 0)."""
    weight_decay: float = 1e-10
    """AdamW weight decay for groups that do not set their own."""
    warmup_steps: int = 0
    """Linear warmup from 0 over this many steps, then constant (upstream's `constant` schedule)."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this (finite); 0 disables clipping (non-finite norms still skip; weights that
    turn non-finite stop the run before a save: exit 50)."""
    mixed_precision: str = "fp32"
    """fp32, or bf16 (FSDP2 MixedPrecisionPolicy: bf16 params/compute, fp32 gradient reduction)."""
    eval_interval: int = field(default=0, metadata=same_outputs())
    """Evaluate every N steps (0 = only at the last step, which always evaluates)."""
    save_interval: int = field(default=0, metadata=same_outputs())
    """Checkpoint every N steps (0 = only at the last step, which always saves); a multiple of eval_interval."""
    keep_last: int = field(default=2, metadata=same_outputs())
    """Complete checkpoints to keep (older ones are deleted after a newer one commits)."""
    log_interval: int = field(default=1, metadata=same_outputs())
    """Log train metrics every N steps (and at the last step)."""
    canary_samples: int = 2
    """Samples in the default canary batch (the first ones of the dataset, no augmentation)."""
    canary_rtol: float = field(default=1e-4, metadata=same_outputs())
    """Relative tolerance of the canary loss check after a load (plus 1e-6 absolute)."""
    cpus_per_worker: float = field(default=1.0, metadata=same_outputs())
    """Ray CPU slots each worker reserves."""
    cpu_threads: int = field(default=0, metadata=same_outputs())
    """torch intra-op threads of a worker on the CPU device; 0 = torch's default, which follows
    OMP_NUM_THREADS (`portable` sets it to 1 unless set). A single in-process trainer on an otherwise
    idle machine gains from more (the demo's policy: ~84 -> ~58 ms a step with 2); results depend on
    the count, so a config that wants the same numbers everywhere names it rather than "all cores".
    `portable` also sets GOMP_SPINCOUNT=1000 unless OMP_WAIT_POLICY or it is set: libgomp's long spin made a
    2-thread step 6-20x slower whenever other processes ran; on a busy shared machine OMP_WAIT_POLICY=PASSIVE
    is faster still, on an idle one it doubles the step."""
    start_timeout_s: float = field(default=120.0, metadata=same_outputs())
    """Bound on waiting for Ray to place the workers (placement group) and, on a cluster, for rank 0's
    node to report the rendezvous address. Joining the process group is bounded by collective_timeout_s. At most
    604800 (one week)."""
    collective_timeout_s: float = field(default=300.0, metadata=same_outputs())
    """torch.distributed timeout (init_process_group's one timeout): bounds the rendezvous (all ranks
    joining) and every collective; a rank whose peer is dead errors after this. At most 604800 (one week)."""

    def __post_init__(self) -> None:
        check_train_values(self)

    @property
    def grad_accum(self) -> int:
        """Micro batches each worker runs per optimizer step."""
        return self.global_batch // (self.micro_batch * self.world_size)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """Build from a dict (e.g. a run config section); unknown keys are refused by name."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(
                f"unknown training config field(s): {', '.join(unknown)}",
                field=unknown[0],
                hint=f"known fields: {', '.join(sorted(known))}",
            )
        data = dict(data)
        if "betas" in data:
            data["betas"] = tuple(data["betas"])
        return cls(**data)

    def resume_key(self) -> dict[str, Any]:
        """The fields a checkpoint must share with this config to be resumed (JSON-able)."""
        return {name: list(v) if isinstance(v := getattr(self, name), tuple) else v for name in RESUME_KEY_FIELDS}

    def digest(self) -> str:
        """SHA-256 of `resume_key()` as canonical JSON (stored in every checkpoint manifest)."""
        return hashlib.sha256(json.dumps(self.resume_key(), sort_keys=True).encode()).hexdigest()


RESUME_KEY_FIELDS = tuple(
    f.name for f in dataclasses.fields(TrainConfig) if changes_outputs(f) and f.name != "max_steps"
)
"""Fields that change the numbers a run produces (every field not declared `same_outputs()`, but max_steps: a resumed
run continues up to it): a resume whose config differs in any of these is refused (naming them)."""


def trained_with(cfg: TrainConfig) -> dict[str, Any]:
    """`cfg`'s fields that change what is trained (RESUME_KEY_FIELDS) and max_steps, as a dict: what a stage's
    outputs record of its trainer (the export's train_config.json, policy_setup.json's `stage.train`). A field
    declared `same_outputs()` (intervals, workers, devices, timeouts) is left out: in an output it made the bytes,
    and the digests evidence records of an export, follow a value declared not to change outputs (audit62 K)."""
    return {k: v for k, v in cfg.to_dict().items() if k == "max_steps" or k in RESUME_KEY_FIELDS}


def check_train_values(cfg: Any, key: str = "") -> None:
    """TrainConfig's rules on `cfg` (a TrainConfig, or anything with its fields as attributes); the ConfigError
    names each field as `key.field` (`policy.train.max_steps` when a run config's section is checked), so two
    training sections of one config are told apart. TrainConfig.__post_init__ calls it with no key."""

    def k(name: str) -> str:
        return f"{key}.{name}" if key else name

    _check_choices(cfg, k)
    _check_positive(cfg, k)
    per_pass = cfg.micro_batch * cfg.world_size
    if cfg.global_batch % per_pass:
        raise ConfigError(
            f"{k('global_batch')}={cfg.global_batch} is not divisible by {k('micro_batch')} x {k('world_size')} = "
            f"{cfg.micro_batch} x {cfg.world_size} = {per_pass}",
            field=k("global_batch"),
            hint=f"pick {k('global_batch')} as a multiple of micro_batch * world_size",
        )
    if cfg.save_interval and cfg.eval_interval and cfg.save_interval % cfg.eval_interval:
        raise ConfigError(
            f"{k('save_interval')}={cfg.save_interval} is not a multiple of {k('eval_interval')}={cfg.eval_interval}",
            field=k("save_interval"),
            hint=f"every checkpoint should carry an evaluation: make {k('save_interval')} a multiple",
        )
    if cfg.launcher == "inprocess" and cfg.world_size != 1:
        raise ConfigError(
            f"{k('launcher')}='inprocess' runs one worker, but {k('world_size')}={cfg.world_size}",
            field=k("launcher"),
            hint=f"set {k('launcher')}=ray for more than one worker",
        )


def _check_choices(cfg: Any, k: Callable[[str], str]) -> None:
    for name, choices in (("device", DEVICES), ("launcher", LAUNCHERS), ("mixed_precision", PRECISIONS)):
        value = getattr(cfg, name)
        if value not in choices:
            raise ConfigError(
                f"{k(name)}={value!r} is not one of {', '.join(choices)}",
                field=k(name),
                hint=f"set {k(name)} to one of: {', '.join(choices)}",
            )


def _check_positive(cfg: Any, k: Callable[[str], str]) -> None:
    # every float finite (inf passed `> 0` and trained a non-finite model, audit52 W4); every count an int64
    for name in ("max_steps", "global_batch", "micro_batch", "world_size", "keep_last", "log_interval"):
        check_number(getattr(cfg, name), k(name), low=1, integer=True)
    for name in ("warmup_steps", "eval_interval", "save_interval", "canary_samples", "cpu_threads", "seed"):
        check_number(getattr(cfg, name), k(name), low=0, integer=True)
    for name in ("lr", "cpus_per_worker"):
        check_number(getattr(cfg, name), k(name), low=0, low_open=True)
    for name in ("start_timeout_s", "collective_timeout_s"):  # bounded: Ray/torch overflow on 1e300 (audit56 D2)
        check_number(getattr(cfg, name), k(name), low=0, low_open=True, high=TIMEOUT_MAX_S)
    for name in ("grad_clip", "weight_decay", "canary_rtol", "eps"):
        check_number(getattr(cfg, name), k(name), low=0)
    check_bool(cfg.shuffle, k("shuffle"))
    betas = tuple(cfg.betas)
    if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
        raise ConfigError(f"{k('betas')}={betas} must be two numbers in [0, 1)", field=k("betas"))
