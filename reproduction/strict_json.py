"""JSON reading that refuses a repeated key: one helper for every file a bundle, a restored tree or a run carries.

`json` keeps the last value of a key that occurs twice in one object, silently: a bundle.json with a second
`"layers": []` restored none of the layers and reported success (audit58 A1), and an evidence file naming a task twice
lost its first counts (audit46 stats F4). A file that means different things to different JSON readers is damaged or
hostile, so readers here refuse it. Stdlib only (release/noop.py imports it before the CLI loads).
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any


class RepeatedKeyError(ValueError):
    """A key occurs more than once in one JSON object. `where` names the object ('' for the top level) as
    `repeated_keys` names it; `key` and `times` say which key and how often. A ValueError, as json's own errors are."""

    def __init__(self, where: str, key: str, times: int) -> None:
        self.where, self.key, self.times = where, key, times
        super().__init__(
            f"the key {key!r} occurs {times} times in {where or 'the top level'}; "
            "JSON keeps only the last, so the others would be silently dropped"
        )


class _Repeats(dict):
    """A JSON object in which a key occurs more than once (`repeated`: key -> times)."""

    repeated: dict[str, int]


def loads_noting_repeats(text: str | bytes, *, named: Collection[str] = ()) -> tuple[Any, list[tuple[str, str, int]]]:
    """(the document as `json.loads` reads it, [(where, key, times)] of every repeated key in it), for a reader that
    checks other things first and reports a repeat in its own words. `named`: keys whose values are objects keyed by a
    name rather than by a field, whose entries `where` names as `parent['name']` instead of `parent.name`.
    Raises what `json.loads` raises (ValueError, RecursionError)."""
    repeats: list[_Repeats] = []
    doc = json.loads(text, object_pairs_hook=lambda pairs: _object(pairs, repeats))
    return doc, (repeated_keys(doc, named=named) if repeats else [])


def loads(text: str | bytes, *, named: Collection[str] = ()) -> Any:
    """`json.loads(text)`, refusing a repeated key: RepeatedKeyError (a ValueError) names the first one."""
    doc, repeats = loads_noting_repeats(text, named=named)
    for where, key, times in repeats:
        raise RepeatedKeyError(where, key, times)
    return doc


def _object(pairs: list[tuple[str, Any]], repeats: list[_Repeats]) -> dict[str, Any]:
    """json's object_pairs_hook: a dict as json makes, or a _Repeats (also appended to `repeats`) saying which keys
    came twice."""
    out = dict(pairs)
    if len(out) == len(pairs):
        return out
    keys = [k for k, _ in pairs]
    twice = _Repeats(out)
    twice.repeated = {k: keys.count(k) for k in dict.fromkeys(keys) if keys.count(k) > 1}
    repeats.append(twice)
    return twice


def repeated_keys(value: Any, where: str = "", *, named: Collection[str] = ()) -> list[tuple[str, str, int]]:
    """(where, key, times) of every repeated key under `value` (as read by `loads_noting_repeats`): `where` is a dotted
    path, list items `[i]`, and entries of an object under a key in `named` `['name']`."""
    found = []
    if isinstance(value, dict):
        found += [(where, k, n) for k, n in getattr(value, "repeated", {}).items()]
        for k, v in value.items():
            inner = f"{where}[{k!r}]" if where.rsplit(".", 1)[-1] in named else f"{where}.{k}" if where else k
            found += repeated_keys(v, inner, named=named)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += repeated_keys(v, f"{where}[{i}]", named=named)
    return found
