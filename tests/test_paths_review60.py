"""review60 S1, S2, S4: `~name` in a setting and in path arguments (one expansion rule, fsio.expand_home; a file
literally named `~foo` is usable as in bash), and the demo's message when it runs from a bundle's own runner."""

from __future__ import annotations

from pathlib import Path

import pytest

from reproduction import portable
from reproduction.errors import ConfigError, InputNotFoundError

NOUSER = "~nouser_review60_zz"


@pytest.fixture
def cli(capsys):
    """portable ARGS in-process -> (exit code, stderr lines)."""

    def run(*args: str) -> tuple[int, list[str]]:
        capsys.readouterr()
        code = portable.main(list(args))
        return code, capsys.readouterr().err.splitlines()

    return run


def test_a_cache_setting_naming_an_unknown_users_home_is_exit_4_naming_the_variable(cli, tmp_path, monkeypatch):
    """S1: exit 1 "internal error: RuntimeError: Could not determine home directory" before the fix."""
    monkeypatch.setenv("PORTABLE_CACHE_DIR", f"{NOUSER}/cache")
    code, err = cli("verify", str(tmp_path))
    assert code == 4
    assert err[0] == (
        f"error: PORTABLE_CACHE_DIR='{NOUSER}/cache': no user 'nouser_review60_zz' on this machine for "
        f"{NOUSER} to expand to"
    )
    assert err[1].startswith("hint: give an absolute path (e.g. PORTABLE_CACHE_DIR=$HOME/.cache/recap-portable)")


def test_the_old_cache_variable_is_named_too():
    from reproduction.settings import cache_root

    with pytest.raises(ConfigError) as caught:
        cache_root({"RECAP_PORTABLE_CACHE": f" {NOUSER}"})
    assert caught.value.exit_code == 4
    assert caught.value.message.startswith(f"RECAP_PORTABLE_CACHE=' {NOUSER}': no user 'nouser_review60_zz'")


def test_expand_home_follows_the_shell():
    from reproduction.fsio import expand_home

    home = str(Path("~").expanduser())
    assert expand_home("~") == (home, None)
    assert expand_home("~/x") == (f"{home}/x", None)
    assert expand_home(f"{NOUSER}/x") == (f"{NOUSER}/x", "nouser_review60_zz")
    assert expand_home(f"./{NOUSER}") == (f"./{NOUSER}", None)  # never expanded, as in bash
    assert expand_home("a/~b") == ("a/~b", None)


@pytest.mark.parametrize("typed", [NOUSER, f"./{NOUSER}", f"{NOUSER}/sub"])
def test_a_folder_literally_named_tilde_name_is_the_path_meant(tmp_path, monkeypatch, typed):
    """S2: `verify '~foo'` was exit 3 "no user 'foo'" with a Hydra hint, `./~foo` "no user ''"."""
    from reproduction.fsio import user_path

    monkeypatch.chdir(tmp_path)
    (tmp_path / NOUSER / "sub").mkdir(parents=True)
    assert user_path(typed, what="BUNDLE") == tmp_path / typed.removeprefix("./")


def test_verify_reaches_a_folder_literally_named_tilde_name(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / NOUSER).mkdir()
    for typed in (NOUSER, f"./{NOUSER}"):
        code, err = cli("verify", typed)
        assert code == 3
        assert "no user" not in "\n".join(err)
        assert str(tmp_path / NOUSER) in err[0]


def test_dot_slash_tilde_is_never_an_unknown_user(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, err = cli("verify", f"./{NOUSER}")
    assert code == 3
    assert err[0] == f"error: {tmp_path / NOUSER} does not exist"


def test_no_hydra_hint_where_no_override_can_stand(cli, tmp_path, monkeypatch):
    """S2: the hint about Hydra's ~key belongs to `run`'s BUNDLE/override position, not to verify's BUNDLE."""
    monkeypatch.chdir(tmp_path)
    code, err = cli("verify", "~returns.tag")
    assert code == 3
    assert err == [
        "error: BUNDLE ~returns.tag: no user 'returns.tag' on this machine for ~returns.tag to expand to, and no "
        f"~returns.tag in {tmp_path} either",
        "hint: write BUNDLE without ~returns.tag (~/ is your home folder), or as an absolute path",
    ]


def test_the_demo_from_a_bundles_runner_says_the_bundle_lacks_the_folder(tmp_path, monkeypatch):
    """S4: it said "a non-editable install (pip install .)" and suggested `pip install -e .`."""
    from reproduction.release import weights_manifest

    (tmp_path / "bundle.json").write_text("{}")
    monkeypatch.setattr(weights_manifest, "project_root", lambda near=None: tmp_path)
    with pytest.raises(InputNotFoundError) as caught:
        weights_manifest.project_path("bundle/demo/run.yaml", needed_by="portable demo")
    assert caught.value.exit_code == 3
    assert caught.value.message == (
        f"portable demo needs the checkout's bundle/ folder, and the bundle {tmp_path} has none: a bundle carries "
        "only what its spec packs, not the checkout's data folders"
    )
    assert caught.value.hint == "run `portable demo` from a recap-portable checkout, not with the bundle's own runner"
