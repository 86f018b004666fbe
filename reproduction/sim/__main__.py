"""`python -m reproduction.sim`: generate a data mix, or evaluate a reference policy, from the shell.

    python -m reproduction.sim generate --out DIR [--mix mix1|mix2] [--tasks T ...] [--cameras agentview,wrist|none]
                                        [--image-size 64] [--seed 0] [--workers 2] [--json]
    python -m reproduction.sim generate --out DIR --tasks libero_10/0 [--sft 48] [--rollouts 100] [--eval 20]
                                        [--cameras none] [--image-size 256] [--max-steps N] [--seed 0] [--workers 2]
    python -m reproduction.sim eval --policy expert|random [--episodes 50] [--tasks T ...] [--out DIR]
                                    [--cameras ...] [--videos 2] [--workers 2] [--json]

A LIBERO task id (one task with a scripted expert: libero_10/0, libero_spatial/0) writes <out>/sft,
<out>/rollouts_train and <out>/rollouts_eval through `reproduction.sim.libero.generate` (also runnable as
`python -m reproduction.sim.libero.generate`); `--cameras none` writes privileged state only, `agentview`,
`wrist` or both upstream's two cameras (a LIBERO env renders both); another name is refused. Talk and
progress go to stderr; `--json` prints the result on stdout. A bad task, camera or mix is one `error:` line
with a `hint:` and the error's exit code; nothing is written. An empty `--out` (an unset `$OUT`) is refused, exit 2,
as by every `portable` command, never taken as the current folder; a negative `--sft/--rollouts/--eval` is
refused before anything runs, exit 4 (a bad value, as by the LIBERO generator), for Fetch tasks too.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from reproduction.errors import PortableError, render_error
from reproduction.sim.libero.tasks import is_libero_id
from reproduction.ui import UiOptions, say


def count(text: str) -> int:
    """argparse type of generate's `--sft/--rollouts/--eval`: a whole number (not one: exit 2, usage). A negative
    one is refused before anything runs by `check_counts`, exit 4 naming the flag, as the LIBERO generator's own
    command line does, for Fetch tasks too, which do not read the counts (audit53 V16: `--tasks push --sft -1` was
    taken silently; audit56: exit 2 here and 4 there for the same value)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m reproduction.sim", description=__doc__.splitlines()[0], allow_abbrev=False
    )
    sub = ap.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    common.add_argument(
        "--tasks",
        nargs="+",
        default=["FetchPickAndPlace-v4"],
        help="env ids or short names, [:variant] (push:slippery)",
    )
    common.add_argument("--cameras", default="none", help="comma-separated cameras, or 'none' (state only)")
    common.add_argument("--image-size", type=int, default=64)
    common.add_argument("--seed", type=int, default=0)
    common.add_argument("--workers", type=int, default=1)
    common.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    common.add_argument("--no-progress", action="store_true")
    gen = sub.add_parser(
        "generate", parents=[common], allow_abbrev=False, help="write <out>/sft and <out>/rollout for a data mix"
    )
    gen.add_argument("--out", required=True)
    gen.add_argument("--mix", default="mix1")
    gen.add_argument("--sft", type=count, default=48, help="LIBERO: expert episodes run for sft (failures dropped)")
    gen.add_argument("--rollouts", type=count, default=100, help="LIBERO: mixed episodes in rollouts_train")
    gen.add_argument("--eval", type=count, default=20, help="LIBERO: mixed episodes in rollouts_eval")
    gen.add_argument("--max-steps", type=int, default=None, help="LIBERO: step limit (default: the suite's)")
    ev = sub.add_parser(
        "eval", parents=[common], allow_abbrev=False, help="evaluate the scripted expert or a random policy"
    )
    ev.add_argument("--policy", choices=("expert", "random"), default="expert")
    ev.add_argument("--episodes", type=int, default=50, help="episodes per task")
    ev.add_argument("--execute-steps", type=int, default=1)
    ev.add_argument("--videos", type=int, default=0)
    ev.add_argument("--out", default=None, help="folder for the MP4s")
    return ap


LIBERO_CAMERAS = ("agentview", "wrist")
"""The names `--cameras` takes for a LIBERO task (stored as observation.images.image / .wrist_image)."""


def _cameras(text: str) -> tuple[str, ...]:
    return () if text in ("", "none") else tuple(c.strip() for c in text.split(",") if c.strip())


def _generate_libero(args: argparse.Namespace, ui: UiOptions) -> dict:
    from reproduction.errors import ConfigError, killed_worker_hint
    from reproduction.sim.libero.generate import generate_libero_data

    if len(args.tasks) != 1 or not is_libero_id(args.tasks[0]):
        raise ConfigError(
            f"LIBERO generation takes one LIBERO task, got {' '.join(args.tasks)}",
            field="tasks",
            hint="generate each task (and Fetch data) in its own call",
        )
    cameras = _cameras(args.cameras)
    unknown = [c for c in cameras if c not in LIBERO_CAMERAS]
    if unknown:  # was silently "both cameras": a typo of `none` turned a state-only job into hours of rendering
        raise ConfigError(
            f"--cameras: {', '.join(map(repr, unknown))} is not a LIBERO camera",
            field="cameras",
            hint=f"valid: {', '.join(LIBERO_CAMERAS)} (a LIBERO env renders both), or none (state only)",
        )
    results = generate_libero_data(
        Path(args.out),
        task=args.tasks[0],
        sft=args.sft,
        rollouts=args.rollouts,
        eval_rollouts=args.eval,
        seed=args.seed,
        workers=args.workers,
        ui=ui,
        cameras=bool(cameras),
        image_size=args.image_size,
        max_steps=args.max_steps,
        killed_hint=killed_worker_hint("--workers", resume=False),
    )
    for kind, r in results.items():
        say(
            f"{kind}: {r.episodes_written}/{r.episodes_run} episodes written, success {r.success_rate:.2f}, "
            f"{r.seconds:.1f} s ({r.episodes_per_s:.2f} episodes/s, {r.steps_per_s:.1f} steps/s) -> {r.path}"
        )
    return {kind: r.to_dict() for kind, r in results.items()}


def _generate_mix(args: argparse.Namespace, ui: UiOptions) -> dict:
    """The Fetch mix: <out>/sft, then <out>/rollout. A killed pool worker's hint names --workers=1, and, when the sft
    set was written whole before the rollout set's worker died, says to delete it first: a rerun refuses a set that
    exists (the same command would fail on it)."""
    from reproduction.errors import WorkerFailedError, killed_worker_hint
    from reproduction.sim.generate import generate_mix

    sft = Path(args.out) / "sft"
    existed = sft.exists()
    try:
        return generate_mix(
            args.mix,
            Path(args.out),
            tasks=tuple(args.tasks),
            seed=args.seed,
            workers=args.workers,
            ui=ui,
            cameras=_cameras(args.cameras),
            image_size=args.image_size,
            killed_hint=killed_worker_hint("--workers", resume=False),
        )
    except WorkerFailedError as exc:
        if not existed and sft.is_dir():
            first = f"delete {sft} (written whole before the worker died; a rerun refuses a set that exists)"
            exc.hint = killed_worker_hint("--workers", resume=False, first=first)
        raise


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: 0 when done, the error's exit code (one line) on bad input, 130 on Ctrl-C or SIGTERM
    (`timeout`'s kill ended the process without shutting down its spawn pool; audit55 E1)."""
    from reproduction.sim.workers import sigterm_as_interrupt

    with sigterm_as_interrupt():  # around the except too: a later signal is held while this answers the first
        try:
            return _main(argv)
        except KeyboardInterrupt:  # the sets are written whole (write_dataset's staging folder): none is half there
            print("error: interrupted", file=sys.stderr)
            return 130


def _main(argv: Sequence[str] | None) -> int:
    args = _parser().parse_args(argv)
    ui = UiOptions(progress=not args.no_progress)
    try:
        if args.out is not None:  # `--out ""` (an unset $OUT) wrote into the current folder (audit53 V15)
            from reproduction.fsio import user_path_argument

            args.out = str(user_path_argument("--out", args.out))
        if args.command == "generate":
            from reproduction.sim.libero.generate import check_counts

            check_counts(sft=args.sft, rollouts=args.rollouts, eval_rollouts=args.eval)
        if args.command == "generate" and any(is_libero_id(t) for t in args.tasks):
            doc = _generate_libero(args, ui)
        elif args.command == "generate":
            results = _generate_mix(args, ui)
            doc = {kind: r.to_dict() for kind, r in results.items()}
            for kind, r in results.items():
                say(
                    f"{kind}: {r.episodes} episodes, success {r.success_rate:.2f}, "
                    f"{r.seconds:.1f} s ({r.episodes_per_s:.1f} episodes/s) -> {r.path}"
                )
        else:
            from reproduction.errors import killed_worker_hint
            from reproduction.sim.evaluate import EvalConfig, evaluate
            from reproduction.sim.policies import ExpertPolicy, RandomPolicy

            factory = ExpertPolicy if args.policy == "expert" else functools.partial(RandomPolicy, seed=args.seed)
            config = EvalConfig(
                tasks=tuple(args.tasks),
                episodes_per_task=args.episodes,
                seed=args.seed,
                execute_steps=args.execute_steps,
                videos=args.videos if args.out else 0,
                workers=args.workers,
                cameras=_cameras(args.cameras),
                image_size=args.image_size,
            )
            result = evaluate(
                factory, config, args.out, ui=ui, killed_hint=killed_worker_hint("--workers", resume=False)
            )
            doc = result.to_dict()
            doc.pop("per_episode")
            for task, summary in doc["tasks"].items():
                say(f"{task}: success at end {summary['success_at_end']}, once {summary['success_once']}")
    except PortableError as exc:
        return render_error(exc)
    if args.json:
        print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
