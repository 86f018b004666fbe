"""Bench stage-3 labelling from given values on a 1M-frame, 5,000-episode table vs a per-frame Python loop.

The loop is upstream's Phase 2 shape (per frame: episode end, pad, window, normalise, and the same
output columns ours writes: value_next, reward_sum, reward_sum_raw, num_valid_rewards) plus its
percentile threshold. Both sides are timed as the best of REPEAT runs (the machine is shared; the
minimum is the least disturbed run), and a CPU-time (time.process_time) ratio is printed as a second
view. Last line: `ratio: X.XX (goal >= 100x vs per-frame loop)` from best-of-REPEAT wall times.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
from _timing import REPEAT, best  # noqa: E402

from reproduction.recap.advantages import label, nstep_advantages, thresholds_by_task  # noqa: E402
from reproduction.recap.normalize import ReturnRange  # noqa: E402
from reproduction.recap.returns import episode_bounds, episode_ends, episode_returns  # noqa: E402

FRAMES, EPISODES, N = 1_000_000, 5_000, 10


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


def main() -> None:
    ep, lengths, row_end, rewards, returns, values = make_inputs()
    rr = ReturnRange(return_min=float(returns.min()), return_max=0.0)

    def ours():  # like the loop, from the episode lengths (the per-row ends are not needed at gamma 1)
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
    t_loop, c_loop = best(lambda: loop_advantages(lengths, returns, rewards, values, rr))
    t_ours, c_ours = best(ours)
    t_g, _ = best(
        lambda: nstep_advantages(
            row_end, returns, rewards, values, lookahead=N, gamma=0.99, discount_next_value=True, return_range=rr
        )
    )
    print(f"frames {FRAMES:,}, episodes {EPISODES:,}, N {N}")
    print(
        f"per-frame loop: {t_loop:.3f} s; vectorised: {t_ours:.4f} s (gamma 0.99 general case: {t_g:.4f} s), "
        f"best of {REPEAT}"
    )
    print(f"cpu time: loop {c_loop:.3f} s, ours {c_ours:.4f} s, speedup {c_loop / max(c_ours, 1e-9):.2f}x")
    print(f"ratio: {t_loop / t_ours:.2f} (goal >= 100x vs per-frame loop)")


if __name__ == "__main__":
    main()
