"""The one orchestrator: walk a recipe's stages, decide skip / continue / redo / refuse by stage keys.

    <run>/run.json      format_version, recipe (its name, and recipe_ref: the name the config gave it), run id,
                        resolved config, and per stage: status,
                        key, key_parts, outputs (path -> size, mtime_ns, sha256), summary, times, and `lineage`: what
                        its lineage statement recorded beyond these (argv, world size, device, versions), so --resume
                        writes a lost statement again
    <run>/<stage>/      one folder per stage
    <run>/report.html   the recipe's report (Recipe.report, called after the stages; <run>/plots/ for the built-in ones)

A stage's key is the sha256 of its key parts: the config subsets it reads (minus the fields inside them declared
`same_outputs()`, reproduction/config_fields.py, and its training step count), the
fingerprints of the opened inputs, the output digests of the stages it needs, the source digests
of its code modules (the stage function's module and those StageSpec.code names) and its function's reference
(StageSpec.fn).
With `resume`: a complete stage whose key and outputs match is skipped; one the
run was killed in continues (training stages from their newest complete checkpoint; others redone), and so does a
complete training stage asked for more steps (`--target-step N`, or its step count raised in the config);
one whose key changed is refused with the differing parts named, unless the change is only in the digests of
upstream stages (redone in this invocation or an earlier one: then it is redone). `restart` redoes the named
stages and every stage downstream of them. An invocation given `--target-step N` records run.json's
`target_step` ({"step": N, "stages": the stages it selected}) with its first `running` record and drops it when it
completes: a plain `--resume` of one that stopped trains each of those stages it runs to N (complete ones below
N too), as it would have. A resume a stage refuses before it trains (ResumeRefusedError: only checkpoints above N
are left) puts back that stage's record and run.json's `target_step` as the invocation found them (what earlier
stages of it completed is kept), N not kept, and report.html if that stage removed it.
run.json is written atomically after every state change, so a kill leaves a consistent record.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reproduction.config_fields import output_free_keys
from reproduction.digest_cache import DigestCache
from reproduction.errors import (
    InputNotFoundError,
    PortableError,
    ReadFailedError,
    ResumeRefusedError,
    RunStateError,
    StageKeyChangedError,
    StageProtocolError,
    UsageError,
)
from reproduction.fsio import (
    atomic_write_bytes,
    atomic_write_text,
    make_output_folder,
    remove_orphaned_temps,
    remove_tree,
)
from reproduction.recipe import Recipe, StageContext, StageOutput, StageSpec, raised_where, resolve_fn
from reproduction.redaction import redact, redact_argv
from reproduction.run.config import as_recorded, select, to_plain
from reproduction.run.guards import LOCK_FILE, deferred_interrupts, refuse_links, run_lock, sigterm_as_interrupt
from reproduction.run.stage_call import call_stage
from reproduction.run.stage_decide import (
    config_layers,
    decide,
    declaration,
    declaration_changes,
    moved_locations,
    refuse_target_below_raised_count,
    stage_ran_with,
)
from reproduction.run.stage_keys import (
    declaration_problems,
    digest,
    fn_problems,
    headline_problems,
    input_files,
    key_parts,
    missing_file_problems,
    recorded_key_still_matches,
    weight_files,
)
from reproduction.run.stage_outputs import (
    OutputsWatch,
    collect_outputs,
    others_outputs,
    refuse_others_files,
    take_over,
    verify_outputs,
)
from reproduction.run.stale import outputs_digest, stale_stages
from reproduction.train.ray_connect import RunRay, may_use_ray, on_cluster_lost, reachable
from reproduction.writers_lock import WRITERS_FILE

RUN_JSON = "run.json"
LOCKS = (LOCK_FILE, WRITERS_FILE)
"""The lock files a fresh run folder may hold before run.json (a first attempt killed early leaves them)."""
REPORT_HTML = "report.html"
"""The run's report (Recipe.report writes it; the runner only checks whether it exists)."""
FORMAT_VERSION = 1


@dataclass(kw_only=True, slots=True)
class StageRecord:
    """One stage run, as the runner hands it to the evidence/lineage writer."""

    run_id: str
    run_dir: Path
    stage: str
    status: str
    action: str
    """ran, continued, skipped."""
    subjects: dict[str, str]
    """Output path (relative to the run) -> sha256."""
    materials: dict[str, Any]
    """Key parts: inputs' fingerprints, upstream outputs, code digests."""
    config: dict[str, Any]
    argv: list[str]
    started: float
    ended: float
    resumed_from: int | None
    summary: dict[str, Any]
    inputs: dict[str, Any]
    """The recipe's opened inputs (datasets: `.root`, `.fingerprint`)."""
    upstream_files: dict[str, str]
    """Upstream stages' output files (path relative to the run) -> sha256."""
    input_files: dict[str, str] = field(default_factory=dict)
    """Files the stage read by path (StageSpec.files; absolute or relative to the cwd) -> sha256."""
    weight_files: list[str] = field(default_factory=list)
    """The starting weights it initialised from (StageSpec.weights): the weights manifest and its files."""
    world_size: int = 1
    device: str = "cpu"
    resumed_from_path: Path | None = None
    resumed_from_sha256: str | None = None
    """The checkpoint's tree digest taken when the trainer loaded it (StageOutput.resumed_from_sha256)."""
    digests: DigestCache | None = None
    """The run's digest cache: the lineage writer hashes through it (a file the run hashed is not hashed again)."""
    target_step: int | None = None
    """The --target-step the stage trained to, explicit or inherited by a plain --resume from run.json (the argv
    of the latter does not say it: audit55 G1); None where none applied."""
    versions: dict[str, Any] | None = None
    """The versions the statement records (a statement written again: those of the run that wrote it); None: the
    recorder collects today's."""


Recorder = Callable[[StageRecord], Any]
"""Writes a stage's statement; may return the versions it recorded (a dict), which run.json keeps (`lineage`)."""


@dataclass(kw_only=True)
class RunOptions:
    """How to run: which stages, resume policy, and the seams tests swap."""

    stages: list[str] | None = None
    resume: bool = False
    restart: list[str] = field(default_factory=list)
    target_step: int | None = None
    argv: list[str] = field(default_factory=list)
    ray_address: str | None = None
    probe_ray: bool = False
    """Whether `ray_address` (a --ray-address) must answer a TCP connect before anything runs, when a stage to run may
    use Ray workers (ray_connect.may_use_ray); a config's address is only joined when a stage asks."""
    ui: Any = None
    recorder: Recorder | None = None
    """Called after each completed stage (the lineage writer, run/record.py); None: no lineage."""
    inputs: dict[str, Any] | None = None
    """Already-opened inputs (else the recipe's open_inputs is called)."""
    preflight: bool = True
    digests: DigestCache | None = None
    """The run's digest cache (reproduction/digest_cache.py); None: a fresh one for this run."""
    config_files: Sequence[str | Sequence[str]] | None = None
    """The --config layers of this invocation, in order (`portable run`, the demos): each stage's record keeps them
    (`config_files`: path and sha256) so a refusal can name a layer a later --resume left out; None: not recorded.
    Each is a [path, sha256] pair hashed where the config was read (stage_decide.config_layers), recorded as it is;
    a bare path (an API caller's) is hashed when a stage completes."""
    inputs_moved: bool = False
    """`--inputs-moved`: a stage whose key differs from its record's only by where its datasets are (same
    fingerprints, same everything else: stage_decide.moved_locations) is taken as unchanged, and its record
    rewritten to today's key with the move noted (`moved`); False: such a stage is refused (exit 52) as any change."""
    recipe_ref: str | None = None
    """The name the run config gave the recipe (`recap`, `package.module:RECIPE`), recorded as run.json's
    `recipe_ref` so commands reading the run folder (`portable eval`) find the recipe; None: the recipe's name."""
    recipe_module: dict[str, str] | None = None
    """The out-of-tree recipe module this invocation imported ({"module", "path", "sha256"}: run/recipe_source.py),
    recorded as run.json's `recipe_module` (audit54 A1); None: not recorded (a built-in recipe, an API caller)."""


@dataclass(kw_only=True)
class StageReport:
    name: str
    action: str
    """ran, continued, skipped."""
    seconds: float
    output: StageOutput


@dataclass(kw_only=True)
class RunReport:
    run_dir: Path
    run_id: str
    stages: list[StageReport]
    report: Path | None = None
    """The run's report (Recipe.report: written, or left as it was); None when the recipe has none or it failed."""
    stale: dict[str, str] = field(default_factory=dict)
    """Complete stages whose results predate an upstream stage's outputs (`stale_stages`): a later --resume redoes
    them."""

    def table(self) -> list[dict[str, Any]]:
        return [{"stage": s.name, "action": s.action, "seconds": round(s.seconds, 2)} for s in self.stages]


# -- state ---------------------------------------------------------------------------------------


def state_config_file(run_dir: Path, state: dict[str, Any]) -> Path:
    """The run's resolved config (run.json's `config`) written as JSON, which is YAML, for the config loader:
    `portable eval`'s base config (run_dir/eval_checkpoint/run_config.json)."""
    from reproduction.fsio import atomic_write_text

    path = Path(run_dir) / "eval_checkpoint" / "run_config.json"
    atomic_write_text(path, json.dumps(dict(state.get("config") or {}), indent=1) + "\n")
    return path


def read_state(run_dir: Path) -> dict[str, Any] | None:
    """run.json as a dict, None when absent; RunStateError (exit 55) when unreadable or not of the schema its
    format_version names (record.check_state: the field that is wrong is named)."""
    path = Path(run_dir) / RUN_JSON
    if path.is_dir():  # a folder where the record belongs: exit 3, as a folder given for any file is
        raise InputNotFoundError(
            f"{path} is a folder, not a file", path=path, hint="remove or rename it, or choose a new --output"
        )
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RunStateError(
            f"{path} is unreadable ({exc})", path=path, hint="start a new run in a new --output"
        ) from None
    from reproduction.run.record import check_state, upgrade_state

    return upgrade_state(check_state(doc, path, FORMAT_VERSION))


def recipe_ref(state: dict[str, Any]) -> str:
    """The name a run folder's recipe is found by (run/resolve.py): run.json's `recipe_ref` (upgrade_state fills it
    for records written before recipes had names)."""
    return str(state.get("recipe_ref") or state.get("recipe"))


def _ref_kind(ref: str) -> str | None:
    """The kind of recipe reference `ref`: "built-in" for a built-in recipe's name or an in-tree module's
    reference, "out-of-tree" for another package.module:NAME, None for a bare name that is no built-in's (an API
    caller's recipe.name: unknown)."""
    module, sep, _ = ref.partition(":")
    if sep:
        return "built-in" if module.split(".")[0] == "reproduction" else "out-of-tree"
    from reproduction.run.resolve import builtin_names

    return "built-in" if ref in builtin_names() else None


def _other_kind(state: dict[str, Any], ref: str | None) -> bool:
    """Whether run.json's recipe and this invocation's (`ref`: the config's reference; None: an API caller, which
    gives only the name) are of different kinds, one built-in and one out-of-tree, though named alike: an
    out-of-tree Recipe(name="recap") is not RECAP (audit56 B3). Two out-of-tree references may differ (a module
    moved: the config's is recorded then)."""
    if ref is None:
        return False
    kinds = {_ref_kind(recipe_ref(state)), _ref_kind(ref)}
    return kinds == {"built-in", "out-of-tree"}


def _write_state(run_dir: Path, state: dict[str, Any]) -> None:
    """run.json with secrets redacted (a token in the config or the environment never reaches the file;
    keys are digests of the unredacted parts, so a resume still matches them)."""
    text = json.dumps(redact(state), indent=1, sort_keys=True, default=str)
    atomic_write_text(Path(run_dir) / RUN_JSON, text + "\n")


# -- the walk -------------------------------------------------------------------------------------


def run_recipe(recipe: Recipe, config: Any, run_dir: Path, options: RunOptions | None = None) -> RunReport:
    """Run (or resume) `recipe` with the typed `config` into `run_dir`; see the module docstring.

    Holds the run folder's lock (run_lock) throughout. Raises LockHeldError (exit 7: another run works in
    run_dir), RunStateError (run_dir is a file; holds a run and resume is off; run.json is not of its
    schema; a stage folder or evidence/ is a symbolic link; a needed stage is neither selected nor complete),
    StageKeyChangedError (resume over changed inputs, each named; a trained stage's max_steps lowered below
    the steps it trained), UsageError (exit 2: --target-step at or below a stage's trained steps while its step
    count is raised above them), PreflightError (every problem found before anything ran), and whatever a stage
    raises: the stage is then recorded `failed` (or `interrupted` on Ctrl-C / SIGTERM) in run.json, so
    `--resume` continues it; a complete stage that `--target-step` failed to train on keeps its record; a resume
    refused before it trained (ResumeRefusedError) leaves the stage's record, run.json's `target_step` (as the
    invocation found it) and report.html as they were; when it is the first stage the invocation runs, run.json's
    bytes are those it found.
    """
    opts = options or RunOptions()
    digests = opts.digests or DigestCache()  # one per run: keys, outputs, datasets, weights and lineage share it
    run_dir = Path(os.path.abspath(run_dir))  # every path derived from it is absolute (the CLI resolved it already)
    if run_dir.exists() and not run_dir.is_dir():
        raise RunStateError(
            f"output {run_dir} is a file, not a folder", path=run_dir, hint="pass a folder path as --output"
        )
    with contextlib.ExitStack() as guard:
        locked = (run_dir / RUN_JSON).is_file()
        if locked:  # before anything is read: a second run on this folder stops here (exit 7)
            guard.enter_context(run_lock(run_dir, ui=opts.ui))
        refuse_links(run_dir, [s.name for s in recipe.stages])
        state = read_state(run_dir)
        if state is not None and not (opts.resume or opts.restart or opts.target_step is not None):
            raise RunStateError(
                f"{run_dir} already holds a run",
                path=run_dir,
                hint="pass --resume to continue it (or --restart-stage NAME), or choose a new --output",
            )
        if state is not None and state.get("recipe") == recipe.name and _other_kind(state, opts.recipe_ref):
            raise RunStateError(  # same name, another recipe: RECAP's schema on its folder failed unrelatedly
                f"{run_dir} holds a run of recipe {recipe_ref(state)!r} (named {recipe.name!r}), not of "
                f"{opts.recipe_ref!r}",
                path=run_dir,
                hint=f"choose a new --output for the {opts.recipe_ref!r} run (a run folder keeps one recipe), or "
                f"resume this one with a config whose recipe is {recipe_ref(state)!r}",
            )
        if state is not None and state.get("recipe") != recipe.name:
            raise RunStateError(
                f"{run_dir} holds a {state.get('recipe')!r} run, not {recipe.name!r}",
                path=run_dir,
                hint=f"choose a new --output for the {recipe.name!r} run (a run folder keeps one recipe), or resume "
                f"this one with a config whose recipe is {recipe_ref(state)!r}",
            )
        selected = recipe.select(opts.stages)
        for name in opts.restart:
            recipe.stage(name)
        _refuse_missing_needs(recipe, selected, state, run_dir)  # before anything runs, every missing stage named
        plain = to_plain(config)  # its values as the stages read them (a path is the path); recorded: _Walk.recorded
        from reproduction.run.preflight import raise_problems, run_problems

        # the recipe's own spelling (config keys, stage functions, its headline), before any input
        names = [s.name for s in selected]
        failed: set[str] = set()  # modules that failed to import: one problem each (audit65_B L1)
        refs = headline_problems(recipe, open_inputs=opts.inputs is None, failed=failed)
        recorded = state.get("stages") if isinstance(state, dict) else None
        done = {n for n, r in (recorded if isinstance(recorded, dict) else {}).items() if _complete(r)}
        redone = downstream(recipe, opts.restart)  # trained afresh to --target-step: no clash with the count
        unfinished = [n for n in names if n not in done or n in redone]
        raise_problems(
            declaration_problems(recipe, plain)
            + fn_problems(recipe, names, digests, unfinished=unfinished, failed=failed)
            + refs
        )
        # listed with the preflight's problems, not before them: a missing eval.reference alone used to hide a
        # missing tokenizer that 341a8f6 listed beside it (audit54 review R6); a key the recipe names itself once
        missing = missing_file_problems(recipe, names, plain)
        left = untargeted(recipe, opts)  # training stages this --target-step leaves to their step count
        _refuse_target_untrained(recipe, selected, left, opts.target_step)
        refuse_target_below_raised_count(
            [s for s in selected if s.name not in redone and s.name not in left],
            state,
            plain,
            opts.target_step,
            opts.config_files,
        )
        opened: dict[str, Any] = {}
        if opts.preflight:
            problems, damaged = run_problems(plain, digests)
            if recipe.preflight and not damaged:
                check = resolve_fn(recipe.preflight)
                found = check(config, run_dir, opened, [s.name for s in selected], **_digests_kw(check, digests))
                if not isinstance(found, (list, tuple)):
                    raise StageProtocolError(
                        f"recipe {recipe.name}: preflight {recipe.preflight} returned {type(found).__name__}, "
                        "not a list of problems",
                        hint="return a list (empty when all is well) of errors or strings from the recipe's preflight",
                    )
                problems += list(found)
            named = " ".join(p.message if isinstance(p, PortableError) else str(p) for p in problems)
            raise_problems(problems + [m for m in missing if f"{m.field}" not in named])
        else:
            raise_problems(missing)
        to_run = [s for s in selected if s.name in unfinished]
        if opts.probe_ray and opts.ray_address and may_use_ray(to_run, plain, config):  # the stages' own predicates
            reachable(opts.ray_address)  # a dead head found now, not after earlier stages trained (audit55 J2, 56 F2)
        if state is None and run_dir.is_dir() and any(p.name not in LOCKS for p in run_dir.iterdir()):
            raise RunStateError(
                f"{run_dir} is not empty and holds no run.json", path=run_dir, hint="choose a new or empty --output"
            )
        make_output_folder(run_dir, command="run")
        if not locked:  # a fresh folder: locked now, and a run another process started in it meanwhile refused
            guard.enter_context(run_lock(run_dir, ui=opts.ui))
            if state is None and read_state(run_dir) is not None:
                raise RunStateError(f"{run_dir} already holds a run", path=run_dir, hint="choose a new --output")
        if state is not None:  # what a killed attempt's writes left half-written (run.json, evidence, statements)
            remove_orphaned_temps_of_run(run_dir, state, opts.ui)
            _note_stages_gone(recipe, state, run_dir, opts.ui)
        elif opts.resume:  # a mistyped --output would otherwise retrain everything without a word
            from reproduction.ui import say

            say(f"nothing to resume in {run_dir} (no run.json there): starting a new run", options=opts.ui)
        state = state or {
            "format_version": FORMAT_VERSION,
            "recipe": recipe.name,
            "recipe_ref": opts.recipe_ref or recipe.name,
            "run_id": uuid.uuid4().hex,
            "created": time.time(),
            "stages": {},
        }
        if opts.recipe_ref:  # the recipe may be found by another name now (a module moved): the config's wins
            state["recipe_ref"] = opts.recipe_ref
        if opts.recipe_module:  # the file that runs now, for a reader of run.json (optional: older runs lack it)
            _note_recipe_module_changed(recipe, state, opts)
            state["recipe_module"] = dict(opts.recipe_module)
        recorded_config = state.get("config") if isinstance(state.get("config"), dict) else {}
        recorded = as_recorded(plain)
        config_changed = state.get("config") != recorded
        state["config"] = recorded
        if opts.inputs is not None:
            inputs = opts.inputs
        else:
            inputs = opened if opened else _open_inputs(recipe, config, digests)
        walk = _Walk(recipe=recipe, config=config, plain=plain, run_dir=run_dir, state=state, inputs=inputs, opts=opts)
        walk.digests = digests
        walk.recorded = recorded  # the cached property, made once
        walk.recorded_config = recorded_config
        walk.free = tuple(output_free_keys(config))
        walk.restarted = downstream(recipe, opts.restart)
        guard.enter_context(sigterm_as_interrupt())
        walk.inherited = _inherited_target(state, opts)
        walk.start_target = state.get("target_step")
        walk.untargeted = left
        with RunRay(opts.ray_address) as walk.ray:  # started when a stage first asks, stopped when the walk ends
            _walk(walk, {s.name for s in selected})
        target_done = _finish_target(state, {s.name for s in selected})
        if (config_changed and not walk.redone) or target_done:  # every stage ran or skipped: record what it asked
            _write_state(run_dir, state)
        report = write_report(recipe, run_dir, changed=bool(walk.redone))  # under the lock: one writer at a time
    stale = stale_stages(state)
    stale = {s.name: stale[s.name] for s in recipe.stages if s.name in stale}  # in recipe order
    return RunReport(run_dir=run_dir, run_id=state["run_id"], stages=walk.reports, report=report, stale=stale)


def _note_recipe_module_changed(recipe: Recipe, state: dict[str, Any], opts: RunOptions) -> None:
    """One `note:` line when the recipe module run.json records (`recipe_module`) has other bytes now and no stage's
    declaration changed with it (a changed one is refused, exit 52, when its stage is reached: decide): an edit
    that keeps every stage's needs, outputs, ... (a comment, a docstring) resumes, but not without a word (audit58
    B3). A `recipe_module` without a sha256, or a stage record without a declaration (older run folders), says
    nothing."""
    before, now = state.get("recipe_module"), opts.recipe_module or {}
    old, new = (before or {}).get("sha256") if isinstance(before, dict) else None, now.get("sha256")
    # another module (the config now names another Recipe): its bytes against the recorded one's said the NEW
    # module "changed" (audit60_B B4); name both instead, also when their bytes are alike. The same module at another
    # path (a moved or reinstalled package) is no switch: only its bytes count, as before
    moved = isinstance(before, dict) and before.get("module") != now.get("module")
    if not isinstance(old, str) or not new or (old == new and not moved):
        return
    records = state.get("stages") or {}
    if any(isinstance(r, dict) and "declaration" not in r for r in records.values()):
        return  # a record written before stop 58 cannot tell what it was made under: resumed as before, silently
    if any(declaration_changes(s, records.get(s.name)) for s in recipe.stages):
        return
    from reproduction.ui import say

    what = (
        f"this run was recorded with recipe module {before.get('module')} ({before.get('path')}, sha256 {old[:12]}...) "
        f"and the config now names {opts.recipe_ref or recipe.name}, module {now.get('module')} ({now.get('path')}, "
        f"sha256 {new[:12]}...)"
        if moved
        else f"recipe module {now.get('module')} ({now.get('path')}) changed since this run recorded it "
        f"(sha256 {old[:12]}... -> {new[:12]}...)"
    )
    say(
        f"note: {what}; no stage's declaration (needs, outputs, training, ...) changed, so its stages are decided by "
        "their keys as before",
        options=opts.ui,
    )


def _note_stages_gone(recipe: Recipe, state: dict[str, Any], run_dir: Path, ui: Any) -> None:
    """One line naming the stages run.json records that the recipe no longer has (renamed or removed since the run
    began): their records, folders, evidence and lineage statements are kept, as the user's results, and `portable
    lineage` lists them; without the line a 4-stage recipe's run showing 5 statements was a puzzle."""
    names = {s.name for s in recipe.stages}
    gone = [name for name in state.get("stages") or {} if name not in names]
    if gone:
        from reproduction.ui import say

        which = ", ".join(gone)
        say(
            f"note: run.json records stage{'s' if len(gone) > 1 else ''} {which} that recipe {recipe.name} no longer "
            f"has (renamed or removed): kept as they are, with their folders and lineage; remove them by hand, or "
            f"start a new --output, to leave them behind",
            options=ui,
        )


def _refuse_missing_needs(
    recipe: Recipe, selected: Sequence[StageSpec], state: dict[str, Any] | None, run_dir: Path
) -> None:
    """RunStateError (exit 55) when a selected stage needs a stage that is neither selected nor complete in
    run.json, directly or through such stages: raised before anything runs (it once came mid-walk, after the
    earlier selected stages had run), naming for each selected stage every stage it lacks, with a --stages hint
    that works when followed (the selection plus all of them)."""
    chosen = {s.name for s in selected}
    recorded = (state or {}).get("stages") or {}
    complete = {n for n, rec in recorded.items() if isinstance(rec, dict) and rec.get("status") == "complete"}
    order = {s.name: i for i, s in enumerate(recipe.stages)}
    lacking: dict[str, list[str]] = {}
    for spec in selected:
        missing: set[str] = set()
        todo = list(spec.needs)
        while todo:
            need = todo.pop()
            if need in chosen or need in complete or need in missing:
                continue
            missing.add(need)
            todo += list(recipe.stage(need).needs)
        if missing:
            lacking[spec.name] = sorted(missing, key=order.__getitem__)
    if not lacking:
        return
    every = {n for names in lacking.values() for n in names}
    said = "; ".join(
        f"stage {name} needs stage{'s' if len(names) > 1 else ''} {', '.join(names)}" for name, names in lacking.items()
    )
    run = ",".join(sorted(chosen | every, key=order.__getitem__))
    raise RunStateError(
        f"{said}, which {'has' if len(every) == 1 else 'have'} not completed in {run_dir}",
        path=run_dir,
        hint=f"run with --stages {run} (or without --stages)",
    )


def remove_orphaned_temps_of_run(run_dir: Path, state: dict[str, Any], ui: Any = None) -> None:
    """Remove the temp files killed atomic writes left in the run folder (fsio.remove_orphaned_temps), never a
    stage's recorded output, and say which in one line. `portable run` and `portable eval` call it under the run
    folder's lock."""
    outputs = [
        run_dir / name / rel
        for name, rec in (state.get("stages") or {}).items()
        if isinstance(rec, dict)
        for rel in (rec.get("outputs") or {})
    ]
    removed = remove_orphaned_temps(run_dir, keep=outputs)
    if removed:
        from reproduction.ui import say

        names = ", ".join(p.relative_to(run_dir).as_posix() for p in removed[:3]) + (
            ", ..." if len(removed) > 3 else ""
        )
        say(f"removed {len(removed)} temp file(s) that a killed write left: {names}", options=ui)


def write_report(recipe: Recipe, run_dir: Path, *, changed: bool = True) -> Path | None:
    """The recipe's report of the run folder (Recipe.report), after its stages: written when `changed` (a stage ran in
    this invocation) or when <run>/report.html is missing, else left as it is (a `--resume` that skipped everything
    rewrites nothing). A report that fails is one warning line on stderr (even with -q: the run's results are not
    all where the user looks) and a stale report.html is removed so the next `--resume` writes it again; the run
    stays complete and recorded. Returns the report's path, None when there is none."""
    if not recipe.report:
        return None
    existing = Path(run_dir) / REPORT_HTML
    if not changed and existing.is_file():
        return existing
    try:
        return Path(resolve_fn(recipe.report)(Path(run_dir)))
    except Exception as exc:  # noqa: BLE001 - a report never loses a finished run
        line = " ".join(str(exc).split())[:300]
        with contextlib.suppress(OSError):
            existing.unlink(missing_ok=True)
        where = raised_where(exc)  # the recipe's own code: say where, and that a rerun alone repeats it (audit65_B L3)
        print(
            f"warning: the run is complete, but its report was not written ({type(exc).__name__}: {line}"
            + (f", raised at {where}); fix it, then `portable run ... --resume` writes it" if where else "); ")
            + ("" if where else "`portable run ... --resume` tries again"),
            file=sys.stderr,
            flush=True,
        )
        return None


def _complete(record: Any) -> bool:
    return isinstance(record, dict) and record.get("status") == "complete"


def run_recipe_redoing_changed(recipe: Recipe, config: Any, run_dir: Path, options: RunOptions) -> RunReport:
    """`run_recipe`, except that with `options.resume` a stage whose inputs changed since it completed (a
    StageKeyChangedError, e.g. after a code change) is redone with what follows instead of refused: what a demo's
    rerun wants. Each stage is redone at most once; any other error propagates."""
    from dataclasses import replace

    from reproduction.ui import say

    restart = list(options.restart)
    for _ in range(len(recipe.stages) + 1):
        try:
            return run_recipe(recipe, config, run_dir, replace(options, restart=list(restart)))
        except StageKeyChangedError as exc:
            stage = getattr(exc, "stage", None)
            if not options.resume or stage is None or stage in restart:
                raise
            say(f"demo: {exc.message}; redoing {stage} and what follows", options=options.ui)
            restart.append(stage)
    raise AssertionError("unreachable: every stage restarted once")  # pragma: no cover


@dataclass(kw_only=True)
class _Walk:
    """One invocation's walk over the recipe: what every stage decision reads, and what it accumulates."""

    recipe: Recipe
    config: Any
    plain: dict[str, Any]
    run_dir: Path
    state: dict[str, Any]
    """run.json, updated (and written) as stages start and complete."""
    inputs: dict[str, Any]
    opts: RunOptions
    recorded_config: dict[str, Any] = field(default_factory=dict)
    """run.json's config before this invocation (what the recorded stages were asked with)."""
    free: tuple[str, ...] = ()
    """The config's keys declared not to change outputs (out of every stage key whose subsets hold them)."""
    digests: DigestCache = field(default_factory=DigestCache)
    """The run's digest cache (stage keys, outputs, lineage)."""
    ray: RunRay | None = None
    """The run's one Ray (a local one started lazily, or the joined --ray-address), closed when the walk ends."""
    done: dict[str, StageOutput] = field(default_factory=dict)
    redone: set[str] = field(default_factory=set)
    """Stages that ran or continued in this invocation (the config and the report are written again after them)."""
    restarted: set[str] = field(default_factory=set)
    """The stages --restart-stage names and those downstream of them: redone whatever changed in their keys."""
    reports: list[StageReport] = field(default_factory=list)
    inherited: dict[str, Any] | None = None
    """run.json's `target_step` ({"step", "stages"}) a plain --resume trains the listed stages to (`_inherited_target`),
    None when this invocation has its own --target-step or there is none."""
    announced: bool = False
    """Whether the inherited --target-step was said (once per invocation)."""
    chosen: set[str] = field(default_factory=set)
    """The stages this invocation selected (run.json's `target_step.stages` when it has --target-step)."""
    untargeted: frozenset[str] = frozenset()
    """The training stages this invocation's --target-step leaves to their step count (`untargeted`)."""
    start_target: dict[str, Any] | None = None
    """run.json's `target_step` when this invocation started (None: none): what a refused resume puts back, not the
    --target-step an earlier stage of this invocation stored (audit56 review R2)."""

    @functools.cached_property
    def config_sha256(self) -> str:
        """The digest of this invocation's config, as a stage's `lineage` record keeps it."""
        return digest(self.recorded)

    @functools.cached_property
    def recorded(self) -> dict[str, Any]:
        """The config as run.json, the lineage statements and the keys record it (`as_recorded`: a plain Enum by its
        name, a literal `${` escaped), so that it reads back through --config (audit62 B7); `plain` as it is read."""
        return as_recorded(self.plain)


def _walk(walk: _Walk, chosen: set[str]) -> None:
    run_dir, state = walk.run_dir, walk.state
    walk.chosen = set(chosen)
    for spec in walk.recipe.stages:
        if spec.name not in chosen:
            rec = state["stages"].get(spec.name)
            if rec and rec.get("status") == "complete":
                walk.done[spec.name] = _output_from_record(run_dir / spec.name, rec)
                _restate_unselected(walk, spec, rec)
            continue
        for need in spec.needs:
            if need not in walk.done:
                raise RunStateError(
                    f"stage {spec.name} needs stage {need}, which has not completed in {run_dir}",
                    path=run_dir,
                    hint=f"run with --stages {need},{spec.name} (or without --stages)",
                )
        report = _run_stage(walk, spec)
        walk.reports.append(report)
        walk.done[spec.name] = report.output
        if report.action != "skipped":
            walk.redone.add(spec.name)


def _open_inputs(recipe: Recipe, config: Any, digests: DigestCache) -> dict[str, Any]:
    if not recipe.open_inputs:
        return {}
    fn = resolve_fn(recipe.open_inputs)
    opened = fn(config, **_digests_kw(fn, digests))
    if not isinstance(opened, dict):
        raise StageProtocolError(
            f"recipe {recipe.name}: open_inputs {recipe.open_inputs} returned {type(opened).__name__}, not a dict",
            hint="return {name: opened input with a .fingerprint} from the recipe's open_inputs",
        )
    return dict(opened)


def _digests_kw(fn: Callable[..., Any], digests: DigestCache) -> dict[str, Any]:
    """{"digests": the run's cache} for a recipe function that takes it (Recipe.open_inputs / preflight may), else
    {}: recipes written before the cache keep their signatures."""
    try:
        takes = "digests" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        takes = False
    return {"digests": digests} if takes else {}


def _output_from_record(stage_dir: Path, rec: dict[str, Any]) -> StageOutput:
    return StageOutput(
        files=[stage_dir / rel for rel in rec.get("outputs", {})],
        summary=rec.get("summary", {}),
        step=rec.get("step"),
    )


def _clear_stage(
    run_dir: Path, state: dict[str, Any], stage: str, rec: dict[str, Any] | None, *, restarted: bool
) -> None:
    """Clear a stage the runner redoes afresh, before its `running` record (which must never see another key's files):
    its lineage statement, its folder, and when it is restarted its files in evidence/ (`_remove_recorded_elsewhere`:
    a redo replaces, an eval of a new step adds). The statement goes first: a redo that then failed kept the earlier
    run's `succeeded` statement, which `portable lineage` showed as the stage's and `--verify` reported as lost
    files (exit 11, audit54 A2); a kill just after it leaves a complete stage without its statement, which the next
    --resume writes again from run.json (`_rewrite_lost_statement`). Its record goes next, written: a kill while a
    --restart-stage cleared the stage used to leave its `complete` record naming removed files, which every --resume
    then refused (audit50 A F1); with no record the next --resume redoes it afresh, whatever the kill left."""
    from reproduction.run.lineage import statement_path

    stage_dir = run_dir / stage
    statement = statement_path(run_dir, stage)
    if not os.path.lexists(stage_dir) and not (restarted and rec) and not os.path.lexists(statement):
        return
    if not statement.is_dir():  # a folder there is refused where lineage is read; not ours to remove
        with contextlib.suppress(FileNotFoundError):
            os.unlink(statement)
    if state["stages"].pop(stage, None) is not None:
        _write_state(run_dir, state)
    if restarted:
        _remove_recorded_elsewhere(run_dir, state, stage, rec)
    remove_tree(stage_dir)


def _remove_report(run_dir: Path) -> bytes | None:
    """Remove <run>/report.html before the first stage this invocation runs: the stage changes what it reports, and a
    kill or Ctrl-C before the new one is written must not leave the old one standing for every later --resume, which
    rewrites a report only when it ran a stage or the report is missing (audit50 A F3). Returns its bytes (None when
    there was none, or it could not be read), held in memory so that a resume the stage refuses before it trains
    puts it back (audit56 review R5) while a kill still leaves none."""
    path = run_dir / REPORT_HTML
    try:
        kept: bytes | None = path.read_bytes()
    except OSError:
        kept = None
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return kept


def _remove_recorded_elsewhere(run_dir: Path, state: dict[str, Any], stage: str, rec: dict[str, Any] | None) -> None:
    """Before a stage `--restart-stage` redoes (it, or one upstream of it): remove the files its previous record lists
    in the run's evidence/ (the stage folder itself is cleared whole), so a redone eval does not leave the earlier
    evidence/eval_<name>_<step>.json beside the new one, unrecorded, for `portable compare` to read as the run's.
    Only regular files recorded as this stage's outputs and as no other stage's are removed; a link is never
    followed or removed."""
    if not rec or not isinstance(rec.get("outputs"), dict):
        return
    evidence = os.path.normpath(run_dir / "evidence")
    others = others_outputs(state, run_dir, stage)
    for rel in rec["outputs"]:
        path = os.path.normpath(run_dir / stage / rel)
        if os.path.dirname(path) != evidence or path in others or os.path.islink(path) or not os.path.isfile(path):
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _announce_start(spec: StageSpec, action: str, ui: Any) -> None:
    """`stage NAME: running` on a terminal as a stage starts, for every recipe's stages (an out-of-tree recipe's showed
    nothing until the closing table, audit62 B6). Only where progress bars are drawn (`ui.bars_wanted`): on a pipe
    or in a log, a run's stderr stays what it was (its errors, its table)."""
    from reproduction.ui import bars_wanted, say

    if bars_wanted(ui):
        say(
            f"stage {spec.name}: {'continuing from its checkpoints' if action == 'continue' else 'running'}", options=ui
        )


def _run_stage(walk: _Walk, spec: StageSpec) -> StageReport:
    run_dir, state, opts = walk.run_dir, walk.state, walk.opts
    if spec.name in walk.untargeted:
        opts = dataclasses.replace(opts, target_step=None)  # as a plain --resume would run it
    stage_dir = run_dir / spec.name
    upstream_digests = {n: outputs_digest(state["stages"][n]["outputs"]) for n in spec.needs}
    rec = state["stages"].get(spec.name)
    try:
        parts = key_parts(spec, walk.plain, walk.inputs, upstream_digests, walk.free, walk.digests)
    except (InputNotFoundError, ReadFailedError) as exc:  # an input's fingerprint could not read its path (exit 3)
        _record_unkeyed(walk, spec, rec, exc)
        raise
    key = digest(parts)
    inherited = _target_step(walk, spec, rec)
    # a complete stage below the inherited target is continued to it, as the stopped --target-step would have
    # (a continuation that failed before its outputs changed keeps the record `complete`: audit54 review RV2)
    decide_opts = opts if inherited is None else dataclasses.replace(opts, target_step=_decide_target(rec, inherited))
    # the config its record ran with, read once: decide and the move it accepted fill a key the record lacks alike
    ran_with = stage_ran_with(spec, rec, stage_dir, walk.recorded_config) if rec is not None else None
    action = decide(
        spec,
        rec,
        key,
        parts,
        stage_dir,
        decide_opts,
        walk.plain,
        walk.recorded_config,
        walk.free,
        walk.digests,
        walk.restarted,
        ran_with,
    )
    if rec is not None and action in ("skip", "continue") and rec.get("key") != key and opts.inputs_moved:
        _note_move(rec, spec, parts, walk.free, ran_with)
    if action == "skip":
        if rec.get("key") != key:  # recorded before a key became exempt: record today's key
            rec.update(key=key, key_parts=parts)
            _write_state(run_dir, state)
        if spec.training and opts.target_step is not None:  # else --target-step below its steps says nothing
            from reproduction.ui import say

            say(
                f"{spec.name}: trained {rec.get('step')} steps already, --target-step {opts.target_step} asks for "
                "no more; skipped (a trained stage is not cut back: --restart-stage trains it anew)",
                options=opts.ui,
            )
        _rewrite_lost_statement(walk, spec, rec)
        return StageReport(name=spec.name, action="skipped", seconds=0.0, output=_output_from_record(stage_dir, rec))
    if action == "continue" and rec.get("status") == "complete" and decide_opts.target_step is None:
        from reproduction.ui import say

        say(
            f"{spec.name}: {spec.training} is {select(walk.plain, spec.training)}, above the {rec.get('step')} steps "
            f"it trained: training on to {select(walk.plain, spec.training)}",
            options=opts.ui,
        )
    if action == "fresh":
        _note_cut_back(walk, spec, rec, opts.target_step if inherited is None else inherited)
        _clear_stage(run_dir, state, spec.name, rec, restarted=spec.name in opts.restart or spec.name in walk.restarted)
    if rec is not None and rec.get("status") == "complete" and action != "fresh" and decide_opts.target_step is None:
        inherited = None  # at or above the target: trained on only by a count raised
    if inherited is not None:
        opts = dataclasses.replace(opts, target_step=inherited)
    target = opts.target_step if spec.training else None
    if inherited is not None and not walk.announced:
        _announce_inherited(walk, spec, inherited)
    started = time.time()
    # config_sha256: which config it runs with, so a kill before it completes still tells what a key field keyed
    # later was (stage_decide.ran_with_config: audit56 review3 T1)
    running = {
        "status": "running",
        "key": key,
        "key_parts": parts,
        "started": started,
        "config_sha256": walk.config_sha256,
        "declaration": declaration(spec),  # compared on --resume (stage_decide.declaration_changes: audit58 B3)
    }
    state["stages"][spec.name] = {**(rec or {}), **running}
    state["stages"][spec.name].pop("target_step", None)  # run.json's top-level `target_step` holds it now
    if walk.opts.target_step is not None:  # kept so that a plain --resume of a kill trains every stage this
        # invocation selected to it, not the running one only to its checkpoint's step (audit54 A6, R2)
        order = [s.name for s in walk.recipe.stages if s.name in walk.chosen and s.name not in walk.untargeted]
        state["target_step"] = {"step": walk.opts.target_step, "stages": order}
    prior = _state_bytes(run_dir)  # what a refused resume puts back (ResumeRefusedError, audit56 K1)
    _write_state(run_dir, state)  # before the stage folder: a kill from here on leaves a run to --resume
    report = None
    if walk.recipe.report and not walk.redone:  # the first stage this invocation runs: the report is out of date
        report = _remove_report(run_dir)
    stage_dir.mkdir(parents=True, exist_ok=True)
    ctx = StageContext(
        name=spec.name,
        config=walk.config,
        out_dir=stage_dir,
        run_dir=run_dir,
        inputs=walk.inputs,
        upstream={n: walk.done[n] for n in spec.needs},
        resume=action == "continue",
        target_step=target,
        ray_address=opts.ray_address,
        ui=opts.ui,
        ray=walk.ray.address if walk.ray is not None else None,
        digests=walk.digests,
    )
    watch = OutputsWatch.watch(run_dir, state, spec.name)  # other stages' recorded files, stat'ed before the call
    _announce_start(spec, action, opts.ui)
    t0 = time.perf_counter()
    before = rec if action == "continue" else None
    try:
        # a Ray cluster lost while the stage's workers run can end the process from a watchdog thread (the main
        # thread stuck inside Ray, audit55 J1): the stage is then recorded failed here, as the except below would
        with on_cluster_lost(lambda exc: _record_stop(run_dir, state, spec, before, exc, walk.digests)):
            with stage_process_state():
                output = call_stage(spec, ctx, recipe=walk.recipe.name)
                output.files = _absolute_files(output.files)  # a relative one is the stage's cwd's, restored next
        try:
            outputs = collect_outputs(spec, stage_dir, output.files, walk.digests, before=watch)
            if not outputs:
                raise StageProtocolError(  # the protocol broken, no checkpoint at fault (exit 54, audit54 A4)
                    f"stage {spec.name} ({spec.fn}) wrote no outputs: it returned no files, and "
                    + (
                        f"nothing in {stage_dir} matches its StageSpec.outputs {list(spec.outputs)}"
                        if spec.outputs
                        else "its StageSpec declares no outputs"
                    ),
                    stage=spec.name,
                    hint="write the stage's outputs into ctx.out_dir and return them in StageOutput(files=[...]), "
                    "or fix StageSpec.outputs to name the files it writes",
                )
            _refuse_missed_target(walk.recipe.name, spec, output, target)
            refuse_others_files(state, run_dir, spec, outputs)
            taken = watch.refuse_changed(spec, stage_dir, outputs, walk.digests)  # ... and those changed unreturned
        except StageProtocolError:
            watch.remove_planted(output.files)  # a file or link it made in evidence/ is not left for compare to read
            raise
        seconds = time.perf_counter() - t0
        ended = time.time()
        if take_over(state, run_dir, spec.name, outputs, taken) & set(spec.needs):  # its upstream records changed
            upstream_digests = {n: outputs_digest(state["stages"][n]["outputs"]) for n in spec.needs}
            parts = key_parts(spec, walk.plain, walk.inputs, upstream_digests, walk.free, walk.digests)
            key = digest(parts)
        complete = {
            "status": "complete",
            "key": key,
            "key_parts": parts,
            "outputs": outputs,
            "summary": output.summary,
            "step": output.step,
            "resumed_from": output.resumed_from,
            "started": started,
            "ended": ended,
            "seconds": seconds,
            "declaration": declaration(spec),
        }
        if opts.config_files is not None:
            complete["config_files"] = config_layers(opts.config_files)
        if opts.recorder is not None:  # the statement before the record: a kill between them leaves a stage to
            # redo, not a complete stage without its statement that no --resume would write again
            versions = _record_lineage(walk, spec, action, output, outputs, parts, started, ended, target_step=target)
            complete["lineage"] = _statement_params(walk, output, versions, target)
    except BaseException as exc:
        if not (isinstance(exc, ResumeRefusedError) and _put_back(run_dir, prior, spec, before, walk, report)):
            _record_stop(run_dir, state, spec, before, exc, walk.digests)
        raise
    with deferred_interrupts():  # a Ctrl-C here comes after the record: the stage is complete, the run stops
        state["stages"][spec.name] = complete
        _write_state(run_dir, state)
    return StageReport(
        name=spec.name, action="continued" if action == "continue" else "ran", seconds=seconds, output=output
    )


def _refuse_missed_target(recipe: str, spec: StageSpec, output: StageOutput, target: int | None) -> None:
    """StageProtocolError (exit 54) when a training stage handed a target (ctx.target_step: --target-step, or the one
    a plain --resume inherits) returned another step: one that trains to its step count regardless was recorded
    `continued` with the target in its lineage while its checkpoints stayed at the old step (audit65_B M1). A stage
    returning step=None decides what a target means to it (docs/recipes.md) and is not checked."""
    if target is None or output.step is None or output.step == target:
        return
    raise StageProtocolError(
        f"recipe {recipe}: stage {spec.name} was asked to train to step {target} (ctx.target_step) but returned "
        f"step {output.step}",
        stage=spec.name,
        hint="a training stage trains to ctx.target_step when it is set, else to its step count "
        f"({spec.training}), and returns the step it reached (docs/recipes.md); fix it, then `portable run` with "
        "--resume continues it",
    )


PROCESS_ENV = (
    "MUJOCO_GL",  # sim/__init__.py and sim/libero/_runtime.py, at their first import
    "PYOPENGL_PLATFORM",  # checks/render.py, sim/libero/_runtime.py
    "NUMBA_CACHE_DIR",  # sim/libero/_runtime.py's caches, at the first import of LIBERO
    "MPLCONFIGDIR",
    "MESA_SHADER_CACHE_DIR",
    "LIBERO_CONFIG_PATH",
    "RAY_AUTH_MODE",  # train/ray_connect.py, when the run's local Ray starts
    "OMP_NUM_THREADS",  # ray_connect.WORKER_ENV (and portable.py's at start)
    "MKL_NUM_THREADS",
    "TOKENIZERS_PARALLELISM",
    "TORCH_DEVICE_BACKEND_AUTOLOAD",  # checks/accelerator_cuda.py
    "GOMP_SPINCOUNT",  # portable.py
    "PYTHONPYCACHEPREFIX",
    "RAY_COLOR_PREFIX",  # train/ray_connect.py plain_log_prefix, when the run's local Ray starts off a terminal
)
"""The variables the project's own modules set once per process, when first imported or used (setdefault: never over
a value already there). One a stage added stays after it: the module that set it stays imported, so a later stage of
the same run would lack it where the same stage run alone (which imports the module itself) has it (review60 R1).
tests/test_stage_env_review60.py keeps this list equal to what reproduction/ sets."""


@contextlib.contextmanager
def stage_process_state() -> Iterator[None]:
    """Run a stage with this process's cwd and os.environ as they are now, and put both back when it ends (also when
    it raises): a stage's os.chdir or environment change ends with it, so every stage starts with the process state
    the run started with, as a --resume that runs it alone does. Until audit60_B B1 a stage's chdir and env reached
    every later stage and the input fingerprints keyed after it (a relative input path read from the stage's cwd).
    The env a stage sets for its own subprocesses reaches them as before; a cwd that was removed is not restored; a
    PROCESS_ENV variable the stage added (a project module's once-per-process default) is kept."""
    try:
        cwd: str | None = os.getcwd()
    except OSError:  # the run's cwd is gone already: nothing to return to
        cwd = None
    env = dict(os.environ)
    try:
        yield
    finally:
        if cwd is not None:
            with contextlib.suppress(OSError):
                os.chdir(cwd)
        for name in [n for n in os.environ if n not in env and n not in PROCESS_ENV]:
            del os.environ[name]
        for name, value in env.items():
            if os.environ.get(name) != value:
                os.environ[name] = value


def _absolute_files(files: Any) -> Any:
    """A stage's returned files with each relative path made absolute against the cwd it returned in (a stage that
    chdir'ed into ctx.out_dir and returned "out.json" keeps meaning that file after stage_process_state restores)."""
    if not isinstance(files, (list, tuple)) or all(os.path.isabs(f) for f in files if isinstance(f, (str, Path))):
        return files
    made = [Path(os.path.abspath(f)) if isinstance(f, (str, Path)) and not os.path.isabs(f) else f for f in files]
    return type(files)(made)


def _record_unkeyed(walk: _Walk, spec: StageSpec, rec: dict[str, Any] | None, exc: BaseException) -> None:
    """Record a stage whose key could not be made (an input's fingerprint failed to read its path) as `failed` with the
    error's line, as a stage that raised is; a complete record whose outputs are intact is kept (_record_stop).
    Until audit60_B B3 the stage got no record at all. A stage with no record gets a key no real key equals (a digest
    of the error), so `--resume` runs it afresh; one with a record keeps its key (a killed training stage continues)."""
    before = rec if rec is not None and rec.get("status") == "complete" else None
    if rec is None or not isinstance(rec.get("key"), str):
        walk.state["stages"][spec.name] = {**(rec or {}), "key": digest({"unkeyed": str(exc)})}
    _record_stop(walk.run_dir, walk.state, spec, before, exc, walk.digests)


def untargeted(recipe: Recipe, opts: RunOptions) -> frozenset[str]:
    """The training stages this invocation's `--target-step` does not train to N: those declared
    `StageSpec.target=False` (a stage that only initialises a later one), unless `--stages` names them; empty
    without --target-step. They run as a plain --resume would (skipped when complete, continued to their step count
    when killed), and run.json's `target_step.stages` leaves them out, so a plain --resume of a killed invocation
    does not train them to N either."""
    if opts.target_step is None:
        return frozenset()
    named = set(opts.stages or ())
    return frozenset(s.name for s in recipe.stages if s.training and not s.target and s.name not in named)


def _refuse_target_untrained(
    recipe: Recipe, selected: Sequence[StageSpec], left: frozenset[str], target: int | None
) -> None:
    """UsageError (exit 2) when `--target-step` reaches none of the selected stages (none declares
    StageSpec.training, or only ones it leaves to their step count: `untargeted`): it was ignored without a word, a
    recipe whose `training=` was forgotten trained to its step count (audit65_B M2)."""
    if target is None or any(s.training and s.name not in left for s in selected):
        return
    trainable = [s.name for s in recipe.stages if s.training]
    chosen = {s.name for s in selected} | set(trainable[-1:])
    example = ",".join(s.name for s in recipe.stages if s.name in chosen)
    raise UsageError(
        f"--target-step {target}: none of the selected stages ({', '.join(s.name for s in selected)}) of recipe "
        f"{recipe.name} declares StageSpec.training, so it would train nothing",
        field="target_step",
        hint=f"select a training stage of it ({', '.join(trainable)}), e.g. --stages {example}, or leave "
        "--target-step out"
        if trainable
        else "declare the step-count key of the stage that trains (StageSpec(training='SECTION.steps'), "
        "docs/recipes.md), or leave --target-step out",
    )


def _note_cut_back(walk: _Walk, spec: StageSpec, rec: dict[str, Any] | None, target: int | None) -> None:
    """One `note:` line when a training stage redone afresh (its upstream or config changed, or restarted) trains to
    its step count, below the steps its complete record reached (an earlier --target-step, or an earlier, higher
    step count in the config): the step count the redo trains to is otherwise said nowhere (audit56 B4). The line
    names no cause: the record does not tell which it was (audit56 review3 T6)."""
    count = select(walk.plain, spec.training) if spec.training else None
    step = rec.get("step") if isinstance(rec, dict) and rec.get("status") == "complete" else None
    if target is not None or not isinstance(count, int) or not isinstance(step, int) or step <= count:
        return
    from reproduction.ui import say

    say(
        f"note: {spec.name} is redone from the start to {spec.training} = {count} steps, not the {step} it had "
        f"trained before; pass --target-step {step} to train it that far again",
        options=walk.opts.ui,
    )


def _inherited_target(state: dict[str, Any], opts: RunOptions) -> dict[str, Any] | None:
    """run.json's `target_step` ({"step": N, "stages": [...]}: the --target-step of an invocation that stopped before it
    completed, and the stages it selected) when this invocation is a --resume without a --target-step of its own,
    else None: an explicit --target-step wins, and a run without --resume asks for nothing it did not say."""
    if not opts.resume or opts.target_step is not None:
        return None
    found = state.get("target_step")
    return dict(found) if isinstance(found, dict) else None  # its shape: record.check_state


def _target_step(walk: _Walk, spec: StageSpec, rec: dict[str, Any] | None) -> int | None:
    """The --target-step a plain --resume inherits for training stage `spec` (a complete stage below it is continued
    to it, `_decide_target`: a continuation that stopped before its outputs changed left it complete, RV2): run.json's
    `target_step.step` when the stopped invocation selected the stage, else, for a run.json written before that field
    (stop 54, audit54 A6), the stage record's own `target_step` when it stopped unfinished; None otherwise (this
    invocation's own --target-step, or the config's step count). Without it a plain --resume of a killed
    `--target-step 20` finished the running stage at its checkpoint's step (A6) and every later training stage at
    its config count (R2)."""
    if not spec.training or walk.opts.target_step is not None or not walk.opts.resume:
        return None
    if walk.inherited is not None:
        return int(walk.inherited["step"]) if spec.name in walk.inherited["stages"] else None
    if rec is None or rec.get("status") == "complete" or rec.get("target_step") is None:
        return None
    return int(rec["target_step"])  # its shape: record.check_state


def _decide_target(rec: dict[str, Any] | None, inherited: int) -> int | None:
    """The --target-step `decide` weighs for a stage with an inherited target: the target while the stage's record is
    below it (a complete one is then continued to it), None once it reached it, so a complete stage at or above it
    is skipped or trained on by a raised count as a plain --resume always did, not refused or cut back."""
    step = rec.get("step") if isinstance(rec, dict) else None
    return inherited if not (isinstance(step, int) and step >= inherited) else None


def _announce_inherited(walk: _Walk, spec: StageSpec, step: int) -> None:
    """One line, once per invocation, before the first stage it trains to an inherited --target-step `step`: the
    training stages the stopped invocation selected (or, from an older run.json, `spec` alone)."""
    from reproduction.ui import say

    walk.announced = True
    names = walk.inherited["stages"] if walk.inherited is not None else [spec.name]
    recorded = walk.state["stages"]

    # A stage this walk changes: one it trains, and every stage after one (its key changes: it is redone afresh).
    # A complete stage at or above the target is skipped unless it is restarted or follows one that changes: it is
    # then redone, to the target too (audit54 review3 RW1: the line left such a stage out).
    changed: set[str] = set()
    training = []
    for s in walk.recipe.stages:
        rec = recorded.get(s.name)
        done = isinstance(rec, dict) and rec.get("status") == "complete" and _decide_target(rec, step) is None
        redone = s.name in walk.restarted or bool(changed.intersection(s.needs))
        if s.name == spec.name or (s.name in walk.chosen and (not done or redone)):
            changed.add(s.name)
            if s.name in names and s.training:
                training.append(s.name)
    status = {recorded[n].get("status") for n in training if isinstance(recorded.get(n), dict)}
    # a continuation of a complete stage that failed before its outputs changed leaves it `complete`: "stopped"
    how = "failed" if "failed" in status else "killed" if status - {"complete"} or not status else "stopped"
    say(
        f"--resume: training {', '.join(training)} to --target-step {step}, as the {how} run asked "
        "(pass --target-step to ask for another)",
        options=walk.opts.ui,
    )


def _finish_target(state: dict[str, Any], walked: set[str]) -> bool:
    """After a walk that completed: drop the stages it walked from run.json's `target_step` (they are complete), and
    the field with its last stage, so a later plain --resume does not train on to a target an invocation already
    reached. Stages the stopped invocation selected that this one did not keep it. Returns whether it changed."""
    found = state.get("target_step")
    if not isinstance(found, dict):
        return False
    left = [n for n in found.get("stages", []) if n not in walked]
    if left == list(found.get("stages", [])):
        return False
    if left:
        state["target_step"] = {**found, "stages": left}
    else:
        state.pop("target_step")
    return True


def _note_move(rec: dict[str, Any], spec: StageSpec, parts: dict, free: Sequence[str], ran_with: Any = None) -> None:
    """Add to a stage record the dataset moves `--inputs-moved` accepted (`moved`: [old path, new path] pairs, an
    earlier move's kept, chained): its lineage statement keeps the paths it ran with, and `lineage --verify` reads
    the record's key_parts through these pairs. Nothing for a key that differs otherwise (then decide refused)."""
    moves = moved_locations(spec, rec.get("key_parts", {}), parts, free, ran_with)
    if not moves:
        return
    pairs = [[a, moves.get(b, b)] for a, b in rec.get("moved") or []]
    rec["moved"] = pairs + [[a, b] for a, b in moves.items() if a not in {p[1] for p in rec.get("moved") or []}]


def _record_lineage(
    walk: _Walk,
    spec: StageSpec,
    action: str,
    output: StageOutput,
    outputs: dict[str, list],
    parts: dict,
    started: float,
    ended: float,
    *,
    argv: Sequence[str] | None = None,
    versions: dict[str, Any] | None = None,
    target_step: int | None = None,
) -> Any:
    """The stage's lineage statement, through the run's recorder (RunOptions.recorder); returns what it returns."""
    run_dir, state, opts = walk.run_dir, walk.state, walk.opts
    return opts.recorder(
        StageRecord(
            run_id=state["run_id"],
            run_dir=run_dir,
            stage=spec.name,
            status="complete",
            action=action,
            subjects={os.path.normpath(f"{spec.name}/{rel}"): v[2] for rel, v in outputs.items()},
            materials=parts,
            config=walk.recorded,
            argv=list(opts.argv if argv is None else argv),
            started=started,
            ended=ended,
            resumed_from=output.resumed_from,
            summary=output.summary,
            inputs=walk.inputs if spec.inputs else {},
            upstream_files={
                os.path.normpath(f"{n}/{rel}"): v[2]
                for n in spec.needs
                for rel, v in state["stages"][n]["outputs"].items()
            },
            input_files={
                path: parts["files"][k] for k, path in input_files(spec, walk.plain).items() if path is not None
            },
            weight_files=weight_files(spec, walk.plain),
            world_size=output.world_size,
            device=output.device,
            resumed_from_path=output.resumed_from_path,
            resumed_from_sha256=output.resumed_from_sha256,
            digests=walk.digests,
            versions=versions,
            target_step=target_step,
        )
    )


def _statement_params(walk: _Walk, output: StageOutput, versions: Any, target_step: int | None) -> dict[str, Any]:
    """What a stage's statement records that run.json's stage record does not hold otherwise, kept as its `lineage`
    so `--resume` can write a lost statement again (`_rewrite_lost_statement`): the command line (redacted as the
    statement has it), world size, device, the checkpoint it continued from, the versions the recorder returned (as
    [name, value] pairs: run.json sorts a mapping's keys, the statement keeps their order), the config's digest
    (run.json's `config` is the latest invocation's) and, only where one applied, the --target-step it trained to."""
    resumed = output.resumed_from_path
    params = {
        "argv": redact_argv(list(walk.opts.argv)),
        "world_size": output.world_size,
        "device": output.device,
        "resumed_from_path": str(resumed) if resumed is not None else None,
        "resumed_from_sha256": output.resumed_from_sha256,
        "versions": [[k, v] for k, v in versions.items()] if isinstance(versions, dict) else None,
        "config_sha256": walk.config_sha256,
    }
    if target_step is not None:  # absent otherwise: records of runs without a target keep their bytes
        params["target_step"] = target_step
    return params


def _rewrite_lost_statement(walk: _Walk, spec: StageSpec, rec: dict[str, Any]) -> None:
    """Write again the statement of a stage skipped as complete (its key and its outputs, re-hashed where their stat
    changed, match run.json: `decide`) when <run>/lineage/<stage>.intoto.json is gone (deleted, or lost to a sync
    tool), and say so in one line. Rebuilt from the stage record and its `lineage` (`_statement_params`), so its
    bytes are those the run wrote, with three exceptions, read as they are now: the bundle (`--bundle` / the config's
    BUNDLE) and its manifest and layers, the opened inputs' folders (their fingerprints are in the key, not their
    paths), and the starting weights (hashed again). The checkpoint continued from keeps the digest the trainer took
    when it loaded it; a record written before that digest was kept hashes it again (one since deleted is left out).
    Not written (one line says why) when the record has no `lineage` (written before run.json kept it) or the
    config differs from the one the statement recorded (a key declared not to change outputs was changed). A
    rewritten statement is as true as run.json: its `lineage` is checked for shape when run.json is loaded
    (record.check_state, exit 55), not for truth, so a hand-edited command line, world size, device, versions or
    checkpoint path is written as given."""
    from reproduction.run.lineage import statement_path
    from reproduction.ui import say

    path = statement_path(walk.run_dir, spec.name)
    if walk.opts.recorder is None or path.exists():
        return
    rel = path.relative_to(walk.run_dir).as_posix()
    params = rec.get("lineage")
    if params is None or params["config_sha256"] != walk.config_sha256:  # its shape: record.check_state
        why = "run.json predates it" if params is None else "the config differs from the one it recorded"
        say(
            f"{spec.name}: its lineage statement {rel} is missing and cannot be written again ({why}); "
            f"--restart-stage {spec.name} redoes the stage and writes it",
            options=walk.opts.ui,
        )
        return
    resumed = params["resumed_from_path"]
    output = StageOutput(
        files=[],
        summary=rec.get("summary", {}),
        step=rec.get("step"),
        resumed_from=rec.get("resumed_from"),
        resumed_from_path=Path(resumed) if resumed is not None else None,
        resumed_from_sha256=params.get("resumed_from_sha256"),
        world_size=params["world_size"],
        device=params["device"],
    )
    versions = dict(params["versions"]) if params["versions"] is not None else None
    _record_lineage(
        walk, spec, "skipped", output, rec["outputs"], rec["key_parts"], rec["started"], rec["ended"],
        argv=params["argv"], versions=versions, target_step=params.get("target_step"),
    )  # fmt: skip
    say(f"{spec.name}: its lineage statement {rel} was missing; written again from run.json", options=walk.opts.ui)


def _restate_unselected(walk: _Walk, spec: StageSpec, rec: dict[str, Any]) -> None:
    """A complete stage `--stages` leaves out whose statement is lost: written again as for a stage skipped as
    complete (`_rewrite_lost_statement`) when its key and outputs still match run.json, else named in one line (a
    run over the other stages used to leave it missing without a word, for `lineage --verify` to find: exit 11)."""
    from reproduction.run.lineage import statement_path
    from reproduction.ui import say

    path = statement_path(walk.run_dir, spec.name)
    if walk.opts.recorder is None or path.exists():
        return
    stage_dir = walk.run_dir / spec.name
    upstream = {n: outputs_digest(walk.state["stages"][n]["outputs"]) for n in spec.needs}
    parts = key_parts(spec, walk.plain, walk.inputs, upstream, walk.free, walk.digests)
    key = digest(parts)
    try:
        still = rec.get("key") == key or recorded_key_still_matches(
            spec,
            rec.get("key_parts", {}),
            key,
            walk.free,
            parts,
            stage_ran_with(spec, rec, stage_dir, walk.recorded_config),
        )
        why = "its inputs changed since it ran" if not still else "its outputs changed after it completed"
    except StageKeyChangedError:  # recorded before a field was keyed, and nothing says the value it ran with
        still, why = False, "which config it ran with cannot be told"
    problems = verify_outputs(stage_dir, rec.get("outputs", {}), walk.digests, spec) if still else []
    if still and not problems:
        _rewrite_lost_statement(walk, spec, rec)
        return
    say(
        f"{spec.name}: its lineage statement {path.relative_to(walk.run_dir).as_posix()} is missing and cannot be "
        f"written again ({why}); --restart-stage {spec.name} redoes the stage and writes it",
        options=walk.opts.ui,
    )


def downstream(recipe: Recipe, names: Sequence[str]) -> set[str]:
    """`names` and every stage that needs one of them, directly or through others (what `--restart-stage` redoes)."""
    closure = set(names)
    for spec in recipe.stages:
        if closure.intersection(spec.needs):
            closure.add(spec.name)
    return closure


def _state_bytes(run_dir: Path) -> bytes | None:
    """run.json's bytes as they are now, None when there is none (or it cannot be read)."""
    try:
        return (run_dir / RUN_JSON).read_bytes()
    except OSError:
        return None


def _put_back(
    run_dir: Path, prior: bytes | None, spec: StageSpec, before: dict | None, walk: _Walk, report: bytes | None
) -> bool:
    """After a resume the stage refused before it loaded, trained or removed anything (ResumeRefusedError: only
    checkpoints above the steps asked for are left): write back run.json as it was before the stage's `running`
    record (`prior`), with its `target_step` as the invocation found it (`walk.start_target`), so the refused
    `--target-step M` is not left for a later plain --resume to inherit and be refused on again (audit56 K1), not
    even when an earlier stage of this invocation trained and stored M (audit56 review R2); what earlier stages
    completed stays recorded, and the stage's record is as it was. When the stage is the first this invocation
    wrote for, run.json's bytes are those it found. `report` (the report.html this stage removed) is written back
    too (audit56 review R5). False (nothing written: the caller records the stop) without earlier bytes readable as
    JSON, or when a complete record's outputs changed since (a multi-mode stage that trained one mode before
    another's resume was refused): its record must not be put back over new files (audit47 kill F1)."""
    if prior is None:
        return False
    if before is not None and before.get("status") == "complete":
        with contextlib.suppress(OSError):
            if verify_outputs(run_dir / spec.name, before.get("outputs", {}), walk.digests, spec):
                return False
    try:
        found = json.loads(prior)
    except ValueError:
        return False
    if not isinstance(found, dict):
        return False
    try:
        if found.get("target_step") == walk.start_target:
            atomic_write_bytes(run_dir / RUN_JSON, prior)
        else:  # an earlier stage's `running` record stored this invocation's --target-step: not kept
            if walk.start_target is None:
                found.pop("target_step", None)
            else:
                found["target_step"] = walk.start_target
            _write_state(run_dir, found)
    except OSError:  # not written: the caller records the stop, and the refusal is raised as it is
        return False
    if report is not None:
        with contextlib.suppress(OSError):  # a report not put back is rewritten by the next --resume
            atomic_write_bytes(run_dir / REPORT_HTML, report)
    return True


def _record_stop(
    run_dir: Path,
    state: dict[str, Any],
    spec: StageSpec,
    before: dict | None,
    exc: BaseException,
    digests: DigestCache | None = None,
) -> None:
    """Record how a stage stopped: `interrupted` (Ctrl-C, SIGTERM) or `failed` with the error's first line. A stage
    that was complete before this continuation (`--target-step`, a raised step count) keeps its complete record while
    the outputs it records are still there unchanged and its globs match no file more; once the continuation rewrote
    one (its export) or added one (a checkpoint its globs match: audit58 B2, --resume would refuse it), the record is
    `interrupted` / `failed` like any other, so `--resume` continues from the newest checkpoint: putting the old record
    back over new files left a run every --resume refused (exit 52, audit47 kill F1). A write that fails here does
    not hide `exc`."""
    intact = before is not None and before.get("status") == "complete"
    if intact:
        with contextlib.suppress(OSError):
            intact = not verify_outputs(run_dir / spec.name, before.get("outputs", {}), digests, spec)
    stage = spec.name
    if intact:
        state["stages"][stage] = before
    else:
        interrupted = isinstance(exc, (KeyboardInterrupt, SystemExit))
        line = " ".join(str(exc).split())[:300]
        state["stages"][stage]["status"] = "interrupted" if interrupted else "failed"
        state["stages"][stage]["error"] = f"{type(exc).__name__}: {line}" if line else type(exc).__name__
    with contextlib.suppress(OSError):
        _write_state(run_dir, state)
