"""A type error on a long value cuts the value, as the rule errors do (review60 T3): the key and the rule stay on one
readable line."""

from __future__ import annotations

import pytest

from reproduction import portable


@pytest.mark.parametrize(
    ("override", "end"),
    [
        ("value.train.lr=" + "x" * 100_000, "' of type 'str' could not be converted to Float"),
        ("value.train.shuffle=" + "y" * 5_000, "(5000 chars): it takes true or false"),
    ],
)
def test_a_long_value_of_the_wrong_type_is_cut_in_the_error_line(tmp_path, capsys, override, end):
    capsys.readouterr()
    rc = portable.main(["run", "--output", str(tmp_path / "r"), "--print-config", override])
    lines = capsys.readouterr().err.splitlines()
    key = override.partition("=")[0]
    assert rc == 4 and len(lines) == 2
    assert lines[0].startswith(f"error: command line: config key `{key}`")
    assert lines[0].endswith(end) and len(lines[0]) < 700


def test_portable_with_no_command_ends_its_help_with_an_error_and_a_hint(capsys):
    """review60 T4: the one usage error left in argparse's old shape."""
    rc = portable.main([])
    captured = capsys.readouterr()
    assert rc == 2 and captured.out == ""
    assert captured.err.splitlines()[-2:] == [
        "error: no command given",
        "hint: name one of the commands above (`portable COMMAND --help`)",
    ]
