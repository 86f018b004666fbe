"""One run's file digests: each file's sha256, reused while its (inode, size, mtime_ns) is unchanged.

The runner creates one DigestCache per run and hands it to everything that hashes the run's files: the
stage keys (code and input files), the recorded outputs and their check on resume, the datasets' content
digests (run/content.py), the bundle weights check and the lineage statements. A file four of them read
is hashed once; a file rewritten in between (new inode, size or mtime) is hashed again. Nothing global:
a cache lives as long as the object the caller holds, and is never shared between processes (a worker
process hashes what it loads itself).

A tree digest (a dataset, a checkpoint) is sha256 over the sorted lines "<relative posix path>\\0<file
sha256>\\n" of the files under the folder (tree_lines); lineage pins folders by it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from reproduction.digests import default_jobs, sha256_file

PARALLEL_HASH_BYTES = 8 << 20
"""Below this many bytes to hash, `files` hashes in the calling thread: starting a pool costs ~1 ms, about what
sha256 takes over a few MiB (a stage's outputs are often a parquet of a few hundred KiB and a JSON)."""

Signature = tuple[int, int, int]
"""(st_ino, st_size, st_mtime_ns): a file whose signature is unchanged keeps its digest."""


def tree_lines(entries: Mapping[str, str]) -> bytes:
    """The bytes a tree digest hashes: "<relative posix path>\\0<sha256>\\n" per file, sorted by path."""
    return b"".join(f"{rel}\0{entries[rel]}\n".encode() for rel in sorted(entries))


def tree_files(root: Path) -> list[Path]:
    """The regular files under `root` (links to files included, links to folders not followed), sorted."""
    root = Path(root)
    return sorted(root / rel for rel in relative_files(root))


def relative_files(root: Path | str) -> list[str]:
    """tree_files' files as relative posix paths, in no particular order ([] when `root` is not a folder)."""
    return _relative_files(os.fspath(root), "")


def _relative_files(top: str, prefix: str) -> list[str]:
    # os.scandir, not Path.rglob: its entries carry the file type, so a folder of a few files costs a few
    # syscalls (rglob took ~0.4 ms over a dataset's five files; a stage key walks every dataset it reads)
    out: list[str] = []
    try:
        entries = list(os.scandir(top))
    except (FileNotFoundError, NotADirectoryError):
        return out
    for entry in entries:
        rel = prefix + entry.name
        if entry.is_dir(follow_symlinks=False):
            out += _relative_files(entry.path, rel + "/")
        elif entry.is_file():
            out.append(rel)
    return out


def _signature(st: os.stat_result) -> Signature:
    return st.st_ino, st.st_size, st.st_mtime_ns


class DigestCache:
    """sha256 of files, remembered by absolute path and signature (see the module docstring).

    `hasher(path) -> hex` hashes one file (digests.sha256_file; a seam for tests, which count its calls).
    Every method raises FileNotFoundError (or the OSError met) for a file it cannot stat or read, and
    remembers nothing for it.
    """

    def __init__(self, *, hasher: Callable[[Path], str] | None = None, jobs: int | None = None) -> None:
        self._hasher = hasher or sha256_file
        self._jobs = jobs
        self._known: dict[str, tuple[Signature, str]] = {}

    def _lookup(self, path: Path) -> tuple[str, Signature, str | None]:
        key = os.path.realpath(path)
        sig = _signature(os.stat(key))
        known = self._known.get(key)
        return key, sig, known[1] if known is not None and known[0] == sig else None

    def file(self, path: Path) -> str:
        """The sha256 of one file, hashed only when its signature changed since it was last seen."""
        key, sig, digest = self._lookup(path)
        if digest is None:
            digest = self._hasher(Path(key))
            self._known[key] = (sig, digest)
        return digest

    def files(self, paths: Iterable[Path]) -> dict[Path, str]:
        """{path: sha256} for many files (keys as given); the ones not known are hashed in parallel threads when they
        hold PARALLEL_HASH_BYTES or more, else one after the other here."""
        paths = list(paths)
        out: dict[Path, str] = {}
        todo: list[tuple[Path, str, Signature]] = []
        for p in paths:
            key, sig, digest = self._lookup(p)
            if digest is None:
                todo.append((p, key, sig))
            else:
                out[p] = digest
        if len(todo) == 1 or sum(sig[1] for _, _, sig in todo) < PARALLEL_HASH_BYTES:
            for p, key, sig in todo:
                out[p] = self._hasher(Path(key))
                self._known[key] = (sig, out[p])
        elif todo:
            with ThreadPoolExecutor(max_workers=self._jobs or default_jobs()) as pool:
                for (p, key, sig), digest in zip(todo, pool.map(lambda t: self._hasher(Path(t[1])), todo)):
                    out[p] = digest
                    self._known[key] = (sig, digest)
        return {p: out[p] for p in paths}

    def remember(self, path: Path, size: int, mtime_ns: int, digest: str) -> bool:
        """Take a digest known from elsewhere (a cache on disk, run.json) for `path` while its size and mtime_ns
        still match; returns whether it was taken."""
        key = os.path.realpath(path)
        try:
            st = os.stat(key)
        except OSError:
            return False
        if (st.st_size, st.st_mtime_ns) != (size, mtime_ns):
            return False
        self._known[key] = (_signature(st), digest)
        return True

    def tree(self, root: Path) -> tuple[str, dict[str, str]]:
        """(tree digest, {relative posix path: sha256}) of every file under a folder."""
        root = Path(root)
        files = {p.relative_to(root).as_posix(): d for p, d in self.files(tree_files(root)).items()}
        return hashlib.sha256(tree_lines(files)).hexdigest(), files

    def path(self, path: Path) -> tuple[str, str, dict[str, str] | None]:
        """(sha256, "file" or "tree", a folder's per-file digests or None); FileNotFoundError when absent."""
        path = Path(os.path.abspath(path))
        if path.is_dir():
            digest, files = self.tree(path)
            return digest, "tree", files
        if not path.is_file():
            raise FileNotFoundError(path)
        return self.file(path), "file", None
