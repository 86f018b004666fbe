"""Tuple items of an Optional[...] type (audit63 misc 4): `opt=[[1, 2]]`, `opt=[x]` for a tuple[Optional[int], ...]
printed omegaconf's keyless line (`config: Value '$VALUE' of type '$VALUE_TYPE' could not be converted to Integer`,
or `config key opt: Value 'None' ...`), where the other item types name the item's key (`nest[0][1]`), the source
and what it takes (review61b 4, 6). An Optional item now takes null or an item of its type, said the same way; what
loads is as before. Also a tuple given another tuple's ${...} whose items misfit said "which is [a]: it takes a
list" of a list. RECAP's `value.train.betas` (a shipped tuple key) keeps its keyed messages."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pytest
import yaml

from reproduction import portable
from reproduction.recipe import Recipe, StageSpec


@dataclass(kw_only=True)
class Items:
    ints: tuple[int, ...] = (1,)
    strs: tuple[str, ...] = ("a",)
    opt: tuple[Optional[int], ...] = (1,)  # noqa: UP045 - a recipe may spell it so; `float | None` below
    optpair: tuple[float | None, float] = (None, 0.5)
    optnest: tuple[Optional[tuple[int, int]], int] = ((1, 2), 3)  # noqa: UP045


def _stage() -> None:
    pass


R_ITEMS = Recipe(
    name="t63items", config_schema=f"{__name__}:Items", stages=(StageSpec(name="a", fn=f"{__name__}:_stage"),)
)
ITEMS = f"recipe={__name__}:R_ITEMS"


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
    "given, key, shown, takes, example",
    [
        ("opt=[[1,2]]", "opt[0]", "[1, 2]", "int or null", "[1]"),
        ("opt=[1,{a: 1}]", "opt[1]", "{a: 1}", "int or null", "[1]"),
        ("opt=[null,x]", "opt[1]", "x", "int or null", "[1]"),
        ("optpair=[[1],0.5]", "optpair[0]", "[1]", "float or null", "[null, 0.5]"),
        ("optpair=[null,null]", "optpair[1]", "null", "float", "[null, 0.5]"),
        ("optnest=[[1,[2]],3]", "optnest[0][1]", "[2]", "int", "[[1, 2], 3]"),
        ("optnest=[[1],3]", "optnest[0]", "[1]", "a list of 2 values or null", "[[1, 2], 3]"),
        ("optnest=[x,3]", "optnest[0]", "x", "a list of 2 values or null", "[[1, 2], 3]"),
    ],
)
def test_an_optional_tuple_item_that_does_not_fit_names_its_key(cli, given, key, shown, takes, example):
    code, out, err = cli(ITEMS, given)
    assert code == 4, err
    name = given.partition("=")[0]
    assert err == [
        f"error: command line: config key `{key}` is {shown}: it takes {takes}",
        f"hint: write it as {name}={example} with your values (its schema {__name__}:Items)",  # audit65_B L4
    ]
    assert out == ""


def test_an_optional_tuple_item_in_a_file_names_the_file(cli, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("opt: [1, [2]]\n")
    code, _, err = cli(ITEMS, "--config", str(path))
    assert code == 4, err
    assert err[0] == f"error: {path}: config key `opt[1]` is [2]: it takes int or null"


def test_null_and_items_of_the_type_still_load(cli):
    code, out, err = cli(ITEMS, "opt=[null,2,'3']", "optnest=[null,4]", "optpair=[0.25,0.5]")
    assert code == 0, err
    loaded = yaml.safe_load(out)
    assert loaded["opt"] == [None, 2, 3] and loaded["optnest"] == [None, 4] and loaded["optpair"] == [0.25, 0.5]


def test_a_tuple_given_another_tuples_interpolation_names_the_misfit_item(cli):
    code, _, err = cli(ITEMS, "ints=${strs}")
    assert code == 4, err
    assert (
        err[0]
        == "error: command line: config key `ints` is ${strs}, which is a list whose item 0 is a: it takes int items"
    )


@pytest.mark.parametrize(
    "given, key, shown",
    [
        ("value.train.betas=[[0.9,0.95],0.95]", "value.train.betas[0]", "[0.9, 0.95]"),
        ("policy.train.betas=[0.9,null]", "policy.train.betas[1]", "null"),
    ],
)
def test_the_shipped_betas_tuple_keeps_its_keyed_messages(cli, given, key, shown):
    code, _, err = cli(given)
    assert code == 4, err
    listed = given.partition("=")[0]
    assert err == [
        f"error: command line: config key `{key}` is {shown}: it takes float",
        f"hint: write it as {listed}=[0.9, 0.95] with your values (docs/config.md)",
    ]
