"""Compile-toolchain probe, for real: this interpreter and the other pyenv Pythons build and import a C
extension; broken compilers, missing headers and dead interpreters fail with exit 22."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from reproduction.checks.probe import run_command
from reproduction.checks.report import collect_report
from reproduction.checks.toolchain import probe_toolchain, resolve_compiler
from tests.fixtures.checks.fakes import FakeRun, make_context
from tests.interpreters import find_python, missing_reason

OTHER_MINORS = ("3.10", "3.13")


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_this_interpreter_builds_and_imports_an_extension():
    row = probe_toolchain(Path(sys.executable))
    assert row.status == "ok", row.finding
    assert row.details["python_version"] == ".".join(map(str, sys.version_info[:3]))
    assert Path(row.details["compiler"]).is_file() and row.details["compile_s"] > 0
    assert "built and imported a C extension for Python" in row.finding


@pytest.mark.parametrize("minor", OTHER_MINORS)
def test_other_interpreters_build_too(minor):
    found = find_python(minor)
    if found is None:
        pytest.skip(missing_reason(minor))
    python, version = found
    row = probe_toolchain(python)
    assert row.status == "ok", row.finding
    assert row.details["python"] == str(python) and row.details["python_version"] == version


def test_no_compiler_on_path_fails_22(tmp_path):
    env = {"PATH": str(tmp_path), "HOME": str(tmp_path)}
    row = probe_toolchain(Path(sys.executable), env=env)
    assert row.status == "fail" and row.failure == "toolchain" and row.exit_code == 22
    assert (
        row.finding.startswith("no C compiler found (tried ")
        and "'gcc' (PATH), 'clang' (PATH), 'cc' (PATH))" in row.finding
    )


def test_cc_env_wins_and_a_broken_compiler_fails_22(tmp_path):
    cc = _script(tmp_path / "badcc", "echo 'cc1: fatal error: unable to open portable_probe_ext.c' >&2\nexit 1\n")
    row = probe_toolchain(Path(sys.executable), env=dict(os.environ, CC=str(cc)))
    assert row.failure == "toolchain" and row.details["compiler_from"] == "$CC"
    assert row.finding.startswith("badcc failed to build a C extension (exit 1): cc1: fatal error")


def test_extension_that_does_not_import_fails_22(tmp_path):
    # A "compiler" that writes a file that is no shared object: the build succeeds, the import must not.
    cc = _script(tmp_path / "junkcc", 'while [ "$1" != "-o" ]; do shift; done; echo junk > "$2"\n')
    row = probe_toolchain(Path(sys.executable), env=dict(os.environ, CC=str(cc)))
    assert row.failure == "toolchain" and "the built extension does not import" in row.finding


def _edited_facts(edit):
    def answer(argv, env):
        real = run_command(argv, timeout=60, env=env)
        facts = json.loads(real.stdout)
        edit(facts)
        return type(real)(argv=real.argv, returncode=0, stdout=json.dumps(facts))

    return answer


def test_missing_python_h_fails_22_with_dev_headers_fix(tmp_path):
    empty = tmp_path / "include"
    empty.mkdir()
    run = FakeRun(
        {"probe:facts": _edited_facts(lambda f: f["paths"].update(include=str(empty), platinclude=str(empty)))}
    )
    report = collect_report(ctx=make_context(tmp_path, run=run))
    row = {r.name: r for r in report.results}["toolchain"]
    assert row.finding == f"Python.h not found in {empty} (Triton's first kernel compile will fail)"
    assert "python3-dev" in row.fix and report.exit_code == 22


def test_moved_interpreter_with_dangling_sysconfig_paths_fails_22(tmp_path):
    run = FakeRun({"probe:facts": _edited_facts(lambda f: f["paths"].update(stdlib="/gone/lib/python3.11"))})
    row = probe_toolchain(Path(sys.executable), ctx=make_context(tmp_path, run=run))
    assert row.failure == "toolchain" and "stdlib=/gone/lib/python3.11" in row.finding
    assert "portable restore" in row.fix


def test_interpreter_that_does_not_start_fails_22(tmp_path):
    row = probe_toolchain(tmp_path / "bin" / "python3")
    assert row.failure == "toolchain" and row.finding.startswith(
        f"{tmp_path / 'bin' / 'python3'} did not run (exit 127)"
    )


def test_resolve_compiler_order():
    env = {"PATH": os.environ["PATH"], "CC": "gcc -m64"}
    argv, origin = resolve_compiler("clang", env)
    assert origin == "$CC" and argv[1:] == ["-m64"] and argv[0].endswith("gcc")
