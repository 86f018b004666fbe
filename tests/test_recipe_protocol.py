"""The recipe protocol held against the recipe, as an outside researcher's recipe gets it wrong: a stage name that
is no plain folder name (the runner clears a stage's folder before a fresh run: `../x` cleared a folder outside the
run), a stage that calls sys.exit (it became `portable run`'s exit code, 0 included), returns no StageOutput or an
output outside its folder, a misspelt config section or code module (keyed as nothing: a change to the real one
went unseen on --resume), an input without a fingerprint, a restarted stage whose dependents' code changed too, a
deleted lineage statement, an Enum in the config."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest

from reproduction.errors import (
    ConfigError,
    MissingDependencyError,
    RunStateError,
    StageKeyChangedError,
    StageProtocolError,
)
from reproduction.recipe import Recipe, StageContext, StageOutput, StageSpec
from reproduction.run.lineage_check import verify_lineage
from reproduction.run.record import make_recorder
from reproduction.run.runner import RunOptions, read_state, run_recipe

REPO = Path(__file__).resolve().parent.parent


@dataclass(kw_only=True, slots=True)
class Train:
    lr: float = 0.5


@dataclass(kw_only=True, slots=True)
class Cfg:
    train: Train = field(default_factory=Train)
    mode: str = "ok"


def write(ctx: StageContext) -> StageOutput:
    out = ctx.out_dir / "out.txt"
    out.write_text(f"{ctx.config.train.lr} {ctx.config.mode}\n")
    mode = ctx.config.mode
    if mode == "exit0":
        sys.exit(0)
    if mode == "none":
        return None
    if mode == "tuple_key":
        return StageOutput(files=[out], summary={("a", 1): 2})
    if mode == "link_out":
        target = ctx.run_dir.parent / "outside.txt"
        target.write_text("not the stage's\n")
        (ctx.out_dir / "link.txt").symlink_to(target)
    if mode == "not_a_file":
        return StageOutput(files=[ctx.out_dir / "never-written.txt"])
    if mode in PLACEMENTS:
        return StageOutput(files=[out], **PLACEMENTS[mode]())
    if mode == "diverged":
        return StageOutput(files=[out], summary={"loss": float("nan"), "curve": [1.0, float("inf")], "g": -math.inf})
    return StageOutput(files=[out], summary={"lr": ctx.config.train.lr})


API_KEY = "s3cr3t-value-123"  # the value of MY_API_KEY in the tests that set it
HF = "hf_" + "Q7rT2" * 7
PLACEMENTS = {  # mode -> StageOutput's world_size / device (callables: numpy and torch are imported when used)
    "ws_four": lambda: {"world_size": "four"},
    "ws_float": lambda: {"world_size": 2.7},
    "ws_true": lambda: {"world_size": True},
    "ws_neg": lambda: {"world_size": -3},
    "ws_zero": lambda: {"world_size": 0},
    "ws_none": lambda: {"world_size": None},
    "ws_numpy": lambda: {"world_size": __import__("numpy").int64(2)},
    "dev_torch": lambda: {"world_size": 2, "device": __import__("torch").device("cpu")},
    "dev_none": lambda: {"device": None},
    "dev_secret": lambda: {"device": f"cuda:0 {API_KEY} {HF}"},
}


def steal(ctx: StageContext) -> StageOutput:
    return StageOutput(files=[ctx.run_dir / "first" / "out.txt"])


def spec(name: str = "first", **kw) -> StageSpec:
    return StageSpec(name=name, fn=f"{__name__}:write", config=kw.pop("config", ("train", "mode")), inputs=False, **kw)


def recipe(*stages: StageSpec, **kw) -> Recipe:
    return Recipe(name="proto", stages=stages or (spec(),), **kw)


@pytest.mark.parametrize("name", ["../precious", "/abs/path", ".", "..", "run.json", "a/b", "", ".hidden"])
def test_a_stage_name_that_is_no_plain_folder_name_is_refused_when_the_recipe_is_built(name):
    with pytest.raises(ConfigError, match="is not a plain folder name") as err:
        recipe(spec(name))
    assert err.value.exit_code == 4 and repr(name) in str(err.value)


@pytest.mark.parametrize("name", ["lineage", "evidence", "plots", "eval_checkpoint"])
def test_a_stage_named_after_a_folder_every_run_has_is_refused(name):
    with pytest.raises(ConfigError, match="a folder every run folder has"):
        recipe(spec(name))


def test_plain_stage_names_are_accepted():
    assert [s.name for s in recipe(spec("a-b_1"), spec("Eval2")).stages] == ["a-b_1", "Eval2"]


def _status(run: Path, stage: str = "first") -> dict:
    return json.loads((run / "run.json").read_text())["stages"][stage]


@pytest.mark.parametrize(
    ("mode", "words"),
    [
        ("exit0", "called sys.exit(0) at "),
        ("none", "returned NoneType, not a StageOutput"),
        ("tuple_key", "returned a summary run.json cannot hold"),
        ("link_out", "link.txt (a link to "),
        ("not_a_file", "never-written.txt among its files, which is not a file"),
    ],
)
def test_a_stage_that_breaks_the_protocol_is_exit_54_and_recorded_failed(tmp_path, mode, words):
    run = tmp_path / "run"
    with pytest.raises(StageProtocolError) as err:
        run_recipe(recipe(), Cfg(mode=mode), run)
    assert err.value.exit_code == 54 and words in str(err.value) and "stage first" in str(err.value)
    rec = _status(run)
    assert rec["status"] == "failed" and rec["error"].startswith("StageProtocolError: stage first")
    if mode == "exit0":  # the file and line of the sys.exit call
        assert f"{__file__}:" in str(err.value)
    # --resume with the stage mended runs it again
    report = run_recipe(recipe(), Cfg(mode="ok"), run, RunOptions(resume=True))
    assert [s.action for s in report.stages] == ["ran"] and _status(run)["status"] == "complete"


def test_a_nan_in_a_summary_is_recorded_as_a_string_strict_json_readers_accept(tmp_path):
    """Python writes NaN and Infinity as bare words that strict JSON readers refuse: a diverged loss made run.json
    and the stage's lineage statement unreadable outside Python."""
    run = tmp_path / "run"
    report = run_recipe(recipe(), Cfg(mode="diverged"), run, RunOptions(recorder=make_recorder(None)))
    want = {"loss": "nan", "curve": [1.0, "inf"], "g": "-inf"}
    assert report.stages[0].output.summary == want

    def strict(word: str):
        raise AssertionError(f"{word} in a JSON file")

    assert json.loads((run / "run.json").read_text(), parse_constant=strict)["stages"]["first"]["summary"] == want
    statement = json.loads((run / "lineage" / "first.intoto.json").read_text(), parse_constant=strict)
    assert "nan" in json.dumps(statement)


def test_sys_exit_0_in_a_stage_is_not_the_commands_exit_code(tmp_path):
    """Before: `portable run` exited 0, printing nothing, the stage left `interrupted`."""
    (tmp_path / "exiting.py").write_text(
        textwrap.dedent(
            """
            import sys
            from dataclasses import dataclass
            from reproduction.recipe import Recipe, StageSpec

            @dataclass
            class Cfg:
                n: int = 1

            def stage(ctx):
                sys.exit(0)

            RECIPE = Recipe(name="exiting", config_schema="exiting:Cfg",
                            stages=(StageSpec(name="s", fn="exiting:stage", config=("n",), inputs=False),))
            """
        )
    )
    (tmp_path / "c.yaml").write_text("recipe: exiting:RECIPE\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path)])}
    proc = subprocess.run(
        [sys.executable, "-m", "reproduction.portable", "run", "--config", "c.yaml", "--output", "r"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 54, proc.stderr
    assert f"error: stage s (exiting:stage) called sys.exit(0) at {tmp_path / 'exiting.py'}:" in proc.stderr
    assert _status(tmp_path / "r", "s")["status"] == "failed"


def test_a_stage_returning_another_stages_file_is_refused(tmp_path):
    """Before: the file moved silently from first's record to second's (run.json and lineage then said second
    wrote first's output)."""
    thief = StageSpec(name="second", fn=f"{__name__}:steal", needs=("first",), inputs=False)
    run = tmp_path / "run"
    with pytest.raises(StageProtocolError, match=r"output .*first/out.txt is stage first's file, outside its folder"):
        run_recipe(recipe(spec(), thief), Cfg(), run)
    assert list(_status(run)["outputs"]) == ["out.txt"]


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"config": ("trian",)}, "declares config key 'trian'"),
        ({"config": ("train.rate",)}, "declares config key 'train.rate'"),
        ({"files": ("reference",)}, "declares files key 'reference'"),
        ({"training": "train.steps"}, "declares training key 'train.steps'"),
    ],
)
def test_a_declared_key_the_config_lacks_is_a_config_error_before_anything_is_written(tmp_path, kw, words):
    """Before: `trian` was keyed as None; a changed train.lr then resumed as `skipped` over the old result."""
    run = tmp_path / "run"
    with pytest.raises(ConfigError, match=words) as err:
        run_recipe(recipe(spec(**kw)), Cfg(), run)
    assert "stage first" in str(err.value) and "top-level keys: mode, train" in str(err.value)
    assert not run.exists()


@pytest.mark.parametrize("module", ["no_such_module_x", "no_such_pkg_x.sub"])
def test_a_code_module_that_cannot_be_found_is_a_config_error(tmp_path, module):
    """Named with the stage and the recipe, before anything is written (audit50_B F10: it left a folder with a lock)."""
    with pytest.raises(ConfigError, match=f"recipe proto: stage first declares code module '{module}', which cannot"):
        run_recipe(recipe(spec(code=(module,))), Cfg(), tmp_path / "run")
    assert not (tmp_path / "run").exists()


class Opened:
    def __init__(self, fail: bool) -> None:
        self.fail = fail

    @property
    def fingerprint(self) -> str:
        if self.fail:
            return self.missing_attribute  # the recipe's own bug, inside the property
        return "fp"


def opened_inputs(config):
    return {"data": Opened(config.mode == "fp_raises")} if config.mode != "no_fp" else {"data": object()}


def opened_list(config):
    return [Opened(False)]


def preflight_none(config, run_dir, opened, stages):
    return None


def test_an_input_without_a_fingerprint_is_refused_and_a_fingerprint_that_raises_is_not_hidden(tmp_path):
    keyed = recipe(dataclasses.replace(spec(), inputs=True), open_inputs=f"{__name__}:opened_inputs")
    with pytest.raises(ConfigError, match="opened input 'data' \\(object\\) has no fingerprint"):
        run_recipe(keyed, Cfg(mode="no_fp"), tmp_path / "a")
    with pytest.raises(AttributeError, match="missing_attribute"):  # before: keyed as None, data changes unseen
        run_recipe(keyed, Cfg(mode="fp_raises"), tmp_path / "b")


def test_open_inputs_and_preflight_returning_the_wrong_kind_are_named(tmp_path):
    with pytest.raises(StageProtocolError, match="open_inputs .*:opened_list returned list, not a dict"):
        run_recipe(recipe(open_inputs=f"{__name__}:opened_list"), Cfg(), tmp_path / "a")
    with pytest.raises(StageProtocolError, match="preflight .*:preflight_none returned NoneType, not a list"):
        run_recipe(recipe(preflight=f"{__name__}:preflight_none"), Cfg(), tmp_path / "b")


def test_restart_stage_redoes_the_stages_after_it_whatever_else_changed_in_their_keys(tmp_path, monkeypatch):
    """Both stages pin the recipe's module; after an edit to it, the hint says `--restart-stage first` redoes it
    "and what follows": before, first was redone and second then refused (exit 52), naming the code change."""
    lib = tmp_path / "lib"
    lib.mkdir()
    module = lib / "protomod.py"
    module.write_text("VERSION = 1\n")
    monkeypatch.syspath_prepend(str(lib))
    code = ("protomod",)
    two = recipe(spec(code=code), spec("second", needs=("first",), code=code))
    run = tmp_path / "run"
    run_recipe(two, Cfg(), run)
    module.write_text("VERSION = 2  # edited\n")
    os.utime(module, ns=(1, 1))  # another size and mtime: the digest cache rehashes it
    sys.modules.pop("protomod", None)
    from reproduction.errors import StageKeyChangedError

    with pytest.raises(StageKeyChangedError, match="code.protomod") as err:
        run_recipe(two, Cfg(), run, RunOptions(resume=True))
    assert "--restart-stage first to redo it (and what follows)" in err.value.hint
    report = run_recipe(two, Cfg(), run, RunOptions(resume=True, restart=["first"]))
    assert [(s.name, s.action) for s in report.stages] == [("first", "ran"), ("second", "ran")]
    report = run_recipe(two, Cfg(), run, RunOptions(resume=True))
    assert [s.action for s in report.stages] == ["skipped", "skipped"]


def test_lineage_verify_names_a_complete_stage_whose_statement_is_gone(tmp_path):
    run = tmp_path / "run"
    run_recipe(recipe(spec(), spec("second", needs=("first",))), Cfg(), run, RunOptions(recorder=make_recorder(None)))
    assert verify_lineage(run).exit_code == 0
    (run / "lineage" / "second.intoto.json").unlink()
    report = verify_lineage(run)
    assert report.exit_code == 11
    assert [str(p) for p in report.problems] == [
        "missing: lineage/second.intoto.json (stage second is complete in run.json, its statement is gone)"
    ]


def test_resume_writes_a_lost_statement_again_with_the_bytes_the_run_wrote(tmp_path, capsys):
    """Before: a complete stage whose statement was deleted stayed so (lineage --verify: exit 11) until
    --restart-stage redid it. --resume now writes it again from run.json (the command line, world size, device and
    versions of the run that wrote it are kept there), byte for byte; a statement that is there is left alone."""
    two = recipe(spec(), spec("second", needs=("first",)))
    run = tmp_path / "run"
    run_recipe(two, Cfg(), run, RunOptions(argv=["portable", "run", "--token", "s3cret"], recorder=make_recorder(None)))
    first, second = run / "lineage" / "first.intoto.json", run / "lineage" / "second.intoto.json"
    written, first_mtime = second.read_bytes(), first.stat().st_mtime_ns
    second.unlink()
    capsys.readouterr()
    report = run_recipe(
        two, Cfg(), run, RunOptions(resume=True, argv=["portable", "run", "--resume"], recorder=make_recorder(None))
    )
    assert [(s.name, s.action) for s in report.stages] == [("first", "skipped"), ("second", "skipped")]
    assert capsys.readouterr().err == (
        "second: its lineage statement lineage/second.intoto.json was missing; written again from run.json\n"
    )
    assert second.read_bytes() == written
    assert first.stat().st_mtime_ns == first_mtime
    assert verify_lineage(run).exit_code == 0
    recorded = json.loads((run / "run.json").read_text())["stages"]["second"]["lineage"]
    assert recorded["argv"] == [
        "portable",
        "run",
        "--token",
        "<redacted>",
    ]  # run.json holds no secret the statement hides


def test_a_run_of_other_stages_writes_a_left_out_stages_lost_statement_again(tmp_path, capsys):
    """Before: `--stages second --resume` with first's statement lost neither wrote it again nor named it (lineage
    --verify found it: exit 11). Written again when first's key and outputs match run.json; named in one line with
    the command that redoes it when its outputs changed."""
    two = recipe(spec(), spec("second", needs=("first",)))
    run = tmp_path / "run"
    run_recipe(two, Cfg(), run, RunOptions(recorder=make_recorder(None)))
    first = run / "lineage" / "first.intoto.json"
    written = first.read_bytes()
    first.unlink()
    capsys.readouterr()
    report = run_recipe(two, Cfg(), run, RunOptions(resume=True, stages=["second"], recorder=make_recorder(None)))
    assert [(s.name, s.action) for s in report.stages] == [("second", "skipped")]
    assert capsys.readouterr().err == (
        "first: its lineage statement lineage/first.intoto.json was missing; written again from run.json\n"
    )
    assert first.read_bytes() == written
    assert verify_lineage(run).exit_code == 0
    first.unlink()
    (run / "first" / "out.txt").write_text("edited by hand\n")
    run_recipe(two, Cfg(), run, RunOptions(resume=True, stages=["second"], recorder=make_recorder(None)))
    assert capsys.readouterr().err == (
        "first: its lineage statement lineage/first.intoto.json is missing and cannot be written again (its outputs "
        "changed after it completed); --restart-stage first redoes the stage and writes it\n"
    )
    assert not first.exists()


def test_a_lost_statement_of_a_record_that_keeps_no_lineage_is_named_not_guessed(tmp_path, capsys):
    """A run.json written before stage records kept `lineage` cannot give the statement's command line, world size,
    device or versions: --resume says so and names the command that writes it, and writes nothing."""
    run = tmp_path / "run"
    run_recipe(recipe(), Cfg(), run, RunOptions(recorder=make_recorder(None)))
    doc = json.loads((run / "run.json").read_text())
    del doc["stages"]["first"]["lineage"]
    (run / "run.json").write_text(json.dumps(doc))
    (run / "lineage" / "first.intoto.json").unlink()
    capsys.readouterr()
    run_recipe(recipe(), Cfg(), run, RunOptions(resume=True, recorder=make_recorder(None)))
    assert capsys.readouterr().err == (
        "first: its lineage statement lineage/first.intoto.json is missing and cannot be written again (run.json "
        "predates it); --restart-stage first redoes the stage and writes it\n"
    )
    assert not (run / "lineage" / "first.intoto.json").exists()


class Color(enum.Enum):
    RED = "red"


@dataclass(kw_only=True, slots=True)
class EnumCfg:
    train: Train = field(default_factory=Train)
    mode: str = "ok"
    color: Color = Color.RED


def test_an_enum_in_the_config_is_recorded_in_the_lineage_as_in_run_json(tmp_path):
    """Before: the stage completed, then its statement failed with "Color is not JSON serializable" (exit 1)."""
    run = tmp_path / "run"
    run_recipe(recipe(), EnumCfg(), run, RunOptions(recorder=make_recorder(None)))
    assert verify_lineage(run).exit_code == 0
    # by its name, as a config file writes it (it was Python's str, "Color.RED", which --config refuses: audit62 B7)
    assert json.loads((run / "run.json").read_text())["config"]["color"] == "RED"


def test_a_recipe_module_importing_a_missing_package_is_a_missing_dependency(tmp_path, monkeypatch):
    from reproduction.run.resolve import resolve_recipe

    (tmp_path / "needsdep.py").write_text("import no_such_dependency_xyz\n")
    (tmp_path / "exitsonimport.py").write_text("import sys\nsys.exit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(MissingDependencyError, match="imports 'no_such_dependency_xyz', which is not installed") as e:
        resolve_recipe("needsdep:RECIPE")
    assert e.value.exit_code == 10
    with pytest.raises(ConfigError, match="cannot be imported: SystemExit: 3"):
        resolve_recipe("exitsonimport:RECIPE")
    with pytest.raises(ConfigError, match="is not a built-in recipe"):
        resolve_recipe("no_such_recipe_xyz")


def test_a_config_object_that_is_no_dataclass_skips_the_declaration_check(tmp_path):
    """A recipe run by code with a config object of its own: nothing to check the declarations against."""
    cfg = SimpleNamespace(train=SimpleNamespace(lr=0.5), mode="ok")
    report = run_recipe(recipe(spec(config=("trian",))), cfg, tmp_path / "run")
    assert [s.action for s in report.stages] == ["ran"]


def test_a_stage_whose_upstream_was_redone_in_an_earlier_run_is_redone_on_resume(tmp_path):
    """README's "train further" form: `--stages policy --target-step N` redoes policy alone; the next `--resume`
    refused eval (exit 52, "upstream.policy changed") and lineage --verify failed on eval's stale statement."""
    two = recipe(spec(), StageSpec(name="second", fn=f"{__name__}:write", needs=("first",), inputs=False))
    run = tmp_path / "run"
    record = RunOptions(recorder=make_recorder(None))
    run_recipe(two, Cfg(), run, record)
    again = RunOptions(stages=["first"], restart=["first"], resume=True, recorder=make_recorder(None))
    run_recipe(two, Cfg(train=Train(lr=0.7)), run, again)
    assert verify_lineage(run).exit_code == 14  # second's statement names first's old output
    report = run_recipe(two, Cfg(train=Train(lr=0.7)), run, RunOptions(resume=True, recorder=make_recorder(None)))
    assert [(s.name, s.action) for s in report.stages] == [("first", "skipped"), ("second", "ran")]
    assert verify_lineage(run).exit_code == 0


def test_a_recipe_without_stages_is_refused():
    with pytest.raises(ConfigError, match="recipe empty: it declares no stages"):
        Recipe(name="empty", stages=())


def test_an_os_error_raised_in_the_users_code_names_where(monkeypatch, capsys, tmp_path):
    """An OSError from a recipe's own file access was "cannot read a file ...; rerun with --debug" (exit 3) with no
    word of whose code read it; it is the user's exception, exit 1 naming its line as docs/recipes.md says (audit50
    F6; tests/test_cli_audit50.py)."""
    from reproduction import portable

    def reads_a_missing_file(args):
        open(tmp_path / "absent.txt").read()  # noqa: SIM115 - the user's code, as it might be written

    monkeypatch.setattr(portable, "cmd_verify", reads_a_missing_file)
    assert portable.main(["verify", str(tmp_path)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert "absent.txt" in err[0]
    assert (
        err[1].startswith(f"hint: raised at {__file__}:") and "(reads_a_missing_file), outside recap-portable" in err[1]
    )


def test_a_stop_after_the_statement_leaves_the_stage_to_redo_not_complete_without_a_statement(tmp_path):
    """The kill sweep's window: run.json said `complete` before the lineage statement was written, so a kill between
    the two left a complete stage with no statement that no --resume wrote again (lineage --verify: exit 11). The
    statement now comes first; a stop right after it leaves the stage not complete, and --resume redoes it."""
    record = make_recorder(None)
    calls = []

    def record_then_stop(rec):
        record(rec)
        calls.append(rec.stage)
        if rec.stage == "second":
            raise KeyboardInterrupt  # what a kill at this moment leaves on disk, less the running record's status

    two = recipe(spec(), spec("second", needs=("first",)))
    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run_recipe(two, Cfg(), run, RunOptions(recorder=record_then_stop))
    assert (run / "lineage" / "second.intoto.json").is_file() and _status(run, "second")["status"] == "interrupted"
    report = run_recipe(two, Cfg(), run, RunOptions(resume=True, recorder=make_recorder(None)))
    assert [(s.name, s.action) for s in report.stages] == [("first", "skipped"), ("second", "ran")]
    assert verify_lineage(run).exit_code == 0


def temp_named(ctx: StageContext) -> StageOutput:
    """A stage whose outputs are named like the runner's temp files: its own, kept (audit45 recipes F1, F2)."""
    names = [f".data.{ctx.config.train.lr:.0f}.zzzzzzzz.portable-tmp", ".x.99999999999999999999.abcdefgh.portable-tmp"]
    for name in names:
        (ctx.out_dir / name).write_text("the stage's\n")
    return StageOutput(files=[ctx.out_dir / n for n in names])


def test_resume_removes_the_temp_files_a_killed_write_left_and_nothing_else(tmp_path, capsys):
    """A kill in the middle of an atomic write (run.json, evidence, a statement, a stage's output) left its temp file
    in the run folder for good; `--resume` removes those of writers that are gone (the kill sweep, audit45), and
    says so: never a recorded output or a file of the user's named like one."""
    import subprocess

    run = tmp_path / "run"
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True).stdout)
    own = StageSpec(name="own", fn=f"{__name__}:temp_named", config=("train",), inputs=False)
    both = Recipe(name="proto", stages=(spec(), own))
    run_recipe(both, Cfg(train=Train(lr=float(dead))), run, RunOptions(recorder=make_recorder(None)))
    left = [
        run / f".run.json.{dead}.q1w2e3r4.portable-tmp",
        run / "lineage" / f".first.intoto.json.{dead}.abcdefgh.portable-tmp",
        run / "first" / f".out.txt.{dead}.zzzz_zzz.portable-tmp",
    ]
    for path in left:
        path.write_text("half")
    # a user's files beside the stages: one in a stage folder that its outputs globs match is an added output, which
    # --resume refuses (audit58 B2, tests/test_outputs_added_audit58.py)
    mine = [run / "notes.tmp", run / f".notes.{dead}.abcdefgh.tmp"]
    for path in mine:
        path.write_text("mine")
    capsys.readouterr()
    report = run_recipe(
        both, Cfg(train=Train(lr=float(dead))), run, RunOptions(resume=True, recorder=make_recorder(None))
    )
    assert [s.action for s in report.stages] == ["skipped", "skipped"]
    assert not any(p.exists() for p in left) and all(p.read_text() == "mine" for p in mine)
    assert sorted(p.name for p in (run / "own").iterdir()) == sorted(
        [f".data.{dead}.zzzzzzzz.portable-tmp", ".x.99999999999999999999.abcdefgh.portable-tmp"]
    )
    err = capsys.readouterr().err
    assert "removed 3 temp file(s) that a killed write left: " in err and ".run.json." in err


def _statement(run: Path, stage: str = "first") -> dict:
    doc = json.loads((run / "lineage" / f"{stage}.intoto.json").read_text())
    return doc["predicate"]["buildDefinition"]["internalParameters"]


def test_a_secret_in_the_device_is_redacted_in_the_statement_as_in_run_json(tmp_path, monkeypatch):
    """Before: a device string holding a token (an environment secret's value, an hf_ token) was written as it was
    into the statement's internalParameters.device (run.json's copy was redacted), and a statement written again
    from run.json then differed from the one the run wrote (audit45 #3)."""
    monkeypatch.setenv("MY_API_KEY", API_KEY)
    run = tmp_path / "run"
    run_recipe(recipe(), Cfg(mode="dev_secret"), run, RunOptions(recorder=make_recorder(None)))
    statement = run / "lineage" / "first.intoto.json"
    written = statement.read_bytes()
    assert _statement(run)["device"] == "cuda:0 <redacted> <redacted>"
    assert _status(run)["lineage"]["device"] == "cuda:0 <redacted> <redacted>"
    assert API_KEY.encode() not in written and HF.encode() not in written
    statement.unlink()
    run_recipe(recipe(), Cfg(mode="dev_secret"), run, RunOptions(resume=True, recorder=make_recorder(None)))
    assert statement.read_bytes() == written


def test_a_secret_in_a_version_string_is_redacted_in_the_statement_as_in_run_json(tmp_path, monkeypatch):
    """Before: the versions were written into the statement as the recorder found them while run.json's copy was
    redacted: a secret in one (an environment secret's value, an hf_ token) reached the statement, and a statement
    written again from run.json then differed from the one the run wrote."""
    from reproduction.run import lineage

    monkeypatch.setenv("MY_API_KEY", API_KEY)
    monkeypatch.setattr(lineage, "runtime_versions", lambda: {"python": f"3.11 {API_KEY}", "torch": f"2.13 {HF}"})
    run = tmp_path / "run"
    run_recipe(recipe(), Cfg(), run, RunOptions(recorder=make_recorder(None)))
    statement = run / "lineage" / "first.intoto.json"
    written = statement.read_bytes()
    assert _statement(run)["versions"] == {"python": "3.11 <redacted>", "torch": "2.13 <redacted>"}
    assert _status(run)["lineage"]["versions"] == [["python", "3.11 <redacted>"], ["torch", "2.13 <redacted>"]]
    assert API_KEY.encode() not in written and HF.encode() not in written
    statement.unlink()
    run_recipe(recipe(), Cfg(), run, RunOptions(resume=True, recorder=make_recorder(None)))
    assert statement.read_bytes() == written
    assert verify_lineage(run).exit_code == 0


@pytest.mark.parametrize("mode", ["ws_four", "ws_float", "ws_true", "ws_neg", "ws_zero", "ws_none"])
def test_a_world_size_that_is_no_integer_of_at_least_1_is_exit_54(tmp_path, mode):
    """Before: "four" failed after the stage with an internal ValueError (exit 1), 2.7 was 2.7 in run.json but 2 in
    the statement, True was true / 1, -3 and 0 were recorded (audit45 #6)."""
    run = tmp_path / "run"
    with pytest.raises(StageProtocolError, match="whose world_size is .*, expected an integer >= 1") as err:
        run_recipe(recipe(), Cfg(mode=mode), run, RunOptions(recorder=make_recorder(None)))
    assert err.value.exit_code == 54 and str(err.value).startswith("recipe proto: stage first (")
    assert _status(run)["status"] == "failed" and not (run / "lineage" / "first.intoto.json").exists()


@pytest.mark.parametrize(
    ("mode", "world_size", "device"), [("ws_numpy", 2, "cpu"), ("dev_torch", 2, "cpu"), ("dev_none", 1, None)]
)
def test_a_numpy_world_size_and_a_torch_device_are_recorded_alike_in_run_json_and_the_statement(
    tmp_path, mode, world_size, device
):
    """Before: numpy.int64(2) was the string "2" in run.json (and 2 in the statement), which --resume then read."""
    if mode != "dev_none":
        pytest.importorskip("numpy" if mode == "ws_numpy" else "torch")
    run = tmp_path / "run"
    report = run_recipe(recipe(), Cfg(mode=mode), run, RunOptions(recorder=make_recorder(None)))
    output = report.stages[0].output
    assert (type(output.world_size), output.world_size, output.device) == (int, world_size, device)
    recorded = _status(run)["lineage"]
    assert (recorded["world_size"], recorded["device"]) == (world_size, device)
    assert (_statement(run)["world_size"], _statement(run)["device"]) == (world_size, device)
    statement = run / "lineage" / "first.intoto.json"
    written = statement.read_bytes()
    statement.unlink()
    run_recipe(recipe(), Cfg(mode=mode), run, RunOptions(resume=True, recorder=make_recorder(None)))
    assert statement.read_bytes() == written


def _drop(key):
    return lambda lineage: lineage.pop(key)


def _put(key, value):
    return lambda lineage: lineage.__setitem__(key, value)


@pytest.mark.parametrize(
    ("damage", "field", "words"),
    [
        (lambda lineage: lineage.clear(), "argv", "is missing"),
        (_drop("world_size"), "world_size", "is missing"),
        (_drop("device"), "device", "is missing"),
        (_drop("argv"), "argv", "is missing"),
        (_drop("versions"), "versions", "is missing"),
        (_drop("resumed_from_path"), "resumed_from_path", "is missing"),
        (_drop("config_sha256"), "config_sha256", "is missing"),
        (_put("world_size", "four"), "world_size", "is a string 'four', expected an integer >= 1"),
        (_put("world_size", None), "world_size", "is null, expected an integer >= 1"),
        (_put("world_size", 0), "world_size", "expected an integer >= 1"),
        (_put("device", 5), "device", "expected a string or null"),
        (_put("argv", [1, 2]), "argv", "expected a list of strings"),
        (_put("argv", "portable run"), "argv", "expected a list of strings"),
        (_put("versions", "abc"), "versions", "expected null or a list of [name, version] string pairs"),
        (_put("versions", [[1, 2, 3]]), "versions", "expected null or a list of [name, version] string pairs"),
        (_put("versions", {"python": "3.11"}), "versions", "expected null or a list of [name, version]"),
        (_put("resumed_from_path", 5), "resumed_from_path", "expected a string (a checkpoint's path) or null"),
        (_put("config_sha256", "abc"), "config_sha256", "expected a sha256"),
    ],
)
def test_a_damaged_lineage_record_is_exit_55_naming_the_field(tmp_path, damage, field, words):
    """Before: each of these made a --resume that writes a lost statement again an internal error (exit 1), and an
    empty `lineage` was said to record another config (audit45 #4). run.json's load now names the field."""
    run = tmp_path / "run"
    run_recipe(recipe(), Cfg(), run, RunOptions(recorder=make_recorder(None)))
    doc = json.loads((run / "run.json").read_text())
    damage(doc["stages"]["first"]["lineage"])
    (run / "run.json").write_text(json.dumps(doc))
    (run / "lineage" / "first.intoto.json").unlink()
    with pytest.raises(RunStateError) as err:
        run_recipe(recipe(), Cfg(), run, RunOptions(resume=True, recorder=make_recorder(None)))
    assert err.value.exit_code == 55 and f"stages.first.lineage.{field} " in str(err.value), str(err.value)
    assert words in str(err.value) and "\n" not in str(err.value)


# -- audit47: step types, others' evidence, the stage function in the key, summary values, redone evidence -------

STEPS = {  # mode -> StageOutput's step / resumed_from
    "step_float": ({"step": 5.0}, "step is float 5.0"),
    "step_str": ({"step": "5"}, "step is str '5'"),
    "step_bool": ({"step": True}, "step is bool True"),
    "step_neg": ({"step": -1}, "step is int -1"),
    "resumed_str": ({"step": 5, "resumed_from": "yes"}, "resumed_from is str 'yes'"),
}


def stepper(ctx: StageContext) -> StageOutput:
    out = ctx.out_dir / "out.txt"
    out.write_text("trained\n")
    if ctx.config.mode == "step_numpy":
        return StageOutput(files=[out], step=__import__("numpy").int64(5), resumed_from=__import__("numpy").int32(2))
    return StageOutput(files=[out], **STEPS.get(ctx.config.mode, ({"step": 5},))[0])


def _trained(**kw) -> Recipe:
    return recipe(StageSpec(name="first", fn=f"{__name__}:stepper", config=("mode",), inputs=False, **kw))


@pytest.mark.parametrize("mode", list(STEPS))
def test_a_step_that_is_no_integer_of_at_least_0_is_exit_54_and_nothing_is_recorded_complete(tmp_path, mode):
    """audit47 #1: numpy.int64(5) was recorded as "5", 5.0 and "yes" as they were, and every later read of run.json
    refused the folder (exit 55), --restart-stage included. The line names the recipe first (stop 48: it named only
    the stage, which any recipe may call `first`)."""
    run = tmp_path / "run"
    with pytest.raises(StageProtocolError) as err:
        run_recipe(_trained(), Cfg(mode=mode), run)
    message = str(err.value)
    assert err.value.exit_code == 54
    assert message.startswith(f"recipe proto: stage first ({__name__}:stepper) returned a StageOutput whose"), message
    assert STEPS[mode][1] in message and "expected an integer >= 0 or None" in message and "\n" not in message
    assert "as an int" in err.value.hint
    assert _status(run)["status"] == "failed"
    report = run_recipe(_trained(), Cfg(mode="ok"), run, RunOptions(resume=True))
    assert [s.action for s in report.stages] == ["ran"] and _status(run)["step"] == 5


def test_a_numpy_step_is_recorded_as_an_int(tmp_path):
    pytest.importorskip("numpy")
    run = tmp_path / "run"
    report = run_recipe(_trained(), Cfg(mode="step_numpy"), run)
    assert (type(report.stages[0].output.step), report.stages[0].output.step) == (int, 5)
    rec = _status(run)
    assert (rec["step"], rec["resumed_from"]) == (5, 2)
    assert [s.action for s in run_recipe(_trained(), Cfg(mode="step_numpy"), run, RunOptions(resume=True)).stages] == [
        "skipped"
    ]


@pytest.mark.parametrize(("written", "action", "step"), [("5", "skipped", 5), (5.0, "skipped", 5), ("yes", "ran", 5)])
def test_a_run_folder_whose_record_holds_an_unchecked_step_resumes(tmp_path, written, action, step):
    """audit47 #1: a folder an earlier recap-portable wrote with the stage's step unchecked ("5" from numpy.int64(5),
    5.0, "yes") was refused by every command (exit 55, with a hint to put back the run.json the run wrote): a
    number is read as the int it was, anything else makes the stage one --resume redoes."""
    run = tmp_path / "run"
    run_recipe(_trained(), Cfg(), run)
    doc = json.loads((run / "run.json").read_text())
    doc["stages"]["first"]["step"] = written
    (run / "run.json").write_text(json.dumps(doc))
    report = run_recipe(_trained(), Cfg(), run, RunOptions(resume=True))
    assert [s.action for s in report.stages] == [action]
    rec = read_state(run)["stages"]["first"]  # as every command reads it (a skip writes nothing)
    assert (rec["status"], rec["step"]) == ("complete", step)


def evidence_writer(ctx: StageContext) -> StageOutput:
    """Writes evidence/shared.json (both stages of the test: two eval stages building the same evidence name)."""
    shared = ctx.run_dir / "evidence" / "shared.json"
    shared.parent.mkdir(exist_ok=True)
    shared.write_text(json.dumps({"by": ctx.name}))
    return StageOutput(files=[shared])


def test_a_stage_returning_another_stages_evidence_file_is_exit_54(tmp_path):
    """audit47 #2: the second stage silently took over (and overwrote) the first's evidence file, exit 0; the first
    stayed complete with no outputs and a lineage statement naming bytes no longer there."""
    first = StageSpec(name="first", fn=f"{__name__}:evidence_writer", inputs=False)
    second = StageSpec(name="second", fn=f"{__name__}:evidence_writer", needs=("first",), inputs=False)
    run = tmp_path / "run"
    with pytest.raises(StageProtocolError) as err:
        run_recipe(recipe(first, second), Cfg(), run)
    assert err.value.exit_code == 54
    assert str(err.value) == (
        f"stage second ({__name__}:evidence_writer) returned evidence/shared.json, which is stage first's output"
    )
    assert err.value.hint.startswith("give the file a name of its own") and "--restart-stage first" in err.value.hint
    assert list(_status(run)["outputs"]) == ["../evidence/shared.json"]
    assert _status(run, "second")["status"] == "failed"


def other_write(ctx: StageContext) -> StageOutput:
    out = ctx.out_dir / "out.txt"
    out.write_text("another function\n")
    return StageOutput(files=[out])


def test_a_stage_pointed_at_another_function_is_a_changed_key_on_resume(tmp_path):
    """audit47 #5a: swapping StageSpec.fn went unnoticed (--resume skipped the stage over the old function's output)."""
    run = tmp_path / "run"
    run_recipe(recipe(), Cfg(), run)
    swapped = recipe(dataclasses.replace(spec(), fn=f"{__name__}:other_write"))
    with pytest.raises(StageKeyChangedError) as err:
        run_recipe(swapped, Cfg(), run, RunOptions(resume=True))
    assert err.value.exit_code == 52 and f"fn: {__name__}:write -> {__name__}:other_write" in str(err.value)


def test_a_stage_without_code_modules_keys_its_functions_module(tmp_path):
    """audit47 #5a: a recipe listing no `code` had no code-change detection at all; the function's module is now its
    default."""
    run = tmp_path / "run"
    run_recipe(recipe(), Cfg(), run)
    parts = _status(run)["key_parts"]
    assert parts["fn"] == f"{__name__}:write" and list(parts["code"]) == [__name__]
    assert list(run_recipe(recipe(spec(code=("json",))), Cfg(), tmp_path / "r2").stages[0].output.files)
    # declared modules beside it (audit50_B F2: naming any replaced it, so an edit to the function went unseen)
    assert sorted(_status(tmp_path / "r2")["key_parts"]["code"]) == ["json", __name__]


def test_a_record_written_before_the_function_was_keyed_still_resumes(tmp_path):
    """A run folder today's runs wrote (no `fn` key part, `code` empty) is skipped on --resume, not redone, and its
    record takes today's key."""
    from reproduction.run.stage_keys import digest

    run = tmp_path / "run"
    run_recipe(recipe(), Cfg(), run)
    doc = json.loads((run / "run.json").read_text())
    rec = doc["stages"]["first"]
    today = rec["key"]
    del rec["key_parts"]["fn"]
    rec["key_parts"]["code"] = {}
    rec["key"] = digest(rec["key_parts"])
    (run / "run.json").write_text(json.dumps(doc))
    report = run_recipe(recipe(), Cfg(), run, RunOptions(resume=True))
    assert [s.action for s in report.stages] == ["skipped"] and _status(run)["key"] == today
    # a real change is still named, and without a spurious line for the parts the old record lacked
    doc = json.loads((run / "run.json").read_text())
    del doc["stages"]["first"]["key_parts"]["fn"]
    doc["stages"]["first"]["key_parts"]["code"] = {}
    doc["stages"]["first"]["key"] = digest(doc["stages"]["first"]["key_parts"])
    (run / "run.json").write_text(json.dumps(doc))
    with pytest.raises(StageKeyChangedError) as err:
        run_recipe(recipe(), Cfg(train=Train(lr=0.25)), run, RunOptions(resume=True))
    assert err.value.changes == ["config.train.lr: 0.5 -> 0.25"]


@pytest.mark.parametrize(
    ("fn", "why"),
    [
        (f"{__name__}:wirte", f"module '{__name__}' has no attribute 'wirte'"),
        ("no_such_module_x:write", "module 'no_such_module_x' cannot be imported"),
        ("just_a_name", "it is not a 'module:function' reference"),
    ],
)
def test_a_misspelt_stage_function_is_a_config_error_before_anything_runs(tmp_path, fn, why):
    """audit47 #5b: a misspelt fn on the last stage was found after the earlier stages had run, in a line naming no
    stage and giving no hint."""
    last = StageSpec(name="second", fn=fn, needs=("first",), inputs=False)
    run = tmp_path / "run"
    with pytest.raises(ConfigError) as err:
        run_recipe(recipe(spec(), last), Cfg(), run)
    assert err.value.exit_code == 4
    assert str(err.value).startswith(f"recipe proto: stage second's function {fn!r} cannot be loaded: {why}")
    assert "fix the spelling of the StageSpec's fn" in err.value.hint
    assert not run.exists()


@pytest.mark.parametrize(
    ("summary", "where"),
    [
        (lambda: {"obj": object()}, "summary['obj'] is object <object object at"),
        (lambda: {"b": b"xx"}, "summary['b'] is bytes b'xx'"),
        (lambda: {"deep": [1, {"s": {1, 2}}]}, "summary['deep'][1]['s'] is set {1, 2}"),
    ],
)
def test_a_summary_value_json_cannot_hold_is_exit_54_naming_it(tmp_path, monkeypatch, summary, where):
    """audit47 #8: such values were recorded as their str() (an object's repr differs from run to run), exit 0."""
    monkeypatch.setitem(PLACEMENTS, "bad_summary", lambda: {"summary": summary()})
    run = tmp_path / "run"
    with pytest.raises(StageProtocolError) as err:
        run_recipe(recipe(), Cfg(mode="bad_summary"), run)
    assert err.value.exit_code == 54 and "stage first" in str(err.value) and where in str(err.value)
    assert f"stage first ({__name__}:write) returned a summary run.json cannot hold: " in str(err.value)
    assert _status(run)["status"] == "failed"


def test_numpy_numbers_in_a_summary_are_recorded_as_numbers(tmp_path, monkeypatch):
    np = pytest.importorskip("numpy")
    monkeypatch.setitem(
        PLACEMENTS,
        "np_summary",
        lambda: {"summary": {"n": np.int64(3), "f": np.float32(0.5), "ok": np.bool_(True), "l": [np.float64("nan")]}},
    )
    run = tmp_path / "run"
    run_recipe(recipe(), Cfg(mode="np_summary"), run)
    assert _status(run)["summary"] == {"n": 3, "f": 0.5, "ok": True, "l": ["nan"]}


def lr_evidence(ctx: StageContext) -> StageOutput:
    ev = ctx.run_dir / "evidence" / f"eval_{ctx.config.train.lr}.json"
    ev.parent.mkdir(exist_ok=True)
    ev.write_text("{}\n")
    return StageOutput(files=[ev])


def test_a_redone_stage_removes_the_evidence_its_previous_record_listed(tmp_path):
    """audit47 #10: a redone eval left the earlier evidence/eval_*_N.json beside the new one, unrecorded. Files of the
    evidence folder the record did not list (portable eval's, another stage's) are left alone."""
    stage = StageSpec(name="first", fn=f"{__name__}:lr_evidence", config=("train",), inputs=False)
    run = tmp_path / "run"
    run_recipe(recipe(stage), Cfg(), run)
    keep = run / "evidence" / "eval_checkpoint_3.json"
    keep.write_text("{}\n")
    run_recipe(recipe(stage), Cfg(train=Train(lr=0.25)), run, RunOptions(resume=True, restart=["first"]))
    assert sorted(p.name for p in (run / "evidence").iterdir()) == ["eval_0.25.json", "eval_checkpoint_3.json"]
    assert list(_status(run)["outputs"]) == ["../evidence/eval_0.25.json"]


def test_a_folder_of_another_recipe_is_refused_with_a_hint(tmp_path):
    run = tmp_path / "run"
    run_recipe(recipe(), Cfg(), run)
    other = Recipe(name="other", stages=(spec(),))
    with pytest.raises(RunStateError) as err:
        run_recipe(other, Cfg(), run, RunOptions(resume=True))
    assert err.value.exit_code == 55 and str(err.value) == f"{run} holds a 'proto' run, not 'other'"
    assert err.value.hint == (
        "choose a new --output for the 'other' run (a run folder keeps one recipe), or resume this one with a config "
        "whose recipe is 'proto'"
    )


def test_resume_names_the_recorded_stages_the_recipe_no_longer_has_and_keeps_them(tmp_path, capsys):
    """A stage renamed or removed from a recipe between runs: its record, folder and lineage statement stay (the
    user's results), and --resume says so in one line instead of `portable lineage` silently listing a stage the
    recipe does not have."""
    run = tmp_path / "run"
    run_recipe(recipe(spec(), spec("second", needs=("first",))), Cfg(), run, RunOptions(recorder=make_recorder(None)))
    capsys.readouterr()
    report = run_recipe(recipe(spec()), Cfg(), run, RunOptions(resume=True, recorder=make_recorder(None)))
    assert [(s.name, s.action) for s in report.stages] == [("first", "skipped")]
    assert capsys.readouterr().err.splitlines()[0] == (
        "note: run.json records stage second that recipe proto no longer has (renamed or removed): kept as they are, "
        "with their folders and lineage; remove them by hand, or start a new --output, to leave them behind"
    )
    assert read_state(run)["stages"]["second"]["status"] == "complete"
    assert (run / "second" / "out.txt").is_file() and (run / "lineage" / "second.intoto.json").is_file()
    run_recipe(recipe(spec(), spec("second", needs=("first",))), Cfg(), run, RunOptions(resume=True))
    assert "no longer" not in capsys.readouterr().err  # the full recipe again: nothing to say
