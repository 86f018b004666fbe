"""Recipes by name: run/ imports no recipe; `portable run` finds a recipe by the config's `recipe:` (built-in or
`package.module:NAME` out of the tree); run folders written before recipes had names still resume."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"

TOY_MODULE = '''
"""A recipe of its own, outside the repository: two stages, a config schema."""
import dataclasses
from dataclasses import dataclass, field

from reproduction.recipe import Recipe, StageContext, StageOutput, StageSpec


@dataclass(kw_only=True, slots=True)
class Count:
    n: int = 3
    """How many numbers `make` writes."""


@dataclass(kw_only=True, slots=True)
class ToyConfig:
    BUNDLE: str = ""
    RUN: str = ""
    count: Count = field(default_factory=Count)
    note: str = ""
    """Read by no stage."""


def make(ctx: StageContext) -> StageOutput:
    out = ctx.out_dir / "numbers.txt"
    out.write_text("\\n".join(str(i) for i in range(ctx.config.count.n)) + "\\n")
    return StageOutput(files=[out], summary={"n": ctx.config.count.n})


def total(ctx: StageContext) -> StageOutput:
    numbers = (ctx.run_dir / "make" / "numbers.txt").read_text().split()
    out = ctx.out_dir / "total.txt"
    out.write_text(f"{sum(int(x) for x in numbers)}\\n")
    return StageOutput(files=[out], summary={"total": sum(int(x) for x in numbers)})


TOY = Recipe(
    name="toy",
    config_schema="toyrecipe:ToyConfig",
    stages=(
        StageSpec(name="make", fn="toyrecipe:make", config=("count",), inputs=False),
        StageSpec(name="total", fn="toyrecipe:total", needs=("make",), inputs=False),
    ),
)
NOT_A_RECIPE = ToyConfig


def good_report(run_dir):
    with open(run_dir / "report_calls.txt", "a") as f:
        f.write("called\\n")
    out = run_dir / "report.html"
    out.write_text("<p>total " + (run_dir / "total" / "total.txt").read_text().strip() + "</p>\\n")
    return out


def broken_report(run_dir):
    raise RuntimeError("the report broke")


@dataclass(kw_only=True, slots=True)
class BareConfig:
    """No BUNDLE or RUN fields: a recipe's schema need not offer ${BUNDLE} / ${RUN}."""
    count: Count = field(default_factory=Count)


BARE = dataclasses.replace(TOY, config_schema="toyrecipe:BareConfig")


def broken_total(ctx: StageContext) -> StageOutput:
    raise RuntimeError("the total broke")


BROKEN_STAGE = dataclasses.replace(
    TOY, stages=(TOY.stages[0], dataclasses.replace(TOY.stages[1], fn="toyrecipe:broken_total"))
)
REPORTED = dataclasses.replace(TOY, report="toyrecipe:good_report")
BROKEN_REPORT = dataclasses.replace(TOY, report="toyrecipe:broken_report")
'''


def portable(*args: str, cwd: Path, path: list[Path] = ()) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO), *map(str, path)]),
    }
    return subprocess.run(
        [sys.executable, "-m", "reproduction.portable", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=cwd,
    )


@pytest.fixture
def toy(tmp_path):
    """(the folder holding toyrecipe.py, a config naming recipe toyrecipe:TOY)."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "toyrecipe.py").write_text(TOY_MODULE)
    (lib / "brokenrecipe.py").write_text("raise RuntimeError('the recipe module broke')\n")
    config = tmp_path / "toy.yaml"
    config.write_text("recipe: toyrecipe:TOY\ncount: {n: 4}\n")
    return lib, config


# -- run/ imports no recipe -----------------------------------------------------------------------------------


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in a module, module-level and inside functions, relative ones resolved."""
    package = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            out += [(node.lineno, f"{base}.{a.name}" if base else a.name) for a in node.names]
            out.append((node.lineno, base))
    return out


def test_no_module_under_run_imports_a_recipe():
    """The runner, its config loader, preflight, evidence, lineage, record, report: none imports a recipe (a recipe
    is found by name, run/resolve.py), at module level or inside a function."""
    modules = sorted((REPO / "reproduction" / "run").rglob("*.py"))
    assert len(modules) > 10
    bad = [
        f"{p.relative_to(REPO)}:{line}: {name}"
        for p in modules
        for line, name in _imports(p)
        if name.startswith(("reproduction.recipes", "reproduction.recap"))
        or name in ("reproduction.recipes", "reproduction.recap")
    ]
    assert not bad, bad


def test_the_protocol_module_is_a_leaf():
    names = [n for _, n in _imports(REPO / "reproduction" / "recipe.py")]
    assert [n for n in names if n.startswith("reproduction")] == [
        "reproduction.errors.ConfigError",
        "reproduction.errors",
    ]


PIPELINE = ("run", "recipes", "recap", "train", "sim", "data")
SHARED = ("errors", "settings", "fsio", "ui", "digests", "digest_cache", "config_fields", "value_export")
SHARED += ("writers_lock", "numerics", "recipe", "redaction")
NEVER = {  # importer (a top-level module or package of reproduction/) -> what it never imports
    "run": ("recipes", "recap"),
    "release": PIPELINE,
    "checks": PIPELINE,
    "data": ("recap", "train", "sim", "run", "recipes"),
    "train": ("recap", "run", "recipes"),
    "recap": ("run", "recipes"),
    "sim": ("recap", "train", "run", "recipes"),
    **{name: ("release", "checks", *PIPELINE) for name in SHARED},
}
NEVER = {me: (*them, "portable") for me, them in NEVER.items()}  # the CLI is the top: no module imports it (R4)
ALLOWED = {("numerics", "reproduction.checks.host")}  # the CPU flags its kernel report names (lazily)
PORTABLE_TOP = {"reproduction.run.guards", "reproduction.train.heap"}  # stdlib only: no runtime for `verify`


def _unit(module: str) -> str | None:
    """The top-level module or package of reproduction/ a dotted name falls in (None outside reproduction/)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "reproduction" and len(parts) > 1 else None


def test_the_never_rules_of_the_dependency_map_hold():
    """docs/architecture.md's "Never" rules, over every import (module level and inside functions): release/ and
    checks/ (the control plane) import no pipeline package, the shared modules import no package, and the
    layering of data < sim, train < recap < recipes, with run/ importing no recipe."""
    bad = []
    for path in sorted((REPO / "reproduction").rglob("*.py")):
        me = _unit(".".join(path.relative_to(REPO).with_suffix("").parts))
        for line, name in _imports(path):
            them = _unit(name)
            if (
                them != me
                and them in NEVER.get(me, ())
                and not any(me == a and (name == b or name.startswith(b + ".")) for a, b in ALLOWED)
            ):
                bad.append(f"{path.relative_to(REPO)}:{line}: {name}")
    assert not bad, bad


def test_portable_imports_no_pipeline_module_at_module_level_but_two_stdlib_ones():
    """`portable.py` imports `run` and `train` lazily, but for run.guards and train.heap (stdlib only); recipes,
    recap, sim, data and checks only inside the commands that need them."""
    tree = ast.parse((REPO / "reproduction" / "portable.py").read_text(encoding="utf-8"))
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    top += [
        n
        for s in tree.body
        if isinstance(s, (ast.If, ast.Try))
        for n in ast.walk(s)
        if isinstance(n, (ast.Import, ast.ImportFrom))
    ]
    names = {a.name for n in top if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in top if isinstance(n, ast.ImportFrom) and n.module}
    heavy = {n for n in names if _unit(n) in ("checks", *PIPELINE)}
    assert heavy == PORTABLE_TOP


def test_the_architecture_layout_names_every_module_it_lists_file_by_file():
    """docs/architecture.md's layout lists the top-level modules, run/ and each recipe file by file (audit53 V9:
    digests.py, ui.py, value_export.py, run/cli_args.py and run/secrets.py, now redaction.py, were missing);
    `lineage*.py` covers lineage.py and lineage_check.py."""
    layout = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8").split("## Layout", 1)[1]
    layout = layout.split("## Dependency rules", 1)[0].replace("lineage*.py", "lineage.py lineage_check.py")
    listed = [*(REPO / "reproduction").glob("*.py"), *(REPO / "reproduction" / "run").glob("*.py")]
    listed += (REPO / "reproduction" / "recipes").glob("*/*.py")
    missing = [str(p.relative_to(REPO)) for p in listed if p.name != "__init__.py" and p.name not in layout]
    assert len(listed) > 60 and not missing, missing


# -- the RECAP recipe by name -----------------------------------------------------------------------------------


def test_a_config_without_recipe_is_recap_and_recap_is_found_by_name():
    from reproduction.recipes.recap import RECIPE
    from reproduction.run.config import recipe_name
    from reproduction.run.resolve import recipe_schema, resolve_recipe

    assert recipe_name([], []) == "recap"
    assert resolve_recipe("recap") is RECIPE and RECIPE.name == "recap"
    assert resolve_recipe("reproduction.recipes.recap:RECIPE") is RECIPE
    assert recipe_schema(RECIPE).__name__ == "RunConfig"
    assert [s.name for s in RECIPE.stages][:3] == ["returns", "value", "advantages"]


ADDED_SINCE = (("policy", "state_keys"), ("policy", "state_dims"))
"""Config fields added after bf2a15e (section, model field): unset ([] or None) they read what the code read then."""

KEYED_SINCE = (("value.train", "micro_batch"), ("policy", "train", "micro_batch"))
"""Fields bf2a15e left out of stage keys that were found to change outputs (audit56 D1: the flow-matching noise and
augmentation are drawn per micro batch) and keyed since, as paths in the key parts' config (the value stage keys its
subset `value.train`, the policy stage the whole `policy` section): taken out here, the rest must match bf2a15e's."""


def test_the_recap_demo_stage_keys_are_those_of_the_code_before_recipes_had_names():
    """Stage keys of the demo configs (fixed stand-ins for the datasets' fingerprints and upstream digests) as the
    code at bf2a15e computed them, with each code module's source digest replaced by a marker so an edit to a
    stage's code (which is meant to change its key) does not fail this test: the config subsets, exemptions,
    inputs, upstream names, files and code module names are what the move must keep, and the fields declared
    `same_outputs()` must leave out exactly what the hand-kept key_exempt lists did. The policy stage's keys are
    those of the code after recap/policy/task.py was split (its code list names config, setup and batches too).
    The LIBERO-10 config's policy key is the one after policy.model.hold_labels defaulted off (that config names
    no value, so its policy trains on other labels: its key must change; the demos name `true` and keep theirs)."""
    from types import SimpleNamespace

    from reproduction.config_fields import output_free_keys
    from reproduction.recipes.recap import RECIPE
    from reproduction.recipes.recap.config import load_config
    from reproduction.run.config import to_plain
    from reproduction.run.stage_keys import digest, key_parts

    expected = json.loads((FIXTURES / "recap_demo_stage_keys.json").read_text())
    got = {}
    for name in expected:
        cfg = load_config([REPO / name], ["eval.reference=null"], bundle=Path("/b"), run_dir=Path("/r"))
        inputs = {"sft": SimpleNamespace(fingerprint="f1"), "rollout": SimpleNamespace(fingerprint="f2")}
        got[name] = {}
        for spec in RECIPE.stages:
            parts = key_parts(spec, to_plain(cfg), inputs, {n: "u" + n for n in spec.needs}, output_free_keys(cfg))
            parts["code"] = dict.fromkeys(parts["code"], "<source>")
            assert parts.pop("fn") == spec.fn  # keyed since audit47; records without it: stage_keys.upgrade_parts
            if spec.fn.partition(":")[0] not in spec.code:  # the function's module, keyed since audit50_B: likewise
                del parts["code"][spec.fn.partition(":")[0]]
            for *path, key in KEYED_SINCE:
                section = parts["config"]
                for part in path:
                    section = section.get(part, {})
                section.pop(key, None)
            for section, key in ADDED_SINCE:  # unset, a field added since bf2a15e computes what the code did then
                model = parts["config"].get(section, {}).get("model", {})
                if key in model and model[key] in (None, []):
                    del model[key]
            got[name][spec.name] = digest(parts)
    assert got == expected


def test_every_built_in_recipe_is_found_by_name_with_a_loadable_schema():
    """reproduction/recipes/<name>/ exports RECIPE named <name>, whose config_schema loads its own defaults."""
    import dataclasses

    from reproduction.run.resolve import builtin_names, recipe_schema, resolve_recipe

    assert builtin_names() == ["grpo", "recap"]
    for name in builtin_names():
        recipe = resolve_recipe(name)
        assert recipe.name == name and resolve_recipe(f"reproduction.recipes.{name}:RECIPE") is recipe
        schema = recipe_schema(recipe)
        assert dataclasses.is_dataclass(schema()) and schema().recipe == name


@pytest.mark.parametrize(
    "value, words",
    [
        ("nosuch", "recipe: 'nosuch' is not a built-in recipe"),
        ("toyrecipe:NOPE", "recipe: 'toyrecipe:NOPE' names nothing, not a Recipe"),
        ("toyrecipe:NOT_A_RECIPE", "recipe: 'toyrecipe:NOT_A_RECIPE' names a type, not a Recipe"),
        ("brokenrecipe:X", "recipe: 'brokenrecipe:X' cannot be imported: RuntimeError: the recipe module broke"),
        ("nomodule.here:X", "recipe: 'nomodule.here:X' cannot be imported"),
        ("not a name", "recipe: 'not a name' is neither a built-in recipe nor package.module:NAME"),
    ],
)
def test_a_recipe_that_cannot_be_had_is_one_config_error_naming_it(toy, tmp_path, value, words):
    lib, config = toy
    proc = portable(
        "run", "--config", str(config), "--output", str(tmp_path / "r"), f"recipe={value}", cwd=tmp_path, path=[lib]
    )
    assert proc.returncode == 4, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith("error: " + words), lines
    assert "Traceback" not in proc.stderr and not (tmp_path / "r").exists()


# -- an out-of-tree recipe through `portable run` -----------------------------------------------------------


def test_an_out_of_tree_recipe_runs_resumes_and_records_lineage(toy, tmp_path):
    lib, config = toy
    run = tmp_path / "run"
    proc = portable("run", "--config", str(config), "--output", str(run), "--json", cwd=tmp_path, path=[lib])
    assert proc.returncode == 0, proc.stderr
    assert [(s["stage"], s["action"]) for s in json.loads(proc.stdout)["stages"]] == [("make", "ran"), ("total", "ran")]
    assert (run / "total" / "total.txt").read_text() == "6\n"
    state = json.loads((run / "run.json").read_text())
    assert (state["recipe"], state["recipe_ref"], state["config"]["count"]) == ("toy", "toyrecipe:TOY", {"n": 4})
    assert "recipe" not in state["config"]  # its schema has no `recipe` field: the key named the recipe only
    assert sorted(p.name for p in (run / "lineage").iterdir()) == ["make.intoto.json", "total.intoto.json"]
    assert not (run / "report.html").exists() and not (run / "plots").exists()  # a recipe without `report`

    again = portable(
        "run", "--config", str(config), "--output", str(run), "--resume", "--json", cwd=tmp_path, path=[lib]
    )
    assert again.returncode == 0, again.stderr
    assert [s["action"] for s in json.loads(again.stdout)["stages"]] == ["skipped", "skipped"]

    verify = portable("lineage", str(run), "--verify", cwd=tmp_path, path=[lib])
    assert verify.returncode == 0, verify.stderr
    no_eval = portable("eval", "--checkpoint", "1", "--output", str(run), cwd=tmp_path, path=[lib])
    assert no_eval.returncode == 2 and "recipe 'toyrecipe:TOY' has no `portable eval" in no_eval.stderr, no_eval.stderr

    changed = portable(
        "run", "--config", str(config), "--output", str(run), "--resume", "count.n=5", cwd=tmp_path, path=[lib]
    )
    assert changed.returncode == 52 and "stage make: its inputs changed" in changed.stderr, changed.stderr
    redo = portable(
        "run",
        "--config",
        str(config),
        "--output",
        str(run),
        "--restart-stage",
        "make",
        "count.n=5",
        "--json",
        cwd=tmp_path,
        path=[lib],
    )
    assert redo.returncode == 0, redo.stderr
    assert [s["action"] for s in json.loads(redo.stdout)["stages"]] == ["ran", "ran"]
    assert (run / "total" / "total.txt").read_text() == "10\n"


def test_an_out_of_tree_recipe_without_a_preflight_gets_the_checks_every_run_gets(toy, tmp_path):
    """The runner's own preflight (run/preflight.py's run_problems) runs for every recipe: a placeholder path left
    in the config stops the run before anything is written, naming the key, whether or not the recipe checks."""
    lib, config = toy
    run = tmp_path / "run"
    proc = portable(
        "run", "--config", str(config), "--output", str(run), "note=/path/to/notes.txt", cwd=tmp_path, path=[lib]
    )
    assert proc.returncode == 4, proc.stderr
    assert proc.stderr.splitlines()[0] == (
        "error: note: '/path/to/notes.txt' still holds a /path/to/ placeholder; set a real path"
    ), proc.stderr
    assert not run.exists()


def test_a_recipe_whose_schema_has_no_bundle_or_run_fields_runs(toy, tmp_path):
    """The loader puts --output (and a bundle) into the schema's RUN / BUNDLE fields only where it has them (until
    2026-12-05 a schema without them failed every run: `unknown config key RUN`)."""
    lib, config = toy
    run = tmp_path / "run"
    proc = portable(
        "run", "--config", str(config), "--output", str(run), "recipe=toyrecipe:BARE", cwd=tmp_path, path=[lib]
    )
    assert proc.returncode == 0, proc.stderr
    assert (run / "total" / "total.txt").read_text() == "6\n"
    assert json.loads((run / "run.json").read_text())["config"] == {"count": {"n": 4}}


def test_an_out_of_tree_stage_that_raises_is_named_as_the_recipes_code_and_recorded_failed(toy, tmp_path):
    lib, config = toy
    run = tmp_path / "run"
    proc = portable(
        "run", "--config", str(config), "--output", str(run), "recipe=toyrecipe:BROKEN_STAGE", cwd=tmp_path, path=[lib]
    )
    assert proc.returncode == 1, proc.stderr
    first, hint = proc.stderr.strip().splitlines()[-2:]
    assert first == "error: RuntimeError: the total broke"
    assert (
        hint.startswith(f"hint: raised at {lib / 'toyrecipe.py'}:") and "(broken_total), outside recap-portable" in hint
    )
    stages = json.loads((run / "run.json").read_text())["stages"]
    assert (stages["make"]["status"], stages["total"]["status"]) == ("complete", "failed")
    assert stages["total"]["error"] == "RuntimeError: the total broke"


def test_the_runner_writes_the_recipes_report_after_stages_that_ran_and_leaves_it_otherwise(toy, tmp_path):
    lib, config = toy
    run = tmp_path / "run"

    def go(*extra: str) -> subprocess.CompletedProcess:
        args = ("run", "--config", str(config), "--output", str(run), "recipe=toyrecipe:REPORTED", *extra)
        proc = portable(*args, cwd=tmp_path, path=[lib])
        assert proc.returncode == 0, proc.stderr
        return proc

    def calls() -> int:
        return len((run / "report_calls.txt").read_text().splitlines())

    go()
    assert (run / "report.html").read_text() == "<p>total 6</p>\n" and calls() == 1
    before = (run / "report.html").stat().st_mtime_ns
    go("--resume")  # everything skipped: the report is left as it was
    assert calls() == 1 and (run / "report.html").stat().st_mtime_ns == before
    (run / "report.html").unlink()
    go("--resume")  # everything skipped, but no report: written again
    assert calls() == 2 and (run / "report.html").is_file()
    go("--restart-stage", "make", "count.n=5")  # a stage ran: rewritten from what the run now holds
    assert calls() == 3 and (run / "report.html").read_text() == "<p>total 10</p>\n"


RAISES = '    raise RuntimeError("the report broke")'


def test_a_report_that_raises_is_a_warning_and_the_run_stays_complete(toy, tmp_path):
    lib, config = toy
    run = tmp_path / "run"
    args = ("run", "--config", str(config), "--output", str(run), "recipe=toyrecipe:BROKEN_REPORT", "--json")
    proc = portable(*args, cwd=tmp_path, path=[lib])
    assert proc.returncode == 0, proc.stderr
    assert [s["action"] for s in json.loads(proc.stdout)["stages"]] == ["ran", "ran"]  # stdout: the data only
    warning = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert warning == [  # the recipe's own code raised it: where, and that a rerun alone repeats it (audit65_B L3)
        "warning: the run is complete, but its report was not written (RuntimeError: the report broke, raised at "
        f"{(lib / 'toyrecipe.py').resolve()}:{TOY_MODULE.splitlines().index(RAISES) + 1}); fix it, then `portable "
        "run ... --resume` writes it"
    ], proc.stderr
    state = json.loads((run / "run.json").read_text())
    assert [s["status"] for s in state["stages"].values()] == ["complete", "complete"]
    assert not (run / "report.html").exists()
    again = portable(*args, "--resume", "-q", cwd=tmp_path, path=[lib])  # tried again, and warned even with -q
    assert again.returncode == 0 and "warning: the run is complete, but its report" in again.stderr, again.stderr
    assert [s["action"] for s in json.loads(again.stdout)["stages"]] == ["skipped", "skipped"]


def test_a_run_folder_of_one_recipe_refuses_another(toy, tmp_path):
    lib, config = toy
    run = tmp_path / "run"
    assert portable("run", "--config", str(config), "--output", str(run), cwd=tmp_path, path=[lib]).returncode == 0
    other = tmp_path / "recap.yaml"
    other.write_text("datasets: []\n")
    proc = portable("run", "--config", str(other), "--output", str(run), "--resume", cwd=tmp_path, path=[lib])
    assert proc.returncode == 55 and "holds a 'toy' run, not 'recap'" in proc.stderr, proc.stderr


# -- run folders written before recipes had names ---------------------------------------------------------------


def test_a_run_folder_written_before_recipes_had_names_resumes(tmp_path):
    """tests/fixtures/run_v1_recap: `portable run --stages returns` by the code at bf2a15e (run.json without
    recipe_ref, its config without `recipe`). Resumed by today's code from another folder: the stage is skipped
    (its key is unchanged), run.json gains recipe_ref and keeps its stage record. The record's code digests are
    first set to today's sources (with the key they give): an edit to the returns stage's code is meant to
    change its key, and this test is about the record's shape, not about that code staying as it was."""
    from reproduction.run.stage_keys import digest, module_digest

    root = tmp_path / "old"
    shutil.copytree(FIXTURES / "run_v1_recap", root)
    # The stage's code modules were edited since bf2a15e (main's stage-3 rework touched recap/returns.py), which is
    # meant to change its key: the copy records today's source digests (its key recomputed from its recorded parts),
    # so what is checked is the rest of the key (config, inputs, upstream) and the run.json migration.
    state = json.loads((root / "run" / "run.json").read_text())
    for rec in state["stages"].values():
        assert digest(rec["key_parts"]) == rec["key"]
        rec["key_parts"]["code"] = {m: module_digest(m) for m in rec["key_parts"]["code"]}
        rec["key"] = digest(rec["key_parts"])
    (root / "run" / "run.json").write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")
    before = json.loads((root / "run" / "run.json").read_text())
    assert "recipe_ref" not in before and "recipe" not in before["config"]
    proc = portable(
        "run", "--config", "run.yaml", "--output", "run", "--stages", "returns", "--resume", "--json", cwd=root
    )
    assert proc.returncode == 0, proc.stderr
    assert [(s["stage"], s["action"]) for s in json.loads(proc.stdout)["stages"]] == [("returns", "skipped")]
    after = json.loads((root / "run" / "run.json").read_text())
    assert (after["recipe"], after["recipe_ref"], after["config"]["recipe"]) == ("recap", "recap", "recap")
    # the record takes today's key: its parts with the stage function added (keyed since audit47) and its module's
    # source (keyed beside the stage's `code` since audit50_B), nothing else
    parts = after["stages"]["returns"]["key_parts"]
    assert parts.pop("fn") == "reproduction.recipes.recap.recipe:returns_stage"
    assert parts["code"].pop("reproduction.recipes.recap.recipe") == module_digest("reproduction.recipes.recap.recipe")
    assert (
        parts == before["stages"]["returns"]["key_parts"]
        and after["stages"]["returns"]["key"] != before["stages"]["returns"]["key"]
    )
    assert after["run_id"] == before["run_id"]


def test_upgrade_state_fills_what_older_records_lack():
    from reproduction.run.record import upgrade_state

    old = {"recipe": "recap", "config": {"returns": {}}, "stages": {}}
    assert upgrade_state(old) == {
        "recipe": "recap",
        "recipe_ref": "recap",
        "config": {"recipe": "recap", "returns": {}},
        "stages": {},
    }
    toy = {"recipe": "toy", "config": {"count": {}}, "stages": {}}
    assert upgrade_state(toy)["recipe_ref"] == "toy" and "recipe" not in toy["config"]
    new = {"recipe": "toy", "recipe_ref": "toyrecipe:TOY", "config": {}, "stages": {}}
    assert upgrade_state(dict(new)) == new


ADDED_AT_DEFAULT = (
    "policy.model.discrete_state_input",
    "policy.model.image_augment",
    "policy.model.norm",
    "policy.model.norm_stats",
)
"""Fields added since (config_fields.added_field): free of the stage keys at their default only, which is what the
code did before they existed (the pi05 preset's openpi prompt, normalisation and augmentation, 2026-12-05)."""


def test_fields_declare_whether_they_change_outputs_once():
    """The trainer's resume key and the stage keys read the same declaration (`same_outputs()` on the field): the
    resume key holds what the hand-kept list held, and the RECAP config's free keys are the old key_exempt lists."""
    from reproduction.config_fields import output_free_keys
    from reproduction.recipes.recap.config import RunConfig
    from reproduction.train.config import RESUME_KEY_FIELDS, TrainConfig

    before = ("seed", "global_batch", "lr", "betas", "eps", "weight_decay", "warmup_steps", "grad_clip")
    keyed_since = ("micro_batch",)  # audit56 D1: KEYED_SINCE
    assert sorted(RESUME_KEY_FIELDS) == sorted((*before, "mixed_precision", "shuffle", "canary_samples", *keyed_since))
    train_free = sorted(output_free_keys(TrainConfig))
    assert "max_steps" not in train_free and not set(train_free) & set(RESUME_KEY_FIELDS)
    free = output_free_keys(RunConfig())
    assert sorted(k for k in free if not k.startswith(("value.train.", "policy.train."))) == sorted(
        ["eval.reference", "eval.workers", "policy.model.execute_steps", *ADDED_AT_DEFAULT]
    )
    assert not set(ADDED_AT_DEFAULT) & set(output_free_keys(RunConfig))  # a field of the class: keyed when set
    assert sorted(k[len("value.train.") :] for k in free if k.startswith("value.train.")) == train_free


def test_the_setup_guards_read_the_fields_declarations():
    """The value and policy setup guards let exactly the fields declared `same_outputs(on_resume=True)` change on
    resume: the sets their hand-kept lists (_NOT_IN_RESUME_KEY, _FREE_ON_RESUME) held; stage keys do not drop them."""
    from reproduction.config_fields import output_free_keys
    from reproduction.recap.policy import setup as policy_setup
    from reproduction.recap.value import task as value_task
    from reproduction.recipes.recap.config import RunConfig

    value_before = (  # and "eval": the extra evaluation datasets, now the stage's argument, which the guard ignores
        "eval_max_samples",
        "eval_micro_batch",
        "tokenizer",
        "pretrained_manifest",
        "weights_dir",
        "allow_unpinned",
        "model_seed",
        "return_min",
        "return_max",
        "folds",
        "fold_seed",
    )
    policy_before = ("execute_steps", "num_steps", "tokenizer", "model_seed", "pretrained_manifest", "weights_dir")
    assert sorted(value_task.RESUME_FREE) == sorted(value_before)
    assert value_task.SOURCE_RESUME_FREE == ("path", "returns")  # the hand list compared name, type, weight, tag
    assert sorted(policy_setup.RESUME_FREE) == sorted(policy_before)
    free = output_free_keys(RunConfig())
    assert not [k for k in free if k.startswith("value.model.")]
    assert [k for k in free if k.startswith("policy.model.") and k not in ADDED_AT_DEFAULT] == [
        "policy.model.execute_steps"
    ]


# -- one settings module -----------------------------------------------------------------------------------------


def test_every_portable_knob_is_read_through_the_settings_module():
    """No module but reproduction/settings.py names a PORTABLE_* variable in code (docstrings may mention them), and
    docs/settings.md is what the module generates."""
    from reproduction import settings

    found = []
    for path in sorted((REPO / "reproduction").rglob("*.py")):
        if path.name == "settings.py" and path.parent.name == "reproduction":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
        }
        docs |= {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
        found += [
            f"{path.relative_to(REPO)}:{n.lineno}: {n.value}"
            for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and "PORTABLE_" in n.value and id(n) not in docs
        ]
    assert not found, found
    assert {s.name for s in settings.SETTINGS} >= {"PORTABLE_CACHE_DIR", "PORTABLE_CPU_KERNELS", "PORTABLE_NO_PROGRESS"}
    assert (REPO / "docs" / "settings.md").read_text() == settings.reference(), (
        "regenerate: python -m reproduction.settings > docs/settings.md"
    )
