"""Bench stage 3 (labelling from given values): the whole stage in fresh processes against an upstream-style run.

Layouts, 1M frames in 5,000 episodes (BENCH_FRAMES / BENCH_EPISODES scale them down): v2.1 with one
data parquet per episode (5,000 files) and v3.0 with one data parquet. Stage 1 runs first (as in a
pipeline: it leaves the sidecar and the fingerprint cache), then per layout, in fresh processes
(interpreter start included), alternated over REPEAT rounds, best round kept:
  upstream   bench/_upstream.py advantages: the episode boundaries read per data file on a thread
             pool of 8, the returns sidecar and the values read, a per-episode loop (vectorised
             inside, as RLinf's relabel recompute), the percentile threshold, one write
  ours       load_dataset_arrays + compute_advantages (fingerprint checked through the stat cache,
             sidecar checked and streamed, values aligned by key, sidecar + mixture_config.yaml)
  io         bench/_upstream.py advantages-io: the same reads and one write of the same columns, with
             no work between them (the ceiling: upstream/io is the most any implementation can reach)
The outputs are asserted column for column equal. Also printed: ours with a cold fingerprint cache
(every data file read once for the digest), and today's in-memory per-frame loop against the
vectorised math. Last line: `ratio: X.XX (goal >= 3x vs upstream-style anchor, worse layout)`.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from _datasets import write_v21, write_v30  # noqa: E402
from _timing import REPEAT, alternate, best, child_env, machine_note, run_process  # noqa: E402

from reproduction.recap.advantages import label, nstep_advantages, thresholds_by_task  # noqa: E402
from reproduction.recap.normalize import ReturnRange  # noqa: E402
from reproduction.recap.returns import episode_bounds, episode_ends, episode_returns  # noqa: E402

FRAMES = int(os.environ.get("BENCH_FRAMES", 1_000_000))
EPISODES = int(os.environ.get("BENCH_EPISODES", 5_000))
N = 10
OURS = """
import sys
from pathlib import Path
from reproduction.recap.advantage_inputs import load_dataset_arrays
from reproduction.recap.advantages import AdvantageConfig, compute_advantages
from reproduction.recap.normalize import ReturnRange
root, run, values, out = (Path(a) for a in sys.argv[1:5])
inputs = [load_dataset_arrays(root, run, values, dataset_type="rollout", returns_tag=None)]
rr = ReturnRange(return_min=float(sys.argv[5]), return_max=0.0)
compute_advantages(inputs, AdvantageConfig(lookahead=10), rr, out_dirs=[out])
"""


def make_inputs(seed: int = 0):
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.choice(np.arange(1, FRAMES), EPISODES - 1, replace=False))
    lengths = np.diff(np.concatenate([[0], cuts, [FRAMES]]))
    ep = np.repeat(np.arange(EPISODES), lengths)
    row_end = episode_ends(ep)[1]
    returns, rewards = episode_returns(*episode_bounds(ep), rng.random(EPISODES) < 0.6, -300.0, 1.0)
    returns, rewards = returns.astype(np.float64), rewards.astype(np.float64)  # as read from the sidecar
    values = rng.uniform(-1, 0, FRAMES)
    return ep, lengths, row_end, rewards, returns, values


def loop_advantages(lengths, returns, rewards, values, rr, gamma=1.0):
    """Upstream's Phase 2 per frame, producing the same columns ours does (RECAP.md section 3)."""
    ends = list(np.cumsum(lengths))
    episode_of = np.repeat(np.arange(len(lengths)), lengths)
    out = {
        "advantage_continuous": np.empty(FRAMES),
        "value_next": np.empty(FRAMES),
        "reward_sum": np.empty(FRAMES),
        "reward_sum_raw": np.empty(FRAMES),
        "num_valid_rewards": np.empty(FRAMES, dtype=np.int64),
    }
    for g in range(FRAMES):
        end = ends[episode_of[g]]
        pad = g + N >= end
        k = min(N, end - g)
        v_next = 0.0 if pad else float(values[g + N])
        if gamma == 1.0:
            r = float(returns[g]) if pad else float(returns[g]) - float(returns[g + N])
        else:
            r = sum(gamma**j * float(rewards[g + j]) for j in range(k))
        r_norm = r / rr.width
        out["advantage_continuous"][g] = r_norm + (gamma**k) * v_next - float(values[g])
        out["value_next"][g] = v_next
        out["reward_sum"][g] = r_norm
        out["reward_sum_raw"][g] = r
        out["num_valid_rewards"][g] = k
    a = out["advantage_continuous"]
    tau = np.percentile(a, 70)
    return a, a >= tau


def in_memory() -> None:
    """Today's in-memory figures: upstream's per-frame Phase 2 loop against the vectorised math."""
    ep, lengths, row_end, rewards, returns, values = make_inputs()
    rr = ReturnRange(return_min=float(returns.min()), return_max=0.0)

    def ours():
        a = nstep_advantages(
            row_end,
            returns,
            rewards,
            values,
            lookahead=N,
            gamma=1.0,
            discount_next_value=True,
            return_range=rr,
            episode_end=np.cumsum(lengths),
        )["advantage_continuous"]
        tau, _ = thresholds_by_task(a, None, 0.3, "global")
        return a, label(a, tau, "rollout")

    ref_a, ref_l = loop_advantages(lengths, returns, rewards, values, rr)
    a, lab = ours()
    assert np.allclose(a, ref_a) and (lab == ref_l).all()
    t_loop, _ = best(lambda: loop_advantages(lengths, returns, rewards, values, rr), repeat=min(REPEAT, 3))
    t_ours, _ = best(ours)
    print(
        f"in memory, {FRAMES:,} frames: per-frame loop {t_loop:.3f} s, vectorised {t_ours:.4f} s "
        f"({t_loop / t_ours:.0f}x)"
    )


def same_columns(ours: Path, upstream: Path) -> None:
    a = pq.read_table(ours).replace_schema_metadata(None)
    b = pq.read_table(upstream)
    assert a.column_names == b.column_names, (a.column_names, b.column_names)
    for name in a.column_names:
        want = a.column(name).combine_chunks()
        got = b.column(name).combine_chunks().cast(a.schema.field(name).type)
        assert want.equals(got), name


def layout(name: str, root: Path, tmp: Path) -> float:
    """upstream / ours (best-of-REPEAT wall times) on one layout, printed."""
    from reproduction.recap.returns import ReturnsConfig, compute_returns

    cache = tmp / "cache"
    env = child_env(PORTABLE_CACHE_DIR=str(cache))
    os.environ["PORTABLE_CACHE_DIR"] = str(cache)
    [res] = compute_returns([root], tmp / "run", ReturnsConfig(dataset_type="rollout"))  # stage 1, as a pipeline
    sidecar = pq.read_table(res.sidecar, columns=["episode_index", "frame_index"])
    values = tmp / "values.parquet"
    rng = np.random.default_rng(1)
    pq.write_table(sidecar.append_column("value", pa.array(rng.uniform(-1, 0, sidecar.num_rows))), values)
    rmin = str(res.stats["return"]["min"])
    py = sys.executable
    ours_args = [py, "-c", OURS, str(root), str(tmp / "run"), str(values), str(tmp / "ours"), rmin]
    up_args = [py, str(BENCH / "_upstream.py"), "advantages", str(root), str(res.sidecar), str(values)]
    up_args += [str(tmp / "up.parquet"), rmin, "0.0"]
    io_args = [py, str(BENCH / "_upstream.py"), "advantages-io", str(root), str(res.sidecar), str(values)]
    io_args += [str(tmp / "io.parquet")]
    t = alternate(
        {
            "upstream": lambda: run_process(up_args, env),
            "ours": lambda: run_process(ours_args, env),
            "io": lambda: run_process(io_args, env),
        }
    )
    same_columns(tmp / "ours" / "advantages.parquet", tmp / "up.parquet")
    shutil.rmtree(cache)
    t0 = time.perf_counter()
    run_process(ours_args, env)  # one run with a cold fingerprint cache: each data file read once
    cold = time.perf_counter() - t0
    files = len(list((root / "data").glob("*/*.parquet")))
    print(
        f"{name} ({files:,} data files): upstream-style {t['upstream']:.2f} s, ours {t['ours']:.2f} s "
        f"(fingerprint cache cold, one run: {cold:.2f} s); upstream/ours {t['upstream'] / t['ours']:.2f}x "
        f"(goal >= 3x); columns identical"
    )
    print(
        f"{name}: io floor {t['io']:.2f} s (process start, the same reads, one write of the same columns): "
        f"ours/io {t['ours'] / t['io']:.2f}x; upstream/io {t['upstream'] / t['io']:.2f}x is the most any "
        f"implementation reading and writing these columns could reach against this anchor"
    )
    return t["upstream"] / t["ours"]


def main() -> None:
    print(f"machine: {machine_note()}; best of {REPEAT} alternated rounds, process start included")
    in_memory()
    ratios = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name, make in (
            ("v2.1", lambda r: write_v21(r, FRAMES, EPISODES)),
            ("v3.0", lambda r: write_v30(r, FRAMES, EPISODES, files=1)),
        ):
            work = tmp / name
            work.mkdir()
            ratios[name] = layout(name, make(work / "ds"), work)
    print(f"machine after: {machine_note()}")
    print(f"ratio: {min(ratios.values()):.2f} (goal >= 3x vs upstream-style anchor, worse of v2.1 / v3.0)")


if __name__ == "__main__":
    main()
