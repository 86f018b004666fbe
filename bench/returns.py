"""Bench stage 1 on a 1M-frame, 5,000-episode metadata table against upstream's per-episode Python loop.

Prints: the loop and vectorised times, the I/O anchor (read the input columns + write the output
columns) against the full stage (read + compute + write sidecar), and last the main speedup as
`ratio: X.XX (goal >= 50x vs per-episode loop)`. Every figure, anchor and ours alike, is the best of
REPEAT runs (the machine is shared, so the minimum is the least disturbed run); CPU-time
(time.process_time) ratios are printed too, as a second view less sensitive to other processes.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from _timing import REPEAT, best  # noqa: E402

from reproduction.recap.returns import ReturnsConfig, compute_returns_table  # noqa: E402

FRAMES, EPISODES = 1_000_000, 5_000


def make_table(seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.choice(np.arange(1, FRAMES), EPISODES - 1, replace=False))
    lengths = np.diff(np.concatenate([[0], cuts, [FRAMES]]))
    ep = np.repeat(np.arange(EPISODES, dtype=np.int64), lengths)
    fr = np.concatenate([np.arange(n) for n in lengths]).astype(np.int64)
    ok = np.repeat(rng.random(EPISODES) < 0.6, lengths)
    return pa.table({"episode_index": ep, "frame_index": fr, "task_index": ep % 10, "is_success": ok})


def loop_returns(table: pa.Table, gamma: float, failure_reward: float, tasks: dict[int, str]) -> dict:
    """Upstream's shape: find each episode's run, then a per-frame backward loop in float32."""
    ep = table.column("episode_index").to_numpy()
    fr = table.column("frame_index").to_numpy()
    ti = table.column("task_index").to_numpy()
    ok = table.column("is_success").to_numpy(zero_copy_only=False)
    out = {"episode_index": [], "frame_index": [], "return": [], "reward": [], "prompt": []}
    start = 0
    n = len(ep)
    while start < n:
        end = start
        while end < n and ep[end] == ep[start]:
            end += 1
        length = end - start
        success = bool(ok[end - 1])
        rewards = np.full(length, -1.0, dtype=np.float32)
        rewards[-1] = 0.0 if success else failure_reward
        returns = np.zeros(length, dtype=np.float32)
        g = 0.0
        for t in reversed(range(length)):
            g = rewards[t] + gamma * g
            returns[t] = g
        out["episode_index"].extend(ep[start:end].tolist())
        out["frame_index"].extend(fr[start:end].tolist())
        out["return"].extend(returns.tolist())
        out["reward"].extend(rewards.tolist())
        out["prompt"].extend(tasks[int(t)] for t in ti[start:end])
        start = end
    return out


def main() -> None:
    table = make_table()
    tasks = {i: f"task number {i}" for i in range(10)}
    cfg = ReturnsConfig(dataset_type="rollout", gamma=1.0, failure_reward=-300.0)
    ours = compute_returns_table(table, cfg, tasks=tasks)
    ref = loop_returns(table, 1.0, -300.0, tasks)
    assert np.allclose(ours.column("return").to_numpy(), np.asarray(ref["return"]), atol=1e-3)
    (t_loop, c_loop), (t_ours, c_ours) = (
        best(lambda: loop_returns(table, 1.0, -300.0, tasks)),
        best(lambda: compute_returns_table(table, cfg, tasks=tasks)),
    )
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "data.parquet", Path(tmp) / "returns.parquet"
        pq.write_table(table, src)

        def io_only() -> None:
            t = pq.read_table(src, columns=["episode_index", "frame_index", "task_index", "is_success"])
            pq.write_table(ours, dst, compression="zstd")  # the same output columns, nothing computed
            del t

        def full_stage() -> None:
            t = pq.read_table(src, columns=["episode_index", "frame_index", "task_index", "is_success"])
            pq.write_table(compute_returns_table(t, cfg, tasks=tasks), dst, compression="zstd")

        (t_io, c_io), (t_full, c_full) = best(io_only), best(full_stage)
    g = ReturnsConfig(dataset_type="rollout", gamma=0.99)
    t_g, _ = best(lambda: compute_returns_table(table, g, tasks=tasks))
    print(f"frames {FRAMES:,}, episodes {EPISODES:,}, best of {REPEAT}")
    print(f"per-episode loop: {t_loop:.3f} s; vectorised: {t_ours:.4f} s (gamma 0.99: {t_g:.4f} s)")
    print(
        f"io anchor (read + write same columns): {t_io:.3f} s; full stage: {t_full:.3f} s; "
        f"stage/io: {t_full / t_io:.2f}x (goal <= 2x)"
    )
    print(
        f"cpu time: loop {c_loop:.3f} s, ours {c_ours:.4f} s, speedup {c_loop / max(c_ours, 1e-9):.2f}x; "
        f"io {c_io:.3f} s, stage {c_full:.3f} s, stage/io {c_full / max(c_io, 1e-9):.2f}x"
    )
    print(f"ratio: {t_loop / t_ours:.2f} (goal >= 50x vs per-episode loop)")


if __name__ == "__main__":
    main()
