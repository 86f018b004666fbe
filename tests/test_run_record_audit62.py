"""run.json's `config` as a config file writes it (audit62 B7): an out-of-tree recipe's plain Enum was recorded as
Python's str (`Color.BLUE`, which `--config` refuses) and a string escaped in the config as `\\${x}` (OmegaConf's
literal) unescaped, so read back through `--config` it was interpolated (exit 4, "Interpolation key 'x' not
found"). A config holding neither records, and keys, the same bytes as before."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from tests.recipe_cli import run_portable

RECIPE = textwrap.dedent(
    """
    import enum
    from dataclasses import dataclass
    from reproduction.recipe import Recipe, StageOutput, StageSpec

    class Color(enum.Enum):
        RED = 1
        BLUE = 2

    @dataclass
    class Cfg:
        color: Color = Color.RED
        text: str = "plain"
        data: str = ""

    def one(ctx):
        (ctx.out_dir / "x.txt").write_text(f"{ctx.config.color.name} {ctx.config.text}")
        return StageOutput(files=[])

    RECIPE = Recipe(
        name="enumrec",
        stages=(StageSpec(name="one", fn="enumrec:one", config=("color", "text"), files=("data",)),),
        config_schema=Cfg,
    )
    """
)


def test_the_recorded_config_reads_back_as_the_config(tmp_path: Path):
    (tmp_path / "enumrec.py").write_text(RECIPE)
    (tmp_path / "d${x}.txt").write_text("data")  # a file the stage reads by path: read as named, not escaped
    (tmp_path / "run.yaml").write_text("recipe: enumrec:RECIPE\ncolor: BLUE\ntext: a \\${x} b\ndata: d\\${x}.txt\n")
    done = run_portable(tmp_path, "-q", "run", "--config", "run.yaml", "--output", "out")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "one" / "x.txt").read_text() == "BLUE a ${x} b"  # the stage got the literal
    recorded = json.loads((tmp_path / "out" / "run.json").read_text())["config"]
    assert recorded == {"color": "BLUE", "text": "a \\${x} b", "data": "d\\${x}.txt"}
    again = run_portable(tmp_path, "run", "--config", "run.yaml", "--output", "out", "--resume")
    assert again.returncode == 0 and "skipped" in again.stderr, again.stderr  # the same key: nothing redone
    (tmp_path / "back.json").write_text(json.dumps({"recipe": "enumrec:RECIPE", **recorded}))
    shown = [
        run_portable(tmp_path, "run", "--config", name, "--output", "o2", "--print-config", "--json")
        for name in ("run.yaml", "back.json")
    ]
    assert [s.returncode for s in shown] == [0, 0], shown[1].stderr  # was exit 4: Interpolation key 'x' not found
    assert json.loads(shown[1].stdout) == json.loads(shown[0].stdout)


def test_a_config_without_enums_or_escapes_records_the_same_bytes():
    """RECAP's and GRPO's configs (no Enum, no `${`): the recorded form, hence every stage key, is unchanged."""
    from reproduction.recipes.grpo.config import GrpoRunConfig
    from reproduction.recipes.recap.config import RunConfig
    from reproduction.run.config import as_recorded, to_plain

    for config in (RunConfig(), GrpoRunConfig()):
        plain = to_plain(config)
        assert json.dumps(as_recorded(plain), sort_keys=True, default=str) == json.dumps(
            plain, sort_keys=True, default=str
        )
