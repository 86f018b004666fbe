"""PNG plots people look at after a run (matplotlib, Agg, no pyplot state): <run>/plots/*.png.

    value_episodes.png      predicted value along a few episodes, successes solid green, failures dashed red
    advantages.png          histogram of advantages with the positive-label threshold
    training_curves.png     loss (and other logged scalars) per training stage from metrics.jsonl
    success_rates.png       success rate per task for each evaluated policy / guidance scale, with counts

Each function takes plain arrays or dicts (no stage object), writes one PNG atomically and returns its path.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reproduction.fsio import atomic_write_bytes

SUCCESS = "#1a7f37"
FAILURE = "#cf222e"
PALETTE = ("#0969da", "#8250df", "#bf8700", "#1a7f37", "#cf222e", "#57606a", "#e16f24", "#1b7c83")


def _figure(width: float, height: float):
    from matplotlib.figure import Figure  # lazy: matplotlib costs ~0.3 s to import

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def _save(fig: Any, out: Path) -> Path:
    buf = io.BytesIO()
    # No "Software" chunk: the same data gives the same bytes whatever matplotlib wrote them.
    fig.savefig(buf, format="png", metadata={"Software": None})
    atomic_write_bytes(Path(out), buf.getvalue())
    return Path(out)


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
    fig = _figure(7.5, 4.2)
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
    return _save(fig, out)


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
    fig = _figure(7.5, 4.0)
    ax = fig.add_subplot()
    ax.hist(  # stacked: with per-task thresholds a bin can hold both labels
        [[v for v, p in pairs if not p], [v for v, p in pairs if p]],
        bins=edges,
        stacked=True,
        color=["#8c959f", SUCCESS],
        label=["below threshold", "positive (>= threshold)"],
    )
    for i, (task, tau) in enumerate(sorted(taus.items())):
        name = f"threshold {tau:.4g}" if task == "*" else f"{_short(task, 24)}: {tau:.4g}"
        ax.axvline(tau, color=PALETTE[i % len(PALETTE)] if len(taus) > 1 else "#24292f", lw=1.5, ls="--", label=name)
    ax.set_xlabel("advantage")
    ax.set_ylabel("frames")
    share = 100 * positive_count / len(values)
    ax.set_title(f"{title}: {positive_count}/{len(values)} frames positive ({share:.1f}%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out)


def _records(source: Path | Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    if isinstance(source, (str, Path)):
        from reproduction.train.metrics import read_records  # stdlib-only module; MetricsLog imports torch lazily

        return read_records(Path(source))
    return list(source)


def plot_training_curves(
    logs: Mapping[str, Path | Sequence[Mapping[str, Any]]],
    out: Path,
    *,
    metrics: Sequence[str] | None = None,
) -> Path:
    """One panel per training stage: every logged scalar (or only `metrics`) per split against the step.

    `logs` maps a stage name to its metrics.jsonl (reproduction/train/metrics.py) or to the records
    themselves. Stages with no records are drawn as an empty panel saying so.
    """
    if not logs:
        raise ValueError("plot_training_curves needs at least one stage's metrics")
    fig = _figure(7.5, 3.0 * len(logs))
    axes = fig.subplots(len(logs), 1, squeeze=False)[:, 0]
    for ax, (stage, source) in zip(axes, logs.items()):
        series: dict[str, tuple[list[int], list[float]]] = {}
        for record in _records(source):
            for name, value in record.get("metrics", {}).items():
                if (metrics is None or name in metrics) and isinstance(value, (int, float)) and math.isfinite(value):
                    xs, ys = series.setdefault(f"{record.get('split', 'train')}/{name}", ([], []))
                    xs.append(int(record["step"]))
                    ys.append(float(value))
        for i, (name, (xs, ys)) in enumerate(sorted(series.items())):
            ax.plot(xs, ys, "-o" if len(xs) < 30 else "-", ms=3, color=PALETTE[i % len(PALETTE)], label=name)
        if not series:
            ax.text(0.5, 0.5, "no metrics logged", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(f"{stage} training")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if series:
            ax.legend(fontsize=8)
    return _save(fig, out)


def _short(task: str, width: int = 28) -> str:
    return task if len(task) <= width else task[: width - 1] + "…"


def _entry_name(entry: Mapping[str, Any]) -> str:
    policy = entry["policy"]
    scale = policy.get("guidance_scale")
    return (
        policy["label"]
        if scale is None or f"cfg={scale:g}" in policy["label"]
        else f"{policy['label']} (cfg={scale:g})"
    )


def plot_success_rates(
    evidence: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    out: Path,
    *,
    metric: str = "success_once",
    title: str = "Success rate per task",
) -> Path:
    """Grouped bars: per task (and overall), one bar per evaluated policy / guidance scale, labelled k/n.

    `evidence` is one evaluation evidence document (its primary and baselines are drawn) or several
    (e.g. one per guidance scale). Error bars are one binomial standard error.
    """
    docs = [evidence] if isinstance(evidence, Mapping) else list(evidence)
    entries = [e for d in docs for e in (d, *d.get("baselines", []))]
    if not entries:
        raise ValueError("plot_success_rates needs at least one evaluation")
    tasks = sorted({t for e in entries for t in e["tasks"]})
    groups = [*tasks, "all tasks"]
    fig = _figure(max(7.5, 2.2 * len(groups) + 1), 4.4)
    ax = fig.add_subplot()
    width = 0.8 / len(entries)
    for i, entry in enumerate(entries):
        counts = [entry["tasks"].get(t, {}).get(metric) for t in tasks] + [entry["metrics"].get(metric)]
        xs = [g + (i - (len(entries) - 1) / 2) * width for g in range(len(groups))]
        rates = [c["rate"] if c else 0.0 for c in counts]
        errs = [math.sqrt(c["rate"] * (1 - c["rate"]) / c["episodes"]) if c and c["episodes"] else 0 for c in counts]
        bars = ax.bar(
            xs, rates, width * 0.92, yerr=errs, capsize=3, color=PALETTE[i % len(PALETTE)], label=_entry_name(entry)
        )
        for bar, c, err in zip(bars, counts, errs):
            text = f"{c['successes']}/{c['episodes']}" if c else "n/a"
            top = (bar.get_x() + bar.get_width() / 2, bar.get_height() + err)
            ax.annotate(text, top, xytext=(0, 3), textcoords="offset points", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(groups)), [_short(g) for g in groups], fontsize=8)
    ax.set_ylim(0, 1.2)
    ax.set_ylabel(metric.replace("_", " ") + " rate")
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", ncols=min(4, len(entries)))
    return _save(fig, out)
