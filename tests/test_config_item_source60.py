"""A rule broken by one item of a tuple or list set on the command line names the command line as its source, as
the whole form does (review59 T4); a section's field set on the command line does not make a rule on the section's
other field a command-line error."""

from __future__ import annotations

from pathlib import Path

from reproduction import portable


def _err(tmp_path: Path, capsys, *args: str) -> tuple[int, str]:
    capsys.readouterr()
    rc = portable.main(["run", "--output", str(tmp_path / "run"), "--print-config", "--json", *args])
    return rc, capsys.readouterr().err


def test_a_tuple_item_that_breaks_the_rule_names_the_command_line_like_the_whole_form(tmp_path, capsys):
    rc_item, item = _err(tmp_path, capsys, "value.train.betas[0]=1")
    rc_dot, dot = _err(tmp_path, capsys, "value.train.betas.0=1")
    rc_whole, whole = _err(tmp_path, capsys, "value.train.betas=[1, 0.95]")
    assert rc_item == rc_dot == rc_whole == 4
    first = whole.splitlines()[0]
    assert first.startswith("error: command line: ") and "value.train.betas" in first
    assert item.splitlines()[0] == dot.splitlines()[0] == first


def test_a_rule_on_a_field_set_in_a_file_still_names_the_file_when_a_sibling_is_set_on_the_command_line(
    tmp_path, capsys
):
    config = tmp_path / "betas.yaml"
    config.write_text("value:\n  train:\n    betas: [1.0, 0.95]\n")
    rc, err = _err(tmp_path, capsys, "--config", str(config), "value.train.lr=0.001")
    assert rc == 4
    assert err.splitlines()[0].startswith(f"error: {config}: ") and "value.train.betas" in err.splitlines()[0]
