"""Upstream-style anchors for the data-plane benches, run as their own processes (numpy + pyarrow only).

    python bench/_upstream.py returns ROOT OUT_PARQUET      RLinf's compute_returns.py, per file
    python bench/_upstream.py advantages ROOT RETURNS VALUES OUT_PARQUET RETURN_MIN RETURN_MAX
    python bench/_upstream.py io ROOT OUT_PARQUET           read stage 1's input columns, write its output columns
    python bench/_upstream.py advantages-io ROOT RETURNS VALUES OUT_PARQUET   the same floor for stage 3

`returns` follows RLinf's `process/compute_returns.py` (commit a3816b5) step by step: per data file
on a ThreadPoolExecutor of 8 (its code default; pyarrow releases the GIL), stat + ParquetFile open +
read_table of the metadata columns, the episode boundaries, its per-episode backward recursion,
the prompts, then one concat_tables + write_table and the stats.json update. Two liberties, both in
the anchor's favour: info.json is not rewritten, and tasks come from tasks.parquet when there is no
tasks.jsonl (upstream would write "perform the task" for a v3.0 dataset).

`advantages` is upstream's Phase 2 in its vectorised per-episode form (relabel_advantages.py's
recompute: a strided window per episode, v_next = V[t+N] or 0), fed as RLinf's compute_advantages
is: the episode boundaries from the data files (read per file on a thread pool of 8), the returns
sidecar and the per-frame values; one percentile threshold; one write.

`io` is the floor of stage 1: the same input columns read with the project's reader settings
(each file once, on its small thread pool) and a table of the same output columns written once
with the project's writer settings (prompts as dictionary codes, as stage 1 builds them).
"""

from __future__ import annotations

import json
import math
import sys
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

_READ_COLUMNS = ["episode_index", "frame_index", "is_success", "task_index", "task"]
NUM_WORKERS = 8


def _tasks(root: Path) -> dict[int, str]:
    path = root / "meta" / "tasks.jsonl"
    tasks: dict[int, str] = {}
    if path.exists():
        with open(path) as f:
            for line in f:
                entry = json.loads(line.strip())
                tasks[entry.get("task_index", len(tasks))] = entry.get("task", "")
    elif (root / "meta" / "tasks.parquet").exists():
        t = pq.read_table(root / "meta" / "tasks.parquet")
        tasks = dict(zip(t.column("task_index").to_pylist(), t.column("__index_level_0__").to_pylist()))
    return tasks


def _returns_for_episode(n: int, ok: bool, gamma: float, failure_reward: float) -> tuple[np.ndarray, np.ndarray]:
    rewards = np.full(n, -1.0, dtype=np.float32)
    rewards[-1] = 0.0 if ok else failure_reward
    returns = np.zeros(n, dtype=np.float32)
    returns[-1] = rewards[-1]
    for t in range(n - 2, -1, -1):
        returns[t] = rewards[t] + gamma * returns[t + 1]
    return returns, rewards


def _boundaries(ep: np.ndarray) -> list[tuple[int, int, int]]:
    if len(ep) == 0:
        return []
    change = np.where(np.diff(ep) != 0)[0] + 1
    starts = np.concatenate([[0], change])
    ends = np.concatenate([change, [len(ep)]])
    return list(zip(ep[starts].tolist(), starts.tolist(), ends.tolist()))


def _process_file(path: str, dataset_type: str, gamma: float, failure_reward: float, tasks: dict) -> pa.Table | None:
    if Path(path).stat().st_size == 0:
        raise RuntimeError(f"Corrupted 0-byte parquet file: {path}")
    pf = pq.ParquetFile(path)
    cols = [c for c in _READ_COLUMNS if c in set(pf.schema_arrow.names)]
    table = pq.read_table(path, columns=cols)
    n = table.num_rows
    if n == 0:
        return None
    ep = table.column("episode_index").to_numpy().astype(np.int64, copy=False)
    fr = table.column("frame_index").to_numpy().astype(np.int64, copy=False)
    ok_col = table.column("is_success").to_pylist() if "is_success" in cols else None
    returns = np.empty(n, dtype=np.float32)
    rewards = np.empty(n, dtype=np.float32)
    for _, s, e in _boundaries(ep):
        ok = True if dataset_type == "sft" else bool(ok_col[e - 1])
        returns[s:e], rewards[s:e] = _returns_for_episode(e - s, ok, gamma, failure_reward)
    if "task" in cols:
        prompts = [str(t) for t in table.column("task").to_pylist()]
    elif "task_index" in cols:
        prompts = [tasks.get(int(i), "perform the task") for i in table.column("task_index").to_pylist()]
    else:
        prompts = ["perform the task"] * n
    return pa.table(
        {
            "episode_index": pa.array(ep),
            "frame_index": pa.array(fr),
            "return": pa.array(returns),
            "reward": pa.array(rewards),
            "prompt": pa.array(prompts, type=pa.string()),
        }
    )


def upstream_returns(root: Path, out: Path, dataset_type: str = "rollout", gamma: float = 1.0) -> None:
    files = sorted(str(p) for p in (root / "data").rglob("*.parquet"))
    tasks = _tasks(root)
    tables = []
    with ThreadPoolExecutor(max_workers=min(NUM_WORKERS, len(files))) as pool:
        futs = {pool.submit(_process_file, f, dataset_type, gamma, -300.0, tasks): f for f in files}
        for fut in as_completed(futs):
            t = fut.result()
            if t is not None:
                tables.append(t)
    combined = pa.concat_tables(tables)
    pq.write_table(combined, str(out))
    stats = {}
    for name in ("return", "reward"):
        arr = combined.column(name).to_numpy()
        var = float(arr.astype(np.float64).var())
        stats[name] = {
            "mean": float(arr.mean()),
            "std": math.sqrt(max(var, 0.0)),
            "min": float(arr.min()),
            "max": float(arr.max()),
        }
    stats_path = out.parent / "stats.json"
    doc = json.loads(stats_path.read_text()) if stats_path.exists() else {}
    doc.update(stats)
    stats_path.write_text(json.dumps(doc, indent=4))


def _read_keys(path: str) -> pa.Table:
    return pq.read_table(path, columns=["episode_index", "frame_index"])


def upstream_advantages(
    root: Path, returns: Path, values: Path, out: Path, rmin: float, rmax: float, n_ahead: int = 10
) -> None:
    files = sorted(str(p) for p in (root / "data").rglob("*.parquet"))
    with ThreadPoolExecutor(max_workers=min(NUM_WORKERS, len(files))) as pool:
        keys = pa.concat_tables(list(pool.map(_read_keys, files)))
    ep_all = keys.column("episode_index").to_numpy()
    ret = pq.read_table(returns)
    vals = pq.read_table(values).sort_by([("episode_index", "ascending"), ("frame_index", "ascending")])
    r_ep = ret.column("episode_index").to_numpy()
    if not (
        np.array_equal(np.sort(ep_all, kind="stable"), r_ep) and np.array_equal(vals.column("episode_index"), r_ep)
    ):
        raise SystemExit("sidecar, values and data files disagree")
    g = ret.column("return").to_numpy().astype(np.float64)
    v = vals.column("value").to_numpy()
    width = rmax - rmin
    n = g.size
    out_cols = {k: np.empty(n) for k in ("advantage_continuous", "value_next", "reward_sum", "reward_sum_raw")}
    k_out = np.empty(n, dtype=np.int64)
    for _, s, e in _boundaries(r_ep):  # per episode, vectorised inside (relabel's recompute form)
        ge, ve = g[s:e], v[s:e]
        m = e - s
        t = np.arange(m)
        pad = t + n_ahead >= m
        k = np.minimum(n_ahead, m - t)
        v_next = np.zeros(m)
        v_next[~pad] = ve[n_ahead:]
        r_raw = ge.copy()
        r_raw[~pad] = ge[~pad] - ge[n_ahead:]
        r_norm = r_raw / width
        out_cols["advantage_continuous"][s:e] = r_norm + v_next - ve
        out_cols["value_next"][s:e] = v_next
        out_cols["reward_sum"][s:e] = r_norm
        out_cols["reward_sum_raw"][s:e] = r_raw
        k_out[s:e] = k
    a = out_cols["advantage_continuous"]
    tau = np.percentile(a, (1 - 0.3) * 100)
    table = pa.table(
        {
            "episode_index": ret.column("episode_index"),
            "frame_index": ret.column("frame_index"),
            "advantage_continuous": a,
            "return": g,
            "value_current": v,
            "value_next": out_cols["value_next"],
            "reward_sum": out_cols["reward_sum"],
            "reward_sum_raw": out_cols["reward_sum_raw"],
            "num_valid_rewards": k_out,
            "dataset_name": pa.array([root.name] * n, pa.string()),
            "advantage": a >= tau,
        }
    )
    pq.write_table(table, str(out))


def io_floor(root: Path, out: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from reproduction.data.scan import ordered_map, read_parquet
    from reproduction.recap.returns import repeat_strings
    from reproduction.recap.sidecars import writer_options

    files = sorted((root / "data").glob("*/*.parquet"))
    cols = ["episode_index", "frame_index", "task_index", "is_success"]
    t = pa.concat_tables([r.table for r in ordered_map(lambda p: read_parquet(p, cols), files)]).combine_chunks()
    tasks = _tasks(root)
    fr = t.column("frame_index")
    table = pa.table(
        {
            "episode_index": t.column("episode_index"),
            "frame_index": fr,
            "return": fr.cast(pa.float32()),
            "reward": fr.cast(pa.float32()),
            "prompt": repeat_strings([tasks[i] for i in sorted(tasks)], t.column("task_index").to_numpy()),
        }
    )
    pq.write_table(table, out, **writer_options(table.schema))


def advantages_io_floor(root: Path, returns: Path, values: Path, out: Path) -> None:
    """The floor of stage 3: read what it reads (data keys, the returns sidecar, the values), write
    a table of its output columns once (the writer settings of reproduction/recap/sidecars.py), with
    only elementwise arithmetic in between: no alignment checks, no per-episode work, no threshold."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from reproduction.data.scan import ordered_map, read_parquet
    from reproduction.recap.returns import repeat_strings
    from reproduction.recap.sidecars import writer_options

    files = sorted((root / "data").glob("*/*.parquet"))
    keys = [r.table for r in ordered_map(lambda p: read_parquet(p, ["episode_index", "frame_index"]), files)]
    n = sum(t.num_rows for t in keys)
    ret = pq.read_table(returns, columns=["episode_index", "frame_index", "return"])
    v = pq.read_table(values, columns=["value"]).column("value").to_numpy()
    g = ret.column("return").to_numpy().astype(np.float64)
    a = g - v
    table = pa.table(
        {
            "episode_index": ret.column("episode_index"),
            "frame_index": ret.column("frame_index"),
            "advantage_continuous": a,
            "return": g,
            "value_current": v,
            "value_next": v,
            "reward_sum": g,
            "reward_sum_raw": g,
            "num_valid_rewards": np.full(n, 10, dtype=np.int64),
            "dataset_name": repeat_strings([root.name], np.zeros(n, np.int64)),
            "advantage": a >= 0,
        }
    )
    pq.write_table(table, out, **writer_options(table.schema))


if __name__ == "__main__":
    kind, args = sys.argv[1], [Path(a) for a in sys.argv[2:]]
    if kind == "returns":
        upstream_returns(args[0], args[1])
    elif kind == "advantages":
        upstream_advantages(args[0], args[1], args[2], args[3], float(sys.argv[6]), float(sys.argv[7]))
    elif kind == "advantages-io":
        advantages_io_floor(args[0], args[1], args[2], args[3])
    else:
        io_floor(args[0], args[1])
