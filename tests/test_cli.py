"""The CLI's contract: fast --help, no pipeline imports in the control plane, one-line errors,
global options before or after the command, one --json convention, one exit code per failure kind."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from bundlekit import run_cli, small_bundle

from reproduction import portable
from reproduction.ui import options_from_args

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "reproduction" / "portable.py"

CONTROL_MODULES = [
    "reproduction.portable",
    "reproduction.release.manifest",
    "reproduction.release.pack",
    "reproduction.release.verify",
    "reproduction.release.restore",
    "reproduction.release.hub",
    "reproduction.checks.report",
]
HEAVY = ["torch", "ray", "transformers", "pyarrow", "numpy"]
GLOBAL_FLAGS = ["-q", "--no-progress", "--debug", "--json"]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    return small_bundle(tmp_path_factory.mktemp("cli"))


def test_control_plane_imports_no_pipeline_library():
    """Every control-plane module imports (a missing one is a failure, not a skip) and pulls in no
    pipeline library."""
    code = (
        "import importlib, sys\n"
        f"for m in {CONTROL_MODULES!r}:\n"
        "    importlib.import_module(m)\n"
        f"bad = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"control plane imported {out.stdout.strip()}"


def test_help_is_fast_and_lists_commands():
    """`--help` lists every command and loads no heavy library. Fast is asserted by what it imports, not by
    a wall-clock limit (the machines are noisy; bench/ measures time)."""
    code = (
        "import runpy, sys\n"
        f"sys.argv = [{str(SCRIPT)!r}, '--help']\n"
        "try:\n"
        f"    runpy.run_path({str(SCRIPT)!r}, run_name='__main__')\n"
        "except SystemExit as exc:\n"
        "    assert exc.code in (0, None), exc.code\n"
        f"bad = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print('HEAVY=' + ','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    for command in ("pack", "verify", "restore", "check", "publish", "fetch", "run", "demo"):
        assert command in out.stdout
    assert out.stdout.strip().splitlines()[-1] == "HEAVY=", f"--help imported {out.stdout.strip().splitlines()[-1]}"


def _console_script() -> Path:
    """The installed `portable` console script next to this interpreter (pip puts it there)."""
    entry = [ep for ep in metadata.entry_points(group="console_scripts") if ep.name == "portable"]
    assert entry, "the `portable` console script is not installed: pip install -e . (see the README)"
    assert entry[0].value == "reproduction.portable:main", entry[0].value
    found = Path(sys.executable).parent / "portable"
    if not found.is_file():
        found = Path(shutil.which("portable") or "portable")
    assert found.is_file(), f"`portable` console script not found next to {sys.executable} or on PATH"
    return found


@pytest.mark.parametrize(
    "argv", [["--help"], ["verify", "--help"], ["check", "--help"], ["verify", "/nonexistent/bundle"], ["run"]]
)
def test_script_and_console_entry_are_the_same_program(argv, tmp_path):
    """`python3 reproduction/portable.py ARGS` and the console script print the same bytes and exit
    with the same code (both run this checkout's `reproduction`, PYTHONPATH pointing here)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "PORTABLE_NO_PROGRESS": "1"}
    by_script = subprocess.run(
        [sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    by_entry = subprocess.run([str(_console_script()), *argv], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert by_entry.returncode == by_script.returncode
    assert by_entry.stdout == by_script.stdout
    assert by_entry.stderr == by_script.stderr
    assert (by_script.stdout + by_script.stderr).strip(), "nothing printed: the comparison would prove nothing"
    if argv[0] == "--help":
        assert by_script.stdout.startswith("usage: portable ") and "pack" in by_script.stdout


def test_usage_error_exit_code_is_2():
    out = subprocess.run([sys.executable, str(SCRIPT), "pack"], capture_output=True, text=True)
    assert out.returncode == 2
    assert "SPEC.toml" in out.stderr


@pytest.mark.parametrize("flag", GLOBAL_FLAGS)
def test_global_options_parse_the_same_before_and_after_the_command(flag):
    parser = portable.build_parser()
    before = vars(parser.parse_args([flag, "verify", "B"]))
    after = vars(parser.parse_args(["verify", "B", flag]))
    neither = vars(parser.parse_args(["verify", "B"]))
    assert before == after != neither
    dest = flag.lstrip("-").replace("-", "_") if flag != "-q" else "quiet"
    assert before[dest] is True and neither[dest] is False


def test_no_progress_before_the_command_turns_bars_off():
    args = portable.build_parser().parse_args(["--no-progress", "restore", "B"])
    assert options_from_args(args).progress is False
    args = portable.build_parser().parse_args(["-q", "restore", "B"])
    assert options_from_args(args).quiet is True


@pytest.mark.parametrize("order", ["before", "after"])
def test_quiet_and_json_work_on_either_side(bundle, order):
    args = ["-q", "--json", "verify", bundle] if order == "before" else ["verify", bundle, "-q", "--json"]
    done = run_cli(*args)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # -q: no talk
    report = json.loads(done.stdout)  # --json: stdout is one JSON document and nothing else
    assert report["exit_code"] == 0


@pytest.mark.parametrize("order", ["before", "after"])
def test_debug_shows_the_traceback_on_either_side(order):
    args = ["--debug", "verify", "/nonexistent/b"] if order == "before" else ["verify", "/nonexistent/b", "--debug"]
    done = run_cli(*args)
    assert "Traceback (most recent call last)" in done.stderr and "InputNotFoundError" in done.stderr
    plain = run_cli("verify", "/nonexistent/b")
    assert "Traceback" not in plain.stderr and plain.stderr.startswith("error: /nonexistent/b does not exist")


@pytest.mark.parametrize("command", ["verify", "restore", "check", "publish"])
def test_a_missing_bundle_is_exit_3_in_every_command(command, tmp_path):
    extra = ["--repo", "me/x"] if command == "publish" else []
    done = run_cli(command, tmp_path / "nope", *extra, env={"HF_HUB_OFFLINE": "1"})
    assert done.returncode == 3, done.stderr
    assert done.stderr.splitlines()[0] == f"error: {tmp_path / 'nope'} does not exist"
    assert done.stderr.splitlines()[1].startswith("hint: ") and done.stdout == ""


def test_json_is_data_on_stdout_for_every_command_that_has_data(bundle, tmp_path):
    restored = tmp_path / "b"
    shutil.copytree(bundle, restored, symlinks=True)
    got = json.loads(run_cli("--json", "restore", restored, "-q").stdout)
    assert got["bundle"] == str(restored) and got["files"] > 0
    packed = run_cli("pack", bundle.parent / "small.toml", "--out", tmp_path / "again", "--json", "-q")
    assert packed.returncode == 0, packed.stderr
    assert json.loads(packed.stdout)["name"] == "small"
    check = run_cli("check", "--device", "cpu", "--json", "-q")  # check's --json without FILE: stdout too
    assert json.loads(check.stdout)["format"] == "recap-portable-check"


def test_check_json_file_is_still_accepted(tmp_path):
    report = tmp_path / "report.json"
    done = run_cli("check", "--device", "cpu", "--json", report, "-q")
    assert done.stdout == "" and json.loads(report.read_text())["format"] == "recap-portable-check"


@pytest.mark.parametrize("command", ["run", "eval"])
def test_a_pipeline_command_without_its_required_flags_is_a_usage_error_not_a_bug(command):
    done = run_cli(command)
    assert done.returncode == 2 and "--output" in done.stderr and "Traceback" not in done.stderr


def test_json_on_a_command_without_data_is_refused():
    done = run_cli("--json", "demo")
    assert done.returncode == 2 and done.stderr.startswith("error: `portable demo` has no JSON output")


def test_an_unexpected_exception_is_exit_1_in_one_line(monkeypatch, capsys):
    def boom(args):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(portable, "cmd_verify", boom)
    assert portable.main(["verify", "/x"]) == 1
    err = capsys.readouterr().err
    assert err.splitlines()[0] == "error: RuntimeError: kaboom" and "Traceback" not in err
    # raised by code outside the package (this test file): named, not called a bug of recap-portable
    assert err.splitlines()[1].startswith(f"hint: raised at {__file__}:") and "outside recap-portable" in err
    with pytest.raises(RuntimeError):
        portable.main(["--debug", "verify", "/x"])


def test_an_unexpected_exception_inside_the_package_is_called_its_bug(monkeypatch, capsys, tmp_path):
    """Only recap-portable's frames between the command and the raise: its bug. (Code of the user's that hands one of
    its helpers a wrong argument is named instead: tests/test_cli_audit50.py.)"""
    from reproduction.ui import human_bytes

    monkeypatch.setattr(portable, "cmd_verify", human_bytes)  # abs(args): a TypeError inside reproduction/ui.py
    assert portable.main(["verify", "/x"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("error: internal error: TypeError:")
    assert err[1] == "hint: this is a bug in recap-portable; rerun with --debug for the traceback and report it"


@pytest.mark.parametrize(
    "argv, module",
    [
        (["run", "--output", "{tmp}/run", "--stages", "returns"], "omegaconf"),
        (["eval", "--checkpoint", "30", "--output", "{tmp}/run"], "omegaconf"),
        (["demo", "--quick", "--output", "{tmp}/demo"], "torch"),
    ],
    ids=["run", "eval", "demo"],
)
def test_a_pipeline_command_on_a_python_without_the_runtime_is_exit_10_and_writes_nothing(argv, module, tmp_path):
    """audit46 newcomer F3: `python3 reproduction/portable.py run|eval|demo` on a Python without the runtime was exit
    1 "internal error ... this is a bug" (and demo left its demo.json behind). `-S`: no site-packages, as on a bare
    server Python."""
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path / "home")}
    args = [a.replace("{tmp}", str(tmp_path / "out")) for a in argv]
    done = subprocess.run(
        [sys.executable, "-S", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert done.returncode == 10, done.stderr
    assert done.stderr.splitlines() == [
        f"error: `portable {argv[0]}` needs the Python package {module!r}, which this Python ({sys.executable}) "
        "does not have",
        "hint: install the runtime (README's quick start): pip install -c constraints.txt torch==2.13.0 -e '.[sim]'; "
        "a Python without it runs only verify, restore, check, compare and lineage",
    ]
    assert not (tmp_path / "out").exists(), "nothing written"


def test_a_package_missing_mid_command_is_exit_10_naming_it(monkeypatch, capsys, tmp_path):
    """A runtime package our code imports that is not installed is a missing dependency (exit 10), not a bug."""
    monkeypatch.setitem(sys.modules, "omegaconf", None)  # as if omegaconf were not installed
    assert portable.main(["run", "--output", str(tmp_path / "run")]) == 10
    assert capsys.readouterr().err.splitlines()[0] == (
        f"error: `portable run` needs the Python package 'omegaconf', which this Python ({sys.executable}) does not "
        "have"
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", ["run", "eval"])
def test_an_override_without_equals_is_exit_4_wherever_it_sits(command, tmp_path, capsys):
    """audit46 newcomer F9: after the options it was argparse's exit 2 with the top-level usage, before them exit 4
    naming it; now exit 4 naming it in both places."""
    (tmp_path / "b").mkdir()
    head = ["run", str(tmp_path / "b")] if command == "run" else ["eval", "--checkpoint", "3"]
    outputs = []
    for argv in ([*head, "--output", str(tmp_path / "o"), "value.train.lr"], [*head, "value.train.lr", "--output"]):
        if argv[-1] == "--output":
            argv.append(str(tmp_path / "o"))
        assert portable.main(argv) == 4
        outputs.append(capsys.readouterr().err)
    assert outputs[0] == outputs[1]
    assert outputs[0].splitlines() == (
        [
            "error: 'value.train.lr' is neither an option nor a key.path=value override",
            "hint: write config overrides as key.path=value (see docs/config.md)",
        ]
        if command == "run"
        else ["error: override 'value.train.lr' is not key.path=value", "hint: write overrides as key.path=value"]
    )
    assert not (tmp_path / "o").exists()
    with pytest.raises(SystemExit) as usage:  # an unknown option stays a usage error
        portable.main([*head, "--output", str(tmp_path / "o"), "--bogus"])
    assert usage.value.code == 2


def test_errors_that_had_no_hint_have_one(monkeypatch, capsys, tmp_path):
    """audit46 newcomer F10: a missing dataset, a bad --target-step, a spec that is not TOML and an interrupt printed
    an `error:` line alone; the contract is an error and a hint (the next thing to do)."""

    def lines(argv: list[str], code: int) -> list[str]:
        assert portable.main(argv) == code
        return capsys.readouterr().err.splitlines()

    out = str(tmp_path / "run")
    assert lines(
        ["run", "--output", out, "--stages", "returns", "datasets=[{path: /nonexistent/ds, type: sft}]"], 3
    ) == [
        "error: datasets[0].path: dataset /nonexistent/ds does not exist",
        "hint: point it at a dataset folder; a ${BUNDLE}/... path needs the bundle as BUNDLE (portable run BUNDLE)",
    ]
    assert lines(["run", "--output", out, "--target-step", "-5"], 2) == [  # a flag's value: usage (audit47 F12)
        "error: --target-step -5 must be >= 1",
        "hint: pass the optimizer step to train on to, e.g. --target-step 3000",
    ]
    spec = tmp_path / "bad.toml"
    spec.write_text("name = [\n")
    assert lines(["pack", str(spec), "--out", str(tmp_path / "b")], 4) == [
        f"error: {spec}: not valid TOML (Invalid value (at end of document))",
        "hint: fix the TOML syntax there (`portable pack --help` shows the format)",
    ]
    assert not (tmp_path / "run").exists() and not (tmp_path / "b").exists()

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(portable, "cmd_run", interrupted)
    assert lines(["run", "--output", out], 130) == [
        "error: interrupted",
        "hint: rerun it with --resume: completed stages are kept, an interrupted one continues from its last "
        "checkpoint",
    ]


@pytest.mark.parametrize("command", ["verify", "restore"])
def test_no_bundle_given_in_a_checkout_says_so(command, monkeypatch, capsys, tmp_path):
    """audit46 newcomer F20: with no BUNDLE the default is the folder holding reproduction/; in a checkout the error
    was "no bundle manifest" with the hint "pack or fetch it again", which leads nowhere."""
    checkout = tmp_path / "clone"
    (checkout / ".git").mkdir(parents=True)
    (checkout / "reproduction").mkdir()
    monkeypatch.setattr(portable, "_default_bundle", lambda: checkout)
    assert portable.main([command]) == 3
    assert capsys.readouterr().err.splitlines() == [
        f"error: no BUNDLE given, and the folder holding reproduction/ ({checkout}) is a source checkout, not a "
        "bundle (no bundle.json)",
        f"hint: name the bundle folder: portable {command} BUNDLE (one that `portable pack`, `portable fetch` or "
        "`portable demo` made)",
    ]
    (checkout / ".git").rmdir()  # not a checkout: the manifest loader's own words
    assert portable.main([command]) == 3
    assert (
        capsys.readouterr().err.splitlines()[0]
        == f"error: {checkout / 'bundle.json'}: no bundle manifest (bundle.json)"
    )


def test_a_cache_dir_that_is_a_file_is_exit_4_like_any_bad_knob(monkeypatch, capsys, tmp_path):
    """audit46 newcomer F21: PORTABLE_CACHE_DIR naming a file ran every command without a cache and without a word;
    PORTABLE_HUB_BATCH_BYTES=16GiB said only "is not a valid int" (the docs wrote its default as "16 GiB")."""
    (tmp_path / "f").write_text("")
    monkeypatch.setenv("PORTABLE_CACHE_DIR", str(tmp_path / "f" / "cache"))
    assert portable.main(["verify", str(tmp_path)]) == 4
    assert capsys.readouterr().err.splitlines() == [
        f"error: PORTABLE_CACHE_DIR='{tmp_path / 'f' / 'cache'}' lies under the file {tmp_path / 'f'}, not a folder: "
        "no cache can be kept there",
        "hint: point PORTABLE_CACHE_DIR at a folder (it is created when missing), or unset it for "
        f"{Path.home() / '.cache' / 'recap-portable'}",
    ]
    monkeypatch.setenv("PORTABLE_CACHE_DIR", str(tmp_path / "new" / "cache"))  # missing folders are fine
    from reproduction.release.hub_transfer import HubSettings
    from reproduction.settings import check_cache_root

    check_cache_root()
    with pytest.raises(portable.PortableError) as bad:
        HubSettings.from_env({"PORTABLE_HUB_BATCH_BYTES": "16GiB"})
    assert (bad.value.exit_code, bad.value.message, bad.value.hint) == (
        4,
        "PORTABLE_HUB_BATCH_BYTES='16GiB' is not a valid int",
        "unset it or give a number of bytes, without a unit (16 GiB is 17179869184)",
    )


def test_eval_plan_without_numpy_is_exit_10_naming_it(tmp_path):
    """audit46 newcomer F2: `eval --plan` was documented as stdlib only, but its exact power search imports numpy: on a
    bare Python it was exit 1 "internal error". docs/architecture.md now says it needs numpy; without it, exit 10."""
    done = subprocess.run(
        [sys.executable, "-S", str(SCRIPT), "eval", "--plan", "--rate", "0.5"],
        capture_output=True,
        text=True,
        env={"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)},
        timeout=120,
        check=False,
    )
    assert done.returncode == 10, done.stderr
    assert done.stderr.splitlines()[0] == (
        f"error: `portable eval` needs the Python package 'numpy', which this Python ({sys.executable}) does not have"
    )


def test_compare_with_a_folder_holding_no_evidence_is_exit_3(tmp_path, capsys):
    """audit46 newcomer F13: exit 2 (usage) for a folder with no eval_*.json; a missing evidence file is exit 3."""
    (tmp_path / "m").mkdir()
    actual = tmp_path / "a.json"
    actual.write_text("{}")
    assert portable.main(["compare", str(tmp_path / "m"), str(actual)]) == 3
    assert capsys.readouterr().err.splitlines() == [
        f"error: {tmp_path / 'm'} holds no eval_*.json evidence",
        "hint: pass an evidence file",
    ]
