"""Compile-toolchain probe: can the target interpreter build and import a C extension (what Triton does)?

Steps, each failing with its own finding: the interpreter starts and reports its sysconfig; the
sysconfig paths exist; `Python.h` is in the include folder; a C compiler resolves (`$CC`, else the
compiler Python was built with, else gcc/clang/cc, the order Triton uses); a tiny extension compiles
in a temporary folder and the target interpreter imports it and gets the right answer.
"""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from reproduction.checks.context import CheckContext, load_facts
from reproduction.checks.probe import TOOLCHAIN, ProbeResult, RunCommand, fail, ok, python_script_argv, run_command

NAME = "toolchain"
EXT_SOURCE = r"""#define PY_SSIZE_T_CLEAN
#include <Python.h>
static PyObject *add(PyObject *self, PyObject *args) {
    long a, b;
    if (!PyArg_ParseTuple(args, "ll", &a, &b)) return NULL;
    return PyLong_FromLong(a + b);
}
static PyMethodDef methods[] = {{"add", add, METH_VARARGS, "a + b"}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "portable_probe_ext", NULL, -1, methods};
PyMODINIT_FUNC PyInit_portable_probe_ext(void) { return PyModule_Create(&module); }
"""
IMPORT_SCRIPT = "# portable-probe: import-ext\nimport portable_probe_ext as m; print(m.add(40, 2))"
_FIX_HEADERS = (
    "install the Python development headers for this interpreter "
    "(Debian/Ubuntu: apt-get install python3-dev; RHEL: dnf install python3-devel), "
    "or restore the bundle's runtime, which carries them"
)


def resolve_compiler(cc_config: str | None, env: Mapping[str, str]) -> tuple[list[str] | None, str]:
    """(argv prefix of the C compiler, where it came from), or (None, what was tried)."""
    path = env.get("PATH", os.defpath)
    candidates: list[tuple[str, str]] = []
    if env.get("CC"):
        candidates.append((env["CC"], "$CC"))
    if cc_config:
        candidates.append((cc_config, "sysconfig CC"))
    candidates += [(name, "PATH") for name in ("gcc", "clang", "cc")]
    for command, origin in candidates:
        argv = shlex.split(command)
        found = argv and shutil.which(argv[0], path=path)
        if found:
            return [found, *argv[1:]], origin
    return None, "tried " + ", ".join(f"{c!r} ({o})" for c, o in candidates)


def probe_toolchain(
    python: Path,
    *,
    run: RunCommand = run_command,
    env: Mapping[str, str] | None = None,
    ctx: CheckContext | None = None,
) -> ProbeResult:
    """Check that `python` can build and import a C extension; never raises for a broken toolchain.

    Runs `python` (for its sysconfig), the C compiler, and `python` again to import the result, all
    in a temporary folder that is removed afterwards. Pass `ctx` to reuse facts already read.
    """
    start = time.perf_counter()
    if ctx is None:
        ctx = CheckContext(python=Path(python), env=dict(os.environ if env is None else env), run=run)
    if not ctx.facts and not ctx.facts_error:
        load_facts(ctx)
    result = _probe(ctx)
    result.seconds = time.perf_counter() - start
    return result


def _probe(ctx: CheckContext) -> ProbeResult:
    if ctx.facts_error:
        return fail(
            NAME,
            TOOLCHAIN,
            ctx.facts_error,
            "restore the bundle again (portable restore --deep) or fix the interpreter",
        )
    facts = ctx.facts
    paths = {k: v for k, v in (facts.get("paths") or {}).items() if v}
    missing = sorted(f"{k}={v}" for k, v in paths.items() if not Path(v).is_dir())
    if missing:
        return fail(
            NAME,
            TOOLCHAIN,
            f"sysconfig paths of {ctx.python} do not exist: {', '.join(missing)}",
            "the interpreter was moved without relocation: run `portable restore` on the bundle again",
            python=str(ctx.python),
            missing=missing,
        )
    include = Path(paths.get("include", ""))
    if not (include / "Python.h").is_file():
        return fail(
            NAME,
            TOOLCHAIN,
            f"Python.h not found in {include} (Triton's first kernel compile will fail)",
            _FIX_HEADERS,
            python=str(ctx.python),
            include=str(include),
        )
    compiler, origin = resolve_compiler(facts.get("cc"), ctx.env)
    if compiler is None:
        return fail(
            NAME,
            TOOLCHAIN,
            f"no C compiler found ({origin})",
            "install gcc (apt-get install gcc) or set CC to a working compiler",
            python=str(ctx.python),
        )
    return _build_and_import(ctx, compiler, origin, include)


def _build_and_import(ctx: CheckContext, compiler: list[str], origin: str, include: Path) -> ProbeResult:
    facts = ctx.facts
    details = {
        "python": str(ctx.python),
        "python_version": facts.get("version"),
        "compiler": compiler[0],
        "compiler_from": origin,
        "include": str(include),
    }
    with tempfile.TemporaryDirectory(prefix="portable-check-cext-") as tmp:
        src = Path(tmp) / "portable_probe_ext.c"
        src.write_text(EXT_SOURCE, encoding="utf-8")
        out = Path(tmp) / f"portable_probe_ext{facts.get('ext_suffix') or '.so'}"
        includes = {str(include), str((facts.get("paths") or {}).get("platinclude") or include)}
        argv = [*compiler, str(src), "-O1", "-shared", "-fPIC", *(f"-I{i}" for i in sorted(includes)), "-o", str(out)]
        built = ctx.run(argv, timeout=120, env=ctx.env, cwd=Path(tmp))
        details["compile_s"] = round(built.seconds, 3)
        if built.returncode != 0 or not out.is_file():
            return fail(
                NAME,
                TOOLCHAIN,
                f"{Path(compiler[0]).name} failed to build a C extension (exit {built.returncode}): {built.tail()}",
                "fix the compiler install (or set CC to one that works); Triton needs it for every kernel",
                **details,
            )
        env = dict(ctx.env, PYTHONPATH=tmp + os.pathsep + ctx.env.get("PYTHONPATH", ""))
        loaded = ctx.run(python_script_argv(ctx.python, IMPORT_SCRIPT), timeout=60, env=env, cwd=Path(tmp))
        if loaded.returncode != 0 or loaded.stdout.strip() != "42":
            return fail(
                NAME,
                TOOLCHAIN,
                f"the built extension does not import in {ctx.python} (exit {loaded.returncode}): {loaded.tail()}",
                "the compiler targets another ABI than the interpreter: use the compiler Python was built with",
                **details,
            )
    version = _compiler_version(ctx, compiler)
    details["compiler_version"] = version
    return ok(
        NAME,
        f"{version or compiler[0]} (from {origin}) built and imported a C extension "
        f"for Python {facts.get('version')} in {details['compile_s']:.2f} s",
        **details,
    )


def _compiler_version(ctx: CheckContext, compiler: list[str]) -> str:
    result = ctx.run([*compiler, "--version"], timeout=20, env=ctx.env)
    return result.stdout.splitlines()[0].strip() if result.returncode == 0 and result.stdout else ""
