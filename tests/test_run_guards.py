"""The run folder under everyday faults, on the toy recipe of tests/test_run_runner.py (no training, fast):
a wrongly shaped run.json (exit 55, the field named; a property test: never a bug), a stage folder or evidence/
that is a symbolic link (exit 55, the link named, nothing read or written through it), a second run on a busy
folder (exit 7), a stage that fails or is interrupted (recorded so), a failed --target-step (the complete
record kept), a lowered step count on --resume (exit 52, both values named, run.json untouched), and config
values no stage could finish with (exit 4 at load, before any stage trains)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_run_runner import TOY, FakeInput, ToyConfig, ToySection

from reproduction.errors import PortableError, RunStateError, StageKeyChangedError, UsageError
from reproduction.recipe import Recipe, StageContext, StageOutput, StageSpec
from reproduction.run.guards import run_lock
from reproduction.run.runner import RunOptions, read_state, run_recipe

REPO = Path(__file__).resolve().parent.parent


def _run(run_dir: Path, config=None, recipe: Recipe = TOY, **kw):
    opts = RunOptions(inputs=kw.pop("inputs", {"data": FakeInput("fp1")}), **kw)
    return [(s.name, s.action) for s in run_recipe(recipe, config or ToyConfig(), run_dir, opts).stages]


@pytest.fixture
def done(tmp_path) -> Path:
    run = tmp_path / "run"
    _run(run)
    return run


# -- run.json's shape ----------------------------------------------------------------------------

SHAPES = [
    ("stages a list", lambda d: d.update(stages=[]), "stages is a list, expected a mapping"),
    ("config a number", lambda d: d.update(config=3), "config is a number, expected a mapping"),
    ("outputs a string", lambda d: d["stages"]["count"].update(outputs="x"), "stages.count.outputs is a string"),
    ("a stage a list", lambda d: d["stages"].update(count=[1]), "stages.count is a list"),
    ("unknown status", lambda d: d["stages"]["count"].update(status="done"), "stages.count.status is 'done'"),
    ("key a number", lambda d: d["stages"]["label"].update(key=1), "stages.label.key is a number"),
    ("summary a list", lambda d: d["stages"]["count"].update(summary=[4]), "stages.count.summary is a list"),
    ("short output entry", lambda d: d["stages"]["count"]["outputs"].update({"counts.json": [1, 2]}), "counts.json"),
    ("output outside", lambda d: d["stages"]["count"]["outputs"].update({"../../x": [1, 2, "0" * 64]}), "'../../x'"),
    ("run_id missing", lambda d: d.pop("run_id"), "run_id is null"),
    ("top level a list", lambda d: (d.clear(), d.update(_list=True)), "format_version"),
    ("format_version 2", lambda d: d.update(format_version=2), "format_version is 2, expected 1"),
]


@pytest.mark.parametrize("name,mutate,words", SHAPES, ids=[s[0] for s in SHAPES])
def test_a_wrongly_shaped_run_json_is_refused_naming_the_field(done, name, mutate, words):
    doc = json.loads((done / "run.json").read_text())
    mutate(doc)
    (done / "run.json").write_text(json.dumps(doc))
    with pytest.raises(RunStateError) as info:
        _run(done, resume=True)
    assert info.value.exit_code == 55 and words in str(info.value), str(info.value)
    assert "\n" not in str(info.value)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 10**12) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


def _paths(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, (*prefix, i))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_property_a_mutated_run_json_is_used_or_refused_never_a_bug(done, data):
    """Replace (or delete) any one node of a real run.json with any JSON value: --resume either works or raises
    a PortableError with a one-line message; never another exception."""
    original = json.loads((done / "run.json").read_text())
    doc = json.loads(json.dumps(original))
    where = data.draw(st.sampled_from(list(_paths(doc))))
    if not where:
        doc = data.draw(JSON)
    else:
        parent = doc
        for k in where[:-1]:
            parent = parent[k]
        if isinstance(parent, dict) and data.draw(st.booleans()):
            del parent[where[-1]]
        else:
            parent[where[-1]] = data.draw(JSON)
    (done / "run.json").write_text(json.dumps(doc))
    try:
        _run(done, resume=True)
    except PortableError as exc:
        assert 50 <= exc.exit_code <= 56 and "\n" not in str(exc), (where, str(exc))
    finally:
        (done / "run.json").write_text(json.dumps(original))
        for stage in ("count", "label"):  # a run that redid a stage: put its outputs back as recorded
            if not (done / stage).is_dir():
                _run(done, restart=[stage])
                original = json.loads((done / "run.json").read_text())


def _cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "reproduction.portable", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=cwd)


@pytest.mark.parametrize("mutate", [lambda d: d.update(stages=[]), lambda d: d.update(config=7)])
def test_a_wrongly_shaped_run_json_through_the_cli_is_exit_55(tmp_path, mutate):
    run = tmp_path / "run"
    run.mkdir()
    doc = {"format_version": 1, "recipe": "recap", "run_id": "r", "created": 1.0, "stages": {}, "config": {}}
    mutate(doc)
    (run / "run.json").write_text(json.dumps(doc))
    proc = _cli("run", "--output", str(run), "--resume", "--stages", "returns")
    assert proc.returncode == 55, proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    assert proc.stderr.startswith(f"error: {run / 'run.json'}: ")


# -- symbolic links ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["count", "evidence"])
@pytest.mark.parametrize("how", ["resume", "restart"])
def test_a_stage_folder_or_evidence_that_links_out_is_refused_naming_it(done, tmp_path, name, how):
    outside = tmp_path / "elsewhere"
    if (done / name).is_dir():
        (done / name).rename(outside)
    else:
        outside.mkdir()
        (outside / "keep.json").write_text("{}")
    (done / name).symlink_to(outside, target_is_directory=True)
    before = {p.name: p.read_bytes() for p in outside.iterdir()}
    state = (done / "run.json").read_bytes()
    with pytest.raises(RunStateError) as info:
        _run(done, **({"resume": True} if how == "resume" else {"restart": ["count"]}))
    assert info.value.exit_code == 55
    assert str(info.value).startswith(f"{done / name} is a symbolic link (to {outside})")
    assert {p.name: p.read_bytes() for p in outside.iterdir()} == before  # nothing cleared or written there
    assert (done / "run.json").read_bytes() == state


# -- the lock ------------------------------------------------------------------------------------


def test_a_second_run_on_a_busy_run_folder_is_exit_7_and_touches_nothing(done):
    from reproduction.run.cli import cmd_run  # noqa: F401  (the CLI path below renders the error)

    state = (done / "run.json").read_bytes()
    with run_lock(done):
        with pytest.raises(PortableError) as info:
            _run(done, resume=True)
        assert info.value.exit_code == 7
        assert str(info.value).startswith(f"{done}: busy: another portable process (pid {os.getpid()}: run)")
        proc = _cli("run", "--output", str(done), "--resume", "--stages", "returns")
    assert proc.returncode == 7, proc.stderr
    assert f"error: {done}: busy: another portable process (pid {os.getpid()}: run)" in proc.stderr
    assert (done / "run.json").read_bytes() == state
    assert _run(done, resume=True) == [("count", "skipped"), ("label", "skipped")]  # released


# -- failed, interrupted, --target-step, fewer steps --------------------------------------------


def failing_stage(ctx: StageContext) -> StageOutput:
    (ctx.out_dir / "half.txt").write_text("half")
    if ctx.config.label == "term":
        os.kill(os.getpid(), signal.SIGTERM)
    raise ValueError("the simulator said no")


def trained_stage(ctx: StageContext) -> StageOutput:
    """A training stage: `count.repeat` is its step count; --target-step N trains on to N (fails for 99)."""
    step = ctx.target_step or ctx.config.count.repeat
    if step == 99:
        raise PortableError("checkpoint step_4 is damaged")
    out = ctx.out_dir / "model.txt"
    out.write_text(f"trained {step} steps\n")
    return StageOutput(files=[out], summary={}, step=step)


TRAINED = Recipe(
    name="toy",
    stages=(StageSpec(name="count", fn=f"{__name__}:trained_stage", config=("count",), training="count.repeat"),),
)


@pytest.mark.parametrize(
    "label,status,raised", [("x", "failed", ValueError), ("term", "interrupted", KeyboardInterrupt)]
)
@pytest.mark.parametrize("before", ["default", "another handler"])
def test_a_failed_or_interrupted_stage_is_recorded_so_and_resume_redoes_it(tmp_path, label, status, raised, before):
    """Also where another SIGTERM handler was installed first (Ray's driver installs one): the walk's own handler
    answers the signal, and the earlier one is put back after."""
    earlier = signal.SIG_DFL if before == "default" else (lambda signum, frame: pytest.fail("the earlier handler ran"))
    signal.signal(signal.SIGTERM, earlier)
    try:
        _failed_or_interrupted(tmp_path, label, status, raised, earlier)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _failed_or_interrupted(tmp_path, label, status, raised, earlier) -> None:
    run = tmp_path / "run"
    failing = Recipe(name="toy", stages=(TOY.stages[0], StageSpec(name="label", fn=f"{__name__}:failing_stage")))
    with pytest.raises(raised):
        run_recipe(failing, ToyConfig(label=label), run, RunOptions(inputs={}))
    rec = read_state(run)["stages"]["label"]
    assert rec["status"] == status
    if status == "failed":
        assert rec["error"] == "ValueError: the simulator said no"
    assert signal.getsignal(signal.SIGTERM) is earlier  # the run's handler is gone with it
    got = _run(run, ToyConfig(label=label), resume=True, inputs={})
    assert got == [("count", "skipped"), ("label", "ran")]
    assert read_state(run)["stages"]["label"]["status"] == "complete"


def test_a_failed_target_step_leaves_the_complete_record_as_it_was(tmp_path):
    run = tmp_path / "run"
    _run(run, ToyConfig(count=ToySection(repeat=4)), recipe=TRAINED)
    before = read_state(run)["stages"]["count"]
    with pytest.raises(PortableError, match="damaged"):
        _run(run, ToyConfig(count=ToySection(repeat=4)), recipe=TRAINED, target_step=99)
    assert read_state(run)["stages"]["count"] == before
    with pytest.raises(PortableError, match="damaged"):  # a plain --resume asks for 99 again (audit54 review RV2)
        _run(run, ToyConfig(count=ToySection(repeat=4)), recipe=TRAINED, resume=True)
    assert read_state(run)["stages"]["count"] == before and read_state(run)["target_step"]["step"] == 99
    got = _run(run, ToyConfig(count=ToySection(repeat=4)), recipe=TRAINED, resume=True, target_step=4)
    assert got == [("count", "skipped")] and "target_step" not in read_state(run)  # an explicit target drops it


def test_a_target_step_at_or_below_the_steps_trained_says_so_and_trains_nothing(tmp_path, capsys):
    run = tmp_path / "run"
    _run(run, ToyConfig(count=ToySection(repeat=4)), recipe=TRAINED)
    state = (run / "run.json").read_bytes()
    capsys.readouterr()
    for target in (2, 4):
        got = _run(run, ToyConfig(count=ToySection(repeat=4)), recipe=TRAINED, target_step=target)
        assert got == [("count", "skipped")]
        assert capsys.readouterr().err == (
            f"count: trained 4 steps already, --target-step {target} asks for no more; skipped (a trained stage is "
            "not cut back: --restart-stage trains it anew)\n"
        )
    assert (run / "run.json").read_bytes() == state
    assert (run / "count" / "model.txt").read_text() == "trained 4 steps\n"


@pytest.mark.parametrize("target", [2, 4])
def test_a_target_step_at_or_below_the_steps_trained_with_a_raised_count_is_refused_before_anything_runs(
    tmp_path, target
):
    """Stop 48: --target-step T <= the 4 steps trained, with count.repeat raised to 6, was skipped as "asks for no
    more" while run.json's config recorded 6: a config claiming steps the stage never trained, and the raised count
    ignored without a word. The two ask for different things: exit 2 naming both, nothing run or written."""
    run = tmp_path / "run"
    _run(run, ToyConfig(count=ToySection(repeat=4)), recipe=TRAINED)
    state = (run / "run.json").read_bytes()
    six = ToyConfig(count=ToySection(repeat=6))
    with pytest.raises(UsageError) as err:
        _run(run, six, recipe=TRAINED, target_step=target)
    assert err.value.exit_code == 2 and str(err.value) == (
        f"--target-step {target} asks for no more steps, but the config raises stage count's count.repeat to 6, "
        "above the 4 steps it trained (nothing was run)"
    )
    assert (
        err.value.hint == "drop --target-step to train on to count.repeat=6 (--resume), or pass --target-step 6 or more"
    )
    assert (run / "run.json").read_bytes() == state
    assert (run / "count" / "model.txt").read_text() == "trained 4 steps\n"
    # either way out works: the count (--resume) or a target at or above it
    assert _run(run, six, recipe=TRAINED, resume=True) == [("count", "continued")]
    assert read_state(run)["stages"]["count"]["step"] == 6


def test_resume_with_fewer_steps_than_trained_is_refused_naming_both(tmp_path):
    run = tmp_path / "run"
    four = ToyConfig(count=ToySection(repeat=4))
    _run(run, four, recipe=TRAINED)
    state = (run / "run.json").read_bytes()
    with pytest.raises(StageKeyChangedError) as info:
        _run(run, ToyConfig(count=ToySection(repeat=2)), recipe=TRAINED, resume=True)
    assert info.value.exit_code == 52
    assert (
        str(info.value)
        == "stage count: count.repeat is now 2, but the stage trained 4 steps (it ran with count.repeat=4)"
    )
    assert "count.repeat=4" in info.value.hint and "--restart-stage count" in info.value.hint
    assert (run / "run.json").read_bytes() == state  # the record still says what was trained
    # --target-step trains on past the configured value: the unchanged config then resumes as a no-op
    assert _run(run, four, recipe=TRAINED, target_step=6) == [("count", "continued")]
    assert _run(run, four, recipe=TRAINED, resume=True) == [("count", "skipped")]
    assert read_state(run)["stages"]["count"]["step"] == 6


def read_model_stage(ctx: StageContext) -> StageOutput:
    out = ctx.out_dir / "score.txt"
    out.write_text((ctx.run_dir / "count" / "model.txt").read_text().upper())
    return StageOutput(files=[out], summary={})


def pinned_stage(ctx: StageContext) -> StageOutput:
    """A training stage that trained nothing by its count (GRPO's sft copying a pinned sft.export): step None."""
    out = ctx.out_dir / "model.txt"
    out.write_text("pinned\n")
    return StageOutput(files=[out], summary={}, step=None)


def zero_or_count_stage(ctx: StageContext) -> StageOutput:
    """Trains up to count.repeat steps (0 allowed), continuing from its checkpoint on resume."""
    ckpt = ctx.out_dir / "step.txt"
    step = int(ckpt.read_text()) if ctx.resume and ckpt.is_file() else 0
    started = step
    while step < (ctx.target_step or ctx.config.count.repeat):
        step += 1
    ckpt.write_text(str(step))
    return StageOutput(files=[ckpt], summary={}, step=step, resumed_from=started if ctx.resume else None)


def test_resume_with_more_steps_than_trained_trains_on_to_them_and_redoes_what_follows(tmp_path, capsys):
    """audit46 newcomer F5: docs/config.md says of `*.train.max_steps` "a resumed run continues up to this", but a
    count raised on --resume was skipped without a word while run.json recorded the new count."""
    run = tmp_path / "run"
    scored = Recipe(
        name="toy",
        stages=(
            *TRAINED.stages,
            StageSpec(name="score", fn=f"{__name__}:read_model_stage", needs=("count",), config=("label",)),
        ),
    )
    _run(run, ToyConfig(count=ToySection(repeat=4)), recipe=scored)
    capsys.readouterr()
    six = ToyConfig(count=ToySection(repeat=6))
    assert _run(run, six, recipe=scored, resume=True) == [("count", "continued"), ("score", "ran")]
    assert capsys.readouterr().err == "count: count.repeat is 6, above the 4 steps it trained: training on to 6\n"
    state = read_state(run)
    assert state["stages"]["count"]["step"] == 6 and state["config"]["count"]["repeat"] == 6
    assert (run / "score" / "score.txt").read_text() == "TRAINED 6 STEPS\n"
    assert _run(run, six, recipe=scored, resume=True) == [("count", "skipped"), ("score", "skipped")]
    assert capsys.readouterr().err == ""
    # a count raised to one that fails: the complete record is kept, and the next --resume tries again
    with pytest.raises(PortableError, match="damaged"):
        _run(run, ToyConfig(count=ToySection(repeat=99)), recipe=scored, resume=True)
    assert read_state(run)["stages"]["count"]["step"] == 6
    with pytest.raises(PortableError, match="damaged"):
        _run(run, ToyConfig(count=ToySection(repeat=99)), recipe=scored, resume=True)
    # after --target-step 8 a count between the configured and the trained steps asks for nothing more
    assert _run(run, six, recipe=scored, target_step=8) == [("count", "continued"), ("score", "ran")]
    assert _run(run, ToyConfig(count=ToySection(repeat=7)), recipe=scored, resume=True) == [
        ("count", "skipped"),
        ("score", "skipped"),
    ]


def test_portable_run_resume_with_a_raised_count_continues_a_real_trainer_to_the_bytes_of_a_straight_run(
    tmp_path, capsys
):
    """The same through `portable run` on tests/test_checkpoint_interrupt.py's recipe, whose stage trains a tiny
    model in process: 8 steps, then `--resume train.steps=12` continues from step 8's checkpoint."""
    from reproduction.portable import main

    (tmp_path / "run.yaml").write_text("recipe: test_checkpoint_interrupt:RECIPE\ntrain: {steps: 8}\n")
    run, straight = tmp_path / "run", tmp_path / "straight"
    base = ["-q", "run", "--config", str(tmp_path / "run.yaml")]
    assert main([*base, "--output", str(run)]) == 0
    assert main([*base, "--output", str(run), "--resume", "train.steps=12"]) == 0
    rec = read_state(run)["stages"]["train"]
    assert (rec["status"], rec["step"], rec["resumed_from"]) == ("complete", 12, 8)
    assert main([*base, "--output", str(straight), "train.steps=12"]) == 0
    rel = "train/export/model.safetensors"
    assert (run / rel).read_bytes() == (straight / rel).read_bytes()
    capsys.readouterr()
    assert main([*base, "--output", str(run), "--resume", "train.steps=12"]) == 0  # now a no-op
    assert read_state(run)["stages"]["train"]["step"] == 12 and capsys.readouterr().err == ""


def test_a_training_stage_that_trained_0_steps_is_trained_on_when_the_count_is_raised(tmp_path, capsys):
    """audit47 #4: a stage that completed at step 0 was skipped by `--resume count.repeat=5` (`0 < step`), and run.json
    then said 5 steps over a stage that trained none."""
    run = tmp_path / "run"
    zero = Recipe(
        name="toy",
        stages=(
            StageSpec(name="count", fn=f"{__name__}:zero_or_count_stage", config=("count",), training="count.repeat"),
        ),
    )
    _run(run, ToyConfig(count=ToySection(repeat=0)), recipe=zero)
    assert read_state(run)["stages"]["count"]["step"] == 0
    capsys.readouterr()
    assert _run(run, ToyConfig(count=ToySection(repeat=5)), recipe=zero, resume=True) == [("count", "continued")]
    assert capsys.readouterr().err == "count: count.repeat is 5, above the 0 steps it trained: training on to 5\n"
    rec = read_state(run)["stages"]["count"]
    assert (rec["step"], rec["resumed_from"], (run / "count" / "step.txt").read_text()) == (5, 0, "5")
    assert _run(run, ToyConfig(count=ToySection(repeat=5)), recipe=zero, resume=True) == [("count", "skipped")]


def test_a_training_stage_that_recorded_no_step_is_not_trained_on(tmp_path, capsys):
    run = tmp_path / "run"
    pinned = Recipe(
        name="toy",
        stages=(StageSpec(name="count", fn=f"{__name__}:pinned_stage", config=("count",), training="count.repeat"),),
    )
    _run(run, ToyConfig(count=ToySection(repeat=4)), recipe=pinned)
    capsys.readouterr()
    assert _run(run, ToyConfig(count=ToySection(repeat=4)), recipe=pinned, resume=True) == [("count", "skipped")]
    assert capsys.readouterr().err == ""


# -- config values checked before any stage trains ------------------------------------------------


@pytest.mark.parametrize(
    "override,words",
    [
        ("eval.episodes_per_task=0", "eval.episodes_per_task=0 must be >= 1"),
        ("eval.workers=0", "eval.workers=0 must be >= 1"),
        ("eval.videos=-1", "eval.videos=-1 must be >= 0"),
        ("eval.guidance_scales=[]", "eval.guidance_scales=[] must be a non-empty list"),
        ("value.infer.batch_size=0", "value.infer.batch_size=0 must be >= 1"),
        ("policy.modes=[]", "policy.modes=[] must name each of recap, bc, filtered_bc"),
        ("policy.modes=[recap,bc,bc]", "policy.modes=['recap', 'bc', 'bc'] must name each"),
        ("eval.tasks=[Nope-v1]", "eval.tasks: unknown simulator task 'Nope-v1'"),
        ("min_free_gb=-1", "min_free_gb=-1.0 must be >= 0"),
    ],
)
def test_a_value_no_stage_could_finish_with_is_refused_at_load(tmp_path, capsys, override, words):
    from reproduction.portable import main

    assert main(["-q", "run", "--output", str(tmp_path / "run"), override]) == 4
    assert capsys.readouterr().err.splitlines()[0].startswith(f"error: command line: {words}")  # audit58 D6
    assert not (tmp_path / "run").exists()


def sleeping_stage(ctx: StageContext) -> StageOutput:
    (ctx.out_dir / "started").write_text("")
    import time

    time.sleep(60)
    raise AssertionError("not stopped")


def test_sigterm_to_a_running_process_records_the_stage_interrupted(tmp_path):
    """A real SIGTERM from outside (what a scheduler or `kill` sends): the process exits 130 with one line and
    run.json says `interrupted`, not `running`; --resume then redoes the stage."""
    import time

    run = tmp_path / "run"
    code = (
        "import sys; sys.path.insert(0, sys.argv[2]); import test_run_guards as g; "
        "from reproduction.run.runner import RunOptions, run_recipe; "
        "label = g.StageSpec(name='label', fn='test_run_guards:sleeping_stage'); "
        "r = g.Recipe(name='toy', stages=(g.TOY.stages[0], label)); "
        "run_recipe(r, g.ToyConfig(), g.Path(sys.argv[1]), RunOptions(inputs={}))"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(run), str(Path(__file__).parent)], env=env, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 60
    while not (run / "label" / "started").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    rec = read_state(run)["stages"]["label"]
    assert rec["status"] == "interrupted" and rec["error"] == "KeyboardInterrupt: SIGTERM"
    assert _run(run, resume=True, inputs={}) == [("count", "skipped"), ("label", "ran")]
