"""Bench peak memory of stage 1 (returns) and stage 3 (labelling from given values) on 10M frames.

Writes a LeRobot v3.0 metadata-only dataset of FRAMES frames (~200-frame episodes) as FILES data
parquets plus a values parquet, then runs each stage in a fresh subprocess and reads its peak RSS
(resource.getrusage ru_maxrss). The anchor is the issue's bound, 2 GiB. Last line:
`ratio: X.XX (goal <= 1.00)` = the larger peak / 2 GiB. FRAMES/FILES can be lowered through the
environment (BENCH_FRAMES, BENCH_FILES) for a quick look; the goal is stated for 10M.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "bench")]

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

FRAMES = int(os.environ.get("BENCH_FRAMES", 10_000_000))
FILES = int(os.environ.get("BENCH_FILES", 10))
BOUND = 2 * 1024**3
TASKS = [f"pick up the object number {i} and place it in the basket" for i in range(40)]


def write_metadata_dataset(root: Path, frames: int, files: int, seed: int = 0) -> int:
    """A v3.0 dataset with only the key columns (+ is_success), episodes never split across files.
    Returns the number of episodes. Built file by file so this process stays small too."""
    from reproduction.data.writer import EpisodeData, write_dataset

    # The metadata files' exact format comes from the project's own writer (one tiny episode) ...
    tiny = EpisodeData(episode_index=0, task=TASKS[0], frames={"is_success": np.ones(2, bool)})
    write_dataset(root, [tiny], fps=10, features={"is_success": {"dtype": "bool", "shape": [1]}})
    # ... then the data, tasks and episodes are replaced at full size.
    for p in (root / "data").rglob("*.parquet"):
        p.unlink()
    rng = np.random.default_rng(seed)
    lengths = rng.integers(100, 301, size=frames // 200 * 2)
    lengths = lengths[: np.searchsorted(np.cumsum(lengths), frames) + 1]
    lengths[-1] -= int(lengths.sum()) - frames
    lengths = lengths[lengths > 0]
    n_ep = lengths.size
    ends = np.cumsum(lengths)
    file_of = np.minimum((ends - 1) * files // frames, files - 1)  # whole episodes per file
    ep_rows = {
        "episode_index": [],
        "tasks": [],
        "length": [],
        "data/chunk_index": [],
        "data/file_index": [],
        "dataset_from_index": [],
        "dataset_to_index": [],
        "meta/episodes/chunk_index": [],
        "meta/episodes/file_index": [],
    }
    for f in range(files):
        eps = np.flatnonzero(file_of == f)
        if not eps.size:
            continue
        lo, hi = int(ends[eps[0]] - lengths[eps[0]]), int(ends[eps[-1]])
        ep_col = np.repeat(eps, lengths[eps]).astype(np.int64)
        fr = np.arange(hi - lo, dtype=np.int64) - np.repeat(ends[eps] - lengths[eps] - lo, lengths[eps])
        task = ep_col % len(TASKS)
        ok = np.repeat(rng.random(eps.size) < 0.6, lengths[eps])
        table = pa.table(
            {
                "is_success": ok,
                "timestamp": (fr / 10).astype(np.float32),
                "frame_index": fr,
                "episode_index": ep_col,
                "index": np.arange(lo, hi, dtype=np.int64),
                "task_index": task,
            }
        )
        path = root / "data" / "chunk-000" / f"file-{f:03d}.parquet"
        pq.write_table(table, path, row_group_size=1 << 20)
        ep_rows["episode_index"] += eps.tolist()
        ep_rows["tasks"] += [[TASKS[e % len(TASKS)]] for e in eps.tolist()]
        ep_rows["length"] += lengths[eps].tolist()
        ep_rows["data/chunk_index"] += [0] * eps.size
        ep_rows["data/file_index"] += [f] * eps.size
        ep_rows["dataset_from_index"] += (ends[eps] - lengths[eps]).tolist()
        ep_rows["dataset_to_index"] += ends[eps].tolist()
        ep_rows["meta/episodes/chunk_index"] += [0] * eps.size
        ep_rows["meta/episodes/file_index"] += [0] * eps.size
    pq.write_table(pa.table(ep_rows), root / "meta" / "episodes" / "chunk-000" / "file-000.parquet")
    tasks = pa.table({"task_index": np.arange(len(TASKS), dtype=np.int64), "__index_level_0__": TASKS})
    pq.write_table(tasks, root / "meta" / "tasks.parquet")
    info = json.loads((root / "meta" / "info.json").read_text())
    info.update(total_episodes=n_ep, total_frames=frames, total_tasks=len(TASKS), splits={"train": f"0:{n_ep}"})
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=4))
    return n_ep


def write_values(root: Path, path: Path, seed: int = 1) -> None:
    """Per-frame values (episode_index, frame_index, value), one row group per data file."""
    rng = np.random.default_rng(seed)
    schema = pa.schema([("episode_index", pa.int64()), ("frame_index", pa.int64()), ("value", pa.float64())])
    with pq.ParquetWriter(path, schema) as writer:
        for data in sorted((root / "data").rglob("*.parquet")):
            t = pq.read_table(data, columns=["episode_index", "frame_index"])
            writer.write_table(t.append_column("value", pa.array(rng.uniform(-1, 0, t.num_rows))))


CHILD = r"""
import os, resource, sys, time
sys.path.insert(0, {repo!r})
from pathlib import Path
stage, root, run, values = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
t0 = time.perf_counter()
if stage == "returns":
    from reproduction.recap.returns import ReturnsConfig, compute_returns
    compute_returns([root], run, ReturnsConfig(dataset_type="rollout"))
else:
    from reproduction.recap.advantages import AdvantageConfig, compute_advantages, load_dataset_arrays
    from reproduction.recap.normalize import ReturnRange
    inputs = [load_dataset_arrays(root, run, values, dataset_type="rollout", returns_tag=None)]  # as the CLI
    compute_advantages(inputs, AdvantageConfig(lookahead=10), ReturnRange(return_min=-600.0, return_max=0.0),
                       out_dirs=[run / root.name])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, time.perf_counter() - t0)
"""


def run_stage(stage: str, root: Path, run: Path, values: Path, env: dict) -> tuple[int, float]:
    """(peak RSS bytes, seconds) of one stage in a fresh interpreter."""
    proc = subprocess.run(
        [sys.executable, "-c", CHILD.format(repo=str(REPO)), stage, str(root), str(run), str(values)],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    if proc.returncode:
        raise SystemExit(f"{stage} failed:\n{proc.stderr}")
    peak, secs = proc.stdout.split()
    return int(peak), float(secs)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root, run, values = Path(tmp) / "ds10m", Path(tmp) / "run", Path(tmp) / "values.parquet"
        t0 = time.perf_counter()
        n_ep = write_metadata_dataset(root, FRAMES, FILES)
        write_values(root, values)
        t_gen = time.perf_counter() - t0
        env = {**os.environ, "PORTABLE_CACHE_DIR": str(Path(tmp) / "cache"), "OMP_NUM_THREADS": "1"}
        r_peak, r_secs = run_stage("returns", root, run, values, env)
        a_peak, a_secs = run_stage("advantages", root, run, values, env)
        rows = pq.ParquetFile(run / "ds10m" / "advantages.parquet").metadata.num_rows
        assert rows == FRAMES, rows
    gib = 1024**3
    from _timing import machine_note

    print(f"machine: {machine_note()} (peak RSS does not depend on load; the seconds do)")
    print(f"frames {FRAMES:,} in {FILES} data files, {n_ep:,} episodes (generated in {t_gen:.1f} s)")
    print(f"returns:    peak RSS {r_peak / gib:.2f} GiB, {r_secs:.1f} s")
    print(f"advantages: peak RSS {a_peak / gib:.2f} GiB, {a_secs:.1f} s (from given values, N 10, global threshold)")
    print(f"ratio: {max(r_peak, a_peak) / BOUND:.2f} (goal <= 1.00, peak RSS / 2 GiB)")


if __name__ == "__main__":
    main()
