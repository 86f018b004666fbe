"""Evaluation evidence: one JSON per evaluation, and its comparison with a bundle's reference evidence.

On disk (schema: evidence/evaluation.schema.json)::

    <run>/evidence/eval_<stage>_<step>.json
      {"format": "recap-portable-evaluation", "format_version": "2.0", "name", "run_id", ["created",]
       "policy":   {"label", "mode", "guidance_scale", "checkpoint": {"path", "sha256", "step"}},
       "seeds", "settings",
       "metrics":  {"success_once": {"successes": 386, "episodes": 500, "rate": 0.772,
                                     "display": "77.2% (386/500)", "wilson95": [0.733, 0.807]}, ...},
       "tasks":    {"<task text>": {"episodes": 50, "success_once": {...}, "success_at_end": {...},
                                    ["outcomes": {"reset_seeds": [...], "success_once": "0110...",
                                                  "success_at_end": "0100..."}]}},
       "baselines": [{"policy", "metrics", "tasks"}, ...],      # e.g. plain BC, other guidance scales
       ["margins": {"success_once": 0.05}], ["alpha": 0.05]}     # optional: declared by a reference
    <run>/evidence/comparison.json   (schema: evidence/comparison.schema.json)

Format 2.0 added `wilson95`, per-episode `outcomes`, `margins` and `alpha`; 1.x files (no intervals, a
`tolerances` field) are still read: their `tolerances` are read as margins.

A comparison matches the primary evaluation with the reference's primary and baselines by label and
gives each rate one of `reproduced` / `differs` / `inconclusive` by an equivalence test against a
margin (reproduction.run.stats: TOST with Newcombe's interval, or Tango's paired interval when both
sides carry per-episode outcomes of the same initial states). Plain-valued metrics (detours per
episode, ...) are not binomial counts: they keep a declared tolerance, else must match to 1e-9, and
are only ever `reproduced` or `differs`. Stdlib only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from reproduction.errors import InputNotFoundError, InvalidInputError, UnsupportedFormatError
from reproduction.fsio import atomic_write_text
from reproduction.run.secrets import redact
from reproduction.run.stats import DEFAULT_ALPHA, DEFAULT_MARGIN, episodes_needed, wilson

FORMAT = "recap-portable-evaluation"
FORMAT_VERSION = "2.0"
READS = ("1", "2")
"""Major format versions this build reads (1.x: no intervals, `tolerances` read as margins)."""
COUNT_METRICS = ("success_once", "success_at_end")
EXACT = 1e-9


# -- building -----------------------------------------------------------------------------------


def count_metric(successes: int, episodes: int) -> dict[str, Any]:
    """A success count as evidence shows it: {"successes", "episodes", "rate", "display", "wilson95": [lo, hi]}."""
    if episodes < 0 or not 0 <= successes <= max(episodes, 0):
        raise ValueError(f"success count {successes}/{episodes} is impossible")
    rate = successes / episodes if episodes else 0.0
    lo, hi = wilson(successes, episodes, 0.95)
    return {
        "successes": int(successes),
        "episodes": int(episodes),
        "rate": rate,
        "display": f"{100 * rate:.1f}% ({successes}/{episodes})",
        "wilson95": [round(lo, 6), round(hi, 6)],
    }


COUNT_KEYS = frozenset({"task", "name", "episodes", "successes", *COUNT_METRICS, *(f"{m}_rate" for m in COUNT_METRICS)})


def _successes(value: Any, episodes: int, where: str) -> int:
    """A success count given as an int or as the text "k/n" (reproduction.sim's TaskResult.summary())."""
    if isinstance(value, str):
        k, sep, n = value.partition("/")
        if not sep or not k.strip().isdigit() or not n.strip().isdigit() or int(n) != episodes:
            raise InvalidInputError(f"{where}: success count {value!r} is not k/{episodes}", field=where)
        return int(k)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(f"{where}: success count {value!r} is not an integer", field=where)
    return value


def _task_details(row: Mapping[str, Any]) -> dict[str, float | None]:
    """The per-task numbers besides the counts (detours per episode, mean first-success step, ...)."""
    return {
        str(k): (None if v is None else float(v))
        for k, v in sorted(row.items())
        if k not in COUNT_KEYS and (v is None or isinstance(v, (int, float)) and not isinstance(v, bool))
    }


def _task_counts(result: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """{task: {"episodes", "success_once", "success_at_end", "details"}} from an EvalResult.to_dict().

    Accepted: {"tasks": {task: counts}}, {"tasks": [{"task": ..., **counts}]}, {"per_task": ...} likewise,
    or a bare {task: counts}. Counts are ints or "k/n" texts; "success_at_end" defaults to "success_once".
    """
    raw = result.get("tasks", result.get("per_task", result))
    if isinstance(raw, Sequence) and not isinstance(raw, str):
        raw = {row.get("task") or row.get("name"): row for row in raw}
    out = {}
    for task, row in dict(raw).items():
        if not isinstance(row, Mapping) or "episodes" not in row:
            continue
        once = row.get("success_once", row.get("successes"))
        if once is None:
            raise InvalidInputError(f"evaluation result for task {task!r} has no success_once count", field=str(task))
        episodes = int(row["episodes"])
        once = _successes(once, episodes, f"tasks[{task!r}].success_once")
        out[str(task)] = {
            "episodes": episodes,
            "success_once": once,
            "success_at_end": _successes(row.get("success_at_end", once), episodes, f"tasks[{task!r}].success_at_end"),
            "details": _task_details(row),
        }
    for task, episodes in dict(result.get("per_episode") or {}).items():
        if str(task) in out and episodes:
            out[str(task)]["outcomes"] = _outcomes(episodes, out[str(task)], str(task))
    if not out:
        raise InvalidInputError(
            "evaluation result holds no per-task counts (expected tasks: {task: {episodes, success_once, ...}})",
            hint="pass EvalResult.to_dict() from reproduction.sim.evaluate",
        )
    return out


def _outcomes(episodes: Sequence[Mapping[str, Any]], counts: Mapping[str, Any], task: str) -> dict[str, Any]:
    """Per-episode outcomes (EvalResult.to_dict()["per_episode"][task]) as evidence keeps them: the reset seeds
    in episode order and one "0"/"1" character per episode per metric, so a comparison can pair episodes."""
    rows = sorted(episodes, key=lambda e: e.get("episode", 0))
    out: dict[str, Any] = {"reset_seeds": [int(e["reset_seed"]) for e in rows]}
    for m in COUNT_METRICS:
        out[m] = "".join("1" if e[m] else "0" for e in rows)
        if len(rows) != counts["episodes"] or out[m].count("1") != counts[m]:
            raise InvalidInputError(
                f"per-episode outcomes of task {task!r} do not add up to its {m} count "
                f"{counts[m]}/{counts['episodes']}",
                field=f"per_episode[{task!r}]",
            )
    return out


@dataclass(kw_only=True, slots=True)
class EvalRecord:
    """One evaluated policy: the simulator's result plus what was evaluated."""

    result: Mapping[str, Any]
    """EvalResult.to_dict(): per-task counts (episodes, success_once, success_at_end)."""
    label: str
    """How tables name it: "recap", "bc", "recap cfg=3"."""
    mode: str
    """Conditioning mode: recap, bc, filtered_bc."""
    guidance_scale: float | None = None
    """Classifier-free guidance scale (None when the mode has no conditioning)."""
    checkpoint: str | None = None
    """Checkpoint path as recorded (relative to the run folder when inside it)."""
    checkpoint_sha256: str | None = None
    """File or tree digest of the checkpoint (see lineage.path_sha256)."""
    step: int | None = None
    """Training step of the checkpoint."""
    extra_metrics: Mapping[str, float] = field(default_factory=dict)
    """Other numbers worth keeping (mean episode length, ...), compared only under a declared tolerance."""


def evaluation_entry(record: EvalRecord) -> dict[str, Any]:
    """The {"policy", "metrics", "tasks"} block of one evaluated policy."""
    counts = _task_counts(record.result)
    tasks = {
        task: {
            "episodes": c["episodes"],
            **{m: count_metric(c[m], c["episodes"]) for m in COUNT_METRICS},
            **({"details": c["details"]} if c["details"] else {}),
            **({"outcomes": c["outcomes"]} if "outcomes" in c else {}),
        }
        for task, c in sorted(counts.items())
    }
    total = sum(c["episodes"] for c in counts.values())
    metrics: dict[str, Any] = {m: count_metric(sum(c[m] for c in counts.values()), total) for m in COUNT_METRICS}
    for name, value in sorted(record.extra_metrics.items()):
        metrics[name] = {"value": float(value)}
    return {
        "policy": {
            "label": record.label,
            "mode": record.mode,
            "guidance_scale": record.guidance_scale,
            "checkpoint": {"path": record.checkpoint, "sha256": record.checkpoint_sha256, "step": record.step},
        },
        "metrics": metrics,
        "tasks": tasks,
    }


def build_evidence(
    primary: EvalRecord,
    *,
    name: str,
    run_id: str,
    seeds: Mapping[str, int],
    settings: Mapping[str, Any],
    baselines: Sequence[EvalRecord] = (),
    tolerances: Mapping[str, float] | None = None,
    margins: Mapping[str, float] | None = None,
    alpha: float | None = None,
    sequential: Mapping[str, Any] | None = None,
    created: datetime | None = None,
) -> dict[str, Any]:
    """The evidence document (a JSON-ready dict); `settings` (episodes per task, execute steps...) is redacted.

    `margins` (a reference's declared equivalence margins per "<label>/<metric>", "<metric>" or
    "<task>/<metric>"), `alpha` (its test level) and `tolerances` (1.x: plain-value tolerances) are kept
    only when given; `sequential` records a sequential evaluation's stop (reproduction.sim.evaluate).

    Deterministic: the same results give the same bytes (an interrupted and resumed run's evidence equals an
    uninterrupted one's), so no clock is read; pass `created` to stamp a time (reference evidence does).
    """
    labels = [primary.label, *(b.label for b in baselines)]
    if len(set(labels)) != len(labels):
        raise ValueError(f"evaluation labels must be unique, got {labels}")
    doc: dict[str, Any] = {"format": FORMAT, "format_version": FORMAT_VERSION, "name": name, "run_id": run_id}
    if created is not None:
        doc["created"] = created.astimezone(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    doc |= {
        **evaluation_entry(primary),
        "seeds": {k: int(v) for k, v in seeds.items()},
        "settings": redact(dict(settings)),
        "baselines": [evaluation_entry(b) for b in baselines],
    }
    if tolerances:
        doc["tolerances"] = {k: float(v) for k, v in tolerances.items()}
    if margins:
        doc["margins"] = {k: float(v) for k, v in margins.items()}
    if alpha is not None:
        doc["alpha"] = float(alpha)
    if sequential:
        doc["sequential"] = dict(sequential)
    return doc


def write_evidence(path: Path, evidence: Mapping[str, Any]) -> Path:
    """Write an evidence document atomically (indented, keys in build order) and return its path."""
    atomic_write_text(Path(path), json.dumps(evidence, indent=1) + "\n")
    return Path(path)


def write_eval_evidence(path: Path, primary: EvalRecord, **kwargs: Any) -> Path:
    """`build_evidence(primary, **kwargs)` written to `path`: the one call the runner makes per evaluation."""
    return write_evidence(path, build_evidence(primary, **kwargs))


def load_evidence(path: Path) -> dict[str, Any]:
    """Read an evidence file; refuses other formats and other major versions with the fix named."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise InputNotFoundError(f"evidence file {path} does not exist", path=path) from exc
    except (OSError, ValueError) as exc:
        raise InvalidInputError(f"evidence file {path} is not JSON: {exc}", path=path) from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise InvalidInputError(f"{path} is not {FORMAT} evidence (format: {doc.get('format')!r})", path=path)
    version = str(doc.get("format_version", ""))
    if version.split(".")[0] not in READS:
        raise UnsupportedFormatError(
            f"{path} has evidence format {version!r}; this build reads {', '.join(v + '.x' for v in READS)}",
            path=path,
            field="format_version",
            hint="use the recap-portable release that wrote it, or upgrade this one",
        )
    return doc


# -- comparing ----------------------------------------------------------------------------------

COMPARISON_FORMAT = "recap-portable-comparison"


@dataclass(kw_only=True, slots=True, frozen=True)
class MetricComparison:
    """One row: a metric of one evaluated policy (or one of its tasks) against the reference.

    Rates (`kind` "rate") carry both counts, the difference's (1 - 2 alpha) interval and the margin; plain
    values (`kind` "value": detours per episode, ...) are no binomial counts, so they carry a tolerance
    (declared, else exact) in `margin` and no interval."""

    metric: str
    """"<label>/<metric>" or "<label>/<task>/<metric>"."""
    kind: str
    reference: float
    actual: float | None
    """None when this run has no such metric."""
    margin: float
    """Rates: the equivalence margin on |actual - reference|; values: the tolerance."""
    method: str
    """Rates: "newcombe-10" (independent) or "tango-paired" (same reset seeds); values: "declared" or "exact"."""
    verdict: str
    reference_display: str
    actual_display: str
    reference_counts: tuple[int, int] | None = None
    actual_counts: tuple[int, int] | None = None
    low: float | None = None
    high: float | None = None
    confidence: float | None = None
    note: str = ""

    @property
    def difference(self) -> float | None:
        return None if self.actual is None else self.actual - self.reference

    @property
    def tolerance(self) -> float:
        """1.x name of `margin`."""
        return self.margin

    def interval_text(self) -> str:
        if self.low is None or self.high is None:
            return ""
        return f"[{self.low:+.3f}, {self.high:+.3f}]"

    def to_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "kind": self.kind,
            "reference": self.reference,
            "actual": self.actual,
            "difference": self.difference,
            "reference_counts": None if self.reference_counts is None else list(self.reference_counts),
            "actual_counts": None if self.actual_counts is None else list(self.actual_counts),
            "interval": None if self.low is None else [self.low, self.high],
            "confidence": self.confidence,
            "margin": self.margin,
            "method": self.method,
            "reference_display": self.reference_display,
            "actual_display": self.actual_display,
            "verdict": self.verdict,
            "note": self.note,
        }

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> MetricComparison:
        """A 2.x row, or a 1.x one ({tolerance, basis, verdict}: reproduced/differs, no interval)."""
        if "margin" not in row:  # 1.x
            return cls(
                metric=row["metric"],
                kind="rate" if str(row["basis"]).startswith("binomial") else "value",
                reference=row["reference"],
                actual=row["actual"],
                margin=row["tolerance"],
                method=str(row["basis"]),
                verdict=row["verdict"],
                reference_display=row.get("reference_display", str(row["reference"])),
                actual_display=row.get("actual_display", str(row["actual"])),
            )
        interval = row.get("interval") or (None, None)
        counts = lambda key: None if row.get(key) is None else tuple(row[key])  # noqa: E731
        return cls(
            metric=row["metric"],
            kind=row["kind"],
            reference=row["reference"],
            actual=row["actual"],
            margin=row["margin"],
            method=row["method"],
            verdict=row["verdict"],
            reference_display=row["reference_display"],
            actual_display=row["actual_display"],
            reference_counts=counts("reference_counts"),
            actual_counts=counts("actual_counts"),
            low=interval[0],
            high=interval[1],
            confidence=row.get("confidence"),
            note=row.get("note", ""),
        )


def overall_verdict(verdicts: Sequence[str]) -> str:
    """`reproduced` only when every row is; `differs` when any row differs; else `inconclusive`."""
    if verdicts and all(v == "reproduced" for v in verdicts):
        return "reproduced"
    return "differs" if "differs" in verdicts or not verdicts else "inconclusive"


@dataclass(kw_only=True, slots=True)
class Comparison:
    """Every metric of a run's evidence against the reference evidence."""

    actual_name: str
    reference_name: str
    rows: list[MetricComparison]
    alpha: float = DEFAULT_ALPHA
    notes: list[str] = field(default_factory=list)
    """Why a verdict may not mean what it seems: seeds or settings that differ, a reference too small."""

    @property
    def verdict(self) -> str:
        return overall_verdict([r.verdict for r in self.rows])

    @property
    def reproduced(self) -> bool:
        return self.verdict == "reproduced"

    @property
    def differing(self) -> list[MetricComparison]:
        return [r for r in self.rows if r.verdict != "reproduced"]

    def render(self) -> str:
        """A fixed-width table, one metric a line, the notes, and a last line with the overall verdict."""
        level = f"{100 * (1 - 2 * self.alpha):g}%"
        head = ("metric", "reference", "this run", f"diff [{level} interval]", "margin", "verdict")
        body = []
        for r in self.rows:
            diff = "-" if r.difference is None else f"{r.difference:+.3f} {r.interval_text()}".rstrip()
            kind = f"±{r.margin:.3f} ({r.method})" if r.kind == "rate" else f"±{r.margin:.3g} (value, {r.method})"
            body.append((r.metric, r.reference_display, r.actual_display, diff, kind, r.verdict))
        widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [head, *body]]
        lines.append(
            f"rates: two one-sided tests at alpha {self.alpha:g} ({level} interval inside ±margin: reproduced; "
            "wholly beyond it: differs; else inconclusive). values: not binomial, so a declared tolerance or exact."
        )
        lines += [f"note: {n}" for n in self.notes]
        counts = {v: sum(r.verdict == v for r in self.rows) for v in ("differs", "inconclusive")}
        verdict = self.verdict
        if verdict != "reproduced":
            verdict += (
                f" ({counts['differs']} differ, {counts['inconclusive']} inconclusive of {len(self.rows)} metrics)"
            )
        lines.append(f"{self.actual_name} vs reference {self.reference_name}: {verdict}")
        return "\n".join(lines)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Comparison:
        """Read back `to_dict()` (comparison.json, 1.x or 2.x); raises InvalidInputError for another format."""
        if not isinstance(data, Mapping) or data.get("format") != COMPARISON_FORMAT:
            raise InvalidInputError("not a recap-portable comparison (comparison.json)", field="format")
        if str(data.get("format_version", "")).split(".")[0] not in READS:
            raise UnsupportedFormatError(
                f"comparison format {data.get('format_version')!r}; this build reads 1.x and 2.x",
                field="format_version",
            )
        try:
            rows = [MetricComparison.from_dict(row) for row in data["rows"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidInputError(f"comparison.json rows are malformed: {exc}", field="rows") from exc
        return cls(
            actual_name=str(data.get("actual")),
            reference_name=str(data.get("reference")),
            rows=rows,
            alpha=float(data.get("alpha", DEFAULT_ALPHA)),
            notes=list(data.get("notes", [])),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": COMPARISON_FORMAT,
            "format_version": FORMAT_VERSION,
            "actual": self.actual_name,
            "reference": self.reference_name,
            "alpha": self.alpha,
            "verdict": self.verdict,
            "reproduced": self.reproduced,
            "notes": list(self.notes),
            "rows": [r.to_dict() for r in self.rows],
        }


def _declared(margins: Mapping[str, float], label: str, key: str) -> float | None:
    """The most specific declared margin: "<label>/<key>", then "<key>", then the metric name alone."""
    for candidate in (f"{label}/{key}", key, key.rsplit("/", 1)[-1]):
        if candidate in margins:
            return float(margins[candidate])
    return None


@dataclass(kw_only=True, slots=True, frozen=True)
class _Side:
    """One side of a row: the count (or value) and, for rates, the per-episode outcomes keyed by reset seed."""

    metric: Mapping[str, Any] | None
    outcomes: dict[tuple[str, int], bool] | None = None


def _paired(ref: _Side, act: _Side) -> tuple[list[bool], list[bool]] | None:
    """Both sides' outcomes in one order when both evaluated exactly the same initial states, else None."""
    if ref.outcomes is None or act.outcomes is None or set(ref.outcomes) != set(act.outcomes):
        return None
    keys = sorted(ref.outcomes)
    return [ref.outcomes[k] for k in keys], [act.outcomes[k] for k in keys]


def _rate_row(name: str, ref: _Side, act: _Side, margin: float, alpha: float) -> MetricComparison:
    from reproduction.run.stats import equivalence_independent, equivalence_paired

    r = ref.metric
    a = act.metric if act.metric is not None and "rate" in act.metric else None
    common = {
        "metric": name,
        "kind": "rate",
        "reference": float(r["rate"]),
        "margin": margin,
        "reference_display": r["display"],
        "reference_counts": (int(r["successes"]), int(r["episodes"])),
    }
    if a is None or not a["episodes"] or not r["episodes"]:
        return MetricComparison(
            **common,
            actual=None if a is None else float(a["rate"]),
            method="newcombe-10",
            verdict="differs",
            actual_display="missing" if a is None else a["display"],
            note="this run has no such metric" if a is None else "no episodes on one side",
        )
    pairs = _paired(ref, act)
    if pairs is not None:
        test = equivalence_paired(*pairs, margin=margin, alpha=alpha)
        b, c = test.discordant or (0, 0)
        note = f"paired by reset seed: {test.pairs} episodes, {b} succeeded only in the reference, {c} only here"
    else:
        test = equivalence_independent(
            int(r["successes"]), int(r["episodes"]), int(a["successes"]), int(a["episodes"]), margin=margin, alpha=alpha
        )
        note = ""
    return MetricComparison(
        **common,
        actual=float(a["rate"]),
        method=test.method,
        verdict=test.verdict,
        actual_display=a["display"],
        actual_counts=(int(a["successes"]), int(a["episodes"])),
        low=float(test.low),
        high=float(test.high),
        confidence=test.confidence,
        note=note,
    )


def _value_row(name: str, ref: Mapping[str, Any], act: Mapping[str, Any] | None, tol: float | None) -> MetricComparison:
    actual = None if act is None or "value" not in act else float(act["value"])
    reference = float(ref["value"])
    method = "declared" if tol is not None else "exact"
    tol = EXACT if tol is None else tol
    ok = actual is not None and not math.isnan(actual) and abs(actual - reference) <= tol + EXACT
    return MetricComparison(
        metric=name,
        kind="value",
        reference=reference,
        actual=actual,
        margin=tol if method == "declared" else 0.0,
        method=method,
        verdict="reproduced" if ok else "differs",
        reference_display=f"{reference:.4g}",
        actual_display="missing" if actual is None else f"{actual:.4g}",
        note="this run has no such metric" if actual is None else "",
    )


def _entries(doc: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    out = {doc["policy"]["label"]: doc}
    out.update({b["policy"]["label"]: b for b in doc.get("baselines", [])})
    return out


def _task_outcomes(entry: Mapping[str, Any], task: str, metric: str) -> dict[tuple[str, int], bool] | None:
    o = entry.get("tasks", {}).get(task, {}).get("outcomes")
    if not o or len(o.get("reset_seeds", [])) != len(o.get(metric, "")):
        return None
    return {(task, int(s)): ch == "1" for s, ch in zip(o["reset_seeds"], o[metric])}


def _all_outcomes(entry: Mapping[str, Any], metric: str) -> dict[tuple[str, int], bool] | None:
    """The policy's outcomes over all its tasks, or None unless every task carries them."""
    out: dict[tuple[str, int], bool] = {}
    for task in entry.get("tasks", {}):
        one = _task_outcomes(entry, task, metric)
        if one is None:
            return None
        out |= one
    return out or None


def _setting_notes(actual: Mapping[str, Any], reference: Mapping[str, Any]) -> list[str]:
    """Seeds and settings that differ between the two sides: a rate then differs by sampling alone."""
    notes = []
    for what in ("seeds", "settings"):
        mine, theirs = actual.get(what, {}) or {}, reference.get(what, {}) or {}
        for key in sorted(set(mine) | set(theirs)):
            if mine.get(key) != theirs.get(key):
                notes.append(f"{what[:-1]} {key!r} differs: reference {theirs.get(key)!r}, this run {mine.get(key)!r}")
    if any(n.startswith("seed 'eval'") for n in notes):
        notes.append(
            "the evaluation seeds differ, so the two sides evaluated different initial states: the rates are "
            "compared unpaired and differ by sampling noise alone (see each row's interval)"
        )
    return notes


def _power_note(rows: Sequence[MetricComparison], alpha: float) -> list[str]:
    """A warning when the reference's own episodes cannot support its margin in an unpaired comparison."""
    short = []
    for r in rows:
        if r.kind != "rate" or r.method != "newcombe-10" or r.reference_counts is None:
            continue
        k, n = r.reference_counts
        need = episodes_needed(k / n if n else 0.5, margin=r.margin, alpha=alpha)
        if n < need:
            short.append((need - n, r.metric, n, need))
    if not short:
        return []
    _, metric, n, need = max(short)
    return [
        f"the reference is too small for its margins on {len(short)} of {len(rows)} rows: e.g. {metric} has "
        f"{n} episodes, and 80% power at alpha {alpha:g} needs {need} per side unpaired "
        "(`portable eval --plan`); evaluating the reference's reset seeds lets a paired test decide with fewer"
    ]


def compare_evidence(
    actual: Mapping[str, Any],
    reference: Mapping[str, Any],
    *,
    margin: float | None = None,
    margins: Mapping[str, float] | None = None,
    alpha: float | None = None,
    tolerances: Mapping[str, float] | None = None,
) -> Comparison:
    """Compare every metric (overall and per task) of every policy the reference holds with this run's.

    Margin of a rate, most specific first: `margins`/`tolerances` (the caller's, per key), `margin` (the
    caller's, every rate), the reference's declared "margins", then its 1.x "tolerances" (read as margins),
    then DEFAULT_MARGIN. A plain value's tolerance: the same keys, else exact. `alpha`: the caller's, the
    reference's "alpha", else DEFAULT_ALPHA. Policies are matched by label; a policy, task or metric the run
    lacks is a "differs" row. A row is paired (Tango) when both sides carry outcomes of the same reset seeds.
    """
    alpha = float(alpha if alpha is not None else reference.get("alpha", DEFAULT_ALPHA))
    ref_declared = {**reference.get("tolerances", {}), **reference.get("margins", {})}
    mine_declared = {**(tolerances or {}), **(margins or {})}
    mine = _entries(actual)

    def margin_of(label: str, key: str) -> float | None:
        found = _declared(mine_declared, label, key)
        if found is None and margin is not None:
            return float(margin)
        return found if found is not None else _declared(ref_declared, label, key)

    rows = []
    for label, ref_entry in _entries(reference).items():
        act_entry = mine.get(label, {})
        for metric, ref_value in ref_entry["metrics"].items():
            act_value = act_entry.get("metrics", {}).get(metric)
            name = f"{label}/{metric}"
            if "rate" in ref_value:
                ref_side = _Side(metric=ref_value, outcomes=_all_outcomes(ref_entry, metric))
                act_side = _Side(metric=act_value, outcomes=_all_outcomes(act_entry, metric) if act_entry else None)
                m = margin_of(label, metric)
                rows.append(_rate_row(name, ref_side, act_side, DEFAULT_MARGIN if m is None else m, alpha))
            else:
                tol = _declared(mine_declared, label, metric)  # the caller's rate `margin` is no value tolerance
                tol = tol if tol is not None else _declared(ref_declared, label, metric)
                rows.append(_value_row(name, ref_value, act_value, tol))
        for task, ref_task in ref_entry.get("tasks", {}).items():
            act_task = act_entry.get("tasks", {}).get(task, {})
            for metric in COUNT_METRICS:
                if metric in ref_task:
                    ref_side = _Side(metric=ref_task[metric], outcomes=_task_outcomes(ref_entry, task, metric))
                    act_side = _Side(
                        metric=act_task.get(metric),
                        outcomes=_task_outcomes(act_entry, task, metric) if act_task else None,
                    )
                    m = margin_of(label, f"{task}/{metric}")
                    rows.append(
                        _rate_row(
                            f"{label}/{task}/{metric}", ref_side, act_side, DEFAULT_MARGIN if m is None else m, alpha
                        )
                    )
    notes = _setting_notes(actual, reference) + _power_note(rows, alpha)
    return Comparison(
        actual_name=str(actual.get("name")),
        reference_name=str(reference.get("name")),
        rows=rows,
        alpha=alpha,
        notes=notes,
    )


def write_comparison(path: Path, comparison: Comparison) -> Path:
    """Write comparison.json atomically; returns its path."""
    atomic_write_text(Path(path), json.dumps(comparison.to_dict(), indent=1) + "\n")
    return Path(path)


def compare_files(
    actual: Path,
    reference: Path,
    *,
    out: Path | None = None,
    margin: float | None = None,
    alpha: float | None = None,
) -> Comparison:
    """Load both evidence files, compare, and write the comparison JSON to `out` when given."""
    comparison = compare_evidence(load_evidence(actual), load_evidence(reference), margin=margin, alpha=alpha)
    if out is not None:
        write_comparison(out, comparison)
    return comparison
