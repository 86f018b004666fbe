"""The pipeline commands behind `portable run` / `eval` / `demo`: load the config, call the runner, print.

portable.py declares the flags and renders errors; these functions take its parsed namespace, do
one thing, and return an exit code. Data goes to stdout (`--print-config`, the summary table as
JSON with `--json`), talk to stderr.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from reproduction.errors import ConfigError, InputNotFoundError, UsageError
from reproduction.ui import UiOptions, options_from_args, say, stdout_to_stderr

DEFAULT_CONFIG = "config/run.yaml"
"""A bundle's run config, used when --config is not given."""


POSITIONAL = ("bundle", "run_dir", "spec", "dir", "manifest", "reference", "actual")
"""Path arguments named by their metavar (BUNDLE, RUN_DIR, ...) in errors, not as a --flag."""


def check_hub_environment() -> None:
    """InvalidInputError (exit 4, naming the variable) for an HF_* variable huggingface_hub cannot parse when it is
    imported (`release.hub_transfer.check_hub_environment`), checked where `portable run` / `eval` / `demo` start:
    their stages import it through transformers (a tokenizer, pi05), not through `hub_import`, and an
    HF_HUB_ETAG_TIMEOUT=abc there was an unexplained ValueError mid-run (audit56 review3 T4). HF_ENDPOINT is left to
    the commands that ask the Hub: the import does not read it, and most runs never ask."""
    from reproduction.release.hub_transfer import check_hub_environment as check

    check(endpoint=False)


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


EVAL_OVERRIDE_ROOTS = ("eval", "recipe")
"""What `portable eval` overrides may set: the evaluation's own keys, and which recipe evaluates (no run folder)."""


def refuse_non_eval_overrides(overrides: list[str]) -> None:
    """ConfigError (exit 4) naming the first override `portable eval` would not use (a training stage's key, say
    `value.train.max_steps`): it evaluates an export as trained, so such a key was silently ignored (audit47 F16).
    An override without `=` is left to the config loader, which names it."""
    for text in overrides:
        key, eq, _ = text.partition("=")
        root = key.lstrip("+~").split(".")[0]
        if eq and root and root not in EVAL_OVERRIDE_ROOTS:  # no key at all: the loader says so
            raise ConfigError(
                f"`portable eval` takes only eval.* overrides (and recipe=...): {key} is not used by an evaluation",
                field=key,
                hint=f"drop {text}; to train with it, use `portable run ... {text}` (then evaluate that run)",
            )


def refuse_output_under_file(output: str) -> None:
    """InputNotFoundError (exit 3, as `pack --out` and `fetch DIR` say it) naming --output when a folder above a
    new run folder is a file: it could never be created (audit47 F14: 'cannot read a file: ... does not exist')."""
    from reproduction.fsio import nearest_existing

    path = Path(output)
    if os.path.lexists(path):
        return  # an existing --output that is a file is the run folder's business (exit 55)
    probe = nearest_existing(path.parent)
    if probe.exists() and not probe.is_dir():
        raise InputNotFoundError(
            f"--output {output} cannot be created: {probe} is a file, not a folder",
            path=output,
            hint="pass --output a folder path (new, or a run folder)",
        )


def _config_files(args: Any, bundle: Path | None) -> list[Path]:
    if args.config:
        return [Path(c) for c in args.config]
    if bundle is not None and (bundle / DEFAULT_CONFIG).is_file():
        return [bundle / DEFAULT_CONFIG]
    return []


def _warn_empty_bundle(files: list[Path], overrides: list[str]) -> None:
    """One warning line when the config refers to ${BUNDLE} and no BUNDLE was given: it resolves to "", so every
    path under it starts at / and the preflight's "does not exist" would not say why."""
    users = [str(f) for f in files if "${BUNDLE}" in f.read_text(encoding="utf-8", errors="replace")]
    users += ["the command line"] if any("${BUNDLE}" in o for o in overrides) else []
    if users:
        print(
            f"warning: no BUNDLE given, so ${{BUNDLE}} in {', '.join(users)} is empty (the paths under it start at /); "
            "pass the bundle folder: portable run BUNDLE ...",
            file=sys.stderr,
        )


def _split_stages(text: str | None) -> list[str] | None:
    """--stages as a list of names; None when it was not given (every stage). An empty list (`--stages ''`,
    `--stages ,`) is refused by `_refuse_no_stages`, not taken as every stage."""
    if text is None:
        return None
    return [s.strip() for s in text.split(",") if s.strip()]


def _refuse_no_stages(args: Any, recipe: Any) -> None:
    """ConfigError (exit 4) for a --stages that names no stage: it once ran the whole pipeline."""
    if args.stages is not None and not _split_stages(args.stages):
        names = ", ".join(s.name for s in recipe.stages)
        raise ConfigError(
            f"--stages {args.stages!r} names no stage (recipe {recipe.name}'s stages: {names})",
            field="stages",
            hint="name the stages to run, comma-separated, or leave --stages out to run every stage",
        )


def _refuse_restart_outside_stages(args: Any, recipe: Any) -> None:
    """UsageError (exit 2) for a --restart-stage that --stages leaves out: the named stage was not redone, only what
    --stages ran of those after it, and nothing said so (`--restart-stage right --stages prep` redid nothing, exit 0;
    audit58 B5). An unknown name is left to the runner, which lists the recipe's stages (exit 4)."""
    chosen = _split_stages(args.stages)
    if not chosen or not args.restart_stage:
        return
    known = {s.name for s in recipe.stages}
    outside = [n for n in args.restart_stage if n in known and n not in chosen]
    if outside:
        raise UsageError(
            f"--restart-stage {', '.join(outside)} names a stage that --stages {args.stages!r} leaves out: "
            "it would not be redone",
            hint=f"add {', '.join(outside)} to --stages, or leave --stages out to run every stage",
        )


def refuse_no_manifest(bundle: Path) -> None:
    """InputNotFoundError (exit 3, as `verify` and `restore` say it of the same folder) when the BUNDLE folder's
    bundle.json is there but no readable file (a folder, a link to nothing), or is missing from a folder that fetch or
    restore worked in (it holds `.portable/`): the run's checks of the bundle files it reads and of the restore then
    had nothing to check against, and the stages ran on whatever the folder held (audit47 F3). `fetch` writes
    bundle.json last, so an interrupted fetch leaves exactly such a folder. A folder no tool made a bundle of (a
    config/ and data written by hand) runs as before, with nothing to check it against."""
    from reproduction.release.manifest import MANIFEST_NAME, STATE_DIR

    manifest = bundle / MANIFEST_NAME
    if manifest.is_file():
        return
    if not os.path.lexists(manifest) and not (bundle / STATE_DIR).is_dir() and not _packed(bundle):
        return  # a folder of configs and data, not a packed or restored bundle: nothing to check it against
    state = "is a folder, not a file" if manifest.is_dir() else "does not exist"
    if os.path.islink(manifest) and not manifest.exists():
        state = "is a link to nothing"
    elif manifest.exists() and not manifest.is_dir():
        state = "is not a regular file (a FIFO, a socket or a device)"  # audit59 A6: it said "does not exist"
    raise InputNotFoundError(
        f"bundle {bundle} has no readable manifest: {manifest} {state}, so nothing it holds can be checked",
        path=manifest,
        hint="an interrupted `portable fetch` leaves a folder like this: run the same fetch again, then "
        f"`portable restore {bundle}`; or run with --config alone, without BUNDLE",
    )


def _packed(bundle: Path) -> bool:
    """Whether `bundle` holds what `pack` writes into every bundle besides bundle.json: the runner's own copy
    (reproduction/portable.py) or a layer's member index (`<layer>.members.json`). A packed or fetched bundle that
    no restore worked in has no `.portable/`, so with its bundle.json deleted it would otherwise run unchecked
    (audit59 H10)."""
    return (bundle / "reproduction" / "portable.py").is_file() or any(bundle.glob("*/*.members.json"))


def _cwd_bundle() -> Path | None:
    """The current folder when it is a bundle (holds bundle.json): what `portable run --output DIR` run from inside a
    restored bundle means (audit51 I2); None elsewhere."""
    from reproduction.release.manifest import MANIFEST_NAME

    here = Path.cwd()
    return here if (here / MANIFEST_NAME).is_file() else None


def _new_run(run_dir: Path) -> bool:
    """True when `run_dir` holds no run (absent, or an empty folder): what is there otherwise (a run.json to resume,
    a file, a link) is the runner's to judge, as before."""
    if not os.path.lexists(run_dir):
        return True
    return run_dir.is_dir() and not run_dir.is_symlink() and not any(run_dir.iterdir())


def cmd_run(args: Any) -> int:
    """`portable run [BUNDLE] --output DIR [--config FILE] [--stages ...] [--resume] [key=value ...]`: the recipe
    the config names (`recipe:`, absent = recap; run/resolve.py) with its config."""
    from reproduction.run.config import given_recipe, to_json, to_yaml
    from reproduction.run.recipe_source import check_recipe_source
    from reproduction.run.resolve import load_run_config
    from reproduction.run.stage_decide import config_layers

    check_hub_environment()
    overrides = list(args.overrides or [])
    if args.bundle and "=" in args.bundle and not Path(args.bundle).exists():
        overrides.insert(0, args.bundle)  # `portable run --output D key=value`: no bundle given
        args.bundle = None
    normalise_paths(args, "output", "config", "bundle")
    if args.output is not None:  # None only with --print-config (portable.py refuses it elsewhere): no run folder
        refuse_output_under_file(args.output)
    if not args.bundle and not args.config and _cwd_bundle() is not None:
        args.bundle = str(_cwd_bundle())  # standing in a restored bundle, its config is meant, not the defaults
        say(
            f"note: no BUNDLE given: running the bundle in the current folder ({args.bundle})",
            options=options_from_args(args),
        )
    bundle = Path(args.bundle).resolve() if args.bundle else None
    if bundle is not None and not bundle.is_dir():
        raise InputNotFoundError(
            f"bundle {args.bundle} {'is not a folder' if bundle.exists() else 'does not exist'}",
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
    output = Path(args.output) if args.output is not None else None
    if bundle is not None and output is not None and (output == bundle or bundle in output.parents):
        from reproduction.release.verify import RUNS_DIR

        runs = bundle / RUNS_DIR
        if runs not in Path(args.output).parents:  # BUNDLE/runs/ is the one place verify and restore leave to runs
            from reproduction.errors import RunStateError

            raise RunStateError(
                f"--output {args.output} is inside the bundle {bundle}; a run would add files the bundle's manifest "
                "does not list (`portable verify` then reports them)",
                path=Path(args.output),
                hint=f"pass an --output outside the bundle folder, or under {runs}",
            )
    if args.target_step is not None and args.target_step < 1:  # a flag's value: usage, exit 2 (audit47 F12)
        raise UsageError(
            f"--target-step {args.target_step} must be >= 1",
            field="target_step",
            hint="pass the optimizer step to train on to, e.g. --target-step 3000",
        )
    if args.ray_address is not None:
        _check_ray_address(args.ray_address, "--ray-address")  # its form now; whether it answers once all is checked
    run_dir = output  # None: --print-config alone, which leaves ${RUN} empty (a key using it is refused, exit 4)
    files = _config_files(args, bundle)
    # hashed here, as the config is read: a layer edited while a stage trains, or a pipe read once, would be
    # recorded wrongly (or block) if each stage's record re-read it when the stage completes (audit52 review R8)
    layers = config_layers(files)
    # the file the recipe will be imported from, checked against the bundle's source layer before it is imported
    ran_from = check_recipe_source(given_recipe(files, overrides), bundle)  # audit54 A1
    json_out = getattr(args, "json", False)
    with stdout_to_stderr(json_out or args.print_config):  # the recipe is imported: user code, its print() talk
        name, recipe, config = load_run_config(files, overrides, bundle=bundle, run_dir=run_dir)
    if not args.ray_address and getattr(config, "ray_address", None) is not None:
        # parsed now, joined lazily: a config (a bundle's) may carry an address the selected stages never use
        _check_ray_address(config.ray_address, "ray_address")
    if bundle is None and not files and not overrides and not args.print_config and _new_run(run_dir):
        raise UsageError(  # the built-in defaults name no dataset: the run would stop at a config never written
            "no BUNDLE and no --config: a new run has nothing to run",
            hint=f"pass the restored bundle folder (`portable run . --output {args.output}` from inside it) "
            "or --config FILE",
        )
    if bundle is None and getattr(config, "BUNDLE", None) == "":
        _warn_empty_bundle(files, overrides)
    if args.print_config:  # with --json as JSON: stdout is one JSON document then (audit47 F15)
        # both name the recipe, so --config reads either back (audit58 D4)
        sys.stdout.write(to_json(config, recipe=name) if json_out else to_yaml(config, recipe=name))
        return 0
    _refuse_no_stages(args, recipe)
    _refuse_restart_outside_stages(args, recipe)
    named = bundle or (Path(config.BUNDLE) if getattr(config, "BUNDLE", None) else None)
    if named is not None and named.is_dir():  # BUNDLE= in a --config file or an override: checked alike
        refuse_no_manifest(named)
        if bundle is None:  # its source layer is a material too: the same check, after the import (audit54 R4)
            ran_from = check_recipe_source(given_recipe(files, overrides), named.resolve()) or ran_from
    with stdout_to_stderr(json_out):  # stages and the report are user code: stdout keeps the one JSON document
        report = execute(recipe, config, run_dir, args, recipe_ref=name, config_files=layers, recipe_module=ran_from)
    print_report(report, ui=options_from_args(args), as_json=getattr(args, "json", False))
    if not getattr(args, "json", False) and report.stale:  # their results are of what came before: not shown
        say(stale_line(report.stale), options=options_from_args(args))
    elif not getattr(args, "json", False):  # the headline numbers and the verdict, last
        lines = headline_lines(recipe, run_dir)
        if lines:
            say("\n".join(lines).rstrip(), options=options_from_args(args))
    return 0


def headline_lines(recipe: Any, run_dir: Path) -> list[str]:
    """The recipe's headline of a finished run (Recipe.headline; [] when it has none). One that cannot be loaded,
    raises or returns no list of lines is one warning line on stderr (even with -q) and no headline: the run is
    complete and recorded, so its exit code stays 0 (audit47 F3: a recipe's own eval summary made it exit 1)."""
    if not recipe.headline:
        return []
    from reproduction.recipe import resolve_fn

    try:
        lines = resolve_fn(recipe.headline, what="headline", key="headline")(Path(run_dir))
        if not isinstance(lines, list) or not all(isinstance(line, str) for line in lines):
            raise TypeError(f"{recipe.headline} returned {type(lines).__name__}, not a list of lines")
    except Exception as exc:  # noqa: BLE001 - a headline never loses a finished run
        line = " ".join(str(exc).split())[:300]
        print(
            f"warning: the run is complete, but the headline of recipe {recipe.name!r} was not printed "
            f"({type(exc).__name__}: {line})",
            file=sys.stderr,
            flush=True,
        )
        return []
    return lines


def stale_line(stale: dict[str, str]) -> str:
    """The line a run prints instead of its headline while stages hold results from before an upstream stage
    changed (runner.stale_stages): after `--target-step N --stages policy` the headline would show the earlier
    policy's rates and verdict as the run's."""
    names = list(stale)
    which = ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else names[0]
    upstream = ", ".join(dict.fromkeys(stale.values()))
    return (
        f"note: {which} ran before {upstream} changed, so {'their' if len(names) > 1 else 'its'} results are not "
        "shown; `portable run ... --resume` (without --stages) redoes "
        f"{'them' if len(names) > 1 else 'it'}"
    )


def _check_ray_address(address: Any, where: str) -> None:
    """Refuse a Ray address that cannot name a cluster before the run folder or any stage output is written: an empty
    one (an unset shell variable silently meant a private local Ray, audit51 F5) and one that is not host:port (it
    failed only inside the first Ray stage, after that stage was recorded failed). `where` is the flag or config key.
    Whether it answers is checked by the runner (RunOptions.probe_ray), after the config and preflight checks and only
    when a stage to run may use Ray workers (audit55 J2, audit56 F2)."""
    from reproduction.train.ray_connect import parse_address, shown

    if where.startswith("--") and not str(address).strip():
        raise UsageError(
            f"{where} is empty",
            field="ray_address",
            hint="pass the cluster's HOST:PORT (`ray status` on the head node prints it), or leave --ray-address out "
            "to let run start a private local Ray",
        )
    try:
        parse_address(str(address))
    except ValueError as exc:
        raise ConfigError(
            f"{where} {shown(str(address))!r} is not a Ray address: {exc}",
            field="ray_address",
            hint="pass HOST:PORT (e.g. 10.0.0.5:6379, the address `ray status` prints on the head node) or `auto`",
        ) from None


def execute(
    recipe: Any,
    config: Any,
    run_dir: Path,
    args: Any,
    *,
    recipe_ref: str | None = None,
    config_files: list[list[str]] | None = None,
    recipe_module: dict[str, str] | None = None,
) -> Any:
    """Run `recipe` with the parsed options (`recipe_ref`: the name the config gave it, recorded in run.json;
    `config_files`: the --config layers as [path, sha256] pairs taken when they were read, recorded as they are in
    each stage's record; `recipe_module`: the out-of-tree recipe file imported (run/recipe_source.py), recorded in
    run.json only: the bundle's source layer, a material of every stage, is that code when it ships it)."""
    from reproduction.run.record import make_recorder
    from reproduction.run.runner import RunOptions, run_recipe

    bundle = getattr(config, "BUNDLE", None)
    opts = RunOptions(
        stages=_split_stages(args.stages),
        resume=args.resume,
        restart=list(args.restart_stage or []),
        inputs_moved=getattr(args, "inputs_moved", False),
        target_step=args.target_step,
        argv=list(sys.argv),
        ray_address=args.ray_address or getattr(config, "ray_address", None),
        probe_ray=args.ray_address is not None,  # a config's address is joined lazily, never probed (5de543f)
        ui=options_from_args(args),
        recorder=make_recorder(Path(bundle) if bundle else None),
        recipe_ref=recipe_ref,
        recipe_module=recipe_module,
        config_files=config_files,
    )
    return run_recipe(recipe, config, run_dir, opts)


def print_report(report: Any, *, ui: UiOptions, as_json: bool = False) -> None:
    """The per-stage table on stderr (or JSON on stdout: `run`, `stages`, and `stale`, each stage whose results
    predate an upstream stage's outputs mapped to that upstream stage, as the note without --json says)."""
    rows = report.table()
    if as_json:
        doc = {"run": str(report.run_dir), "stages": rows, "stale": dict(report.stale)}
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
        return
    width = max([len(r["stage"]) for r in rows] + [5])
    lines = [f"{'stage':<{width}}  {'action':<9}  seconds"]
    lines += [f"{r['stage']:<{width}}  {r['action']:<9}  {r['seconds']:>7.2f}" for r in rows]
    lines.append(f"run folder: {report.run_dir}")
    say("\n".join(lines), options=ui)


def cmd_eval(args: Any) -> int:
    """`portable eval --checkpoint STEP|PATH --output DIR`: the recipe's own evaluation command (Recipe.evaluate).

    The recipe is the run folder's (run.json) when DIR holds a run, else the one the --config files and
    overrides name (absent: recap). In a run folder it runs under the folder's lock (not beside a `portable run`)
    and refuses stage folders linked out of it. UsageError (exit 2) when the recipe has no such command.
    """
    from reproduction.errors import RunStateError, StageProtocolError
    from reproduction.recipe import resolve_fn
    from reproduction.run.config import recipe_name
    from reproduction.run.guards import refuse_links, run_lock
    from reproduction.run.resolve import resolve_recipe
    from reproduction.run.runner import read_state, recipe_ref, remove_orphaned_temps_of_run

    check_hub_environment()
    normalise_paths(args, "output", "config")
    if not args.checkpoint.isdigit():
        normalise_paths(args, "checkpoint")
    refuse_output_under_file(args.output)
    refuse_non_eval_overrides(list(args.overrides or []))
    run_dir = Path(args.output)
    if run_dir.exists() and not run_dir.is_dir():
        raise RunStateError(f"output {run_dir} is a file, not a folder", path=run_dir)

    def evaluate(state: dict[str, Any] | None) -> int:
        files = [Path(c) for c in args.config or []]
        name = recipe_ref(state) if state is not None else recipe_name(files, list(args.overrides or []))
        recipe = resolve_recipe(name)
        if not recipe.evaluate:
            raise UsageError(
                f"recipe {name!r} has no `portable eval --checkpoint` command",
                hint="its evaluation runs as a stage of `portable run` (see `portable run --print-config`)",
            )
        if state is not None:
            refuse_links(run_dir, [s.name for s in recipe.stages])
        fn = resolve_fn(recipe.evaluate, what=f"recipe {name!r}: evaluate", key="evaluate")
        _check_evaluate_signature(fn, recipe.evaluate, name)
        code = fn(args, run_dir, state, options_from_args(args))
        if code is not None and (isinstance(code, bool) or not isinstance(code, int)):
            raise StageProtocolError(
                f"recipe {name!r}: evaluate {recipe.evaluate!r} returned {code!r}, not an exit code",
                hint=EVALUATE_HINT,
            )
        return code or 0

    if not (run_dir / "run.json").is_file():
        return evaluate(None)
    with run_lock(
        run_dir, what="eval", ui=options_from_args(args)
    ):  # one writer in a run folder: not beside a `portable run`
        state = read_state(run_dir)
        if state is not None:  # a killed eval's temp file went only at the next `portable run` (audit47 kill F4)
            remove_orphaned_temps_of_run(run_dir, state, options_from_args(args))
        return evaluate(state)


EVALUATE_HINT = "write it as def cmd_eval(args, run_dir, state, ui) -> int (reproduction/recipe.py: Recipe.evaluate)"


def _check_evaluate_signature(fn: Any, ref: str, name: str) -> None:
    """StageProtocolError (exit 54) naming the recipe and `ref` when `fn` cannot be called as (args, run_dir, state,
    ui): checked before the call, so a TypeError raised inside a recipe's evaluation stays its own (audit47 F6: a
    function written to the docstring's old (args, ui) was an internal error, "a bug in recap-portable")."""
    import inspect

    from reproduction.errors import StageProtocolError

    try:
        inspect.signature(fn).bind(None, None, None, None)
    except TypeError as exc:
        why = "is not a function" if not callable(fn) else f"cannot be called as (args, run_dir, state, ui): {exc}"
        raise StageProtocolError(f"recipe {name!r}: evaluate {ref!r} {why}", hint=EVALUATE_HINT) from None
    except ValueError:  # no signature to read (a builtin): the call itself says
        pass
