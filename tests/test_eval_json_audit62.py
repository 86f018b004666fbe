"""`portable eval ... --json FILE` (audit62 L5): eval's --json is the global flag, so FILE was read as an override
and refused as one (exit 4 "override 'e.json' is not key.path=value", or --plan's exit 2 "takes no key.path=value
overrides"), written nowhere, where `portable check --json FILE` writes FILE relative to the current folder. Now a
usage error (exit 2) that says eval writes no FILE and how to write one: stdout redirected to FILE made absolute
from the current folder. Nothing is evaluated or created."""

from __future__ import annotations

import pytest

from reproduction.portable import main


@pytest.mark.parametrize(
    "argv",
    [["--checkpoint", "1", "--output", "run"], ["--plan", "--rate", "0.5"]],
    ids=["evaluate", "plan"],
)
@pytest.mark.parametrize("where", ["after", "before"])
def test_a_json_file_is_refused_naming_it_and_its_absolute_path(tmp_path, monkeypatch, capsys, argv, where):
    monkeypatch.chdir(tmp_path)
    args = ["eval", *argv, "--json", "e.json"] if where == "after" else ["--json", "eval", *argv, "e.json"]
    assert main(args) == 2  # was 4 (evaluate) and 2 with a message about overrides (plan)
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "error: `portable eval` writes no --json FILE: 'e.json' is no key.path=value override (eval's --json prints "
        "the result on stdout; only `portable check --json FILE` writes one)",
        f"hint: redirect stdout to write it: portable eval ... --json > {tmp_path / 'e.json'}",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no run folder, no e.json


def test_a_word_without_json_is_still_the_overrides_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["eval", "--checkpoint", "1", "--output", "run", "e.json"]) == 4
    assert capsys.readouterr().err.startswith("error: override 'e.json' is not key.path=value")


def test_with_json_an_override_missing_its_value_is_still_the_overrides_error(tmp_path, monkeypatch, capsys):
    """review62 S L1: `--json` anywhere made `eval.episodes_per_task` (its `=value` forgotten) a --json FILE, with a
    hint to redirect stdout into a file of that name."""
    monkeypatch.chdir(tmp_path)
    argv = ["--json", "eval", "--checkpoint", "1", "--output", "run", "eval.episodes_per_task"]
    assert main(argv) == 4
    assert capsys.readouterr().err.startswith("error: override 'eval.episodes_per_task' is not key.path=value")
