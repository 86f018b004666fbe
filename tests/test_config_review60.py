"""review60 S3, S6: a long value is cut where it is quoted (not by a regex over the finished message), and a tuple of
sections is refused inside Optional/list/dict too."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from reproduction import portable
from reproduction.errors import ConfigError

SHOWN_VALUE_CHARS = 200  # config_fields.SHOWN_VALUE_CHARS


@dataclass
class Pt:
    x: int = 0


@dataclass(kw_only=True)
class OptionalTuple:
    pts: tuple[Pt, ...] | None = (Pt(),)


@dataclass(kw_only=True)
class ListOfTuples:
    pts: list[tuple[Pt, ...]] = field(default_factory=list)


@dataclass(kw_only=True)
class DictOfTuples:
    pts: dict[str, tuple[Pt, ...]] = field(default_factory=dict)


@dataclass(kw_only=True)
class Inner:
    pts: tuple[Pt, ...] | None = None


@dataclass(kw_only=True)
class ListOfOptionalSections:
    items: list[Inner | None] = field(default_factory=list)


@pytest.fixture
def cli(tmp_path, capsys):
    """portable run --print-config --output DIR ARGS -> (exit code, stderr lines), in-process."""

    def run(*args: str) -> tuple[int, list[str]]:
        capsys.readouterr()
        code = portable.main(["run", "--print-config", "--output", str(tmp_path / "r"), *args])
        return code, capsys.readouterr().err.splitlines()

    return run


@pytest.mark.parametrize(
    ("schema", "key", "shown_type", "hint"),
    [
        ("OptionalTuple", "pts", "tuple[{m}.Pt, ...] | None", "type the tuple in `pts` as list[Pt]"),
        ("ListOfTuples", "pts", "list[tuple[{m}.Pt, ...]]", "type the tuple in `pts` as list[Pt]"),
        ("DictOfTuples", "pts", "dict[str, tuple[{m}.Pt, ...]]", "type the tuple in `pts` as list[Pt]"),
        (
            "ListOfOptionalSections",
            "items.pts",
            "tuple[{m}.Pt, ...] | None",
            "type the tuple in `items.pts` as list[Pt]",
        ),
    ],
)
def test_a_tuple_of_sections_inside_optional_list_or_dict_is_refused(cli, schema, key, shown_type, hint):
    """S6: `tuple[Pt, ...] | None` printed a config that `pts=[{x: 1}]` then failed on, naming no key."""
    from reproduction.recipe import Recipe, StageSpec

    globals()[f"R_{schema}"] = Recipe(
        name="r60",
        config_schema=f"{__name__}:{schema}",
        stages=(StageSpec(name="a", fn=f"{__name__}:Pt", inputs=False),),
    )
    code, err = cli(f"recipe={__name__}:R_{schema}")
    assert code == 4
    assert err[0] == (
        f"error: recipe '{__name__}:R_{schema}': config_schema {__name__}:{schema}: field `{key}` is of type "
        f"{shown_type.format(m=__name__)}, a tuple of sections, which a run config cannot set or read back"
    )
    assert err[1] == f"hint: {hint} (a list of sections works like any list)"


def test_shown_cuts_the_value_whatever_its_quotes():
    """S3: a value holding `'` is repr'd in double quotes, which the old regex never matched (921 chars shown)."""
    from reproduction.config_fields import SHOWN_VALUE_CHARS, shown

    value = "it's " + "w" * 900
    assert shown(value) == '"' + value[:SHOWN_VALUE_CHARS] + '..." (905 chars)'
    assert shown("a" * 900) == "'" + "a" * SHOWN_VALUE_CHARS + "...' (900 chars)"
    assert shown("short") == "'short'"
    assert shown(3) == "3"


def test_a_long_value_with_an_apostrophe_is_cut_in_the_error_line(cli, tmp_path):
    big = tmp_path / "big.yaml"
    value = "it's" + "a" * 900
    big.write_text(f'returns: {{tag: "{value}"}}\n')
    code, err = cli("--config", str(big))
    assert code == 4
    assert err[0] == (
        f'error: {big}: returns.tag="{value[:SHOWN_VALUE_CHARS]}..." (904 chars) must be a plain name (letters, '
        "digits, - _ .; at most 100 characters, not starting with -)"
    )


def test_prose_apostrophes_far_apart_are_not_cut():
    """S3: `a section's value zzz... isn't ok` became `a section's value zzz...' (312 chars)t ok`."""
    from omegaconf import OmegaConf

    from reproduction.run.config import _name_source

    message = "a section's value " + "z" * 300 + " isn't ok"
    exc = ConfigError(message, field="k")
    _name_source(exc, None, None, OmegaConf.create({"k": "v"}))
    assert exc.message == message
