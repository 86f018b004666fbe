"""`portable lineage --verify` found a dataset whose path holds a space, `%` or `${` "missing" (exit 11): the
statement's uri is Path.as_uri(), percent-encoded, and the check used it as a path without decoding it (review62 S
M3)."""

from __future__ import annotations

import pytest

from reproduction.run.lineage_check import resolve


@pytest.mark.parametrize("name", ["a b", "100%", "x${y}", "ü é", "plain"])
def test_a_file_uri_resolves_to_the_path_it_was_made_from(tmp_path, name):
    path = tmp_path / name / "data"
    descriptor = {"name": "data", "uri": path.as_uri(), "annotations": {}}
    assert resolve(descriptor, tmp_path / "run", statement=None) == path
