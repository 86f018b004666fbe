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
