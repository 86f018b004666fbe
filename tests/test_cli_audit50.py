"""An out-of-tree recipe's mistakes and a broken stderr, met by the CLI (audit50_B): each mistake of the recipe's is
named as the recipe's (its file and line, its field), never "a bug in recap-portable", and its exit code is the
documented one (F4, F5, F6, F10); a stderr or stdout that cannot be written never changes the command's exit code
(F9). A toy recipe through `portable.main`, in-process; fast."""

from __future__ import annotations

import dataclasses
import errno
import io
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from reproduction import portable
from reproduction.errors import BARE_HINT, ConfigError, PortableError
from reproduction.recipe import Recipe, StageContext, StageOutput, StageSpec

SCRIPT = Path(portable.__file__)


@dataclass(kw_only=True)
class Toy:
    mode: str = "ok"


@dataclass(kw_only=True)
class ToyConfig:
    toy: Toy = field(default_factory=Toy)


def stage(ctx: StageContext) -> StageOutput:
    """Does what `toy.mode` says (each a mistake a recipe's own code can make)."""
    from reproduction.fsio import atomic_write_text

    out = ctx.out_dir / "o.txt"
    mode = ctx.config.toy.mode
    if mode == "helper_bytes":
        atomic_write_text(out, b"bytes, not text")  # a recap-portable helper handed the wrong type
    if mode == "raise_fnf":
        raise FileNotFoundError("weights missing")  # no errno: the recipe's own words
    if mode == "raise_perm":
        raise PermissionError(errno.EACCES, "Permission denied")
    if mode == "open_missing":
        open(ctx.run_dir / "nosuch" / "w.json").read()  # noqa: SIM115 - a recipe's read, as it might be written
    if mode == "disk_full":
        raise OSError(errno.ENOSPC, "No space left on device", str(out))
    if mode == "bare":
        raise PortableError("recipe says no")
    out.write_text("o\n")
    return StageOutput(files=[out], summary={})


def no_args() -> StageOutput:  # a stage function that takes no StageContext
    raise AssertionError("never called")


def preflight_one(config, run_dir, opened, names):
    return ["only problem"]


def preflight_one_error(config, run_dir, opened, names):
    return [ConfigError("toy.mode: not a mode")]


def preflight_two(config, run_dir, opened, names):
    return ["problem one", ConfigError("problem two")]


def preflight_no_args():
    return []


class Thing:
    pass


@dataclass(kw_only=True)
class SetConfig:
    toy: Toy = field(default_factory=Toy)
    tags: set = field(default_factory=set)


@dataclass(kw_only=True)
class Inner:
    thing: Thing | None = None


@dataclass(kw_only=True)
class NestedThingConfig:
    inner: Inner = field(default_factory=Inner)


@dataclass(kw_only=True)
class BundleConfig:
    BUNDLE: str = ""
    data: str = "x"


@dataclass(kw_only=True)
class PlainConfig:
    data: str = "x"


RECIPE = Recipe(
    name="toy50",
    config_schema=f"{__name__}:ToyConfig",
    stages=(StageSpec(name="a", fn=f"{__name__}:stage", config=("toy",), inputs=False),),
)
NO_ARGS = dataclasses.replace(RECIPE, stages=(StageSpec(name="a", fn=f"{__name__}:no_args", inputs=False),))
PREFLIGHT_ONE = dataclasses.replace(RECIPE, preflight=f"{__name__}:preflight_one")
PREFLIGHT_ONE_ERROR = dataclasses.replace(RECIPE, preflight=f"{__name__}:preflight_one_error")
PREFLIGHT_TWO = dataclasses.replace(RECIPE, preflight=f"{__name__}:preflight_two")
PREFLIGHT_NO_ARGS = dataclasses.replace(RECIPE, preflight=f"{__name__}:preflight_no_args")
SET_FIELD = dataclasses.replace(RECIPE, config_schema=f"{__name__}:SetConfig")
NESTED_THING = dataclasses.replace(RECIPE, config_schema=f"{__name__}:NestedThingConfig")
WITH_BUNDLE = dataclasses.replace(RECIPE, config_schema=f"{__name__}:BundleConfig")
PLAIN = dataclasses.replace(RECIPE, config_schema=f"{__name__}:PlainConfig")


@pytest.fixture
def cli(tmp_path, capsys):
    """portable(*args, recipe=NAME, yaml=TEXT) -> (exit code, stderr lines); in-process, a config naming the recipe
    attribute of this module (and TEXT after it)."""

    def run(*args: str, recipe: str = "RECIPE", yaml: str = "") -> tuple[int, list[str]]:
        config = tmp_path / "run.yaml"
        config.write_text(f"recipe: {__name__}:{recipe}\n{yaml}")
        capsys.readouterr()
        code = portable.main([args[0], "--config", str(config), *args[1:]])
        return code, capsys.readouterr().err.splitlines()

    return run


def _line_of(text: str, fn: object = stage) -> int:
    """The line of this file, within `fn`'s source, that holds `text` (once)."""
    import inspect

    lines, start = inspect.getsourcelines(fn)
    (number,) = [start + i for i, line in enumerate(lines) if text in line]
    return number


# -- F4: whose mistake ------------------------------------------------------------------------------------------


def test_a_recipe_handing_a_helper_a_wrong_argument_is_named_with_its_line_not_called_a_bug(tmp_path, cli):
    """atomic_write_text(p, b"bytes") raised inside reproduction/fsio.py, so the innermost frame outside the libraries
    was recap-portable's: "internal error ... this is a bug in recap-portable" (exit 1)."""
    code, err = cli("run", "--output", str(tmp_path / "r"), "--no-progress", "toy.mode=helper_bytes")
    assert code == 1, err
    assert err[-2] == "error: AttributeError: 'bytes' object has no attribute 'encode'"
    line = _line_of("atomic_write_text(out, b")
    assert err[-1].startswith("hint: raised in recap-portable's ") and "fsio.py" in err[-1], err
    assert f"called from {__file__}:{line} (stage), outside recap-portable: check what your code passes" in err[-1]
    assert "internal error" not in " ".join(err)


def test_a_protocol_function_that_cannot_take_its_arguments_is_named_not_called_a_bug(tmp_path, cli):
    """`def preflight_no_args():` raised its TypeError at recap-portable's call, before the function ran, so no frame
    of the recipe's was in the traceback: "this is a bug in recap-portable"."""
    code, err = cli("run", "--output", str(tmp_path / "r"), recipe="PREFLIGHT_NO_ARGS")
    text = "\n".join(err)
    assert "bug in recap-portable" not in text and "internal error" not in text, err
    assert f"{__name__}:preflight_no_args" in text, err
    if code == 1:  # named by the CLI's attribution (a check before the call would give its own code)
        line = preflight_no_args.__code__.co_firstlineno
        assert err[-1].startswith(f"hint: {__name__}:preflight_no_args (defined at {__file__}:{line})"), err
    assert not (tmp_path / "r" / "a").exists()


def test_a_stage_function_without_the_context_parameter_is_named_not_called_a_bug(tmp_path, cli):
    code, err = cli("run", "--output", str(tmp_path / "r"), recipe="NO_ARGS")
    text = "\n".join(err)
    assert code != 0 and "bug in recap-portable" not in text and f"{__name__}:no_args" in text, err


def _ours(source: str) -> dict:
    """The functions `source` defines, compiled as if they were a file of recap-portable's package."""
    namespace: dict = {}
    exec(compile(source, str(SCRIPT.parent / "_audit50_probe.py"), "exec"), namespace)  # noqa: S102 - a test seam
    return namespace


def test_origin_sorts_frames_into_ours_the_users_and_a_call_ours_could_not_make():
    """The unit under the CLI's hint: only our frames is our bug; a frame of the user's anywhere below is theirs; a
    TypeError at our call of the user's function names that function's definition."""
    ours = _ours("def call(fn):\n    return fn(1)\n\n\ndef boom(x=None):\n    raise TypeError('ours')\n")

    def takes_none():
        pass

    def calls_ours(x):
        ours["boom"]()

    def raises(x):
        raise TypeError("the user's")

    def origin_of(name, arg):
        try:
            ours[name](arg)
        except TypeError as exc:
            exc.__traceback__ = exc.__traceback__.tb_next  # start below this test's frame, as main's handler does
            return portable._origin(exc)
        raise AssertionError("no TypeError")

    def kind(origin):
        return "ours" if origin is None else "call" if origin.call else "via" if origin.via else "user"

    cases = [("boom", None, "ours"), ("call", takes_none, "call"), ("call", ours["boom"], "ours")]
    cases += [("call", calls_ours, "via"), ("call", raises, "user")]
    assert [kind(origin_of(name, arg)) for name, arg, _ in cases] == [k for _, _, k in cases]
    origin = origin_of("call", takes_none)
    assert origin.at == (
        f"{__name__}:{takes_none.__qualname__} (defined at {__file__}:{takes_none.__code__.co_firstlineno})"
    )
    assert origin_of("call", calls_ours).at.startswith(f"{__file__}:{calls_ours.__code__.co_firstlineno + 1} ")


# -- F6: an OSError is mapped by what happened ------------------------------------------------------------------


@pytest.mark.parametrize(
    "mode, words",
    [
        ("raise_fnf", "error: FileNotFoundError: weights missing"),
        ("raise_perm", "error: PermissionError: [Errno 13] Permission denied"),
        ("open_missing", "error: FileNotFoundError: [Errno 2] No such file or directory: "),
    ],
)
def test_an_os_error_a_recipe_raises_itself_is_exit_1_naming_its_line(tmp_path, cli, mode, words):
    """docs/recipes.md: an exception that is not a PortableError is exit 1 naming the recipe's file and line. A
    FileNotFoundError("weights missing") was "cannot write a file: weights missing" (exit 8, "the disk is full"), a
    PermissionError on a read "cannot write a file: permission denied" (8), an open() of a missing file exit 3."""
    run = tmp_path / "r"
    code, err = cli("run", "--output", str(run), "--no-progress", f"toy.mode={mode}")
    assert code == 1, err
    assert err[-2].startswith(words) and "write" not in err[-2], err
    assert err[-1].startswith(f"hint: raised at {__file__}:") and "(stage), outside recap-portable" in err[-1], err


def test_a_full_disk_in_a_recipe_is_exit_8_whoever_hit_it(tmp_path, cli):
    code, err = cli("run", "--output", str(tmp_path / "r"), "--no-progress", "toy.mode=disk_full")
    assert code == 8 and "the disk is full" in err[-2], err


@pytest.mark.parametrize(
    "exc, code, message",
    [
        (
            PermissionError(errno.EACCES, "Permission denied", "/x/f"),
            3,
            "cannot access a file: permission denied (/x/f)",
        ),
        (FileNotFoundError("/x/gone"), 3, "cannot read a file: /x/gone does not exist (or a parent is not a folder)"),
        (OSError(errno.EIO, "Input/output error", "/x/f"), 3, "cannot access a file: Input/output error (/x/f)"),
        (OSError(errno.EROFS, "Read-only file system", "/x/f"), 8, "cannot write a file: the filesystem is read-only"),
    ],
)
def test_an_os_error_of_recap_portables_own_is_mapped_by_what_happened(exc, code, message):
    """`_from_os_error` took any errno outside four for a write (exit 8, "cannot write"), errno None included."""
    error = portable._from_os_error(exc)
    assert error.exit_code == code and error.message.startswith(message), error.message


def test_an_os_error_that_is_no_os_failure_is_left_to_the_unexpected_exception_path():
    assert portable._from_os_error(OSError("something else")) is None


# -- F5: a schema field of a type a config cannot hold ----------------------------------------------------------


@pytest.mark.parametrize(
    "recipe, words",
    [
        ("SET_FIELD", "config_schema {m}:SetConfig: field `tags` is of type set, which a run config cannot hold"),
        (
            "NESTED_THING",
            "config_schema {m}:NestedThingConfig: field `inner.thing` is of type {m}.Thing | None, which a run config "
            "cannot hold",
        ),
    ],
)
def test_a_schema_field_of_a_type_omegaconf_cannot_hold_is_a_config_error_naming_recipe_field_and_type(
    tmp_path, cli, recipe, words
):
    """It was "internal error: ValidationError: Unexpected type annotation: set" (exit 1, a bug)."""
    code, err = cli("run", "--output", str(tmp_path / "r"), recipe=recipe)
    assert code == 4, err
    assert err[0] == f"error: recipe '{__name__}:{recipe}': " + words.format(m=__name__), err
    assert (
        err[1].startswith("hint: give each field of the schema one of: int, float, bool, str")
        and "@dataclass" in err[1]
    )
    assert not (tmp_path / "r").exists()


# -- F10: a bare PortableError, one preflight problem, an empty ${BUNDLE} ---------------------------------------


def test_a_bare_portable_error_says_to_raise_a_subclass_and_where(tmp_path, cli):
    code, err = cli("run", "--output", str(tmp_path / "r"), "--no-progress", "toy.mode=bare")
    assert code == 1 and err[-2] == "error: recipe says no", err
    line = _line_of('raise PortableError("recipe says no")')
    assert err[-1] == f"hint: raised at {__file__}:{line} (stage); {BARE_HINT}"


@pytest.mark.parametrize(
    "recipe, code, error, hint",
    [
        ("PREFLIGHT_ONE", 4, "error: preflight: only problem", "hint: fix it, then run again (nothing was started"),
        ("PREFLIGHT_ONE_ERROR", 4, "error: toy.mode: not a mode", "hint: fix it, then run again (nothing was started"),
        ("PREFLIGHT_TWO", 56, "error: preflight found 2 problems: problem one | problem two", "hint: fix them all"),
    ],
)
def test_one_preflight_problem_gets_its_own_code_and_a_hint(tmp_path, cli, recipe, code, error, hint):
    """One problem a recipe's preflight returned as a string was exit 56 ("several problems") without a hint."""
    got, err = cli("run", "--output", str(tmp_path / "r"), recipe=recipe)
    assert (got, err[0]) == (code, error) and err[1].startswith(hint), err
    assert not (tmp_path / "r").exists()


def test_bundle_used_while_empty_is_refused_naming_the_key(tmp_path, cli):
    """`data: ${BUNDLE}/d` with no bundle resolved to "/d" and the run went on."""
    code, err = cli("run", "--output", str(tmp_path / "r"), recipe="WITH_BUNDLE", yaml="data: ${BUNDLE}/d\n")
    assert code == 4, err
    assert err[0].endswith("config key `data` uses ${BUNDLE}, which is empty here ('${BUNDLE}/d' would start at /)")
    assert err[1] == (  # the override, not the environment variable (audit53 V11)
        "hint: give the bundle folder: portable run BUNDLE ... (or the override BUNDLE=PATH after the command; "
        "the environment variable BUNDLE is not read), or write data without ${BUNDLE}"
    )
    assert not (tmp_path / "r").exists()
    code, err = cli(
        "run",
        "--output",
        str(tmp_path / "r"),
        "--print-config",
        f"BUNDLE={tmp_path}",
        recipe="WITH_BUNDLE",
        yaml="data: ${BUNDLE}/d\n",
    )
    assert code == 0, err


def test_an_interpolation_hint_offers_only_the_placeholders_the_schema_has(tmp_path, cli):
    code, err = cli("run", "--output", str(tmp_path / "r"), recipe="PLAIN", yaml="data: ${RUN}/d\n")
    assert code == 4 and "${RUN}" not in err[1] and "${BUNDLE}" not in err[1], err
    assert err[1] == "hint: an interpolation names a config key (${eval.seed}): check the name and braces"


# -- F9: a stderr or stdout that cannot be written --------------------------------------------------------------


class _Refusing(io.StringIO):
    def __init__(self, exc: OSError) -> None:
        super().__init__()
        self.exc = exc

    def write(self, text: str) -> int:
        raise self.exc


@pytest.mark.parametrize("exc", [OSError(errno.ENOSPC, "No space left on device"), BrokenPipeError(errno.EPIPE, "x")])
def test_a_stderr_that_cannot_be_written_changes_no_exit_code(monkeypatch, exc):
    """`2>/dev/full` (or stderr piped to `head`) turned every exit code into 1, a successful run's too."""

    def talks(args):
        print("some talk", file=sys.stderr)
        return 0

    monkeypatch.setattr(sys, "stderr", _Refusing(exc))
    monkeypatch.setattr(portable, "cmd_verify", talks)
    assert portable.main(["verify", "/x"]) == 0
    monkeypatch.undo()
    monkeypatch.setattr(sys, "stderr", _Refusing(exc))
    assert portable.main(["verify", "/nonexistent/bundle"]) == 3


def test_stdout_a_reader_left_keeps_the_code_and_stdout_that_cannot_take_data_is_exit_8(monkeypatch, capsys):
    def prints(args):
        print('{"data": 1}')
        sys.stdout.flush()
        return 0

    monkeypatch.setattr(portable, "cmd_verify", prints)
    monkeypatch.setattr(sys, "stdout", _Refusing(BrokenPipeError(errno.EPIPE, "Broken pipe")))
    assert portable.main(["verify", "/x"]) == 0
    monkeypatch.setattr(sys, "stdout", _Refusing(OSError(errno.ENOSPC, "No space left on device")))
    assert portable.main(["verify", "/x"]) == 8
    assert capsys.readouterr().err.startswith("error: cannot write the command's output to stdout: No space left")


def test_a_real_stderr_on_a_full_device_keeps_the_exit_code(tmp_path):
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, str(SCRIPT), "verify", str(tmp_path / "absent")], stderr=full, timeout=120, check=False
        )
    assert done.returncode == 3
