"""A mapping a --config file gives replaces the default's and an earlier file's, as a list does (audit58 E2: a file's
`value.model.cameras: {left_wrist_0_rgb: ...}` kept the default `base_0_rgb` too); sections still merge field by
field. `portable run --print-config` writes a config `--config` reads back to the same config (audit58 B6: no
`recipe:` line for an out-of-tree recipe, exit 4; a Path as a python/object tag yaml.safe_load refuses)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from recipe_cli import run_portable

from reproduction import portable
from reproduction.recipes.grpo.config import GrpoRunConfig
from reproduction.recipes.recap.config import RunConfig
from reproduction.run.config import load_config, to_plain

REPO = Path(__file__).resolve().parent.parent
WRIST = {"left_wrist_0_rgb": "observation.images.wrist"}


def _file(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _load(files, schema=RunConfig, overrides=()):
    return to_plain(load_config(files, list(overrides), schema=schema))


def test_a_files_mapping_replaces_the_schema_default(tmp_path):
    assert _load([])["value"]["model"]["cameras"] == {"base_0_rgb": "observation.images.image"}  # the default
    one = _file(tmp_path, "a.yaml", "value:\n  model:\n    cameras: {left_wrist_0_rgb: observation.images.wrist}\n")
    assert _load([one])["value"]["model"]["cameras"] == WRIST  # was {base_0_rgb: ..image, left_wrist_0_rgb: ..}
    empty = _file(tmp_path, "e.yaml", "policy:\n  model:\n    cameras: {}\n")
    assert _load([one, empty])["value"]["model"]["cameras"] == WRIST  # a file names only the maps it gives


def test_a_later_files_mapping_replaces_an_earlier_files(tmp_path):
    one = _file(tmp_path, "a.yaml", "value:\n  model: {cameras: {base_0_rgb: observation.images.front}}\n")
    two = _file(tmp_path, "b.yaml", "value:\n  model: {cameras: {left_wrist_0_rgb: observation.images.wrist}}\n")
    assert _load([one, two])["value"]["model"]["cameras"] == WRIST
    assert _load([two, one])["value"]["model"]["cameras"] == {"base_0_rgb": "observation.images.front"}
    # the command line's dotted entry still adds to the file's map (audit58 E1's rule, unchanged)
    both = _load([one, two], overrides=["value.model.cameras.base_0_rgb=observation.images.front"])
    assert both["value"]["model"]["cameras"] == {**WRIST, "base_0_rgb": "observation.images.front"}


def test_grpo_sft_cameras_from_two_files(tmp_path):
    one = _file(tmp_path, "a.yaml", "sft:\n  model: {cameras: {agentview: observation.images.agentview}}\n")
    two = _file(tmp_path, "b.yaml", "sft:\n  model: {cameras: {wrist: observation.images.wrist}}\n")
    assert _load([one], GrpoRunConfig)["sft"]["model"]["cameras"] == {"agentview": "observation.images.agentview"}
    assert _load([one, two], GrpoRunConfig)["sft"]["model"]["cameras"] == {"wrist": "observation.images.wrist"}


def test_a_section_still_merges_field_by_field(tmp_path):
    one = _file(tmp_path, "a.yaml", "value:\n  model: {preset: tiny, folds: 2}\n  train: {max_steps: 7}\n")
    two = _file(tmp_path, "b.yaml", "value:\n  model: {folds: 3}\n")
    value = _load([one, two])["value"]
    assert (value["model"]["preset"], value["model"]["folds"], value["train"]["max_steps"]) == ("tiny", 3, 7)
    assert value["model"]["cameras"] == {"base_0_rgb": "observation.images.image"}  # a map no file names: kept


def _print(tmp_path: Path, capsys, *args: str) -> str:
    capsys.readouterr()
    assert portable.main(["run", "--output", str(tmp_path / "run"), "--print-config", *args]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize(
    ("files", "recipe"),
    [(["demo/run.yaml"], "recap"), (["grpo/config.yaml", "grpo/libero.yaml"], "grpo")],
)
def test_print_config_reads_back_to_the_same_config(tmp_path, capsys, files, recipe):
    args = [a for f in files for a in ("--config", str(REPO / "bundle" / f))]
    printed = _print(tmp_path, capsys, *args, f"BUNDLE={tmp_path / 'b'}")
    assert printed.startswith(f"recipe: {recipe}\n")
    yaml.safe_load(printed)
    again = _file(tmp_path, "printed.yaml", printed)
    assert _print(tmp_path, capsys, "--config", str(again)) == printed


MODULE = """\
import enum
from dataclasses import dataclass, field
from pathlib import Path

from reproduction.fsio import atomic_write_text
from reproduction.recipe import Recipe, StageOutput, StageSpec


class Speed(enum.Enum):
    FAST = 1
    SLOW = 2


@dataclass(kw_only=True)
class Cfg:
    extra: Path = Path("/tmp/none")
    speed: Speed = Speed.FAST
    names: dict[str, str] = field(default_factory=lambda: {"a": "x"})


def write(ctx):
    out = ctx.out_dir / "o.txt"
    atomic_write_text(out, f"{ctx.config.extra} {ctx.config.speed.name} {sorted(ctx.config.names)}")
    return StageOutput(files=[out])


RECIPE = Recipe(
    name="pc58",
    config_schema="pc58mod:Cfg",
    stages=(StageSpec(name="one", fn="pc58mod:write", config=("extra", "speed", "names"), inputs=False),),
)
"""


def test_an_out_of_tree_recipes_printed_config_names_it_and_reruns_to_the_same_keys(tmp_path):
    (tmp_path / "pc58mod.py").write_text(MODULE)
    (tmp_path / "c.yaml").write_text("recipe: pc58mod:RECIPE\nextra: /data/x\nspeed: SLOW\nnames: {b: y}\n")
    done = run_portable(tmp_path, "run", "--config", "c.yaml", "--output", "run", "--print-config")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "recipe: pc58mod:RECIPE\nextra: /data/x\nspeed: SLOW\nnames:\n  b: 'y'\n"
    assert yaml.safe_load(done.stdout) == {
        "recipe": "pc58mod:RECIPE",
        "extra": "/data/x",
        "speed": "SLOW",
        "names": {"b": "y"},  # the file's map, not the default's {a: x} too
    }
    (tmp_path / "pc.yaml").write_text(done.stdout)
    again = run_portable(tmp_path, "run", "--config", "pc.yaml", "--output", "run", "--print-config")
    assert (again.returncode, again.stdout) == (0, done.stdout), again.stderr  # was exit 4: read as RECAP's
    ran = run_portable(tmp_path, "run", "--config", "c.yaml", "--output", "run", "--json")
    assert ran.returncode == 0, ran.stderr
    assert (tmp_path / "run" / "one" / "o.txt").read_text() == "/data/x SLOW ['b']"
    resumed = run_portable(tmp_path, "run", "--config", "pc.yaml", "--output", "run", "--resume", "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert [s["action"] for s in json.loads(resumed.stdout)["stages"]] == ["skipped"]  # the same stage key
    as_json = run_portable(tmp_path, "run", "--config", "c.yaml", "--output", "run", "--print-config", "--json")
    assert json.loads(as_json.stdout) == yaml.safe_load(done.stdout)  # names the recipe too (audit58 D4)
