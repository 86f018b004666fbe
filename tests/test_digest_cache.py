"""One digest cache per run: a file is hashed once however many parts of the run read it (stage keys, outputs,
datasets' content digests, lineage), and again only when its signature (inode, size, mtime_ns) changes."""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from reproduction.digest_cache import DigestCache, tree_files
from reproduction.digests import sha256_file
from reproduction.recipe import Recipe, StageContext, StageOutput, StageSpec
from reproduction.run.lineage import tree_sha256
from reproduction.run.record import make_recorder
from reproduction.run.runner import RunOptions, run_recipe


def counting() -> tuple[DigestCache, Counter]:
    calls: Counter = Counter()

    def hasher(path: Path) -> str:
        calls[Path(path).name] += 1
        return sha256_file(path)

    return DigestCache(hasher=hasher), calls


def test_tree_files_lists_files_and_links_to_files_and_follows_no_folder_link(tmp_path):
    root = tmp_path / "tree"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "deep.bin").write_bytes(b"1")
    (root / ".hidden").write_bytes(b"2")
    (root / "z.json").write_text("{}")
    (root / "empty").mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.bin").write_bytes(b"3")
    (root / "to_folder").symlink_to(outside)  # a folder link: not followed
    (root / "to_file").symlink_to(root / "z.json")  # a file link: a file of the tree
    (root / "dangling").symlink_to(tmp_path / "gone")
    os.mkfifo(root / "pipe")  # not a regular file
    assert tree_files(root) == [root / ".hidden", root / "a/b/deep.bin", root / "to_file", root / "z.json"]
    assert tree_files(tmp_path / "missing") == [] and tree_files(root / "z.json") == []


def test_sha256_file_sizes_its_buffer_by_the_file(tmp_path):
    # an empty file, one byte, and one over the 1 MiB chunk
    (tmp_path / "zero").write_bytes(b"")
    (tmp_path / "one").write_bytes(b"2")
    (tmp_path / "big").write_bytes(bytes(range(256)) * 4097)
    for name in ("zero", "one", "big"):
        assert sha256_file(tmp_path / name) == hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()


def test_a_file_is_hashed_once_and_again_after_a_same_size_rewrite(tmp_path):
    cache, calls = counting()
    f = tmp_path / "w.bin"
    f.write_bytes(b"a" * 4096)
    first = cache.file(f)
    assert cache.file(f) == first and cache.files([f]) == {f: first} and calls["w.bin"] == 1
    st = f.stat()
    f.write_bytes(b"b" * 4096)  # the same size, other bytes
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # a new mtime, as any rewrite leaves
    assert cache.file(f) == sha256_file(f) != first and calls["w.bin"] == 2


def test_many_files_hash_in_threads_only_above_the_size_worth_a_pool(tmp_path, monkeypatch):
    import threading

    import reproduction.digest_cache as dc

    files = []
    for i in range(4):
        files.append(tmp_path / f"f{i}.bin")
        files[-1].write_bytes(bytes([i]) * 70_000)
    threads: set[str] = set()

    def hasher(path: Path) -> str:
        threads.add(threading.current_thread().name)
        return sha256_file(path)

    want = {f: sha256_file(f) for f in files}
    assert DigestCache(hasher=hasher).files(files) == want
    assert threads == {threading.current_thread().name}  # 280 KB: hashed here, no pool started
    threads.clear()
    monkeypatch.setattr(dc, "PARALLEL_HASH_BYTES", 100_000)
    assert DigestCache(hasher=hasher, jobs=2).files(files) == want
    assert threading.current_thread().name not in threads  # above the bar: the pool's threads


def test_trees_and_remembered_digests(tmp_path):
    cache, calls = counting()
    folder = tmp_path / "ds"
    (folder / "meta").mkdir(parents=True)
    (folder / "meta/info.json").write_text("{}")
    (folder / "a.bin").write_bytes(b"x" * 10)
    digest, kind, files = cache.path(folder)
    assert (digest, kind) == (tree_sha256(folder), "tree") and set(files) == {"a.bin", "meta/info.json"}
    assert cache.path(folder)[0] == digest and sum(calls.values()) == 2
    (folder / "meta/info.json").write_text('{"v": 2}')
    assert cache.path(folder)[0] != digest and calls["info.json"] == 2 and calls["a.bin"] == 1
    other, _ = counting()
    st = (folder / "a.bin").stat()
    assert other.remember(folder / "a.bin", st.st_size, st.st_mtime_ns, "known")
    assert other.file(folder / "a.bin") == "known"
    assert not other.remember(folder / "a.bin", st.st_size + 1, st.st_mtime_ns, "stale")
    with pytest.raises(FileNotFoundError):
        cache.path(tmp_path / "absent")


# -- a run ------------------------------------------------------------------------------------------


@dataclass
class Cfg:
    reference: str = ""


@dataclass
class Data:
    root: Path
    fingerprint: str


def open_inputs(config: Cfg, digests: DigestCache) -> dict[str, Data]:
    from reproduction.run.content import content_digest

    root = Path(config.reference).parent / "ds"
    return {"ds": Data(root=root, fingerprint=content_digest(root, digests))}


def make(ctx: StageContext) -> StageOutput:
    out = ctx.out_dir / "big.bin"
    out.write_bytes(os.urandom(1 << 16))
    return StageOutput(files=[out])


def use(ctx: StageContext) -> StageOutput:
    out = ctx.out_dir / "small.json"
    out.write_text(json.dumps({"read": (ctx.run_dir / "make" / "big.bin").stat().st_size}))
    return StageOutput(files=[out])


RECIPE = Recipe(
    name="digests",
    stages=(
        StageSpec(name="make", fn=f"{__name__}:make", files=("reference",), code=(__name__,)),
        StageSpec(name="use", fn=f"{__name__}:use", needs=("make",), files=("reference",), code=(__name__,)),
    ),
    open_inputs=f"{__name__}:open_inputs",
)


def test_a_run_hashes_each_file_once(tmp_path, monkeypatch):
    """Two stages read the same reference file and dataset; the first's output is the second's input; every
    stage's lineage pins all of them: each file is hashed once in the run, and a resume over it hashes no output."""
    monkeypatch.setenv("PORTABLE_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "episodes.bin").write_bytes(b"e" * 70_000)
    ref = tmp_path / "ref.bin"
    ref.write_bytes(b"r" * 50_000)
    cache, calls = counting()
    run = tmp_path / "run"
    opts = RunOptions(digests=cache, recorder=make_recorder(None))
    run_recipe(RECIPE, Cfg(reference=str(ref)), run, opts)
    assert (run / "lineage" / "use.intoto.json").is_file()
    assert calls == {"episodes.bin": 1, "ref.bin": 1, "big.bin": 1, "small.json": 1, "test_digest_cache.py": 1}
    again, calls = counting()
    got = run_recipe(RECIPE, Cfg(reference=str(ref)), run, RunOptions(digests=again, resume=True))
    assert [s.action for s in got.stages] == ["skipped", "skipped"]
    assert "big.bin" not in calls and "small.json" not in calls  # recorded outputs: a stat each
