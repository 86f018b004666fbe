"""`portable`: the one CLI. Thin commands that parse, call one library function, and print.

Also runnable as `python3 reproduction/portable.py CMD` from a bundle on a bare server Python:
this module and the control plane use only the standard library at import time (argparse rather
than typer, because a bare server has neither typer nor click before `restore`), so `--help` is
fast and `verify`/`restore` work before any runtime exists. Pipeline commands import lazily.

Conventions every command follows (and a new one inherits by being added with `_command`):
- Global options (`GLOBAL_OPTIONS`: -q, --no-progress, --debug, --json) are declared once and
  accepted before or after the command name (`portable -q verify B` == `portable verify B -q`).
- stdout carries data only: with `--json` one JSON document; without it, only what a command
  documents as its result (`publish` prints the commit SHA). Talk and progress go to stderr.
- Errors: the library raises `PortableError`s; `main` renders them as `error: ...` and `hint: ...`
  on stderr and exits with the error's code (see reproduction/errors.py). An unexpected exception
  is exit 1 ("a bug") with a one-line message; `--debug` shows the traceback in both cases.
- A bundle argument that does not exist is exit 3 in every command that takes one.
- Every path argument is normalised once, before the command runs (`_check_paths`: `~` expanded, absolute,
  resolved) and the command uses that form; an empty one is a usage error (exit 2), never the current folder.
- `--debug` adds the traceback and changes no exit code.
"""

from __future__ import annotations

import os
import shlex
import sys

if __name__ == "__main__" and __package__ in (None, "") and not sys.pycache_prefix:
    # Run as a file (a bundle's own runner): `verify` ignores reproduction/**/__pycache__/, so bytecode there
    # must never be what runs (a planted .pyc with the .py's mtime and size would: audit F19). A prefix makes
    # Python read and write .pyc only under it, for this process and (through the environment) its children.
    sys.pycache_prefix = os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "recap-portable", "pycache"
    )
    os.environ["PYTHONPYCACHEPREFIX"] = sys.pycache_prefix

if __name__ == "__main__" and __package__ in (None, "") and "restore" in sys.argv[1:]:
    # `python3 reproduction/portable.py restore` of an unchanged bundle is answered from the receipt and a
    # stat pass before argparse and the restore machinery load (they cost more than the stat pass).
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
    from reproduction.release.noop import try_noop_restore

    _code = try_noop_restore(sys.argv[1:], os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
    if _code is not None:
        sys.exit(_code)

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import errno  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, NoReturn  # noqa: E402

if __package__ in (None, ""):
    # Run as a script (`python3 reproduction/portable.py`): make the package importable.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    __package__ = "reproduction"

from reproduction.errors import (  # noqa: E402
    DISK_FULL_ERRNOS,
    ConfigError,
    InputNotFoundError,
    MissingDependencyError,
    PortableError,
    UsageError,
    WriteFailedError,
    errno_of,
    os_error,
    render_error,
)
from reproduction.numerics import pin_cpu_kernels  # noqa: E402
from reproduction.run.guards import forget_unhandled_interrupt, interrupt_in_chain, interrupts_noted  # noqa: E402
from reproduction.settings import check_cache_root  # noqa: E402
from reproduction.train.heap import choice as heap_choice  # noqa: E402
from reproduction.ui import options_from_args, say  # noqa: E402

EXIT_CODES = """exit codes:
  0 ok    1 bug (or a recipe's own exception: the hint names its file and line)
  2 usage (also: a command not built yet)    3 not found or unreadable (or cannot be accessed)
  4 invalid input or format version
  5 integrity (verify: 11 missing, 12 extra, 13 size mismatch, 14 digest mismatch; lowest wins;
               lineage --verify: 11 a subject or material missing, 14 its digest differs)
  6 unsafe archive    7 busy (locked)    8 write failed / disk full    9 relocation impossible
  10 missing dependency    20-29 check failure classes (see `portable check --help`)
  30-39 Hub (30 refused, 31 auth/permission, 32 not found, 33 transfer kept failing,
         34 downloaded bytes kept failing sha256, 35 conflict: branch moved or tag taken)
  weights verify: 5 bytes missing or different, 4 only fields still "to-be-pinned"
  pack --dry-run: 3 something is missing on this machine
  40-49 dataset/sidecar/simulator (40 dataset, 41 fingerprint mismatch, 45 simulator, 46 cannot render camera images)
  50-59 training and runs (50 a checkpoint incomplete or damaged, 51 a worker failed (its traceback kept),
         52 a stage's inputs changed or its steps were lowered, 53 guidance scale,
         54 a recipe's stage broke the protocol: returned no StageOutput, called sys.exit,
         55 the run folder cannot be used: wrongly shaped run.json, a linked stage folder,
            --output in the bundle (but not under its runs/),
         56 the preflight found several problems (each listed; one has its own code),
         57 bundle layers not restored: run `portable restore`, 58 Ray did not start or the cluster did not answer)
  run: 11-14 a bundle file it reads differs    7 also: another `portable run` works in the run folder
  130 interrupted (Ctrl-C, SIGTERM)
  compare: 60 differs (beyond the margin), 61 inconclusive (more episodes needed)"""


RUNTIME_INSTALL = "pip install -c constraints.txt torch==2.13.0 -e '.[sim]'"
"""How the pipeline's runtime is installed (README's quick start): what a missing one's hint names."""
CONTROL_PLANE = "verify, restore, check, compare and lineage"
"""The commands a bare Python (no runtime installed) runs."""
DEMO_MODULES = ("torch", "numpy", "pyarrow", "yaml", "omegaconf", "gymnasium", "gymnasium_robotics", "mujoco")
"""What every demo imports (the `sim` extra): looked for before the demo writes anything."""


INTERRUPT_HINTS = {
    "run": "rerun it with --resume: completed stages are kept, an interrupted one continues from its last checkpoint",
    "demo": "run the same `portable demo` again: it reuses what is done",
    "restore": "run `portable restore` again: it finishes the job",
    "fetch": "run the same `portable fetch` again: it keeps the files already verified and resumes partial ones",
    "publish": "run the same `portable publish` again: it uploads only what is missing",
    "pack": "run the same `portable pack` again: nothing half-written was kept",
    "eval": "run the same `portable eval` again: nothing half-written was kept",
}
"""The hint under `error: interrupted` (exit 130): how each command continues."""


BASE_PACKAGES = ("huggingface_hub",)
"""Base dependencies (no extra): a missing one needs the plain install, not the multi-GB runtime."""


def _install_command(extra: str | None) -> str:
    """RUNTIME_INSTALL for `extra` (None: the base install), run from anywhere: names the checkout holding this
    `reproduction/` when there is one, else says to run it from the checkout (a wheel has no checkout beside it)."""
    root = Path(__file__).resolve().parent.parent
    command = RUNTIME_INSTALL.replace("'.[sim]'", f"'.[{extra}]'" if extra else ".")
    if extra is None:
        command = command.replace(" -c constraints.txt torch==2.13.0", "")
    if (root / "pyproject.toml").is_file() and root != Path.cwd().resolve():
        return f"cd {root} && {command}"
    return command if (root / "pyproject.toml").is_file() else f"{command} (from the recap-portable checkout)"


def missing_runtime(module: str, command: str, extra: str | None = None) -> MissingDependencyError:
    """The one error for a pipeline command on an interpreter without the package `module` (exit 10, not "a bug").
    `extra`: the extra the command needs (default: `libero` for a libero module, else `sim`); a base dependency
    (BASE_PACKAGES) names the base install instead (audit60 N4)."""
    top = module.partition(".")[0]
    python = sys.executable
    message = f"`portable {command}` needs the Python package {top!r}, which this Python ({python}) does not have"
    if top in BASE_PACKAGES:
        return MissingDependencyError(
            message, hint=f"install it with `pip install {top}`, or install recap-portable: {_install_command(None)}"
        )
    extra = extra or ("libero" if top.startswith("libero") else "sim")
    return MissingDependencyError(
        message,
        hint=f"install the runtime (README's quick start): {_install_command(extra)}; "
        f"a Python without it runs only {CONTROL_PLANE}",
    )


def _require(modules: tuple[str, ...], command: str, extra: str | None = None) -> None:
    """MissingDependencyError (exit 10) naming the first of `modules` this interpreter cannot import (looked up,
    not imported), before the command writes anything."""
    import importlib.util

    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise missing_runtime(name, command, extra)


def _default_bundle() -> Path:
    """The folder that holds this `reproduction/` package: a bundle when run from inside one."""
    return Path(__file__).resolve().parent.parent


def _bundle(args: argparse.Namespace, *, default: Path | None = None) -> Path | None:
    """The command's BUNDLE argument (or `default`); InputNotFoundError (exit 3) when it does not exist,
    the same in every command (what a bundle that exists but is not one means is the command's business)."""
    given = getattr(args, "bundle", None)
    if given is None:
        return default
    path = Path(given)
    if not os.path.lexists(path):
        raise InputNotFoundError(
            f"{path} does not exist",
            path=path,
            hint="name a bundle folder (one holding bundle.json); `portable fetch OWNER/NAME DIR` downloads one",
        )
    return path


def _default_bundle_of(args: argparse.Namespace) -> Path:
    """`verify`/`restore` with no BUNDLE: the folder holding reproduction/ (`_default_bundle`). In a source checkout
    (a .git beside reproduction/, no bundle.json) that is no bundle: InputNotFoundError (exit 3) saying so, where the
    manifest loader's hint ("pack or fetch it again") would send a newcomer the wrong way."""
    default = _default_bundle()
    if getattr(args, "bundle", None) is None and (default / ".git").exists() and not (default / "bundle.json").exists():
        raise InputNotFoundError(
            f"no BUNDLE given, and the folder holding reproduction/ ({default}) is a source checkout, not a bundle "
            "(no bundle.json)",
            path=default,
            hint=f"name the bundle folder: portable {args.command} BUNDLE (one that `portable pack`, `portable fetch` "
            "or `portable demo` made)",
        )
    return default


def _positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (thread counts)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive number")
    return value


def _warn_unknown_settings(args: argparse.Namespace) -> None:
    """One warning line (stderr, not with -q) naming every PORTABLE_* variable set that nothing reads, with the
    closest known name: a misspelled knob (PORTABLE_CPU_KERNEL for PORTABLE_CPU_KERNELS) otherwise silently kept
    its default in every command but `check` (audit55 H2). A warning, not an error: a variable meant for another
    version of the tool must not stop this one."""
    from reproduction.settings import unknown_settings
    from reproduction.ui import say

    unknown = unknown_settings()
    if unknown:
        said = ", ".join(f"{name} (did you mean {near}?)" if near else name for name, near in unknown)
        say(
            f"warning: set but read by nothing, so they change nothing: {said}; fix the name or unset it "
            "(docs/settings.md lists every knob)",
            options=options_from_args(args),
        )


def _jsonable(value: object) -> object:
    """Dataclasses, paths and containers as plain JSON values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def _print_json(data: object) -> None:
    sys.stdout.write(json.dumps(_jsonable(data), indent=1) + "\n")
    sys.stdout.flush()


# -- control plane ------------------------------------------------------------------------------


def cmd_pack(args: argparse.Namespace) -> int:
    from reproduction.release.pack import pack_bundle

    root = Path(args.root) if args.root else None
    if root is not None and not root.is_dir():
        raise InputNotFoundError(
            f"--root {root} is not a folder", path=root, hint="pass the folder the spec's sources are in"
        )
    if args.dry_run:
        from reproduction.release.weights_plan import plan_pack

        plan = plan_pack(Path(args.spec), root=root)
        if args.json:
            _print_json(plan.to_dict())
        else:
            print(plan.summary())
        return plan.exit_code
    manifest = pack_bundle(Path(args.spec), Path(args.out), jobs=args.jobs, ui=options_from_args(args), root=root)
    if args.json:
        _print_json(
            {
                "name": manifest.name,
                "out": str(Path(args.out).absolute()),
                "files": len(manifest.files),
                "layers": len(manifest.layers),
                "bytes": manifest.total_size,
            }
        )
    say(
        f"packed {manifest.name}: {len(manifest.files)} files, {len(manifest.layers)} layers -> {args.out}",
        options=options_from_args(args),
    )
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from reproduction.release.verify import verify_bundle

    report = verify_bundle(_bundle(args, default=_default_bundle_of(args)), jobs=args.jobs, ui=options_from_args(args))
    if args.json:
        _print_json(report.to_dict())
    else:
        say(report.summary() + ("" if report.ok else f"\nhint: {report.hint()}"), options=options_from_args(args))
    return report.exit_code


def cmd_restore(args: argparse.Namespace) -> int:
    from reproduction.release.restore import restore_bundle

    # SIGTERM is an interrupt like Ctrl-C (exit 130, one line) through main's guard: its default action skipped
    # restore's swap-back and the cleanup of staging/ (audit F18).
    report = restore_bundle(
        _bundle(args, default=_default_bundle_of(args)),
        deep=args.deep,
        refresh_source=args.refresh_source,
        jobs=args.jobs,
        ui=options_from_args(args),
    )
    if args.json:
        _print_json(report)
    say(report.summary(), options=options_from_args(args))
    return 0


def _check_json_target(args: argparse.Namespace) -> bool | str:
    """Where check's report goes: False (nowhere), True (stdout) or a FILE. Every --json counts, before the command
    (the global flag, in args.json) and after it (check's own, collected in args.check_json): a FILE given with any
    other --json is a UsageError (exit 2) rather than one silently dropped (audit60 L3: `check --json F --json`
    left F unwritten, `portable --json check --json F` printed nothing on stdout). A FOLDER given with no BUNDLE is
    the bundle (`cmd_check`), its report on stdout, so it goes with a plain --json."""
    from reproduction.fsio import expand_home

    given = ([True] if args.json is True else []) + [g if g != "-" else True for g in getattr(args, "check_json", [])]
    files = [g for g in given if g is not True and not (args.bundle is None and g and os.path.isdir(expand_home(g)[0]))]
    folders = [g for g in given if g is not True]
    if (files and len(given) > 1) or len(folders) > 1:
        shown = " ".join("--json" if g is True else f"--json {g}" for g in given)
        raise UsageError(
            f"`{shown}` asks for the check report in more than one place: --json FILE writes it to FILE instead "
            "of stdout",
            hint=f"give --json {folders[0]} alone to write that file, or --json alone for stdout",
        )
    return folders[0] if folders else bool(given)


def cmd_check(args: argparse.Namespace) -> int:
    from reproduction.checks.report import run_checks

    target = args.json  # True, False or a FILE: `_check_json_target` combined every --json given
    if isinstance(target, str) and target != "-" and Path(target).is_dir():
        if args.bundle is not None:  # refused before the check runs, not exit 8 after it
            raise InputNotFoundError(
                f"--json {target} is a folder, not a file",
                path=target,
                hint="name the report file (e.g. --json check.json), or give --json alone for stdout",
            )
        # `check --json BUNDLE`: a report cannot be written to a folder, so the folder is the bundle
        args.bundle, target = target, True
    if isinstance(target, str) and target != "-":
        # before the probes run, not after them (audit47 F6); exit 8 as a report that cannot be written always was
        _refuse_file_above(
            target,
            flag="--json",
            hint="give --json alone for stdout",
            error=WriteFailedError,
            what="the check report to",
        )
    json_path = Path("-") if target is True else Path(target) if target else None
    return run_checks(
        bundle=_bundle(args),
        jit_smoke=args.jit_smoke,
        json_path=json_path,
        device=args.device,
        ui=options_from_args(args),
    )


def _refuse_file_above(
    target: str, *, flag: str, hint: str, error: type = InputNotFoundError, what: str | None = None
) -> None:
    """`error` (InputNotFoundError, exit 3, "a file where a folder is expected"; `check --json`: WriteFailedError,
    exit 8) naming `flag` and `target` when a folder above the file `target` is a file: the file could never be
    written there."""
    from reproduction.fsio import nearest_existing

    probe = nearest_existing(Path(target).absolute().parent)
    if probe.exists() and not probe.is_dir():
        raise error(
            f"cannot write {what or flag} {target}: {probe} is a file, not a folder",
            path=target,
            hint=f"pass {flag} a file in an existing folder (or a new one), or {hint}",
        )


def _repo_argument(repo: str, flag: str) -> str:
    """`repo` when it is OWNER/NAME; else UsageError (exit 2) naming `flag`: a bad value typed on the command line
    is a usage error like any other (audit47 F12), where the same mistake inside a manifest stays exit 4."""
    from reproduction.errors import InvalidInputError
    from reproduction.release.hub import check_repo_id
    from reproduction.release.hub_transfer import redact_shown

    try:
        return check_repo_id(repo)
    except InvalidInputError as exc:  # a pasted clone URL may carry a token: shown redacted (audit56 I3)
        raise UsageError(f"{flag} {redact_shown(repo)!r} is not OWNER/NAME", hint=exc.hint) from None


def cmd_publish(args: argparse.Namespace) -> int:
    from reproduction.release.hub import publish_bundle

    _repo_argument(args.repo, "--repo")
    result = publish_bundle(
        _bundle(args),
        args.repo,
        repo_type=args.repo_type,
        revision=args.revision,
        private=args.private,
        tag=args.tag,
        ui=options_from_args(args),
    )
    if args.json:
        _print_json(result)
    else:
        print(result.commit_sha, flush=True)
    say(result.url, options=options_from_args(args))
    return 0


def cmd_fetch(args: argparse.Namespace) -> int:
    from reproduction.release.hub import fetch_bundle

    _repo_argument(args.repo, "repo")
    result = fetch_bundle(
        args.repo, Path(args.dir), revision=args.revision, repo_type=args.repo_type, ui=options_from_args(args)
    )
    if args.json:
        _print_json(result)
    say(f"fetched {args.repo}@{result.commit_sha} -> {args.dir}", options=options_from_args(args))
    return 0


def cmd_weights(args: argparse.Namespace) -> int:
    from reproduction.release import weights, weights_hub
    from reproduction.release.weights_manifest import load_weights_manifest

    if args.weights_command == "pin":
        if args.target.endswith(".json"):  # a manifest (a Hub repo id never ends in .json here)
            manifest = weights_hub.pin_manifest(Path(args.target), ui=options_from_args(args))
            if args.json:
                _print_json(manifest.to_dict())
            say(f"pinned {len(manifest.components)} component(s) -> {args.target}", options=options_from_args(args))
            return 0
        _repo_argument(args.target, "REPO")
        manifest_path = Path(args.manifest) if args.manifest else None
        comp = weights_hub.pin_hub(
            args.target,
            revision=args.revision,
            repo_type=args.repo_type,
            globs=args.files,
            license_arg=args.license,
            existing=weights_hub.existing_component(manifest_path, args.target),
            ui=options_from_args(args),
        )
        if manifest_path is not None:
            weights_hub.pin_into(manifest_path, comp)
            say(f"updated {manifest_path}", options=options_from_args(args))
        if manifest_path is None or args.json:
            _print_json(comp.to_dict())  # the result: a component to place into a manifest
        return 0
    manifest = load_weights_manifest(Path(args.manifest))
    if args.weights_command == "fetch":
        # verified under the folder's lock: the files on disk, as they stay once the lock is released
        result, report = weights_hub.fetch_and_verify_weights(manifest, Path(args.dir), ui=options_from_args(args))
        if args.json:
            _print_json({"fetch": result, "verify": report.to_dict()})
        say(
            f"fetched {manifest.name}: {result.downloaded} downloaded, {result.built} built; {report.summary()}",
            options=options_from_args(args),
        )
        return 0
    weights_dir = Path(args.dir)
    fetch = f"`portable weights fetch {args.manifest} DIR` downloads them"
    if weights_dir.exists() and not weights_dir.is_dir():  # never a weights folder (audit47 F13)
        raise InputNotFoundError(
            f"DIR {weights_dir} is a file, not a folder", path=weights_dir, hint=f"name the weights folder; {fetch}"
        )
    report = weights.verify_weights(manifest, weights_dir)
    if not weights_dir.exists():  # still the report (it lists the unpinned fields), but said why all are missing
        print(
            f"warning: DIR {weights_dir} does not exist, so every pinned file counts as missing; {fetch}",
            file=sys.stderr,
        )
    if args.json:
        _print_json(report.to_dict())
    else:
        print(report.summary())
    return report.exit_code


# -- pipeline -----------------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    from reproduction.run.cli import cmd_run as run

    return run(args)


def _file_like(word: str) -> bool:
    """Whether a word given where an override goes reads as a file path: a folder in it, or a .json name."""
    return "/" in word or word.lower().endswith(".json")


def _refuse_json_file(args: argparse.Namespace) -> None:
    """UsageError (exit 2) for `eval ... --json FILE`: eval's --json is the global flag (the result on stdout), so
    FILE was read as a key.path=value override, refused as one (exit 4, or --plan's exit 2) and written nowhere,
    where `portable check --json FILE` writes FILE relative to the current folder (audit62 L5). The hint redirects
    stdout to the path FILE names from the current folder, made absolute."""
    # a FILE-like word only (`e.json`, `out/e`): `eval.episodes_per_task` missing its `=value` gets the override's
    # own error (review62 S L1: it was sent to stdout redirected into a file of that name)
    stray = next((o for o in args.overrides or [] if "=" not in o and _file_like(o)), None) if args.json else None
    if stray is not None:
        raise UsageError(
            f"`portable eval` writes no --json FILE: {stray!r} is no key.path=value override (eval's --json prints "
            "the result on stdout; only `portable check --json FILE` writes one)",
            hint=f"redirect stdout to write it: portable eval ... --json > "
            f"{shlex.quote(os.path.abspath(os.path.expanduser(stray)))}",
        )


def cmd_eval(args: argparse.Namespace) -> int:
    _refuse_json_file(args)
    if args.plan:
        from reproduction.run.compare_cmd import cmd_plan

        if args.overrides:  # the plan reads no config: an override would be silently ignored (audit52 W9)
            raise UsageError(
                f"--plan takes no key.path=value overrides: {args.overrides[0]}",
                hint="drop the overrides (the plan uses only --rate/--reference, --alpha, --power, --difference)",
            )

        return cmd_plan(args)
    if not args.checkpoint or not args.output:
        raise UsageError("`portable eval` needs --checkpoint and --output", hint="or --plan to plan episodes")
    from reproduction.run.cli import cmd_eval as evaluate

    return evaluate(args)  # the run folder's recipe evaluates, under the folder's lock


def cmd_compare(args: argparse.Namespace) -> int:
    from reproduction.run.compare_cmd import cmd_compare as compare

    if args.out:  # before the evidence is read: not exit 8 'File exists' naming no argument (audit47 F14)
        _refuse_file_above(args.out, flag="--out", hint="drop --out (the verdict is printed anyway)")
    return compare(args)


def cmd_lineage(args: argparse.Namespace) -> int:
    from reproduction.run.cli import normalise_paths
    from reproduction.run.lineage_check import lineage_chain, verify_lineage  # stdlib only

    normalise_paths(args, "run_dir")
    report = verify_lineage(Path(args.run_dir)) if args.verify else None
    # no statement left to chain (every one gone from complete stages): the report names them, exit 11 (audit53 V4)
    chain = lineage_chain(Path(args.run_dir)) if report is None or report.statements else None
    if args.json:
        _print_json({"chain": chain.to_dict() if chain else None, "verify": report.to_dict() if report else None})
    elif chain is not None:
        print(chain.render())
    if report is not None and report.problems:
        print(report.summary(), file=sys.stderr)  # what differs is the result: shown even with -q
    elif report is not None and not args.json:
        say(report.summary(), options=options_from_args(args))
    return report.exit_code if report is not None else 0


DEMOS = {"recap": "reproduction.recipes.recap.demo", "grpo": "reproduction.recipes.grpo.demo"}
"""`portable demo --recipe NAME`: the module whose run_demo(output, quick=, overrides=, ui=) builds that demo."""


def cmd_demo(args: argparse.Namespace) -> int:
    import importlib

    from reproduction.run.cli import check_hub_environment, normalise_paths

    check_hub_environment()
    workdir = getattr(args, "workdir", None)
    if workdir is not None and args.output is not None and workdir != args.output:
        raise UsageError(  # the alias shared --output's dest, so the last one silently won (audit53 V17)
            f"--output {args.output} and --workdir {workdir} name the demo folder twice",
            hint="give one of them (--workdir is the older name of --output)",
        )
    args.output = args.output or workdir
    recipe = getattr(args, "recipe", "recap")
    if recipe not in DEMOS:
        raise UsageError(f"--recipe {recipe!r} has no demo", hint=f"demos: {', '.join(DEMOS)}")
    libero = getattr(args, "world", "fetch") == "libero"
    if libero and recipe != "recap":
        raise UsageError(f"--world libero is a tier of the recap demo, not of {recipe!r}", hint="drop --recipe")
    # before the demo folder and its demo.json are made; the LIBERO tier's extra includes sim's (audit60 N4)
    _require(DEMO_MODULES, "demo", "libero" if libero else None)
    # the checkout's bundle/ and evidence/ (a non-editable install has none), before any work (audit60 N1)
    importlib.import_module("reproduction.recipes.recap.demo_libero" if libero else DEMOS[recipe]).check_checkout()
    normalise_paths(args, "output")
    output = Path(args.output) if args.output else None
    if libero:
        from reproduction.recipes.recap.demo_libero import run_libero_demo

        return run_libero_demo(
            output, quick=args.quick, seed=args.seed, overrides=args.overrides, ui=options_from_args(args)
        )
    if getattr(args, "seed", None) is not None:  # an option another one needs: a usage error (audit47 F12)
        raise UsageError("--seed is an option of the LIBERO tier only", hint="add --world libero, or drop --seed")
    run_demo = importlib.import_module(DEMOS[recipe]).run_demo
    return run_demo(output, quick=args.quick, overrides=args.overrides, ui=options_from_args(args))


# -- parser -------------------------------------------------------------------------------------

GLOBAL_OPTIONS: tuple[tuple[tuple[str, ...], dict[str, Any]], ...] = (
    (("-q", "--quiet"), {"action": "store_true", "help": "only errors and results"}),
    (("--no-progress",), {"action": "store_true", "help": "no progress bars"}),
    (("--debug",), {"action": "store_true", "help": "show tracebacks"}),
    (
        ("--json",),
        {"action": "store_true", "help": "print the command's result as JSON on stdout (talk stays on stderr)"},
    ),
)
"""The options every command accepts, before or after its name. Declared once: the top-level parser
gets them with real defaults, each subcommand with SUPPRESS defaults (so a flag given before the
command is not reset by the subcommand's default)."""


def _add_global_options(
    parser: argparse.ArgumentParser, *, top: bool, skip: tuple[str, ...] = (), hide: tuple[str, ...] = ()
) -> None:
    """The global options on `parser`, but those in `skip`; those in `hide` are parsed yet left out of its help (a
    --json the command refuses with its own usage error is not offered: audit51 I3)."""
    group = parser.add_argument_group("global options (also accepted before the command)")
    for flags, kwargs in GLOBAL_OPTIONS:
        if flags[-1] in skip:
            continue
        shown = {**kwargs, "help": argparse.SUPPRESS} if flags[-1] in hide else kwargs
        group.add_argument(*flags, **shown, default=False if top else argparse.SUPPRESS)


class _Parser(argparse.ArgumentParser):
    """argparse with the CLI's error shape: a usage error is `error: MESSAGE` and `hint: see PROG --help` on
    stderr, exit 2, as every other error (README "Errors"); it was argparse's usage block and `PROG: error:`
    with no hint (audit60 L4). Subcommand parsers inherit it (add_subparsers' parser_class is the parent's type)."""

    def error(self, message: str, *, prog: str | None = None) -> NoReturn:
        self.exit(2, f"error: {message}\nhint: see `{prog or self.prog} --help`\n")


def build_parser() -> argparse.ArgumentParser:
    """The CLI. A new subcommand is one `_command(...)` call plus its own arguments: it inherits the
    global options, the exit-code epilog and error rendering; `json_output=False` makes --json a usage
    error for it, and `json_option=False` lets the command declare its own --json."""
    # allow_abbrev=False everywhere: a prefix such as --input silently meant --inputs-moved, the opt-in that
    # vouches for data at new paths (audit55 H1); a flag is spelt in full or refused (exit 2)
    parser = _Parser(
        prog="portable",
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Pack, move, restore, check and run RECAP release bundles on any Linux server.",
        epilog=EXIT_CODES,
    )
    _add_global_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def _command(
        name: str,
        handler: Callable[[argparse.Namespace], int],
        help_text: str,
        *,
        json_output: bool = True,
        json_option: bool = True,
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(
            name,
            allow_abbrev=False,
            help=help_text,
            description=help_text,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            epilog=EXIT_CODES,
            conflict_handler="resolve",  # a command may redefine a global option (its own wins there)
        )
        _add_global_options(
            p, top=False, skip=() if json_option else ("--json",), hide=() if json_output else ("--json",)
        )
        p.set_defaults(handler=handler, json_output=json_output)
        return p

    p = _command(
        "pack",
        cmd_pack,
        "build a release bundle from a spec (TOML: its format is at the end of `portable pack --help`)",
    )
    from reproduction.release.spec_format import FORMAT  # stdlib only

    p.epilog = f"{FORMAT}\n\n{EXIT_CODES}"  # every install has the format; the checkout's bundle/ only the checkout
    p.add_argument("spec", metavar="SPEC.toml")
    p.add_argument("--out", required=True, metavar="DIR", help="bundle folder to create (new or empty)")
    p.add_argument(
        "--root",
        default=None,
        metavar="DIR",
        help="where the spec's relative sources start (default: the spec's `root`, relative to the spec's folder)",
    )
    p.add_argument("--jobs", type=_positive_int, default=None, help="compression/hash threads (default: all cores)")
    p.add_argument(
        "--dry-run", action="store_true", help="write nothing: list what would be included and what is missing here"
    )

    p = _command("verify", cmd_verify, "hash every file of a bundle against bundle.json")
    p.add_argument("bundle", nargs="?", metavar="BUNDLE", help="default: the folder holding reproduction/")
    p.add_argument("--jobs", type=_positive_int, default=None, help="hash threads (default: all cores)")

    p = _command("restore", cmd_restore, "verify, extract and relocate a bundle's layers in place")
    p.add_argument("bundle", nargs="?", metavar="BUNDLE", help="default: the folder holding reproduction/")
    p.add_argument(
        "--deep",
        action="store_true",
        help="rehash everything instead of trusting the receipt (a runtime target found changed is extracted "
        "again, whole: files added inside it are removed)",
    )
    p.add_argument("--refresh-source", action="store_true", help="re-extract source layers over local edits")
    p.add_argument("--jobs", type=_positive_int, default=None, help="extraction/hash threads (default: all cores)")

    p = _command("check", cmd_check, "probe the accelerator, compile toolchain and known hazards", json_option=False)
    p.add_argument("bundle", nargs="?", metavar="BUNDLE")
    p.add_argument(
        "--jit-smoke", action="store_true", help="also compile and run a kernel (Triton on CUDA, hccl on Ascend)"
    )
    p.add_argument(
        "--json",
        nargs="?",
        const=True,
        action="append",
        dest="check_json",
        default=argparse.SUPPRESS,
        metavar="FILE",
        help="the report as JSON on stdout; `--json FILE` writes it to FILE instead (kept for compatibility); "
        "given once (a FILE with another --json, before or after the command, is exit 2)",
    )
    p.add_argument("--device", choices=("auto", "cuda", "npu", "cpu"), default="auto")
    from reproduction.checks.probe import EXIT_HELP as CHECK_EXIT_HELP  # stdlib-only, keeps --help fast

    p.epilog = CHECK_EXIT_HELP + "\n\n" + EXIT_CODES

    p = _command("publish", cmd_publish, "upload a verified bundle to a Hugging Face Hub repo; prints the commit SHA")
    p.add_argument("bundle", metavar="BUNDLE")
    p.add_argument("--repo", required=True, metavar="OWNER/NAME")
    p.add_argument("--repo-type", choices=("model", "dataset"), default="model")
    p.add_argument("--revision", default=None, metavar="BRANCH")
    p.add_argument("--private", action="store_true")
    p.add_argument("--tag", default=None)

    p = _command("fetch", cmd_fetch, "download a published bundle, verified file by file")
    p.add_argument("repo", metavar="OWNER/NAME")
    p.add_argument("dir", metavar="DIR")
    p.add_argument("--revision", default=None, metavar="REV")
    p.add_argument("--repo-type", choices=("model", "dataset"), default="model")

    p = _command(
        "weights",
        cmd_weights,
        "pin, fetch and verify third-party weights (the repository checkout's weights_manifest/*.json)",
    )
    wsub = p.add_subparsers(dest="weights_command", metavar="ACTION", required=True)

    def _action(name: str, help_text: str, description: str | None = None) -> argparse.ArgumentParser:
        w = wsub.add_parser(
            name,
            allow_abbrev=False,
            help=help_text,
            description=description or help_text,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            epilog=EXIT_CODES,
        )
        _add_global_options(w, top=False)
        return w

    w = _action(
        "pin",
        "record a Hub repo's commit, file sizes and sha256 (LFS oids); no large download",
        "REPO: print a pinned component as JSON (or update it in --manifest).\n"
        "MANIFEST.json: pin every component of it in place (built ones by building).",
    )
    w.add_argument("target", metavar="REPO|MANIFEST.json")
    w.add_argument("--revision", default=None, metavar="REV", help="branch, tag or commit (default: main)")
    w.add_argument("--files", nargs="+", default=None, metavar="GLOB", help="files to pin (default: all)")
    w.add_argument("--repo-type", choices=("model", "dataset"), default=None)
    w.add_argument("--license", default=None, metavar="ID", help="license id or LICENSES/<file> (default: the card's)")
    w.add_argument("--manifest", default=None, metavar="FILE", help="update this manifest's component for REPO")
    w = _action("fetch", "download exactly the pinned files (or build built ones), hashed while written")
    w.add_argument("manifest", metavar="MANIFEST")
    w.add_argument("dir", metavar="DIR")
    w = _action("verify", "hash a folder's files against a manifest; report unpinned fields")
    w.add_argument("manifest", metavar="MANIFEST")
    w.add_argument("dir", metavar="DIR")

    from reproduction.run.cli_args import (  # stdlib only
        add_compare_arguments,
        add_demo_arguments,
        add_eval_arguments,
        add_run_arguments,
    )

    p = _command(
        "run",
        cmd_run,
        "run a recipe's stages from a bundle (the config's `recipe`: recap by default, grpo, or "
        "package.module:NAME; resumable; --print-config shows every key, docs/config.md and docs/grpo.md in the "
        "repository checkout explain them)",
    )
    add_run_arguments(p)
    p = _command("eval", cmd_eval, "evaluate a policy checkpoint in the simulator and write its evidence")
    add_eval_arguments(p)
    p = _command(
        "compare",
        cmd_compare,
        "compare two evaluation evidence files: equivalence within a margin (exit 0 reproduced, 60 differs, "
        "61 inconclusive)",
    )
    add_compare_arguments(p)
    p = _command("lineage", cmd_lineage, "show or verify the lineage of a run's outputs (--json: the chain as JSON)")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a folder `portable run --output` wrote")
    p.add_argument(
        "--verify", action="store_true", help="rehash every subject and material (exit 11 missing, 14 differs)"
    )

    p = _command(
        "demo",
        cmd_demo,
        "the whole pipeline end to end on CPU, with no download: simulator data, bundle, restore, check, "
        "four stages, evaluation, evidence (a rerun reuses what is valid); --recipe grpo: GRPO on Fetch push; "
        "runs in the repository checkout (it reads the checkout's bundle/ and evidence/)",
        json_output=False,
    )
    add_demo_arguments(p)
    return parser


def _from_os_error(exc: OSError, folder: str | None = None) -> PortableError | None:
    """A raw OSError that reached the CLI (the library should have wrapped it), through the one mapping
    (errors.os_error, op 'access': what happened decides read or write, never a guess), so the user gets one line and
    a usage-class code, not a bug. None where it is no such failure, for `main` to show as an unexpected exception
    (exit 1): one raised without an errno that names no missing file, a permission or the like (`OSError("...")`),
    and one a recipe's or other user code raised itself (docs/recipes.md: exit 1 naming its file and line; audit50
    F6), except a full disk, which is exit 8 whoever hit it. A full disk hit by a write on an open file (os.write,
    os.pwrite, os.ftruncate name no file) is said at `folder`, the folder the command writes to (_written_folder),
    with what was free there: README's exit-8 row promises the path, not "(a file)" (audit58 A4)."""
    origin = _origin(exc)
    code = errno_of(exc)
    if code in DISK_FULL_ERRNOS and exc.filename is None and folder is not None:
        named = OSError(code, exc.strerror or os.strerror(code), folder)
        where = f"{origin.hint_head()}; " if origin else ""
        hint = f"{where}free some space at {folder}, then run the command again (--debug shows which write it was)"
        return os_error(named, "a file", op="write", hint=hint)
    if code in DISK_FULL_ERRNOS and exc.filename is not None:  # where it happened is already named
        return os_error(exc, "a file", op="write")
    if code is None or (origin is not None and origin.via is None and code not in DISK_FULL_ERRNOS):
        return None
    where = f"{origin.hint_head()}; " if origin else ""
    return os_error(exc, "a file", op="access", hint=f"{where}rerun with --debug to see where it happened")


WRITTEN_ARGUMENTS = ("out", "output", "run_dir", "dir", "workdir", "bundle")
"""The path arguments a command writes under, the first one given naming where a nameless full disk was hit."""


def _written_folder(args: argparse.Namespace) -> str | None:
    """The first of WRITTEN_ARGUMENTS that `args` holds a path for (`restore BUNDLE`, `pack --out B`); None when the
    command was given none (a default bundle: the error then names no folder rather than a guessed one)."""
    for name in WRITTEN_ARGUMENTS:
        value = getattr(args, name, None)
        if isinstance(value, str) and value:
            return value
    return None


PATH_ARGUMENTS = (
    *("bundle", "spec", "out", "root", "dir", "manifest", "run_dir", "output", "workdir", "config", "checkpoint"),
    *("reference", "actual"),  # compare's evidence files (a `hub:OWNER/NAME` reference is no link: left alone)
    "json",  # check's `--json FILE` (the global --json is a flag, True/False: no path; `-` is stdout)
)
"""The attributes of the parsed arguments that hold user paths (every command's)."""


def _path_flag(args: argparse.Namespace, name: str) -> str:
    """How the user spelled the path argument `name`: BUNDLE for a positional, --output for an option (`weights
    pin --manifest` and `eval --plan --reference` are options where other commands take MANIFEST, REFERENCE)."""
    from reproduction.run.cli import POSITIONAL

    option = (name, args.command) == ("reference", "eval") or (
        name == "manifest" and getattr(args, "weights_command", None) == "pin"
    )
    return name.upper() if name in POSITIONAL and not option else "--" + name.replace("_", "-")


def _not_a_path(name: str, item: str) -> bool:
    """A value of a path argument that names no file: check's `--json -` (stdout), eval's `--checkpoint STEP`,
    compare's `hub:OWNER/NAME` evidence."""
    return (
        (name == "json" and item == "-")
        or (name == "checkpoint" and item.isdigit())
        or (name in ("reference", "actual") and item.startswith("hub:"))
    )


def _check_paths(args: argparse.Namespace) -> None:
    """Normalise every path argument once, the same way, before any command reads or writes through it: `~`
    expanded, made absolute, resolved (fsio.user_path), and the normalised form stored back in `args`, so what
    was checked is what every command uses (audit47 F5: `pack --out '~/b'` made a folder named `~`).

    Refused, naming the argument: an empty path (UsageError, exit 2: `Path('')` is the current folder, so an
    unset `--output "$OUT"` wrote wherever the user stood; audit47 F2), a symbolic-link loop, a link to nothing
    and a name too long to look up (exit 3)."""
    from reproduction.fsio import user_path_argument

    for name in PATH_ARGUMENTS:
        value = getattr(args, name, None)
        items = value if isinstance(value, list) else [value]
        if not any(isinstance(item, str) for item in items):
            continue  # not given, or the global --json flag (True/False)
        flag = _path_flag(args, name)
        normalised = []
        for item in items:
            # `run ~key.sub` may be Hydra's delete override in BUNDLE's place: only there is the hint apt
            hydra = (args.command, name) == ("run", "bundle")
            normalised.append(
                item if item and _not_a_path(name, item) else str(user_path_argument(flag, item, hydra_hint=hydra))
            )
            kind = FILE_ARGUMENTS.get((args.command, name))
            if kind and os.path.isdir(normalised[-1]):  # exit 3, as errors.py and README's --config say (F11)
                raise InputNotFoundError(
                    f"{flag} {item} is a folder, not {kind}",
                    path=normalised[-1],
                    hint=f"pass {flag} {kind} (a path that is not a folder)",
                )
        setattr(args, name, normalised if isinstance(value, list) else normalised[0])


FILE_ARGUMENTS = {("pack", "spec"): "a spec file", ("compare", "out"): "a file to write the comparison to"}
"""(command, path argument) that must name a file, not a folder: a folder there is exit 3 naming the argument, before
the command runs (`--config`, MANIFEST and `check --json FILE` say the same in their own words)."""


def main(argv: list[str] | None = None) -> int:
    """`portable ARGV`: the command's exit code. While it runs, stderr (talk) drops what it cannot write and stdout
    drops what a reader that went away (`| head`) no longer reads, so neither changes the code (audit50 F9: a run
    with `2>/dev/full`, or its stderr piped to `head`, ended 1, "a bug", after it had done its work); Python's own
    flush at exit then finds nothing left to write. Data stdout cannot take (a full disk) is exit 8 naming stdout.
    A standard stream the command was started without (`>&-`, `2>&-`) is /dev/null for it (`_occupy_closed_fds`)."""
    _occupy_closed_fds()
    out, err = sys.stdout, sys.stderr
    null = open(os.devnull, "w") if out is None or err is None else None  # noqa: SIM115 - closed in the finally
    sys.stdout = _Stream(out if out is not None else null, data=True)
    sys.stderr = _Stream(err if err is not None else null, data=False)
    try:
        code = _main(argv)
        try:
            if sys.stdout is not None:
                sys.stdout.flush()
        except PortableError as exc:  # the command's data did not all reach stdout
            code = code or render_error(exc)
    finally:
        sys.stdout, sys.stderr = out, err
        if null is not None:
            null.close()
    if argv is None and _RAY_DRIVER_ENDED:
        _exit_before_native_teardown(code)
    return code


_RAY_DRIVER_ENDED = False
"""Set by `_interrupted` run as the program when it shut down a Ray driver this process had (or was starting)."""


def _exit_before_native_teardown(code: int) -> NoReturn:
    """End the program with `code` after what Python's own exit does (join the non-daemon threads, run the atexit
    hooks: Ray's, multiprocessing's, logging's, the CLI's; flush stdout and stderr) but before the C++ exit handlers
    run. Ray's core worker registers one (CoreWorkerProcess::HandleAtExit) that tears a core worker down which an
    interrupt inside `ray.init` left unreachable from Python (ray_connect.shutdown_for_exit); its raylet and GCS died
    of the same Ctrl-C, and its IO thread then crashed in the teardown: the process died of SIGSEGV (-11) about 5 s
    after `error: interrupted`, in 5 of 5 group SIGINTs as the value inference's Ray workers started (audit64 segv)."""
    import atexit
    import threading

    shutdown = getattr(threading, "_shutdown", None)  # what the interpreter's exit does first
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _occupy_closed_fds() -> None:
    """Point a closed fd 0, 1 or 2 at /dev/null before the command opens any file: the lowest free fd goes to the next
    file opened (a run's `.lock`), which a stage's write to stdout, or a child's, then overwrote, and a stage's output
    under `--json 2>&-` reached stdout ahead of the JSON (review65 O L2)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)  # the lowest free fd: this one, unless a lower one was closed too
            if null != fd:
                os.dup2(null, fd)
                os.close(null)


class _Stream:
    """sys.stdout or sys.stderr while `main` runs: a write or flush the stream refuses is not the command's failure.
    On stderr (`data` False: talk) any refusal (EPIPE, ENOSPC, EIO, a closed file) drops this and every later line;
    on stdout a reader gone away (EPIPE) does, and any other refusal is a WriteFailedError (exit 8) naming stdout.
    The stream's file descriptor is then pointed at /dev/null, so what its buffer still holds (and Python's flush at
    exit, and child processes) write nowhere instead of failing again."""

    def __init__(self, stream: Any, *, data: bool) -> None:
        self._stream, self._data, self._lost = stream, data, False

    def write(self, text: str) -> int:
        if not self._lost:
            try:
                return self._stream.write(text)
            except (OSError, ValueError) as exc:
                self._refused(exc)
        return len(text)

    def flush(self) -> None:
        if not self._lost:
            try:
                self._stream.flush()
            except (OSError, ValueError) as exc:
                self._refused(exc)

    def _refused(self, exc: Exception) -> None:
        if isinstance(exc, UnicodeError):  # a character the stream cannot encode: ours to fix, not a lost stream
            raise exc
        self._lost = True
        _to_devnull(self._stream)
        if self._data and not isinstance(exc, BrokenPipeError) and getattr(exc, "errno", None) != errno.EPIPE:
            raise WriteFailedError(
                f"cannot write the command's output to stdout: {getattr(exc, 'strerror', None) or exc}",
                hint="send stdout where it can be written (a disk with free space, an open pipe) and run the command "
                "again",
            ) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _to_devnull(stream: Any) -> None:
    """Point `stream`'s file descriptor at /dev/null and drop what its buffer holds (nothing when it has none)."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is an OSError and a ValueError
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)
    try:
        stream.flush()
    except (OSError, ValueError):
        pass


_CONFIG_KEY = re.compile(r"[A-Za-z_]\w*(\[\d+\])*(\.[A-Za-z_]\w*(\[\d+\])*)+")
"""A dotted config key (`eval.episodes_per_task`, `datasets[0].path`): at least one dot, no slash."""


def _override_without_value(bundle: str | None) -> bool:
    """Whether `run`'s first positional is an override that lost its `=value`, not a bundle: a dotted config key
    naming nothing on disk. It was reported as "bundle ... does not exist" (exit 3) where an override missing
    its value anywhere else is exit 4 (audit53 V12). Only a key whose first part is a section of a built-in
    recipe's config counts: a missing bundle named `my_bundle.v2` stays exit 3 (audit53 review R2)."""
    if not bundle or "=" in bundle or os.path.lexists(bundle) or not _CONFIG_KEY.fullmatch(bundle):
        return False
    import dataclasses

    from reproduction.run.resolve import recipe_schema, resolve_recipe

    sections = {f.name for name in ("recap", "grpo") for f in dataclasses.fields(recipe_schema(resolve_recipe(name)))}
    return re.match(r"\w+", bundle).group() in sections  # `datasets[0].path`: datasets


def _main(argv: list[str] | None = None) -> int:
    if "restore" in (sys.argv[1:] if argv is None else argv):
        from reproduction.release.noop import try_noop_restore

        code = try_noop_restore(sys.argv[1:] if argv is None else list(argv), str(_default_bundle()))
        if code is not None:
            return code
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    from reproduction.run.cli_args import missing_run_output  # stdlib only

    if missing_run_output(args):  # before the extras, as argparse did
        parser.error("the following arguments are required: --output", prog="portable run")
    if extra:  # `run` takes key.path=value overrides anywhere after the command; nothing else is unknown
        if getattr(args, "overrides", None) is None or any(e.startswith("-") for e in extra):
            named = (args.command, getattr(args, "weights_command", None))  # the hint names the command's own help
            prog = " ".join(["portable", *(n for n in named if n)])
            parser.error(f"unrecognized arguments: {' '.join(extra)}", prog=prog)
        args.overrides += extra  # one without `=` is refused by the command as in any other place (exit 4)
    if not getattr(args, "handler", None):  # the help, then the error and hint every usage error ends with (review T4)
        parser.print_help(sys.stderr)
        hint = "hint: name one of the commands above (`portable COMMAND --help`)"
        print("error: no command given", hint, sep="\n", file=sys.stderr)
        return 2
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # Idle OpenMP threads spin 1000 rounds, not libgomp's 300000, before they sleep (issue 25). With
    # cpu_threads 2 (the demo's policy) a long spin burns the core the peer thread needs whenever anything
    # else runs: with other processes using 1-1.5 of 2 cores a step took 865-2341 ms by default, 98-144
    # ms with 1000 spins (34-91 ms with OMP_WAIT_POLICY=PASSIVE); on an idle machine 1000 spins cost
    # nothing (21-27 ms as by default) where PASSIVE doubled the step (53-60 ms). Only how idle threads
    # wait changes, not the threads or the work split: the trained bits are equal. A user's own
    # OMP_WAIT_POLICY or GOMP_SPINCOUNT wins.
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ.setdefault("GOMP_SPINCOUNT", "1000")
    arrived: list[KeyboardInterrupt] = []  # the interrupts SIGINT/SIGTERM raised while the command ran
    try:
        if args.command == "check":
            args.json = _check_json_target(args)
        if args.json and not args.json_output:
            raise UsageError(f"`portable {args.command}` has no JSON output", hint="drop --json")
        if args.command == "run" and args.bundle and "=" in args.bundle and not os.path.lexists(args.bundle):
            args.overrides.insert(0, args.bundle)  # `portable run --output D key=value`: no BUNDLE given
            args.bundle = None
        if args.command == "run" and _override_without_value(args.bundle):
            raise ConfigError(
                f"{args.bundle!r} is no folder and reads as a config key: an override missing its =value",
                field=args.bundle,
                hint=f"write it as {args.bundle}=VALUE (a BUNDLE must be an existing folder)",
            )
        _check_paths(args)
        pin_cpu_kernels()  # before any pipeline command imports torch: the same bits on every x86-64 CPU
        heap_choice()  # a bad PORTABLE_HEAP stops here, not inside a trainer after minutes of work
        check_cache_root()  # a PORTABLE_CACHE_DIR that is a file: said here, not silently run without a cache
        if args.command != "check":  # check says it in its host.settings row
            _warn_unknown_settings(args)
        # SIGTERM is Ctrl-C in every command (exit 130), not only run/restore. Run as the program (no argv), a
        # second Ctrl-C stays held through the exit that follows the first (audit51 K3); a caller passing argv
        # gets its handlers back.
        with interrupts_noted(arrived, hold_after=argv is None):
            return int(args.handler(args) or 0)
    except PortableError as exc:
        _traceback_if(args.debug)  # --debug adds the traceback; the exit code stays the error's (audit47 F9)
        origin = _origin(exc) if type(exc) is PortableError else None  # a recipe's bare PortableError: say where
        return render_error(exc, raised_at=origin.at if origin else None)
    except KeyboardInterrupt:
        return _interrupted(args, as_program=argv is None)
    except Exception as exc:
        mapped = _from_os_error(exc, _written_folder(args)) if isinstance(exc, OSError) else None
        if mapped is not None:
            _traceback_if(args.debug)
            return render_error(mapped)
        if arrived or interrupt_in_chain(exc):  # an interrupt a library turned into another error (audit47 F8)
            return _interrupted(args, as_program=argv is None)
        if args.debug:
            raise
        origin = _origin(exc)
        if isinstance(exc, ModuleNotFoundError) and exc.name and origin is None:
            if not exc.name.startswith("reproduction"):  # a package our code imports is not installed: not a bug
                return render_error(missing_runtime(exc.name, args.command))
        label = "" if origin else "internal error: "  # not ours: no "internal error" over the user's exception
        words = " ".join(str(exc).split())  # one line, as run.json records it (audit59 B4)
        print(f"error: {label}{type(exc).__name__}: {words}", file=sys.stderr)
        print(f"hint: {_blame(origin)}", file=sys.stderr)
        return 1


def _interrupted(args: argparse.Namespace, *, as_program: bool) -> int:
    """`error: interrupted` and the command's hint on how to continue (INTERRUPT_HINTS): exit 130, also when the
    interrupt passed through an evaluation a C extension ran (guards.forget_unhandled_interrupt). Run as the program,
    a Ray driver this process still has is shut down here, while further interrupts are held, not in Ray's atexit
    hook: a second Ctrl-C there broke Ray's teardown and the process died of SIGSEGV instead of exiting 130 (audit51
    K3). Called with argv (a test, an embedding), the caller's Ray session is left to the caller (audit52 R7)."""
    from reproduction.train.ray_connect import shutdown_for_exit

    forget_unhandled_interrupt()
    print("error: interrupted", file=sys.stderr)
    if args.command == "run" and getattr(args, "print_config", False):  # it starts no run: none to resume (audit56 D5)
        print("hint: run the same command again: --print-config writes nothing", file=sys.stderr)
    elif args.command in INTERRUPT_HINTS:
        print(f"hint: {INTERRUPT_HINTS[args.command]}", file=sys.stderr)
    if as_program and shutdown_for_exit():
        global _RAY_DRIVER_ENDED
        _RAY_DRIVER_ENDED = True  # main ends the process before Ray's C++ teardown (audit64 segv)
    return 130


def _traceback_if(debug: bool) -> None:
    """With --debug, print the traceback of the exception being handled on stderr (above its `error:` line)."""
    if debug:
        import traceback

        traceback.print_exc(file=sys.stderr)


@dataclasses.dataclass(frozen=True)
class _Origin:
    """Where an exception that is not recap-portable's own mistake came from (`_origin`)."""

    at: str
    """'FILE:LINE (FUNCTION)' of the user's code (a recipe's) that raised it, or passed what made ours raise it."""
    via: str | None = None
    """'FILE:LINE (FUNCTION)' of recap-portable's frame that raised it, called from `at` (a helper such as
    fsio.atomic_write_text given bytes); None when the user's code raised it itself."""
    call: bool = False
    """`at` names a user function recap-portable could not call with the arguments the protocol passes (a stage
    `def g():`), defined there."""

    def hint_head(self) -> str:
        """Where it was raised, in the words every hint under it starts with."""
        if self.call:
            return f"{self.at}, outside recap-portable, cannot be called with the arguments recap-portable passes"
        if self.via:
            return f"raised in recap-portable's {self.via}, called from {self.at}, outside recap-portable"
        return f"raised at {self.at}, outside recap-portable"


def _origin(exc: BaseException) -> _Origin | None:
    """Whose mistake `exc` is, from its traceback's frames outside the interpreter's libraries (stdlib,
    site-packages): the innermost one that is not recap-portable's own code (an out-of-tree recipe's, or other code
    of the user's) when there is one anywhere below the command, even above a frame of ours that raised (a recipe
    handing a recap-portable helper a wrong argument); a TypeError raised by our call of a user function that cannot
    take the protocol's arguments names that function; None when only our code is involved (a bug of ours)."""
    import traceback

    from reproduction.recipe import code_owner as kind

    if isinstance(exc, SyntaxError) and exc.filename and not exc.filename.startswith("<") and exc.lineno:
        if kind(exc.filename) == "user":  # its file is in the exception, not in the traceback (importlib's frames)
            return _Origin(f"{exc.filename}:{exc.lineno}")  # was "internal error" (audit65_B H1)

    frames = [
        (frame, line, kind(frame.f_code.co_filename))
        for frame, line in traceback.walk_tb(exc.__traceback__)
        if frame.f_code.co_filename and not frame.f_code.co_filename.startswith("<")
    ]
    where = [f"{f.f_code.co_filename}:{line} ({f.f_code.co_name})" for f, line, _ in frames]
    mine = [i for i, (_, _, k) in enumerate(frames) if k != "library"]
    if not mine:
        return None
    inner = mine[-1]
    if frames[inner][2] == "user":
        return _Origin(where[inner])
    users = [i for i in mine if frames[i][2] == "user"]
    if users:  # ours raised it, called (directly or not) from the user's code with what that code passed
        return _Origin(where[users[-1]], via=where[inner])
    if isinstance(exc, TypeError) and inner == len(frames) - 1:  # raised by a call in our frame, before any callee ran
        callee = _uncallable(exc, frames[inner][0], kind)
        if callee is not None:
            return _Origin(callee, call=True)
    return None


def _uncallable(exc: TypeError, frame: Any, kind: Callable[[str], str]) -> str | None:
    """'MODULE:NAME (defined at FILE:LINE)' of the user's function that `frame` (ours) called with arguments it does
    not take, as the TypeError's message names it ("g() takes 0 positional arguments but 1 was given"); None when
    the message names no function, or none of that name outside recap-portable is among the frame's variables."""
    import re

    named = re.match(r"([\w.<>]+)\(\) ", str(exc))
    if named is None:
        return None
    for value in list(frame.f_locals.values()):
        func = getattr(value, "__func__", value)  # a bound method: its function
        code = getattr(func, "__code__", None)
        if code is None or named.group(1) not in (getattr(func, "__qualname__", None), getattr(func, "__name__", None)):
            continue
        if kind(code.co_filename) == "user":
            name = f"{getattr(func, '__module__', '?')}:{func.__qualname__}"
            return f"{name} (defined at {code.co_filename}:{code.co_firstlineno})"
    return None


def _blame(origin: _Origin | None) -> str:
    """The hint under an unexpected exception: whose mistake it is (`_origin`)."""
    if origin is None:
        return "this is a bug in recap-portable; rerun with --debug for the traceback and report it"
    if origin.call:
        return f"{origin.hint_head()}: check its signature (docs/recipes.md); rerun with --debug for the traceback"
    if origin.via:
        return (
            f"{origin.hint_head()}: check what your code passes there (if it is right, this is a bug in "
            "recap-portable: report it); rerun with --debug for the traceback"
        )
    return f"{origin.hint_head()}: a recipe's or other code of yours; rerun with --debug for the traceback"


if __name__ == "__main__":
    sys.exit(main())
