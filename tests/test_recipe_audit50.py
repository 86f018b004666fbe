"""An out-of-tree recipe's slips, met before anything runs (audit50_B): a `training` key naming a section (F1: the
section left the stage key, so a changed learning rate was skipped on --resume), `code` naming a package (F2: its empty
`__init__.py` was keyed, the stage function's module no longer), a str where a StageSpec field wants a tuple and a glob
pathlib refuses (F3), a stage function of another signature or an async one (F4), a summary key that is no str (F8), a
misspelt code module, open_inputs or submodule (F10), an opened input whose fingerprint is no str (F11)."""

from __future__ import annotations

import dataclasses
import json
import sys
import textwrap
from dataclasses import dataclass, field

import pytest

from reproduction.errors import ConfigError, StageKeyChangedError, StageProtocolError
from reproduction.recipe import Recipe, StageContext, StageOutput, StageSpec
from reproduction.run.runner import RunOptions, run_recipe


@dataclass(kw_only=True, slots=True)
class Train:
    steps: int = 2
    lr: float = 0.5
    name: str = "x"
    on: bool = True


@dataclass(kw_only=True, slots=True)
class Cfg:
    train: Train = field(default_factory=Train)
    summary: str = "{}"
    fingerprint: str = "fp"


def write(ctx: StageContext) -> StageOutput:
    out = ctx.out_dir / "out.txt"
    out.write_text(f"{ctx.config.train.lr}\n")
    return StageOutput(files=[out], summary={"lr": ctx.config.train.lr})


def two_args(ctx, extra):
    raise AssertionError("never called")


def no_args():
    raise AssertionError("never called")


async def async_stage(ctx):
    raise AssertionError("never called")


def gen_stage(ctx):
    yield StageOutput(files=[])


def keyword_only(ctx, *, extra):
    raise AssertionError("never called")


def spec(name: str = "first", **kw) -> StageSpec:
    kw.setdefault("fn", f"{__name__}:write")
    return StageSpec(name=name, config=kw.pop("config", ("train",)), inputs=kw.pop("inputs", False), **kw)


def recipe(*stages: StageSpec, **kw) -> Recipe:
    return Recipe(name="audit50", stages=stages or (spec(),), **kw)


# -- F1: a training key that holds no integer step count -----------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "what"),
    [("train", "a section"), ("train.name", "str 'x'"), ("train.lr", "float 0.5"), ("train.on", "bool True")],
)
def test_a_training_key_that_holds_no_integer_step_count_is_refused_before_anything_is_written(tmp_path, key, what):
    """`training="train"` once took the whole section out of the key: --resume train.lr=0.1 skipped the stage."""
    run = tmp_path / "run"
    with pytest.raises(ConfigError) as err:
        run_recipe(recipe(spec(training=key)), Cfg(), run)
    assert err.value.exit_code == 4
    assert str(err.value).startswith(
        f"recipe audit50: stage first declares training key {key!r}, which is {what}, not an integer step count"
    )
    assert "dotted path of the stage's integer step count" in err.value.hint
    assert not run.exists()


def test_a_training_key_naming_the_step_count_leaves_the_rest_of_its_section_in_the_key(tmp_path):
    run = tmp_path / "run"
    run_recipe(recipe(spec(training="train.steps")), Cfg(), run)
    with pytest.raises(StageKeyChangedError, match="config.train.lr: 0.5 -> 0.1"):
        run_recipe(recipe(spec(training="train.steps")), Cfg(train=Train(lr=0.1)), run, RunOptions(resume=True))


# -- F2: code naming a package -------------------------------------------------------------------------------------


@pytest.fixture
def pkg(tmp_path, monkeypatch):
    """A package `rpkg50` on sys.path: rpkg50/stages.py holds the stage function, rpkg50/helper.py a helper."""
    root = tmp_path / "src"
    (root / "rpkg50" / "sub").mkdir(parents=True)
    (root / "rpkg50" / "__init__.py").write_text("")
    (root / "rpkg50" / "helper.py").write_text("SCALE = 1\n")
    (root / "rpkg50" / "sub" / "__init__.py").write_text("")
    (root / "rpkg50" / "stages.py").write_text(
        textwrap.dedent(
            """
            from reproduction.recipe import StageOutput

            def stage(ctx):
                out = ctx.out_dir / "o.txt"
                out.write_text("1")
                return StageOutput(files=[out])
            """
        )
    )
    monkeypatch.syspath_prepend(str(root))
    yield root / "rpkg50"
    for name in [m for m in sys.modules if m == "rpkg50" or m.startswith("rpkg50.")]:
        del sys.modules[name]


def _pkg_recipe(code: tuple[str, ...]) -> Recipe:
    return recipe(StageSpec(name="first", fn="rpkg50.stages:stage", inputs=False, code=code))


@pytest.mark.parametrize("code", [("rpkg50",), ("rpkg50.helper",)])
def test_an_edit_to_the_stage_functions_module_is_seen_whatever_code_names(tmp_path, pkg, code):
    """`code=("rpkg50",)` keyed the package's empty __init__.py alone: an edit to rpkg50/stages.py was skipped."""
    run = tmp_path / "run"
    run_recipe(_pkg_recipe(code), Cfg(), run)
    parts = json.loads((run / "run.json").read_text())["stages"]["first"]["key_parts"]
    assert sorted(parts["code"]) == sorted({"rpkg50.stages", *code})
    (pkg / "stages.py").write_text((pkg / "stages.py").read_text() + "# an edit\n")
    with pytest.raises(StageKeyChangedError, match="code.rpkg50.stages: "):
        run_recipe(_pkg_recipe(code), Cfg(), run, RunOptions(resume=True))


def test_naming_a_package_keys_every_module_under_it(tmp_path, pkg):
    run = tmp_path / "run"
    run_recipe(_pkg_recipe(("rpkg50",)), Cfg(), run)
    (pkg / "sub" / "deep.py").write_text("X = 2\n")  # a new module, two folders down
    with pytest.raises(StageKeyChangedError, match="code.rpkg50: "):
        run_recipe(_pkg_recipe(("rpkg50",)), Cfg(), run, RunOptions(resume=True))
    (pkg / "sub" / "deep.py").unlink()
    (pkg / "__pycache__").mkdir(exist_ok=True)
    (pkg / "__pycache__" / "junk.py").write_text("not source\n")  # compiled caches are not the package's source
    assert [s.action for s in run_recipe(_pkg_recipe(("rpkg50",)), Cfg(), run, RunOptions(resume=True)).stages] == [
        "skipped"
    ]


def test_a_record_written_before_the_functions_module_was_keyed_beside_code_still_resumes(tmp_path, pkg):
    """A run folder whose record keys only the declared code modules is taken as made by today's source of the
    function's module (as a record without `fn` is, audit47), and takes today's key."""
    from reproduction.run.stage_keys import digest

    run = tmp_path / "run"
    run_recipe(_pkg_recipe(("rpkg50.helper",)), Cfg(), run)
    doc = json.loads((run / "run.json").read_text())
    rec = doc["stages"]["first"]
    today = rec["key"]
    del rec["key_parts"]["code"]["rpkg50.stages"]
    rec["key"] = digest(rec["key_parts"])
    (run / "run.json").write_text(json.dumps(doc))
    report = run_recipe(_pkg_recipe(("rpkg50.helper",)), Cfg(), run, RunOptions(resume=True))
    assert [s.action for s in report.stages] == ["skipped"]
    assert json.loads((run / "run.json").read_text())["stages"]["first"]["key"] == today


# -- F3: StageSpec fields of the wrong type, globs pathlib refuses -------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "words", "hint"),
    [
        ({"config": "train"}, "config is 'train', a str, not a tuple of str", "write config=('train',)"),
        ({"needs": "zero"}, "needs is 'zero', a str, not a tuple of str", "write needs=('zero',)"),
        ({"code": "json"}, "code is 'json', a str, not a tuple of str", "write code=('json',)"),
        ({"outputs": "o.txt"}, "outputs is 'o.txt', a str, not a tuple of str", "write outputs=('o.txt',)"),
        ({"files": ("a", 1)}, "files is ('a', 1), not a tuple of non-empty str", "as a tuple of str"),
        ({"outputs": ("",)}, "outputs is ('',), not a tuple of non-empty str", "as a tuple of str"),
        ({"outputs": ("/etc/host*",)}, "outputs is '/etc/host*', not a glob pathlib takes", "relative to its folder"),
        ({"outputs": ("a**b",)}, "outputs is 'a**b', not a glob pathlib takes", "relative to its folder"),
        ({"files_if": ("a", "b")}, "files_if is ('a', 'b'), not a tuple of (file key, boolean key) pairs", "(("),
        ({"training": 5}, "training is 5, not a non-empty str", "StageSpec"),
        ({"fn": None}, "fn is None, not a non-empty str", "StageSpec"),
        ({"inputs": "yes"}, "inputs is 'yes', not a bool", "inputs=True"),
    ],
)
def test_a_stage_spec_field_of_the_wrong_type_is_refused_when_the_recipe_is_built(kw, words, hint):
    """`config=("train")` is a str: it was read letter by letter (config keys 't', 'r', ...); `outputs=("o.txt")`
    and a glob pathlib refuses crashed after the stage ran, as "internal error ... a bug in recap-portable"."""
    zero = spec("zero")
    with pytest.raises(ConfigError) as err:
        recipe(zero, spec(**kw))
    assert err.value.exit_code == 4
    assert str(err.value).startswith(f"recipe audit50: stage first's {words}"), str(err.value)
    assert hint in err.value.hint


def test_a_list_where_a_tuple_is_declared_still_works(tmp_path):
    report = run_recipe(recipe(spec(config=["train"], outputs=["*.txt"])), Cfg(), tmp_path / "run")
    assert [s.action for s in report.stages] == ["ran"]


def test_a_recipe_module_building_a_stage_spec_wrong_is_exit_4_with_the_recipes_hint(tmp_path, monkeypatch):
    from reproduction.run.resolve import resolve_recipe

    (tmp_path / "rmod50.py").write_text(
        "from reproduction.recipe import Recipe, StageSpec\n"
        "RECIPE = Recipe(name='m', stages=(StageSpec(name='a', fn='rmod50:f', config=('train')),))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as err:
        resolve_recipe("rmod50:RECIPE")
    assert str(err.value) == (
        "recipe: 'rmod50:RECIPE' cannot be imported: recipe m: stage a's config is 'train', a str, not a tuple of str"
    )
    assert err.value.hint == "write config=('train',) (note the trailing comma)"


# -- F4: a stage function that cannot be called as fn(ctx) ---------------------------------------------------------


@pytest.mark.parametrize(
    ("fn", "why"),
    [
        ("two_args", "missing a required argument: 'extra'"),
        ("no_args", "too many positional arguments"),
        ("keyword_only", "missing a required argument: 'extra'"),
        ("async_stage", "it is an async def, which the runner would call without awaiting"),
        ("gen_stage", "it is a generator function (it yields), which returns a generator, not a StageOutput"),
    ],
)
def test_a_stage_function_that_cannot_be_called_as_fn_ctx_is_exit_54_before_any_stage_runs(tmp_path, fn, why):
    """It was "internal error: TypeError: g() takes 0 positional arguments but 1 was given" (exit 1) once the stages
    before it had run; an async one also left "coroutine was never awaited" on stderr."""
    run = tmp_path / "run"
    bad = recipe(spec("zero"), spec(fn=f"{__name__}:{fn}", needs=("zero",)))
    with pytest.raises(StageProtocolError) as err:
        run_recipe(bad, Cfg(), run)
    assert err.value.exit_code == 54
    assert (
        str(err.value) == f"recipe audit50: stage first's function '{__name__}:{fn}' cannot be called as fn(ctx): {why}"
    )
    assert err.value.hint.startswith("write it as def NAME(ctx: StageContext) -> StageOutput")
    assert not run.exists()


def test_a_stage_functions_def_is_read_without_importing_its_module(tmp_path, monkeypatch):
    """A finished --resume of a torch recipe imports no torch: the signature is read from the module's source."""
    from reproduction.run.stage_keys import fn_problems

    (tmp_path / "unimported50.py").write_text(
        "import no_such_package_anywhere\n"
        "def two(ctx, extra): ...\n"
        "async def coro(ctx): ...\n"
        "def fine(ctx, extra=1, *, k=2): ...\n"
        "def star(*args): ...\n"
        "def rebound(ctx, extra): ...\n"
        "rebound = make_it_take_ctx(rebound)\n"  # what the name holds is not the def: the call checks it
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    stages = [spec(n, fn=f"unimported50:{n}") for n in ("two", "coro", "fine", "star", "rebound")]
    problems = fn_problems(recipe(*stages), [s.name for s in stages])
    assert "unimported50" not in sys.modules
    assert [str(p) for p in problems] == [
        "recipe audit50: stage two's function 'unimported50:two' cannot be called as fn(ctx): missing a required "
        "argument: 'extra'",
        "recipe audit50: stage coro's function 'unimported50:coro' cannot be called as fn(ctx): it is an async def, "
        "which the runner would call without awaiting",
    ]


def test_the_call_itself_checks_the_signature_where_no_check_came_first(tmp_path):
    """call_stage's own check (a decorated def is not read from source; a caller may call it directly)."""
    from reproduction.run.stage_call import call_stage

    ctx = StageContext(name="first", config=Cfg(), out_dir=tmp_path, run_dir=tmp_path, inputs={}, upstream={})
    with pytest.raises(StageProtocolError, match="stage first's function .*:async_stage' cannot be called as fn"):
        call_stage(spec(fn=f"{__name__}:async_stage"), ctx, recipe="audit50")


# -- F8: summary keys ------------------------------------------------------------------------------------------------


def summary_stage(ctx: StageContext) -> StageOutput:
    out = ctx.out_dir / "out.txt"
    out.write_text("x")
    return StageOutput(files=[out], summary=eval(ctx.config.summary))  # noqa: S307 - the test's own literal


@pytest.mark.parametrize(
    ("summary", "words"),
    [
        ("{1: 'a'}", "summary key 1 is int, not a string"),
        ("{(1, 2): 'b', 'ok': 1}", "summary key (1, 2) is tuple, not a string"),
        ("{'nested': {2.5: 'c'}}", "summary['nested'] key 2.5 is float, not a string"),
    ],
)
def test_a_summary_key_that_is_no_string_is_named(tmp_path, summary, words):
    """run.json would turn 1 into "1" (a reader gets another dict); a tuple was "'<' not supported between ..."."""
    with pytest.raises(StageProtocolError) as err:
        run_recipe(recipe(spec(fn=f"{__name__}:summary_stage")), Cfg(summary=summary), tmp_path / "run")
    assert err.value.exit_code == 54 and words in str(err.value), str(err.value)


# -- F10: a misspelt open_inputs, a misspelt submodule of the recipe's own package ----------------------------------


def test_a_misspelt_open_inputs_is_refused_before_anything_is_written(tmp_path):
    run = tmp_path / "run"
    with pytest.raises(ConfigError) as err:
        run_recipe(recipe(open_inputs=f"{__name__}:no_such_opener"), Cfg(), run)
    assert str(err.value) == (
        f"recipe audit50: its open_inputs '{__name__}:no_such_opener' cannot be loaded: module '{__name__}' has no "
        "attribute 'no_such_opener'"
    )
    assert not run.exists()  # it left a folder holding only .lock


def test_a_misspelt_submodule_of_the_recipes_own_package_is_exit_4_not_a_missing_dependency(tmp_path, monkeypatch):
    from reproduction.run.resolve import resolve_recipe

    (tmp_path / "own50").mkdir()
    (tmp_path / "own50" / "__init__.py").write_text("")
    (tmp_path / "own50" / "helpers.py").write_text("")
    (tmp_path / "own50" / "recipe.py").write_text("import own50.helperz\nRECIPE = None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(ConfigError) as err:
            resolve_recipe("own50.recipe:RECIPE")
    finally:
        for name in [m for m in sys.modules if m.startswith("own50")]:
            del sys.modules[name]
    assert err.value.exit_code == 4
    assert str(err.value).startswith("recipe: 'own50.recipe:RECIPE' imports 'own50.helperz', which the package 'own50'")


# -- F11: an opened input's fingerprint ------------------------------------------------------------------------------


FINGERPRINTS = {"none": None, "int": 7, "bytes": b"ab", "empty": ""}


def opened_with(config):
    return {"data": dataclasses.make_dataclass("Data", ["fingerprint"])(FINGERPRINTS.get(config.fingerprint, "ok"))}


@pytest.mark.parametrize(("kind", "shown"), [("none", "NoneType None"), ("int", "int 7"), ("bytes", "bytes b'ab'"),
                                             ("empty", "str ''")])  # fmt: skip
def test_an_opened_input_whose_fingerprint_is_no_non_empty_str_is_refused(tmp_path, kind, shown):
    """A None fingerprint pinned nothing: a change to the data was never seen on --resume."""
    keyed = recipe(spec(inputs=True), open_inputs=f"{__name__}:opened_with")
    with pytest.raises(ConfigError) as err:
        run_recipe(keyed, Cfg(fingerprint=kind), tmp_path / "run")
    assert err.value.exit_code == 4
    assert str(err.value) == (
        f"opened input 'data' (Data) has fingerprint {shown}, not a non-empty str, so a stage key cannot pin it"
    )
    assert [s.action for s in run_recipe(keyed, Cfg(), tmp_path / "ok").stages] == ["ran"]


# -- F7: another stage's recorded files, rewritten or removed ------------------------------------------------------


def good(ctx: StageContext) -> StageOutput:
    out = ctx.out_dir / "g.txt"
    out.write_text("good\n")
    (ctx.run_dir / "evidence").mkdir(exist_ok=True)
    ev = ctx.run_dir / "evidence" / "good_ev.json"
    ev.write_text("{}")
    return StageOutput(files=[out, ev])


def meddler(ctx: StageContext) -> StageOutput:
    own = ctx.out_dir / "b.txt"
    own.write_text("bad\n")
    mode, other = ctx.config.summary, ctx.run_dir / "good" / "g.txt"
    if mode == "rewrite":
        other.write_text("tampered\n")
    elif mode == "same_bytes":
        other.write_text("good\n")
    elif mode == "remove":
        other.unlink()
    elif mode == "link_evidence":
        link = ctx.run_dir / "evidence" / "bad_ev.json"
        link.symlink_to(ctx.run_dir / "evidence" / "good_ev.json")
        return StageOutput(files=[own, link])
    elif mode == "plant":
        planted = ctx.run_dir / "good" / "planted.txt"
        planted.write_text("x")
        return StageOutput(files=[own, planted])
    return StageOutput(files=[own])


MEDDLING = recipe(
    StageSpec(name="good", fn=f"{__name__}:good", inputs=False),
    StageSpec(name="bad", fn=f"{__name__}:meddler", needs=("good",), config=("summary",), inputs=False),
)


@pytest.mark.parametrize(("mode", "done"), [("rewrite", "overwrote"), ("remove", "removed")])
def test_a_stage_changing_another_stages_folder_file_unreturned_is_exit_54(tmp_path, mode, done):
    """It passed with exit 0; `lineage --verify` then found the digest differing and the next --resume refused the
    run (exit 52) until the other stage was redone. Only the other stages' evidence/ files were watched."""
    run = tmp_path / "run"
    with pytest.raises(StageProtocolError) as err:
        run_recipe(MEDDLING, Cfg(summary=mode), run)
    assert err.value.exit_code == 54
    assert str(err.value) == (
        f"stage bad ({__name__}:meddler) {done} good/g.txt, which is stage good's output, without returning it"
    )
    assert "--restart-stage good then writes good's file again" in err.value.hint
    state = json.loads((run / "run.json").read_text())["stages"]
    assert (state["good"]["status"], state["bad"]["status"]) == ("complete", "failed")


def test_a_rewrite_of_another_stages_file_with_the_same_bytes_is_no_change(tmp_path):
    report = run_recipe(MEDDLING, Cfg(summary="same_bytes"), tmp_path / "run")
    assert [s.action for s in report.stages] == ["ran", "ran"]


def test_a_refused_link_planted_in_evidence_is_removed_and_a_file_planted_in_another_stages_folder_is_named(
    tmp_path,
):
    run = tmp_path / "run"
    with pytest.raises(StageProtocolError, match="returned evidence/good_ev.json, which is stage good's output"):
        run_recipe(MEDDLING, Cfg(summary="link_evidence"), run)
    assert sorted(p.name for p in (run / "evidence").iterdir()) == ["good_ev.json"]  # the link, not its target
    assert (run / "evidence" / "good_ev.json").read_text() == "{}"
    with pytest.raises(StageProtocolError, match="planted.txt is outside its folder"):
        run_recipe(MEDDLING, Cfg(summary="plant"), run, RunOptions(resume=True))
    assert (run / "good" / "planted.txt").exists()  # left: see OutputsWatch.remove_planted
    # and named by the next --resume: good's folder holds a file its outputs globs match that no record lists
    with pytest.raises(
        StageKeyChangedError, match="stage good: its outputs changed after it completed: planted.txt was added"
    ):
        run_recipe(MEDDLING, Cfg(), run, RunOptions(resume=True))
    (run / "good" / "planted.txt").unlink()
    assert [s.action for s in run_recipe(MEDDLING, Cfg(), run, RunOptions(resume=True)).stages] == ["skipped", "ran"]


def test_watching_thousands_of_recorded_files_costs_stats_only(tmp_path):
    """Two stats per recorded file of the other stages, no hashing when nothing changed (the cost measured is in
    OutputsWatch's docstring)."""
    import time

    from reproduction.digest_cache import DigestCache
    from reproduction.run.stage_outputs import OutputsWatch

    (tmp_path / "big").mkdir()
    outputs = {}
    for i in range(5000):
        p = tmp_path / "big" / f"f{i}.bin"
        p.write_bytes(b"x")
        st = p.stat()
        outputs[p.name] = [st.st_size, st.st_mtime_ns, "0" * 64]
    state = {"stages": {"big": {"status": "complete", "outputs": outputs}}}
    hashed = []
    digests = DigestCache(hasher=lambda path: hashed.append(path) or "0" * 64)
    t0 = time.perf_counter()
    watch = OutputsWatch.watch(tmp_path, state, "small")
    assert watch.refuse_changed(spec("small"), tmp_path / "small", {}, digests) == set()
    assert len(watch.files) == 5000 and not hashed
    assert time.perf_counter() - t0 < 2.0  # a generous bound; the docstring gives the measured cost
