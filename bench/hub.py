"""Bench: `portable fetch` of a 1 GB bundle vs `huggingface_hub.snapshot_download` + a separate sha256 pass.

Both download the same files from the same local Hub-compatible server (tests/hubserver.py, a
stand-in for huggingface.co on 127.0.0.1, serving with sendfile), each in its own Python process so
both pay the same start-up. The anchor is what a user does today to get a verified copy: download,
then hash every file against bundle.json (parallel hashlib, reproduction.digests). `portable fetch`
hashes while writing and verifies by stat, so it saves the second read. Rounds alternate (anchor,
fetch, ...) and the best time of each is compared. Last line: `ratio: X.XX (goal <= 0.70)`.

    python3 bench/hub.py [--size-mb 1024] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from hubserver import HubServer, make_bundle, portable_cmd, portable_env  # noqa: E402

ANCHOR = """
import sys, time
from pathlib import Path
sys.path.insert(0, {repo!r})
from huggingface_hub import snapshot_download
from reproduction.digests import sha256_files
from reproduction.release.manifest import load_manifest
out = Path(snapshot_download({repo_id!r}, local_dir={out!r}))
manifest = load_manifest(out)
digests = sha256_files([out / e.path for e in manifest.files])
bad = [e.path for e in manifest.files if digests[out / e.path] != e.sha256]
assert not bad, bad
"""


def bundle_files(total_mb: int) -> dict[str, bytes]:
    """A release-shaped bundle: a few large weight shards and layers, and 200 small config/data files."""
    block = os.urandom(64 << 20)
    mb = 1 << 20
    big = {
        "weights/policy.safetensors": 0.30,
        "weights/value.safetensors": 0.25,
        "runtime/python.tar.zst": 0.12,
        "runtime/venv.tar.zst": 0.18,
        "source/recap.tar.zst": 0.05,
        "data/libero_10/chunk-000.parquet": 0.09,
    }
    files: dict[str, bytes] = {}
    for i, (rel, share) in enumerate(big.items()):
        size = int(total_mb * mb * share)
        reps = size // len(block) + 1
        files[rel] = (i.to_bytes(8, "little") + block * reps)[:size]  # distinct content, no RNG cost per byte
    for i in range(200):
        files[f"config/part-{i:03d}.json"] = (b'{"k": %d}\n' % i) * (i + 1)
    return files


def timed(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"failed ({result.returncode}): {' '.join(cmd[:4])}...\n{result.stderr[-3000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-hub-"))
    try:
        files = bundle_files(args.size_mb)
        total, n_files = sum(len(v) for v in files.values()), len(files)
        bundle = make_bundle(work / "bundle", files, name="bench")
        del files
        with HubServer(work / "hub", tokens={"hf_bench": ("alice", "write")}, log_bodies=False) as hub:
            hub.seed_repo("model/alice/bench", bundle, owner="alice", lfs_min_size=1 << 20)
            env = portable_env(hub, work / "hfhome", token="hf_bench", PORTABLE_NO_PROGRESS="1")
            best = {"fetch": float("inf"), "anchor": float("inf")}
            for r in range(args.rounds):
                out = work / f"anchor-{r}"
                code = ANCHOR.format(repo=str(REPO), repo_id="alice/bench", out=str(out))
                best["anchor"] = min(best["anchor"], timed([sys.executable, "-c", code], env))
                shutil.rmtree(out)
                out = work / f"fetch-{r}"
                best["fetch"] = min(best["fetch"], timed(portable_cmd("fetch", "alice/bench", str(out), "-q"), env))
                shutil.rmtree(out)
                print(
                    f"round {r + 1}: best so far anchor {best['anchor']:.2f} s, fetch {best['fetch']:.2f} s", flush=True
                )
        gb = total / 1e9
        print(f"bundle: {n_files} files, {gb:.2f} GB, {args.rounds} rounds, best of each")
        print(f"anchor (snapshot_download + sha256 pass): {best['anchor']:.2f} s ({gb / best['anchor']:.2f} GB/s)")
        print(f"portable fetch (hash while writing, verify): {best['fetch']:.2f} s ({gb / best['fetch']:.2f} GB/s)")
        print(f"ratio: {best['fetch'] / best['anchor']:.2f} (goal <= 0.70)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
