"""Restore's Low findings of audit63 A still open after round 63: the swap renames in folder fds (L3), folders without
owner r/x (L1), a member too long for PATH_MAX under the bundle (L2), the zstd CLI's own refusal (L7), names that
differ only by Unicode normalisation (L8). In-process through `portable.main` where the behaviour allows."""

from __future__ import annotations

import os

import pytest
from bundlekit import forge_bundle, member

import reproduction.release.restore as restore_mod
from reproduction.portable import main

# -- L3: a symlink planted in a target's parent folder between preflight and the swap ------------------------------


def _plant_at_swap(monkeypatch, victim):
    """Wrap restore's swap: before it runs, the target's parent folder is moved away and replaced by a symlink to
    `victim` (a second local user winning the race between preflight and the rename)."""
    real = restore_mod.swap_into_place

    def swap(staging, final, trash, **kwargs):
        os.rename(final.parent, f"{final.parent}.moved")
        os.symlink(victim, final.parent)
        return real(staging, final, trash, **kwargs)

    monkeypatch.setattr(restore_mod, "swap_into_place", swap)


@pytest.mark.parametrize("again", [False, True], ids=["first restore", "update of a restored target"])
def test_a_symlink_planted_in_a_targets_parent_after_preflight_is_refused(tmp_path, monkeypatch, capsys, again):
    victim = tmp_path / "victim"
    (victim / "a").mkdir(parents=True)
    (victim / "a" / "precious.txt").write_text("victim's data\n")
    bundle = forge_bundle(
        tmp_path / "bundle", [("layers/a.tar.zst", "runtime/a", "runtime", [member("x.txt", data=b"bundle file\n")])]
    )
    if again:  # the target is restored, then damaged: the next restore extracts and swaps it again
        assert main(["restore", str(bundle), "-q"]) == 0
        (bundle / "runtime" / "a" / "x.txt").write_text("damaged\n")
    capsys.readouterr()
    _plant_at_swap(monkeypatch, victim)
    code = main(["restore", str(bundle), "-q"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 6, err
    assert err[0] == (
        "error: layer target runtime/a lies under the symlink runtime, which appeared while restore ran: "
        "refusing to restore through it"
    )
    assert err[1].startswith(f"hint: remove {bundle / 'runtime'} ")
    assert sorted(os.listdir(victim)) == ["a"] and sorted(os.listdir(victim / "a")) == ["precious.txt"]
    assert (victim / "a" / "precious.txt").read_text() == "victim's data\n"
    # the link gone and the folder back, the next restore finishes the job
    monkeypatch.undo()
    os.unlink(bundle / "runtime")
    os.rename(f"{bundle / 'runtime'}.moved", bundle / "runtime")
    assert main(["restore", str(bundle), "-q"]) == 0
    assert (bundle / "runtime" / "a" / "x.txt").read_bytes() == b"bundle file\n"
