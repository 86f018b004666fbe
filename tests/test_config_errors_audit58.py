"""Config errors that named no key or no source (audit58 D3, D6): a section set to a ${...} that does not give a
section of its type (`value.model=${policy.model}`, `inner=${maybe_inner}`) was omegaconf's line (`config: field ''
is not Optional`); a component rule on a command-line value named the key but not `command line`, as it names a file."""

from __future__ import annotations

from pathlib import Path

import pytest

from reproduction import portable

MODULE = """
from dataclasses import dataclass, field
from typing import Optional

from reproduction.recipe import Recipe, StageContext, StageOutput, StageSpec


@dataclass
class Inner:
    a: int = 1
    tags: dict[str, str] = field(default_factory=lambda: {"x": "1"})


@dataclass(kw_only=True)
class InterpConfig:
    BUNDLE: str = ""
    RUN: str = ""
    inner: Inner = field(default_factory=Inner)
    maybe_inner: Optional[Inner] = None


def open_inputs(config):
    return {}


def go(ctx: StageContext) -> StageOutput:
    return StageOutput(files=[])


RECIPE = Recipe(
    name="interp",
    config_schema="ie58rec:InterpConfig",
    open_inputs="ie58rec:open_inputs",
    stages=(StageSpec(name="go", fn="ie58rec:go", inputs=False, code=("ie58rec",)),),
)
"""
SECTION = "a section cannot be set from another section's interpolation; set its fields"


def _first_line(tmp_path: Path, capsys, *args: str) -> tuple[int, str]:
    capsys.readouterr()
    rc = portable.main(["run", "--output", str(tmp_path / "run"), "--print-config", *args])
    err = capsys.readouterr().err
    assert "Traceback" not in err and not (tmp_path / "run").exists()
    return rc, err.splitlines()[0]


def test_a_section_set_to_another_sections_interpolation_names_the_key_and_the_command_line(tmp_path, capsys):
    rc, line = _first_line(tmp_path, capsys, "value.model=${policy.model}")
    assert (rc, line) == (
        4,
        "error: command line: config key `value.model` (a section of type ValueConfig) is ${policy.model}, "
        f"which is a PolicyConfig: {SECTION}",
    )


def test_the_same_from_a_file_names_the_file(tmp_path, capsys):
    path = tmp_path / "i.yaml"
    path.write_text("value: {model: '${policy.model}'}\n")
    rc, line = _first_line(tmp_path, capsys, "--config", str(path))
    assert (rc, line) == (
        4,
        f"error: {path}: config key `value.model` (a section of type ValueConfig) is ${{policy.model}}, "
        f"which is a PolicyConfig: {SECTION}",
    )


def test_an_interpolated_null_section_names_the_key(tmp_path, capsys, monkeypatch):
    (tmp_path / "ie58rec.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    rc, line = _first_line(tmp_path, capsys, "recipe=ie58rec:RECIPE", "inner=${maybe_inner}")
    assert (rc, line) == (
        4,
        "error: command line: config key `inner` (a section of type Inner) is ${maybe_inner}, which is null: "
        + SECTION,
    )
    # a ${...} giving a section of the section's own type still works, as before
    capsys.readouterr()
    args = ["run", "--output", str(tmp_path / "run"), "--print-config", "recipe=ie58rec:RECIPE", "inner.a=7"]
    assert portable.main([*args, "maybe_inner=${inner}"]) == 0
    assert "maybe_inner:\n  a: 7\n" in capsys.readouterr().out


def test_a_same_type_section_interpolation_is_accepted(tmp_path, capsys):
    capsys.readouterr()
    args = ["run", "--output", str(tmp_path / "run"), "--print-config", "value.train.max_steps=7"]
    assert portable.main([*args, "policy.train=${value.train}"]) == 0
    assert "policy:" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["value.model.cameras={}"], "error: command line: value.model.cameras={} maps no model slot to a dataset key"),
        (["recipe=grpo", "rl.tasks=[]"], "error: command line: rl.tasks is empty; name at least one task"),
        (
            ["policy.modes=[]"],
            "error: command line: policy.modes=[] must name each of recap, bc, filtered_bc at most once, at least one",
        ),
    ],
)
def test_a_rule_on_a_command_line_value_says_command_line(tmp_path, capsys, args, line):
    assert _first_line(tmp_path, capsys, *args) == (4, line)


def test_a_rule_on_a_file_value_still_names_the_file(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("value: {model: {cameras: {}}}\n")
    assert _first_line(tmp_path, capsys, "--config", str(path)) == (
        4,
        f"error: {path}: value.model.cameras={{}} maps no model slot to a dataset key",
    )
