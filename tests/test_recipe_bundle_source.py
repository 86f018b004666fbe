"""audit54 A1: `portable run BUNDLE` of a bundle shipping an out-of-tree recipe in a source layer runs the module on
PYTHONPATH; one whose bytes differ from the layer's copy is refused before anything runs (exit 5, both files and
digests named), one not importable at all is told which layer folder to put on PYTHONPATH, and the file that ran is
recorded in run.json (`recipe_module`). audit54 R4: every .py file of the recipe's package is compared (a doctored
sibling module, one missing or one only on the import side is refused), without executing the package's __init__.
audit54 R5: the recipe file is no lineage material of its own (the bundle's source layer is), so editing it after a
run without a bundle leaves `lineage --verify` passing."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from bundlekit import QUIET
from recipe_cli import run_portable

from reproduction.errors import ConfigError, IntegrityError
from reproduction.run.recipe_source import check_recipe_source

MODULE = """\
from dataclasses import dataclass

from reproduction.fsio import atomic_write_text
from reproduction.recipe import Recipe, StageOutput, StageSpec


@dataclass(kw_only=True)
class Cfg:
    BUNDLE: str = ""
    RUN: str = ""
    n: int = 3


def g(ctx):
    out = ctx.out_dir / "n.json"
    atomic_write_text(out, str(ctx.config.n * VALUE))
    return StageOutput(files=[out])


VALUE = 1
STAGE = StageSpec(name="g", fn="pkga1.r:g", inputs=False)
RECIPE = Recipe(name="shipped", config_schema="pkga1.r:Cfg", stages=(STAGE,))
"""


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    """A restored bundle whose source layer `a1src` holds pkga1/r.py and whose config names pkga1.r:RECIPE."""
    from reproduction.release.pack import pack_bundle
    from reproduction.release.restore import restore_bundle

    root = tmp_path_factory.mktemp("a1")
    src = root / "src"
    (src / "project" / "pkga1").mkdir(parents=True)
    (src / "project" / "pkga1" / "__init__.py").write_text("")
    (src / "project" / "pkga1" / "r.py").write_text(MODULE)
    (src / "run.yaml").write_text("recipe: pkga1.r:RECIPE\n")
    (src / "spec.toml").write_text(
        'name = "a1"\nroot = "."\nentry_config = "config/run.yaml"\n'
        '[[layer]]\nsource = "project"\nkind = "source"\nname = "a1src"\n'
        '[[config]]\nsource = "run.yaml"\ndest = "config/run.yaml"\n'
    )
    pack_bundle(src / "spec.toml", root / "b", ui=QUIET)
    restore_bundle(root / "b", ui=QUIET)
    return root / "b"


def _copy(folder: Path, text: str) -> Path:
    (folder / "pkga1").mkdir(parents=True)
    (folder / "pkga1" / "__init__.py").write_text("")
    (folder / "pkga1" / "r.py").write_text(text)
    return folder


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_doctored_copy_on_pythonpath_is_refused_before_anything_runs(bundle, tmp_path):
    mine = _copy(tmp_path / "mine", MODULE.replace("VALUE = 1", "VALUE = 20  # doctored"))
    shipped = bundle / "source" / "a1src" / "pkga1" / "r.py"
    done = run_portable(mine, "run", str(bundle), "--output", str(tmp_path / "run"))
    assert done.returncode == 5, done.stderr
    mine_sha, shipped_sha = _sha(mine / "pkga1" / "r.py"), _sha(shipped)
    assert done.stderr.splitlines() == [
        f"error: recipe: 'pkga1.r:RECIPE' would run {mine / 'pkga1' / 'r.py'} (sha256 {mine_sha[:12]}), not the "
        f"bundle's copy {shipped} (sha256 {shipped_sha[:12]}) that its lineage names",
        f"hint: to run the bundle's code put {bundle / 'source' / 'a1src'} first on PYTHONPATH; to run yours, repack "
        "the bundle with it (`portable pack`)",
    ]
    assert not (tmp_path / "run").exists()


def test_the_same_bytes_run_and_the_file_is_recorded_in_run_json_and_the_lineage(bundle, tmp_path):
    mine = _copy(tmp_path / "mine", MODULE)
    done = run_portable(mine, "run", str(bundle), "--output", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    path = mine / "pkga1" / "r.py"
    want = {"module": "pkga1.r", "path": str(path.resolve()), "sha256": _sha(path)}
    assert json.loads((tmp_path / "run" / "run.json").read_text())["recipe_module"] == want
    deps = json.loads((tmp_path / "run" / "lineage" / "g.intoto.json").read_text())["predicate"]["buildDefinition"]
    uris = [d["uri"] for d in deps["resolvedDependencies"]]
    # the bundle's source layer is the material that names this code; the user's r.py is none of its own (R5)
    assert uris == [
        (bundle / "bundle.json").resolve().as_uri(),
        (bundle / "source" / "a1src.tar.zst").resolve().as_uri(),
    ]
    assert (tmp_path / "run" / "g" / "n.json").read_text() == "3"


def test_a_module_that_cannot_be_imported_names_the_layer_folder(bundle, monkeypatch):
    with pytest.raises(ConfigError) as err:
        check_recipe_source("pkga1.r:RECIPE", bundle)
    assert err.value.exit_code == 4
    folder = bundle / "source" / "a1src"
    assert f"PYTHONPATH={folder}:$PYTHONPATH portable run ..." in err.value.hint
    monkeypatch.syspath_prepend(str(folder))  # the bundle's own copy: matches, recorded
    assert check_recipe_source("pkga1.r:RECIPE", bundle)["path"] == str(folder / "pkga1" / "r.py")


@pytest.mark.parametrize("name", ["grpo", "recap", "reproduction.recipes.grpo:RECIPE", None])
def test_built_in_recipes_are_not_compared_or_recorded(bundle, name):
    assert check_recipe_source(name, bundle) is None


def _tree(folder: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    return folder


# an __init__ that leaves a mark when executed: locating the recipe must not run it (R4)
INIT = "import pathlib\npathlib.Path(__file__).with_name('EXECUTED').touch()\n"
PKG = {"aud4/__init__.py": INIT, "aud4/r.py": "RECIPE = None\n", "aud4/stages.py": "def ev(ctx):\n    return 1\n"}


@pytest.fixture
def layered(tmp_path) -> Path:
    """A bundle folder whose source layer `l` holds the package aud4 (only bundle.json and the restored layer)."""
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "bundle.json").write_text('{"layers": [{"kind": "source", "target": "source/l", "order": 1}]}')
    _tree(tmp_path / "b" / "source" / "l", PKG)
    return tmp_path / "b"


def _refusal(name: str, bundle: Path, mine: Path, monkeypatch) -> str:
    monkeypatch.syspath_prepend(str(mine))
    with pytest.raises(IntegrityError) as err:
        check_recipe_source(name, bundle)
    assert err.value.exit_code == 5
    assert err.value.hint.startswith(f"to run the bundle's code put {bundle / 'source' / 'l'} first on PYTHONPATH")
    assert not (mine / "aud4" / "EXECUTED").exists()
    return str(err.value)


def _sha12(path: Path) -> str:
    return _sha(path)[:12]


@pytest.mark.parametrize("name", ["aud4.r:RECIPE", "aud4:RECIPE"])
def test_a_doctored_sibling_module_is_refused_without_running_the_package_init(layered, tmp_path, name, monkeypatch):
    mine = _tree(tmp_path / "mine", {**PKG, "aud4/stages.py": "def ev(ctx):\n    return 20  # doctored\n"})
    here, there = mine / "aud4" / "stages.py", layered / "source" / "l" / "aud4" / "stages.py"
    assert _refusal(name, layered, mine, monkeypatch) == (
        f"recipe: {name!r} would run {here} (sha256 {_sha12(here)}), not the bundle's copy {there} "
        f"(sha256 {_sha12(there)}) that its lineage names"
    )


def test_a_module_the_layer_ships_and_the_import_side_lacks_is_refused(layered, tmp_path, monkeypatch):
    mine = _tree(tmp_path / "mine", {k: v for k, v in PKG.items() if k != "aud4/stages.py"})
    there = layered / "source" / "l" / "aud4" / "stages.py"
    assert _refusal("aud4.r:RECIPE", layered, mine, monkeypatch) == (
        f"recipe: 'aud4.r:RECIPE' would run without {mine / 'aud4' / 'stages.py'}, which the bundle's copy {there} "
        f"(sha256 {_sha12(there)}) that its lineage names has"
    )


def test_a_module_only_on_the_import_side_is_refused(layered, tmp_path, monkeypatch):
    mine = _tree(tmp_path / "mine", {**PKG, "aud4/sub/extra.py": "X = 1\n"})
    extra = mine / "aud4" / "sub" / "extra.py"
    assert _refusal("aud4.r:RECIPE", layered, mine, monkeypatch) == (
        f"recipe: 'aud4.r:RECIPE' would run beside {extra} (sha256 {_sha12(extra)}), which the bundle's source "
        f"layer {layered / 'source' / 'l'} that its lineage names does not ship"
    )


def test_the_same_package_passes_and_caches_and_other_files_do_not_count(layered, tmp_path, monkeypatch):
    mine = _tree(tmp_path / "mine", {**PKG, "aud4/__pycache__/r.cpython-312.py": "junk", "aud4/data.txt": "x"})
    monkeypatch.syspath_prepend(str(mine))
    got = check_recipe_source("aud4.r:RECIPE", layered)
    assert got == {
        "module": "aud4.r",
        "path": str((mine / "aud4" / "r.py").resolve()),
        "sha256": _sha(mine / "aud4" / "r.py"),
    }
    assert not (mine / "aud4" / "EXECUTED").exists()


def test_namespace_packages_compare_their_first_regular_package_or_the_module_alone(tmp_path, monkeypatch):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "bundle.json").write_text('{"layers": [{"kind": "source", "target": "source/l", "order": 1}]}')
    _tree(
        tmp_path / "b" / "source" / "l",
        {"ns4/r.py": "RECIPE = None\n", "ns4/pk/__init__.py": "", "ns4/pk/r.py": "R = 1\n"},
    )
    # ns4 is a namespace package spread over two folders; the other portion's modules are not the recipe's
    mine = _tree(tmp_path / "mine", {"ns4/r.py": "RECIPE = None\n", "ns4/pk/__init__.py": "", "ns4/pk/r.py": "R = 1\n"})
    _tree(tmp_path / "other", {"ns4/unrelated.py": "U = 1\n"})
    monkeypatch.syspath_prepend(str(tmp_path / "other"))
    monkeypatch.syspath_prepend(str(mine))
    assert check_recipe_source("ns4.r:RECIPE", tmp_path / "b")["path"] == str((mine / "ns4" / "r.py").resolve())
    assert check_recipe_source("ns4.pk.r:RECIPE", tmp_path / "b")["module"] == "ns4.pk.r"
    (mine / "ns4" / "pk" / "helper.py").write_text("H = 1\n")  # in the regular package ns4.pk: compared
    with pytest.raises(IntegrityError, match="would run beside .*helper.py"):
        check_recipe_source("ns4.pk.r:RECIPE", tmp_path / "b")
    assert check_recipe_source("ns4.r:RECIPE", tmp_path / "b") is not None  # ns4.r alone is its unit


def test_without_a_bundle_the_recipe_file_is_recorded_but_no_lineage_material(tmp_path):
    mine = _copy(tmp_path / "mine", MODULE)
    (tmp_path / "c.yaml").write_text("recipe: pkga1.r:RECIPE\n")
    done = run_portable(mine, "run", "--config", str(tmp_path / "c.yaml"), "--output", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    path = (mine / "pkga1" / "r.py").resolve()
    recorded = json.loads((tmp_path / "run" / "run.json").read_text())["recipe_module"]
    assert recorded == {"module": "pkga1.r", "path": str(path), "sha256": _sha(path)}
    with path.open("a") as f:
        f.write("# edited after the run\n")  # normal development: the run's lineage still verifies (R5)
    verify = run_portable(mine, "lineage", str(tmp_path / "run"), "--verify")
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_a_bundle_named_by_bundle_override_is_checked_too(bundle, tmp_path):
    mine = _copy(tmp_path / "mine", MODULE.replace("VALUE = 1", "VALUE = 20  # doctored"))
    (tmp_path / "c.yaml").write_text("recipe: pkga1.r:RECIPE\n")
    done = run_portable(
        mine, "run", "--config", str(tmp_path / "c.yaml"), "--output", str(tmp_path / "run"), f"BUNDLE={bundle}"
    )
    assert done.returncode == 5, done.stderr
    assert done.stderr.startswith(f"error: recipe: 'pkga1.r:RECIPE' would run {mine / 'pkga1' / 'r.py'} (sha256 ")
    assert not (tmp_path / "run").exists()
