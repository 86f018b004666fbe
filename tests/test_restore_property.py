"""Property test: restore of a mutated real bundle terminates, exits with a documented code, writes
nothing outside the bundle and leaves no receipt-vouched target incomplete.

The attacker controls every byte of the bundle: random byte edits of any file (bundle.json, member
indexes, archives, plain files), edits of the decompressed tar (headers and pax records), hostile
members inserted into a layer, and structural edits of bundle.json; after each edit the attacker
recomputes sizes and digests in bundle.json (and regenerates the member index) so that verification
alone does not stop the case. Each case runs `portable restore` (its `main`, so exit codes are the
CLI's) in a worker process with a time bound; a worker that overruns is killed and the case fails.

`PORTABLE_FUZZ_EXAMPLES` sets the number of cases (CI: the default, a few hundred).
"""

from __future__ import annotations

import hashlib
import io
import json
import multiprocessing
import os
import shutil
import tarfile
from pathlib import Path

import pytest
import zstandard
from bundlekit import raw_member, small_bundle
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reproduction.release.layers import write_index
from reproduction.release.manifest import load_manifest, write_manifest
from reproduction.release.receipt import load_receipt
from reproduction.release.restore import restore_bundle
from reproduction.release.tarscan import StreamSource, iter_members
from reproduction.ui import UiOptions

EXAMPLES = int(os.environ.get("PORTABLE_FUZZ_EXAMPLES", "200"))
TIME_BOUND_S = 30.0
DOCUMENTED = {0, 3, 4, 5, 6, 7, 8, 9, 10}
ARCHIVES = ("source/project.tar.zst", "runtime/rt.tar.zst")
TARGET_DIRS = ("source/project/", "runtime/rt/")
HOSTILE_STRINGS = [
    ".",
    "..",
    "",
    "/etc",
    "../sentinel",
    "../../sentinel/x",
    "source/../../sentinel",
    "runtime/rt",
    "source/project",
    "source/project/recap",
    "a/b/c/d/e",
    ".portable/x",
    ".portable",
    "bundle.json",
    "reproduction",
    "runs",
    "weights",
    "x" * 300,
    "a\0b",
    "~/x",
    "source/project.tar.zst",
    "source/project.members.json",
]
HOSTILE_VALUES = HOSTILE_STRINGS + [None, 0, -1, 2**70, 1.5, True, [], {}, [1], {"a": 1}]
LINKS = ["../../../sentinel", "../../sentinel", "../" * 8 + "tmp", "/tmp", "recap", "..", ".", "../rt", "x/../../.."]


# -- the worker: runs restores, answers (exit code, stderr text) --------------------------------


def _serve(conn) -> None:
    import contextlib
    import traceback

    from reproduction.portable import main

    while True:
        path = conn.recv()
        if path is None:
            return
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                code = main(["restore", path, "-q", "--no-progress"])
        except BaseException:  # a traceback is exit 1: the property fails on it
            code, err = 1, io.StringIO(err.getvalue() + traceback.format_exc())
        conn.send((code, err.getvalue()))


class Worker:
    """One spawned interpreter that restores bundles on request; killed and replaced when it overruns."""

    def __init__(self) -> None:
        self.ctx = multiprocessing.get_context("spawn")
        self._start()

    def _start(self) -> None:
        self.conn, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=_serve, args=(child,), daemon=True)
        self.proc.start()

    def restore(self, bundle: Path) -> tuple[int | None, str]:
        self.conn.send(str(bundle))
        if self.conn.poll(TIME_BOUND_S):
            return self.conn.recv()
        self.proc.kill()
        self.proc.join(10)
        self._start()
        return None, f"restore did not finish within {TIME_BOUND_S:.0f}s"

    def close(self) -> None:
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()


@pytest.fixture(scope="module")
def outcomes():
    """Exit code -> count over the run (printed at the end; `pytest -s` shows it)."""
    counts: dict[int, int] = {}
    yield counts
    print(f"\nrestore property: {sum(counts.values())} cases, exit codes {dict(sorted(counts.items()))}")


@pytest.fixture(scope="module")
def worker():
    w = Worker()
    yield w
    w.close()


# -- base bundles: a real packed one (without the runner copy, to keep cases fast), fresh and restored


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    fresh = small_bundle(root)
    shutil.rmtree(fresh / "reproduction")
    manifest = load_manifest(fresh)
    manifest.files = [e for e in manifest.files if not e.path.startswith("reproduction/")]
    write_manifest(fresh, manifest)
    restored = root / "restored"
    shutil.copytree(fresh, restored, symlinks=True)
    restore_bundle(restored, ui=UiOptions(quiet=True, progress=False))
    return {"fresh": fresh, "restored": restored}


# -- mutations (each recomputes digests as an attacker would) -------------------------------------


def _manifest_json(bundle: Path):
    try:
        return json.loads((bundle / "bundle.json").read_text())
    except (ValueError, RecursionError):
        return None


def _repin(bundle: Path, rel: str) -> None:
    data = _manifest_json(bundle)
    if not isinstance(data, dict) or not isinstance(data.get("files"), list):
        return
    blob = (bundle / rel).read_bytes()
    for entry in data["files"]:
        if isinstance(entry, dict) and entry.get("path") == rel:
            entry["size"], entry["sha256"] = len(blob), hashlib.sha256(blob).hexdigest()
    (bundle / "bundle.json").write_text(json.dumps(data, indent=1))


def _tar(bundle: Path, archive: str) -> bytes:
    """The decompressed tar (b'' when an earlier edit broke the archive: the tar-level edit is then moot)."""
    try:
        return zstandard.ZstdDecompressor().decompressobj().decompress((bundle / archive).read_bytes())
    except (zstandard.ZstdError, OSError):
        return b""


def _put_tar(bundle: Path, archive: str, tar: bytes, *, reindex: bool) -> None:
    (bundle / archive).write_bytes(zstandard.ZstdCompressor(level=1).compress(tar))
    _repin(bundle, archive)
    if reindex:  # keep the member index consistent with the edited tar, where it still parses
        index = archive.replace(".tar.zst", ".members.json")
        try:
            members = list(iter_members(StreamSource(io.BytesIO(tar)), archive=archive))
        except Exception:
            return
        write_index(bundle / index, members)
        _repin(bundle, index)


def byte_edit(data, bundle: Path) -> str:
    files = sorted(  # the bundle's own files, not what a restore made of them (edits there are the user's)
        str(p.relative_to(bundle))
        for p in bundle.rglob("*")
        if p.is_file() and ".portable" not in p.parts and not str(p.relative_to(bundle)).startswith(TARGET_DIRS)
    )
    files.sort(key=lambda r: (r == "bundle.json", not r.endswith((".tar.zst", ".members.json")), r))
    rel = data.draw(st.sampled_from(files))  # hypothesis favours the first: archives and indexes, bundle.json last
    blob = bytearray((bundle / rel).read_bytes())
    how = data.draw(st.sampled_from(["set", "truncate", "insert", "delete"]))
    at = data.draw(st.integers(0, max(0, len(blob) - 1)))
    if how == "set" and blob:
        blob[at] = data.draw(st.integers(0, 255))
    elif how == "truncate":
        del blob[at:]
    elif how == "insert":
        blob[at:at] = data.draw(st.binary(min_size=1, max_size=16))
    else:
        del blob[at : at + data.draw(st.integers(1, 64))]
    (bundle / rel).write_bytes(bytes(blob))
    if rel != "bundle.json" and data.draw(st.booleans()):
        _repin(bundle, rel)
    return f"{how} {rel}@{at}"


def _headers(tar: bytes) -> list[int]:
    return [i for i in range(0, len(tar) - 512, 512) if tar[i + 257 : i + 262] == b"ustar"] or [0]


def tar_edit(data, bundle: Path) -> str:
    archive = data.draw(st.sampled_from(ARCHIVES))
    tar = bytearray(_tar(bundle, archive))
    if len(tar) < 1024:
        return f"tar {archive} (unreadable, skipped)"
    block = data.draw(st.sampled_from(_headers(tar)))
    field = data.draw(
        st.sampled_from([(0, 100), (100, 108), (124, 136), (136, 148), (148, 156), (156, 157), (157, 257), (345, 500)])
    )
    at = block + data.draw(st.integers(field[0], field[1] - 1))
    tar[at] = data.draw(st.sampled_from([0, 0x20, ord("0"), ord("7"), ord("-"), ord("/"), ord("."), 0x80, 0xFF]))
    if data.draw(st.booleans()) and tar[block + 156 : block + 157] == b"x":  # rewrite a pax record
        size = int(bytes(tar[block + 124 : block + 136]).split(b"\0")[0].strip() or b"0", 8)
        body = data.draw(
            st.sampled_from([b"0 path=x\n", b"9 size=-5\n", b"12 mtime=inf\n", b"12 mtime=nan\n", b"1 a\n", b"xx\n"])
        )
        tar[block + 512 : block + 512 + size] = body.ljust(size, b"\0")[:size]
    _put_tar(bundle, archive, bytes(tar), reindex=data.draw(st.sampled_from([True, True, False])))
    return f"tar {archive}@{at}"


def hostile_member(data, bundle: Path) -> str:
    archive = data.draw(st.sampled_from(ARCHIVES))
    tar = _tar(bundle, archive)
    if len(tar) < 1024:
        return f"member {archive} (unreadable, skipped)"
    offsets = _headers(tar)  # header blocks, found by their magic (an earlier edit may have broken the tar)
    name = data.draw(st.sampled_from(["esc", "recap", "recap/esc", "esc/pwned", "bin", "lib/esc/x", "../x", "/tmp/x"]))
    kind = data.draw(st.sampled_from([tarfile.SYMTYPE, tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.LNKTYPE]))
    new = raw_member(name, b"pwned" if kind == tarfile.REGTYPE else b"", kind=kind)
    if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
        info = tarfile.TarInfo(name)
        info.type, info.linkname, info.mode = kind, data.draw(st.sampled_from(LINKS)), 0o777
        new = info.tobuf(tarfile.USTAR_FORMAT)
    at = data.draw(st.sampled_from(offsets + [len(tar) - 1024]))
    _put_tar(bundle, archive, tar[:at] + new + tar[at:], reindex=data.draw(st.sampled_from([True, True, False])))
    return f"member {name} kind {kind!r} into {archive}@{at}"


def json_edit(data, bundle: Path) -> str:
    doc = _manifest_json(bundle)
    if not isinstance(doc, dict):
        return "json (unparsable, skipped)"
    how = data.draw(st.sampled_from(["layer field", "file field", "top field", "duplicate layer", "drop field"]))
    layers = [x for x in doc.get("layers", []) if isinstance(x, dict)] if isinstance(doc.get("layers"), list) else []
    files = [x for x in doc.get("files", []) if isinstance(x, dict)] if isinstance(doc.get("files"), list) else []
    if how == "layer field" and layers:
        layer = data.draw(st.sampled_from(layers))
        key = data.draw(
            st.sampled_from(["target", "archive", "kind", "order", "members_index", "prefix_files", "build_prefix"])
        )
        layer[key] = data.draw(st.sampled_from(HOSTILE_VALUES))
    elif how == "file field" and files:
        entry = data.draw(st.sampled_from(files))
        entry[data.draw(st.sampled_from(["path", "size", "sha256"]))] = data.draw(st.sampled_from(HOSTILE_VALUES))
    elif how == "top field":
        key = data.draw(st.sampled_from(["entry_config", "metadata", "name", "format_version", "layers", "files"]))
        doc[key] = data.draw(st.sampled_from(HOSTILE_VALUES))
    elif how == "duplicate layer" and layers:
        copy = dict(data.draw(st.sampled_from(layers)))
        copy["target"] = data.draw(st.sampled_from(["deep/er/t", "s", "source/project", "runtime/rt", "x"]))
        copy["order"] = data.draw(st.integers(-1, 5))
        doc["layers"].append(copy)
    elif how == "drop field":
        doc.pop(data.draw(st.sampled_from(sorted(doc))), None)
    (bundle / "bundle.json").write_text(json.dumps(doc, indent=1))
    return f"json {how}"


def benign_member(data, bundle: Path) -> str:
    """A harmless file added to a layer (index regenerated): the restore goes all the way to the swap."""
    archive = data.draw(st.sampled_from(ARCHIVES))
    tar = _tar(bundle, archive)
    if len(tar) < 1024:
        return f"benign {archive} (unreadable, skipped)"
    name = data.draw(st.sampled_from(["new.txt", "recap/new.py", "lib/new.so", "deep/a/b/c.txt"]))
    _put_tar(bundle, archive, raw_member(name, b"fine\n") + tar, reindex=True)
    return f"benign {name} into {archive}"


MUTATIONS = {
    "member": hostile_member,
    "tar": tar_edit,
    "benign": benign_member,
    "byte": byte_edit,
    "json": json_edit,
}


# -- the property ---------------------------------------------------------------------------------


def _outside(case: Path) -> dict:
    out = {}
    for dirpath, dirs, names in os.walk(case):
        rel_dir = os.path.relpath(dirpath, case)
        if rel_dir == "bundle" or rel_dir.startswith("bundle/"):
            dirs[:] = []
            continue
        for name in dirs + names:
            full = os.path.join(dirpath, name)
            if full == os.path.join(case, "bundle"):
                continue  # the bundle itself (its .portable/ appears); everything else must stay as it was
            st_ = os.lstat(full)
            out[os.path.relpath(full, case)] = (st_.st_mode, st_.st_size, st_.st_mtime_ns)
    return out


def _vouched_incomplete(bundle: Path) -> list[str]:
    receipt = load_receipt(bundle)
    bad = []
    for archive, rec in receipt.layers.items():
        root = bundle / rec.target
        if not root.is_dir() or rec.changed_files(root):
            bad.append(f"{archive} at {rec.target}: {rec.changed_files(root)[:3] if root.is_dir() else 'missing'}")
    return bad


@pytest.mark.slow
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_mutated_bundles_restore_safely(bases, worker, outcomes, tmp_path_factory, data):
    case = tmp_path_factory.mktemp("case")
    start = data.draw(st.sampled_from(sorted(bases)))
    bundle = case / "bundle"
    shutil.copytree(bases[start], bundle, symlinks=True)
    (case / "sentinel" / "sub").mkdir(parents=True)
    (case / "sentinel" / "a.txt").write_text("sentinel")
    (case / "sentinel" / "sub" / "b.txt").write_text("sentinel")
    steps = [
        MUTATIONS[name](data, bundle)
        for name in data.draw(st.lists(st.sampled_from(list(MUTATIONS)), min_size=1, max_size=3))
    ]
    before = _outside(case)
    code, err = worker.restore(bundle)
    note = f"start={start} steps={steps}\n{err}"
    outcomes[code] = outcomes.get(code, 0) + 1
    assert code is not None, note
    assert code in DOCUMENTED, note
    assert _outside(case) == before, note
    assert not _vouched_incomplete(bundle), note
    shutil.rmtree(case, ignore_errors=True)
