"""PNG plots people look at after a run (matplotlib, Agg, no pyplot state): <run>/plots/*.png.

    value_episodes.png      predicted value along a few episodes, successes solid green, failures dashed red
    advantages.png          histogram of advantages with the positive-label threshold
    training_curves.png     a row per training stage, a panel per metric (loss, value error, ...) from metrics.jsonl
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


CURVE_METRICS = ("loss", "value_error", "value_spearman", "grad_norm", "positive_label_fraction")
"""The metric families a training-curves panel is drawn for by default (when a stage logs them)."""
MAX_PANELS = 4
"""Panels per stage row at most."""
_SPLIT_STYLE = {"train": "-", "eval": "--"}


def _curves(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, tuple[list[int], list[float]]]]:
    """{metric family: {split: (steps, values)}} of train/eval records. A family is the name after the last
    "/": an eval's per-dataset "rollout.heldout/loss" counts only when no overall "loss" was logged."""
    out: dict[str, dict[str, tuple[list[int], list[float]]]] = {}
    overall = {(r.get("split"), n) for r in records for n in r.get("metrics", {}) if "/" not in n}
    for record in records:
        split = record.get("split", "train")
        if split not in _SPLIT_STYLE:
            continue  # checkpoint timings and the like
        for name, value in record.get("metrics", {}).items():
            family = name.rsplit("/", 1)[-1]
            if "/" in name and (split, family) in overall:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                continue
            label = split if "/" not in name else f"{split} {name.rsplit('/', 1)[0]}"
            xs, ys = out.setdefault(family, {}).setdefault(label, ([], []))
            xs.append(int(record["step"]))
            ys.append(float(value))
    return out


def plot_training_curves(
    logs: Mapping[str, Path | Sequence[Mapping[str, Any]]],
    out: Path,
    *,
    metrics: Sequence[str] | None = None,
) -> Path:
    """One row per training stage, one panel per metric family (loss, value error, ...), one line per run of
    the stage (fold model, policy mode; the colour) and split (train solid, eval dashed); each row's legend
    stands in a column of its own, right of its panels.

    `logs` maps "stage" or "stage/run" (e.g. "value/model_0", "policy/recap") to its metrics.jsonl
    (reproduction/train/metrics.py) or to the records themselves. `metrics`: the families to draw (default
    CURVE_METRICS that the stage logged, else its first MAX_PANELS families). A stage with no records is
    drawn as a panel saying so.
    """
    return _save(training_curves_figure(logs, metrics=metrics), out)


def training_curves_figure(
    logs: Mapping[str, Path | Sequence[Mapping[str, Any]]], *, metrics: Sequence[str] | None = None
) -> Any:
    """The matplotlib Figure `plot_training_curves` saves (same arguments); ValueError without logs."""
    if not logs:
        raise ValueError("plot_training_curves needs at least one stage's metrics")
    from matplotlib.lines import Line2D

    stages: dict[str, dict[str, dict[str, dict[str, tuple[list[int], list[float]]]]]] = {}
    for key, source in logs.items():
        stage, _, run = key.partition("/")
        stages.setdefault(stage, {})[run] = _curves(_records(source))
    rows = []
    for stage, runs in stages.items():
        logged = sorted({f for curves in runs.values() for f in curves})
        wanted = list(metrics) if metrics is not None else [f for f in CURVE_METRICS if f in logged] or logged
        rows.append((stage, runs, [f for f in wanted if f in logged][:MAX_PANELS]))
    ncols = max(1, *(len(families) for _, _, families in rows))
    fig = _figure(2.9 * ncols + 1.5, 2.6 * len(rows))  # ~1300 px for 4 panels: legible at the report's 1100
    # A last, narrow column holds each row's legend, so no legend covers a curve and the panels align.
    grid = fig.subplots(len(rows), ncols + 1, squeeze=False, gridspec_kw={"width_ratios": [1.0] * ncols + [0.5]})
    axes = grid[:, :ncols]
    for r, (stage, runs, families) in enumerate(rows):
        colours = {run: PALETTE[i % len(PALETTE)] for i, run in enumerate(runs)}
        splits: set[str] = set()
        grid[r, ncols].set_axis_off()
        for c, ax in enumerate(axes[r]):
            if c >= max(1, len(families)):
                ax.set_axis_off()
                continue
            if not families:
                ax.text(0.5, 0.5, "no metrics logged", ha="center", va="center", transform=ax.transAxes)
                ax.set_title(f"{stage} training", fontsize=10)
                continue
            family = families[c]
            for run, curves in runs.items():
                for label, (xs, ys) in sorted(curves.get(family, {}).items()):
                    split = label.split()[0]
                    splits.add(split)
                    ax.plot(xs, ys, _SPLIT_STYLE[split], marker="o" if len(xs) < 30 else None, ms=3, color=colours[run])
            _min_span(
                ax, [y for curves in runs.values() for _, ys in curves.get(family, {}).values() for y in ys], family
            )
            ax.set_title(f"{stage}: {family.replace('_', ' ')}", fontsize=10)
            ax.set_xlabel("step", fontsize=9)
            ax.tick_params(labelsize=8)
            ax.grid(alpha=0.3)
        handles = [Line2D([], [], color=colours[run], lw=2, label=run or stage) for run in runs if len(runs) > 1]
        handles += [Line2D([], [], color="#57606a", ls=_SPLIT_STYLE[s], label=s) for s in sorted(splits)]
        if families and handles:
            grid[r, ncols].legend(handles=handles, loc="upper left", fontsize=9, frameon=False, borderaxespad=0.0)
    return fig


BOUNDED_FAMILIES = {"value_spearman": 0.2, "positive_label_fraction": 0.2, "cat_acc_best": 0.2}
"""Families on a fixed scale ([-1, 1] or [0, 1]) and the least y-span their panel shows."""


def _min_span(ax: Any, ys: list[float], family: str) -> None:
    """Widen a panel whose values barely move (two Spearman points 0.003 apart) to a least span, so a tiny
    difference does not fill the axis and look large; other families get 5% of their magnitude."""
    if not ys:
        return
    lo, hi = min(ys), max(ys)
    span = BOUNDED_FAMILIES.get(family, 0.05 * max(abs(lo), abs(hi), 1e-12))
    if hi - lo < span:
        mid = (lo + hi) / 2
        ax.set_ylim(mid - span / 2, mid + span / 2)


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
    (e.g. one per guidance scale). Error bars are the Wilson 95% interval (reproduction.run.stats.wilson),
    which stays inside [0, 1] at 0/n and n/n, where a standard error collapses to zero.
    """
    from reproduction.run.stats import wilson

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
        cis = [wilson(c["successes"], c["episodes"]) if c and c["episodes"] else (r, r) for c, r in zip(counts, rates)]
        errs = [[r - lo for r, (lo, _) in zip(rates, cis)], [hi - r for r, (_, hi) in zip(rates, cis)]]
        bars = ax.bar(
            xs, rates, width * 0.92, yerr=errs, capsize=3, color=PALETTE[i % len(PALETTE)], label=_entry_name(entry)
        )
        for bar, c, err in zip(bars, counts, errs[1]):
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
