"""Benchmark `portable restore` against what a user would do by hand, on tmpfs and on disk.

Builds a bundle of >= 1 GB (two runtime-like layers of many small files, plus large weight files)
once on tmpfs (/dev/shm, the headline: file creation on these shared disks swings 2-5x between
rounds, almost all of it kernel time) and once on disk, then times on each, alternating which goes
first and keeping each one's best of --rounds:

  (a) `python3 <bundle>/reproduction/portable.py restore` (verify + validate + extract + receipt)
  (b) the anchor: every layer decompressed at once, each `zstd -T0 -dc layer | tar -x` (zstd's
      multi-threaded CLI), then hashlib sha256 of every bundle file on a pool of one thread per core
      (hashlib releases the GIL), as a user would verify-and-extract with the best tools at hand
  (c) a no-change re-restore, against `python -S` that os.stat()s every restored file (the floor of
      any check that the files are still there: an interpreter start and a stat pass), alternated
      NOOP_RUNS times each per round
Each side's CPU seconds (user + system, its child processes and threads) are printed beside the
wall figures: on a shared machine they move much less with other people's load.

Prints the core count. Last line: `ratio: X.XX (goal <= 0.80, tmpfs)` = restore / anchor on tmpfs;
the disk ratio and the re-restore ratio (goal <= 1.5x) are printed above it.

    python3 bench/restore.py [--small-files 20000] [--weights-mb 1000] [--rounds 2] [--keep DIR] [--no-tmpfs]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from reproduction.release.pack import pack_bundle  # noqa: E402

NOOP_RUNS = 4
"""No-change re-restores (and as many stat floors) per round, alternated: each takes well under a second."""


def build_sources(root: Path, small_files: int, weights_mb: int, seed: int = 0) -> None:
    """A runtime-like tree (nested folders, small semi-compressible files) and large weight files."""
    rng = random.Random(seed)
    pool = bytearray()
    for _ in range(16):  # 32 MiB pool: half random, half repetitive text, so zstd gets about 2x
        pool += os.urandom(1 << 20) + (b"def function_%d(x):\n    return x\n" % rng.randrange(1000)) * 30000
    pool = bytes(pool[: 32 << 20])
    for i in range(small_files):
        layer = root / ("runtime" if i % 5 < 3 else "venv")  # two layers: 60% / 40% of the files
        d = layer / f"lib/pkg{i % 97}/sub{i % 13}"
        d.mkdir(parents=True, exist_ok=True)
        size = min(int(rng.lognormvariate(9.3, 1.1)), 1 << 20)
        start = rng.randrange(0, len(pool) - size)
        (d / f"m{i}.py").write_bytes(pool[start : start + size])
    weights = root / "weights"
    weights.mkdir(parents=True)
    per = 250
    for i in range(max(1, weights_mb // per)):
        with open(weights / f"model-{i:05d}.safetensors", "wb") as fh:
            for _ in range(per):
                fh.write(os.urandom(1 << 20))
    (root / "spec.toml").write_text(
        'name = "bench"\n\n[[layer]]\nsource = "runtime"\nkind = "runtime"\nname = "python"\n\n'
        '[[layer]]\nsource = "venv"\nkind = "runtime"\nname = "venv"\n\n'
        '[[file]]\nsource = "weights"\ndest = "weights"\n',
        encoding="utf-8",
    )


CPU: dict[str, list[float]] = {}
"""CPU seconds (user + system, children and this process's threads) of each timed run, by side: on a
shared machine the wall figures swing with other people's load, the CPU figures much less."""


def _cpu() -> float:
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return kids.ru_utime + kids.ru_stime + time.process_time()


def _timed(side: str, fn) -> float:
    c0, start = _cpu(), time.perf_counter()
    fn()
    wall = time.perf_counter() - start
    CPU.setdefault(side, []).append(_cpu() - c0)
    return wall


def run_restore(bundle: Path) -> float:
    return _timed(
        "restore",
        lambda: subprocess.run(
            [sys.executable, str(bundle / "reproduction" / "portable.py"), "restore", "-q", str(bundle)],
            check=True,
            env={**os.environ, "PORTABLE_NO_PROGRESS": "1"},
            timeout=3600,
        ),
    )


def run_again(bundle: Path) -> float:
    """A no-change re-restore (the receipt and a stat pass answer it)."""
    wall = run_restore(bundle)
    CPU.setdefault("again", []).append(CPU["restore"].pop())
    return wall


def _cli_start(bundle: Path) -> float:
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, str(bundle / "reproduction" / "portable.py"), "--help"],
        check=True,
        stdout=subprocess.DEVNULL,
        timeout=60,
    )
    return time.perf_counter() - start


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def run_anchor(bundle: Path, dest: Path) -> float:
    """All layers decompressed concurrently (zstd -T0 into tar), then every bundle file hashed on
    one thread per core; the digests are checked against the manifest."""
    from concurrent.futures import ThreadPoolExecutor

    manifest = json.loads((bundle / "bundle.json").read_text())
    c0, start = _cpu(), time.perf_counter()
    procs = []
    for layer in manifest["layers"]:
        out = dest / layer["target"]
        out.mkdir(parents=True)
        cmd = f"zstd -T0 -dcq '{bundle / layer['archive']}' | tar -x -C '{out}'"
        procs.append(subprocess.Popen(cmd, shell=True))
    for proc in procs:
        if proc.wait(timeout=3600):
            raise SystemExit("anchor: zstd | tar failed")
    files = manifest["files"]
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        digests = list(pool.map(lambda e: _sha256(bundle / e["path"]), files))
    wall = time.perf_counter() - start
    CPU.setdefault("anchor", []).append(_cpu() - c0)
    assert digests == [e["sha256"] for e in files]
    return wall


STAT_ALL = """
import os, sys
def walk(path):
    n = 0
    for entry in os.scandir(path):
        os.stat(entry.path, follow_symlinks=False)
        n += 1
        if entry.is_dir(follow_symlinks=False):
            n += walk(entry.path)
    return n
print(sum(walk(p) for p in sys.argv[1:]))
"""


def run_stat_floor(bundle: Path) -> float:
    """`python -S` stat()ing every file of the restored layer targets: a re-restore's floor."""
    manifest = json.loads((bundle / "bundle.json").read_text())
    targets = [str(bundle / layer["target"]) for layer in manifest["layers"]]
    return _timed(
        "floor",
        lambda: subprocess.run(
            [sys.executable, "-S", "-c", STAT_ALL, *targets], check=True, stdout=subprocess.DEVNULL, timeout=600
        ),
    )


def reset(bundle: Path, anchor: Path, graveyard: Path) -> None:
    """Move earlier results aside (deleting 20k files right before a timed run slows it on disks
    mounted with `discard`, like this one; they are deleted after the last round), then sync."""
    graveyard.mkdir(exist_ok=True)
    manifest = json.loads((bundle / "bundle.json").read_text())
    for path in [bundle / layer["target"] for layer in manifest["layers"]] + [bundle / ".portable", anchor]:
        if path.exists():
            os.rename(path, graveyard / f"{len(os.listdir(graveyard))}")
    subprocess.run(["sync"], check=False)
    time.sleep(2)


def bench_on(work: Path, args: argparse.Namespace, label: str) -> tuple[float, float]:
    """(restore / anchor, re-restore / stat floor) with the bundle built and restored under `work`."""
    t0 = time.perf_counter()
    build_sources(work / "src", args.small_files, args.weights_mb)
    bundle, anchor = work / "bundle", work / "anchor"
    manifest = pack_bundle(work / "src" / "spec.toml", bundle)
    size = sum(e.size for e in manifest.files)
    members = sum(layer.members for layer in manifest.layers)
    unpacked = sum(layer.unpacked_size for layer in manifest.layers)
    packed = sum(manifest.file(layer.archive).size for layer in manifest.layers)
    print(
        f"[{label}] bundle at {work}: {size / 1e9:.2f} GB ({len(manifest.layers)} layers, {members} members, "
        f"{unpacked / 1e6:.0f} MB unpacked, {packed / 1e6:.0f} MB compressed); built in {time.perf_counter() - t0:.0f}s"
    )
    restores, anchors, again, floors = [], [], [], []
    CPU.clear()
    for r in range(args.rounds):
        for which in ("anchor", "restore") if r % 2 == 0 else ("restore", "anchor"):  # alternate the order
            reset(bundle, anchor, work / "graveyard")
            if which == "anchor":
                anchors.append(run_anchor(bundle, anchor))
            else:
                restores.append(run_restore(bundle))
                for k in range(2 * NOOP_RUNS):  # both are short: alternate them several times per round
                    if (k + r) % 2 == 0:
                        again.append(run_again(bundle))
                    else:
                        floors.append(run_stat_floor(bundle))
        print(
            f"[{label}] round {r + 1}: restore {restores[-1]:.2f}s, anchor {anchors[-1]:.2f}s, "
            f"no-change re-restore {again[-1]:.3f}s, python -S stat floor {floors[-1]:.3f}s"
        )
    best_restore, best_anchor, best_again, best_floor = min(restores), min(anchors), min(again), min(floors)
    start = min(_cli_start(bundle) for _ in range(3))
    print(
        f"[{label}] restore {best_restore:.2f}s vs anchor {best_anchor:.2f}s: {best_restore / best_anchor:.2f}x "
        f"(goal <= 0.80); no-change re-restore {best_again:.3f}s vs stat floor {best_floor:.3f}s: "
        f"{best_again / best_floor:.2f}x (goal <= 1.5x); `portable.py --help` alone {start:.3f}s"
    )
    cpu = {side: min(v) for side, v in CPU.items()}
    print(
        f"[{label}] CPU seconds (best run, user + system): restore {cpu['restore']:.2f} vs anchor {cpu['anchor']:.2f} "
        f"({cpu['restore'] / cpu['anchor']:.2f}x); re-restore {cpu['again']:.3f} vs stat floor {cpu['floor']:.3f} "
        f"({cpu['again'] / cpu['floor']:.2f}x); load now {os.getloadavg()[0]:.1f}"
    )
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    floor = cpu["anchor"] / cores  # the anchor's CPU is C tools doing the same work: decompress, create, hash
    print(
        f"[{label}] on {cores} cores a restore doing the anchor's work in the anchor's CPU time needs at least "
        f"{floor:.2f}s of wall: restore/anchor >= {floor / best_anchor:.2f}x here (single-pass hashing saves only "
        f"re-reading the archives from the page cache; the anchor kept {cpu['anchor'] / best_anchor:.2f} cores busy)"
    )
    return best_restore / best_anchor, best_again / best_floor


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small-files", type=int, default=20000)
    parser.add_argument("--weights-mb", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--keep", default=None, help="build the disk bundle here and keep it (default: a temp folder)")
    parser.add_argument("--no-tmpfs", action="store_true", help="skip the tmpfs run (the headline)")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg()
    print(f"cores: {cores} (os.cpu_count {os.cpu_count()}); load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}")
    need = 3 * (args.weights_mb << 20) + args.small_files * 40_000
    shm = Path("/dev/shm")
    use_tmpfs = not args.no_tmpfs and shm.is_dir() and shutil.disk_usage(shm).free > 2 * need
    results = {}
    for label in (["tmpfs"] if use_tmpfs else []) + ["disk"]:
        if label == "tmpfs":
            work = Path(tempfile.mkdtemp(prefix="bench-restore-", dir=shm))
        else:
            work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-restore-"))
        try:
            results[label] = bench_on(work, args, label)
        finally:
            if label == "tmpfs" or not args.keep:
                shutil.rmtree(work, ignore_errors=True)
    if not use_tmpfs:
        print("tmpfs: skipped (no /dev/shm with room, or --no-tmpfs); the headline below is the disk ratio")
    head = results.get("tmpfs", results["disk"])
    print(f"disk: restore/anchor {results['disk'][0]:.2f}x, re-restore/stat floor {results['disk'][1]:.2f}x")
    print(f"re-restore/stat floor ({'tmpfs' if use_tmpfs else 'disk'}): {head[1]:.2f}x (goal <= 1.5x)")
    print(f"ratio: {head[0]:.2f} (goal <= 0.80, {'tmpfs' if use_tmpfs else 'disk'}; vs zstd -T0 + hashlib anchor)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
