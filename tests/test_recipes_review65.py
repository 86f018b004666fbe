"""review65 O: what the audit65_B fixes blamed on the wrong party. A failure of recap-portable's own module at import
is a bug ("internal error", exit 1), not the user's "fix the module" (M1); a SyntaxError in an installed library names
the user's line importing it, not a file in site-packages to edit (L1); `portable run --json` started with stdout or
stderr closed neither lends fd 1 to the run's `.lock` nor puts a stage's output ahead of the JSON (L2)."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from recipe_cli import recipe_env
from test_recipes_audit65 import STAGES, _package

import reproduction
from reproduction.errors import ConfigError
from reproduction.recipe import import_failure, raised_where

OURS = Path(reproduction.__file__).resolve().parent


def _raised(code: str, filename: str) -> BaseException:
    """The exception `code` raises, compiled as `filename`, with this helper's own frame taken off its traceback (an
    import's traceback holds importlib's frames and the module's)."""
    try:
        exec(compile(code, filename, "exec"), {})
    except Exception as exc:  # noqa: BLE001 - the exception under test
        return exc.with_traceback(exc.__traceback__.tb_next)
    raise AssertionError("no exception")


@pytest.mark.parametrize(
    "exc",
    [
        pytest.param(lambda: _raised("x = undefined_helper\n", str(OURS / "run" / "compare_cmd.py")), id="NameError"),
        pytest.param(
            lambda: SyntaxError("invalid syntax", (str(OURS / "run" / "compare_cmd.py"), 25, 9, "def _broken(:\n")),
            id="SyntaxError",
        ),
    ],
)
def test_a_failure_of_our_own_module_is_raised_as_the_bug_it_is(exc) -> None:
    """M1: was ConfigError (exit 4) "... cannot be imported: NameError ... hint: fix the module"."""
    error = exc()
    with pytest.raises(type(error)) as raised:
        import_failure("reproduction.run.compare_cmd", error, "recipe grpo: headline module", field="headline")
    assert raised.value is error


def test_a_users_module_installed_in_site_packages_is_still_the_users() -> None:
    purelib = sysconfig.get_path("purelib")
    error = _raised("x = undefined_helper\n", f"{purelib}/their_recipe/stages.py")
    problem = import_failure("their_recipe.stages", error, "recipe r: stage a's module", field="stages.a.fn")
    assert isinstance(problem, ConfigError)
    assert "NameError" in problem.message and problem.hint.startswith("fix the module")


def test_a_syntax_error_in_an_installed_library_names_the_users_import_line(tmp_path) -> None:
    """L1: the hint said `fix <site-packages>/lib.py:2`, a library's file."""
    library = f"{sysconfig.get_path('purelib')}/somelib/core.py"
    user = tmp_path / "mine.py"
    user.write_text(f"import os\nraise SyntaxError('invalid syntax', ({library!r}, 2, 1, 'def (:\\n'))\n")
    error = _raised(user.read_text(), str(user))
    assert raised_where(error) == f"{user}:2"
    problem = import_failure("mine", error, "recipe r: stage a's module", field="stages.a.fn")
    assert problem.hint.startswith(f"fix {user}:2,")


PRINTING = (
    "    return StageOutput(files=[out])\n",
    "    import os, subprocess, sys\n"
    "    os.write(1, b'FD1-WRITE\\n')\n"
    "    print('LOCK', (ctx.run_dir / '.lock').read_bytes(), file=sys.stderr)\n"
    "    subprocess.run(['echo', 'CHILD-ECHO'], check=True)\n"
    "    return StageOutput(files=[out])\n",
)
assert PRINTING[0] in STAGES


def _run_closed(folder: Path, shell_redirect: str) -> subprocess.CompletedProcess:
    command = f"{sys.executable} -m reproduction.portable run --config c.yaml --output run --json {shell_redirect}"
    return subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, timeout=120, cwd=folder, env=recipe_env(folder)
    )


def test_run_json_with_stdout_closed_keeps_fd_1_off_the_lock(tmp_path) -> None:
    """L2: fd 1 was the run's .lock (a stage's write to stdout overwrote its holder line; a child had no stdout, exit
    1) and the run ended `internal error: AttributeError` after it had completed."""
    folder = _package(tmp_path, stages=PRINTING)
    done = _run_closed(folder, ">&-")
    assert done.returncode == 0, done.stderr
    assert "LOCK b'pid " in done.stderr and "error" not in done.stderr  # the lock kept its holder line
    assert "FD1-WRITE" in done.stderr and "CHILD-ECHO" in done.stderr  # a stage's stdout goes to stderr (--json)
    assert json.loads((folder / "run" / "run.json").read_text())["stages"]["score"]["status"] == "complete"


def test_run_json_with_stderr_closed_keeps_stdout_one_json_document(tmp_path) -> None:
    """L2: a stage's fd-1 write and a child's output reached stdout ahead of the JSON document."""
    folder = _package(tmp_path, stages=PRINTING)
    done = _run_closed(folder, "2>&-")
    assert done.returncode == 0
    assert json.loads(done.stdout)["run"].endswith("run")
