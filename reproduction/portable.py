"""`portable`: the one CLI. Thin commands that parse, call one library function, and print.

Also runnable as `python3 reproduction/portable.py CMD` from a bundle on a bare server Python:
this module and the control plane use only the standard library at import time (argparse rather
than typer, because a bare server has neither typer nor click before `restore`), so `--help` is
fast and `verify`/`restore` work before any runtime exists. Pipeline commands import lazily.

Errors: the library raises `PortableError`s; `main` renders them as `error: ...` and `hint: ...`
on stderr and exits with the error's code (see reproduction/errors.py). `--debug` shows tracebacks.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

if __package__ in (None, ""):
    # Run as a script (`python3 reproduction/portable.py`): make the package importable.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    __package__ = "reproduction"

from reproduction.errors import PortableError  # noqa: E402
from reproduction.ui import UiOptions, say  # noqa: E402

EXIT_CODES = """exit codes:
  0 ok    1 bug    2 usage    3 not found    4 invalid input or format version
  5 integrity (verify: 11 missing, 12 extra, 13 size mismatch, 14 digest mismatch; lowest wins;
               lineage --verify: 11 a subject or material missing, 14 its digest differs)
  6 unsafe archive    7 busy (locked)    8 write failed / disk full    9 relocation impossible
  10 missing dependency    20-29 check failure classes (see `portable check --help`)
  30-39 Hub (30 refused, 31 auth/permission, 32 not found, 33 transfer kept failing,
         34 downloaded bytes kept failing sha256, 35 conflict: branch moved or tag taken)
  40-49 dataset/sidecar    50-59 training and runs"""


def _default_bundle() -> Path:
    """The folder that holds this `reproduction/` package: a bundle when run from inside one."""
    return Path(__file__).resolve().parent.parent


def _ui(args: argparse.Namespace) -> UiOptions:
    return UiOptions(quiet=args.quiet, progress=not args.no_progress)


def _print_json(data: object) -> None:
    sys.stdout.write(json.dumps(data, indent=1) + "\n")


# -- control plane ------------------------------------------------------------------------------


def cmd_pack(args: argparse.Namespace) -> int:
    from reproduction.release.pack import pack_bundle

    manifest = pack_bundle(Path(args.spec), Path(args.out), jobs=args.jobs, ui=_ui(args))
    say(
        f"packed {manifest.name}: {len(manifest.files)} files, {len(manifest.layers)} layers -> {args.out}",
        options=_ui(args),
    )
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from reproduction.release.verify import verify_bundle

    report = verify_bundle(Path(args.bundle or _default_bundle()), jobs=args.jobs, ui=_ui(args))
    if args.json:
        _print_json(report.to_dict())
    else:
        say(report.summary(), options=_ui(args))
    return report.exit_code


def cmd_restore(args: argparse.Namespace) -> int:
    from reproduction.release.restore import restore_bundle

    report = restore_bundle(
        Path(args.bundle or _default_bundle()),
        deep=args.deep,
        refresh_source=args.refresh_source,
        jobs=args.jobs,
        ui=_ui(args),
    )
    say(report.summary(), options=_ui(args))
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from reproduction.checks.report import run_checks

    return run_checks(
        bundle=Path(args.bundle) if args.bundle else None,
        jit_smoke=args.jit_smoke,
        json_path=Path(args.json) if args.json else None,
        device=args.device,
        ui=_ui(args),
    )


def cmd_publish(args: argparse.Namespace) -> int:
    from reproduction.release.hub import publish_bundle

    result = publish_bundle(
        Path(args.bundle),
        args.repo,
        repo_type=args.repo_type,
        revision=args.revision,
        private=args.private,
        tag=args.tag,
        ui=_ui(args),
    )
    print(result.commit_sha)
    say(result.url, options=_ui(args))
    return 0


def cmd_fetch(args: argparse.Namespace) -> int:
    from reproduction.release.hub import fetch_bundle

    result = fetch_bundle(args.repo, Path(args.dir), revision=args.revision, repo_type=args.repo_type, ui=_ui(args))
    say(f"fetched {args.repo}@{result.commit_sha} -> {args.dir}", options=_ui(args))
    return 0


# -- pipeline -----------------------------------------------------------------------------------


def _not_built(what: str) -> int:
    say(f"error: `portable {what}` is not built yet in this version of recap-portable")
    return 1


def cmd_run(args: argparse.Namespace) -> int:
    return _not_built("run")


def cmd_eval(args: argparse.Namespace) -> int:
    return _not_built("eval")


def cmd_lineage(args: argparse.Namespace) -> int:
    from reproduction.run.lineage_check import lineage_chain, verify_lineage  # stdlib only

    chain = lineage_chain(Path(args.run_dir))
    report = verify_lineage(Path(args.run_dir)) if args.verify else None
    if args.json:
        _print_json({"chain": chain.to_dict(), "verify": report.to_dict() if report else None})
    else:
        print(chain.render())
    if report is not None and report.problems:
        print(report.summary(), file=sys.stderr)  # what differs is the result: shown even with -q
    elif report is not None and not args.json:
        say(report.summary(), options=_ui(args))
    return report.exit_code if report is not None else 0


def cmd_demo(args: argparse.Namespace) -> int:
    from reproduction.run.demo import run_demo

    return run_demo(Path(args.workdir) if args.workdir else None, ui=_ui(args))


# -- parser -------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-q", "--quiet", action="store_true", help="only errors and results")
    common.add_argument("--no-progress", action="store_true", help="no progress bars")
    common.add_argument("--debug", action="store_true", help="show tracebacks")

    parser = argparse.ArgumentParser(
        prog="portable",
        parents=[common],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Pack, move, restore, check and run RECAP release bundles on any Linux server.",
        epilog=EXIT_CODES,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def add(name: str, handler, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(
            name,
            parents=[common],
            help=help_text,
            description=help_text,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            epilog=EXIT_CODES,
        )
        p.set_defaults(handler=handler)
        return p

    p = add("pack", cmd_pack, "build a release bundle from a spec (bundle/*.toml)")
    p.add_argument("spec", metavar="SPEC.toml")
    p.add_argument("--out", required=True, metavar="DIR", help="bundle folder to create")
    p.add_argument("--jobs", type=int, default=None, help="compression/hash threads (default: all cores)")

    p = add("verify", cmd_verify, "hash every file of a bundle against bundle.json")
    p.add_argument("bundle", nargs="?", metavar="BUNDLE", help="default: the folder holding reproduction/")
    p.add_argument("--jobs", type=int, default=None)
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")

    p = add("restore", cmd_restore, "verify, extract and relocate a bundle's layers in place")
    p.add_argument("bundle", nargs="?", metavar="BUNDLE", help="default: the folder holding reproduction/")
    p.add_argument("--deep", action="store_true", help="rehash everything instead of trusting the receipt")
    p.add_argument("--refresh-source", action="store_true", help="re-extract source layers over local edits")
    p.add_argument("--jobs", type=int, default=None)

    p = add("check", cmd_check, "probe the accelerator, compile toolchain and known hazards")
    p.add_argument("bundle", nargs="?", metavar="BUNDLE")
    p.add_argument(
        "--jit-smoke", action="store_true", help="also compile and run a kernel (Triton on CUDA, hccl on Ascend)"
    )
    p.add_argument("--json", metavar="FILE", help="write the JSON report here ('-' for stdout)")
    p.add_argument("--device", choices=("auto", "cuda", "npu", "cpu"), default="auto")
    from reproduction.checks.probe import EXIT_HELP as CHECK_EXIT_HELP  # stdlib-only, keeps --help fast

    p.epilog = CHECK_EXIT_HELP + "\n\n" + EXIT_CODES

    p = add("publish", cmd_publish, "upload a verified bundle to a Hugging Face Hub repo")
    p.add_argument("bundle", metavar="BUNDLE")
    p.add_argument("--repo", required=True, metavar="OWNER/NAME")
    p.add_argument("--repo-type", choices=("model", "dataset"), default="model")
    p.add_argument("--revision", default=None, metavar="BRANCH")
    p.add_argument("--private", action="store_true")
    p.add_argument("--tag", default=None)

    p = add("fetch", cmd_fetch, "download a published bundle, verified file by file")
    p.add_argument("repo", metavar="OWNER/NAME")
    p.add_argument("dir", metavar="DIR")
    p.add_argument("--revision", default=None, metavar="REV")
    p.add_argument("--repo-type", choices=("model", "dataset"), default="model")

    p = add("run", cmd_run, "run the four RECAP stages (resumable)")
    p.add_argument("bundle", nargs="?", metavar="BUNDLE")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--stages", default=None)
    p.add_argument("--ray-address", default=None)

    p = add("eval", cmd_eval, "evaluate a policy checkpoint in the simulator")
    p = add("lineage", cmd_lineage, "show or verify the lineage of a run's outputs")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a folder `portable run --output` wrote")
    p.add_argument(
        "--verify", action="store_true", help="rehash every subject and material (exit 11 missing, 14 differs)"
    )
    p.add_argument("--json", action="store_true", help="print the chain (and the verification) as JSON on stdout")

    p = add("demo", cmd_demo, "the whole pipeline end to end on CPU, with no download")
    p.add_argument("--workdir", default=None, metavar="DIR", help="where to build (default: a new folder under ./runs)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help(sys.stderr)
        return 2
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        return int(args.handler(args) or 0)
    except PortableError as exc:
        if args.debug:
            raise
        print(f"error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
