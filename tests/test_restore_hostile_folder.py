"""Regression tests for the audit of restore/verify against hostile bundle FOLDERS (stop 44).

The bundle's bytes are fine here; what is hostile is what else the folder holds: a state folder or
its entries as symlinks, a shipped receipt, layer targets that are links or the user's own folders.
Each test names the audit finding (F1...) it pins and failed before its fix.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
from bundlekit import QUIET, REPO, forge_bundle, member, repin, run_cli, small_bundle, tree_snapshot

from reproduction.errors import InvalidInputError, UnsafeArchiveError
from reproduction.release.restore import restore_bundle
from reproduction.release.verify import verify_bundle


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return small_bundle(tmp_path_factory.mktemp("hostile"))


@pytest.fixture
def bundle(packed, tmp_path):
    out = tmp_path / "case" / "bundle"
    shutil.copytree(packed, out, symlinks=True)
    return out


@pytest.fixture
def outside(tmp_path):
    out = tmp_path / "outside"
    for rel in ("staging/precious.txt", "trash/also.txt", "reloc/keep.txt", "file.cfg"):
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text("mine\n")
    return out


def _one_error(done, code: int, needle: str) -> None:
    lines = done.stderr.splitlines()
    assert done.returncode == code, done.stderr
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("hint: "), done.stderr
    assert needle in lines[0], done.stderr


# -- F1: the state folder as a symlink ------------------------------------------------------------


def test_a_symlinked_state_folder_is_refused_and_nothing_outside_changes(bundle, outside):
    os.symlink(outside, bundle / ".portable")
    before = tree_snapshot(outside)
    done = run_cli("restore", bundle)
    _one_error(done, 6, f"{bundle}/.portable is a symlink")
    assert tree_snapshot(outside) == before
    verify = run_cli("verify", bundle)
    assert verify.returncode == 12 and "extra    .portable" in verify.stderr


def test_a_state_folder_that_is_a_file_is_refused(bundle):
    (bundle / ".portable").write_text("x")
    _one_error(run_cli("restore", bundle), 6, ".portable is not a folder")


# -- F2 / F16: entries of a real state folder that are symlinks or files ---------------------------


@pytest.mark.parametrize("noop", [False, True])
def test_a_symlinked_lock_file_is_never_truncated(bundle, outside, noop):
    if noop:  # the receipt-only fast path opens the lock too
        restore_bundle(bundle, ui=QUIET)
        (bundle / ".portable" / "lock").unlink()
    else:
        (bundle / ".portable").mkdir()
    os.symlink(outside / "file.cfg", bundle / ".portable" / "lock")
    _one_error(run_cli("restore", bundle), 6, "the lock file")
    assert (outside / "file.cfg").read_text() == "mine\n"


@pytest.mark.parametrize("name", ["staging", "trash", "reloc"])
def test_symlinked_state_entries_are_removed_not_followed(bundle, outside, name):
    restore_bundle(bundle, ui=QUIET)
    (bundle / "runtime" / "rt" / "share" / "data.txt").write_text("damaged")  # forces a re-extraction (a swap)
    os.symlink(outside / name, bundle / ".portable" / name)
    before = tree_snapshot(outside)
    report = restore_bundle(bundle, ui=QUIET)
    assert report.extracted == ["runtime/rt"]
    assert tree_snapshot(outside) == before
    assert sorted(os.listdir(bundle / ".portable")) == ["lock", "receipt.json"]


@pytest.mark.parametrize("name", ["staging", "trash"])
def test_state_entries_left_as_plain_files_do_not_block_restore(bundle, name):
    restore_bundle(bundle, ui=QUIET)
    (bundle / "runtime" / "rt" / "share" / "data.txt").write_text("damaged")
    (bundle / ".portable" / name).write_text("x")
    done = run_cli("restore", bundle)
    assert done.returncode == 0, done.stderr
    assert "extracted runtime/rt" in done.stderr
    assert sorted(os.listdir(bundle / ".portable")) == ["lock", "receipt.json"]


# -- F3: a layer target that is a symlink, vouched for by a shipped receipt -------------------------


def _ship_receipt(bundle, layers: dict) -> None:
    (bundle / ".portable").mkdir(exist_ok=True)
    (bundle / ".portable" / "receipt.json").write_text(
        json.dumps(
            {
                "format": "recap-portable-receipt",
                "format_version": "1.0",
                "bundle_path": "/old",
                "manifest_sha256": "",
                "plain": {},
                "fetch": {},
                "layers": layers,
            }
        )
    )


def test_a_symlinked_target_is_refused_before_relocating_through_it(bundle, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "profile.sh").write_text("export PATH=/old/source/project/bin:$PATH\n")
    data = json.loads((bundle / "bundle.json").read_text())
    src = next(x for x in data["layers"] if x["target"] == "source/project")
    src["build_prefix"], src["prefix_files"] = "/old/source/project", [{"path": "profile.sh", "mode": "text"}]
    (bundle / "bundle.json").write_text(json.dumps(data, indent=1))
    sha = next(f["sha256"] for f in data["files"] if f["path"] == src["archive"])
    rec = {"sha256": sha, "target": "source/project", "prefix": "/old/source/project"}
    _ship_receipt(bundle, {src["archive"]: {**rec, "files": {"profile.sh": [0, 0]}, "links": {}, "digests": {}}})
    shutil.rmtree(bundle / "source" / "project", ignore_errors=True)
    os.symlink(home, bundle / "source" / "project")
    done = run_cli("restore", bundle)
    _one_error(done, 6, "layer target source/project is a symlink")
    assert (home / "profile.sh").read_text() == "export PATH=/old/source/project/bin:$PATH\n"
    assert [p.kind + " " + p.path for p in verify_bundle(bundle).problems] == ["extra source/project"]


def test_a_target_under_a_symlinked_folder_is_refused(bundle, tmp_path):
    (tmp_path / "elsewhere").mkdir()
    shutil.move(bundle / "runtime", tmp_path / "elsewhere" / "runtime")
    os.symlink(tmp_path / "elsewhere" / "runtime", bundle / "runtime")
    with pytest.raises(UnsafeArchiveError, match="lies under the symlink runtime"):
        restore_bundle(bundle, ui=QUIET)
    assert not (tmp_path / "elsewhere" / "runtime" / "rt").exists()


# -- F10: a read-only folder inside a layer's old tree ---------------------------------------------

_REMOVE = (
    "import sys; from pathlib import Path; from reproduction.fsio import remove_tree; remove_tree(Path(sys.argv[1]))"
)


def test_remove_tree_removes_read_only_folders_and_never_follows_links(tmp_path):
    import subprocess
    import tempfile
    from pathlib import Path

    if os.geteuid() == 0:  # pytest's tmp_path is root's private folder: nobody could not reach it
        tmp_path = Path(tempfile.mkdtemp(prefix="portable-f10-", dir="/tmp"))
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "x").write_text("mine")
    root = tmp_path / "trash"
    (root / "ro" / "deeper").mkdir(parents=True)
    (root / "ro" / "file").write_text("x")
    (root / "ro" / "deeper" / "f").write_text("y")
    os.symlink(keep, root / "ro" / "link")
    os.chmod(root / "ro" / "deeper", 0o555)
    os.chmod(root / "ro", 0o555)
    for mode in (0o400, 0o600, 0o000):  # listable but not searchable (audit49 review F3), and neither
        folder = root / f"m{mode:o}"
        (folder / "sub").mkdir(parents=True)
        (folder / "sub" / "f").write_text("z")
        os.chmod(folder, mode)
    cmd = [os.sys.executable, "-c", _REMOVE, str(root)]
    if os.geteuid() == 0:  # root ignores folder permissions: run as nobody, who owns the tree
        if not shutil.which("setpriv"):
            pytest.skip("needs setpriv to drop root")
        for dirpath, dirs, names in os.walk(tmp_path):
            for name in [dirpath, *(os.path.join(dirpath, n) for n in dirs + names)]:
                os.lchown(name, 65534, 65534)
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert done.returncode == 0, done.stderr
        assert not os.path.lexists(root)
        assert (keep / "x").read_text() == "mine"
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chmod", "-R", "u+rwx", str(tmp_path)], check=False)
            shutil.rmtree(tmp_path)


def test_remove_tree_unlinks_a_symlink_itself(tmp_path):
    from reproduction.fsio import remove_tree

    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "f").write_text("mine")
    os.symlink(tmp_path / "dir", tmp_path / "link")
    remove_tree(tmp_path / "link")
    assert not os.path.lexists(tmp_path / "link") and (tmp_path / "dir" / "f").read_text() == "mine"


# -- F3b / F5: a receipt vouches only for what its layers' indexes list, at their targets ----------


def test_a_shipped_receipt_with_empty_lists_does_not_vouch_for_a_hand_made_tree(bundle):
    data = json.loads((bundle / "bundle.json").read_text())
    sha = {f["path"]: f["sha256"] for f in data["files"]}
    recs = {
        x["archive"]: {"sha256": sha[x["archive"]], "target": x["target"], "prefix": str(bundle / x["target"])}
        for x in data["layers"]
    }
    _ship_receipt(bundle, {a: {**r, "files": {}, "links": {}, "digests": {}} for a, r in recs.items()})
    rt = bundle / "runtime" / "rt"
    (rt / "bin").mkdir(parents=True)
    os.symlink("/etc/shadow", rt / "bin" / "tool")  # member paths of the layer, made by hand
    os.symlink("../../../../../..", rt / "bin" / "tool-link")
    # not vouched, so compared with the layer's tree: a folder of one's own, refused naming them (audit62 L3)
    with pytest.raises(InvalidInputError, match=r"runtime/rt: .* 2 file\(s\) .* \(bin/tool, bin/tool-link\)"):
        restore_bundle(bundle, ui=QUIET)
    assert os.readlink(rt / "bin" / "tool") == "/etc/shadow"  # nothing changed, nothing followed
    shutil.rmtree(rt)  # the way out the hint gives
    report = restore_bundle(bundle, ui=QUIET)
    assert report.extracted == ["source/project", "runtime/rt"] and report.unchanged == []
    assert (rt / "bin" / "tool").read_bytes() == b"#!/bin/sh\necho tool\n"
    assert os.readlink(rt / "bin" / "tool-link") == "tool"


def test_a_setuid_file_in_a_restored_tree_counts_as_changed(bundle):
    restore_bundle(bundle, ui=QUIET)
    tool = bundle / "runtime" / "rt" / "bin" / "tool"
    st = os.stat(tool)
    os.chmod(tool, 0o4755)
    os.utime(tool, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert restore_bundle(bundle, ui=QUIET).extracted == ["runtime/rt"]
    assert os.stat(tool).st_mode & 0o7777 == 0o755


def test_a_layer_moved_to_another_existing_folder_is_extracted_there(bundle):
    restore_bundle(bundle, ui=QUIET)
    (bundle / "other").mkdir()
    data = json.loads((bundle / "bundle.json").read_text())
    data["layers"][0]["target"] = "other"  # the same archive (same sha256), now at another folder
    (bundle / "bundle.json").write_text(json.dumps(data, indent=1))
    shutil.rmtree(bundle / "source" / "project")
    report = restore_bundle(bundle, ui=QUIET)
    assert report.extracted == ["other"] and report.unchanged == ["runtime/rt"]
    assert (bundle / "other" / "README.md").read_bytes() == b"# the project\n"


def test_the_fast_no_change_path_also_refuses_a_receipt_that_lists_nothing(bundle):
    restore_bundle(bundle, ui=QUIET)
    path = bundle / ".portable" / "receipt.json"
    data = json.loads(path.read_text())
    for rec in data["layers"].values():  # bundle_path and manifest digest right: only the lists are forged
        rec["files"], rec["links"] = {}, {}
    path.write_text(json.dumps(data))
    done = run_cli("restore", bundle)
    assert done.returncode == 0, done.stderr
    assert "extracted source/project, runtime/rt" in done.stderr


def test_a_kept_layer_is_validated_like_an_extracted_one(bundle):
    restore_bundle(bundle, ui=QUIET)
    index = bundle / "runtime" / "rt.members.json"
    rows = json.loads(index.read_text())
    rows["members"].append(["bin/evil", "symlink", 0o777, 0, "/etc/shadow"])
    index.write_text(json.dumps(rows))
    repin(bundle, "runtime/rt.members.json")
    path = bundle / ".portable" / "receipt.json"
    data = json.loads(path.read_text())
    data["layers"]["runtime/rt.tar.zst"]["links"]["bin/evil"] = "/etc/shadow"
    path.write_text(json.dumps(data))
    os.symlink("/etc/shadow", bundle / "runtime" / "rt" / "bin" / "evil")
    with pytest.raises(UnsafeArchiveError, match="symlink to the absolute path '/etc/shadow'"):
        restore_bundle(bundle, ui=QUIET)


# -- F4 / F9: a layer target over files restore did not write -------------------------------------


def _retarget(bundle, **targets) -> None:
    data = json.loads((bundle / "bundle.json").read_text())
    for layer in data["layers"]:
        layer["target"] = targets.get(layer["kind"], layer["target"])
    (bundle / "bundle.json").write_text(json.dumps(data, indent=1))


def test_runs_is_reserved_as_a_layer_target(bundle):
    (bundle / "runs" / "exp1").mkdir(parents=True)
    (bundle / "runs" / "exp1" / "results.json").write_text("{}")
    _retarget(bundle, source="runs")
    _one_error(run_cli("restore", bundle), 4, "layers[0].target 'runs' would overwrite runs")
    assert (bundle / "runs" / "exp1" / "results.json").read_text() == "{}"


def test_a_layer_target_over_a_users_folder_is_refused_naming_the_files(bundle):
    (bundle / "notes").mkdir()
    (bundle / "notes" / "todo.txt").write_text("my notes\n")
    _retarget(bundle, runtime="notes")
    done = run_cli("restore", bundle)
    _one_error(done, 4, "notes: restore would replace this layer target, and 1 file(s) in it are not ones restore")
    assert "(todo.txt)" in done.stderr and "move your files out of" in done.stderr
    assert (bundle / "notes" / "todo.txt").read_text() == "my notes\n"
    assert not (bundle / "source" / "project").exists()  # nothing was swapped in


def test_a_lost_receipt_never_discards_source_edits_silently(bundle):
    restore_bundle(bundle, ui=QUIET)
    (bundle / "source" / "project" / "README.md").write_text("# my edits\n")
    (bundle / "source" / "project" / "recap" / "mine.py").write_text("def mine(): ...\n")
    (bundle / ".portable" / "receipt.json").write_text("{ damaged")
    done = run_cli("restore", bundle)
    _one_error(done, 4, "source/project: restore would replace this layer target, and 2 file(s)")
    assert "(README.md, recap/mine.py)" in done.stderr and "--refresh-source" in done.stderr
    assert (bundle / "source" / "project" / "README.md").read_text() == "# my edits\n"
    done = run_cli("restore", "--refresh-source", bundle)
    assert done.returncode == 0, done.stderr
    assert "--refresh-source overwrote 2 locally edited file(s) in source/project: README.md, recap/mine.py" in (
        done.stderr
    )
    assert (bundle / "source" / "project" / "README.md").read_bytes() == b"# the project\n"


def test_a_lost_receipt_over_an_intact_tree_just_restores_it(bundle):
    restore_bundle(bundle, ui=QUIET)
    (bundle / ".portable" / "receipt.json").unlink()
    report = restore_bundle(bundle, ui=QUIET)
    assert report.extracted == ["source/project", "runtime/rt"] and report.overwritten == {}


# -- F6: the declared unpacked size bounds what is written -----------------------------------------


def test_an_archive_larger_than_its_declared_unpacked_size_is_refused_before_writing(tmp_path):
    bundle = forge_bundle(
        tmp_path / "bomb", [("runtime/r.tar.zst", "runtime/r", "runtime", [member("bomb.bin", data=bytes(4 << 20))])]
    )
    assert (bundle / "runtime" / "r.tar.zst").stat().st_size < 64 << 10
    data = json.loads((bundle / "bundle.json").read_text())
    data["layers"][0]["unpacked_size"] = 10
    (bundle / "bundle.json").write_text(json.dumps(data))
    done = run_cli("restore", bundle)
    _one_error(done, 6, "more than the 10 bytes bundle.json declares as its unpacked_size")
    assert not (bundle / "runtime" / "r").exists()
    assert sorted(os.listdir(bundle / ".portable")) == ["lock"]


# -- F7: bundle files that are symlinks out of the bundle ------------------------------------------


@pytest.mark.parametrize("linked", ["both", "folder"])
@pytest.mark.parametrize("restored_first", [False, True])
def test_bundle_files_linked_out_of_the_bundle_fail_verify_and_restore(bundle, tmp_path, restored_first, linked):
    """`folder` alone: lstat of config/run.json follows the linked folder and finds the file unchanged, so the
    no-change fast path must check the folders above the files too."""
    if restored_first:  # the no-change fast path must not vouch for them either
        restore_bundle(bundle, ui=QUIET)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if linked == "both":
        shutil.move(bundle / "weights" / "model.safetensors", elsewhere / "model.safetensors")
        os.symlink(elsewhere / "model.safetensors", bundle / "weights" / "model.safetensors")
    shutil.move(bundle / "config", elsewhere / "config")
    os.symlink(elsewhere / "config", bundle / "config")
    verify = run_cli("verify", bundle)
    assert verify.returncode == 11, verify.stderr
    assert "missing  config/run.json (under a symlink)" in verify.stderr
    done = run_cli("restore", bundle)
    assert done.returncode == 5, done.stderr
    if linked == "both":
        assert "missing  weights/model.safetensors (a symlink)" in verify.stderr
        assert "missing  weights/model.safetensors (a symlink)" in done.stderr
    else:
        assert "missing  config/run.json (under a symlink)" in done.stderr


# -- F14: bundle.json's free-form metadata.weights and the files it names ---------------------------


def _set_weights(bundle, value) -> None:
    data = json.loads((bundle / "bundle.json").read_text())
    data["metadata"]["weights"] = value
    (bundle / "bundle.json").write_text(json.dumps(data, indent=1))


def _pin_new(bundle, rel: str, blob: bytes) -> None:
    import hashlib

    (bundle / rel).write_bytes(blob)
    data = json.loads((bundle / "bundle.json").read_text())
    data["files"].append({"path": rel, "size": len(blob), "sha256": hashlib.sha256(blob).hexdigest()})
    (bundle / "bundle.json").write_text(json.dumps(data, indent=1))


@pytest.mark.parametrize("value", ["abc", [1], {"a": 1}, [{"manifest": 5}], [{"manifest": "../x"}]])
def test_malformed_metadata_weights_is_invalid_input(bundle, value):
    _set_weights(bundle, value)
    _one_error(run_cli("restore", bundle), 4, "metadata.weights")


def test_a_deeply_nested_weights_manifest_is_invalid_input(bundle):
    _pin_new(bundle, "config/wm.json", b"[" * 100000 + b"]" * 100000)
    _set_weights(bundle, [{"manifest": "config/wm.json", "dest": "weights"}])
    _one_error(run_cli("restore", bundle), 4, "config/wm.json: not valid JSON")


def test_a_license_index_that_is_not_an_object_is_invalid_input(bundle):
    (bundle / "LICENSES" / "index.json").write_bytes(b"[1]")
    repin(bundle, "LICENSES/index.json")
    _pin_new(bundle, "config/wm.json", b'{"format": "recap-portable-weights", "format_version": 2, "components": []}')
    _set_weights(bundle, [{"manifest": "config/wm.json", "dest": "weights"}])
    _one_error(run_cli("restore", bundle), 4, "LICENSES/index.json: should be an object")


# -- F19: bytecode under reproduction/**/__pycache__/ (ignored by verify) never runs -----------------


def test_the_bundles_runner_never_runs_a_planted_pyc(bundle, tmp_path):
    import importlib.util
    import marshal
    import struct
    import sys

    marker = tmp_path / "PLANTED_CODE_RAN"
    src = bundle / "reproduction" / "release" / "verify.py"
    code = compile(src.read_text() + f"\nopen({str(marker)!r}, 'w').write('ran')\n", str(src), "exec")
    st = src.stat()
    pyc = src.parent / "__pycache__" / f"verify.{sys.implementation.cache_tag}.pyc"
    pyc.parent.mkdir(exist_ok=True)
    header = struct.pack("<III", 0, int(st.st_mtime) & 0xFFFFFFFF, st.st_size & 0xFFFFFFFF)
    pyc.write_bytes(importlib.util.MAGIC_NUMBER + header + marshal.dumps(code))
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "PYTHONPYCACHEPREFIX": ""}
    done = run_cli("verify", bundle, script=bundle / "reproduction" / "portable.py", env=env)
    assert done.returncode == 0, done.stderr  # __pycache__ stays ignored: a used bundle verifies clean
    assert not marker.exists()


# -- F8a: a manifest listing both `x` and `x/y` ---------------------------------------------------


def test_a_manifest_listing_a_file_and_a_file_below_it_is_invalid_input(bundle):
    from reproduction.errors import InvalidInputError
    from reproduction.release.manifest import Manifest

    data = json.loads((bundle / "bundle.json").read_text())
    pin = {"size": 1, "sha256": "0" * 64}
    data["files"] += [{"path": "x", **pin}, {"path": "x/y/z", **pin}]
    with pytest.raises(InvalidInputError, match="'x' is listed as a file and as the folder of 'x/y/z'"):
        Manifest.from_dict(data)
    (bundle / "bundle.json").write_text(json.dumps(data))
    _one_error(run_cli("verify", bundle), 4, "is listed as a file and as the folder of")


# -- F11 and control characters: manifest paths no filesystem (or listing) takes --------------------


@pytest.mark.parametrize(
    ("rel", "needle"),
    [
        ("a" * 300, "longer than filesystems allow"),
        ("/".join(["d" * 200] * 21), "longer than filesystems allow"),
        ("weights/x\nerror: forged line", "holds a control character"),
        ("weights/\x1b[31mred", "holds a control character"),
        ("weights/x\x85error: forged line", "holds a control character"),  # C1 NEL
        ("weights/\x9b31mred", "holds a control character"),  # C1 CSI
    ],
)
def test_manifest_paths_no_filesystem_takes_are_invalid_input(bundle, rel, needle):
    data = json.loads((bundle / "bundle.json").read_text())
    data["files"][0]["path"] = rel
    (bundle / "bundle.json").write_text(json.dumps(data))
    for command in ("verify", "restore"):
        _one_error(run_cli(command, bundle), 4, needle)


def test_an_unreadable_bundle_file_is_a_read_error_not_a_write_error(bundle, monkeypatch):
    from reproduction.errors import ReadFailedError
    from reproduction.release import verify as verify_mod

    real = os.lstat

    def lstat(path, *args, **kwargs):
        if str(path).endswith("data/episodes.parquet"):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(verify_mod.os, "lstat", lstat)
    with pytest.raises(ReadFailedError, match="cannot read the bundle file data/episodes.parquet") as info:
        verify_bundle(bundle)
    assert info.value.exit_code == 3


# -- F18: SIGTERM during restore is an interrupt --------------------------------------------------


def test_sigterm_during_restore_is_exit_130_with_the_previous_state_kept(bundle, monkeypatch, capsys):
    import signal

    from reproduction import portable
    from reproduction.release import restore as restore_mod

    restore_bundle(bundle, ui=QUIET)
    before = tree_snapshot(bundle / "runtime" / "rt")
    (bundle / "runtime" / "rt" / "share" / "data.txt").unlink()  # a re-extraction: a swap to undo
    before.pop("share/data.txt")
    real = restore_mod._relocate

    def relocate(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # after the new tree went in: the swap-back must run
        return real(*args, **kwargs)

    def unhandled(signum, frame):  # stands for the default action (which would end pytest too)
        raise RuntimeError("SIGTERM not handled by restore")

    monkeypatch.setattr(restore_mod, "_relocate", relocate)
    previous = signal.signal(signal.SIGTERM, unhandled)
    try:
        assert portable.main(["restore", str(bundle), "-q"]) == 130
        assert signal.getsignal(signal.SIGTERM) is unhandled  # put back afterwards
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert capsys.readouterr().err.splitlines() == [
        "error: interrupted",
        "hint: run `portable restore` again: it finishes the job",
    ]
    assert tree_snapshot(bundle / "runtime" / "rt") == before
    assert sorted(os.listdir(bundle / ".portable")) == ["lock", "receipt.json"]


def test_a_new_source_archive_over_new_local_files_needs_refresh_source(bundle):
    from reproduction.errors import InvalidInputError

    restore_bundle(bundle, ui=QUIET)
    (bundle / "source" / "project" / "recap" / "mine.py").write_text("def mine(): ...\n")
    path = bundle / ".portable" / "receipt.json"
    receipt = json.loads(path.read_text())
    receipt["layers"]["source/project.tar.zst"]["sha256"] = "0" * 64  # as if the bundle had been updated
    path.write_text(json.dumps(receipt))
    with pytest.raises(InvalidInputError, match=r"recap/mine\.py") as info:
        restore_bundle(bundle, ui=QUIET)
    assert info.value.field == "--refresh-source"
    assert (bundle / "source" / "project" / "recap" / "mine.py").exists()
    report = restore_bundle(bundle, refresh_source=True, ui=QUIET)
    assert report.overwritten == {"source/project": ["recap/mine.py"]}


@pytest.mark.parametrize("dirname", ["with\nnewline", "with\ttab", "with\x85nel"], ids=["newline", "tab", "c1-nel"])
def test_a_bundle_path_with_a_control_character_is_refused_before_relocating_naming_the_path(tmp_path, dirname):
    # audit48 F7: the relocator refused it after extracting, as "new prefix ... must be an absolute path other than
    # '/'" with a hint to "pass the folder the tree lives at"; now the reason and the fix (move the bundle), unwritten
    members = [
        member("bin", "dir", mode=0o755),
        member("bin/tool", data=b"#!/build/xx/bin/python3\nprint(1)\n", mode=0o755),
    ]
    bundle = forge_bundle(tmp_path / dirname / "bundle", [("runtime/r.tar.zst", "runtime/r", "runtime", members)])
    data = json.loads((bundle / "bundle.json").read_text())
    data["layers"][0].update(build_prefix="/build/xx", prefix_files=[{"path": "bin/tool", "mode": "text"}])
    (bundle / "bundle.json").write_text(json.dumps(data))
    done = run_cli("restore", bundle)
    assert done.returncode == 9, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0] == (
        f"error: {str(bundle)!r}: the bundle's path holds a control character (a newline, a tab, an escape), which "
        "the restored layers' scripts and shebangs cannot hold"
    )
    assert lines[1].startswith("hint: move (or rename) the bundle to a folder whose path has no control character")
    assert len(lines) == 2 and not (bundle / "runtime" / "r").exists()
