"""A resolver that cannot resolve gets a hint about resolvers, not about config keys and ${BUNDLE} (audit60 H19)."""

from __future__ import annotations

import pytest

from reproduction import portable


@pytest.mark.parametrize(
    ("value", "hint"),
    [
        (
            "${oc.env:RECAP_PORTABLE_UNSET_60}",
            "hint: set that environment variable, give a default (${oc.env:NAME,default}), or write the value itself",
        ),
        (
            "${nosuchresolver:x}",
            "hint: the resolvers are oc.env, oc.decode, oc.create and oc.select (docs/config.md), or write the value",
        ),
    ],
)
def test_an_unresolvable_resolver_names_the_key_and_what_to_do(tmp_path, capsys, monkeypatch, value, hint):
    monkeypatch.delenv("RECAP_PORTABLE_UNSET_60", raising=False)
    capsys.readouterr()
    rc = portable.main(["run", "--output", str(tmp_path / "r"), "--print-config", f"returns.failure_reward={value}"])
    lines = capsys.readouterr().err.splitlines()
    assert rc == 4
    assert lines[0].startswith("error: command line: config key `returns.failure_reward`: ")
    assert lines[1] == hint
