"""audit60 D: path arguments starting with `~unknownuser`, a tuple-of-sections schema field, odd --config targets,
long values and newlines in error lines, and Hydra's +key/~key forms."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from reproduction import portable


@dataclass
class Pt:
    x: int = 0


@dataclass(kw_only=True)
class TupleOfSections:
    pts: tuple[Pt, ...] = (Pt(),)


@dataclass(kw_only=True)
class Nested:
    inner: TupleOfSections = field(default_factory=TupleOfSections)


@dataclass(kw_only=True)
class Plain:
    s: str = "x"
    pair: tuple[int, int] = (1, 2)


@pytest.fixture
def cli(tmp_path, capsys):
    """portable run --print-config ARGS -> (exit code, stderr lines), in-process, output under tmp_path."""

    def run(*args: str) -> tuple[int, list[str]]:
        capsys.readouterr()
        code = portable.main(["run", "--print-config", *args])
        return code, capsys.readouterr().err.splitlines()

    return run


NOUSER = "~nouser_audit60_zz"


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--output", f"{NOUSER}/r"], "--output"),
        (["--output", "R", "--config", f"{NOUSER}/c.yaml"], "--config"),
        ([f"{NOUSER}/bundle", "--output", "R"], "BUNDLE"),
    ],
)
def test_a_path_naming_an_unknown_users_home_is_exit_3_naming_the_argument(cli, tmp_path, monkeypatch, args, flag):
    monkeypatch.chdir(tmp_path)  # no file `~nouser_audit60_zz` here either (review60 S2: one would be meant)
    args = [str(tmp_path / "r") if a == "R" else a for a in args]
    code, err = cli(*args)
    assert code == 3
    assert err[0] == f"error: {flag} {next(a for a in args if a.startswith(NOUSER))}: no user " + (
        f"'nouser_audit60_zz' on this machine for ~nouser_audit60_zz to expand to, and no ~nouser_audit60_zz in "
        f"{tmp_path} either"
    )
    assert "Hydra" not in err[1]


def test_hydras_deletion_syntax_taken_as_the_bundle_gets_a_hint(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, err = cli("--output", str(tmp_path / "r"), "~returns.tag")
    assert code == 3
    assert err[0] == (
        "error: BUNDLE ~returns.tag: no user 'returns.tag' on this machine for ~returns.tag to expand to, "
        f"and no ~returns.tag in {tmp_path} either"
    )
    assert "Hydra's ~key (delete) and +key=value (add) overrides are not supported" in err[1]
    assert "returns.tag=null" in err[1]


def test_hydras_addition_syntax_gets_a_hint(cli, tmp_path):
    code, err = cli("--output", str(tmp_path / "r"), "+returns.zz=1")
    assert code == 4
    assert err[0].startswith("error: command line: unknown config key `+returns`")
    assert err[1].startswith("hint: Hydra's +key=value (add) and ~key (delete) overrides are not supported")


@pytest.mark.parametrize("schema", ["TupleOfSections", "Nested"])
def test_a_tuple_of_sections_in_a_schema_is_refused_naming_the_field(cli, tmp_path, schema):
    from reproduction.recipe import Recipe, StageSpec

    globals()[f"R_{schema}"] = Recipe(
        name="t60",
        config_schema=f"{__name__}:{schema}",
        stages=(StageSpec(name="a", fn=f"{__name__}:Pt", inputs=False),),
    )
    code, err = cli("--output", str(tmp_path / "r"), f"recipe={__name__}:R_{schema}")
    key = "pts" if schema == "TupleOfSections" else "inner.pts"
    assert code == 4
    assert err[0] == (
        f"error: recipe '{__name__}:R_{schema}': config_schema {__name__}:{schema}: field `{key}` is of type "
        f"tuple[{__name__}.Pt, ...], a tuple of sections, which a run config cannot set or read back"
    )
    assert err[1] == f"hint: type `{key}` as list[Pt] (a list of sections works like any list)"


def test_a_tuple_of_plain_values_is_still_accepted(cli, tmp_path):
    from reproduction.recipe import Recipe, StageSpec

    globals()["R_PLAIN"] = Recipe(
        name="t60p", config_schema=f"{__name__}:Plain", stages=(StageSpec(name="a", fn=f"{__name__}:Pt", inputs=False),)
    )
    code, err = cli("--output", str(tmp_path / "r"), f"recipe={__name__}:R_PLAIN", "pair[0]=5")
    assert (code, err) == (0, [])


def test_dev_null_as_config_is_not_a_regular_file(cli, tmp_path):
    code, err = cli("--output", str(tmp_path / "r"), "--config", "/dev/null")
    assert code == 3
    assert err[0] == "error: config file /dev/null is not a regular file (a FIFO, a socket or a device)"


def test_a_config_file_holding_a_number_is_not_a_mapping(cli, tmp_path):
    (tmp_path / "i.yaml").write_text("3\n")
    code, err = cli("--output", str(tmp_path / "r"), "--config", str(tmp_path / "i.yaml"))
    assert code == 4
    assert err[0] == f"error: {tmp_path / 'i.yaml'}: the top level is not a mapping of keys"


def test_a_long_value_is_cut_in_the_error_line(cli, tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("returns: {tag: " + "a" * 900_000 + "}\n")
    code, err = cli("--output", str(tmp_path / "r"), "--config", str(big))
    assert code == 4
    assert err[0] == (
        f"error: {big}: returns.tag='{'a' * 200}...' (900000 chars) must be a plain name (letters, digits, - _ .; "
        "at most 100 characters, not starting with -)"
    )


def test_a_newline_in_an_overrides_key_stays_on_one_line(cli, tmp_path):
    code, err = cli("--output", str(tmp_path / "r"), "returns.\ntag=a")
    assert code == 4
    assert err[0] == "error: command line: unknown config key `returns. tag`"
    assert err[1].startswith("hint: did you mean `returns.tag`?")


def test_a_value_under_a_str_key_names_the_command_line(cli, tmp_path):
    code, err = cli("--output", str(tmp_path / "r"), "value.model.cameras.a.b=x")
    assert code == 4
    assert err[0].startswith("error: command line: config key `value.model.cameras.a`: ")


def test_an_interpolated_recipe_names_its_source_and_why(cli, tmp_path):
    code, err = cli("--output", str(tmp_path / "r"), "recipe=${returns.tag}")
    assert code == 4
    assert err[0] == (
        "error: command line: recipe: '${returns.tag}' is an interpolation; the recipe is read before the config "
        "resolves"
    )
    (tmp_path / "r.yaml").write_text("recipe: 3\n")
    code, err = cli("--output", str(tmp_path / "r"), "--config", str(tmp_path / "r.yaml"))
    assert (code, err[0]) == (4, f"error: {tmp_path / 'r.yaml'}: recipe: 3 is not a recipe name")
