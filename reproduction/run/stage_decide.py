"""What the runner does with one stage on this invocation: run it afresh, skip it, continue it from its checkpoints,
or refuse (StageKeyChangedError, exit 52, naming what changed) — from its run.json record, today's stage key and
the options (`--resume`, `--restart-stage`, `--target-step`, a raised step count)."""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reproduction.config_fields import recorded_train
from reproduction.digest_cache import DigestCache
from reproduction.digests import json_sha256, sha256_file
from reproduction.errors import StageKeyChangedError, UsageError
from reproduction.recipe import StageSpec
from reproduction.run.config import select
from reproduction.run.lineage import LINEAGE_DIR, SUFFIX
from reproduction.run.stage_keys import (
    UNTOLD,
    Untold,
    describe_changes,
    exempt,
    recorded_key_still_matches,
    upgrade_parts,
)
from reproduction.run.stage_outputs import verify_outputs

if TYPE_CHECKING:
    from reproduction.run.runner import RunOptions


def decide(
    spec: StageSpec,
    rec: dict[str, Any] | None,
    key: str,
    parts: dict,
    stage_dir: Path,
    opts: RunOptions,
    plain: dict[str, Any],
    recorded_config: dict[str, Any],
    free: Sequence[str] = (),
    digests: DigestCache | None = None,
    restarted: set[str] | frozenset[str] = frozenset(),
    ran_with: Any = None,
) -> str:
    """fresh, skip, continue (from checkpoints), or raise naming the difference. `restarted`: the stages
    `--restart-stage` names and those downstream of them (`downstream`). `ran_with`: the record's `stage_ran_with`
    where the caller has it (None: read here)."""
    if spec.name in opts.restart or spec.name in restarted or rec is None:
        return "fresh"  # restarted, or after a restarted stage: redone whatever else changed in its key
    if rec.get("status") != "complete" and not spec.training:
        return "fresh"  # killed before it completed, with nothing kept to continue from: its key decides nothing
    if declaration_changes(spec, rec):  # the recipe's own edit, which no key sees (audit58 B3)
        refuse_changed_declaration(spec, rec)
        return "fresh"  # redo_on_change
    recorded = rec.get("key_parts", {})
    # a config key the record lacks reads as the config the stage ran with (stage_keys.unkeyed_filled: audit56 R1)
    if ran_with is None:
        ran_with = stage_ran_with(spec, rec, stage_dir, recorded_config)
    if rec.get("key") != key and not recorded_key_still_matches(spec, recorded, key, free, parts, ran_with):
        moves = moved_locations(spec, recorded, parts, free, ran_with)
        if moves is None or not opts.inputs_moved:
            _refuse_changed(spec, rec, parts, opts, moves, ran_with)
            return "fresh"
        # --inputs-moved: the user says the data at the new paths is the data the stage ran on; the runner records
        # today's key (and the move) so a later --resume needs no flag
    if rec.get("status") == "complete":
        refuse_fewer_steps(spec, rec, plain, recorded_config, layers_hint(missing_layers([rec], opts.config_files)))
        target = trains_on(spec, rec, plain, opts)
        # a record without `declaration` was written before additions were checked (stop 58), by code that put a
        # complete record back over a continuation stopped after it wrote files its globs match (a live evaluation,
        # a checkpoint): continuing rewrites and re-records them, so only a stage that is not continued is refused
        # for an addition (review58 S2)
        added_checked = target is None or "declaration" in rec
        problems = verify_outputs(stage_dir, rec.get("outputs", {}), digests, spec if added_checked else None)
        if problems:
            raise StageKeyChangedError(
                f"stage {spec.name}: its outputs changed after it completed: " + "; ".join(problems),
                stage=spec.name,
                changes=problems,
                hint=f"pass --restart-stage {spec.name} to redo it",
            )
        return "continue" if target is not None else "skip"
    return "continue" if spec.training else "fresh"


def declaration(spec: StageSpec) -> dict[str, Any]:
    """What stage `spec` declares of its place in the pipeline that no part of its key covers, as its run.json record
    keeps it (`declaration`): `needs`, `inputs`, `outputs`, `training` and `target`. A Recipe defined apart from its
    stage functions is edited without any keyed code changing (audit58 B3). Its `config`, `code`, `files`, `weights`
    are left out: the key already holds what they name (a config key added with its value unchanged, a module added
    to `code`, must not refuse a run folder a newer recipe version resumes; review58 S1), as is `uses_ray` (where
    workers run, not what they compute). Tuples whose order means nothing are sorted: reordering `needs` is no
    change."""
    return {
        "needs": sorted(spec.needs),
        "inputs": spec.inputs,
        "outputs": sorted(spec.outputs),
        "training": spec.training,
        "target": spec.target,
    }


def declaration_changes(spec: StageSpec, rec: dict[str, Any] | None) -> list[tuple[str, Any, Any]]:
    """(field, recorded, today) of each declaration of `spec` that differs from the one its record `rec` was made
    under; [] when they agree, and for a record without one (written before stop 58: accepted as it is)."""
    old = rec.get("declaration") if isinstance(rec, dict) else None
    if not isinstance(old, dict):
        return []
    now = declaration(spec)
    # a field only one side has is not compared: a record made when `declaration` held more (or fewer) fields still
    # resumes (review58 S1: config, code, ... left the declaration once the key was seen to cover them)
    return [(k, old[k], v) for k, v in now.items() if k in old and old[k] != v]


def refuse_changed_declaration(spec: StageSpec, rec: dict[str, Any]) -> None:
    """StageKeyChangedError (exit 52) when stage `spec`'s declaration (`declaration`: its needs, outputs, training
    key, ...) differs from the one its record was made under: the record says what the stage read and wrote under
    the old one, so skipping it would mix two recipes in one run ("refuse or redo, never silently mix"). A stage
    with `redo_on_change` is redone instead (the caller returns "fresh")."""
    changes = declaration_changes(spec, rec)
    if not changes or spec.redo_on_change:
        return
    raise StageKeyChangedError(
        f"stage {spec.name}: its declaration in the recipe changed since it ran: "
        + "; ".join(f"{k}: {_full(a)} -> {_full(b)}" for k, a, b in changes),
        stage=spec.name,
        changes=[f"declaration.{k}" for k, _, _ in changes],
        hint=f"put the recipe back, or pass --restart-stage {spec.name} to redo it (and what follows)",
    )


def ran_with_config(
    rec: dict[str, Any],
    recorded_config: dict[str, Any],
    statement: Path,
    spec: StageSpec | None = None,
    stage_dir: Path | None = None,
) -> Any:
    """The config stage record `rec` provably ran with, an `Untold` (saying why) when nothing says: run.json's
    `config` (`recorded_config`, the latest invocation's) where its digest is the one the record names, else the
    config of the stage's lineage statement (`statement`, written by the invocation that completed it) where its
    digest is. The digest a record names: a complete one's `lineage.config_sha256` (its statement's); an unfinished
    one's `config_sha256` (written with `running` by the invocation that started it: audit56 review3 T1), never the
    `lineage` a previous completion left in it (another invocation's config: T2). An unfinished training record
    written before either (`spec`'s, killed mid-run) reads the train config its setup files in `stage_dir` record
    (`config_fields.recorded_train`, the rule its checkpoints are resumed by) into the config section holding
    `spec.training`; a field outside that section stays absent (a change). Only a field keyed after the record was
    written is read from it (`stage_keys.unkeyed_filled`); taking run.json's config whatever its digest resumed a
    stage trained with micro_batch 8 under 4 and recorded 4 (audit56 review2 S1)."""
    if rec.get("status") == "complete":
        sha = (rec.get("lineage") or {}).get("config_sha256") if isinstance(rec.get("lineage"), dict) else None
    else:
        sha = rec.get("config_sha256")
    if not isinstance(sha, str):
        if rec.get("status") != "complete" and spec is not None and spec.training and stage_dir is not None:
            return _setup_config(spec, stage_dir)
        return Untold("its record holds no digest of the config it ran with (it was written before records kept one)")
    if recorded_config and json_sha256(recorded_config) == sha:
        return recorded_config
    try:
        config = json.loads(statement.read_text())["predicate"]["buildDefinition"]["externalParameters"]["config"]
    except (OSError, ValueError, KeyError, TypeError):  # missing or unreadable: lineage --verify names it
        return UNTOLD
    return config if isinstance(config, dict) and json_sha256(config) == sha else UNTOLD


def _setup_config(spec: StageSpec, stage_dir: Path) -> Any:
    """The config an unfinished training stage ran with as far as its setup files in `stage_dir` tell it: their train
    config under the section of `spec.training` (`sft.train`), else an Untold naming what is missing."""
    train = recorded_train(stage_dir)
    if train is None:
        return Untold("neither its record nor its setup files say which value it ran with")
    config: dict[str, Any] = train
    for part in reversed(str(spec.training).split(".")[:-1]):
        config = {part: config}
    return config


def stage_ran_with(spec: StageSpec, rec: dict[str, Any], stage_dir: Path, recorded_config: dict[str, Any]) -> Any:
    """`ran_with_config` of stage `spec`'s record `rec` (its statement beside the run's other statements, its setup
    files in `stage_dir`): what decide, the move it accepted and a restated statement all read (audit56 review3 T3)."""
    return ran_with_config(
        rec, recorded_config, stage_dir.parent / LINEAGE_DIR / f"{spec.name}{SUFFIX}", spec, stage_dir
    )


def _refuse_changed(
    spec: StageSpec,
    rec: dict[str, Any],
    parts: dict,
    opts: RunOptions,
    moves: dict[str, str] | None,
    ran_with: Any = None,
) -> None:
    """Return (the stage is redone afresh) or raise StageKeyChangedError (exit 52) for a stage whose key differs from
    its record's, as decided before --inputs-moved existed; the message names each differing item in full, and a
    difference only of where its datasets are (`moves`) in one line naming the opt-in."""
    if spec.redo_on_change:
        return
    old = upgrade_parts(spec, rec.get("key_parts", {}), parts, ran_with)
    changes = describe_changes(old, parts)
    if changes and all(c.startswith("upstream.") for c in changes):
        # Only the runner rewrites an upstream stage's record (a file edited under it fails that stage's own
        # check first), so it was redone, here or in an earlier run (`--stages policy --target-step N`):
        # its dependents follow.
        return
    if rec.get("status") != "complete" and not spec.training:
        return  # killed before it completed, with nothing kept to continue from
    hint = layers_hint(missing_layers([rec], opts.config_files))
    if moves:
        raise StageKeyChangedError(
            f"stage {spec.name}: only the location of its datasets changed (same fingerprints, same everything "
            "else): " + "; ".join(f"{a} -> {b}" for a, b in moves.items()),
            stage=spec.name,
            changes=changes,
            hint=hint + "if the data at the new paths is the data it ran on, pass --inputs-moved to resume there "
            "(a fingerprint pins a dataset's key columns, not every byte, so the move is yours to vouch for); "
            f"or put the data back, or pass --restart-stage {spec.name} to redo it (and what follows)",
        )
    raise StageKeyChangedError(
        f"stage {spec.name}: its inputs changed since it ran: "
        + "; ".join(f"{w}: {_full(a)} -> {_full(b)}" for w, a, b in item_changes(old, parts)),
        stage=spec.name,
        changes=changes,
        hint=hint + f"put the inputs back, or pass --restart-stage {spec.name} to redo it (and what follows)",
    )


def item_changes(old: Any, new: Any, where: str = "") -> list[tuple[str, Any, Any]]:
    """(place, old value, new value) of each differing leaf of two key-part trees, a list of mappings or lists
    compared item by item when both sides have the same length (`config.datasets[0].path`), sorted by key;
    "<absent>" for a missing key."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new), key=str):
            out += item_changes(old.get(k, "<absent>"), new.get(k, "<absent>"), f"{where}.{k}" if where else str(k))
        return out
    compound = any(isinstance(v, (dict, list)) for v in (*old, *new)) if isinstance(old, list) else False
    if compound and isinstance(new, list) and len(old) == len(new):  # a list of scalars reads best whole
        return [c for i, (a, b) in enumerate(zip(old, new)) for c in item_changes(a, b, f"{where}[{i}]")]
    return [] if old == new else [(where, old, new)]


def _full(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, default=str, sort_keys=True)


def moved_locations(
    spec: StageSpec, recorded_parts: Any, parts: dict, free: Sequence[str] = (), ran_with: Any = None
) -> dict[str, str] | None:
    """{old path: new path} when the only differences between a stage's recorded key parts and today's `parts` are
    where its datasets are: config strings naming a dataset folder (the `path` of a list's entry, or a value that
    names one of the stage's inputs) moved to a folder of the same name elsewhere, one-to-one, and the inputs named
    by those paths renamed with them (an input keyed by a path no config subset of the stage holds: to the one new input
    of the same folder name and fingerprint), every input's fingerprint equal; everything else (config, code,
    upstream, files) equal. None otherwise (also when nothing moved). Two entries whose paths were swapped give
    different folder names or fingerprints, so they are no move."""
    if not isinstance(recorded_parts, dict) or not isinstance(recorded_parts.get("config"), dict):
        return None
    old = upgrade_parts(spec, recorded_parts, parts, ran_with)
    old["config"] = exempt(spec, old["config"], free)
    names = set(old.get("inputs") or {})
    moves: dict[str, str] = {}
    for where, a, b in item_changes(old["config"], parts.get("config", {})):
        if not (isinstance(a, str) and isinstance(b, str) and a and b):
            return None
        # a dataset entry's `path` (an item of a list: `datasets[0].path`), or a value naming an input
        if not (re.search(r"\]\.path$", where) or a in names or str(Path(a)) in names):
            return None
        if Path(a).name != Path(b).name or moves.setdefault(a, b) != b:
            return None
    before, now = old.get("inputs"), parts.get("inputs")
    if isinstance(before, dict) and isinstance(now, dict):
        # a stage that reads no dataset path from the config still keys the inputs by path: each input gone from
        # its old name pairs with the one new name of the same folder name and fingerprint
        known = {str(Path(a)) for a in moves}
        for n in set(before) - set(now) - known:
            found = [m for m in set(now) - set(before) if Path(m).name == Path(n).name and now[m] == before[n]]
            if len(found) != 1:
                return None
            moves[n] = found[0]
    if not moves or len(set(moves.values())) != len(moves):
        return None
    by_name = {str(Path(a)): str(Path(b)) for a, b in moves.items()} | moves
    if isinstance(old.get("inputs"), dict):
        old["inputs"] = {by_name.get(n, n): fp for n, fp in old["inputs"].items()}
    old["config"] = _relocated(old["config"], moves)
    return moves if json_sha256(old) == json_sha256(parts) else None


def _relocated(tree: Any, moves: dict[str, str]) -> Any:
    """`tree` with every string that is a key of `moves` replaced by its value (a copy)."""
    if isinstance(tree, dict):
        return {k: _relocated(v, moves) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_relocated(v, moves) for v in tree]
    return moves.get(tree, tree) if isinstance(tree, str) else tree


def refuse_fewer_steps(
    spec: StageSpec, rec: dict[str, Any], plain: dict[str, Any], recorded: dict[str, Any], hint_first: str = ""
) -> None:
    """StageKeyChangedError (exit 52) when a complete training stage's step count (`spec.training`, exempt from
    its key so --target-step can train on) was lowered below both the value it ran with and the steps it
    trained: skipping it would record results of more steps under a config claiming fewer. (After
    `--target-step N` the stage holds N steps under the unchanged value: that is not a lowering.) `hint_first`:
    what the hint says first (`layers_hint`: the --config layers the stage ran with that are missing now)."""
    if not spec.training or not is_int(rec.get("step")):
        return
    wanted, before = select(plain, spec.training), select(recorded, spec.training)
    if not is_int(wanted) or wanted >= rec["step"] or (is_int(before) and wanted >= before):
        return
    raise StageKeyChangedError(
        f"stage {spec.name}: {spec.training} is now {wanted}, but the stage trained {rec['step']} steps "
        f"(it ran with {spec.training}={before if is_int(before) else rec['step']})",
        stage=spec.name,
        changes=[f"{spec.training}: {before} -> {wanted}"],
        hint=hint_first
        + f"set {spec.training}={before if is_int(before) else rec['step']} again (a trained stage is not "
        f"cut back), or pass --restart-stage {spec.name} to train it anew for {wanted} steps",
    )


def trains_on(spec: StageSpec, rec: dict[str, Any], plain: dict[str, Any], opts: RunOptions) -> int | None:
    """The step a complete training stage trains on to in this invocation, None when it does not: `--target-step N`
    above the steps it trained, or, without --target-step, its step count in the config (`spec.training`) raised
    above them (`--resume` continues a stage up to the configured count, a completed one too: the count is exempt
    from its key, so skipping it would leave run.json's config claiming steps the stage never trained), step 0
    included (a run with the count 0 trains on when it is raised). A stage that recorded no step (None) is not
    counted in steps (GRPO's sft copying a pinned sft.export) and is not trained on by a raised count."""
    if not spec.training:
        return None
    step = rec.get("step")
    if opts.target_step is not None:
        return opts.target_step if (step or 0) < opts.target_step else None
    wanted = select(plain, spec.training)
    return wanted if is_int(wanted) and is_int(step) and step < wanted else None


def refuse_target_below_raised_count(
    specs: Sequence[StageSpec],
    state: dict[str, Any] | None,
    plain: dict[str, Any],
    target: int | None,
    config_files: Sequence[str | Path] | None = None,
) -> None:
    """UsageError (exit 2), before anything runs, naming every complete training stage of `specs` (the selected ones
    not redone afresh) for which `--target-step` (`target`) and the config ask for different things: the target at or
    below the steps it trained, its step count (`spec.training`) raised above them. --target-step says "no more
    steps" and the count "train on", so either choice would break a promise: skipped, run.json's config would claim
    steps the stage never trained (the mismatch trains_on prevents); trained on, --target-step would be ignored.
    `config_files`: the --config layers given now; when a clashing stage's record names layers it ran with that
    are not among them (`missing_layers`), the hint names those first: the usual cause is a layer left out
    (a quick demo's config/quick.yaml), and the other ways out would retrain at full size (audit51 I4)."""
    if target is None or state is None:
        return
    clashes = []
    for spec in specs:
        rec = (state.get("stages") or {}).get(spec.name)
        if not spec.training or not isinstance(rec, dict) or rec.get("status") != "complete":
            continue
        step, wanted = rec.get("step"), select(plain, spec.training)
        if is_int(step) and is_int(wanted) and target <= step < wanted:
            clashes.append((spec, step, wanted))
    if not clashes:
        return
    counts = ", ".join(f"{spec.training}={wanted}" for spec, _, wanted in clashes)
    layers = missing_layers([state["stages"][spec.name] for spec, *_ in clashes], config_files)
    raise UsageError(
        f"--target-step {target} asks for no more steps, but the config raises "
        + "; ".join(
            f"stage {spec.name}'s {spec.training} to {wanted}, above the {step} steps it trained"
            for spec, step, wanted in clashes
        )
        + " (nothing was run)",
        field="target_step",
        hint=layers_hint(layers)
        + f"drop --target-step to train on to {counts} (--resume), or pass --target-step "
        + f"{max(wanted for *_, wanted in clashes)} or more",
    )


def config_layers(files: Sequence[str | Path | Sequence[str]] | None) -> list[list[str]] | None:
    """The --config layers a stage ran with, as run.json's stage records keep them (`config_files`): one
    [absolute path, sha256 of its bytes] pair per layer, in order; None when the caller did not say which layers it
    used (an API run: nothing is recorded). A layer given as a [path, sha256] pair (what the CLI hashed when it
    read the config, RunOptions.config_files) is kept as it is; one given as a path is hashed now: "" for one that
    is not a regular file (a pipe, /dev/stdin: reading it again would consume or block) or is unreadable."""
    if files is None:
        return None
    return [
        [str(f[0]), str(f[1])] if isinstance(f, (list, tuple)) else [os.path.abspath(f), _file_sha256(f)] for f in files
    ]


def missing_layers(
    records: Sequence[dict[str, Any]], config_files: Sequence[str | Path] | None
) -> list[tuple[str, int, list[str]]]:
    """The layers the stage `records` ran with (their `config_files`) that the layers given now (`config_files`)
    lack: (path, its 1-based place then, every path of that record), each path once, in order. A layer counts as
    given when its path or its bytes' sha256 is among today's (a bundle restored elsewhere keeps its layers' bytes).
    [] when today's layers are unknown (None) or a record names none (run folders from before stop 52)."""
    if config_files is None:
        return []
    now = config_layers(config_files) or []
    paths, shas = {p for p, _ in now}, {s for _, s in now if s}
    out: list[tuple[str, int, list[str]]] = []
    for rec in records:
        recorded = rec.get("config_files")
        if not isinstance(recorded, list):
            continue
        order = [str(p) for p, _ in recorded]
        for i, (path, sha) in enumerate(recorded, 1):
            if path not in paths and not (sha and sha in shas) and path not in [m[0] for m in out]:
                out.append((str(path), i, order))
    return out


def layers_hint(layers: Sequence[tuple[str, int, list[str]]]) -> str:
    """The start of a refusal's hint naming the --config layers a run was made with that this command leaves out
    (`missing_layers`); "" when none is missing."""
    if not layers:
        return ""
    named = ", ".join(f"--config {path} (layer {i})" for path, i, _ in layers)
    again = " ".join(f"--config {p}" for p in layers[0][2])
    return (
        f"this run was made with {named}, which this command does not pass: pass the same --config layers "
        f"({again}); or "
    )


def _file_sha256(path: str | Path) -> str:
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return ""
        return sha256_file(Path(path))
    except OSError:
        return ""


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
