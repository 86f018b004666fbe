"""`--help` texts that name a file of the repository checkout say so (audit62 N5): a non-editable install
(`pip install .`) has no bundle/, docs/ or weights_manifest/, and `portable --help` sent its user to
`bundle/demo.toml`, `docs/config.md` and `weights_manifest/*.json` as if they were beside it."""

from __future__ import annotations

import re

import pytest

from reproduction.portable import main

COMMANDS = [
    [],
    *([c] for c in ("pack", "verify", "restore", "check", "publish", "fetch", "weights", "run", "eval")),
    *([c] for c in ("compare", "lineage", "demo")),
    *(["weights", a] for a in ("pin", "fetch", "verify")),
]
CHECKOUT_PATH = re.compile(r"\b(?:bundle|docs|weights_manifest)/\S*")


def _paragraphs(text: str) -> list[str]:
    """Each help entry (a description, a command's line, an argument's help) as one line of words."""
    entries, current = [], []
    for line in text.splitlines():
        starts = not line.startswith(" " * 6) or re.match(r"^ {2,4}\S", line)
        if starts and current:
            entries.append(" ".join(current))
            current = []
        current.append(line.strip())
    return [*entries, " ".join(current)]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "portable")
def test_a_checkout_file_a_help_names_is_said_to_be_in_the_checkout(command, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # one line per entry
    with pytest.raises(SystemExit) as done:
        main([*command, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    if "runs in the repository checkout" in text:  # demo: the command itself runs only there (check_checkout)
        return
    bare = [
        entry
        for entry in _paragraphs(text.split("\nexit codes:")[0])
        if CHECKOUT_PATH.search(entry) and "repository checkout" not in entry
    ]
    assert bare == [], bare  # was: pack's `bundle/demo.toml shows the format`, run's `keys: docs/config.md`, ...
