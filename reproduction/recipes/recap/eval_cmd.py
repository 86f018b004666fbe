"""`portable eval --checkpoint` for RECAP runs: evaluate policy exports of a run (or one export folder) and write
their evidence beside the run's, compared with eval.reference when one is set.

    <output>/eval_checkpoint/<name>/    the simulator's per-policy output (<name>: checkpoint, or
                                        checkpoint_<mode>_<key> for an export folder)
    <output>/evidence/eval_<name>_<step>.json, comparison_<name>_<step>.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from reproduction.ui import UiOptions, say


def cmd_eval(args: Any, run_dir: Path, state: dict[str, Any] | None, ui: UiOptions) -> int:
    """`portable eval --checkpoint STEP|PATH --output DIR` for RECAP (run/cli.py's cmd_eval calls it with the paths
    normalised, the run folder locked and `state` its run.json, or None): evaluate policy exports, write their
    evidence.

    With DIR a run folder, the run's resolved config is the base (overrides apply on top) and STEP
    names its recap policy's step; a PATH is a policy export folder (export/ of a policy stage).
    """
    from reproduction.recipes.recap.config import load_config
    from reproduction.recipes.recap.policy import evaluate_exports
    from reproduction.run.evidence import refuse_unwritable_outputs
    from reproduction.run.runner import state_config_file

    overrides = list(args.overrides or [])
    files = [Path(c) for c in args.config or []]
    if state is not None and not files:
        files = [state_config_file(run_dir, state)]
    config = load_config(files, overrides, run_dir=run_dir)
    exports, name = _resolve_checkpoint(args.checkpoint, run_dir, state)
    config.policy.modes = list(exports)
    labels = {mode: label for mode, (path, _) in exports.items() if (label := own_label(path, mode)) is not None}
    shown = ", ".join(
        (f"{labels[mode]} (mode {mode}, " if mode in labels else f"{mode} (") + f"step {step}, {path})"
        for mode, (path, step) in exports.items()
    )
    # Its own folder and evidence name: the eval stage's recorded outputs stay as the run wrote them, and
    # each export evaluated into one --output gets its own file.
    out_dir = run_dir / "eval_checkpoint" / name
    refuse_unwritable_outputs(run_dir, out_dir)
    say(f"evaluating {len(exports)} policy export(s): {shown}", options=ui)
    output = evaluate_exports(
        config, exports, out_dir, run_dir, name=name, ui=ui, labels=labels, export_execute_steps=True, resume=False
    )
    say(f"evidence: {run_dir / output.summary['evidence']}", options=ui)
    if config.eval.reference:
        from reproduction.recipes.recap.policy import compare_with_reference

        evidence = run_dir / output.summary["evidence"]
        out = evidence.with_name(evidence.name.replace("eval_", "comparison_", 1))
        output.summary["comparison"] = compare_with_reference(evidence, Path(config.eval.reference), out)
        verdict = output.summary["comparison"]["verdict"]
        say(f"against the reference evidence: {verdict} ({out})", options=ui)
    if getattr(args, "json", False):
        sys.stdout.write(json.dumps(output.summary, indent=1) + "\n")
    return 0


def _resolve_checkpoint(
    text: str, run_dir: Path, state: dict[str, Any] | None
) -> tuple[dict[str, tuple[Path, int | None]], str]:
    """({mode: (export folder, step)}, evidence name) from --checkpoint STEP (every policy mode the run
    trained, at that step: evidence/eval_checkpoint_STEP.json) or PATH (one export, its step read from its
    own metadata: evidence/eval_checkpoint_<mode>_<key of its folder>_STEP.json, so two exports evaluated
    into one --output never share a file)."""
    import hashlib

    from reproduction.errors import CheckpointError, InputNotFoundError

    if text.isdigit():
        step = int(text)
        rec = (state or {}).get("stages", {}).get("policy")
        if not rec or rec.get("status") != "complete":
            raise InputNotFoundError(
                f"{run_dir} holds no completed policy stage to take step {step} from",
                path=run_dir,
                hint="run `portable run --output DIR` first, or pass --checkpoint PATH (a policy export folder)",
            )
        done = rec.get("step")
        if done != step:
            raise CheckpointError(
                f"step {step}: the run's policy export is of step {done} (only the last step is exported)",
                path=run_dir / "policy",
                hint=f"pass --checkpoint {done}"
                + (
                    f", or train on with `portable run --target-step {step} --stages policy`"
                    if step > (done or 0)
                    else ""
                ),
            )
        modes = list(rec.get("summary") or {"recap": {}})
        exports = {
            m: (run_dir / "policy" / m / "export", (rec.get("summary") or {}).get(m, {}).get("step", step))
            for m in modes
        }
        return exports, "checkpoint"
    path = Path(text)
    if not (path / "policy.json").is_file():
        raise InputNotFoundError(
            f"checkpoint {path} is not a policy export (no policy.json)",
            path=path,
            hint="pass a run's policy/<mode>/export folder, or a step number with --output RUN",
        )
    from reproduction.recap.policy.export import export_step

    meta = json.loads((path / "policy.json").read_text(encoding="utf-8"))
    mode = str(meta.get("mode", "recap"))
    refuse_foreign_export(path, meta, mode)
    key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:8]
    return {mode: (path, export_step(path, meta))}, f"checkpoint_{mode}_{key}"


def refuse_foreign_export(path: Path, meta: dict[str, Any], mode: str) -> None:
    """ConfigError (exit 4) for an export RECAP's evidence cannot label truthfully: one another recipe trained
    (policy.json's `algorithm`, e.g. a GRPO rl export: it would be recorded and compared as `bc`), or of a mode
    RECAP does not train. A RECAP export names no algorithm; a BC export of another recipe (GRPO's sft) is a bc
    policy and is evaluated as one, labelled by the stage that wrote it (own_label)."""
    from reproduction.errors import ConfigError
    from reproduction.recap.policy.conditioning import MODES

    algorithm = meta.get("algorithm")
    if algorithm in (None, "recap") and mode in MODES:
        return
    what = f"algorithm {algorithm}, mode {mode}" if algorithm is not None else f"mode {mode}"
    hint = (
        f"evaluate it into a {algorithm} run folder: portable eval --checkpoint {path} --output {algorithm.upper()}_RUN"
        if isinstance(algorithm, str) and algorithm
        else "pass a RECAP run's policy/<mode>/export folder"
    )
    raise ConfigError(
        f"checkpoint {path} is not a RECAP policy export (policy.json: {what}); a RECAP run's evidence labels only "
        f"RECAP's modes ({', '.join(MODES)})",
        path=path,
        field="--checkpoint",
        hint=hint,
    )


def own_label(path: Path, mode: str) -> str | None:
    """The evidence label of a baseline (non-recap) export another recipe's run wrote as one of its stages
    (<run>/<stage>/export, <run>/run.json of a recipe other than recap recording that stage): the stage's name, so
    GRPO's sft export is labelled `sft` in RECAP's evidence as in GRPO's, not `bc` beside RECAP's own bc policy
    (`<recipe>_<stage>` when the stage is named like one of RECAP's modes). None for a RECAP run's export
    (<run>/policy/<mode>/export) and for an export outside any run folder: labelled by its mode."""
    from reproduction.recap.policy.conditioning import MODES
    from reproduction.recipe import STAGE_NAME

    if mode == "recap":
        return None
    stage_dir = Path(path).resolve().parent
    try:
        state = json.loads((stage_dir.parent / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    recipe = state.get("recipe") if isinstance(state, dict) else None
    stages = state.get("stages") if isinstance(state, dict) else None
    if not isinstance(recipe, str) or not STAGE_NAME.fullmatch(recipe) or recipe == "recap":
        return None  # the label names a folder of eval_checkpoint/: a plain name only
    if not isinstance(stages, dict) or stage_dir.name not in stages:
        return None
    return f"{recipe}_{stage_dir.name}" if stage_dir.name in MODES else stage_dir.name
