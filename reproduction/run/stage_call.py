"""Calling a stage's function and holding what it returns to the stage protocol (reproduction/recipe.py): a
StageOutput whose summary run.json can hold, whose step, resumed_from and world_size are integers of the right
range, a resumed_from_path inside the run with a resumed_from_sha256 of 64 lowercase hex (or None), and no
sys.exit. Every refusal is a StageProtocolError (exit 54) naming the stage and its function."""

from __future__ import annotations

import importlib
import inspect
import json
import math
import numbers
import os
import types
from pathlib import Path
from typing import Any

from reproduction.digests import is_sha256
from reproduction.errors import PortableError, StageProtocolError
from reproduction.recipe import StageContext, StageOutput, StageSpec, resolve_fn


def call_stage(spec: StageSpec, ctx: StageContext, *, recipe: str | None = None) -> StageOutput:
    """spec.fn(ctx), held to the stage protocol: StageProtocolError (exit 54) when it returns anything but a
    StageOutput whose summary is a JSON-able dict (numpy scalars in it become Python numbers), whose world_size is an
    integer >= 1, whose step and resumed_from are integers >= 0 or None (numpy integers become ints), whose
    resumed_from_path is None or a path inside the run (recorded as a Path) and resumed_from_sha256 None or 64
    lowercase hex given with that path, or calls sys.exit (which would otherwise end `portable run` with the stage's
    chosen exit code, 0 included, and the stage half-recorded). `recipe`: its name, which the step and world-size
    refusals name first (a recipe's stage name alone may be any recipe's `train`)."""
    module_dependency(spec, recipe)
    fn = resolve_fn(
        spec.fn,
        what=f"stage {spec.name}'s function",
        key=f"stages.{spec.name}.fn",
        hint="fix the spelling of the StageSpec's fn ('module:function')",
    )
    why = signature_problem(fn)
    if why:  # fn_problems found it before anything ran, unless its def could not be read unimported (decorated)
        raise uncallable_error(recipe, spec, why)
    try:
        output = fn(ctx)
    except SystemExit as exc:
        raise StageProtocolError(
            f"stage {spec.name} ({spec.fn}) called sys.exit({exc.code!r}){_raised_at(exc)}",
            stage=spec.name,
            hint="a stage reports a failure by raising an exception; the run is recorded failed, --resume reruns it",
        ) from None
    except PortableError as exc:  # raised by the stage itself, not by this check: the CLI's hint names the stage
        exc.raised_in_stage = spec.name  # (errors.render_error, audit59 B4)
        raise
    if not isinstance(output, StageOutput):
        raise StageProtocolError(
            f"stage {spec.name} ({spec.fn}) returned {type(output).__name__}, not a StageOutput",
            stage=spec.name,
            hint="return reproduction.recipe.StageOutput(files=[...], summary={...}) from the stage function",
        )
    if not isinstance(output.summary, dict) or not isinstance(output.files, (list, tuple)):
        wrong = "summary" if not isinstance(output.summary, dict) else "files"
        raise StageProtocolError(
            f"stage {spec.name} ({spec.fn}) returned a StageOutput whose {wrong} is a "
            f"{type(getattr(output, wrong)).__name__}",
            stage=spec.name,
            hint="files: a list of the paths it wrote; summary: a dict of JSON values",
        )
    try:
        summary = _json_values(output.summary, "summary")
        json.dumps(summary, sort_keys=True)
    except (TypeError, ValueError, RecursionError) as exc:  # a non-string key, a cycle: run.json could not record it
        raise StageProtocolError(
            f"stage {spec.name} ({spec.fn}) returned a summary run.json cannot hold: {exc}",
            stage=spec.name,
            hint="give the summary string keys and JSON values (numbers, strings, booleans, None, lists, dicts; "
            "a numpy number is recorded as the Python number it holds)",
        ) from None
    output.summary = finite_json(summary)
    who = f"recipe {recipe}: " if recipe else ""
    output.world_size, output.device = _placement(spec, output, who)
    output.step, output.resumed_from = _step(spec, output, "step", who), _step(spec, output, "resumed_from", who)
    output.resumed_from_path, output.resumed_from_sha256 = _resumed_checkpoint(spec, output, ctx.run_dir, who)
    return output


def module_dependency(spec: StageSpec, recipe: str | None = None) -> None:
    """Import the module of a stage's function; MissingDependencyError (exit 10, the package named, an install hint)
    when a module it imports is not installed, or a ConfigError for a misspelt submodule of a package that is there,
    as for a recipe module (run/resolve.py). Returns quietly when the import succeeds or the module named in fn is
    itself the one not found (the caller's spelling hint then applies). Until audit54 A7 a missing dependency was
    exit 4 "fix the spelling of the StageSpec's fn"."""
    from reproduction.run.resolve import import_problem

    module = spec.fn.partition(":")[0]
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        who = (f"recipe {recipe}: " if recipe else "") + f"stage {spec.name}'s module {module!r}"
        problem = import_problem(module, exc, who, field=f"stages.{spec.name}.fn")
        if problem is not None:
            raise problem from None
    except (ImportError, ValueError):  # an empty or relative name: resolve_fn names it, with the spelling hint
        pass


ASYNC_STAGE = "it is an async def, which the runner would call without awaiting"
STAGE_FN_HINT = "write it as def NAME(ctx: StageContext) -> StageOutput (reproduction/recipe.py: StageSpec.fn)"


def signature_problem(fn: Any) -> str | None:
    """Why `fn` cannot be called as fn(ctx), the stage protocol (None when it can, or has no signature to read): an
    async def (its coroutine was never awaited, a RuntimeWarning beside exit 54), or a signature that does not bind
    one positional argument (inspect's words: "too many positional arguments", "missing a required argument: 'x'")."""
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        return ASYNC_STAGE
    if inspect.isgeneratorfunction(fn):
        return "it is a generator function (it yields), which returns a generator, not a StageOutput"
    if type(fn) is types.FunctionType and not hasattr(fn, "__wrapped__"):  # read from its code: ~1 us, not ~30
        return _plain_function_problem(fn)
    try:
        inspect.signature(fn).bind(None)
    except TypeError as exc:
        return str(exc)
    except ValueError:  # no signature to read (a builtin): the call itself says
        return None
    return None


def _plain_function_problem(fn: types.FunctionType) -> str | None:
    """signature_problem of a plain function, read from its code object in inspect's words."""
    code = fn.__code__
    positional = code.co_varnames[: code.co_argcount]
    if not positional and not code.co_flags & inspect.CO_VARARGS:
        return "too many positional arguments"
    required = list(positional[1 : code.co_argcount - len(fn.__defaults__ or ())])
    kwonly = code.co_varnames[code.co_argcount : code.co_argcount + code.co_kwonlyargcount]
    required += [k for k in kwonly if k not in (fn.__kwdefaults__ or {})]
    return f"missing a required argument: {required[0]!r}" if required else None


def uncallable_error(recipe: str | None, spec: StageSpec, why: str) -> StageProtocolError:
    """The StageProtocolError (exit 54) for a stage function that cannot be called as fn(ctx), as Recipe.evaluate's
    check words it (run/cli.py): until audit50_B the call's TypeError was "internal error ... a bug in
    recap-portable" (exit 1), after the stages before it had run."""
    who = f"recipe {recipe}: " if recipe else ""
    return StageProtocolError(
        f"{who}stage {spec.name}'s function {spec.fn!r} cannot be called as fn(ctx): {why}",
        stage=spec.name,
        hint=STAGE_FN_HINT,
    )


def _json_values(value: Any, where: str) -> Any:
    """`value` with each numpy scalar as the Python value it holds (numpy.int64(3) -> 3, numpy.float32(0.5) -> 0.5,
    numpy.bool_ -> bool); TypeError naming `where` (summary['key'][0]...) and the value for anything else JSON cannot
    hold (bytes, a set, an object, a dict key that is no str): `json.dumps(default=str)` once wrote these as their
    str(), so numbers became strings and an object's repr, which differs from run to run, was recorded."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, dict):
        for k in value:  # run.json would write 1 as "1" (a reader gets another dict) and refuse a tuple
            if not isinstance(k, str):
                raise TypeError(f"{where} key {k!r:.60} is {type(k).__name__}, not a string")
        return {k: _json_values(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_json_values(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return type(value)(items) if type(value) in (list, tuple) else items
    if type(value).__module__ == "numpy" and callable(getattr(value, "item", None)) and getattr(value, "ndim", 1) == 0:
        return _json_values(value.item(), where)
    raise TypeError(f"{where} is {type(value).__name__} {value!r:.60}, not a JSON value")


def _step(spec: StageSpec, output: StageOutput, name: str, who: str = "") -> int | None:
    """StageOutput's `step` or `resumed_from` (`name`) as run.json records it: None, or an integer >= 0 (a numpy
    integer becomes an int); StageProtocolError (exit 54) for anything else (a float, a bool, a string, a negative
    number), its message opening with `who` ("recipe NAME: "). Unchecked, numpy.int64(5) was recorded as the string
    "5", which every later read of run.json refused (exit 55), so the run could not be resumed at all."""
    value = getattr(output, name)
    if value is None or (isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= 0):
        return None if value is None else int(value)
    what = "the step the stage reached" if name == "step" else "the step it continued from, or None"
    raise StageProtocolError(
        f"{who}stage {spec.name} ({spec.fn}) returned a StageOutput whose {name} is {type(value).__name__} "
        f"{value!r:.60}, expected an integer >= 0 or None",
        stage=spec.name,
        hint=f"{name}: {what}, as an int (e.g. int({name}))",
    )


def _resumed_checkpoint(
    spec: StageSpec, output: StageOutput, run_dir: Path, who: str = ""
) -> tuple[Path | None, str | None]:
    """StageOutput's `resumed_from_path` (None, or a path, str or os.PathLike, inside the run folder: the checkpoint
    the stage loaded, `<stage>/checkpoints/step_N`) and `resumed_from_sha256` (None, or a sha256 as 64 lowercase hex
    digits, given only with a path) as run.json and the statement record them; StageProtocolError (exit 54) naming
    the field and the value otherwise. Unchecked, a digest such as "SHA256:..." completed the stage, went into the
    statement, and every later read of run.json refused it (exit 55): the run could not be resumed (audit53 R3)."""
    path, sha = output.resumed_from_path, output.resumed_from_sha256

    def refuse(field: str, value: Any, why: str, hint: str) -> StageProtocolError:
        return StageProtocolError(
            f"{who}stage {spec.name} ({spec.fn}) returned a StageOutput whose {field} is {type(value).__name__} "
            f"{value!r:.80}, {why}",
            stage=spec.name,
            hint=hint,
        )

    path_hint = "resumed_from_path: the checkpoint folder the stage loaded (<stage>/checkpoints/step_N), or None"
    if path is not None:
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            raise refuse("resumed_from_path", path, "expected a path or None", path_hint)
        path = Path(os.fspath(path))
        absolute, base = Path(os.path.abspath(path)), Path(os.path.abspath(run_dir))
        if base not in absolute.parents:
            raise refuse("resumed_from_path", str(path), f"not inside the run folder {base}", path_hint)
    if sha is None:
        return path, None
    if not is_sha256(sha):
        raise refuse(
            "resumed_from_sha256",
            sha,
            "expected a sha256 (64 lowercase hex digits) or None",
            "resumed_from_sha256: the checkpoint's tree digest as the trainer loaded it "
            "(reproduction.run.lineage.tree_sha256(folder)), or None to have it hashed when the statement is written",
        )
    if path is None:
        raise refuse(
            "resumed_from_sha256",
            sha,
            "but its resumed_from_path is None: a digest needs the checkpoint it is of",
            "give resumed_from_path too (the folder the digest is of), or leave resumed_from_sha256 None",
        )
    return path, sha


def _placement(spec: StageSpec, output: StageOutput, who: str = "") -> tuple[int, str | None]:
    """The StageOutput's world size (an integer >= 1: a numpy integer becomes an int) and device (None, or a string:
    a torch.device becomes its str(), as the statement writes it), so run.json and the statement record the same
    values; StageProtocolError (exit 54) for a world size that is no integer >= 1 (a float, a bool, a string), its
    message opening with `who`."""
    ws = output.world_size
    if not isinstance(ws, numbers.Integral) or isinstance(ws, bool) or int(ws) < 1:
        raise StageProtocolError(
            f"{who}stage {spec.name} ({spec.fn}) returned a StageOutput whose world_size is {type(ws).__name__} "
            f"{ws!r:.60}, expected an integer >= 1",
            stage=spec.name,
            hint="world_size: the number of processes the stage ran on (1 for one), e.g. dist.get_world_size()",
        )
    device = output.device
    return int(ws), device if device is None or isinstance(device, str) else str(device)


def finite_json(obj: Any) -> Any:
    """`obj` with every NaN or infinite float as its string ("nan", "inf", "-inf"): Python writes them as the bare
    words NaN and Infinity, which strict JSON readers (jq, a browser, most languages) refuse, so a diverged loss in
    a summary would make run.json and the lineage statement unreadable outside Python."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else str(obj)
    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(finite_json(v) for v in obj) if type(obj) in (list, tuple) else [finite_json(v) for v in obj]
    return obj


def _raised_at(exc: BaseException) -> str:
    """' at FILE:LINE' of the innermost frame of `exc`'s traceback ('' when it has none)."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    return f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
