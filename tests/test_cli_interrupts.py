"""Interrupts in every command: SIGTERM is Ctrl-C (exit 130, one line, nothing half-written), and an interrupt a
library turned into another exception is still an interrupt, not "a bug" (audit47_cli F7, F8)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from bundlekit import SMALL_SPEC, small_sources

from reproduction import portable
from reproduction.release import pack as pack_module


class _DefaultSigterm(Exception):
    """What SIGTERM raises in these tests when nothing else answers it (its default action would end pytest)."""


@pytest.fixture(autouse=True)
def _signals():
    """SIGTERM raises _DefaultSigterm unless the CLI installs its own handler; SIGINT is Python's handler (a
    background shell starts the tests with SIGINT ignored); both are put back after."""

    def default(signum, frame):
        raise _DefaultSigterm("SIGTERM reached the handler the process had")

    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    signal.signal(signal.SIGTERM, default)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    for signum, handler in before.items():
        signal.signal(signum, handler)


def _signal_self(signum: int) -> None:
    os.kill(os.getpid(), signum)
    time.sleep(5)  # the handler runs at the next bytecode; this sleep is never finished


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_pack_is_exit_130_and_leaves_no_partial_bundle(signum, tmp_path, monkeypatch, capsys):
    """F7: SIGTERM during `pack` killed it (exit 143) and left `<out>.partial/`; now it is an interrupt like Ctrl-C."""
    small_sources(tmp_path)
    (tmp_path / "small.toml").write_text(SMALL_SPEC)
    real = pack_module._pack_layers

    def interrupted_mid_layers(spec, stage, jobs, ui):
        assert stage.is_dir() and any(stage.iterdir()), "the plain files are staged by now"
        _signal_self(signum)
        return real(spec, stage, jobs, ui)

    monkeypatch.setattr(pack_module, "_pack_layers", interrupted_mid_layers)
    out = tmp_path / "b"
    assert portable.main(["pack", str(tmp_path / "small.toml"), "--out", str(out)]) == 130
    assert capsys.readouterr().err.splitlines() == [
        "error: interrupted",
        "hint: run the same `portable pack` again: nothing half-written was kept",
    ]
    assert not out.exists() and not (tmp_path / "b.partial").exists()
    assert signal.getsignal(signal.SIGTERM).__name__ == "default", "the handler the process had is put back"


@pytest.mark.parametrize("command", ["eval", "verify", "check", "compare", "lineage", "fetch", "publish", "weights"])
def test_sigterm_is_an_interrupt_in_every_command(command, monkeypatch, capsys, tmp_path):
    """F7: only run and restore turned SIGTERM into an interrupt; eval died with 143 (its worker semaphores leaked)."""
    monkeypatch.setattr(portable, f"cmd_{command}", lambda args: _signal_self(signal.SIGTERM))
    argv = {
        "eval": ["eval", "--checkpoint", "1", "--output", str(tmp_path / "run")],
        "verify": ["verify", str(tmp_path)],
        "check": ["check"],
        "compare": ["compare", str(tmp_path), str(tmp_path)],
        "lineage": ["lineage", str(tmp_path)],
        "fetch": ["fetch", "a/b", str(tmp_path / "d")],
        "publish": ["publish", str(tmp_path), "--repo", "a/b"],
        "weights": ["weights", "verify", str(tmp_path / "m.json"), str(tmp_path)],
    }[command]
    assert portable.main(argv) == 130
    assert capsys.readouterr().err.splitlines()[0] == "error: interrupted"


def test_an_interrupt_a_library_wrapped_in_another_exception_is_exit_130(monkeypatch, capsys):
    """F8: Ctrl-C inside transformers' lazy import came out as ModuleNotFoundError, reported as a bug (exit 1)."""

    def lazy_import(args):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as exc:
            raise ModuleNotFoundError(
                "Could not import module 'Gemma3TextModel'. Are this object's requirements defined correctly?",
                name="transformers.models.gemma3",
            ) from exc

    monkeypatch.setattr(portable, "cmd_pack", lazy_import)
    assert portable.main(["pack", "spec.toml", "--out", "b"]) == 130
    assert capsys.readouterr().err.splitlines() == [
        "error: interrupted",
        "hint: run the same `portable pack` again: nothing half-written was kept",
    ]


def test_an_interrupt_whose_chain_a_library_dropped_is_still_exit_130(monkeypatch, capsys):
    """F8: a library that swallows the KeyboardInterrupt and raises an unchained error later (a pickled worker error
    has no __context__): the signal handler saw the interrupt, so it is one."""

    def swallowed(args):
        try:
            _signal_self(signal.SIGINT)
        except KeyboardInterrupt:
            pass
        raise RuntimeError("a worker failed")

    monkeypatch.setattr(portable, "cmd_verify", swallowed)
    assert portable.main(["verify", "/x"]) == 130
    assert capsys.readouterr().err.splitlines()[0] == "error: interrupted"


def test_an_error_with_no_interrupt_is_still_a_bug(monkeypatch, capsys):
    """The interrupt check does not hide real bugs: an exception raised while handling a ValueError is exit 1."""

    def boom(args):
        try:
            raise ValueError("first")
        except ValueError:
            raise RuntimeError("second") from None

    monkeypatch.setattr(portable, "cmd_verify", boom)
    assert portable.main(["verify", "/x"]) == 1
    assert capsys.readouterr().err.splitlines()[0] == "error: RuntimeError: second"


def test_an_interrupt_inside_an_extension_s_evaluation_is_exit_130_under_python_m(tmp_path):
    """audit50 F6: a SIGTERM that lands while a C extension runs PyRun_String (Cython modules do as they import)
    made CPython note the KeyboardInterrupt as unhandled, and `python -m reproduction.portable` then died of SIGINT
    (-2) after printing `error: interrupted`. The interrupt here is raised inside such an evaluation."""
    (tmp_path / "nested_interrupt.py").write_text(
        "import ctypes, sys\n"
        "from reproduction import portable\n"
        "run = ctypes.pythonapi.PyRun_String\n"
        "run.restype = ctypes.py_object\n"
        "run.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.py_object, ctypes.py_object]\n"
        "def in_extension(*args, **kwargs):\n"
        "    scope = {'__builtins__': __builtins__}\n"
        "    run(b'raise KeyboardInterrupt', 257, scope, scope)  # 257: Py_file_input\n"
        "portable.cmd_verify = in_extension\n"
        "sys.exit(portable.main(['verify', '/x']))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(Path(portable.__file__).parents[1])])}
    done = subprocess.run(
        [sys.executable, "-m", "nested_interrupt"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stderr.splitlines()[0]) == (130, "error: interrupted")
