"""The GRPO recipe's run config: one small dataclass per component (OmegaConf structured schema).

    recipe: grpo
    sft.datasets[] / sft.export     the SFT initialisation: BC on demonstrations, or a pinned policy export
    sft.model / sft.train           the policy preset (RECAP stage 4's) and its trainer (reproduction/train)
    rl                              group size, init states per step, clip, KL, lr, steps, evaluation, co-training
    eval                            held-out evaluation (reproduction/sim/evaluate.py) and the reference evidence

`portable run` loads it (the recipe names it: Recipe.config_schema); in code,
`reproduction.run.config.load_config(files, overrides, schema=GrpoRunConfig)`. A field that does not change what
its stage computes is declared so on the field (`same_outputs()`): the stage keys and the rl stage's resume check
(train.py) leave it out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from reproduction.config_fields import added_field, check_bool, check_number, same_outputs
from reproduction.errors import ConfigError
from reproduction.sim.cameras import CAMERA_NAMES, IMAGE_PREFIX, camera_names  # noqa: F401 (grpo's names for them)
from reproduction.train.config import TrainConfig

ADVANTAGE_SCALES = ("group", "batch", "none")
"""What `rl.advantage_scale` may name (objective.group_advantages)."""
REWARDS = ("success_at_end", "success_once", "progress")
"""rl.reward's choices."""
GROUP_SIZE_MAX = 4096
"""rl.group_size's bound: a group's rollouts are held and scored together (audit56 D3: 10**30 passed the config)."""
ROLLOUTS_MAX = 2**20
"""Bound on rl.init_states x rl.group_size, the episodes one rollout round simulates and holds (audit56 D3)."""
NOISE_LEVEL_MIN = 1e-6
"""rl.noise_level's floor: below ~1e-44 the float32 step noise is 0 and every step's log-probability NaN (the run
skipped every step and exited 0: audit54 C2); long before that an update's shift of the mean, divided by the noise,
overflows the ratio. RLinf's default is 0.5."""


@dataclass(kw_only=True, slots=True)
class SftDataset:
    """One demonstration dataset the SFT stage trains on (LeRobot, with observation.state/goal and action)."""

    path: str = "???"
    """Dataset root (e.g. ${BUNDLE}/data/sft)."""
    weight: float = 1.0
    """Mixture weight when there are several."""

    def __post_init__(self) -> None:
        # nan or a negative weight made a mixture share nan or negative (audit52 W7); `path` is checked where read
        check_number(self.weight, "sft.datasets[].weight", low=0, low_open=True)


@dataclass(kw_only=True, slots=True)
class PolicyModelSection:
    """The policy preset: RECAP stage 4's model (reproduction/recap/policy), trained without conditioning."""

    preset: str = "tiny"
    """tiny (CPU; camera-free unless `cameras` maps some) or pi05 (lerobot PI05Policy's architecture: reads cameras;
    stage 4 trains it at RECAP's pi05 defaults, openpi pi05_libero's prompt without the state and quantile
    normalisation; full size needs a GPU and `pretrained_manifest`)."""
    cameras: dict[str, str] = field(default_factory=dict)
    """Model camera slot -> observation key, as RECAP's policy.model.cameras (e.g. {base_0_rgb:
    observation.images.agentview}); the keys name cameras the simulator renders, which the SFT data, the rollouts
    and the evaluation then carry: Fetch's observation.images.agentview and .wrist, LIBERO's
    observation.images.image (agentview) and .wrist_image (RLinf/openpi's names). {} = state (+ goal) + prompt."""
    image_size: int = 64
    """tiny: the camera resolution its SigLIP reads, and the simulator renders at (pi05 reads and renders 224)."""
    chunk: int = 4
    """Action chunk length H."""
    execute_steps: int = 2
    """Actions of each chunk executed before the policy is asked again (training rollouts and evaluation)."""
    state_keys: list[str] = field(default_factory=list)
    """Observation features the policy's state concatenates, in order ([] = observation.state, and .goal where the
    data have it: Fetch). LIBERO: [observation.state, observation.object_state] (privileged object poses)."""
    state_dims: list[int] | None = None
    """Indices of that vector the policy reads (None = all); bundle/grpo/libero.yaml picks positions as RECAP's tier."""
    num_steps: int = 10
    """Denoising steps K (Euler at evaluation, flow-SDE steps in RL rollouts)."""
    width: int = 64
    """tiny: prefix and expert width."""
    prefix_layers: int = 2
    """tiny: Gemma3 layers of the prefix."""
    expert_layers: int = 2
    """tiny: action expert layers."""
    model_seed: int = 0
    """Seed of the model's random initialisation."""
    pretrained_manifest: str | None = None
    """weights_manifest/*.json whose files initialise the SFT model (sha256-checked); None = random init."""
    weights_dir: str | None = None
    """Folder the manifest's file paths are relative to."""
    tokenizer: str | None = None
    """Folder with tokenizer.json (pi05 with pretrained weights: PaliGemma's); None = train one in-process."""
    # How the preset reads its inputs: RECAP's policy.model fields of the same names, passed to stage 4's trainer as
    # they are (recap/policy/config.py documents each); the SFT export records them, so the rollouts, the loss and
    # the evaluation read the state, prompt and actions as SFT trained on them.
    discrete_state_input: bool = field(default=False, metadata=added_field())
    """pi05: the normalised state as openpi's 256-bin text in the prompt; False = upstream's pi05_libero (the task
    alone). tiny: must be false."""
    norm: str | None = field(default=None, metadata=added_field())
    """State/action normalisation: quantile (openpi's pi0.5) or zscore; None = the preset's (pi05 quantile, tiny
    zscore)."""
    norm_stats: str | None = field(default=None, metadata=added_field())
    """openpi's norm_stats.json (or its folder) for the quantile norm; None = the SFT frames' quantiles."""
    image_augment: bool | None = field(default=None, metadata=added_field())
    """SFT's train-time image augmentation as openpi's (crop, rotation, colour jitter); None = the preset's (pi05 on,
    tiny off). The RL loss never augments: it rescores the frames the rollouts saw."""

    def __post_init__(self) -> None:
        k = "sft.model."
        if self.preset not in PRESETS:
            raise ConfigError(
                f"{k}preset={self.preset!r} is not one of {', '.join(PRESETS)}",
                field=k + "preset",
                hint=f"set {k}preset to one of: {', '.join(PRESETS)}",
            )
        for name in ("chunk", "execute_steps", "num_steps", "width", "prefix_layers", "expert_layers", "image_size"):
            check_number(getattr(self, name), k + name, low=1, integer=True)
        check_number(self.model_seed, k + "model_seed", low=0, integer=True)
        check_bool(self.discrete_state_input, k + "discrete_state_input")
        if self.image_augment is not None:
            check_bool(self.image_augment, k + "image_augment")
        if self.execute_steps > self.chunk:
            raise ConfigError(
                f"{k}execute_steps={self.execute_steps} exceeds {k}chunk={self.chunk}",
                field=k + "execute_steps",
            )
        from reproduction.recap.policy.config import check_input_options

        check_input_options(self, "sft.model")  # RECAP's rules: norm, norm_stats, discrete_state_input, pi05 cameras
        if not 16 <= self.image_size <= 480 or self.image_size % 16:
            raise ConfigError(
                f"{k}image_size={self.image_size} is not a multiple of 16 in 16..480 (tiny's SigLIP patch is 16 px)",
                field=k + "image_size",
            )

    @property
    def render_size(self) -> int:
        """The resolution the simulator renders the cameras at: the model's input (tiny image_size, pi05 224)."""
        return PI05_IMAGE_SIZE if self.preset == "pi05" else int(self.image_size)


PRESETS = ("tiny", "pi05")
"""The policy presets (reproduction/recap/policy/model.py PRESETS, not imported: it loads torch)."""
PI05_IMAGE_SIZE = 224
"""pi05's camera resolution (reproduction/recap/policy/pi05.py pi05_config's default)."""
OBJECT_STATE = "observation.object_state"
"""LIBERO's privileged object poses (sim/libero/env.py: observed only by an env that renders no cameras)."""
SIM_CAMERAS = CAMERA_NAMES
"""The cameras the Fetch simulator renders (reproduction/sim/cameras.py, which does not load mujoco)."""


def _sft_train() -> TrainConfig:
    return TrainConfig(max_steps=400, global_batch=256, micro_batch=256, launcher="inprocess", device="cpu", lr=1e-3)


@dataclass(kw_only=True, slots=True)
class SftSection:
    """The `sft` stage: BC on `datasets` (RECAP's policy training with conditioning off), or a pinned export."""

    datasets: list[SftDataset] = field(default_factory=list)
    """Demonstrations to clone (ignored when `export` is set)."""
    export: str | None = None
    """A pinned SFT policy export folder (model.safetensors, policy.json, ...): used as is, nothing trains."""
    model: PolicyModelSection = field(default_factory=PolicyModelSection)
    """The policy preset."""
    train: TrainConfig = field(default_factory=_sft_train)
    """The BC trainer (steps, batch, lr, launcher)."""


@dataclass(kw_only=True, slots=True)
class RlSection:
    """The `rl` stage: GRPO from the SFT policy (reproduction/recipes/grpo/objective.py, sde.py)."""

    tasks: list[str] = field(default_factory=lambda: ["FetchPush-v4"])
    """Simulator tasks of the training rollouts (init state i of a step uses tasks[i % len(tasks)]): Fetch env ids,
    or LIBERO task ids as RECAP's eval.tasks names them (`libero_10/0`: init state i starts from the task's fixed
    init state i % 50; privileged state, or the cameras sft.model.cameras reads); one kind per run."""
    max_steps: int | None = None
    """Policy steps per rollout episode (and per live-evaluation episode); None = the task's (Fetch: always 50,
    LIBERO: the suite's limit, libero_10 520). LIBERO only: a lower value is for short runs and tests."""
    steps: int = 40
    """Optimizer steps in total (`--target-step` raises it)."""
    init_states: int = 8
    """B: initial states (reset seeds) per rollout round, each with a group of `group_size` rollouts."""
    micro_init_states: int = 8
    """Init states per forward/backward (gradient accumulation = init_states / micro_init_states). Changes outputs:
    advantage_scale batch divides by the std of a micro batch's groups, cotrain draws its frames and noise per micro
    batch, and tasks with other episode lengths weigh their rows per micro batch (audit56 D1)."""
    group_size: int = 8
    """G: rollouts per initial state; advantages are standardised within the group. 2..4096, and init_states x
    group_size at most 2**20 (the episodes of one round)."""
    updates_per_rollout: int = 1
    """PPO updates on each round's rollouts (mu); > 1 makes the clip bite. Divides steps and save_every."""
    clip_eps: float = 0.2
    """PPO clip range epsilon."""
    kl_coef: float = 0.01
    """beta: weight of the KL to the reference (SFT) policy, per denoising step. RLinf's embodied GRPO has no such
    term (docs/upstream.md, "GRPO"): 0 gives its objective, and no reference policy is loaded."""
    noise_level: float = 0.5
    """a: the flow-SDE noise level of rollouts (RLinf's flow_sde default); evaluation stays on the ODE. At least
    1e-6 (NOISE_LEVEL_MIN)."""
    logprob_steps: int = 2
    """Denoising steps of each decision the loss trains on, drawn per (rollout, decision) from its seed (RLinf
    trains on one random step per sampling call, shared by the whole batch, and samples the others on the ODE:
    sde.py); the full K costs K / logprob_steps times the loss."""
    lr: float = 1e-4
    """AdamW learning rate."""
    grad_clip: float = 1.0
    """Global gradient-norm clip."""
    reward: str = "success_at_end"
    """success_at_end (cube at the goal when the episode ends), success_once (at any step), or progress (Fetch:
    success_at_end plus the share of the object-goal distance the episode removed; objective.rollout_rewards)."""
    advantage_scale: str = field(default="group", metadata=added_field())
    """What a group's centred rewards are divided by: group (its own std, GRPO), batch (the std over all groups
    collected together) or none (objective.group_advantages)."""
    eval_every: int = 10
    """Evaluate the live policy every N steps (and at the last) on `eval_episodes` held-out episodes; 0 = last only.
    Keys the rl stage and is refused changed on resume: its live evaluations (evidence/eval_rl_<step>.json) are
    the stage's outputs (audit62 K M1)."""
    eval_episodes: int = 20
    """Episodes per task of the in-training evaluation (the eval stage runs the full one). Keys the rl stage and is
    refused changed on resume, as eval_every is."""
    save_every: int = field(default=10, metadata=same_outputs())
    """DCP checkpoint every N steps (and at the last); a multiple of eval_every and of updates_per_rollout."""
    seed: int = 0
    """Seeds the rollouts' init states and noise, and the trainer; 0..2**32-1."""
    cotrain_dataset: str | None = None
    """Optional SFT co-training dataset (RL-Co's PPO + SFT form): a flow-matching loss on it is added."""
    cotrain_weight: float = 0.0
    """Weight of the co-training flow-matching loss (0 = off)."""
    cotrain_batch: int = 64
    """Frames per co-training micro batch."""
    rollout_workers: int = field(default=1, metadata=same_outputs())
    """Simulator worker processes the rollouts' envs are sliced over (the policy forward stays batched in the
    trainer); 1 = envs in the trainer's process. Any count gives the same rollouts."""
    launcher: str = field(default="inprocess", metadata=same_outputs())
    """Trainer launcher: inprocess (one worker) or ray."""
    world_size: int = field(default=1, metadata=same_outputs())
    """Trainer ranks (FSDP2 shards, launcher ray): each step's init states are split over them, each rank rolls out
    its own on an unsharded copy of the policy synced at the round's start; the same rollouts and the same summed
    gradient as one rank (up to the order gradients are added in)."""
    device: str = field(default="cpu", metadata=same_outputs())
    """Trainer device."""
    cpu_threads: int = field(default=0, metadata=same_outputs())
    """torch threads of the trainer (0 = torch's default)."""

    def __post_init__(self) -> None:
        k = "rl."
        for name in (
            "steps",
            "init_states",
            "micro_init_states",
            "updates_per_rollout",
            "eval_episodes",
            "logprob_steps",
            "rollout_workers",
            "cotrain_batch",
            "world_size",
        ):
            check_number(getattr(self, name), k + name, low=1, integer=True)
        for name in ("eval_every", "save_every", "cpu_threads"):
            check_number(getattr(self, name), k + name, low=0, integer=True)
        # finite: inf passed `> 0`/`>= 0` and trained a non-finite policy (audit52 W4)
        check_number(self.lr, k + "lr", low=0, low_open=True)
        check_number(self.noise_level, k + "noise_level", low=NOISE_LEVEL_MIN)
        for name in ("grad_clip", "kl_coef", "cotrain_weight"):
            check_number(getattr(self, name), k + name, low=0)
        if self.eval_every and self.save_every and self.save_every % self.eval_every:
            # named here: the trainer's own rule would name its eval_interval/save_interval (audit52 W6)
            raise ConfigError(
                f"{k}save_every={self.save_every} is not a multiple of {k}eval_every={self.eval_every}",
                field=k + "save_every",
                hint=f"every checkpoint should carry an evaluation: make {k}save_every a multiple",
            )
        _check_seed(k + "seed", self.seed, SEED_MAX)
        # a group is group_size rollouts per init state held at once: bounded like init_states x group_size below
        check_number(self.group_size, k + "group_size", low=2, high=GROUP_SIZE_MAX, integer=True)
        if self.init_states * self.group_size > ROLLOUTS_MAX:
            raise ConfigError(
                f"{k}init_states x {k}group_size = {self.init_states} x {self.group_size} rollouts per round is over "
                f"{ROLLOUTS_MAX}",
                field=k + "group_size",
                hint=f"lower {k}init_states or {k}group_size (their product is the episodes simulated per round)",
            )
        if self.world_size > 1 and self.launcher != "ray":
            raise ConfigError(
                f"{k}world_size={self.world_size} needs {k}launcher=ray ({self.launcher!r} runs one worker)",
                field=k + "launcher",
                hint=f"set {k}launcher=ray, or {k}world_size=1",
            )
        per_pass = self.micro_init_states * self.world_size
        if self.init_states % per_pass:
            raise ConfigError(
                f"{k}init_states={self.init_states} is not a multiple of {k}micro_init_states x {k}world_size = "
                f"{self.micro_init_states} x {self.world_size}",
                field=k + "micro_init_states",
                hint=f"pick {k}init_states as a multiple of {per_pass}, or lower {k}micro_init_states",
            )
        if not 0.0 < self.clip_eps < 1.0:
            raise ConfigError(
                f"{k}clip_eps={self.clip_eps} is outside (0, 1)",
                field=k + "clip_eps",
                hint=f"set {k}clip_eps to a number in (0, 1), e.g. 0.2 (PPO's usual)",
            )
        if self.reward not in REWARDS:
            raise ConfigError(
                f"{k}reward={self.reward!r} is not success_at_end, success_once or progress",
                field=k + "reward",
                hint=f"set {k}reward to one of: {', '.join(REWARDS)}",
            )
        if self.advantage_scale not in ADVANTAGE_SCALES:
            raise ConfigError(
                f"{k}advantage_scale={self.advantage_scale!r} is not {', '.join(ADVANTAGE_SCALES)}",
                field=k + "advantage_scale",
                hint=f"set {k}advantage_scale to one of: {', '.join(ADVANTAGE_SCALES)}",
            )
        mu = self.updates_per_rollout
        for name in ("steps", "save_every"):
            if getattr(self, name) % mu:
                raise ConfigError(
                    f"{k}{name}={getattr(self, name)} is not a multiple of {k}updates_per_rollout={mu}",
                    field=k + name,
                    hint="a checkpoint must fall on a rollout-round boundary, so a resume regenerates no rollout",
                )
        check_tasks("rl.tasks", self.tasks, self.max_steps, field_max="rl.max_steps")
        if self.reward == "progress" and any(_is_libero(t) for t in self.tasks):
            raise ConfigError(
                f"{k}reward=progress needs the object-goal distance of a Fetch task; {k}tasks={list(self.tasks)} "
                "names LIBERO",
                field=k + "reward",
                hint="use rl.reward=success_at_end on LIBERO",
            )
        if any(_is_libero(t) for t in self.tasks) and self.eval_episodes > _INIT_STATES:
            raise ConfigError(
                f"{k}eval_episodes={self.eval_episodes} is past LIBERO's {_INIT_STATES} init states per task",
                field=k + "eval_episodes",
                hint=f"set {k}eval_episodes to 1..{_INIT_STATES}",
            )
        if self.cotrain_weight > 0 and not self.cotrain_dataset:
            raise ConfigError(
                f"{k}cotrain_weight={self.cotrain_weight} names no {k}cotrain_dataset",
                field=k + "cotrain_dataset",
                hint=f"set {k}cotrain_dataset to an SFT dataset folder (e.g. ${{BUNDLE}}/data/sft), or "
                f"{k}cotrain_weight=0",
            )
        self.train_config()  # the trainer's own rules, named

    def train_config(self, max_steps: int | None = None) -> TrainConfig:
        """The trainer's config: one "sample" is one init state (its group of rollouts)."""
        steps = int(max_steps if max_steps is not None else self.steps)
        if steps % self.updates_per_rollout:
            raise ConfigError(
                f"target step {steps} is not a multiple of rl.updates_per_rollout={self.updates_per_rollout}",
                field="rl.steps",
            )
        return TrainConfig(
            max_steps=steps,
            global_batch=self.init_states,
            micro_batch=self.micro_init_states,
            world_size=self.world_size,
            launcher=self.launcher,
            device=self.device,
            seed=self.seed,
            shuffle=False,
            lr=self.lr,
            grad_clip=self.grad_clip,
            weight_decay=0.0,
            eval_interval=self.eval_every,
            save_interval=self.save_every,
            log_interval=1,
            canary_samples=1,
            cpu_threads=self.cpu_threads,
        )


SEED_MAX = 2**32 - 1
"""numpy's and LIBERO's env.seed bound: a seed outside 0..SEED_MAX failed only after sft trained (audit51 H3)."""


def _check_seed(name: str, value: int, most: int) -> None:
    """ConfigError (exit 4) naming `name` when `value` is outside 0..most, at config load (before any stage)."""
    if not 0 <= value <= most:
        raise ConfigError(f"{name}={value} is outside 0..{most}", field=name, hint=f"set {name} to 0..{most}")


@dataclass(kw_only=True, slots=True)
class GrpoEvalSection:
    """The `eval` stage: the SFT and the RL policy on the same held-out episodes (odd "eval" reset seeds)."""

    tasks: list[str] = field(default_factory=lambda: ["FetchPush-v4"])
    """Simulator tasks: Fetch env ids, or LIBERO task ids (`libero_10/0`, evaluated by LIBERO's protocol, camera-free:
    the task's first N fixed init states, in order); one kind per run, the rollouts' kind."""
    episodes_per_task: int = 100
    """Episodes per task and policy (LIBERO: at most its 50 init states)."""
    seed: int = 100000
    """Evaluation seed (Fetch: which held-out states; LIBERO: the per-episode seed base, the init states are fixed);
    0..2**32-51, as an episode's LIBERO seed is this plus its init index (< 50) and env seeds stop at 2**32-1."""
    max_steps: int | None = None
    """Policy steps per episode; None = the task's (Fetch: always 50; LIBERO: the suite's limit). LIBERO only: a
    lower value is for short runs and tests, and the evidence records it."""
    workers: int = field(default=1, metadata=same_outputs())
    """Simulator worker processes."""
    videos: int = 0
    """MP4s of the first N episodes per task."""
    reference: str | None = field(default=None, metadata=same_outputs())
    """Reference evidence the compare stage compares with (none: compare records that there was none)."""

    def __post_init__(self) -> None:
        check_tasks("eval.tasks", self.tasks, self.max_steps, field_max="eval.max_steps")
        _check_seed("eval.seed", self.seed, SEED_MAX - _INIT_STATES)
        # workers: the eval stage reports them as its world size, which the runner holds to >= 1; the counts as
        # RECAP's eval section refuses them (audit52 W6)
        check_number(self.workers, "eval.workers", low=1, integer=True)
        check_number(self.episodes_per_task, "eval.episodes_per_task", low=1, integer=True)
        check_number(self.videos, "eval.videos", low=0, integer=True)
        if any(_is_libero(t) for t in self.tasks):
            if not 1 <= self.episodes_per_task <= _INIT_STATES:
                raise ConfigError(
                    f"eval.episodes_per_task={self.episodes_per_task} is outside 1..{_INIT_STATES}: LIBERO's protocol "
                    f"runs each task's first N of its {_INIT_STATES} init states",
                    field="eval.episodes_per_task",
                    hint=f"set eval.episodes_per_task to 1..{_INIT_STATES}",
                )
            if self.videos:
                raise ConfigError(
                    f"eval.videos={self.videos}: LIBERO evaluation records no videos", field="eval.videos", hint="set 0"
                )


_INIT_STATES = 50
"""LIBERO's fixed init states per task (reproduction/sim/libero/tasks.py INIT_STATES_PER_TASK)."""


def _is_libero(task: str) -> bool:
    """A LIBERO task id, or what is meant as one (a misspelt suite: its error then names LIBERO's suites); static,
    as RECAP's eval.tasks check: Fetch ids never hold a "/"."""
    from reproduction.sim.libero.tasks import is_libero_id

    return is_libero_id(task) or "/" in task or task.lower().startswith("libero")


def check_tasks(key: str, tasks: list[str], max_steps: int | None, *, field_max: str) -> None:
    """What can be checked of `key`'s tasks without LIBERO installed: not empty, one kind (a policy acts in 4 dims
    on Fetch, 7 on LIBERO), each LIBERO id's suite and index (names are resolved, and Fetch ids checked, at
    preflight), and `max_steps` (LIBERO only, >= 1). ConfigError naming the field."""
    from reproduction.errors import PortableError

    if not tasks:
        raise ConfigError(f"{key} is empty; name at least one task", field=key, hint=f"e.g. {key}=[FetchPush-v4]")
    libero = [t for t in tasks if _is_libero(t)]
    if libero and len(libero) != len(tasks):
        other = [t for t in tasks if t not in libero]
        raise ConfigError(
            f"{key} mixes LIBERO tasks ({', '.join(libero)}) with others ({', '.join(other)})",
            field=key,
            hint="a policy acts on LIBERO (7-dim actions) or on Fetch (4), not both: name one kind per run",
        )
    for task in libero:  # Fetch ids are checked at preflight, with the run's other problems
        try:
            from reproduction.sim.libero.tasks import parse_task_id

            every = parse_task_id(task).every
        except PortableError as exc:
            raise ConfigError(f"{key}: {exc.message}", field=key, hint=exc.hint) from None
        if every:
            raise ConfigError(f"{key}: {task!r} names a whole suite", field=key, hint="name one task per entry")
    if max_steps is not None and not libero:
        raise ConfigError(
            f"{field_max}={max_steps}: Fetch episodes are always 50 steps",
            field=field_max,
            hint=f"set {field_max}=null",
        )
    if max_steps is not None and max_steps < 1:
        raise ConfigError(
            f"{field_max}={max_steps} must be >= 1", field=field_max, hint=f"set {field_max}=null (the suite's limit)"
        )
    if max_steps is not None:
        check_number(max_steps, field_max, low=1, integer=True)


@dataclass(kw_only=True, slots=True)
class GrpoRunConfig:
    """A whole GRPO run."""

    recipe: str = "grpo"
    """The recipe this config is for: `grpo`, or `package.module:NAME` naming a recipe that uses this schema."""
    BUNDLE: str = ""
    """The restored bundle's folder (set by `portable run`)."""
    RUN: str = ""
    """The run folder (set by `portable run`)."""
    sft: SftSection = field(default_factory=SftSection)
    """The SFT initialisation."""
    rl: RlSection = field(default_factory=RlSection)
    """Online RL."""
    eval: GrpoEvalSection = field(default_factory=GrpoEvalSection)
    """Evaluation and evidence."""
    ray_address: str | None = None
    """Join this Ray cluster instead of starting a local one."""
    min_free_gb: float = 1.0
    """Preflight: free disk space the run folder needs (GiB)."""

    def __post_init__(self) -> None:
        check_number(self.min_free_gb, "min_free_gb", low=0)  # nan disabled the disk check (audit52 W7)
        if self.recipe != "grpo" and ":" not in self.recipe:  # a recipe of another name brought another schema
            raise ConfigError(f"recipe={self.recipe!r} in a GRPO config", field="recipe", hint="set recipe: grpo")
        if _is_libero(self.rl.tasks[0]) != _is_libero(self.eval.tasks[0]):
            raise ConfigError(
                f"rl.tasks {list(self.rl.tasks)} and eval.tasks {list(self.eval.tasks)} are of different simulators",
                field="eval.tasks",
                hint="evaluate in the world the policy is trained in (both Fetch, or both LIBERO)",
            )
        self._check_cameras()

    @staticmethod
    def component_checks() -> dict[type, Any]:
        """{section type: its component's rules, called as check(values, key=...)}: `sft.train` is a TrainConfig,
        whose __post_init__ would name a bare field (`lr=inf`, audit52 W4)."""
        from reproduction.train.config import check_train_values

        return {TrainConfig: check_train_values}

    def _check_cameras(self) -> None:
        """sft.model.cameras against the world: keys the simulator renders (Fetch's or LIBERO's; a co-training
        dataset must hold them too: preflight.py); on LIBERO no privileged object state beside them (a rendering
        LIBERO env observes none)."""
        model = self.sft.model
        if not model.cameras:
            return
        libero = _is_libero(self.rl.tasks[0])
        camera_names(model.cameras, libero=libero)
        if libero and OBJECT_STATE in model.state_keys:
            raise ConfigError(
                f"sft.model.state_keys={list(model.state_keys)}: a LIBERO env that renders cameras observes no "
                f"{OBJECT_STATE} (LIBERO's privileged object poses come only without cameras)",
                field="sft.model.state_keys",
                hint="set sft.model.state_keys=[observation.state] and sft.model.state_dims=null with cameras, or "
                "sft.model.cameras={} for privileged state",
            )
