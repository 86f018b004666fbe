"""The content digest a stage key pins for a dataset folder: every file's sha256, cached by (size, mtime_ns).

The data plane's fingerprint covers info.json, the episode index and the key columns (what a sidecar
must align with); a stage also reads other columns (actions, states, images), so its key pins the
bytes of every file too, as lineage's tree digest does: sha256 over the sorted lines
"<relative path>\\0<file sha256>\\n". Per-file digests are kept beside the fingerprint cache
(`$PORTABLE_CACHE_DIR/fingerprints/content-<root digest>.json`), so a resume over unchanged data costs
a stat per file; a cache that cannot be written is ignored. The run's in-process DigestCache hashes
the files this cache does not know, and learns the ones it does.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from reproduction.digest_cache import DigestCache, relative_files, tree_lines


def content_digest(root: Path, digests: DigestCache | None = None) -> str:
    """Tree digest of every file under `root` (lineage.tree_sha256's definition), hashing only files whose
    size or mtime changed since the last call. `digests`: the run's cache (reproduction/digest_cache.py),
    which learns every file's digest here, so lineage pins the dataset without hashing it again.
    Raises OSError when a file cannot be read."""
    from reproduction.data.fingerprint import cache_dir
    from reproduction.fsio import atomic_write_text

    digests = digests if digests is not None else DigestCache()
    root = Path(root).resolve()
    cache_path = cache_dir() / f"content-{hashlib.sha256(str(root).encode()).hexdigest()[:32]}.json"
    try:
        cache = json.loads(cache_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        cache = {}
    fresh: dict[str, list] = {}
    missing: dict[str, tuple[str, int, int]] = {}
    for rel in relative_files(root):  # strings, not Paths: this runs on every stage key of every dataset
        path = os.path.join(root, rel)
        st = os.stat(path)
        entry = cache.get(rel) if isinstance(cache, dict) else None
        if isinstance(entry, list) and entry[:2] == [st.st_size, st.st_mtime_ns]:
            fresh[rel] = entry
            digests.remember(path, st.st_size, st.st_mtime_ns, entry[2])
        else:
            missing[path] = (rel, st.st_size, st.st_mtime_ns)
    for path, digest in (digests.files(missing) if missing else {}).items():
        rel, size, mtime = missing[path]
        fresh[rel] = [size, mtime, digest]
    if fresh != cache:
        try:
            atomic_write_text(cache_path, json.dumps(fresh))
        except OSError:
            pass  # a read-only home must not stop a run
    return hashlib.sha256(tree_lines({rel: v[2] for rel, v in fresh.items()})).hexdigest()
