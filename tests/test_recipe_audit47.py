"""An out-of-tree recipe's own shapes and values, met by recap-portable (audit47): its `eval` stage's summary is not
RECAP's (F3), its `evaluate` has another signature (F6), its `config_schema` is no dataclass (F7), it hands the
evidence API an impossible count (F9). Each is the recipe's business, so none may end as "internal error ... a bug in
recap-portable" (exit 1), and a finished run never fails on its headline. A toy recipe through the CLI; fast."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from reproduction.recipe import Recipe, StageContext, StageOutput, StageSpec


@dataclass(kw_only=True)
class Eval:
    episodes: int = 4


@dataclass(kw_only=True)
class ToyConfig:
    RUN: str = ""
    eval: Eval = field(default_factory=Eval)


def eval_stage(ctx: StageContext) -> StageOutput:
    """Writes its evidence with the documented API; its summary is of the shape the test names (TOY47_SUMMARY)."""
    from reproduction.run.evidence import EvalRecord, write_eval_evidence

    n = ctx.config.eval.episodes
    record = EvalRecord(result={"tasks": {"toy": {"episodes": n, "success_once": 0}}}, label="mine", mode="toy")
    path = write_eval_evidence(
        ctx.run_dir / "evidence" / "eval_mine_1.json", record, name="t", run_id="r", seeds={}, settings={}
    )
    return StageOutput(files=[path], summary=json.loads(os.environ.get("TOY47_SUMMARY", "{}")))


def compare_stage(ctx: StageContext) -> StageOutput:
    out = ctx.out_dir / "verdict.json"
    out.write_text('{"ok": true}\n')
    return StageOutput(files=[out], summary={"ok": True})


def raising_headline(run_dir: Path) -> list[str]:
    raise RuntimeError("the headline broke")


def evaluate_two_args(args, ui):  # the signature Recipe.evaluate's docstring gave until audit47
    return 0


def evaluate_four_args(args, run_dir, state, ui):
    print(f"evaluated {args.checkpoint} in {run_dir.name}, run {state is not None}")
    return 0


def evaluate_says_ok(args, run_dir, state, ui):
    return "ok"


RECIPE = Recipe(
    name="toy47",
    config_schema=f"{__name__}:ToyConfig",
    stages=(
        StageSpec(name="eval", fn=f"{__name__}:eval_stage", config=("eval",), inputs=False),
        StageSpec(name="compare", fn=f"{__name__}:compare_stage", needs=("eval",), inputs=False),
    ),
)
RAISING_HEADLINE = dataclasses.replace(RECIPE, headline=f"{__name__}:raising_headline")
RECAP_HEADLINE = dataclasses.replace(RECIPE, headline="reproduction.run.compare_cmd:run_results_lines")
TWO_ARGS = dataclasses.replace(RECIPE, evaluate=f"{__name__}:evaluate_two_args")
FOUR_ARGS = dataclasses.replace(RECIPE, evaluate=f"{__name__}:evaluate_four_args")
SAYS_OK = dataclasses.replace(RECIPE, evaluate=f"{__name__}:evaluate_says_ok")
NOT_A_DATACLASS = dataclasses.replace(RECIPE, config_schema=f"{__name__}:eval_stage")


@pytest.fixture
def cli(tmp_path, capsys, monkeypatch):
    """portable(*args, recipe=NAME, summary=SUMMARY) -> (exit code, stderr lines); in-process, a config naming the
    recipe attribute of this module."""
    from reproduction.portable import main

    def portable(*args: str, recipe: str = "RECIPE", summary: object = None) -> tuple[int, list[str]]:
        (tmp_path / "run.yaml").write_text(f"recipe: {__name__}:{recipe}\n")
        monkeypatch.setenv("TOY47_SUMMARY", json.dumps(summary or {}))
        capsys.readouterr()
        code = main([args[0], "--config", str(tmp_path / "run.yaml"), *args[1:]])
        captured = capsys.readouterr()
        return code, captured.err.splitlines() + captured.out.splitlines()

    return portable


# -- F3: the headline -----------------------------------------------------------------------------------------


SHAPES = [
    {"results": ["mine", 0.5]},
    {"results": {"mine": 0.5}},
    {"results": {"mine": {"tasks": {"t": {"episodes": "twenty"}}}}},
    {"results": {"mine": {"tasks": [1, 2]}}},
    {"results": {"mine": {"tasks": {"t": {"episodes": 4, "success_at_end": 9}}}}},
    {"sequential": {"why": "stopped"}},
    {"sequential": "yes"},
    {"rate": 0.25},
]


@pytest.mark.parametrize("summary", SHAPES)
def test_a_recipe_without_a_headline_ends_its_run_with_exit_0_whatever_its_eval_summary(tmp_path, cli, summary):
    """Until audit47 any recipe's stage *named* eval was read as RECAP's: a `results` of another shape was exit 1
    (internal error) after every stage completed, and on every --resume; and each run said "no reference evidence
    in the bundle" with no bundle at all."""
    run = str(tmp_path / "run")
    for extra in ((), ("--resume",)):
        code, err = cli("run", "--output", run, "--no-progress", *extra, summary=summary)
        assert code == 0, err
        assert not any("error" in line or "reference evidence" in line for line in err), err
    state = json.loads((tmp_path / "run" / "run.json").read_text())
    assert [s["status"] for s in state["stages"].values()] == ["complete", "complete"]


@pytest.mark.parametrize("summary", [*SHAPES, [1], "text", None])
def test_the_recap_headline_leaves_out_what_is_not_of_its_shape_and_never_raises(tmp_path, summary):
    from reproduction.run.compare_cmd import run_results_lines

    good = {"episodes": 10, "success_at_end": 4, "success_once": 5}
    for stages in (
        {"eval": {"summary": summary}},
        {"eval": {"summary": {"results": {"bc": {"tasks": {"t": good}}, "odd": summary}}}},
        {"eval": "x", "compare": {"status": "complete", "summary": summary}},
        ["eval"],
    ):
        (tmp_path / "run.json").write_text(json.dumps({"stages": stages, "config": summary}))
        lines = run_results_lines(tmp_path)
        assert all(isinstance(line, str) for line in lines)
    assert lines == []
    (tmp_path / "run.json").write_text(
        json.dumps({"stages": {"eval": {"summary": {"results": {"bc": {"tasks": {"t": good}}, "odd": summary}}}}})
    )
    assert run_results_lines(tmp_path) == [
        "bc             success at end  40.0% (4/10, 95% CI 16.8%-68.7%), at any step  50.0%",
        "",
    ]


@pytest.mark.parametrize(
    "bundle, compare, line",
    [
        (
            "/b",
            {"status": "complete", "summary": {"reference": None, "verdict": None}},
            "no reference evidence in the bundle to compare with",
        ),
        (
            "",
            {"status": "complete", "summary": {"reference": None, "verdict": None}},
            "no reference evidence to compare with (eval.reference is not set)",
        ),
        (
            None,
            {"status": "complete", "summary": {"reference": None, "verdict": None}},
            "no reference evidence to compare with (eval.reference is not set)",
        ),
        (
            "/b",
            {"status": "complete", "summary": {"reference": "r.json", "verdict": "reproduced"}},
            "against the reference evidence: reproduced",
        ),
        ("/b", None, None),  # no compare stage ran (`--stages eval`): nothing said of a reference
        ("/b", {"status": "failed", "summary": {}}, None),
    ],
)
def test_the_headline_speaks_of_a_bundles_reference_only_for_a_run_with_a_bundle_whose_compare_ran(
    tmp_path, bundle, compare, line
):
    from reproduction.run.compare_cmd import run_results_lines

    tasks = {"t": {"episodes": 10, "success_at_end": 4, "success_once": 5}}
    stages = {"eval": {"status": "complete", "summary": {"results": {"bc": {"tasks": tasks}}}}}
    stages |= {"compare": compare} if compare else {}
    config = {} if bundle is None else {"BUNDLE": bundle}
    (tmp_path / "run.json").write_text(json.dumps({"stages": stages, "config": config}))
    lines = run_results_lines(tmp_path)
    assert lines[0].startswith("bc ") and lines[-1] == ""
    assert lines[1:-1] == ([line] if line else [])


def test_a_recipes_own_headline_is_printed_and_one_that_raises_is_a_warning_not_a_failed_run(tmp_path, cli):
    tasks = {"t": {"episodes": 10, "success_at_end": 4, "success_once": 5}}
    run = str(tmp_path / "run")
    code, err = cli(
        "run", "--output", run, "--no-progress", recipe="RECAP_HEADLINE", summary={"results": {"bc": {"tasks": tasks}}}
    )
    assert (
        code == 0 and err[-1] == "bc             success at end  40.0% (4/10, 95% CI 16.8%-68.7%), at any step  50.0%"
    ), err
    for extra in ((), ("--resume", "-q")):
        code, err = cli("run", "--output", str(tmp_path / "other"), "--no-progress", *extra, recipe="RAISING_HEADLINE")
        assert code == 0, err
        assert err[-1] == (
            "warning: the run is complete, but the headline of recipe 'toy47' was not printed "
            "(RuntimeError: the headline broke)"
        ), err


MISSPELT_HEADLINE = dataclasses.replace(RECIPE, headline=f"{__name__}:raising_headlin")
NO_MODULE_HEADLINE = dataclasses.replace(RECIPE, headline="no_such_module47:headline")
LIST_HEADLINE = dataclasses.replace(RECIPE, headline=f"{__name__}:SHAPES")


@pytest.mark.parametrize(
    ("recipe", "ref", "why"),
    [
        ("MISSPELT_HEADLINE", f"{__name__}:raising_headlin", f"module {__name__!r} has no attribute 'raising_headlin'"),
        ("NO_MODULE_HEADLINE", "no_such_module47:headline", "module 'no_such_module47' cannot be imported"),
        ("LIST_HEADLINE", f"{__name__}:SHAPES", f"{__name__}.SHAPES is a list, not a function"),
    ],
)
def test_a_headline_that_names_no_function_is_refused_before_any_stage_runs(tmp_path, cli, recipe, ref, why):
    """Stop 48: a misspelt Recipe.headline was found only after every stage had run (a training could be hours), as a
    warning line. Like a misspelt stage function, it is a ConfigError (exit 4) naming the recipe and the reference,
    before anything runs: no run folder is made."""
    run = tmp_path / "run"
    code, err = cli("run", "--output", str(run), "--no-progress", recipe=recipe)
    assert code == 4, err
    assert len(err) == 2 and err[0].startswith(f"error: recipe toy47: its headline {ref!r} cannot be loaded: {why}")
    assert err[1].startswith("hint: fix the spelling of the Recipe's headline"), err
    assert not run.exists()


# -- F6: Recipe.evaluate's signature ---------------------------------------------------------------------------


HINT_EVALUATE = (
    "hint: write it as def cmd_eval(args, run_dir, state, ui) -> int (reproduction/recipe.py: Recipe.evaluate)"
)


def test_an_evaluate_of_another_signature_is_a_protocol_error_naming_the_recipe_and_the_signature(tmp_path, cli):
    """The docstring gave (args, ui); the CLI calls (args, run_dir, state, ui), so a function written to the docstring
    was "internal error: TypeError ... a bug in recap-portable" (exit 1)."""
    out = str(tmp_path / "r")
    code, err = cli("eval", "--checkpoint", "1", "--output", out, recipe="TWO_ARGS")
    assert code == 54, err
    assert err == [
        f"error: recipe '{__name__}:TWO_ARGS': evaluate '{__name__}:evaluate_two_args' cannot be called as "
        "(args, run_dir, state, ui): too many positional arguments",
        HINT_EVALUATE,
    ]
    code, err = cli("eval", "--checkpoint", "1", "--output", out, recipe="SAYS_OK")
    assert code == 54 and err == [
        f"error: recipe '{__name__}:SAYS_OK': evaluate '{__name__}:evaluate_says_ok' returned 'ok', not an exit code",
        HINT_EVALUATE,
    ], err
    code, err = cli("eval", "--checkpoint", "1", "--output", out, recipe="FOUR_ARGS")
    assert code == 0 and err == ["evaluated 1 in r, run False"], err


# -- F7: a config_schema that is no dataclass ------------------------------------------------------------------


def test_a_config_schema_that_is_no_dataclass_is_one_config_error_naming_the_recipe_and_the_value(tmp_path, cli):
    """It was "internal error: ValidationError: Object of unsupported type: 'function'" (exit 1)."""
    code, err = cli("run", "--output", str(tmp_path / "r"), recipe="NOT_A_DATACLASS")
    assert code == 4, err
    assert err == [
        f"error: recipe 'toy47': config_schema '{__name__}:eval_stage' names a function, not a dataclass",
        "hint: point the recipe's config_schema at a 'module:Class' whose class is a @dataclass (docs/recipes.md)",
    ]
    assert not (tmp_path / "r").exists()


# -- F9: bad values handed to the evidence API -----------------------------------------------------------------


def test_an_impossible_count_handed_to_the_evidence_api_is_invalid_input_naming_the_record_field_and_value(
    tmp_path, cli
):
    """`eval.episodes=-1` reached count_metric's plain ValueError, which the CLI called "a bug in recap-portable"
    (exit 1). It is the caller's value: InvalidInputError (exit 4), as the API's other refusals of a result are,
    and the stage is recorded failed."""
    run = tmp_path / "run"
    code, err = cli("run", "--output", str(run), "--no-progress", "eval.episodes=-1")
    assert code == 4, err
    assert err[-2:] == [
        "error: EvalRecord 'mine': tasks['toy']: episodes is -1, not a count >= 0",
        "hint: hand the evidence API whole counts, 0 <= successes <= episodes (EvalRecord.result as reproduction.sim's "
        "EvalResult.to_dict() gives it); check the evaluation settings that produced them",
    ]
    assert json.loads((run / "run.json").read_text())["stages"]["eval"]["status"] == "failed"


@pytest.mark.parametrize(
    "row, words",
    [
        (
            {"episodes": 4, "success_once": 5},
            "EvalRecord 'r': tasks['t'].success_once: success count 5 of 4 episodes is impossible",
        ),
        ({"episodes": 4, "success_once": -1}, "EvalRecord 'r': tasks['t'].success_once: success count -1 of 4"),
        ({"episodes": 4, "success_once": 1, "success_at_end": 7}, "tasks['t'].success_at_end: success count 7 of 4"),
        (
            {"episodes": "twenty", "success_once": 1},
            "EvalRecord 'r': tasks['t']: episodes is 'twenty', not a count >= 0",
        ),
        ({"episodes": 2.5, "success_once": 1}, "episodes is 2.5, not a count >= 0"),
    ],
)
def test_the_evidence_api_names_the_record_and_the_field_of_a_bad_count(row, words):
    from reproduction.errors import InvalidInputError
    from reproduction.run.evidence import EvalRecord, build_evidence, count_metric

    with pytest.raises(InvalidInputError) as err:
        build_evidence(
            EvalRecord(result={"tasks": {"t": row}}, label="r", mode="m"), name="n", run_id="r", seeds={}, settings={}
        )
    assert err.value.exit_code == 4 and words in str(err.value), str(err.value)
    with pytest.raises(InvalidInputError, match=r"count_metric\(successes=0, episodes=-1\): not a success count"):
        count_metric(0, -1)
    with pytest.raises(InvalidInputError, match="labels must be unique"):
        record = EvalRecord(result={"tasks": {"t": {"episodes": 2, "success_once": 1}}}, label="r", mode="m")
        build_evidence(record, baselines=[record], name="n", run_id="r", seeds={}, settings={})
    valid = EvalRecord(result={"tasks": {"t": {"episodes": 4.0, "success_once": "1/4"}}}, label="r", mode="m")
    doc = build_evidence(valid, name="n", run_id="r", seeds={}, settings={})  # as int() read them before
    assert doc["metrics"]["success_once"]["display"] == "25.0% (1/4)"
