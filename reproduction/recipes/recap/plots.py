"""RECAP's plots (matplotlib, Agg): <run>/plots/*.png from its value and advantage stages.

    value_episodes.png      predicted value along a few episodes, successes solid green, failures dashed red
    advantages.png          histogram of advantages with the positive-label threshold

Drawn and written with run/plots.py's `figure` and `save` (the same PNG bytes for the same data); each function
takes plain arrays or dicts, writes one PNG atomically and returns its path.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from reproduction.run.plots import FAILURE, PALETTE, SUCCESS, figure, save, short


@dataclass(kw_only=True, slots=True, frozen=True)
class EpisodeTrace:
    """The value model's predictions along one episode."""

    values: Sequence[float]
    """Predicted value per frame."""
    success: bool
    """The episode's outcome."""
    label: str = ""
    """Legend text, e.g. "episode 12"."""
    returns: Sequence[float] | None = None
    """The Monte-Carlo return per frame the value was trained on (drawn thin), when known."""


def pick_episodes(
    episode_index: Sequence[int],
    values: Sequence[float],
    success: Mapping[int, bool],
    *,
    returns: Sequence[float] | None = None,
    per_outcome: int = 2,
) -> list[EpisodeTrace]:
    """Up to `per_outcome` successful and `per_outcome` failed episodes (lowest indices first) as traces.

    `episode_index`, `values` (and `returns`) are per-frame columns in frame order (a value inference
    output and a returns sidecar); `success` maps an episode to its outcome (its last row's is_success).
    """
    if len(episode_index) != len(values) or (returns is not None and len(returns) != len(values)):
        raise ValueError("episode_index, values and returns must have one entry per frame")
    rows: dict[int, list[int]] = {}
    for row, ep in enumerate(episode_index):
        rows.setdefault(int(ep), []).append(row)
    chosen = [ep for ep in sorted(rows) if success.get(ep)][:per_outcome]
    chosen += [ep for ep in sorted(rows) if ep in success and not success[ep]][:per_outcome]
    return [
        EpisodeTrace(
            values=[float(values[r]) for r in rows[ep]],
            success=bool(success[ep]),
            label=f"episode {ep}",
            returns=None if returns is None else [float(returns[r]) for r in rows[ep]],
        )
        for ep in chosen
    ]


def plot_value_episodes(episodes: Sequence[EpisodeTrace], out: Path, *, title: str = "Value along episodes") -> Path:
    """One line per episode over its frames; raises ValueError for no episodes or an empty one."""
    if not episodes or any(len(e.values) == 0 for e in episodes):
        raise ValueError("plot_value_episodes needs at least one episode, each with at least one value")
    fig = figure(7.5, 4.2)
    ax = fig.add_subplot()
    for i, ep in enumerate(episodes):
        colour = SUCCESS if ep.success else FAILURE
        style = "-" if ep.success else "--"
        name = ep.label or f"episode {i}"
        ax.plot(
            range(len(ep.values)),
            ep.values,
            style,
            color=colour,
            lw=1.8,
            label=f"{name} ({'success' if ep.success else 'failure'})",
        )
        if ep.returns is not None:
            ax.plot(range(len(ep.returns)), ep.returns, ":", color=colour, lw=1.0, alpha=0.7)
    ax.set_xlabel("frame")
    ax.set_ylabel("predicted value")
    ax.set_title(title + ("  (dotted: return targets)" if any(e.returns is not None for e in episodes) else ""))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return save(fig, out)


def plot_advantage_histogram(
    advantages: Sequence[float],
    threshold: float | Mapping[str, float],
    out: Path,
    *,
    positive: Sequence[bool] | None = None,
    bins: int = 60,
    title: str = "Advantages",
) -> Path:
    """Histogram of the advantages, frames labelled positive in green, a dashed line per threshold.

    `threshold`: one value, or the advantage stage's table ({"*": tau} or {task: tau}); `positive`:
    the per-frame labels (needed to colour per-task thresholds; default: advantage >= the one threshold).
    """
    taus = (
        {"*": float(threshold)} if isinstance(threshold, (int, float)) else {k: float(v) for k, v in threshold.items()}
    )
    if not taus:
        raise ValueError("plot_advantage_histogram needs a threshold")
    if positive is None:
        if len(taus) != 1:
            raise ValueError("per-task thresholds need the per-frame labels (positive=...)")
        positive = [float(a) >= next(iter(taus.values())) for a in advantages]
    if len(positive) != len(advantages):
        raise ValueError("positive must have one label per advantage")
    pairs = [(float(a), bool(p)) for a, p in zip(advantages, positive) if not math.isnan(float(a))]
    if not pairs:
        raise ValueError("plot_advantage_histogram needs at least one finite advantage")
    values = [v for v, _ in pairs]
    lo, hi = min(values + list(taus.values())), max(values + list(taus.values()))
    if hi == lo:
        lo, hi = lo - 0.5, hi + 0.5
    edges = [lo + (hi - lo) * i / bins for i in range(bins + 1)]
    positive_count = sum(p for _, p in pairs)
    fig = figure(7.5, 4.0)
    ax = fig.add_subplot()
    # Stage 3 forces some frames positive whatever their advantage (sft and hold labels): with one threshold
    # they are drawn apart, so no "positive" bar sits left of the line the caption calls the threshold.
    one = next(iter(taus.values())) if len(taus) == 1 else None
    forced = [v for v, p in pairs if p and one is not None and v < one]
    stacks = [[v for v, p in pairs if not p], [v for v, p in pairs if p and (one is None or v >= one)]]
    names = ["labelled negative", "labelled positive" if one is None else "positive: at or above the threshold"]
    colours = ["#8c959f", SUCCESS]
    if forced:
        stacks.append(forced)
        names.append("positive below the threshold (forced: sft/hold labels)")
        colours.append("#a5d6a7")
    ax.hist(stacks, bins=edges, stacked=True, color=colours, label=names)  # stacked: a bin can hold several
    for i, (task, tau) in enumerate(sorted(taus.items())):
        name = f"threshold {tau:.4g}" if task == "*" else f"{short(task, 24)}: {tau:.4g}"
        ax.axvline(tau, color=PALETTE[i % len(PALETTE)] if len(taus) > 1 else "#24292f", lw=1.5, ls="--", label=name)
    ax.set_xlabel("advantage")
    ax.set_ylabel("frames")
    share = 100 * positive_count / len(values)
    ax.set_title(f"{title}: {positive_count}/{len(values)} frames positive ({share:.1f}%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save(fig, out)
