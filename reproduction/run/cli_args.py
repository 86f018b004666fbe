"""The flags of the pipeline commands, declared once (stdlib only: `portable --help` imports this)."""

from __future__ import annotations

from typing import Any


def add_run_arguments(p: Any) -> None:
    """The flags of `portable run` (declared once, here)."""
    p.add_argument("bundle", nargs="?", metavar="BUNDLE", help="restored bundle (its config/run.yaml is the default)")
    # not required=True: --print-config runs nothing, so it needs no run folder (`portable run --print-config` is how
    # --help says to list the keys); portable.py refuses a missing --output otherwise, with argparse's words (exit 2)
    p.add_argument(
        "--output", default=None, metavar="DIR", help="the run folder (created; ${RUN}; required unless --print-config)"
    )
    p.add_argument("--config", action="append", metavar="FILE", help="YAML run config (repeatable, later wins)")
    p.add_argument("--stages", default=None, metavar="A,B", help="run only these stages (comma-separated)")
    p.add_argument("--resume", action="store_true", help="skip completed stages, continue killed ones")
    p.add_argument(
        "--inputs-moved",
        action="store_true",
        help=(
            "with --resume: the datasets now at other paths are the data the run used; a stage whose key differs only "
            "by where its datasets are (same fingerprints) is skipped or continued, not refused (exit 52)"
        ),
    )
    p.add_argument("--restart-stage", action="append", metavar="NAME", help="redo this stage (and what depends on it)")
    p.add_argument(
        "--target-step",
        type=int,
        default=None,
        metavar="N",
        help=(
            "train every selected training stage below step N on to step N (--stages policy: only that one); "
            "the stages after it are redone (with it, or by the next --resume)"
        ),
    )
    p.add_argument(
        "--print-config", action="store_true", help="print the resolved config as YAML (with --json: JSON) and exit"
    )
    p.add_argument("--ray-address", default=None, help="join this Ray cluster instead of starting a local one")
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="key.path=value",
        help="config overrides (keys: --print-config; docs/config.md in the repository checkout)",
    )


def missing_run_output(args: Any) -> bool:
    """Whether `portable run` was given no --output where it needs one: every run but --print-config."""
    return args.command == "run" and args.output is None and not args.print_config


def add_eval_arguments(p: Any) -> None:
    """The flags of `portable eval`."""
    p.add_argument(
        "--checkpoint", metavar="STEP|PATH", help="a step of the run's policy, or an export (required unless --plan)"
    )
    p.add_argument(
        "--output", metavar="DIR", help="the run folder (evidence goes to DIR/evidence/; required unless --plan)"
    )
    p.add_argument("--config", action="append", metavar="FILE", help="YAML config (default: the run's own)")
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="key.path=value",
        help="config overrides (eval.* and recipe=; others are refused, exit 4; --plan takes none, exit 2)",
    )
    plan = p.add_argument_group("planning (--plan: evaluate nothing, print the episodes a margin needs)")
    plan.add_argument("--plan", action="store_true", help="print episodes per side for --power at --alpha, per rate")
    plan.add_argument("--reference", metavar="FILE", help="plan for every rate of this reference evidence")
    plan.add_argument(
        "--rate", type=float, action="append", metavar="P", help="plan for this success rate (repeatable)"
    )
    add_test_arguments(plan)
    plan.add_argument("--power", type=float, default=0.8, metavar="P", help="probability of `reproduced` (default 0.8)")
    plan.add_argument(
        "--difference",
        type=float,
        default=0.0,
        metavar="D",
        help="true difference to plan for, signed: this run's rate minus the reference's (default 0); the other "
        "sign can need more episodes, and the plan prints its size too",
    )


def add_test_arguments(p: Any) -> None:
    """--margin and --alpha of the equivalence test (compare, eval --plan)."""
    p.add_argument(
        "--margin",
        type=float,
        default=None,
        metavar="M",
        help="equivalence margin on every rate, absolute (default: the reference's declared margins, else 0.05)",
    )
    p.add_argument(
        "--alpha", type=float, default=None, metavar="A", help="test level (default: the reference's, else 0.05)"
    )


def add_compare_arguments(p: Any) -> None:
    """The flags of `portable compare`."""
    p.add_argument(
        "reference",
        metavar="REFERENCE.json",
        help="reference evidence: a file, a folder holding one, a model card (*.md) or hub:OWNER/NAME[@REV]",
    )
    p.add_argument("actual", metavar="ACTUAL.json", help="the evidence to check against it")
    add_test_arguments(p)
    p.add_argument("--out", default=None, metavar="FILE", help="also write the comparison JSON to FILE")


def add_demo_arguments(p: Any) -> None:
    """The flags of `portable demo`."""
    p.add_argument(
        "--output",
        default=None,
        metavar="DIR",
        help="where to build (default ./runs/demo, --quick ./runs/demo-quick; --recipe grpo: ./runs/demo-grpo, "
        "./runs/demo-grpo-quick; --world libero: ./runs/demo-libero, ./runs/demo-libero-quick)",
    )
    p.add_argument("--workdir", default=None, metavar="DIR", help="the same as --output (its older name)")
    p.add_argument(
        "--recipe",
        default="recap",
        metavar="NAME",
        help="the recipe to demo: recap (the default: bundle, restore, check, four stages) or grpo (GRPO on Fetch push "
        "from scratch: demos, sft, rl, eval, compare)",
    )
    p.add_argument(
        "--quick", action="store_true", help="the reduced demo CI runs (bundle/demo/quick.yaml, bundle/grpo/quick.yaml)"
    )
    p.add_argument(
        "--world",
        choices=("fetch", "libero"),
        default="fetch",
        help="recap's demo world: fetch (default) or libero: LIBERO-10 task 0 on privileged state (needs the libero "
        "extra; docs/libero.md)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        metavar="N",
        help="--world libero: the training seed (value and policy); N > 0 runs in <output>/run-seedN beside run/",
    )
    p.add_argument("overrides", nargs="*", metavar="key.path=value", help="run config overrides (docs/config.md)")
