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
    if args.target_step is not None and args.target_step < 1:
        raise ConfigError(f"--target-step {args.target_step} must be >= 1", field="target_step")
    run_dir = Path(args.output)
    config = load_config(_config_files(args, bundle), overrides, bundle=bundle, run_dir=run_dir)
    if args.print_config:
        sys.stdout.write(to_yaml(config))
        return 0
    report = execute(config, run_dir, args)
    print_report(report, ui=_ui(args), as_json=getattr(args, "json", False))
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
