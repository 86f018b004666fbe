"""The pipeline commands behind `portable run` / `eval` / `demo`: load the config, call the runner, print.

portable.py declares the flags and renders errors; these functions take its parsed namespace, do
one thing, and return an exit code. Data goes to stdout (`--print-config`, the summary table as
JSON with `--json`), talk to stderr.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from reproduction.errors import ConfigError, InputNotFoundError
from reproduction.ui import UiOptions, say

DEFAULT_CONFIG = "config/run.yaml"
"""A bundle's run config, used when --config is not given."""


def _ui(args: Any) -> UiOptions:
    return UiOptions(quiet=getattr(args, "quiet", False), progress=not getattr(args, "no_progress", False))


POSITIONAL = ("bundle", "run_dir", "spec", "dir", "manifest", "reference", "actual")
"""Path arguments named by their metavar (BUNDLE, RUN_DIR, ...) in errors, not as a --flag."""


def normalise_paths(args: Any, *names: str) -> None:
    """Make each named path argument of `args` absolute and resolved, once, at the CLI boundary (fsio.user_path);
    a list argument (`--config` repeated) item by item, None left as None. Everything the command derives
    from them (the run folder's stage folders, exports, evidence) is then absolute too."""
    from reproduction.fsio import user_path

    for name in names:
        value = getattr(args, name, None)
        if value is None:
            continue
        flag = name.upper() if name in POSITIONAL else "--" + name.replace("_", "-")
        if isinstance(value, list):
            setattr(args, name, [str(user_path(v, what=flag)) for v in value])
        else:
            setattr(args, name, str(user_path(value, what=flag)))


def _config_files(args: Any, bundle: Path | None) -> list[Path]:
    if args.config:
        return [Path(c) for c in args.config]
    if bundle is not None and (bundle / DEFAULT_CONFIG).is_file():
        return [bundle / DEFAULT_CONFIG]
    return []


def _split_stages(text: str | None) -> list[str] | None:
    if not text:
        return None
    return [s.strip() for s in text.split(",") if s.strip()]


def cmd_run(args: Any) -> int:
    """`portable run [BUNDLE] --output DIR [--config FILE] [--stages ...] [--resume] [key=value ...]`."""
    from reproduction.run.config import load_config, to_yaml

    overrides = list(args.overrides or [])
    if args.bundle and "=" in args.bundle and not Path(args.bundle).exists():
        overrides.insert(0, args.bundle)  # `portable run --output D key=value`: no bundle given
        args.bundle = None
    normalise_paths(args, "output", "config", "bundle")
    bundle = Path(args.bundle).resolve() if args.bundle else None
    if bundle is not None and not bundle.is_dir():
        raise InputNotFoundError(
            f"bundle {args.bundle} is not a folder",
            path=bundle,
            hint="pass a restored bundle folder (or omit it and give --config)",
        )
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise ConfigError(
            f"{bad[0]!r} is neither an option nor a key.path=value override",
            field=bad[0],
            hint="write config overrides as key.path=value (see docs/config.md)",
        )
    if bundle is not None and (Path(args.output) == bundle or bundle in Path(args.output).parents):
        from reproduction.errors import RunStateError

        raise RunStateError(
            f"--output {args.output} is inside the bundle {bundle}; a run would add files the bundle's manifest "
            "does not list (`portable verify` then reports them)",
            path=Path(args.output),
            hint="pass an --output outside the bundle folder",
        )
    if args.target_step is not None and args.target_step < 1:
        raise ConfigError(f"--target-step {args.target_step} must be >= 1", field="target_step")
    run_dir = Path(args.output)
    config = load_config(_config_files(args, bundle), overrides, bundle=bundle, run_dir=run_dir)
    if args.print_config:
        sys.stdout.write(to_yaml(config))
        return 0
    report = execute(config, run_dir, args)
    print_report(report, ui=_ui(args), as_json=getattr(args, "json", False))
    if not getattr(args, "json", False):  # the headline numbers and the verdict, last
        from reproduction.run.compare_cmd import run_results_lines

        lines = run_results_lines(run_dir)
        if lines:
            say("\n".join(lines).rstrip(), options=_ui(args))
    return 0


def execute(config: Any, run_dir: Path, args: Any) -> Any:
    """Run the RECAP recipe with the parsed options."""
    from reproduction.run.recap_recipe import RECAP
    from reproduction.run.record import make_recorder
    from reproduction.run.runner import RunOptions, run_recipe

    opts = RunOptions(
        stages=_split_stages(args.stages),
        resume=args.resume,
        restart=list(args.restart_stage or []),
        target_step=args.target_step,
        argv=list(sys.argv),
        ray_address=args.ray_address or config.ray_address,
        ui=_ui(args),
        recorder=make_recorder(Path(config.BUNDLE) if config.BUNDLE else None),
    )
    return run_recipe(RECAP, config, run_dir, opts)


def print_report(report: Any, *, ui: UiOptions, as_json: bool = False) -> None:
    """The per-stage table on stderr (or JSON on stdout)."""
    rows = report.table()
    if as_json:
        sys.stdout.write(json.dumps({"run": str(report.run_dir), "stages": rows}, indent=1) + "\n")
        return
    width = max([len(r["stage"]) for r in rows] + [5])
    lines = [f"{'stage':<{width}}  {'action':<9}  seconds"]
    lines += [f"{r['stage']:<{width}}  {r['action']:<9}  {r['seconds']:>7.2f}" for r in rows]
    lines.append(f"run folder: {report.run_dir}")
    say("\n".join(lines), options=ui)


def cmd_eval(args: Any) -> int:
    """`portable eval --checkpoint STEP|PATH --output DIR`: evaluate one policy export, write its evidence.

    With DIR a run folder, the run's resolved config is the base (overrides apply on top) and STEP
    names its recap policy's step; a PATH is a policy export folder (export/ of a policy stage).
    """
    from reproduction.run.config import load_config
    from reproduction.run.recap_policy import evaluate_exports
    from reproduction.run.runner import read_state

    normalise_paths(args, "output", "config")
    if not args.checkpoint.isdigit():
        normalise_paths(args, "checkpoint")
    run_dir = Path(args.output)
    if run_dir.exists() and not run_dir.is_dir():
        from reproduction.errors import RunStateError

        raise RunStateError(f"output {run_dir} is a file, not a folder", path=run_dir)
    state = read_state(run_dir) if run_dir.is_dir() else None
    overrides = list(args.overrides or [])
    files = [Path(c) for c in args.config or []]
    if state is not None and not files:
        files = [_state_config_file(run_dir, state)]
    config = load_config(files, overrides, run_dir=run_dir)
    exports, name = _resolve_checkpoint(args.checkpoint, run_dir, state)
    config.policy.modes = list(exports)
    shown = ", ".join(f"{mode} (step {step}, {path})" for mode, (path, step) in exports.items())
    say(f"evaluating {len(exports)} policy export(s): {shown}", options=_ui(args))
    # Its own folder and evidence name: the eval stage's recorded outputs stay as the run wrote them, and
    # each export evaluated into one --output gets its own file.
    output = evaluate_exports(config, exports, run_dir / "eval_checkpoint" / name, run_dir, name=name, ui=_ui(args))
    say(f"evidence: {run_dir / output.summary['evidence']}", options=_ui(args))
    if config.eval.reference:
        from reproduction.run.recap_policy import compare_with_reference

        evidence = run_dir / output.summary["evidence"]
        out = evidence.with_name(evidence.name.replace("eval_", "comparison_", 1))
        output.summary["comparison"] = compare_with_reference(evidence, Path(config.eval.reference), out)
        verdict = output.summary["comparison"]["verdict"]
        say(f"against the reference evidence: {verdict} ({out})", options=_ui(args))
    if getattr(args, "json", False):
        sys.stdout.write(json.dumps(output.summary, indent=1) + "\n")
    return 0


def _state_config_file(run_dir: Path, state: dict[str, Any]) -> Path:
    """The run's resolved config, written as YAML beside run.json (eval's base config)."""
    from reproduction.fsio import atomic_write_text

    path = run_dir / "eval_checkpoint" / "run_config.json"
    config = dict(state.get("config") or {})
    atomic_write_text(path, json.dumps(config, indent=1) + "\n")  # JSON is YAML
    return path


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
    meta = json.loads((path / "policy.json").read_text(encoding="utf-8"))
    mode = str(meta.get("mode", "recap"))
    key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:8]
    return {mode: (path, export_step(path, meta))}, f"checkpoint_{mode}_{key}"


def export_step(path: Path, meta: dict[str, Any]) -> int | None:
    """The step a policy export was written at: policy.json's `step` when it has one, else the step its
    training ended at (train_config.json's `max_steps`: an export is written once training reached it)."""
    if isinstance(meta.get("step"), int):
        return meta["step"]
    try:
        steps = json.loads((Path(path) / "train_config.json").read_text(encoding="utf-8")).get("max_steps")
    except (OSError, ValueError, AttributeError):
        return None
    return steps if isinstance(steps, int) else None
