"""Restore's Low findings of audit63 A still open after round 63: the swap renames in folder fds (L3), folders without
owner r/x (L1), a member too long for PATH_MAX under the bundle (L2), the zstd CLI's own refusal (L7), names that
differ only by Unicode normalisation (L8). In-process through `portable.main` where the behaviour allows."""

from __future__ import annotations

import errno
import io
import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import zstandard
from bundlekit import QUIET, SCRIPT, forge_bundle, member, raw_bundle, repin, write_tree

import reproduction.release.restore as restore_mod
from reproduction.portable import main
from reproduction.release import zstdio
from reproduction.release.manifest import PATH_MAX
from reproduction.release.pack import pack_bundle
from reproduction.release.tarscan import StreamSource, iter_members

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


# -- L1: a folder packed without owner r/x -------------------------------------------------------------------------

MODES_SPEC = """\
name = "modes"
root = "src"

[[layer]]
source = "rt"
kind = "runtime"
name = "rt"

[[layer]]
source = "app"
kind = "source"
name = "app"
"""


def _modes_bundle(root: Path, mode: int, out: str = "bundle", version: bytes = b"v1") -> Path:
    """Pack a runtime and a source layer (as root may: it reads any folder), each holding a folder `d` of `mode`
    with a file in it."""
    shutil.rmtree(root / "src", ignore_errors=True)
    write_tree(root / "src", {"rt/d/x.txt": b"x\n", "app/d/x.py": version, "app/top.py": version})
    (root / "modes.toml").write_text(MODES_SPEC, encoding="utf-8")
    for folder in ("rt/d", "app/d"):
        os.chmod(root / "src" / folder, mode)
    try:
        pack_bundle(root / "modes.toml", root / out, ui=QUIET)
    finally:
        for folder in ("rt/d", "app/d"):
            os.chmod(root / "src" / folder, 0o755)
    return root / out


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("mode", [0o000, 0o644, 0o555, 0o1777])
def test_a_restored_folder_is_always_owner_rwx(tmp_path, capsys, mode):
    if mode in (0o000, 0o644) and os.geteuid() != 0:
        pytest.skip("only root packs a folder it cannot read")
    bundle = _modes_bundle(tmp_path, mode)
    assert main(["restore", str(bundle), "-q"]) == 0, capsys.readouterr().err
    want = mode & 0o1777 & ~_umask() | 0o700
    for target in ("runtime/rt", "source/app"):
        assert f"{stat.S_IMODE(os.lstat(bundle / target / 'd').st_mode):o}" == f"{want:o}", target


def _as_nobody() -> list[str] | None:
    """The command prefix that runs the CLI as the user nobody (a Python it may run, with zstandard or the zstd CLI),
    or None where that cannot be done (not root, no setpriv, no such Python)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return None
    try:
        uid = pwd.getpwnam("nobody").pw_uid
    except KeyError:
        return None
    prefix = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "env", "PORTABLE_NO_PROGRESS=1"]
    for python in (sys.executable, "/usr/bin/python3"):
        probe = "import zstandard" if shutil.which("zstd") is None else "pass"
        done = subprocess.run([*prefix, python, "-c", probe], capture_output=True, timeout=60)
        help_ok = subprocess.run([*prefix, python, str(SCRIPT), "--help"], capture_output=True, timeout=60)
        if done.returncode == 0 and help_ok.returncode == 0:
            return [*prefix, python, str(SCRIPT)]
    return None


@pytest.fixture
def nobody() -> Iterator[tuple[list[str], Path]]:
    """(the CLI run as the user nobody, a fresh folder of mode 0755 under /tmp: pytest's tmp_path nobody cannot
    reach); the folder is removed after. Skips where the CLI cannot run as nobody (_as_nobody)."""
    cli = _as_nobody()
    if cli is None:
        pytest.skip("needs root, setpriv and a Python the user nobody can run")
    work = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        os.chmod(work, 0o755)
        yield cli, work
    finally:
        subprocess.run(["chmod", "-R", "u+rwx", str(work)], timeout=60)
        shutil.rmtree(work, ignore_errors=True)


def _give_to_nobody(work: Path) -> None:
    subprocess.run(["chown", "-R", "nobody:", str(work)], check=True, timeout=60)


def _restore_as(cli: list[str], bundle: Path) -> tuple[int, str]:
    """`portable restore BUNDLE` run by `cli`: its exit code and stderr."""
    done = subprocess.run([*cli, "restore", str(bundle)], capture_output=True, text=True, timeout=120)
    return done.returncode, done.stderr


@pytest.mark.parametrize("mode", [0o000, 0o644])
def test_a_user_other_than_root_restores_such_a_folder_unchanged_and_updates_it(nobody, mode):
    cli, work = nobody
    bundle = _modes_bundle(work, mode)

    def restore() -> tuple[int, str]:
        _give_to_nobody(work)
        return _restore_as(cli, bundle)

    code, err = restore()
    assert code == 0 and err.endswith("files verified; extracted runtime/rt, source/app\n"), err
    code, err = restore()
    assert code == 0 and err.endswith("files verified; unchanged runtime/rt, source/app\n"), err
    shutil.copytree(_modes_bundle(work, mode, out="bundle2", version=b"v2"), bundle, dirs_exist_ok=True)
    code, err = restore()
    assert code == 0 and err.endswith("files verified; extracted source/app; unchanged runtime/rt\n"), err
    assert (bundle / "source" / "app" / "d" / "x.py").read_bytes() == b"v2"


# -- L2: a member whose path under the bundle's folder passes PATH_MAX ---------------------------------------------

DEEP = "/".join(["c" * 250] * 15)
"""15 folders of 250 bytes: 3764 bytes, so `source/app/<DEEP>/f.txt` fits the bundle-relative limit, and the path of
a bundle in pytest's tmp_path too, but not in a folder some 300 bytes deeper."""


def _pax_tar(members: list[tuple[str, bytes | None]]) -> bytes:
    """Tar bytes (pax, no end blocks) of folders (data None) and files, in order."""
    out = b""
    for name, data in members:
        info = tarfile.TarInfo(name)
        info.mtime = 1577836800
        if data is None:
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            out += info.tobuf(tarfile.PAX_FORMAT)
        else:
            info.size, info.mode = len(data), 0o644
            out += info.tobuf(tarfile.PAX_FORMAT) + data + b"\0" * (-len(data) % 512)
    return out


def _deep_bundle(root: Path, version: bytes = b"v1\n") -> Path:
    """A source layer (with a member index, so a restore can keep it on the receipt's word) holding DEEP/f.txt."""
    parts = DEEP.split("/")
    tar = _pax_tar([*(("/".join(parts[: i + 1]), None) for i in range(len(parts))), ("top.py", b"top\n")])
    tar += _pax_tar([(f"{DEEP}/f.txt", version)])
    index = [[m.name, m.kind, m.mode, m.size, m.linkname] for m in iter_members(StreamSource(io.BytesIO(tar)))]
    return raw_bundle(root, tar, index=index)


def _long_home(tmp_path: Path) -> Path:
    """A folder whose path makes `<it>/bundle/source/app/<DEEP>/f.txt` pass PATH_MAX (4095 bytes)."""
    pad = PATH_MAX + 20 - len(f"{tmp_path}/bundle/source/app/{DEEP}/f.txt")
    assert pad > 20, "pytest's tmp_path is too long for this test"
    return tmp_path.joinpath(*["p" * 199] * (pad // 200), "p" * (pad % 200))


def _length_refusal(bundle: Path, err: list[str], *, recorded: bool = False) -> None:
    """The exit 9 refusal of DEEP/f.txt: as an archive member (where the staging copy, `.portable/staging/0`, is 9
    bytes longer than the target `source/app`: review64 R L2), or as a file an earlier restore wrote (`recorded`)."""
    final = len(f"{bundle}/source/app/{DEEP}/f.txt")
    size = final if recorded else final + len(".portable/staging/0") - len("source/app")
    assert len(err) == 2, err
    if recorded:
        assert err[0].startswith(f"error: {bundle}/source/app: the file '{DEEP[:60]}...") and err[0].endswith(
            f"/f.txt', which an earlier restore wrote there, now lies at a path of {size} bytes, longer than the 4095 "
            "bytes a path may have; nothing was changed"
        ), err[0][:200]
    else:
        assert err[0].startswith(f"error: source/app.tar.zst: member '{DEEP[:60]}...") and err[0].endswith(
            f"/f.txt' would lie at a path of {size} bytes in {bundle}/.portable/staging while restore extracts it "
            f"({final} bytes in {bundle}/source/app), longer than the 4095 bytes a path may have; nothing was changed"
        ), err[0][:200]
    assert err[1] == (
        f"hint: move the bundle to a folder whose path is at least {size - PATH_MAX} bytes shorter (it is "
        f"{len(str(bundle))} bytes now), then run `portable restore` there"
    )


def test_a_member_too_long_for_the_bundles_path_is_refused_before_extracting(tmp_path, capsys):
    bundle = _deep_bundle(_long_home(tmp_path) / "bundle")
    code = main(["restore", str(bundle), "-q"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 9, err
    _length_refusal(bundle, err)
    assert not (bundle / "source" / "app").exists()


def test_a_restored_bundle_moved_where_a_member_is_too_long_is_refused(tmp_path, capsys):
    bundle = _deep_bundle(tmp_path / "bundle")
    assert main(["restore", str(bundle), "-q"]) == 0, capsys.readouterr().err
    moved = _long_home(tmp_path) / "bundle"
    moved.parent.mkdir(parents=True)
    os.rename(bundle, moved)
    _deep_bundle(moved, version=b"v2\n")  # an update too: it was refused as a source edit (exit 4)
    capsys.readouterr()
    for _ in range(2):  # it would have been named as locally edited by every later restore
        code = main(["restore", str(moved), "-q"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 9, err
        _length_refusal(moved, err, recorded=True)


# -- L7: a frame the zstd CLI refuses ------------------------------------------------------------------------------


def _wide_window_bundle(root: Path, *, index: bool) -> Path:
    """A source layer whose archive is one zstd frame with a 2 GiB window: its digest matches, the CLI refuses it."""
    tar = _pax_tar([("a.py", b"hello\n" * 1000)])
    params = zstandard.ZstdCompressionParameters(window_log=31, compression_level=3)
    stream = zstandard.ZstdCompressor(compression_params=params).compressobj()  # no content size: the window counts
    blob = stream.compress(tar + b"\0" * 1024) + stream.flush()
    rows = [["a.py", "file", 0o644, 6000, ""]] if index else None
    bundle = raw_bundle(root, tar, index=rows)
    (bundle / "source" / "app.tar.zst").write_bytes(blob)
    repin(bundle, "source/app.tar.zst")
    return bundle


@pytest.mark.skipif(shutil.which("zstd") is None, reason="needs the zstd command")
@pytest.mark.parametrize("index", [True, False], ids=["member index", "no index"])
def test_the_zstd_commands_own_refusal_is_reported(tmp_path, capsys, monkeypatch, index):
    monkeypatch.setattr(zstdio, "_module", lambda: None)  # as on a Python without zstandard: `zstd -dc`
    assert zstdio.backend() == "cli"
    bundle = _wide_window_bundle(tmp_path / "bundle", index=index)
    code = main(["restore", str(bundle), "-q"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 6, err
    assert len(err) == 2 and err[0].startswith(
        "error: source/app.tar.zst: cannot be read although its digest matches bundle.json (zstd -d failed (exit 1): "
    ), err
    assert "Window size larger than maximum" in err[0] and err[0].endswith(")"), err
    assert err[1] == "hint: the publisher packed a broken archive; ask for a re-pack"
    assert not (bundle / "source" / "app").exists()


# -- L8: index and archive names that differ only by Unicode normalisation -----------------------------------------


def test_names_differing_only_by_normalisation_are_told_apart(tmp_path, capsys):
    nfc, nfd = "caf\u00e9.py", "cafe\u0301.py"  # the index lists NFC; the archive, made on macOS, holds NFD
    bundle = raw_bundle(tmp_path / "bundle", _pax_tar([(nfd, b"x\n")]), index=[[nfc, "file", 0o644, 2, ""]])
    code = main(["restore", str(bundle), "-q"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 6, err
    assert err[0] == (
        f"error: source/app.tar.zst: member {nfd!r} is not what its member index lists next ({nfc!r}, the same name "
        "in another Unicode normalisation: 'caf\\xe9.py' (NFC) in the index, 'cafe\\u0301.py' (NFD) in the archive): "
        "the index and the archive disagree, or the archive changed since it was validated"
    )
    assert not (bundle / "source" / "app").exists()


# -- L5: layers of different kinds at one target -------------------------------------------------------------------


@pytest.mark.parametrize("kinds", [("runtime", "source"), ("source", "runtime")], ids=["runtime first", "source first"])
@pytest.mark.parametrize("command", ["restore", "verify"])
def test_layers_of_two_kinds_at_one_target_are_refused(tmp_path, capsys, kinds, command):
    bundle = forge_bundle(
        tmp_path / "bundle",
        [
            ("a1.tar.zst", "t", kinds[0], [member("one.txt", data=b"1\n")]),
            ("a2.tar.zst", "t", kinds[1], [member("two.txt", data=b"2\n")]),
        ],
    )
    code = main([command, str(bundle), "-q"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 4, err
    assert err == [
        f"error: layers[1] (a2.tar.zst, a {kinds[1]} layer) and layers[0] (a1.tar.zst, a {kinds[0]} layer) share the "
        "target 't': the layers of one target are all of one kind",
        "hint: the manifest is damaged or hostile; do not use this bundle; ask its publisher to re-pack it",
    ]
    assert not (bundle / "t").exists()


# -- review64 R M1: a layer target deeper than the swap's old fd cache; an OSError in the swap names its full path ---


@pytest.mark.parametrize("depth", [63, 70])
def test_a_layer_target_many_folders_deep_is_restored_and_updated(tmp_path, capsys, depth):
    target = "/".join(["d"] * (depth - 1) + ["t"])
    bundle = forge_bundle(tmp_path / "bundle", [("t.tar.zst", target, "runtime", [member("x.txt", data=b"v1\n")])])
    for damage in (False, True):  # a first restore, then an update that swaps the old tree out to the trash
        if damage:
            (bundle / target / "x.txt").write_bytes(b"damaged\n")
        capsys.readouterr()
        code = main(["restore", str(bundle)])
        err = capsys.readouterr().err.strip()
        assert code == 0 and err.endswith(f"1 files verified; extracted {target}"), err[-300:]
        assert (bundle / target / "x.txt").read_bytes() == b"v1\n"
    assert sorted(os.listdir(bundle / ".portable")) == ["lock", "receipt.json"]


@pytest.mark.parametrize("again", [False, True], ids=["first restore", "update"])
def test_a_rename_failing_in_the_swap_names_the_full_path(tmp_path, capsys, monkeypatch, again):
    from reproduction.release import swap as swap_mod

    bundle = forge_bundle(
        tmp_path / "bundle", [("layers/a.tar.zst", "runtime/a", "runtime", [member("x.txt", data=b"bundle file\n")])]
    )
    if again:
        assert main(["restore", str(bundle), "-q"]) == 0
        (bundle / "runtime" / "a" / "x.txt").write_text("damaged\n")
    real = os.rename

    def rename(src, dst, **kwargs):  # the swap's renames (in folder fds) are refused
        if kwargs.get("dst_dir_fd") is not None:
            raise OSError(errno.EACCES, os.strerror(errno.EACCES), src, None, dst)
        return real(src, dst, **kwargs)

    monkeypatch.setattr(swap_mod, "exchange", lambda *a: False)  # the two-rename path
    monkeypatch.setattr(os, "rename", rename)
    capsys.readouterr()
    code = main(["restore", str(bundle), "-q"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 8, err
    where = bundle / ".portable" / "trash" / "0" if again else bundle / "runtime" / "a"
    assert err[0] == f"error: cannot write the restored bundle at {bundle}: permission denied ({where})", err
    monkeypatch.undo()
    if again:  # the previous state is kept
        assert (bundle / "runtime" / "a" / "x.txt").read_bytes() == b"damaged\n"
    else:
        assert not (bundle / "runtime" / "a").exists()


# -- review64 R L1: a folder above a target that its user may write and search but not read (0300) ------------------


@pytest.mark.parametrize("folder", ["runtime", ""], ids=["the target's parent", "the bundle folder"])
def test_a_target_under_a_folder_without_read_permission_is_swapped(nobody, folder):
    cli, work = nobody
    bundle = _modes_bundle(work, 0o755)
    _give_to_nobody(work)
    code, err = _restore_as(cli, bundle)
    assert code == 0 and err.endswith("files verified; extracted runtime/rt, source/app\n"), err
    (bundle / "runtime" / "rt" / "d" / "x.txt").write_bytes(b"damaged\n")
    os.chmod(bundle / folder, 0o300)  # its owner, nobody, may write and search it, not list it
    try:
        code, err = _restore_as(cli, bundle)
    finally:
        os.chmod(bundle / folder, 0o755)
    assert code == 0 and err.endswith("files verified; extracted runtime/rt; unchanged source/app\n"), err
    assert (bundle / "runtime" / "rt" / "d" / "x.txt").read_bytes() == b"x\n"


# -- review64 R L2: the staging copy of a member is longer than its path at a short target -------------------------


def _sized_bundle(tmp_path: Path, length: int, *, target: str = "t", kind: str = "runtime") -> tuple[Path, str]:
    """A one-layer bundle (with a member index) whose member DEEP/<f...> lies at an absolute path of exactly `length`
    bytes at `target`; (bundle, the member's name)."""
    pad = length - len(f"{tmp_path}/x/b/{target}/{DEEP}/") - 100 + 1
    assert pad > 0, "pytest's tmp_path is too long for this test"
    bundle = tmp_path / ("p" * pad) / "b"
    name = f"{DEEP}/" + "f" * (length - len(f"{bundle}/{target}/{DEEP}/"))
    assert len(f"{bundle}/{target}/{name}".encode()) == length
    parts = DEEP.split("/")
    tar = _pax_tar([*(("/".join(parts[: i + 1]), None) for i in range(len(parts))), ("top.py", b"top\n")])
    tar += _pax_tar([(name, b"v1\n")])
    index = [[m.name, m.kind, m.mode, m.size, m.linkname] for m in iter_members(StreamSource(io.BytesIO(tar)))]
    raw_bundle(bundle, tar, index=index, target=target)
    data = json.loads((bundle / "bundle.json").read_text())
    data["layers"][0]["kind"] = kind
    (bundle / "bundle.json").write_text(json.dumps(data, indent=1))
    return bundle, name


def test_a_member_that_fits_its_target_and_its_staging_copy_is_kept_by_restore_deep(tmp_path, capsys):
    bundle, _ = _sized_bundle(tmp_path, PATH_MAX - len(".portable/staging/0") + len("t"))  # staged: 4095 bytes
    assert main(["restore", str(bundle), "-q"]) == 0, capsys.readouterr().err
    (bundle / "t" / "mine.txt").write_text("a file of the user's\n")
    for _ in range(2):  # `--deep` compared the staged tree by path: ENAMETOOLONG, so every `--deep` re-extracted
        capsys.readouterr()
        assert main(["restore", "--deep", str(bundle)]) == 0
        assert capsys.readouterr().err.strip().endswith("2 files verified; unchanged t")
    assert (bundle / "t" / "mine.txt").read_text() == "a file of the user's\n"


@pytest.mark.parametrize("length", [PATH_MAX - len(".portable/staging/0") + len("t") + 1, PATH_MAX])
def test_a_member_whose_staging_copy_passes_path_max_is_refused(tmp_path, capsys, length):
    bundle, name = _sized_bundle(tmp_path, length)
    code = main(["restore", str(bundle), "-q"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 9, err
    size = length + len(".portable/staging/0") - len("t")
    assert err[0] == (
        f"error: t.tar.zst: member '{name[:60]}...{name[-50:]}' would lie at a path of {size} bytes in "
        f"{bundle}/.portable/staging while restore extracts it ({length} bytes in {bundle}/t), longer than the 4095 "
        "bytes a path may have; nothing was changed"
    )
    need = size - PATH_MAX
    assert err[1] == (
        f"hint: move the bundle to a folder whose path is at least {need} {'byte' if need == 1 else 'bytes'} shorter "
        f"(it is {len(str(bundle))} bytes now), then run `portable restore` there"
    )
    assert not (bundle / "t").exists()


def test_a_member_too_long_for_a_bundle_in_any_folder_says_so(tmp_path, capsys):
    # `t/<name>` is 4090 bytes: within the 4095 a bundle-relative path may have, but `/.portable/staging/0/<name>`
    # passes 4095 bytes below any bundle folder, so moving the bundle cannot help
    name = "/".join(["c" * 250] * 16) + "/" + "f" * (4090 - 2 - 16 * 251)
    tar = _pax_tar([(name, b"x\n")])
    index = [[m.name, m.kind, m.mode, m.size, m.linkname] for m in iter_members(StreamSource(io.BytesIO(tar)))]
    bundle = raw_bundle(tmp_path / "bundle", tar, index=index, target="t")
    code = main(["restore", str(bundle), "-q"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 9, err
    inside = len(f"/.portable/staging/0/{name}")
    assert err[0].startswith("error: t.tar.zst: member ") and "while restore extracts it" in err[0], err
    assert err[1] == (
        f"hint: its path inside the bundle alone is {inside - 1} bytes, too long for a bundle in any folder: do not "
        "use this bundle; ask its publisher to re-pack it with shorter names"
    )


# -- review64 R L3: the receipt's files bounded as what they are, a damaged entry as a damaged receipt ---------------


def test_a_recorded_file_the_new_version_drops_is_named_as_the_earlier_restores(tmp_path, capsys):
    first, name = _sized_bundle(tmp_path / "one", PATH_MAX - 10, target="source/app", kind="source")
    assert main(["restore", str(first), "-q"]) == 0, capsys.readouterr().err
    moved = tmp_path / ("q" * 20) / first.relative_to(tmp_path)  # 21 bytes deeper
    moved.parent.mkdir(parents=True)
    os.rename(first, moved)
    for rel in ("bundle.json", "source/app.tar.zst", "source/app.members.json"):
        (moved / rel).unlink()
    tar = _pax_tar([("top.py", b"v2\n")])  # version 2: without the long member
    raw_bundle(
        moved,
        tar,
        index=[[m.name, m.kind, m.mode, m.size, m.linkname] for m in iter_members(StreamSource(io.BytesIO(tar)))],
    )
    capsys.readouterr()
    code = main(["restore", str(moved), "-q"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 9, err
    assert err[0] == (
        f"error: {moved}/source/app: the file '{name[:60]}...{name[-50:]}', which an earlier restore wrote there, now "
        f"lies at a path of {PATH_MAX + 11} bytes, longer than the 4095 bytes a path may have; nothing was changed"
    )
    assert err[1] == (
        f"hint: move the bundle to a folder whose path is at least 11 bytes shorter (it is {len(str(moved))} bytes "
        "now), then run `portable restore` there"
    )


@pytest.mark.parametrize(
    "entry", ["/".join(["z" * 200] * 21), "/".join(["z" * 200] * 20) + "/" + "z" * 65], ids=["4220 bytes", "4085 bytes"]
)
def test_a_receipt_entry_no_bundle_folder_could_hold_counts_as_changed(tmp_path, capsys, entry):
    bundle = _modes_bundle(tmp_path, 0o755)
    assert main(["restore", str(bundle), "-q"]) == 0, capsys.readouterr().err
    receipt = bundle / ".portable" / "receipt.json"
    data = json.loads(receipt.read_text())
    [rt] = [r for r in data["layers"].values() if r["target"] == "runtime/rt"]
    rt["files"][entry] = [1, 1]  # damaged (or edited by hand): restore never writes it
    receipt.write_text(json.dumps(data))
    for want in ("extracted runtime/rt; unchanged source/app", "unchanged runtime/rt, source/app"):
        capsys.readouterr()  # as any damaged entry: the target is extracted again, and recorded anew
        code = main(["restore", str(bundle)])
        err = capsys.readouterr().err.strip()
        assert code == 0 and err.endswith(f"files verified; {want}"), err[-300:]


# -- review64 R L4: the README names both refusals -----------------------------------------------------------------


def test_the_readme_names_the_path_length_and_mixed_kind_refusals():
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    rows = {line.split("`")[1].split()[1]: line for line in text.splitlines() if line.startswith("| `portable ")}
    assert "would pass the 4095 bytes a path may have" in rows["restore"] and "exit 9" in rows["restore"]
    assert "layers of two kinds at one target are refused, exit 4" in rows["restore"]
    assert "layers of two kinds (runtime and source) at one target is refused, exit 4" in rows["verify"]
    assert "| 9 | relocation impossible (`restore`: " in text and "would pass 4095 bytes)" in text
