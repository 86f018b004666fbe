"""The recipe protocol: a recipe is data, the stage graph (names, upstream stages, config subsets, outputs)
the runner walks.

The runner knows nothing of RECAP: a recipe names its stage functions as "module:function" strings
(imported only when the stage runs, so a finished `--resume` imports no torch), the config subsets
each stage reads (part of the stage's key), and where its outputs are. A second pipeline is a second
Recipe value, with no change to run/: `portable run` finds it by the name its config gives
(`recipe: recap` is reproduction/recipes/recap/; `recipe: package.module:RECIPE` any importable one).

A leaf module (it imports only the error tree): recipes (reproduction/recipes/*, or out of the tree) and the
runner (reproduction/run/) both import it, and neither imports the other through it.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reproduction.errors import ConfigError

STAGE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
"""A stage's name is its folder in the run folder, which the runner clears before a fresh run of the stage: one plain
path part (no separator, no dot: not `..`, `/abs`, `run.json`)."""

RUN_FOLDER_NAMES = frozenset({"lineage", "evidence", "plots", "eval_checkpoint"})
"""Folders the runner and the CLI write in every run folder beside the stages' (lineage statements, evidence,
report plots, `portable eval`'s work): no stage may be named after one."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StageSpec:
    """One node of the stage graph."""

    name: str
    """Stage name: also its folder in the run and its `--stages` / `--restart-stage` name."""
    fn: str
    """"module:function" called as fn(StageContext) -> StageOutput (the reference is part of its key; that it names a
    function callable so, not an async def, is checked before anything runs)."""
    needs: tuple[str, ...] = ()
    """Upstream stages whose outputs it reads (their output digests are part of its key)."""
    config: tuple[str, ...] = ()
    """Dotted config subsets it reads (their resolved values are part of its key, less the fields inside them declared
    not to change outputs: `same_outputs()` field metadata, reproduction/config_fields.py)."""
    inputs: bool = True
    """Its key includes the fingerprints of the recipe's opened inputs (datasets)."""
    outputs: tuple[str, ...] = ("**/*",)
    """Globs (relative to the stage folder) of the files that are its outputs (digested, verified on resume)."""
    training: str | None = None
    """For a training stage: the dotted key of its integer step count, e.g. "train.steps", never a section
    (`--target-step` raises it; a killed run continues from the newest complete checkpoint). Exempt from the key."""
    target: bool = True
    """For a training stage: whether a `--target-step N` that names no `--stages` trains it to N. False for a stage
    that only initialises a later one (GRPO's sft: "resume from step 60, train to 80" means rl's steps, and sft
    continued to N would retrain it and redo rl from step 0, audit55 H3); it then runs as a plain --resume would.
    Named in `--stages`, it is trained to N like any other."""
    code: tuple[str, ...] = ()
    """Modules whose source is part of its key (a code change is a changed input), beside the module of `fn`, which
    always is; a package named here keys every .py file under its folder."""
    files: tuple[str, ...] = ()
    """Dotted config keys naming files it reads by path (not datasets): their sha256 is part of its key and
    each is a lineage input. An unset key (None or "") counts as no file."""
    files_if: tuple[tuple[str, str], ...] = ()
    """(dotted file key, dotted boolean key): like `files`, but only while the boolean key is true (the eval
    stage reads the reference evidence only when eval.sequential.enabled); while it is false the stage's key
    and lineage are as if the file were not listed."""
    weights: tuple[str, ...] = ()
    """Dotted config keys of model sections whose `pretrained_manifest` (with `weights_dir`) names the starting
    weights it initialises from: the manifest and every weights file it lists are lineage inputs (role
    `weights`). Not part of its key beyond the section's own values: the stage verifies each file's sha256
    against the manifest when it loads it."""
    redo_on_change: bool = False
    """A changed key redoes it instead of refusing: for a cheap stage whose outputs only derive from its
    inputs (a comparison), so there is nothing worth protecting from a rerun."""
    uses_ray: Callable[[Any], bool] | None = None
    """(the run's typed config) -> whether the stage runs workers on Ray: the predicate its function hands
    `ctx.ray_for`, so that a `--ray-address` is probed before anything runs only when a stage to run will join it.
    None (a recipe that does not say): the probe guesses from the config sections in `config` (a `launcher: ray` or
    `workers` above 1 at any depth, reproduction/train/ray_connect.py may_use_ray)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Recipe:
    """A pipeline: its stages in order and how its inputs are opened."""

    name: str
    """Recipe name (stored in run.json; a run folder keeps one recipe)."""
    stages: tuple[StageSpec, ...]
    """Stages in dependency order."""
    open_inputs: str | None = None
    """"module:function" (config) -> {name: opened input with a `.fingerprint`}; opened once per run. One that takes a
    keyword `digests` gets the run's digest cache (reproduction/digest_cache.py) to hash the inputs through."""
    preflight: str | None = None
    """"module:function" (config, run_dir, opened, stage names) -> list of problems (errors or strings), checked before
    anything runs, after the runner's checks of every run (run/preflight.py's run_problems: placeholders, the bundle's
    weights and files; not called when those found the bundle's files damaged); inputs it opens go into the dict
    `opened` and are used instead of open_inputs'. Takes `digests` like open_inputs."""
    config_schema: str | type | None = None
    """"module:Class", or the dataclass itself: the config dataclass `portable run` loads the run config into (None:
    the recipe is run by code only, with a config object it builds itself). Anything else is a ConfigError (exit 4)
    when `portable run` loads a config for the recipe (run/resolve.py recipe_schema)."""
    evaluate: str | None = None
    """"module:function" (args, run_dir, state, ui) -> exit code behind `portable eval --checkpoint` for this recipe's
    runs: `args` the parsed command line (`checkpoint`, `output`, `config`, `overrides`), `run_dir` the --output
    folder (a Path), `state` its run.json (a dict; None when the folder holds no run), `ui` the output options
    (reproduction.ui.UiOptions). One that cannot be called so, or returns no int, is a StageProtocolError (exit 54).
    None: the recipe has no such command."""
    headline: str | None = None
    """"module:function" (run_dir) -> list of lines `portable run` prints last (stderr, not with --json) while the
    run's results are current: its headline numbers and verdict. RECAP's and GRPO's is
    reproduction.run.compare_cmd:run_results_lines (their eval and compare stages' summaries). One that names no
    function is a ConfigError (exit 4) before anything runs (run/stage_keys.py's headline_problems); an error it raises
    is a warning line, never a failed run (None: no headline)."""
    report: str | None = None
    """"module:function" (run_dir) -> Path: writes the run's report (<run>/report.html, and what it embeds, e.g.
    <run>/plots/) from what the run folder holds. The runner calls it after the selected stages complete, when a
    stage ran in that invocation or report.html is missing (a `--resume` that skipped everything leaves it); an error
    it raises is a warning, never a failed run (None: no report)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Free-form recipe data its stage functions may read."""

    def __post_init__(self) -> None:
        if not (isinstance(self.name, str) and self.name.strip()):
            # an empty name was recorded in run.json, and that run folder then refused every --resume (audit60_B B7)
            raise ConfigError(
                f"recipe name {self.name!r} is not a non-empty str",
                field="name",
                hint="give the Recipe a name, e.g. Recipe(name='myrecipe', ...) (it is stored in run.json)",
            )
        if not self.stages:
            raise ConfigError(f"recipe {self.name}: it declares no stages", field="stages", hint="give it a StageSpec")
        seen: set[str] = set()
        for i, st in enumerate(self.stages):
            if not isinstance(st, StageSpec):  # a dict there was a raw AttributeError on `.name` (audit60_B B7)
                raise ConfigError(
                    f"recipe {self.name}: stage {i} is {a_kind(type(st).__name__)}, not a StageSpec ({st!r:.80})",
                    field="stages",
                    hint="write each stage as StageSpec(name=..., fn='module:function', ...) "
                    "(from reproduction.recipe import StageSpec)",
                )
            if not isinstance(st.name, str) or not STAGE_NAME.fullmatch(st.name):
                raise ConfigError(
                    f"recipe {self.name}: stage name {st.name!r} is not a plain folder name",
                    field="stages",
                    hint="name it with letters, digits, _ and - (it is the stage's folder in the run folder)",
                )
            if st.name in RUN_FOLDER_NAMES:
                raise ConfigError(
                    f"recipe {self.name}: stage name {st.name!r} is a folder every run folder has for other files",
                    field="stages",
                    hint=f"rename the stage (not one of {', '.join(sorted(RUN_FOLDER_NAMES))})",
                )
            if st.name in seen:
                raise ConfigError(f"recipe {self.name}: stage {st.name!r} is declared twice", field="stages")
            _check_fields(self.name, st)
            missing = [n for n in st.needs if n not in seen]
            if missing:
                raise ConfigError(
                    f"recipe {self.name}: stage {st.name!r} needs {missing[0]!r}, which is not declared before it",
                    field="stages",
                )
            seen.add(st.name)

    def stage(self, name: str) -> StageSpec:
        for st in self.stages:
            if st.name == name:
                return st
        raise ConfigError(
            f"no stage {name!r} in recipe {self.name}",
            field="stages",
            hint=f"stages: {', '.join(s.name for s in self.stages)}",
        )

    def select(self, names: list[str] | None) -> list[StageSpec]:
        """The named stages (all when None) in recipe order; unknown names are refused."""
        if not names:
            return list(self.stages)
        wanted = {self.stage(n).name for n in names}
        return [st for st in self.stages if st.name in wanted]


def a_kind(kind: str) -> str:
    """`kind` (a type's name) with its article, for messages: "a dict", "an int"."""
    return f"{'an' if kind[:1].lower() in 'aeiou' else 'a'} {kind}"


_STR_TUPLES = ("needs", "config", "outputs", "code", "files", "weights")
"""StageSpec's fields of str items: a tuple (or a list) of str. A bare str (`config=("train")`, a missing trailing
comma) was read letter by letter: config keys 't', 'r', ..., or globs '.', 'o' that crashed the run after the stage
ran (audit50_B F3)."""


def _check_fields(recipe: str, st: StageSpec) -> None:
    """ConfigError (exit 4) naming the recipe, the stage, the field and the value when a StageSpec field is not of its
    type, or an `outputs` glob pathlib refuses (empty, absolute, `a**b`: refused only when the stage had run, as an
    internal error). `../evidence/*.json`, `./x` and `a//b` are globs pathlib takes, as recipes wrote them before."""

    def refuse(name: str, value: Any, why: str, hint: str) -> None:
        message = f"recipe {recipe}: stage {st.name}'s {name} is {value!r:.80}, {why}"
        raise ConfigError(message, field=f"stages.{st.name}.{name}", hint=hint)

    for name in _STR_TUPLES:
        value = getattr(st, name)
        if isinstance(value, str):
            refuse(name, value, "a str, not a tuple of str", f"write {name}=({value!r},) (note the trailing comma)")
        if not isinstance(value, (tuple, list)) or not all(isinstance(v, str) and v for v in value):
            refuse(name, value, "not a tuple of non-empty str", f"write {name} as a tuple of str, e.g. ('a', 'b')")
    pairs = st.files_if
    if not isinstance(pairs, (tuple, list)) or not all(
        isinstance(p, (tuple, list)) and len(p) == 2 and all(isinstance(k, str) and k for k in p) for p in pairs
    ):
        refuse(
            "files_if", pairs, "not a tuple of (file key, boolean key) pairs", "write files_if=(('a.file', 'a.on'),)"
        )
    for name, value in (("fn", st.fn), ("training", st.training)):
        if not (isinstance(value, str) and value) and not (name == "training" and value is None):
            refuse(name, value, "not a non-empty str", "see reproduction/recipe.py: StageSpec")
    for name in ("inputs", "redo_on_change", "target"):
        if not isinstance(getattr(st, name), bool):
            refuse(name, getattr(st, name), "not a bool", f"write {name}=True or {name}=False")
    if st.uses_ray is not None and not callable(st.uses_ray):
        refuse("uses_ray", st.uses_ray, "not callable", "write uses_ray=a function (config) -> bool, or leave it out")
    for glob in st.outputs:
        try:  # pathlib's own rules, those the runner's glob applies after the stage ran (nothing is read: no folder)
            next(Path("/nonexistent-portable-glob-check").glob(glob), None)
        except (ValueError, NotImplementedError) as exc:
            why = f"not a glob pathlib takes relative to the stage's folder ({exc})"
            refuse("outputs", glob, why, "name the stage's outputs relative to its folder, e.g. 'export/**/*'")


@dataclass(kw_only=True)
class StageOutput:
    """What a stage function returns: the files it wrote, a JSON-able summary, and (in memory only)
    a typed result for the caller."""

    files: list[Path]
    summary: dict[str, Any] = field(default_factory=dict)
    result: Any = None
    step: int | None = None
    """For a training stage: the step it reached (an integer >= 0; None: not counted in steps, e.g. a pinned copy)."""
    resumed_from: int | None = None
    resumed_from_path: Path | None = None
    """The checkpoint it continued from (a lineage material): for a trainer stage the folder it loaded,
    `<stage>/checkpoints/step_<resumed_from>` (or the model's equivalent)."""
    resumed_from_sha256: str | None = None
    """That checkpoint's tree digest taken when the trainer loaded it (TrainResult.resumed_from_sha256); the lineage
    records it even after keep-last deleted the folder. None: hashed when the statement is written."""
    world_size: int = 1
    device: str = "cpu"


@dataclass(kw_only=True)
class StageContext:
    """What the runner hands a stage function: everything already opened and resolved."""

    name: str
    config: Any
    """The typed, resolved run config."""
    out_dir: Path
    """The stage's folder (created by the runner)."""
    run_dir: Path
    inputs: dict[str, Any]
    """The recipe's opened inputs (datasets with their fingerprints), opened once."""
    upstream: dict[str, StageOutput]
    """Outputs of the stages it needs (from this invocation, or rebuilt from run.json)."""
    resume: bool = False
    """Continue from the newest complete checkpoint in out_dir (training stages)."""
    target_step: int | None = None
    """Train up to this step instead of the configured one."""
    ray_address: str | None = None
    """--ray-address as given (None: none was). A stage whose workers need Ray calls ray_cluster() instead."""
    ui: Any = None
    ray: Callable[[], str | None] | None = None
    """The runner's shared Ray (reproduction.train.ray_connect.RunRay.address, held for the whole run): read it
    through ray_cluster()."""
    digests: Any = None
    """The run's digest cache (reproduction.digest_cache.DigestCache): hash the run's files through it, so a file
    is hashed once per run. None when no runner gave one."""

    @property
    def writers_lock(self) -> Path:
        """The run's writers file (`<run_dir>/.writers`, absolute): pass it to train() / run_tasks() as
        `writers_lock=`, so their Ray workers hold it while they write into the run and the next invocation on the
        run waits for any a killed driver left behind (reproduction/writers_lock.py; audit51 K2)."""
        # spelled here, not imported: this protocol module imports nothing of the package but its errors (a test
        # checks it equals reproduction/writers_lock.py writers_file)
        return Path(os.path.abspath(self.run_dir)) / ".writers"

    def ray_cluster(self) -> str | None:
        """The address of the Ray cluster the run's stages share: --ray-address, else one local Ray the runner
        starts on the first call and stops when the run ends (RayUnavailableError, exit 58, when it does not
        start); None when this process already runs a Ray or no runner gave one (the launcher then uses that
        Ray or starts its own)."""
        return self.ray() if self.ray is not None else self.ray_address

    def ray_for(self, workers_need_ray: bool) -> str | None:
        """The Ray address to hand a trainer or inference launcher: ray_cluster() when its workers run on Ray (a
        `launcher: ray`, several inference workers), else --ray-address as given (so nothing starts a Ray)."""
        return self.ray_cluster() if workers_need_ray else self.ray_address


def resolve_fn(
    ref: str, *, what: str = "recipe function", key: str = "fn", hint: str | None = None
) -> Callable[..., Any]:
    """Import "module:name"; ConfigError "`what` `ref` cannot be loaded: why" (its field `key`, `hint`) when it
    cannot."""
    module, _, name = ref.partition(":")
    try:
        loaded = importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(f"{what} {ref!r} cannot be loaded: {exc}", field=key, hint=hint) from None
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - the module's own failure (a SyntaxError): the user's file and line
        raise import_failure(module, exc, f"{what} {ref!r}", field=key) from None
    try:
        return getattr(loaded, name)
    except AttributeError as exc:
        raise ConfigError(f"{what} {ref!r} cannot be loaded: {exc}", field=key, hint=hint) from None


def import_failure(module: str, exc: BaseException, who: str, *, field: str) -> ConfigError:
    """The ConfigError (exit 4) for importing `module` (what `who` names: a recipe, a stage's function) failing with
    `exc`, raised by the module's own code (a SyntaxError, a NameError at its top level): the exception and the file
    and line of the user's code it came from (`raised_where`). A SyntaxError in a stage's or the config schema's
    module was "internal error ... a bug in recap-portable", exit 1 (audit65_B H1): its file is in the exception,
    not in the traceback, whose last frames are importlib's. A module of recap-portable's own (`reproduction.*`: a
    built-in recipe's stage, headline or preflight module) that fails with no code of the user's involved
    (`raised_where` finds none) raises `exc` again, as the bug it is (`internal error`, exit 1), not blamed on the
    user with exit 4 (review65 O M1); a user's module installed in site-packages is still the user's."""
    where = raised_where(exc)
    if where is None and (module == "reproduction" or module.startswith("reproduction.")):
        raise exc
    words = " ".join((exc.msg if isinstance(exc, SyntaxError) and exc.msg else str(exc)).split())[:200]
    return ConfigError(
        f"{who} cannot be imported: {type(exc).__name__}: {words}" + (f" (at {where})" if where else ""),
        field=field,
        hint=(f"fix {where}, then run again; " if where else "fix the module, then run again; ")
        + f"python -c 'import {module}' (with the same PYTHONPATH) shows the traceback",
    )


def code_owner(filename: str) -> str:
    """Whose source file `filename` is: "ours" (recap-portable's package), "library" (the interpreter's stdlib or
    site-packages) or "user" (anything else: an out-of-tree recipe, other code of the user's)."""
    import sysconfig

    real = os.path.realpath(filename)
    ours = os.path.dirname(os.path.realpath(__file__))
    if real == ours or real.startswith(ours + os.sep):
        return "ours"
    libraries = {
        os.path.realpath(p)
        for p in {sysconfig.get_path("stdlib"), sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
        if p
    }
    return "library" if any(real.startswith(lib + os.sep) for lib in libraries) else "user"


def raised_where(exc: BaseException) -> str | None:
    """'FILE:LINE' of the user's code where `exc` arose: a SyntaxError's own file and line when that file is the
    user's, else the innermost traceback frame outside the interpreter's libraries and recap-portable (for a
    SyntaxError in an installed library: the user's line importing it, review65 O L1); None when there is none
    (only recap-portable's own code and libraries: a bug of ours)."""
    import traceback

    def users(name: str) -> bool:
        return bool(name) and not name.startswith("<") and code_owner(name) == "user"

    if isinstance(exc, SyntaxError) and exc.filename and exc.lineno and users(exc.filename):
        return f"{exc.filename}:{exc.lineno}"
    mine = [
        (os.path.realpath(f.f_code.co_filename), line)
        for f, line in traceback.walk_tb(exc.__traceback__)
        if users(f.f_code.co_filename)
    ]
    return f"{mine[-1][0]}:{mine[-1][1]}" if mine else None
