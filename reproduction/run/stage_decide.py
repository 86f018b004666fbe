"""What the runner does with one stage on this invocation: run it afresh, skip it, continue it from its checkpoints,
or refuse (StageKeyChangedError, exit 52, naming what changed) — from its run.json record, today's stage key and
the options (`--resume`, `--restart-stage`, `--target-step`, a raised step count)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reproduction.digest_cache import DigestCache
from reproduction.errors import StageKeyChangedError, UsageError
from reproduction.recipe import StageSpec
from reproduction.run.config import select
from reproduction.run.stage_keys import comparable_parts, describe_changes, recorded_key_still_matches
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
) -> str:
    """fresh, skip, continue (from checkpoints), or raise naming the difference. `restarted`: the stages
    `--restart-stage` names and those downstream of them (`downstream`)."""
    if spec.name in opts.restart or spec.name in restarted or rec is None:
        return "fresh"  # restarted, or after a restarted stage: redone whatever else changed in its key
    recorded = rec.get("key_parts", {})
    if rec.get("key") != key and not recorded_key_still_matches(spec, recorded, key, free, parts, recorded_config):
        if spec.redo_on_change:
            return "fresh"
        # compared as today's code keys (a dataset's path left out): a moved dataset is no change to name
        old = comparable_parts(spec, recorded, parts, free, recorded_config) if isinstance(recorded, dict) else {}
        changes = describe_changes(old, parts)
        if changes and all(c.startswith("upstream.") for c in changes):
            # Only the runner rewrites an upstream stage's record (a file edited under it fails that stage's own
            # check first), so it was redone, here or in an earlier run (`--stages policy --target-step N`):
            # its dependents follow.
            return "fresh"
        if rec.get("status") != "complete" and not spec.training:
            return "fresh"  # killed before it completed, with nothing kept to continue from
        raise StageKeyChangedError(
            f"stage {spec.name}: its inputs changed since it ran: " + "; ".join(changes),
            stage=spec.name,
            changes=changes,
            hint=f"put the inputs back, or pass --restart-stage {spec.name} to redo it (and what follows)",
        )
    if rec.get("status") == "complete":
        refuse_fewer_steps(spec, rec, plain, recorded_config)
        problems = verify_outputs(stage_dir, rec.get("outputs", {}), digests)
        if problems:
            raise StageKeyChangedError(
                f"stage {spec.name}: its outputs changed after it completed: " + "; ".join(problems),
                stage=spec.name,
                changes=problems,
                hint=f"pass --restart-stage {spec.name} to redo it",
            )
        return "continue" if trains_on(spec, rec, plain, opts) is not None else "skip"
    return "continue" if spec.training else "fresh"


def refuse_fewer_steps(spec: StageSpec, rec: dict[str, Any], plain: dict[str, Any], recorded: dict[str, Any]) -> None:
    """StageKeyChangedError (exit 52) when a complete training stage's step count (`spec.training`, exempt from
    its key so --target-step can train on) was lowered below both the value it ran with and the steps it
    trained: skipping it would record results of more steps under a config claiming fewer. (After
    `--target-step N` the stage holds N steps under the unchanged value: that is not a lowering.)"""
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
        hint=f"set {spec.training}={before if is_int(before) else rec['step']} again (a trained stage is not "
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
    specs: Sequence[StageSpec], state: dict[str, Any] | None, plain: dict[str, Any], target: int | None
) -> None:
    """UsageError (exit 2), before anything runs, naming every complete training stage of `specs` (the selected ones
    not redone afresh) for which `--target-step` (`target`) and the config ask for different things: the target at or
    below the steps it trained, its step count (`spec.training`) raised above them. --target-step says "no more
    steps" and the count "train on", so either choice would break a promise: skipped, run.json's config would claim
    steps the stage never trained (the mismatch trains_on prevents); trained on, --target-step would be ignored."""
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
    raise UsageError(
        f"--target-step {target} asks for no more steps, but the config raises "
        + "; ".join(
            f"stage {spec.name}'s {spec.training} to {wanted}, above the {step} steps it trained"
            for spec, step, wanted in clashes
        )
        + " (nothing was run)",
        field="target_step",
        hint=f"drop --target-step to train on to {counts} (--resume), or pass --target-step "
        f"{max(wanted for *_, wanted in clashes)} or more",
    )


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
