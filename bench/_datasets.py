"""Synthetic LeRobot datasets for the data-plane benches: metadata-sized frames, real layouts.

`write_v21(root, frames, episodes)` writes the v2.1 layout LIBERO uses (one data parquet per
episode, meta/episodes.jsonl, meta/tasks.jsonl); `write_v30(root, frames, episodes, files)` the
v3.0 layout (episodes packed into `files` parquets). Both carry the key columns, is_success and
two small float vectors (state 8, action 7), as a LIBERO-like file without its images.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

TASKS = [f"pick up the object number {i} and place it in the basket" for i in range(40)]
FEATURES = {
    "is_success": {"dtype": "bool", "shape": [1]},
    "observation.state": {"dtype": "float32", "shape": [8]},
    "action": {"dtype": "float32", "shape": [7]},
}


def episode_lengths(frames: int, episodes: int, seed: int = 0) -> np.ndarray:
    """`episodes` lengths summing to `frames`, uneven (random cuts), each >= 1."""
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.choice(np.arange(1, frames), episodes - 1, replace=False))
    return np.diff(np.concatenate([[0], cuts, [frames]])).astype(np.int64)


def _episode_table(ep: int, start: int, length: int, ok: bool, rng: np.random.Generator) -> pa.Table:
    fr = np.arange(length, dtype=np.int64)
    vec = lambda d: pa.FixedSizeListArray.from_arrays(rng.random(length * d, dtype=np.float32), d)  # noqa: E731
    return pa.table(
        {
            "observation.state": vec(8),
            "action": vec(7),
            "timestamp": (fr / 10).astype(np.float32),
            "frame_index": fr,
            "episode_index": np.full(length, ep, np.int64),
            "index": np.arange(start, start + length, dtype=np.int64),
            "task_index": np.full(length, ep % len(TASKS), np.int64),
            "is_success": np.full(length, ok),
        }
    )


def _base(root: Path, version: str) -> dict:
    """The metadata files' format from the project's own writer (one tiny episode), then replaced."""
    from reproduction.data.writer import EpisodeData, write_dataset

    tiny = EpisodeData(
        episode_index=0,
        task=TASKS[0],
        frames={
            "is_success": np.ones(2, bool),
            "observation.state": np.zeros((2, 8), np.float32),
            "action": np.zeros((2, 7), np.float32),
        },
    )
    write_dataset(root, [tiny], fps=10, features=FEATURES, version=version)
    for p in (root / "data").rglob("*.parquet"):
        p.unlink()
    return json.loads((root / "meta" / "info.json").read_text())


def write_v21(root: Path, frames: int, episodes: int, seed: int = 0) -> Path:
    """One parquet per episode (data/chunk-XXX/episode_XXXXXX.parquet), as LIBERO's v2.1 datasets."""
    info = _base(root, "v2.1")
    lengths = episode_lengths(frames, episodes, seed)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    ok = np.random.default_rng(seed + 1).random(episodes) < 0.6

    def one(ep: int) -> None:
        rng = np.random.default_rng((seed, ep))
        path = root / "data" / f"chunk-{ep // 1000:03d}" / f"episode_{ep:06d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(_episode_table(ep, int(starts[ep]), int(lengths[ep]), bool(ok[ep]), rng), path)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, range(episodes)))
    lines = "".join(
        json.dumps({"episode_index": e, "tasks": [TASKS[e % len(TASKS)]], "length": int(n)}) + "\n"
        for e, n in enumerate(lengths)
    )
    (root / "meta" / "episodes.jsonl").write_text(lines)
    (root / "meta" / "tasks.jsonl").write_text(
        "".join(json.dumps({"task_index": i, "task": t}) + "\n" for i, t in enumerate(TASKS))
    )
    info.update(
        total_episodes=episodes,
        total_frames=frames,
        total_tasks=len(TASKS),
        total_chunks=(episodes + 999) // 1000,
        splits={"train": f"0:{episodes}"},
    )
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=4))
    return root


def write_v30(root: Path, frames: int, episodes: int, files: int = 1, seed: int = 0) -> Path:
    """Episodes packed into `files` data parquets (whole episodes per file), as lerobot's v3.0."""
    info = _base(root, "v3.0")
    lengths = episode_lengths(frames, episodes, seed)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    ok = np.random.default_rng(seed + 1).random(episodes) < 0.6
    file_of = np.minimum((ends - 1) * files // frames, files - 1)
    rows: dict[str, list] = {
        k: []
        for k in (
            "episode_index",
            "tasks",
            "length",
            "data/chunk_index",
            "data/file_index",
            "dataset_from_index",
            "dataset_to_index",
            "meta/episodes/chunk_index",
            "meta/episodes/file_index",
        )
    }
    for f in range(files):
        eps = np.flatnonzero(file_of == f)
        if not eps.size:
            continue
        rng = np.random.default_rng((seed, f))
        table = pa.concat_tables(
            [_episode_table(int(e), int(starts[e]), int(lengths[e]), bool(ok[e]), rng) for e in eps]
        ).combine_chunks()
        pq.write_table(table, root / "data" / "chunk-000" / f"file-{f:03d}.parquet", row_group_size=1 << 20)
        rows["episode_index"] += eps.tolist()
        rows["tasks"] += [[TASKS[e % len(TASKS)]] for e in eps.tolist()]
        rows["length"] += lengths[eps].tolist()
        rows["data/chunk_index"] += [0] * eps.size
        rows["data/file_index"] += [f] * eps.size
        rows["dataset_from_index"] += starts[eps].tolist()
        rows["dataset_to_index"] += ends[eps].tolist()
        rows["meta/episodes/chunk_index"] += [0] * eps.size
        rows["meta/episodes/file_index"] += [0] * eps.size
    pq.write_table(pa.table(rows), root / "meta" / "episodes" / "chunk-000" / "file-000.parquet")
    tasks = pa.table({"task_index": np.arange(len(TASKS), dtype=np.int64), "__index_level_0__": TASKS})
    pq.write_table(tasks, root / "meta" / "tasks.parquet")
    info.update(total_episodes=episodes, total_frames=frames, total_tasks=len(TASKS), splits={"train": f"0:{episodes}"})
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=4))
    return root
