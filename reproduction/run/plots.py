"""PNG plots people look at after a run (matplotlib, Agg, no pyplot state): <run>/plots/*.png.

    training_curves.png     a row per training stage, a panel per metric (loss, value error, ...) from metrics.jsonl
    success_rates.png       success rate per task for each evaluated policy / guidance scale, with counts

Each function takes plain arrays or dicts (no stage object), writes one PNG atomically and returns its path.
A recipe's own plots (RECAP's value and advantage plots: reproduction/recipes/recap/plots.py) draw with `figure`
and write with `save`.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from reproduction.fsio import atomic_write_bytes

SUCCESS = "#1a7f37"
FAILURE = "#cf222e"
PALETTE = ("#0969da", "#8250df", "#bf8700", "#1a7f37", "#cf222e", "#57606a", "#e16f24", "#1b7c83")
_HATCHES = ("", "//", "..", "xx", "\\\\", "++")


def policy_colours(names: Iterable[str]) -> dict[str, str]:
    """The one colour of each policy (by name: "recap", "bc", "grpo", "sft") in every plot of a run's report: PALETTE
    in the names' sorted order. A recipe's report calls it once with all its policies and hands the mapping to each
    plot (`colours=`), so a policy drawn in the training curves and in the success rates has the same colour there
    (each plot once numbered its own lines and bars, audit56 F3)."""
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(sorted(set(names)))}


def figure(width: float, height: float):
    from matplotlib.figure import Figure  # lazy: matplotlib costs ~0.3 s to import

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def save(fig: Any, out: Path) -> Path:
    buf = io.BytesIO()
    # No "Software" chunk: the same data gives the same bytes whatever matplotlib wrote them.
    fig.savefig(buf, format="png", metadata={"Software": None})
    atomic_write_bytes(Path(out), buf.getvalue())
    return Path(out)


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
    colours: Mapping[str, str] | None = None,
) -> Path:
    """One row per training stage, one panel per metric family (loss, value error, ...), one line per run of
    the stage (fold model, policy mode; the colour) and split (train solid, eval dashed); each row's legend
    stands in a column of its own, right of its panels.

    `logs` maps "stage" or "stage/run" (e.g. "value/model_0", "policy/recap") to its metrics.jsonl
    (reproduction/train/metrics.py) or to the records themselves. `metrics`: the families to draw (default
    CURVE_METRICS that the stage logged, else its first MAX_PANELS families). A stage with no records is
    drawn as a panel saying so. `colours`: the colour of a `logs` key's lines (a policy's, from `policy_colours`);
    the runs of a stage it does not name take PALETTE in their order.
    """
    return save(training_curves_figure(logs, metrics=metrics, colours=colours), out)


def training_curves_figure(
    logs: Mapping[str, Path | Sequence[Mapping[str, Any]]],
    *,
    metrics: Sequence[str] | None = None,
    colours: Mapping[str, str] | None = None,
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
    fig = figure(2.9 * ncols + 1.5, 2.6 * len(rows))  # ~1300 px for 4 panels: legible at the report's 1100
    # A last, narrow column holds each row's legend, so no legend covers a curve and the panels align.
    grid = fig.subplots(len(rows), ncols + 1, squeeze=False, gridspec_kw={"width_ratios": [1.0] * ncols + [0.5]})
    axes = grid[:, :ncols]
    for r, (stage, runs, families) in enumerate(rows):
        given = colours or {}
        hue = {
            run: given.get(f"{stage}/{run}" if run else stage, PALETTE[i % len(PALETTE)]) for i, run in enumerate(runs)
        }
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
                    ax.plot(xs, ys, _SPLIT_STYLE[split], marker="o" if len(xs) < 30 else None, ms=3, color=hue[run])
            _min_span(
                ax, [y for curves in runs.values() for _, ys in curves.get(family, {}).values() for y in ys], family
            )
            ax.set_title(f"{stage}: {family.replace('_', ' ')}", fontsize=10)
            ax.set_xlabel("step", fontsize=9)
            ax.tick_params(labelsize=8)
            ax.grid(alpha=0.3)
        handles = [Line2D([], [], color=hue[run], lw=2, label=run or stage) for run in runs if len(runs) > 1]
        handles += [Line2D([], [], color="#57606a", ls=_SPLIT_STYLE[s], label=s) for s in sorted(splits)]
        if families and handles:
            grid[r, ncols].legend(handles=handles, loc="upper left", fontsize=9, frameon=False, borderaxespad=0.0)
    return fig


BOUNDED_FAMILIES = {"value_spearman": 0.2, "positive_label_fraction": 0.2, "cat_acc_best": 0.2}
"""Families on a fixed scale ([-1, 1] or [0, 1]) and the least y-span their panel shows."""


def _min_span(ax: Any, ys: list[float], family: str) -> None:
    """Widen a panel whose values barely move (two Spearman points 0.003 apart) to a least span, so a tiny
    difference does not fill the axis and look large: a bounded family (also any rate: a family naming
    success, `*_rate`, `*_fraction`) by its BOUNDED_FAMILIES span (0.2 for a rate), others by 5% of their magnitude,
    and an all-zero series by 1 (5% of nothing drew a GRPO demo's 0.0 success on a "1e-14" axis: audit55 I3)."""
    if not ys:
        return
    lo, hi = min(ys), max(ys)
    rate = "success" in family or family.endswith(("_rate", "_fraction"))
    magnitude = max(abs(lo), abs(hi))
    span = BOUNDED_FAMILIES.get(family, 0.2 if rate else 0.05 * magnitude if magnitude > 0 else 1.0)
    if hi - lo < span:
        mid = (lo + hi) / 2
        bottom = mid - span / 2
        if rate:  # a rate's window stays within [0, 1] (but for a sliver, so a line at 0 or 1 shows)
            bottom = min(max(bottom, -0.02), 1.02 - span)
        ax.set_ylim(bottom, bottom + span)


def short(task: str, width: int = 28) -> str:
    """`task` cut to `width` characters (an ellipsis marks the cut): legends and tick labels stay readable."""
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
    colours: Mapping[str, str] | None = None,
) -> Path:
    """Grouped bars: per task (and overall), one bar per evaluated policy / guidance scale, labelled k/n.

    `evidence` is one evaluation evidence document (its primary and baselines are drawn) or several
    (e.g. one per guidance scale). Error bars are the Wilson 95% interval (reproduction.run.stats.wilson),
    which stays inside [0, 1] at 0/n and n/n, where a standard error collapses to zero. `colours`: the colour of
    an entry's bars by its policy label (from `policy_colours`; a label it does not name takes PALETTE in the
    entries' order); entries of one colour (a policy at several guidance scales) are told apart by hatching.
    """
    from reproduction.run.stats import wilson

    docs = [evidence] if isinstance(evidence, Mapping) else list(evidence)
    entries = [e for d in docs for e in (d, *d.get("baselines", []))]
    if not entries:
        raise ValueError("plot_success_rates needs at least one evaluation")
    tasks = sorted({t for e in entries for t in e["tasks"]})
    groups = [*tasks, "all tasks"]
    fig = figure(max(7.5, 2.2 * len(groups) + 1), 4.4)
    ax = fig.add_subplot()
    width = 0.8 / len(entries)
    given = colours or {}
    bar_colours = [given.get(e["policy"]["label"], PALETTE[i % len(PALETTE)]) for i, e in enumerate(entries)]
    for i, entry in enumerate(entries):
        counts = [entry["tasks"].get(t, {}).get(metric) for t in tasks] + [entry["metrics"].get(metric)]
        xs = [g + (i - (len(entries) - 1) / 2) * width for g in range(len(groups))]
        rates = [c["rate"] if c else 0.0 for c in counts]
        cis = [wilson(c["successes"], c["episodes"]) if c and c["episodes"] else (r, r) for c, r in zip(counts, rates)]
        errs = [[r - lo for r, (lo, _) in zip(rates, cis)], [hi - r for r, (_, hi) in zip(rates, cis)]]
        hatch = _HATCHES[bar_colours[:i].count(bar_colours[i]) % len(_HATCHES)]
        bars = ax.bar(
            xs,
            rates,
            width * 0.92,
            yerr=errs,
            capsize=3,
            color=bar_colours[i],
            hatch=hatch or None,
            edgecolor="white" if hatch else None,
            label=_entry_name(entry),
        )
        for bar, c, err in zip(bars, counts, errs[1]):
            text = f"{c['successes']}/{c['episodes']}" if c else "n/a"
            top = (bar.get_x() + bar.get_width() / 2, bar.get_height() + err)
            ax.annotate(text, top, xytext=(0, 3), textcoords="offset points", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(groups)), [short(g) for g in groups], fontsize=8)
    ax.set_ylim(0, 1.2)
    ax.set_ylabel(metric.replace("_", " ") + " rate")
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", ncols=min(4, len(entries)))
    return save(fig, out)
