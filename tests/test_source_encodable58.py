"""Every string constant in reproduction/ encodes as UTF-8.

A docstring that wrote an escape such as `\\udcff` without doubling its backslash held a lone surrogate: Python 3.13
dedents docstrings at compile time with strict UTF-8, so importing release/manifest.py failed there, and `restore`
on a bare Python 3.13 exited 1 (found at stop 58 by tests/test_restore.py's bare-Python restore). The bundle's
reproduction/ runs on whatever Python 3.10-3.13 a server has, so the rule is checked on the source, not only by the
bare-Python tests, which skip where those interpreters are missing.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_no_string_constant_holds_a_lone_surrogate():
    bad = []
    files = sorted((REPO / "reproduction").rglob("*.py"))
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                try:
                    node.value.encode("utf-8")
                except UnicodeEncodeError:
                    bad.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert len(files) > 100 and not bad, f"double the backslash of the escape (`\\\\udcff`) in: {bad}"
