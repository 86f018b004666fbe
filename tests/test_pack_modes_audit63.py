"""`portable pack` keeps a folder's sticky bit (audit63 misc 2): it kept only `mode & 0o777`, so a shared 0o1777
folder came back from restore a plain world-writable one, though restore keeps the bit (extract.py). Setuid/setgid
stay dropped, from folders as from files (restore refuses them), and a file's sticky bit too. Real pack and restore
of the small test bundle with its runtime layer's folders chmod-ed; the layer's member index and its archive agree."""

from __future__ import annotations

import json
import os
import tarfile

import zstandard
from bundlekit import QUIET, SMALL_SPEC, small_bundle, small_sources

from reproduction.release.restore import restore_bundle

MODES = {"share": 0o1777, "lib/python": 0o1755, "lib": 0o2775, "bin": 0o3755}
"""Folders of the runtime layer and the mode each is given before packing."""
KEPT = {"share": 0o1777, "lib/python": 0o1755, "lib": 0o775, "bin": 0o1755}
"""What the packed layer records for them: permission bits and the sticky bit, never setuid/setgid."""


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _packed(tmp_path):
    """The small bundle packed from sources whose runtime folders have MODES (and bin/tool the sticky bit)."""
    small_sources(tmp_path)
    (tmp_path / "small.toml").write_text(SMALL_SPEC, encoding="utf-8")
    runtime = tmp_path / "src" / "runtime"
    for rel, mode in MODES.items():
        os.chmod(runtime / rel, mode)
    os.chmod(runtime / "bin" / "tool", 0o1755)  # a file's sticky bit: dropped, as before
    return small_bundle(tmp_path)


def test_pack_records_a_folders_sticky_bit_and_no_setuid_or_setgid(tmp_path):
    bundle = _packed(tmp_path)
    with open(bundle / "runtime" / "rt.tar.zst", "rb") as fh:
        stream = zstandard.ZstdDecompressor().stream_reader(fh)
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            modes = {m.name: m.mode for m in tar}
    assert {rel: modes[rel] for rel in KEPT} == KEPT
    assert modes["bin/tool"] == 0o755
    index = json.loads((bundle / "runtime" / "rt.members.json").read_text())
    rows = {row[0]: row[2] for row in index["members"]}
    assert {rel: rows[rel] for rel in KEPT} == KEPT


def test_restore_brings_back_the_sticky_bit_of_a_packed_folder(tmp_path):
    bundle = _packed(tmp_path)
    restore_bundle(bundle, ui=QUIET)
    root = bundle / "runtime" / "rt"
    umask = _umask()
    got = {rel: os.stat(root / rel).st_mode & 0o7777 for rel in KEPT}
    assert got == {rel: mode & ~umask for rel, mode in KEPT.items()}
    assert got["share"] & 0o1000 and got["lib/python"] & 0o1000
    assert os.stat(root / "bin" / "tool").st_mode & 0o7777 == 0o755 & ~umask


def _root_packed(tmp_path, mode: int):
    small_sources(tmp_path)
    (tmp_path / "small.toml").write_text(SMALL_SPEC, encoding="utf-8")
    os.chmod(tmp_path / "src" / "runtime", mode)
    return small_bundle(tmp_path)


def test_pack_records_the_layers_own_folder_and_restore_gives_it_its_mode(tmp_path):
    """audit63 A L9: the layer's own folder was never packed, so restore made it 0o777 less the umask: a shared
    0o1777 root lost its sticky bit. Pack writes it first as `./`; restore sets its mode, as for any folder."""
    bundle = _root_packed(tmp_path, 0o1777)
    with open(bundle / "runtime" / "rt.tar.zst", "rb") as fh:
        stream = zstandard.ZstdDecompressor().stream_reader(fh)
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            first = next(iter(tar))
            assert (first.name, first.isdir(), first.mode) == (".", True, 0o1777)
    index = json.loads((bundle / "runtime" / "rt.members.json").read_text())
    assert index["members"][0] == ["", "dir", 0o1777, 0, ""]
    restore_bundle(bundle, ui=QUIET)
    assert os.stat(bundle / "runtime" / "rt").st_mode & 0o7777 == 0o1777 & ~_umask()
    restore_bundle(bundle, ui=QUIET)  # unchanged: the second restore keeps it
    assert os.stat(bundle / "runtime" / "rt").st_mode & 0o7777 == 0o1777 & ~_umask()


def test_a_read_only_layer_root_comes_back_with_owner_rwx(tmp_path):
    """The swap renames the target's folder across folders and trash removes it: both need u+rwx on it."""
    bundle = _root_packed(tmp_path, 0o555)
    restore_bundle(bundle, ui=QUIET)
    assert os.stat(bundle / "runtime" / "rt").st_mode & 0o7777 == 0o755 & ~_umask()


def test_a_bundle_without_a_root_member_restores_its_root_as_before(tmp_path):
    """Bundles packed before L9 list no `./`: the target is made as it always was (0o777 less the umask)."""
    from bundlekit import raw_bundle, raw_member

    bundle = raw_bundle(tmp_path / "b", raw_member("f", b"abc"), index=[["f", "file", 0o644, 3, ""]])
    restore_bundle(bundle, ui=QUIET)
    assert os.stat(bundle / "source" / "app").st_mode & 0o7777 == 0o777 & ~_umask()


def test_restore_deep_puts_back_the_mode_of_a_targets_own_folder(tmp_path):
    """review63 R L1: `--deep` compared the modes of a runtime target's subfolders with a fresh extraction's, not the
    target folder's own, which a fresh extraction now sets from `./`: a chmod of it was called unchanged."""
    bundle = _root_packed(tmp_path, 0o1777)
    restore_bundle(bundle, ui=QUIET)
    target = bundle / "runtime" / "rt"
    os.chmod(target, 0o700)
    report = restore_bundle(bundle, deep=True, ui=QUIET)
    assert os.stat(target).st_mode & 0o7777 == 0o1777 & ~_umask()
    assert "runtime/rt" in report.extracted


def test_a_root_member_with_setuid_or_setgid_is_refused_as_any_folder_is(tmp_path):
    """review63 R L2: `./` at 0o4755 restored (the bit masked off) where a subfolder at 0o4755 is exit 6."""
    import pytest
    from bundlekit import raw_bundle, raw_member

    from reproduction.errors import UnsafeArchiveError

    root = tarfile.TarInfo(".")
    root.type, root.mode, root.mtime = tarfile.DIRTYPE, 0o4755, 1577836800
    tar = root.tobuf(tarfile.USTAR_FORMAT) + raw_member("f", b"abc")
    bundle = raw_bundle(tmp_path / "b", tar, index=[["", "dir", 0o4755, 0, ""], ["f", "file", 0o644, 3, ""]])
    with pytest.raises(UnsafeArchiveError) as info:
        restore_bundle(bundle, ui=QUIET)
    assert info.value.exit_code == 6
    assert "has the setuid/setgid bit set (mode 4755)" in str(info.value)
    assert not (bundle / "source" / "app").exists()
