"""audit59 B8: a recipe package in the current folder, which the `portable` console script does not put on sys.path,
was refused with the generic "must be importable (PYTHONPATH)": the hint now says where it is and what to pass."""

from __future__ import annotations

import sys

import pytest

from reproduction.errors import ConfigError
from reproduction.run.resolve import resolve_recipe


def test_a_recipe_package_in_the_current_folder_gets_a_hint_naming_it(tmp_path, monkeypatch):
    (tmp_path / "cwdpkg").mkdir()
    (tmp_path / "cwdpkg" / "__init__.py").write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    with pytest.raises(ConfigError) as info:
        resolve_recipe("cwdpkg.module:RECIPE")
    assert info.value.message == "recipe: 'cwdpkg.module:RECIPE' cannot be imported: No module named 'cwdpkg'"
    assert info.value.hint.endswith(
        f"; cwdpkg is in the current folder, which is not searched: run with PYTHONPATH={tmp_path}"
    )


def test_no_such_hint_when_the_package_is_nowhere_near(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        resolve_recipe("nowherepkg.module:RECIPE")
    assert "current folder" not in info.value.hint
