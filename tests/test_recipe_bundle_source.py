"""audit54 A1: `portable run BUNDLE` of a bundle shipping an out-of-tree recipe in a source layer runs the module on
PYTHONPATH; one whose bytes differ from the layer's copy is refused before anything runs (exit 5, both files and
digests named), one not importable at all is told which layer folder to put on PYTHONPATH, and the file that ran is
recorded in run.json (`recipe_module`) and as a `source` material of every stage."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from bundlekit import QUIET
from recipe_cli import run_portable

from reproduction.errors import ConfigError
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
    got = [(d["uri"], d["digest"]["sha256"]) for d in deps["resolvedDependencies"] if d["uri"].endswith("r.py")]
    assert got == [(path.resolve().as_uri(), want["sha256"])]
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
