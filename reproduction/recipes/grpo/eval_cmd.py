"""`portable eval --checkpoint` for GRPO runs (Recipe.evaluate): the release form `eval --checkpoint 60`.

    <output>/eval_checkpoint/<name>/    the simulator's per-policy output
    <output>/evidence/eval_<name>_<step>.json, comparison_<name>_<step>.json

<name> is `checkpoint` for --checkpoint STEP (the run's rl export, with its sft policy as the baseline, as the eval
stage does), `checkpoint_<key>` for --checkpoint PATH (one policy export folder; <key> names the folder). The eval
stage's own evidence (eval_grpo_<step>.json) is never touched.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from reproduction.ui import UiOptions, say


def cmd_eval(args: Any, run_dir: Path, state: dict[str, Any] | None, ui: UiOptions) -> int:
    """Evaluate the export --checkpoint names on the config's held-out episodes (eval.*; in a run folder the run's
    resolved config, overrides on top) and write its evidence; compared with eval.reference when one is set.
    Raises InputNotFoundError (no complete rl stage; PATH not a policy export), CheckpointError (STEP is not the
    exported step: only the last step is exported) and what the config loader and the simulator raise."""
    from reproduction.recipes.grpo.config import GrpoRunConfig
    from reproduction.recipes.grpo.stages import evaluate_exports
    from reproduction.run.config import load_config
    from reproduction.run.evidence import refuse_unwritable_outputs
    from reproduction.run.runner import state_config_file

    files = [Path(c) for c in args.config or []]
    if state is not None and not files:
        files = [state_config_file(run_dir, state)]
    config = load_config(files, list(args.overrides or []), run_dir=run_dir, schema=GrpoRunConfig)
    exports, name = _resolve_checkpoint(args.checkpoint, run_dir, state)
    shown = ", ".join(f"{label} (step {step}, {path})" for label, (path, step) in exports.items())
    out_dir = run_dir / "eval_checkpoint" / name
    refuse_unwritable_outputs(run_dir, out_dir)  # before the first rollout, not after them all (audit47 F17)
    say(f"evaluating {len(exports)} policy export(s): {shown}", options=ui)
    output = evaluate_exports(config, exports, out_dir, run_dir, name=name, ui=ui, resume=False)
    evidence = run_dir / output.summary["evidence"]
    say(f"evidence: {evidence}", options=ui)
    if config.eval.reference:
        from reproduction.run import evidence as ev

        out = evidence.with_name(evidence.name.replace("eval_", "comparison_", 1))
        comparison = ev.compare_files(evidence, Path(config.eval.reference), out=out).to_dict()
        output.summary["comparison"] = {"path": str(out), "verdict": comparison["verdict"]}
        say(f"against the reference evidence: {comparison['verdict']} ({out})", options=ui)
    if getattr(args, "json", False):
        sys.stdout.write(json.dumps(output.summary, indent=1) + "\n")
    return 0


def _resolve_checkpoint(
    text: str, run_dir: Path, state: dict[str, Any] | None
) -> tuple[dict[str, tuple[Path, int | None]], str]:
    """({label: (export folder, step)}, evidence name) of --checkpoint STEP (the run's rl export at that step, its
    sft export as the baseline) or PATH (one export, its step from its train_config.json)."""
    from reproduction.errors import CheckpointError, InputNotFoundError
    from reproduction.recap.policy.export import export_step
    from reproduction.recipes.grpo.stages import sft_step

    if text.isdigit():
        step = int(text)
        stages = (state or {}).get("stages", {})
        rec = stages.get("rl")
        if not rec or rec.get("status") != "complete":
            raise InputNotFoundError(
                f"{run_dir} holds no completed rl stage to take step {step} from",
                path=run_dir,
                hint="run `portable run --output DIR` first, or pass --checkpoint PATH (a policy export folder)",
            )
        done = rec.get("step")
        if done != step:
            more = f", or train on with `portable run --resume --target-step {step}`" if step > (done or 0) else ""
            raise CheckpointError(
                f"step {step}: the run's rl export is of step {done} (only the last step is exported)",
                path=run_dir / "rl",
                hint=f"pass --checkpoint {done}{more}",
            )
        exports: dict[str, tuple[Path, int | None]] = {"grpo": (run_dir / "rl" / "export", step)}
        sft = stages.get("sft", {})
        if sft.get("status") == "complete" and (run_dir / "sft" / "export" / "policy.json").is_file():
            exports["sft"] = (run_dir / "sft" / "export", sft_step(sft.get("step"), run_dir / "sft" / "export"))
        return exports, "checkpoint"
    path = Path(text)
    if not (path / "policy.json").is_file():
        raise InputNotFoundError(
            f"checkpoint {path} is not a policy export (no policy.json)",
            path=path,
            hint="pass a run's rl/export or sft/export folder, or a step number with --output RUN",
        )
    meta = json.loads((path / "policy.json").read_text(encoding="utf-8"))
    key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:8]
    return {_label(path, meta): (path, export_step(path, meta))}, f"checkpoint_{key}"


def _label(path: Path, meta: dict[str, Any]) -> str:
    """The evidence label of the export at `path` (its policy.json `meta`): `grpo` for a GRPO-trained export
    (algorithm grpo), `sft` for a BC policy (mode bc, no algorithm: an sft export, or any recipe's BC export, which
    GRPO's sft stage also is). ConfigError (exit 4) for anything else (a RECAP recap or filtered_bc export, another
    algorithm's), which either label would misstate."""
    from reproduction.errors import ConfigError

    algorithm, mode = meta.get("algorithm"), str(meta.get("mode", "recap"))
    if algorithm == "grpo":
        return "grpo"
    if algorithm is None and mode == "bc":
        return "sft"
    what = f"algorithm {algorithm}, mode {mode}" if algorithm is not None else f"mode {mode}"
    hint = (
        f"evaluate it into a RECAP run folder: portable eval --checkpoint {path} --output RECAP_RUN"
        if algorithm in (None, "recap")
        else "pass a GRPO run's rl/export or sft/export folder"
    )
    raise ConfigError(
        f"checkpoint {path} is neither a GRPO nor a BC policy export (policy.json: {what}); a GRPO run's evidence "
        "labels only grpo (algorithm grpo) and sft (mode bc) policies",
        path=path,
        field="--checkpoint",
        hint=hint,
    )
