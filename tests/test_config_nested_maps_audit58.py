"""The one rule for mappings, where it did not hold (audit58 D1, D2, D4): a mapping (a dict field) given whole replaces
the default's inside a list item too (`items: [{meta: {z: 1}}]` kept the item default's `meta.k`) and under an
Optional section that defaults to None (`maybe_inner={tags: {}}` kept `tags`' default entries); and
`--print-config --json` names an out-of-tree recipe as the YAML does, so either reads back to the same config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from reproduction import portable

MODULE = """
import enum
from dataclasses import dataclass, field
from typing import Optional

from reproduction.recipe import Recipe, StageContext, StageOutput, StageSpec


class Color(enum.Enum):
    red = 1
    green = 2


@dataclass
class Inner:
    a: int = 1
    tags: dict[str, str] = field(default_factory=lambda: {"x": "1", "y": "2"})
    color: Color = Color.red


@dataclass
class Item:
    path: str = "/tmp/p"
    meta: dict[str, int] = field(default_factory=lambda: {"k": 1})


@dataclass(kw_only=True)
class NestConfig:
    BUNDLE: str = ""
    RUN: str = ""
    items: list[Item] = field(default_factory=lambda: [Item()])
    inner: Inner = field(default_factory=Inner)
    maybe_inner: Optional[Inner] = None


def open_inputs(config):
    return {}


def go(ctx: StageContext) -> StageOutput:
    return StageOutput(files=[])


RECIPE = Recipe(
    name="nest",
    config_schema="nm58rec:NestConfig",
    open_inputs="nm58rec:open_inputs",
    stages=(StageSpec(name="go", fn="nm58rec:go", inputs=False, code=("nm58rec",)),),
)
"""
RECIPE = "recipe=nm58rec:RECIPE"


@pytest.fixture
def rec(tmp_path, monkeypatch):
    (tmp_path / "nm58rec.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _print(tmp_path: Path, capsys, *args: str) -> str:
    capsys.readouterr()
    assert portable.main(["run", "--output", str(tmp_path / "run"), "--print-config", *args]) == 0
    return capsys.readouterr().out


def _file(tmp_path: Path, name: str, text: str) -> Path:
    (tmp_path / name).write_text(text)
    return tmp_path / name


def _config(tmp_path: Path, capsys, *args: str) -> dict:
    return yaml.safe_load(_print(tmp_path, capsys, *args))


def test_a_mapping_in_a_files_list_item_replaces_the_items_default(rec, capsys):
    one = _file(rec, "f1.yaml", "recipe: nm58rec:RECIPE\nitems: [{path: /a, meta: {z: 1}}, {meta: {}}]\n")
    assert _config(rec, capsys, "--config", str(one))["items"] == [
        {"path": "/a", "meta": {"z": 1}},  # was {k: 1, z: 1}
        {"path": "/tmp/p", "meta": {}},  # was {k: 1}
    ]
    # the whole list on the command line: the same rule
    given = _config(rec, capsys, RECIPE, "items=[{meta: {q: 2}}]")["items"]
    assert given == [{"path": "/tmp/p", "meta": {"q": 2}}]
    # an item without the mapping keeps the default's (a section merges field by field)
    assert _config(rec, capsys, RECIPE, "items=[{path: /b}]")["items"] == [{"path": "/b", "meta": {"k": 1}}]


@pytest.mark.parametrize("override", ["items[0]={meta: {}}", "items.0.meta={z: 3}", "items.0={meta: {z: 3}}"])
def test_a_list_items_printed_mapping_reads_back_to_the_same_config(rec, capsys, override):
    printed = _print(rec, capsys, RECIPE, override)
    again = _file(rec, "printed.yaml", printed)
    assert _print(rec, capsys, "--config", str(again)) == printed  # `meta: {}` read back as {k: 1}


def test_a_mapping_under_a_none_section_replaces_its_default(rec, capsys):
    assert _config(rec, capsys, RECIPE)["maybe_inner"] is None
    for override in ("maybe_inner={tags: {}}", "maybe_inner.tags={}"):
        assert _config(rec, capsys, RECIPE, override)["maybe_inner"] == {"a": 1, "tags": {}, "color": "red"}
    assert _config(rec, capsys, RECIPE, "maybe_inner={tags: {q: r}}")["maybe_inner"]["tags"] == {"q": "r"}
    # the section takes its schema defaults for what the value does not name, as `inner={tags: {}}` does
    assert _config(rec, capsys, RECIPE, "maybe_inner={a: 5}")["maybe_inner"] == {
        "a": 5,
        "tags": {"x": "1", "y": "2"},
        "color": "red",
    }
    one = _file(rec, "m.yaml", "recipe: nm58rec:RECIPE\nmaybe_inner: {tags: {c: d}}\n")
    assert _config(rec, capsys, "--config", str(one))["maybe_inner"]["tags"] == {"c": "d"}  # was {x, y, c}


@pytest.mark.parametrize(
    "args",
    [
        (),
        ("items=[{path: /a, meta: {z: 1}}, {meta: {}}]",),
        ("maybe_inner={tags: {c: d}}", "inner.tags={}"),
    ],
)
def test_print_config_yaml_and_json_read_back_to_the_same_config(rec, capsys, args):
    printed = _print(rec, capsys, RECIPE, *args)
    assert printed.startswith("recipe: nm58rec:RECIPE\n")
    as_json = _print(rec, capsys, "--json", RECIPE, *args)
    assert json.loads(as_json) == yaml.safe_load(printed)  # the JSON had no "recipe" key
    assert next(iter(json.loads(as_json))) == "recipe"
    for name, text in (("p.yaml", printed), ("p.json", as_json)):
        again = _file(rec, name, text)
        assert _print(rec, capsys, "--config", str(again)) == printed  # the JSON read back as RECAP's: exit 4
        assert _print(rec, capsys, "--json", "--config", str(again)) == as_json
