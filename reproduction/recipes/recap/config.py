"""RECAP's run config: the schema (config dataclasses) the generic loader (run/config.py) fills.

Every key and its one-line doc is listed in docs/config.md, generated from these dataclasses
(`python -m reproduction.run.config`).

    recipe                      recap (the default recipe: a config without it is RECAP's)
    BUNDLE, RUN                 set by `portable run` (placeholders)
    datasets[]                  path, type, weight, value, policy
    returns                     stage 1 (ReturnsSection)
    value.model / .train / .infer   stage 2: ValueConfig and TrainConfig (the packages' own), inference
    advantages                  stage 3 (AdvantageConfig)
    policy.model / .train       stage 4: PolicyConfig and TrainConfig (the packages' own); policy.modes
    eval                        stage 5 (EvalSection)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reproduction.config_fields import check_bool, check_name, check_number, same_outputs
from reproduction.errors import ConfigError, PortableError
from reproduction.recap.advantage_config import AdvantageConfig
from reproduction.recap.value.config import ValueConfig
from reproduction.train.config import TrainConfig

DATASET_TYPES = ("sft", "rollout")


@dataclass(kw_only=True, slots=True)
class DatasetConfig:
    """One LeRobot dataset of the run."""

    path: str = "???"
    """Dataset root (usually ${BUNDLE}/data/<name>); its folder name names it in sidecars, fold plans and
    metrics, so folder names must be unique within a run, and one dataset may be listed once (not again through
    a link or as a copy: refused, exit 4). A relative path is read from the current folder (where `portable`
    runs), not the config file's folder, and run.json keeps it as written: give an absolute path or
    ${BUNDLE}/... when the run may be resumed or read from elsewhere."""
    type: str = "rollout"
    """sft (every episode a success) or rollout (is_success decides: bool or 0/1, the last frame's is the outcome;
    missing values, NaN and others are refused); RLinf's compute_returns defaults to sft."""
    weight: float = 1.0
    """Mixture weight when training on several datasets (a finite number > 0)."""
    value: bool = True
    """The value model (stage 2) trains on this dataset."""
    policy: bool = True
    """The policy (stage 4) trains on this dataset."""

    def __post_init__(self) -> None:
        # nan or a negative weight made a mixture share nan or negative (audit52 W7); `path` is checked where read
        check_number(self.weight, "datasets[].weight", low=0, low_open=True)
        check_bool(self.value, "datasets[].value")
        check_bool(self.policy, "datasets[].policy")
        # its folder name names it in sidecar folders: `.../data/sft/..` named it `..` (audit52 W3)
        if Path(self.path).name in ("", ".", ".."):
            raise ConfigError(
                f"datasets[].path={self.path!r} does not end in a dataset folder's name",
                field="datasets[].path",
                hint="give the dataset folder's own path, e.g. ${BUNDLE}/data/sft (not one ending in ..)",
            )


@dataclass(kw_only=True, slots=True)
class ReturnsSection:
    """Stage 1 (RLinf's recap_compute_returns.yaml); each dataset's sft/rollout type comes from `datasets`."""

    gamma: float = 1.0
    """Discount in (0, 1]."""
    failure_reward: float = -300.0
    """Reward of a failed episode's last frame."""
    tag: str | None = None
    """Sidecar tag: returns_{tag}.parquet (stage 3 reads the same tag); a plain name (letters, digits, - _ .)."""

    def __post_init__(self) -> None:
        from reproduction.recap.returns import check_returns_values

        check_returns_values(self, key="returns")  # ReturnsConfig's rules, at load, naming returns.KEY
        # the tag becomes a file name: `x/../..` wrote outside the run folder (audit52 W3)
        check_name(self.tag, "returns.tag")


@dataclass(kw_only=True, slots=True)
class ValueInferSection:
    """Stage 3's value inference (every frame labelled by the fold model that did not train on it)."""

    batch_size: int = 64
    """Frames per forward."""
    workers: int = 1
    """Shards run concurrently, one Ray worker (one device) each; 1 = in this process, no Ray. On CPU
    with no Ray given, this process is one of them: it infers while the local Ray starts."""
    device: str = "auto"
    """auto, cpu, cuda or npu (auto: what `portable check` selects)."""

    def __post_init__(self) -> None:
        from reproduction.train.device import check_device_kind

        _check_ranges("value.infer", (("batch_size", self.batch_size, 1), ("workers", self.workers, 1)))
        check_device_kind(self.device, key="value.infer.device")  # at load, not when stage 3 starts


def _value_train() -> TrainConfig:
    return TrainConfig(max_steps=300, global_batch=32, micro_batch=16, launcher="inprocess", device="cpu")


@dataclass(kw_only=True, slots=True)
class ValueSection:
    """Stage 2: value-model SFT, one model per cross-fitting fold."""

    model: ValueConfig = field(default_factory=ValueConfig)
    """What the value model is and reads."""
    train: TrainConfig = field(default_factory=_value_train)
    """How it trains (the training core's config)."""
    infer: ValueInferSection = field(default_factory=ValueInferSection)
    """How stage 3 infers every frame's value."""


try:  # stage 4 (recap/policy) joins the schema where it is installed
    from reproduction.recap.policy.config import PolicyConfig
except ImportError:  # pragma: no cover - a build without the policy stage

    @dataclass(kw_only=True, slots=True)
    class PolicyConfig:
        """Stage 4 is not installed in this build."""


def _policy_train() -> TrainConfig:
    return TrainConfig(max_steps=1000, global_batch=64, micro_batch=64, launcher="inprocess", device="cpu", lr=1e-3)


@dataclass(kw_only=True, slots=True)
class PolicySection:
    """Stage 4: the flow-matching policy, one per mode (RECAP and its baselines, same model and steps)."""

    modes: list[str] = field(default_factory=lambda: ["recap"])
    """Policies to train: recap (advantage-conditioned), bc (all data), filtered_bc (successes only)."""
    model: PolicyConfig = field(default_factory=PolicyConfig)
    """What the policy is and reads."""
    train: TrainConfig = field(default_factory=_policy_train)
    """How each policy trains (the training core's config)."""

    def __post_init__(self) -> None:
        known = ("recap", "bc", "filtered_bc")
        bad = [m for m in self.modes if m not in known]
        if not self.modes or bad or len(set(self.modes)) != len(self.modes):
            raise ConfigError(
                f"policy.modes={list(self.modes)} must name each of {', '.join(known)} at most once, at least one",
                field="policy.modes",
                hint="e.g. policy.modes=[recap,bc]",
            )


@dataclass(kw_only=True, slots=True)
class SequentialSection:
    """Sequential evaluation: evaluate in looks and stop once the comparison with eval.reference is settled."""

    enabled: bool = False
    """Evaluate in looks and stop early once every rate the comparison tests is reproduced or differs at the
    look's error-spending level (reproduction.run.sequential); needs eval.reference. Off: one fixed evaluation."""
    looks: int = 4
    """Looks at k/looks of eval.episodes_per_task, k = 1..looks, each rounded up to whole batches of 25
    episodes (so fewer looks when episodes_per_task is small)."""
    rho: float = 3.0
    """Error-spending exponent: by the look at fraction t of the episodes, alpha * t^rho is spent (3: little
    early, so the last look loses little)."""

    def __post_init__(self) -> None:
        _check_ranges("eval.sequential", (("looks", self.looks, 1),))
        check_bool(self.enabled, "eval.sequential.enabled")
        if not 0 < self.rho <= 100:  # also refuses nan
            raise ConfigError(
                f"eval.sequential.rho={self.rho} must be > 0 (and at most 100)",
                field="eval.sequential.rho",
                hint="3 (the default) spends little alpha at the early looks; 1 spends it evenly",
            )


@dataclass(kw_only=True, slots=True)
class LiberoEvalSection:
    """How LIBERO tasks in eval.tasks are evaluated (upstream's protocol, docs/libero.md); unused for Fetch tasks."""

    chunk: int = 5
    """Actions executed per policy call (RLinf's openpi evals: num_action_chunks 5)."""
    cameras: bool = True
    """Render upstream's two 180-degree-rotated views; false = no cameras, LIBERO's privileged object state
    instead (CPU tiers only: the evidence says so)."""
    image_size: int = 256
    """Camera images are image_size x image_size (RLinf's 256); 8..512, the generator's range."""
    max_steps: int | None = None
    """Policy steps per episode; None = the suite's limit (spatial 240, object 280, goal 320, 10 520). A lower
    value is for reduced runs and tests, and the evidence records it."""

    def __post_init__(self) -> None:
        _check_ranges("eval.libero", (("chunk", self.chunk, 1),))
        # the generator's --image-size range: a typo such as 25600 would ask for ~2 GB a frame (audit55 E6)
        check_number(self.image_size, "eval.libero.image_size", low=8, high=512, integer=True)
        check_bool(self.cameras, "eval.libero.cameras")
        if self.max_steps is not None:
            _check_ranges("eval.libero", (("max_steps", self.max_steps, 1),))


@dataclass(kw_only=True, slots=True)
class EvalSection:
    """Stage 5: closed-loop evaluation of the trained policies in the simulator, and the evidence."""

    tasks: list[str] = field(default_factory=lambda: ["FetchPickAndPlace-v4"])
    """Simulator tasks: Fetch environment ids, or LIBERO task ids (`libero_10/0`, `libero_spatial/*`,
    `<suite>/<task name>`); one kind per run."""
    episodes_per_task: int = 50
    """Episodes per task and policy (Fetch: fixed reset seeds from `seed`; LIBERO: the task's first N of its 50
    fixed init states, in order)."""
    seed: int = 1000
    """First reset seed (held out from the training data's seeds); LIBERO: the policy's per-episode seed base."""
    guidance_scales: list[float] = field(default_factory=lambda: [1.0, 2.0])
    """Classifier-free guidance scales w evaluated for the recap policy (baselines run at w = 1)."""
    workers: int = field(default=1, metadata=same_outputs())
    """Evaluation processes (episodes split across them, no collectives; LIBERO: one env per task each, 1.5-2.6 GB)."""
    videos: int = 0
    """Episodes per policy saved as video (Fetch only)."""
    reference: str | None = field(default=None, metadata=same_outputs())
    """Reference evidence JSON the compare stage checks the evaluation against (usually ${BUNDLE}/evidence/...;
    its sha256 keys that stage only, so a new reference recompares without evaluating again, unless
    eval.sequential is on); None = none."""
    sequential: SequentialSection = field(default_factory=SequentialSection)
    """Sequential evaluation (off by default): stop early once the verdict against eval.reference is settled."""
    libero: LiberoEvalSection = field(default_factory=LiberoEvalSection)
    """LIBERO's protocol settings (used when eval.tasks names LIBERO tasks)."""

    def __post_init__(self) -> None:
        _check_ranges(
            "eval",
            (
                ("episodes_per_task", self.episodes_per_task, 1),
                ("workers", self.workers, 1),
                ("videos", self.videos, 0),
                ("seed", self.seed, 0),
            ),
        )
        if not self.tasks:
            raise ConfigError(
                "eval.tasks is empty; name at least one simulator task",
                field="eval.tasks",
                hint="e.g. eval.tasks=[FetchPush-v4]",
            )
        libero = [t for t in self.tasks if is_libero_task(t)]
        if libero:
            _check_libero_tasks(self, libero)
        else:
            try:
                from reproduction.sim.tasks import get_task
            except ImportError:  # pragma: no cover - a build without the simulator
                get_task = None
            for task in self.tasks if get_task is not None else ():
                try:
                    get_task(task)
                except PortableError as exc:
                    hint = f"{exc.hint}, or LIBERO task ids such as libero_10/0" if exc.hint else None
                    raise ConfigError(f"eval.tasks: {exc.message}", field="eval.tasks", hint=hint) from None
        if self.sequential.enabled and libero:
            # the looks split Fetch's seeded batches; LIBERO's protocol runs init states per policy, not in looks
            raise ConfigError(
                f"eval.sequential.enabled=true is not supported for LIBERO tasks yet (eval.tasks names {libero[0]})",
                field="eval.sequential.enabled",
                hint="set eval.sequential.enabled=false for LIBERO evaluations",
            )
        if self.sequential.enabled and not self.reference:
            raise ConfigError(
                "eval.sequential.enabled=true needs eval.reference: each look compares with reference evidence",
                field="eval.reference",
                hint="set eval.reference=${BUNDLE}/evidence/<file>.json, or eval.sequential.enabled=false",
            )
        if self.sequential.enabled:
            _check_look_levels(self)
        if not self.guidance_scales or not all(
            isinstance(w, int | float) and 0 <= w < math.inf for w in self.guidance_scales
        ):
            raise ConfigError(
                f"eval.guidance_scales={list(self.guidance_scales)} must be a non-empty list of finite values >= 0",
                field="eval.guidance_scales",
            )


def _check_look_levels(ev: EvalSection) -> None:
    """Every look of a sequential evaluation tests at its share of alpha, (t_k^rho - t_(k-1)^rho) alpha: refuse a
    rho (with its looks) whose smallest share would put a look's level below stats.MIN_ALPHA even at the largest
    alpha a reference can declare (0.5), where 1 - 2 a_k rounds to 1 (an internal error after the first look's
    episodes, audit46 stats F5). The reference's own alpha is checked the same way before the first episode."""
    from reproduction.run.sequential import SequentialRule
    from reproduction.run.stats import MIN_ALPHA

    rule = SequentialRule(looks=ev.sequential.looks, rho=ev.sequential.rho, alpha=1.0)
    n = ev.episodes_per_task
    sizes = rule.sizes(n, 25)  # whole batches of the simulator's 25 episodes, as the eval stage looks
    share = rule.spend([size / n for size in sizes])
    k = min(range(len(share)), key=share.__getitem__)
    if 0.5 * share[k] < MIN_ALPHA:
        raise ConfigError(
            f"eval.sequential.rho={ev.sequential.rho} with eval.sequential.looks={ev.sequential.looks} leaves look "
            f"{k + 1} of {len(sizes)} ({sizes[k]} of {n} episodes per task) a share {share[k]:.3g} of alpha: its "
            f"test level would be below {MIN_ALPHA:g}, the smallest recap-portable computes, whatever the "
            "reference's alpha",
            field="eval.sequential.rho",
            hint="3 (the default) spends little alpha at the early looks; 1 spends it evenly",
        )


def is_libero_task(task: str) -> bool:
    """True when an eval.tasks entry is meant for LIBERO (`libero_10/0`; also a misspelt suite such as
    `libero_99/0` or `libero_10`, so its error names LIBERO's suites, not Fetch's ids). Static: LIBERO need not be
    installed; Fetch ids never contain a "/"."""
    from reproduction.sim.libero.tasks import is_libero_id

    return is_libero_id(task) or "/" in task or task.lower().startswith("libero")


def _check_libero_tasks(ev: EvalSection, libero: list[str]) -> None:
    """What can be checked of LIBERO ids without LIBERO installed (suite, task index, init-state count; names are
    resolved at preflight): ConfigError naming eval.tasks or eval.episodes_per_task. A run evaluates one kind of
    task: a policy acts in 7 dims on LIBERO and 4 on Fetch."""
    from reproduction.sim.libero.tasks import INIT_STATES_PER_TASK, parse_task_id

    other = [t for t in ev.tasks if t not in libero]
    if other:
        raise ConfigError(
            f"eval.tasks mixes LIBERO tasks ({', '.join(libero)}) with others ({', '.join(other)})",
            field="eval.tasks",
            hint="a policy acts on LIBERO (7-dim actions) or on Fetch (4), not both: name one kind per run",
        )
    for task in libero:
        try:
            parse_task_id(task)
        except PortableError as exc:
            raise ConfigError(f"eval.tasks: {exc.message}", field="eval.tasks", hint=exc.hint) from None
    if ev.episodes_per_task > INIT_STATES_PER_TASK:
        raise ConfigError(
            f"eval.episodes_per_task={ev.episodes_per_task} is past LIBERO's {INIT_STATES_PER_TASK} init states per "
            "task (the protocol runs each task's first N, in order)",
            field="eval.episodes_per_task",
            hint=f"set eval.episodes_per_task to 1..{INIT_STATES_PER_TASK}",
        )
    if ev.videos:
        raise ConfigError(
            f"eval.videos={ev.videos}: LIBERO evaluation does not record videos yet",
            field="eval.videos",
            hint="set eval.videos=0",
        )


def _check_ranges(section: str, values: tuple[tuple[str, Any, float], ...]) -> None:
    """ConfigError naming the first `section.key` (`key` at the top level) whose value is below its minimum
    (checked when the config loads, so a run that could not finish is refused before any stage trains)."""
    for key, value, least in values:
        name = f"{section}.{key}" if section else key
        # an int minimum marks a count (a whole number, int64); a float one a finite quantity (audit52 W4/W7)
        check_number(value, name, low=least, integer=isinstance(least, int))


@dataclass(kw_only=True, slots=True)
class RunConfig:
    """A whole RECAP run: datasets and one section per stage."""

    recipe: str = "recap"
    """The recipe this config is for (`recap`, or `package.module:RECIPE` for a recipe of your own); read
    before the rest of the config, whose schema it brings."""
    BUNDLE: str = ""
    """The restored bundle's folder (set by `portable run`; write ${BUNDLE} in paths)."""
    RUN: str = ""
    """The run folder (set by `portable run --output`; write ${RUN} in paths)."""
    datasets: list[DatasetConfig] = field(default_factory=list)
    """The run's LeRobot datasets."""
    returns: ReturnsSection = field(default_factory=ReturnsSection)
    """Stage 1: rewards and returns."""
    value: ValueSection = field(default_factory=ValueSection)
    """Stage 2: the value model."""
    advantages: AdvantageConfig = field(default_factory=AdvantageConfig)
    """Stage 3: N-step advantages, thresholds and labels (returns_tag is set from returns.tag)."""
    policy: PolicySection = field(default_factory=PolicySection)
    """Stage 4: the policies."""
    eval: EvalSection = field(default_factory=EvalSection)
    """Evaluation in the simulator and the evidence it writes."""
    ray_address: str | None = None
    """Join this Ray cluster instead of starting a local one."""
    min_free_gb: float = 1.0
    """Preflight: free disk space the run folder needs (GiB; a finite number >= 0)."""

    def __post_init__(self) -> None:
        _check_ranges("", (("min_free_gb", self.min_free_gb, 0.0),))  # nan disabled the disk check (audit52 W7)
        # the run config's AdvantageConfig section: its tags become file names as returns.tag does (audit52 W3)
        check_name(getattr(self.advantages, "tag", None), "advantages.tag")
        check_name(getattr(self.advantages, "returns_tag", None), "advantages.returns_tag")
        check_number(self.advantages.lookahead, "advantages.lookahead", low=1, integer=True)  # int64, not 10^23

    @staticmethod
    def component_checks() -> dict[type, Any]:
        """{section type: its component's rules, called as check(values, key=...)} for the sections whose type is
        a component's own config dataclass, whose __post_init__ (run by to_object) would name a bare field
        (`value.train` and `policy.train`: TrainConfig; `value.model`: ValueConfig; `policy.model`: PolicyConfig;
        `advantages`: AdvantageConfig)."""
        from reproduction.recap.advantage_config import check_advantage_values
        from reproduction.recap.value.config import check_value_values
        from reproduction.train.config import check_train_values

        checks = {
            TrainConfig: check_train_values,
            AdvantageConfig: check_advantage_values,
            ValueConfig: check_value_values,
        }
        try:
            from reproduction.recap.policy.config import check_policy_values
        except ImportError:  # pragma: no cover - a build without the policy stage
            return checks
        return {**checks, PolicyConfig: check_policy_values}


def load_config(
    files: list[Path] | None = None,
    overrides: list[str] | None = None,
    *,
    bundle: Path | None = None,
    run_dir: Path | None = None,
) -> RunConfig:
    """RECAP's run config from YAML files and overrides: run/config.py's `load_config` with this schema."""
    from reproduction.run.config import load_config as load

    return load(files, overrides, bundle=bundle, run_dir=run_dir, schema=RunConfig)
