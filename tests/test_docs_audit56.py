"""README.md after audit56 H2-H5, H7: the compare row's defaults and `--out`, `weights pin --manifest`, the commands
`--json` prints JSON for, and the lerobot helper's package count, each as the code has them."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from reproduction.portable import build_parser

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text(encoding="utf-8")


def _row(command: str) -> str:
    return next(line for line in README.splitlines() if line.startswith(f"| `portable {command}"))


def test_the_compare_row_has_out_and_the_reference_first_defaults():
    row = _row("compare")
    assert row.startswith(
        "| `portable compare REFERENCE.json ACTUAL.json [--margin M] [--alpha A] [--out FILE] [--json]`"
    )
    assert "default: the reference's declared `margins` and `alpha`, else margin 0.05 and alpha 0.05" in row
    assert "`--out FILE` also writes the comparison JSON to FILE" in row


def test_weights_pin_manifest_is_documented():
    assert "`pin REPO --manifest FILE`" in _row("weights pin")
    assert "portable weights pin google/gemma-3-270m --manifest weights_manifest/" in README


def test_the_json_convention_names_every_command_that_prints_json():
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    takes = {name for name, p in sub.choices.items() if p.get_default("json_output")}
    assert takes == {"pack", "verify", "restore", "check", "publish", "fetch", "weights", "run", "eval", "compare",
                     "lineage"}  # fmt: skip
    text = " ".join(README.split("`--json` prints the command's result as one JSON document on", 1)[1].split())
    listed = set(re.match(r"stdout \(every command but `demo`, where it is exit 2: ([a-z, ]+)\)", text)[1].split(", "))
    assert listed == takes and set(sub.choices) - takes == {"demo"}


def test_the_lerobot_helper_count_is_of_packages_not_pins():
    import ast

    tree = ast.parse((REPO / "tests" / "test_lerobot_interop.py").read_text(encoding="utf-8"))
    pins = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "PINS")
    others = [p for p in pins if not p.startswith("lerobot==")]
    assert (len(others), sum("==" in p for p in others)) == (25, 19)
    assert "lerobot 0.4.4 and 25 other packages, 19 of them pinned to a version" in " ".join(README.split())
