"""The runner over a toy two-stage recipe: recipe as data, stage keys, resume, restart, refusals."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from reproduction.config_fields import same_outputs
from reproduction.errors import ConfigError, RunStateError, StageKeyChangedError
from reproduction.recipe import Recipe, StageContext, StageOutput, StageSpec
from reproduction.run.runner import RunOptions, read_state, run_recipe

CALLS: list[str] = []


@dataclass
class ToySection:
    words: list[str] = field(default_factory=lambda: ["a", "b"])
    repeat: int = 2
    workers: int = field(default=1, metadata=same_outputs())  # out of the count stage's key


@dataclass
class ToyConfig:
    count: ToySection = field(default_factory=ToySection)
    label: str = "x"


@dataclass
class FakeInput:
    fingerprint: str


def count_stage(ctx: StageContext) -> StageOutput:
    CALLS.append("count")
    sec = ctx.config.count
    out = ctx.out_dir / "counts.json"
    counts = {w: len(w) * sec.repeat for w in sec.words}
    out.write_text(json.dumps(counts))
    return StageOutput(files=[out], summary={"words": len(counts)})


def label_stage(ctx: StageContext) -> StageOutput:
    CALLS.append("label")
    counts = json.loads((ctx.run_dir / "count" / "counts.json").read_text())
    out = ctx.out_dir / "labels.txt"
    out.write_text("".join(f"{ctx.config.label}:{k}={v}\n" for k, v in sorted(counts.items())))
    assert ctx.upstream["count"].summary == {"words": len(counts)}
    return StageOutput(files=[out], summary={"lines": len(counts)})


def crash_stage(ctx: StageContext) -> StageOutput:
    (ctx.out_dir / "half.txt").write_text("half")
    raise KeyboardInterrupt  # a kill, as far as the run record is concerned


TOY = Recipe(
    name="toy",
    stages=(
        StageSpec(
            name="count",
            fn=f"{__name__}:count_stage",
            config=("count",),
            code=(__name__,),
        ),
        StageSpec(name="label", fn=f"{__name__}:label_stage", needs=("count",), config=("label",)),
    ),
)


def _run(run_dir: Path, config: ToyConfig | None = None, **kw) -> list[tuple[str, str]]:
    CALLS.clear()
    opts = RunOptions(inputs=kw.pop("inputs", {"data": FakeInput("fp1")}), **kw)
    report = run_recipe(TOY, config or ToyConfig(), run_dir, opts)
    return [(s.name, s.action) for s in report.stages]


def test_a_toy_recipe_runs_through_the_same_runner_and_resumes_as_a_no_op(tmp_path):
    run = tmp_path / "run"
    assert _run(run) == [("count", "ran"), ("label", "ran")]
    assert (run / "label" / "labels.txt").read_text() == "x:a=2\nx:b=2\n"
    state = read_state(run)
    assert state["recipe"] == "toy" and state["stages"]["count"]["status"] == "complete"
    assert set(state["stages"]["count"]["key_parts"]) == {"config", "inputs", "upstream", "code", "fn"}
    assert _run(run, resume=True) == [("count", "skipped"), ("label", "skipped")] and CALLS == []
    # an exempt key (workers) does not change the key
    assert _run(run, ToyConfig(count=ToySection(workers=4)), resume=True)[0] == ("count", "skipped")


def test_a_changed_config_value_or_input_is_refused_by_name(tmp_path):
    run = tmp_path / "run"
    _run(run)
    with pytest.raises(StageKeyChangedError) as err:
        _run(run, ToyConfig(count=ToySection(repeat=3)), resume=True)
    assert err.value.exit_code == 52 and "config.count.repeat: 2 -> 3" in str(err.value)
    assert "--restart-stage count" in err.value.hint
    with pytest.raises(StageKeyChangedError, match=r"inputs.data: fp1 -> fp2"):
        _run(run, resume=True, inputs={"data": FakeInput("fp2")})
    with pytest.raises(StageKeyChangedError, match=r"config.label: x -> y"):
        _run(run, ToyConfig(label="y"), resume=True)


def test_restart_stage_redoes_it_and_its_dependents_follow(tmp_path):
    run = tmp_path / "run"
    _run(run)
    got = _run(run, ToyConfig(count=ToySection(repeat=3)), restart=["count"])
    assert got == [("count", "ran"), ("label", "ran")]  # label's upstream changed here: redone, not refused
    assert (run / "label" / "labels.txt").read_text() == "x:a=3\nx:b=3\n"
    assert _run(run, ToyConfig(count=ToySection(repeat=3)), resume=True) == [("count", "skipped"), ("label", "skipped")]


def test_an_edited_output_is_named_and_a_missing_upstream_refused(tmp_path):
    run = tmp_path / "run"
    _run(run)
    (run / "count" / "counts.json").write_text('{"a": 99}')
    with pytest.raises(StageKeyChangedError, match=r"stage count: its outputs changed after it completed: counts.json"):
        _run(run, resume=True)
    with pytest.raises(RunStateError, match="stage label needs stage count"):
        _run(tmp_path / "other", stages=["label"])


def test_a_stage_killed_midway_is_redone_on_resume(tmp_path):
    run = tmp_path / "run"
    crashing = Recipe(name="toy", stages=(TOY.stages[0], StageSpec(name="label", fn=f"{__name__}:crash_stage")))
    with pytest.raises(KeyboardInterrupt):
        run_recipe(crashing, ToyConfig(), run, RunOptions(inputs={}))
    state = read_state(run)
    assert state["stages"]["count"]["status"] == "complete" and state["stages"]["label"]["status"] == "interrupted"
    got = [(s.name, s.action) for s in run_recipe(TOY, ToyConfig(), run, RunOptions(inputs={}, resume=True)).stages]
    assert got == [("count", "skipped"), ("label", "ran")] and not (run / "label" / "half.txt").exists()


def test_the_first_write_is_one_running_record_before_any_stage_folder(tmp_path, monkeypatch):
    """A fresh run writes run.json once before its first stage folder (already saying `running`):
    a kill right after it leaves a run that --resume completes."""
    import reproduction.run.runner as runner_mod

    run, writes = tmp_path / "run", []
    real = runner_mod._write_state

    def spy(run_dir, state):
        writes.append((json.loads(json.dumps(state["stages"], default=str)), sorted(p.name for p in run_dir.iterdir())))
        real(run_dir, state)
        if len(writes) == 1:
            raise KeyboardInterrupt  # killed right after the run's first write

    monkeypatch.setattr(runner_mod, "_write_state", spy)
    with pytest.raises(KeyboardInterrupt):
        _run(run)
    stages, present = writes[0]
    assert stages["count"]["status"] == "running" and present == [".lock"]  # nothing but the lock and run.json yet
    assert sorted(p.name for p in run.iterdir()) == [".lock", "run.json"]
    monkeypatch.setattr(runner_mod, "_write_state", real)
    assert _run(run, resume=True) == [("count", "ran"), ("label", "ran")]
    assert read_state(run)["stages"]["label"]["status"] == "complete"


def test_run_folder_refusals(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunStateError, match="is a file") as err:
        _run(tmp_path / "file")
    assert err.value.exit_code == 55
    run = tmp_path / "run"
    _run(run)
    with pytest.raises(RunStateError, match="already holds a run"):
        _run(run)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "mine.txt").write_text("keep")
    with pytest.raises(RunStateError, match="not empty and holds no run.json"):
        _run(tmp_path / "busy")
    assert (tmp_path / "busy" / "mine.txt").read_text() == "keep"
    with pytest.raises(ConfigError, match="no stage 'nope'"):
        _run(tmp_path / "x", stages=["nope"])
    with pytest.raises(ConfigError, match="needs 'missing'"):
        Recipe(name="bad", stages=(StageSpec(name="a", fn="m:f", needs=("missing",)),))


@dataclass
class CheckedConfig(ToyConfig):
    expected: str | None = None
    """A file of expected labels (read by path: its content is part of the check stage's key)."""


def check_stage(ctx: StageContext) -> StageOutput:
    CALLS.append("check")
    got = (ctx.run_dir / "label" / "labels.txt").read_text()
    want = Path(ctx.config.expected).read_text() if ctx.config.expected else None
    out = ctx.out_dir / "check.json"
    out.write_text(json.dumps({"expected": ctx.config.expected, "same": got == want if want is not None else None}))
    return StageOutput(files=[out], summary={"same": got == want if want is not None else None})


def _checked(redo: bool) -> Recipe:
    check = StageSpec(
        name="check",
        fn=f"{__name__}:check_stage",
        needs=("label",),
        config=("expected",),
        files=("expected",),
        inputs=False,
        redo_on_change=redo,
    )
    return Recipe(name="toy", stages=(*TOY.stages, check))


def test_a_cheap_stage_reading_a_file_by_path_is_redone_when_the_file_changes(tmp_path):
    """Like the RECAP compare stage: a new reference recompares and reuses every stage before it."""
    run, ref = tmp_path / "run", tmp_path / "expected.txt"
    ref.write_text("x:a=2\nx:b=2\n")

    def go(recipe: Recipe, config: CheckedConfig, **kw) -> list[tuple[str, str]]:
        CALLS.clear()
        report = run_recipe(recipe, config, run, RunOptions(inputs={"data": FakeInput("fp1")}, **kw))
        return [(s.name, s.action) for s in report.stages]

    cheap = _checked(redo=True)
    assert go(cheap, CheckedConfig(expected=str(ref)))[-1] == ("check", "ran")
    state = read_state(run)
    assert state["stages"]["check"]["summary"] == {"same": True}
    assert state["stages"]["check"]["key_parts"]["files"] == {"expected": _sha(ref)}
    assert "files" not in state["stages"]["count"]["key_parts"]  # stages reading no file keep their keys
    assert go(cheap, CheckedConfig(expected=str(ref)), resume=True)[-1] == ("check", "skipped") and CALLS == []
    ref.write_text("x:a=9\n")  # same path, new content
    got = go(cheap, CheckedConfig(expected=str(ref)), resume=True)
    assert got == [("count", "skipped"), ("label", "skipped"), ("check", "ran")] and CALLS == ["check"]
    assert read_state(run)["stages"]["check"]["summary"] == {"same": False}
    # No file at all (None), then one again: each is a change, each only redoes the cheap stage.
    assert go(cheap, CheckedConfig(expected=None), resume=True)[-1] == ("check", "ran")
    assert go(cheap, CheckedConfig(expected=str(ref)), resume=True)[-1] == ("check", "ran")
    # A stage that is not declared cheap is refused, naming the file's key.
    ref.write_text("x:a=2\nx:b=2\n")
    with pytest.raises(StageKeyChangedError, match=r"files.expected: "):
        go(_checked(redo=False), CheckedConfig(expected=str(ref)), resume=True)


def _sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class _SectionBefore:
    """ToySection as it was before `workers` was declared same_outputs()."""

    words: list[str] = field(default_factory=lambda: ["a", "b"])
    repeat: int = 2
    workers: int = 1


@dataclass
class _ConfigBefore:
    count: _SectionBefore = field(default_factory=_SectionBefore)
    label: str = "x"


def test_a_key_recorded_before_a_config_key_became_exempt_still_matches(tmp_path):
    """Runs made before eval.reference left the eval stage's key are reused, not refused (exit 52)."""
    run = tmp_path / "run"
    count = TOY.stages[0]
    before = Recipe(name="toy", stages=(StageSpec(name="count", fn=count.fn, config=count.config, code=count.code),))
    run_recipe(before, _ConfigBefore(), run, RunOptions(inputs={"data": FakeInput("fp1")}))
    old_key = read_state(run)["stages"]["count"]["key"]
    # Today's config declares count.workers same_outputs(): the old record (workers in its key) matches once it is
    # dropped ...
    assert _run(run, resume=True) == [("count", "skipped"), ("label", "ran")]
    state = read_state(run)["stages"]["count"]
    assert state["key"] != old_key and "workers" not in state["key_parts"]["config"]["count"]  # ... and is updated
    assert _run(run, ToyConfig(count=ToySection(workers=8)), resume=True) == [
        ("count", "skipped"),
        ("label", "skipped"),
    ]
    # A value that was never exempt still refuses.
    with pytest.raises(StageKeyChangedError, match=r"config.count.repeat: 2 -> 5"):
        _run(run, ToyConfig(count=ToySection(repeat=5)), resume=True)


def shared_writer(ctx: StageContext) -> StageOutput:
    CALLS.append(ctx.name)
    shared = ctx.run_dir / "evidence" / "comparison.json"
    shared.parent.mkdir(exist_ok=True)
    shared.write_text(json.dumps({"by": ctx.name, "label": ctx.config.label}))
    own = ctx.out_dir / "own.txt"
    own.write_text(ctx.name)
    return StageOutput(files=[own, shared])


def test_a_file_a_later_stage_writes_is_that_stages_output(tmp_path):
    """An old eval record claims evidence/comparison.json; once compare writes it, eval no longer does."""
    run = tmp_path / "run"
    first = StageSpec(name="first", fn=f"{__name__}:shared_writer", inputs=False)
    second = StageSpec(name="second", fn=f"{__name__}:shared_writer", needs=("first",), config=("label",))
    recipe = Recipe(name="toy", stages=(first, second))
    run_recipe(recipe, ToyConfig(), run, RunOptions(inputs={}))
    stages = read_state(run)["stages"]
    assert "../evidence/comparison.json" not in stages["first"]["outputs"]
    assert "../evidence/comparison.json" in stages["second"]["outputs"]
    got = run_recipe(recipe, ToyConfig(), run, RunOptions(inputs={}, resume=True))
    assert [s.action for s in got.stages] == ["skipped", "skipped"]


def ray_asker(ctx: StageContext) -> StageOutput:
    CALLS.append(ctx.ray_cluster())
    out = ctx.out_dir / "ray.txt"
    out.write_text("asked")
    return StageOutput(files=[out])


def test_stages_ask_the_runner_for_the_runs_ray(tmp_path):
    """--ray-address is joined as given: every stage that asks gets it, and no local Ray starts."""
    stages = (
        StageSpec(name="first", fn=f"{__name__}:ray_asker", inputs=False),
        StageSpec(name="second", fn=f"{__name__}:ray_asker", needs=("first",), inputs=False),
    )
    CALLS.clear()
    opts = RunOptions(ray_address="10.0.0.5:6379")
    run_recipe(Recipe(name="toy", stages=stages), ToyConfig(), tmp_path / "run", opts)
    assert CALLS == ["10.0.0.5:6379", "10.0.0.5:6379"]


def test_a_recipe_run_by_code_with_a_config_that_is_no_dataclass_runs(tmp_path):
    """run_recipe takes any config object a recipe run by code builds (Recipe.config_schema None): the runner's
    preflight (placeholders, a bundle) reads what it can of it and finds nothing to refuse."""
    from types import SimpleNamespace

    config = SimpleNamespace(count=ToySection(), label="y")
    CALLS.clear()
    report = run_recipe(TOY, config, tmp_path / "run", RunOptions(inputs={"data": FakeInput("fp1")}))
    assert [(s.name, s.action) for s in report.stages] == [("count", "ran"), ("label", "ran")]
    assert (tmp_path / "run" / "label" / "labels.txt").read_text() == "y:a=2\ny:b=2\n"
