"""Config errors inside list items and tuples (audit59 B1, B3): a bad field of a list item given whole
(`items=[{name: q, bad: 1}]`, on the command line or in a file) was named by its leaf alone (`bad`) with the
top-level keys as the hint (and, for RECAP, a missing `recipe:` line); one item of a tuple (`betas[0]=0.8`) was
"config: Cannot merge incompatible container types", naming no key."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from reproduction import portable
from reproduction.errors import ConfigError
from reproduction.run.config import load_config


@dataclass
class Item:
    name: str = "a"
    weight: float = 1.0


@dataclass
class Model:
    width: int = 4


@dataclass
class Prep:
    items: list[Item] = field(default_factory=lambda: [Item()])
    models: dict[str, Model] = field(default_factory=lambda: {"a": Model()})
    pair: tuple[int, int] = (1, 2)
    anything: Any = None


@dataclass(kw_only=True)
class Schema:
    prep: Prep = field(default_factory=Prep)
    other: int = 0


def _refused(overrides: list[str], files: list[Path] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(files, overrides, schema=Schema)
    return info.value


def test_an_unknown_field_of_a_list_item_given_whole_is_named_in_full_with_the_items_keys():
    exc = _refused(["prep.items=[{name: q}, {name: r, bad: 1}]"])
    assert (exc.message, exc.field, exc.hint) == (
        "command line: unknown config key `prep.items[1].bad`",
        "prep.items[1].bad",
        "valid keys here: name, weight",
    )
    near = _refused(["prep.items=[{nmae: q}]"])
    assert (near.message, near.hint) == (
        "command line: unknown config key `prep.items[0].nmae`",
        "did you mean `prep.items[0].name`?",
    )


def test_a_list_item_in_a_file_is_named_in_full_with_its_file_and_a_wrong_type_too(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("prep:\n  items:\n    - {name: q, bad: 1}\n")
    exc = _refused([], [bad])
    assert (exc.message, exc.hint) == (
        f"{bad}: unknown config key `prep.items[0].bad`",
        "valid keys here: name, weight",
    )
    bad.write_text("prep:\n  items:\n    - {name: q, weight: zz}\n")
    exc = _refused([], [bad])
    assert exc.field == "prep.items[0].weight"
    assert exc.message.startswith(f"{bad}: config key `prep.items[0].weight`: Value 'zz'")


def test_a_new_entry_of_a_mapping_of_sections_given_whole_gets_its_sections_keys_as_the_hint():
    exc = _refused(["prep.models={c: {bad: 1}}"])
    assert (exc.message, exc.hint) == ("command line: unknown config key `prep.models.c.bad`", "valid keys here: width")


def test_one_item_of_a_tuple_is_set_and_the_others_kept():
    config = load_config(None, ["prep.pair[1]=5"], schema=Schema)
    assert config.prep.pair == (1, 5)
    config = load_config(None, ["prep.pair=[7, 8]", "prep.pair.0=3"], schema=Schema)
    assert config.prep.pair == (3, 8)


def test_a_tuple_item_that_does_not_fit_names_the_item_and_the_whole_tuple_form():
    exc = _refused(["prep.pair[0]=x"])
    assert (exc.message, exc.field, exc.hint) == (
        "command line: config key `prep.pair[0]`: x does not fit prep.pair's type Tuple[int, int]",
        "prep.pair[0]",
        "give a value of that type, or the whole tuple: prep.pair=[1, 2] with your values",
    )
    exc = _refused(["prep.pair[0].z=1"])
    assert exc.message == (
        "command line: config key `prep.pair[0].z`: prep.pair is a tuple of values, its items have no fields"
    )
    exc = _refused(["prep.pair[2]=1"])
    assert exc.field == "prep.pair[2]" and "has 2 items" in exc.message


def _recap(tmp_path: Path, capsys, *overrides: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = portable.main(["run", "--output", str(tmp_path / "run"), "--print-config", "--json", *overrides])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_recap_datasets_item_names_the_field_without_the_recipe_hint(tmp_path, capsys):
    rc, _, err = _recap(tmp_path, capsys, "datasets=[{path: /x, bogus: 1}]")
    assert rc == 4
    assert err.splitlines() == [
        "error: command line: unknown config key `datasets[0].bogus`",
        "hint: valid keys here: path, policy, type, value, weight",
    ]
    rc, _, err = _recap(tmp_path, capsys, "bogus=1")  # a top-level key still gets the `recipe:` hint
    assert rc == 4 and "the config names no `recipe:`" in err


def test_recap_betas_item_is_set(tmp_path, capsys):
    import json

    rc, out, err = _recap(tmp_path, capsys, "value.train.betas[0]=0.8")
    assert rc == 0, err
    assert json.loads(out)["value"]["train"]["betas"] == [0.8, 0.95]


@pytest.mark.parametrize(
    ("held", "given", "expected"),
    [
        ("{z: 1}", "[1, 2]", [1, 2]),  # was "is a section, not a value"
        ("[1, 2]", "{a: 1}", {"a": 1}),  # was "Cannot merge incompatible container types", no key
        ("'${prep.models}'", "7", 7),  # was "Cannot assign int to Dict[str, Model]"
        ("'${prep.models}'", "[1, 2]", [1, 2]),  # was "Cannot merge incompatible container types", no key
        ("{z: 1}", "7", 7),
    ],
)
def test_an_untyped_field_takes_any_value_given_whole_on_the_command_line_or_in_a_file(tmp_path, held, given, expected):
    base = tmp_path / "base.yaml"
    base.write_text(f"prep:\n  anything: {held}\n")
    assert load_config([base], [f"prep.anything={given}"], schema=Schema).prep.anything == expected
    layer = tmp_path / "layer.yaml"
    layer.write_text(f"prep:\n  anything: {given}\n")
    assert load_config([base, layer], [], schema=Schema).prep.anything == expected
