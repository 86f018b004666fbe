"""Benchmark `portable restore` against the by-hand anchor, in one run.

Builds a bundle of >= 1 GB in a temp folder (a runtime-like layer of many small files plus large
weight files), then times, alternating which goes first and keeping each one's best of --rounds:

  (a) `python3 <bundle>/reproduction/portable.py restore` (verify + validate + extract + receipt)
  (b) the anchor: `zstd -dc layer | tar -x` for the layer, then hashlib sha256 of every bundle file,
      one after the other

and a no-change re-restore. Last line: `ratio: X.XX (goal <= 0.80)`.

    python3 bench/restore.py [--small-files 20000] [--weights-mb 1000] [--rounds 2] [--keep DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from reproduction.release.pack import pack_bundle  # noqa: E402


def build_sources(root: Path, small_files: int, weights_mb: int, seed: int = 0) -> None:
    """A runtime-like tree (nested folders, small semi-compressible files) and large weight files."""
    rng = random.Random(seed)
    pool = bytearray()
    for _ in range(16):  # 32 MiB pool: half random, half repetitive text, so zstd gets about 2x
        pool += os.urandom(1 << 20) + (b"def function_%d(x):\n    return x\n" % rng.randrange(1000)) * 30000
    pool = bytes(pool[: 32 << 20])
    runtime = root / "runtime"
    for i in range(small_files):
        d = runtime / f"lib/pkg{i % 97}/sub{i % 13}"
        if i < 97 * 13:
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
        '[[file]]\nsource = "weights"\ndest = "weights"\n',
        encoding="utf-8",
    )


def run_restore(bundle: Path) -> float:
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, str(bundle / "reproduction" / "portable.py"), "restore", "-q", str(bundle)],
        check=True,
        env={**os.environ, "PORTABLE_NO_PROGRESS": "1"},
        timeout=3600,
    )
    return time.perf_counter() - start


def _cli_start(bundle: Path) -> float:
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, str(bundle / "reproduction" / "portable.py"), "--help"],
        check=True,
        stdout=subprocess.DEVNULL,
        timeout=60,
    )
    return time.perf_counter() - start


def run_anchor(bundle: Path, dest: Path) -> float:
    manifest = json.loads((bundle / "bundle.json").read_text())
    start = time.perf_counter()
    for layer in manifest["layers"]:
        out = dest / layer["target"]
        out.mkdir(parents=True)
        subprocess.run(
            f"zstd -dcq '{bundle / layer['archive']}' | tar -x -C '{out}'", shell=True, check=True, timeout=3600
        )
    for entry in manifest["files"]:
        h = hashlib.sha256()
        with open(bundle / entry["path"], "rb", buffering=0) as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
        assert h.hexdigest() == entry["sha256"], entry["path"]
    return time.perf_counter() - start


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small-files", type=int, default=20000)
    parser.add_argument("--weights-mb", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--keep", default=None, help="build here and keep it (default: a temp folder, removed)")
    args = parser.parse_args()
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-restore-"))
    try:
        t0 = time.perf_counter()
        build_sources(work / "src", args.small_files, args.weights_mb)
        bundle, anchor = work / "bundle", work / "anchor"
        manifest = pack_bundle(work / "src" / "spec.toml", bundle)
        size = sum(e.size for e in manifest.files)
        layer = manifest.layers[0]
        print(
            f"bundle: {size / 1e9:.2f} GB ({layer.members} layer members, {layer.unpacked_size / 1e6:.0f} MB unpacked, "
            f"{manifest.file(layer.archive).size / 1e6:.0f} MB compressed); built in {time.perf_counter() - t0:.0f}s"
        )
        restores, anchors, again = [], [], []
        for r in range(args.rounds):
            for which in ("anchor", "restore") if r % 2 == 0 else ("restore", "anchor"):  # alternate the order
                reset(bundle, anchor, work / "graveyard")
                if which == "anchor":
                    anchors.append(run_anchor(bundle, anchor))
                else:
                    restores.append(run_restore(bundle))
                    again.append(run_restore(bundle))
            print(
                f"round {r + 1}: restore {restores[-1]:.2f}s, anchor {anchors[-1]:.2f}s, no-change "
                f"re-restore {again[-1]:.3f}s"
            )
        best_restore, best_anchor, best_again = min(restores), min(anchors), min(again)
        start = min(_cli_start(bundle) for _ in range(3))
        print(
            f"no-change re-restore: {best_again:.3f}s = {best_again / best_restore:.3f} of a full "
            "restore (goal <= 0.02); "
            f"the CLI's own start (`portable.py --help`) is {start:.3f}s of it"
        )
        print(f"ratio: {best_restore / best_anchor:.2f} (goal <= 0.80)")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
