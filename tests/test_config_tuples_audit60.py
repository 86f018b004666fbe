"""audit60 D3 (rest): a fixed-length tuple field given a mapping, a scalar or a ${...} that is no list of its length
was refused naming no key ("Cannot merge incompatible container types", "TupleConfig length 3 does not match type
hint length 2"): omegaconf 2.4's TupleConfig is no ListConfig, so the list checks passed it by."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Optional

import pytest

from reproduction import portable
from reproduction.recipe import Recipe, StageSpec


class Color(enum.Enum):
    RED = 1
    GREEN = 2


@dataclass(kw_only=True)
class Odd:
    n: int = 3
    lst: list[int] = field(default_factory=lambda: [4, 5])
    strs: list[str] = field(default_factory=lambda: ["a", "b"])
    en: tuple[Color, Color] = (Color.RED, Color.GREEN)
    pair: tuple[int, int] = (1, 2)
    var: tuple[int, ...] = (1, 2, 3)
    opt: Optional[tuple[int, int]] = None  # noqa: UP045 (the form review61 used)


def _stage() -> None:
    pass


R_ODD = Recipe(name="t60odd", config_schema=f"{__name__}:Odd", stages=(StageSpec(name="a", fn=f"{__name__}:_stage"),))
ODD = f"recipe={__name__}:R_ODD"


@pytest.fixture
def cli(tmp_path, capsys):
    """portable run --print-config ARGS -> (exit code, stdout, stderr lines), in-process."""

    def run(*args: str) -> tuple[int, str, list[str]]:
        capsys.readouterr()
        code = portable.main(["run", "--print-config", "--output", str(tmp_path / "r"), *args])
        out = capsys.readouterr()
        return code, out.out, out.err.splitlines()

    return run


@pytest.mark.parametrize(
    "given, shown",
    [("{0: 0.8}", "{0: 0.8}"), ("2", "2"), ("abc", "abc")],
)
def test_a_tuple_given_no_list_names_the_key_on_the_command_line(cli, given, shown):
    code, _, err = cli(f"value.train.betas={given}")
    assert code == 4, err
    assert err == [
        f"error: command line: config key `value.train.betas` takes 2 values as a list, e.g. [0.9, 0.95], not {shown}",
        "hint: write it as value.train.betas=[0.9, 0.95] with your values, or set one item as value.train.betas[0]=... "
        "(docs/config.md)",
    ]


def test_a_tuple_given_a_mapping_in_a_file_names_the_file(cli, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("policy:\n  train:\n    betas: {0: 0.8}\n")
    code, _, err = cli("--config", str(path))
    assert code == 4, err
    assert err[0] == (
        f"error: {path}: config key `policy.train.betas` takes 2 values as a list, e.g. [0.9, 0.95], not {{0: 0.8}}"
    )


@pytest.mark.parametrize(
    "target, what",
    [("${policy.modes}", "a list of 3 values"), ("${eval.seed}", "7"), ("${returns.tag}", "t")],
)
def test_a_tuple_interpolation_of_another_shape_names_the_key_and_what_it_gives(cli, target, what):
    given = ("policy.modes=[bc, filtered_bc, recap]", "eval.seed=7", "returns.tag=t")
    code, _, err = cli(*given, f"value.train.betas={target}")
    assert code == 4, err
    assert err == [
        f"error: command line: config key `value.train.betas` is {target}, which is {what}: it takes 2 values",
        "hint: point value.train.betas at a list of 2 values, or write them: value.train.betas=[a, b] (docs/config.md)",
    ]


def test_a_tuple_interpolation_in_a_file_names_the_file(cli, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("value:\n  train:\n    betas: ${policy.modes}\n")
    code, _, err = cli("--config", str(path))
    assert code == 4, err
    assert err[0] == (
        f"error: {path}: config key `value.train.betas` is ${{policy.modes}}, which is a list of 1 value: "
        "it takes 2 values"
    )


def test_a_tuple_interpolation_that_fits_and_a_list_still_load(cli):
    code, out, err = cli("value.train.betas=${policy.train.betas}", "policy.train.betas=[0.8, 0.99]")
    assert code == 0, err
    assert out.count("betas:\n    - 0.8\n    - 0.99\n") == 2


@pytest.mark.parametrize(
    "given, line",
    [
        # a null Optional tuple: its len() raised inside the diagnosis, so omegaconf's keyless line came out
        ("opt={a: 1}", "config key `opt` takes 2 values as a list, e.g. [a, b], not {a: 1}"),
        ("opt=[1, 2, 3]", "config key `opt` takes 2 values, got 3: [1, 2, 3]"),
        ("opt=5", "config key `opt` takes 2 values as a list, e.g. [a, b], not 5"),
        # an item of another type: "config: Value '$VALUE' of type '$VALUE_TYPE' could not be converted to Integer"
        ("pair=[a, b]", "config key `pair[0]` is a: it takes int"),
        ("pair=[1, 2.5]", "config key `pair[1]` is 2.5: it takes int"),
        ("pair=[1, null]", "config key `pair[1]` is null: it takes int"),
        ("var=[1, x]", "config key `var[1]` is x: it takes int"),
        # a scalar ${...} for a variable tuple: "config: Invalid value assigned: int is not a TupleConfig, ..."
        ("var=${n}", "config key `var` is ${n}, which is 3: it takes a list"),
    ],
)
def test_odd_tuple_values_name_their_key(cli, given, line):
    """review61 2-4: the forms audit60 D3's fix did not reach (unchanged from before it, not regressions)."""
    code, _, err = cli(ODD, given)
    assert code == 4, err
    assert err[0] == f"error: command line: {line}"


@pytest.mark.parametrize("given", ["opt=[1, 2]", 'pair=[1, "2"]', "var=[4]", "var=${lst}", "pair=${lst}"])
def test_tuple_values_that_loaded_before_still_load(cli, given):
    code, out, err = cli(ODD, given)
    assert code == 0, err


@pytest.mark.parametrize(
    "given, lines",
    [
        # a null tuple has no item to set: its hint offers only the whole form (review61b 1)
        (
            "opt=5",
            [  # an out-of-tree schema: its hint names it, not docs/config.md (audit65_B L4)
                "config key `opt` takes 2 values as a list, e.g. [a, b], not 5",
                f"write it as opt=[a, b] with your values (its schema {__name__}:Odd)",
            ],
        ),
        # an Enum default is shown by name, as a file writes it, not as <Color.RED: 1> (review61b 2)
        (
            "en=[BLUE, RED]",
            [
                "config key `en[0]` is BLUE: it takes Color",
                f"write it as en=[RED, GREEN] with your values (its schema {__name__}:Odd)",
            ],
        ),
        # the right length, an item of another type: no "it takes a list" of a list (review61b 3)
        (
            "var=${strs}",
            [
                "config key `var` is ${strs}, which is a list whose item 0 is a: it takes int items",
                f"point var at a list of int items, or write them: var=[a, b] (its schema {__name__}:Odd)",
            ],
        ),
    ],
)
def test_tuple_hints_can_be_followed(cli, given, lines):
    code, _, err = cli(ODD, given)
    assert code == 4, err
    assert err == [f"error: command line: {lines[0]}", f"hint: {lines[1]}"]
