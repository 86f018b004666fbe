"""audit53 V1-V3, V7, V13, V14, V18: the cache root is one checked, `~`-expanded, absolute folder for every writer;
Hub tunables out of range (inf, nan, negative, zero) are exit 4 naming the variable; `portable check` names an
unwritable cache and PORTABLE_* variables that nothing reads."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from reproduction import portable, settings
from reproduction.checks import host
from reproduction.data.fingerprint import cache_dir as fingerprint_dir
from reproduction.errors import ConfigError, InvalidInputError
from reproduction.release.hub_transfer import HubSettings
from reproduction.sim.libero._runtime import default_cache_dir

CACHE_VARS = ("PORTABLE_CACHE_DIR", "RECAP_PORTABLE_CACHE")


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for name in CACHE_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    return tmp_path


def _numerics_path(env: dict[str, str], tmp_path: Path) -> Path | None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("vendor_id : x\n")
    ctx = SimpleNamespace(
        facts={"modules": {"torch": __file__}}, python=Path(sys.executable), env=env, cpuinfo_file=cpuinfo
    )
    return host._numerics_cache(ctx, env)  # type: ignore[arg-type]


def test_tilde_is_expanded_for_every_writer_and_nothing_lands_in_the_cwd(clean_env, monkeypatch):
    """V13: a `~` the shell did not expand made a folder literally named `~` in the current folder (in a bundle:
    `verify` then found an extra file, exit 12). Every writer now uses settings.cache_root."""
    home = clean_env / "home"
    monkeypatch.setenv("PORTABLE_CACHE_DIR", "~/c")
    assert settings.cache_root() == home / "c"
    assert fingerprint_dir() == home / "c" / "fingerprints"
    assert default_cache_dir() == home / "c" / "libero"
    numerics = _numerics_path({"PORTABLE_CACHE_DIR": "~/c", "HOME": str(home)}, clean_env)
    assert numerics is not None and numerics.parent == home / "c" / "numerics"
    assert settings.cache_root({"PORTABLE_CACHE_DIR": "  /abs/x/../y  "}) == Path("/abs/y")
    assert list((clean_env / "cwd").iterdir()) == []


def test_blank_is_unset_and_relative_is_exit_4_naming_the_variable(clean_env, monkeypatch, capsys):
    """V13: a blank value made a folder named " ", a relative one `./relcache`, both in the current folder."""
    assert settings.cache_root({"PORTABLE_CACHE_DIR": "   "}) is None
    assert settings.cache_root({"PORTABLE_CACHE_DIR": " ", "RECAP_PORTABLE_CACHE": "/old"}) == Path("/old")
    with pytest.raises(ConfigError) as bad:
        settings.cache_root({"RECAP_PORTABLE_CACHE": "relcache"})
    assert (bad.value.exit_code, bad.value.field) == (4, "RECAP_PORTABLE_CACHE")
    monkeypatch.setenv("PORTABLE_CACHE_DIR", "relcache")
    assert portable.main(["verify", str(clean_env / "nothing")]) == 4
    assert capsys.readouterr().err.splitlines() == [
        "error: PORTABLE_CACHE_DIR='relcache' is not an absolute path: the cache would land in whichever folder a "
        "command runs from",
        "hint: give an absolute path (e.g. PORTABLE_CACHE_DIR=$PWD/relcache or PORTABLE_CACHE_DIR=$HOME/...), or "
        f"unset it for {clean_env / 'home' / '.cache' / 'recap-portable'}",
    ]
    assert _numerics_path({"PORTABLE_CACHE_DIR": "relcache"}, clean_env) is None  # no cache, not ./relcache
    assert list((clean_env / "cwd").iterdir()) == []


def test_an_unexpanded_variable_is_not_told_to_go_under_the_current_folder():
    """A `$HOME/c` that reached the tool unexpanded was told to become `$PWD/$HOME/c` (stop 53's left-over)."""
    with pytest.raises(ConfigError) as bad:
        settings.cache_root({"PORTABLE_CACHE_DIR": "$HOME/c"})
    assert str(bad.value) == (
        "PORTABLE_CACHE_DIR='$HOME/c' is not an absolute path (no shell expanded its variable): the cache would land "
        "in whichever folder a command runs from"
    )
    assert bad.value.hint.startswith("write the folder out (e.g. PORTABLE_CACHE_DIR=/home/me/.cache/recap-portable)")
    assert "$PWD" not in bad.value.hint


def test_libero_honours_the_old_name(clean_env, monkeypatch):
    """V7: with only RECAP_PORTABLE_CACHE set, fingerprints went there but LIBERO's files to the temp folder."""
    monkeypatch.setenv("RECAP_PORTABLE_CACHE", str(clean_env / "old"))
    assert default_cache_dir() == clean_env / "old" / "libero"
    assert fingerprint_dir() == clean_env / "old" / "fingerprints"


@pytest.mark.parametrize(
    ("var", "raw", "shown", "allowed", "default"),
    [
        ("CONNECT_TIMEOUT_S", "inf", "inf", "a number of seconds above 0, at most 86400", "20"),
        ("STALL_TIMEOUT_S", "nan", "nan", "a number of seconds above 0, at most 86400", "60"),
        ("STALL_TIMEOUT_S", "0", "0", "a number of seconds above 0, at most 86400", "60"),
        ("BACKOFF_S", "nan", "nan", "a number of seconds from 0 to 86400", "1"),
        ("BACKOFF_MAX_S", "-inf", "-inf", "a number of seconds from 0 to 86400", "30"),
        ("BACKOFF_S", "-1", "-1", "a number of seconds from 0 to 86400", "1"),
        ("RETRIES", "-1", "-1", "a whole number from 0 to 1000", "5"),
        ("RETRIES", "5000", "5000", "a whole number from 0 to 1000", "5"),
        ("JOBS", "0", "0", "a whole number from 1 to 256", "8"),
        ("CONNECT_TIMEOUT_S", "9999999999", "9999999999", "a number of seconds above 0, at most 86400", "20"),
    ],
)
def test_hub_values_out_of_range_are_exit_4_naming_the_variable(var, raw, shown, allowed, default):
    """V1, V2, V3: inf/nan passed `< 0` checks and ended as "internal error" (exit 1) or "not JSON" (exit 30);
    negative values were refused as `hub setting retries=-1` without naming the variable or what to do."""
    env = f"PORTABLE_HUB_{var}"
    with pytest.raises(InvalidInputError) as bad:
        HubSettings.from_env({env: raw})
    assert (bad.value.exit_code, bad.value.field, bad.value.message, bad.value.hint) == (
        4,
        env,
        f"{env}={shown} must be {allowed}",
        f"unset {env} for the default ({default}) or set it to {allowed}",
    )


def test_hub_edges_that_are_fine():
    import dataclasses

    # settings.HUB_FIELDS (what `portable check` counts as read) is exactly what from_env reads
    assert tuple(f.name for f in dataclasses.fields(HubSettings) if f.name != "endpoint") == settings.HUB_FIELDS
    s = HubSettings.from_env({"PORTABLE_HUB_RETRIES": "0", "PORTABLE_HUB_BACKOFF_S": "0", "PORTABLE_HUB_JOBS": "1"})
    assert (s.retries, s.backoff_s, s.jobs) == (0, 0.0, 1)
    assert math.isfinite(HubSettings.from_env({"PORTABLE_HUB_CONNECT_TIMEOUT_S": "1e-3"}).connect_timeout_s)


def test_fetch_with_an_infinite_timeout_is_exit_4_not_an_internal_error(monkeypatch, capsys, tmp_path):
    """V1: `PORTABLE_HUB_CONNECT_TIMEOUT_S=inf portable fetch` was exit 1 "internal error: OverflowError"."""
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("PORTABLE_HUB_CONNECT_TIMEOUT_S", "inf")
    assert portable.main(["fetch", "alice/x", str(tmp_path / "dest")]) == 4
    assert capsys.readouterr().err.splitlines()[0] == (
        "error: PORTABLE_HUB_CONNECT_TIMEOUT_S=inf must be a number of seconds above 0, at most 86400"
    )


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs /proc (a folder nobody, root included, writes)")
def test_check_names_an_unwritable_cache(tmp_path):
    """V14: PORTABLE_CACHE_DIR=/proc/nope/cache ran `portable check` with no cache and no word."""
    row = host.cache_row({"PORTABLE_CACHE_DIR": "/proc/nope/cache"})
    assert (row.name, row.status) == ("host.cache", "warn")
    assert row.finding.startswith("no cache can be written: cannot write the cache root /proc/nope/cache: ")
    assert row.fix == "point PORTABLE_CACHE_DIR at a writable absolute folder, or unset it for the default"
    good = host.cache_row({"PORTABLE_CACHE_DIR": str(tmp_path / "new")})
    assert (good.status, good.finding) == ("ok", f"cache at {tmp_path / 'new'} (writable)")
    assert not (tmp_path / "new").exists()  # probed, not created


def test_check_names_portable_variables_nothing_reads():
    """V18: misspelled knobs (PORTABLE_HUB_STALL_TIMEOUT without _S) silently kept their defaults."""
    env = {
        "PORTABLE_HUB_JOB": "abc",
        "PORTABLE_HUB_STALL_TIMEOUT": "5",
        "PORTABLE_HEAPS": "bogus",
        "PORTABLE_XYZZY": "1",
        "PORTABLE_HEAP": "hold",
        "PORTABLE_FUZZ_EXAMPLES": "3",
        "PORTABLE_HUB_BACKOFF_MAX_S": "3",
    }
    row = host.settings_row(env)
    assert (row.name, row.status, row.details["unknown"]) == (
        "host.settings",
        "warn",
        ["PORTABLE_HEAPS", "PORTABLE_HUB_JOB", "PORTABLE_HUB_STALL_TIMEOUT", "PORTABLE_XYZZY"],
    )
    assert row.finding == (
        "PORTABLE_* variables that nothing reads, so they change nothing: PORTABLE_HEAPS (did you mean "
        "PORTABLE_HEAP?), PORTABLE_HUB_JOB (did you mean PORTABLE_HUB_JOBS?), PORTABLE_HUB_STALL_TIMEOUT (did you "
        "mean PORTABLE_HUB_STALL_TIMEOUT_S?), PORTABLE_XYZZY"
    )
    assert host.settings_row({"PORTABLE_HEAP": "hold"}).status == "ok"
