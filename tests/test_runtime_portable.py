"""Runtime layers really are portable: this machine's Python and a venv, packed, restored elsewhere, moved.

The interpreter is `sys.base_prefix` (here a pyenv shared-library build whose RUNPATH is absolute);
the venv (`--copies`) holds a pure package with a console script and a package with a C extension,
both built from tiny sources with no network. Restored at a path shorter and at one longer than the
build prefix, then moved and restored again, the interpreter starts with an environment that does
not point back, imports both packages, runs the console script, and compiles and loads a fresh C
extension against the restored headers.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

from reproduction.release import elf
from reproduction.release.manifest import load_manifest

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "tests" / "specs" / "runtime_layers.toml"
PY_PREFIX = os.path.realpath(sys.base_prefix)
PY_VER = f"{sys.version_info[0]}.{sys.version_info[1]}"
BASE_PY = Path(PY_PREFIX) / "bin" / f"python{PY_VER}"
GCC = shutil.which("gcc")
CLEAN_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1"}

SHORT_LEN = len("/tmp/rpXXXXXXXX/runtime/py")  # where the "shorter" cases restore

if GCC is None or not BASE_PY.is_file() or not sysconfig.get_config_var("Py_ENABLE_SHARED"):
    pytest.skip("needs gcc and a shared-library CPython at sys.base_prefix", allow_module_level=True)
if PY_PREFIX in ("/usr", "/usr/local") or len(PY_PREFIX) <= SHORT_LEN:
    pytest.skip(
        f"sys.base_prefix {PY_PREFIX} is a system prefix or too short to restore shorter", allow_module_level=True
    )

PURE_PYPROJECT = """\
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"
[project]
name = "purepkg"
version = "0.1"
[project.scripts]
pure-hello = "purepkg:main"
"""
PURE_INIT = """\
import sys
def main():
    print("pure-hello from", sys.prefix)
"""
CEXT_SETUP = (
    "from setuptools import setup, Extension\n"
    'setup(name="cextpkg", version="0.1", ext_modules=[Extension("cextpkg", ["cextpkg.c"])])\n'
)
CEXT_C = """\
#include <Python.h>
static PyObject *add(PyObject *self, PyObject *args) {
    long a, b;
    if (!PyArg_ParseTuple(args, "ll", &a, &b)) return NULL;
    return PyLong_FromLong(a + b);
}
static PyMethodDef methods[] = {{"add", add, METH_VARARGS, "a + b"}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "%s", NULL, -1, methods};
PyMODINIT_FUNC PyInit_%s(void) { return PyModule_Create(&mod); }
"""
FACTS = """\
import json, sys, sysconfig
import purepkg, cextpkg
maps = sorted({line.split()[-1] for line in open("/proc/self/maps") if "/" in line.split()[-1]})
print(json.dumps({"maps": maps, "prefix": sys.prefix, "base_prefix": sys.base_prefix,
                  "path": [p for p in sys.path if p],
                  "include": sysconfig.get_paths()["include"], "suffix": sysconfig.get_config_var("EXT_SUFFIX"),
                  "libdir": sysconfig.get_config_var("LIBDIR"), "pure": purepkg.__file__, "cext": cextpkg.__file__,
                  "sum": cextpkg.add(40, 2)}))
"""


def _run(
    cmd: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)


def _portable(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return _run([sys.executable, "-m", "reproduction.portable", "--no-progress", *map(str, args)], env=env, cwd=REPO)


def _build_venv(work: Path) -> Path:
    """A --copies venv made by the base interpreter, with purepkg and cextpkg installed from local wheels."""
    (work / "src" / "purepkg" / "purepkg").mkdir(parents=True)
    (work / "src" / "purepkg" / "pyproject.toml").write_text(PURE_PYPROJECT)
    (work / "src" / "purepkg" / "purepkg" / "__init__.py").write_text(PURE_INIT)
    (work / "src" / "cextpkg").mkdir()
    (work / "src" / "cextpkg" / "setup.py").write_text(CEXT_SETUP)
    (work / "src" / "cextpkg" / "cextpkg.c").write_text(CEXT_C % ("cextpkg", "cextpkg"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    wheels = _run(
        [
            *pip,
            "wheel",
            "--no-index",
            "--no-build-isolation",
            "--no-deps",
            "-w",
            work / "wheels",
            work / "src" / "purepkg",
            work / "src" / "cextpkg",
        ]
    )
    assert wheels.returncode == 0, wheels.stderr
    venv = work / "venv"
    made = _run([BASE_PY, "-m", "venv", "--copies", "--without-pip", venv], env=CLEAN_ENV)
    assert made.returncode == 0, made.stderr
    installed = _run(
        [
            *pip,
            "--python",
            venv / "bin" / "python",
            "install",
            "--no-index",
            "--no-deps",
            *sorted((work / "wheels").glob("*.whl")),
        ]
    )
    assert installed.returncode == 0, installed.stderr
    return venv


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The bundle packed once from this machine's Python and a fresh venv (build prefixes recorded)."""
    work = tmp_path_factory.mktemp("rtbuild")
    venv = _build_venv(work)
    spec = work / "runtime.toml"
    spec.write_text(SPEC.read_text().format(python_prefix=PY_PREFIX, stdlib=f"lib/python{PY_VER}", venv=venv))
    out = _portable("pack", spec, "--out", work / "bundle")
    assert out.returncode == 0, out.stderr
    return {"bundle": work / "bundle", "venv": venv}


def _restore(bundle: Path) -> str:
    done = _portable("restore", bundle)
    assert done.returncode == 0, f"restore {bundle} exited {done.returncode}: {done.stderr}"
    return done.stdout + done.stderr


def _check_runtime(bundle: Path, tmp: Path) -> None:
    """The restored runtime works from `bundle` alone, in an environment that knows nothing else."""
    py, venv = bundle / "runtime" / "py", bundle / "runtime" / "venv"
    env = {**CLEAN_ENV, "HOME": str(tmp)}
    base = _run(
        [
            py / "bin" / "python3",
            "-c",
            "import sys, sysconfig, json; print(json.dumps([sys.prefix, sys.path, "
            "sysconfig.get_paths()['include'], sysconfig.get_config_var('LIBDIR')]))",
        ],
        env=env,
    )
    assert base.returncode == 0, base.stderr
    prefix, path, include, libdir = json.loads(base.stdout)
    assert (prefix, include, libdir) == (str(py), f"{py}/include/python{PY_VER}", f"{py}/lib")
    assert all(p.startswith(str(py) + "/") for p in path if p), path
    assert base.stderr == ""  # no "Could not find platform independent libraries": getpath found its own lib/

    facts = _run([venv / "bin" / "python", "-c", FACTS], env=env)
    assert facts.returncode == 0, facts.stderr
    got = json.loads(facts.stdout)
    assert (got["prefix"], got["base_prefix"], got["sum"]) == (str(venv), str(py), 42)
    assert got["pure"].startswith(f"{venv}/lib/") and got["cext"].startswith(f"{venv}/lib/")
    assert all(p.startswith((str(venv) + "/", str(py) + "/")) for p in got["path"]), got["path"]
    # What the loader really mapped: libpython and every extension module come from the bundle.
    assert not [m for m in got["maps"] if m.startswith(PY_PREFIX + "/")], got["maps"]
    assert f"{py}/lib/libpython{PY_VER}.so.1.0" in got["maps"] and got["cext"] in got["maps"]

    script = _run([venv / "bin" / "pure-hello"], env=env)
    assert (script.returncode, script.stdout) == (0, f"pure-hello from {venv}\n"), script.stderr

    # A fresh C extension compiled against the restored headers, loaded by the restored interpreter.
    assert got["include"] == f"{py}/include/python{PY_VER}" and (Path(got["include"]) / "Python.h").is_file()
    fresh = tmp / "fresh"
    fresh.mkdir(exist_ok=True)
    (fresh / "freshext.c").write_text(CEXT_C % ("freshext", "freshext"))
    built = _run(
        [GCC, "-shared", "-fPIC", f"-I{got['include']}", "-o", fresh / f"freshext{got['suffix']}", fresh / "freshext.c"]
    )
    assert built.returncode == 0, built.stderr
    loaded = _run(
        [venv / "bin" / "python", "-c", "import freshext; print(freshext.add(2, 3), freshext.__file__)"],
        env=env,
        cwd=fresh,
    )
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout == f"5 {fresh}/freshext{got['suffix']}\n"

    runpath = elf.search_paths((py / "bin" / f"python{PY_VER}").read_bytes())
    assert [p.value for p in runpath] == ["$ORIGIN/../lib"]
    assert [p.value for p in elf.search_paths((venv / "bin" / f"python{PY_VER}").read_bytes())] == [
        "$ORIGIN/../../py/lib"
    ]
    _probe_toolchain(venv / "bin" / "python", env)


def _probe_toolchain(python: Path, env: dict[str, str]) -> None:
    """`portable check`'s compile-toolchain probe, run for real against the restored interpreter."""
    try:
        from reproduction.checks.toolchain import probe_toolchain
    except ImportError:
        return  # the check package is not in this build; the compile above covers the same ground
    result = probe_toolchain(python, env=env)
    assert result.status == "ok", (result.finding, result.fix)


def _recorded_files(bundle: Path) -> list[str]:
    """Bundle-relative paths of every file a layer records as holding a build prefix."""
    manifest = load_manifest(bundle)
    rels = {f"{layer.target}/{o.path}" for layer in manifest.layers for o in layer.prefix_files}
    rels |= {
        f"{layer.target}/{o.path}"
        for layer in manifest.layers
        for occ in layer.foreign_prefix_files.values()
        for o in occ
    }
    return sorted(rels)


def _leftovers(bundle: Path) -> dict[str, list[int]]:
    """Offsets where a recorded file below `bundle` still holds its owner layer's build prefix."""
    manifest = load_manifest(bundle)
    by_archive = {layer.archive: layer for layer in manifest.layers}
    found: dict[str, list[int]] = {}
    for layer in manifest.layers:
        jobs = [(layer.build_prefix, layer.prefix_files)]
        jobs += [(by_archive[a].build_prefix, occ) for a, occ in layer.foreign_prefix_files.items()]
        for prefix, occurrences in jobs:
            needle = prefix.encode()
            for occ in occurrences:
                data = (bundle / layer.target / occ.path).read_bytes()
                hits, at = [], data.find(needle)
                while at >= 0:
                    hits.append(at)
                    at = data.find(needle, at + 1)
                if hits:
                    found[f"{layer.target}/{occ.path}"] = hits
    return found


def _assert_only_harmless_leftovers(bundle: Path, leftovers: dict[str, list[int]]) -> None:
    """Longer than the build prefix: only libpython's PREFIX fallback and unmapped debug strings may keep it."""
    needle = PY_PREFIX.encode()
    for rel, offsets in leftovers.items():
        data = (bundle / rel).read_bytes()
        unmapped = elf.unmapped_ranges(data)
        for at in offsets:
            exact_cstring = data[at - 1] == 0 and data[at + len(needle)] == 0
            if "/libpython" in rel and exact_cstring:
                continue
            assert any(a <= at < b for a, b in unmapped), f"{rel}: build prefix left at offset {at} in mapped bytes"


def test_manifest_records_where_each_build_prefix_occurs(packed: dict[str, Path]) -> None:
    manifest = load_manifest(packed["bundle"])
    py, venv = manifest.layers
    assert (py.target, py.build_prefix, venv.target, venv.build_prefix) == (
        "runtime/py",
        PY_PREFIX,
        "runtime/venv",
        str(packed["venv"]),
    )
    modes = {o.path: o.mode for o in py.prefix_files}
    stdlib = f"lib/python{PY_VER}"
    assert modes[f"bin/python{PY_VER}"] == "elf-runpath"
    assert modes[f"lib/libpython{PY_VER}.so.1.0"] == "elf-runpath"
    assert modes[f"{stdlib}/_sysconfigdata__linux_x86_64-linux-gnu.py"] == "text"
    assert modes[f"lib/pkgconfig/python-{PY_VER}.pc"] == "text"
    assert any(p.startswith(f"{stdlib}/config-") and p.endswith("/Makefile") for p in modes)
    assert not any("site-packages/" in p or p.endswith(".pyc") or "/test/" in p for p in modes)
    own = {o.path: o.mode for o in venv.prefix_files}
    assert own["bin/pure-hello"] == "text" and own["bin/activate"] == "text"
    foreign = {o.path: o.mode for o in venv.foreign_prefix_files[py.archive]}
    assert foreign["pyvenv.cfg"] == "text" and foreign[f"bin/python{PY_VER}"] == "elf-runpath"
    assert foreign[f"lib/python{PY_VER}/site-packages/cextpkg{sysconfig.get_config_var('EXT_SUFFIX')}"] == "elf-runpath"


def test_restore_shorter_then_move_longer(packed: dict[str, Path], tmp_path: Path) -> None:
    short = Path(tempfile.mkdtemp(prefix="rp", dir="/tmp"))  # /tmp/rpXXXXXXXX/runtime/py: shorter than the build prefix
    try:
        shutil.copytree(packed["bundle"], short, dirs_exist_ok=True)
        assert len(str(short / "runtime" / "py")) < len(PY_PREFIX)
        _restore(short)
        _check_runtime(short, tmp_path)
        assert _leftovers(short) == {}  # every recorded file was fully rewritten

        moved = tmp_path / ("a-folder-name-that-makes-the-path-much-longer-than-the-build-prefix" * 2) / "moved"
        moved.parent.mkdir()
        shutil.move(short, moved)
        talk = _restore(moved)
        assert "relocated" in talk
        _check_runtime(moved, tmp_path)
        _assert_only_harmless_leftovers(moved, _leftovers(moved))
        for rel in _recorded_files(moved):  # nothing names the previous location either
            assert str(short).encode() not in (moved / rel).read_bytes(), rel
    finally:
        shutil.rmtree(short, ignore_errors=True)


def test_restore_longer_then_move_shorter(packed: dict[str, Path], tmp_path: Path) -> None:
    long_ = tmp_path / ("x" * 100) / "bundle"
    long_.parent.mkdir()
    shutil.copytree(packed["bundle"], long_)
    talk = _restore(long_)
    _check_runtime(long_, tmp_path)
    assert "relocation kept the build prefix in" in talk and f"libpython{PY_VER}.so.1.0" in talk  # said, not silent
    leftovers = _leftovers(long_)
    assert f"runtime/py/lib/libpython{PY_VER}.so.1.0" in leftovers  # PREFIX fallback: longer than its slot
    _assert_only_harmless_leftovers(long_, leftovers)
    assert len(f"#!{long_}/runtime/venv/bin/python") > 127  # too long for a shebang: the sh trampoline ran it
    trampoline = "#!/bin/sh\n'''exec' " + f'{long_}/runtime/venv/bin/python "$0" "$@"\n' + "' '''\n"
    assert (long_ / "runtime" / "venv" / "bin" / "pure-hello").read_text().startswith(trampoline)

    short = Path(tempfile.mkdtemp(prefix="rp", dir="/tmp"))
    try:
        short.rmdir()
        shutil.move(long_, short)
        assert "relocation kept the build prefix" not in _restore(short)
        _check_runtime(short, tmp_path)
        assert _leftovers(short) == {}  # strings kept while the path was too long caught up
    finally:
        shutil.rmtree(short, ignore_errors=True)


def test_a_binary_string_that_cannot_fit_is_refused_with_exit_9(tmp_path: Path) -> None:
    """A layer whose loaded bytes embed the build prefix: restoring at a longer path is refused."""
    src = tmp_path / "build-location-of-the-layer" / "rtx"
    (src / "lib").mkdir(parents=True)
    (src / "k.c").write_text(f'const char *data_dir(void) {{ return "{src}/share/k"; }}\n')
    built = _run([GCC, "-shared", "-fPIC", "-o", src / "lib" / "libk.so", src / "k.c"])
    assert built.returncode == 0, built.stderr
    spec = tmp_path / "rtx.toml"
    spec.write_text(f'name = "rtx"\n[[layer]]\nsource = "{src}"\nkind = "runtime"\nrelocatable = true\n')
    packed = _portable("pack", spec, "--out", tmp_path / "packed")
    assert packed.returncode == 0, packed.stderr
    longer = tmp_path / ("y" * 80)
    shutil.copytree(tmp_path / "packed", longer)
    refused = _portable("restore", longer)
    assert refused.returncode == 9, refused.stderr
    assert "lib/libk.so" in refused.stderr and repr(str(src)) in refused.stderr
    assert repr(str(longer / "runtime" / "rtx")) in refused.stderr
    short = Path(tempfile.mkdtemp(prefix="rp", dir="/tmp"))
    try:
        short.rmdir()
        shutil.move(longer, short)
        _restore(short)
        data = (short / "runtime" / "rtx" / "lib" / "libk.so").read_bytes()
        assert str(src).encode() not in data and f"{short}/runtime/rtx/share/k".encode() + b"\0" in data
    finally:
        shutil.rmtree(short, ignore_errors=True)
