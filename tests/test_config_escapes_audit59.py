"""Two run-config loader rules (audit58 D5, audit58 review S3).

An escaped `\\${...}` (OmegaConf's escape for a literal `${...}`) loads as that literal string, and --print-config
(YAML and --json) prints it escaped again, so --config reads the printed config back to the same config. It was
resolved anyway: OmegaConf.resolve turned `\\${a}` into `${a}`, which to_object then resolved.

An untyped (Any) field holding a ${...} is replaced by a mapping given whole (`interp={}`), as a typed mapping is; the
merge resolved the ${...} and added the mapping's entries to its target's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from reproduction.errors import ConfigError
from reproduction.recipes.recap.config import RunConfig
from reproduction.run.config import escape_interpolations, load_config, to_json, to_plain, to_yaml

ESCAPED = (
    "datasets:\n"
    "- path: '\\${advantages.lookahead}/x'\n"
    "  type: sft\n"
    "value:\n"
    "  model:\n"
    "    cameras: {base_0_rgb: '\\${advantages.lookahead}', left_wrist_0_rgb: '${advantages.lookahead}'}\n"
)


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_an_escaped_interpolation_loads_as_the_literal(tmp_path):
    config = load_config([_write(tmp_path, "e.yaml", ESCAPED)], schema=RunConfig)
    assert config.datasets[0].path == "${advantages.lookahead}/x"
    # the escaped one is the literal, the plain one beside it still resolves
    assert config.value.model.cameras == {"base_0_rgb": "${advantages.lookahead}", "left_wrist_0_rgb": "10"}


def test_an_escaped_interpolation_on_the_command_line_loads_as_the_literal():
    config = load_config(None, ["datasets=[{path: '\\${RUN}/d', type: sft}]"], schema=RunConfig)
    assert config.datasets[0].path == "${RUN}/d"


def test_a_rule_names_the_literal_it_refuses(tmp_path):
    path = _write(tmp_path, "t.yaml", "returns:\n  tag: '\\${advantages.lookahead}'\n")
    with pytest.raises(ConfigError) as err:  # it loaded as tag 10 before
        load_config([path], schema=RunConfig)
    assert f"{path}: returns.tag='${{advantages.lookahead}}' must be a plain name" in str(err.value)


@pytest.mark.parametrize("form", ["yaml", "json"])
def test_print_config_escapes_the_literal_and_reads_back(tmp_path, form):
    config = load_config([_write(tmp_path, "e.yaml", ESCAPED)], schema=RunConfig)
    text = to_yaml(config, recipe="recap") if form == "yaml" else to_json(config, recipe="recap")
    if form == "yaml":
        assert "- path: \\${advantages.lookahead}/x\n" in text
        assert "      base_0_rgb: \\${advantages.lookahead}\n" in text
    else:
        assert '"path": "\\\\${advantages.lookahead}/x"' in text
    again = load_config([_write(tmp_path, f"printed.{form}", text)], schema=RunConfig)
    assert to_plain(again) == to_plain(config)
    assert (to_yaml(again, recipe="recap") if form == "yaml" else to_json(again, recipe="recap")) == text


@pytest.mark.parametrize(
    "literal", ["${a}", "x ${a} ${b.c}", "\\${a}", "C:\\dir\\\\${a}", "${", "no dollar \\ here", "$ {a}", "$a"]
)
def test_escape_interpolations_reads_back_as_itself(literal):
    node = OmegaConf.create({"a": 1, "b": {"c": 2}, "v": escape_interpolations(literal)})
    assert OmegaConf.to_container(node, resolve=True)["v"] == literal


def test_a_string_without_interpolation_prints_as_before():
    assert escape_interpolations("C:\\dir\\x $a") == "C:\\dir\\x $a"


@dataclass
class Inner:
    interp: Any = "${ref}"


@dataclass
class AnyCfg:
    ref: dict[str, str] = field(default_factory=lambda: {"r": "s"})
    interp: Any = "${ref}"
    inner: Inner = field(default_factory=Inner)
    scalar: Any = "${ref.r}"


@pytest.mark.parametrize(
    ("overrides", "interp"),
    [
        (["interp={}"], {}),
        (["interp={x: y}"], {"x": "y"}),
        (["interp={}", "interp.x=y"], {"x": "y"}),
        (["interp=${ref}"], {"r": "s"}),  # a plain override is not a mapping given whole: it still resolves
        ([], {"r": "s"}),
    ],
)
def test_a_mapping_given_whole_replaces_an_interpolated_any_field(overrides, interp):
    config = load_config(None, overrides, schema=AnyCfg)
    assert config.interp == interp
    assert config.ref == {"r": "s"}  # the ${...}'s target is not touched


def test_a_mapping_given_whole_replaces_an_interpolated_any_field_in_a_section_and_a_file(tmp_path):
    assert load_config(None, ["inner.interp={x: y}"], schema=AnyCfg).inner.interp == {"x": "y"}
    assert load_config(None, ["inner={interp: {}}"], schema=AnyCfg).inner.interp == {}
    assert load_config(None, ["scalar={x: y}"], schema=AnyCfg).scalar == {"x": "y"}
    config = load_config([_write(tmp_path, "a.yaml", "interp: {x: y}\ninner: {interp: {}}\n")], schema=AnyCfg)
    assert (config.interp, config.inner.interp, config.ref) == ({"x": "y"}, {}, {"r": "s"})
