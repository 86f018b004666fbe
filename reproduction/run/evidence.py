"""Evaluation evidence: one JSON per evaluation, and its comparison with a bundle's reference evidence.

On disk (schema: evidence/evaluation.schema.json)::

    <run>/evidence/eval_<stage>_<step>.json
      {"format": "recap-portable-evaluation", "format_version": "1.0", "name", "run_id", ["created",]
       "policy":   {"label", "mode", "guidance_scale", "checkpoint": {"path", "sha256", "step"}},
       "seeds", "settings",
       "metrics":  {"success_once": {"successes": 386, "episodes": 500, "rate": 0.772,
                                     "display": "77.2% (386/500)"}, "success_at_end": {...}},
       "tasks":    {"<task text>": {"episodes": 50, "success_once": {...}, "success_at_end": {...}}},
       "baselines": [{"policy", "metrics", "tasks"}, ...],      # e.g. plain BC, other guidance scales
       "tolerances": {"success_once": 0.05}}                     # optional: declared by a reference
    <run>/evidence/comparison.json   (schema: evidence/comparison.schema.json)

A comparison matches the primary evaluation with the reference's primary and baselines by label, and
compares each rate with a tolerance: the one the reference declares for the metric, else three
standard errors of the difference of two binomial proportions (pooled, Laplace-smoothed), so a
rate measured on 500 episodes is held tighter than one on 20. Plain-valued metrics need a declared
tolerance (else they must match to 1e-9). Stdlib only.
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

FORMAT = "recap-portable-evaluation"
FORMAT_VERSION = "1.0"
COUNT_METRICS = ("success_once", "success_at_end")
DEFAULT_Z = 3.0
EXACT = 1e-9


# -- building -----------------------------------------------------------------------------------


def count_metric(successes: int, episodes: int) -> dict[str, Any]:
    """A success count as evidence shows it: {"successes", "episodes", "rate", "display": "77.2% (386/500)"}."""
    if episodes < 0 or not 0 <= successes <= max(episodes, 0):
        raise ValueError(f"success count {successes}/{episodes} is impossible")
    rate = successes / episodes if episodes else 0.0
    return {
        "successes": int(successes),
        "episodes": int(episodes),
        "rate": rate,
        "display": f"{100 * rate:.1f}% ({successes}/{episodes})",
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
    if not out:
        raise InvalidInputError(
            "evaluation result holds no per-task counts (expected tasks: {task: {episodes, success_once, ...}})",
            hint="pass EvalResult.to_dict() from reproduction.sim.evaluate",
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
    created: datetime | None = None,
) -> dict[str, Any]:
    """The evidence document (a JSON-ready dict); `settings` (episodes per task, execute steps...) is redacted.

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
    if version.split(".")[0] != FORMAT_VERSION.split(".")[0]:
        raise UnsupportedFormatError(
            f"{path} has evidence format {version!r}; this build reads {FORMAT_VERSION.split('.')[0]}.x",
            path=path,
            field="format_version",
            hint="use the recap-portable release that wrote it, or upgrade this one",
        )
    return doc


# -- comparing ----------------------------------------------------------------------------------


@dataclass(kw_only=True, slots=True, frozen=True)
class MetricComparison:
    """One row: a metric of one evaluated policy (or one of its tasks) against the reference."""

    metric: str
    """"<label>/<metric>" or "<label>/<task>/<metric>"."""
    reference: float
    actual: float | None
    """None when this run has no such metric."""
    tolerance: float
    """Absolute tolerance on |actual - reference|."""
    basis: str
    """"binomial 3.0 SE", "declared" or "exact"."""
    reference_display: str
    actual_display: str

    @property
    def difference(self) -> float | None:
        return None if self.actual is None else self.actual - self.reference

    @property
    def verdict(self) -> str:
        """ "reproduced" when within tolerance, else "differs" (a missing metric differs)."""
        if self.actual is None or math.isnan(self.actual):
            return "differs"
        return "reproduced" if abs(self.actual - self.reference) <= self.tolerance + EXACT else "differs"

    def to_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "reference": self.reference,
            "actual": self.actual,
            "difference": self.difference,
            "tolerance": self.tolerance,
            "basis": self.basis,
            "reference_display": self.reference_display,
            "actual_display": self.actual_display,
            "verdict": self.verdict,
        }


@dataclass(kw_only=True, slots=True)
class Comparison:
    """Every metric of a run's evidence against the reference evidence."""

    actual_name: str
    reference_name: str
    rows: list[MetricComparison]

    @property
    def reproduced(self) -> bool:
        return all(r.verdict == "reproduced" for r in self.rows)

    @property
    def differing(self) -> list[MetricComparison]:
        return [r for r in self.rows if r.verdict != "reproduced"]

    def render(self) -> str:
        """A fixed-width table, one metric a line, and a last line with the overall verdict."""
        head = ("metric", "reference", "this run", "diff", "tolerance", "verdict")
        body = [
            (
                r.metric,
                r.reference_display,
                r.actual_display,
                "-" if r.difference is None else f"{r.difference:+.3f}",
                f"±{r.tolerance:.3f} ({r.basis})",
                r.verdict,
            )
            for r in self.rows
        ]
        widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [head, *body]]
        n_bad = len(self.differing)
        verdict = "reproduced" if not n_bad else f"differs ({n_bad} of {len(self.rows)} metrics)"
        lines.append(f"{self.actual_name} vs reference {self.reference_name}: {verdict}")
        return "\n".join(lines)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Comparison:
        """Read back `to_dict()` (comparison.json); raises InvalidInputError for another format."""
        if not isinstance(data, Mapping) or data.get("format") != "recap-portable-comparison":
            raise InvalidInputError("not a recap-portable comparison (comparison.json)", field="format")
        keys = ("metric", "reference", "actual", "tolerance", "basis", "reference_display", "actual_display")
        try:
            rows = [MetricComparison(**{k: row[k] for k in keys}) for row in data["rows"]]
        except (KeyError, TypeError) as exc:
            raise InvalidInputError(f"comparison.json rows are malformed: {exc}", field="rows") from exc
        return cls(actual_name=str(data.get("actual")), reference_name=str(data.get("reference")), rows=rows)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "recap-portable-comparison",
            "format_version": FORMAT_VERSION,
            "actual": self.actual_name,
            "reference": self.reference_name,
            "reproduced": self.reproduced,
            "rows": [r.to_dict() for r in self.rows],
        }


def binomial_tolerance(ref: Mapping[str, Any], act: Mapping[str, Any], *, z: float = DEFAULT_Z) -> float:
    """z standard errors of the difference of two independent binomial rates (pooled, Laplace-smoothed p)."""
    n1, n2 = ref["episodes"], act["episodes"]
    if n1 <= 0 or n2 <= 0:
        return 0.0
    p = (ref["successes"] + act["successes"] + 1) / (n1 + n2 + 2)
    return z * math.sqrt(p * (1 - p) * (1 / n1 + 1 / n2))


def _declared(tolerances: Mapping[str, float], label: str, key: str) -> float | None:
    """The most specific declared tolerance: "<label>/<key>", then "<key>", then the metric name alone."""
    for candidate in (f"{label}/{key}", key, key.rsplit("/", 1)[-1]):
        if candidate in tolerances:
            return float(tolerances[candidate])
    return None


def _metric_rows(
    label: str,
    key: str,
    ref: Mapping[str, Any],
    act: Mapping[str, Any] | None,
    tolerances: Mapping[str, float],
    z: float,
) -> MetricComparison:
    declared = _declared(tolerances, label, key)
    if "rate" in ref:
        reference, ref_display = float(ref["rate"]), ref["display"]
        actual = None if act is None or "rate" not in act else float(act["rate"])
        act_display = "missing" if actual is None else act["display"]
        if declared is not None:
            tol, basis = declared, "declared"
        elif actual is not None:
            tol, basis = binomial_tolerance(ref, act, z=z), f"binomial {z:g} SE"
        else:
            tol, basis = 0.0, "binomial"
    else:
        reference, ref_display = float(ref["value"]), f"{ref['value']:.4g}"
        actual = None if act is None or "value" not in act else float(act["value"])
        act_display = "missing" if actual is None else f"{actual:.4g}"
        tol, basis = (declared, "declared") if declared is not None else (0.0, "exact")
    return MetricComparison(
        metric=f"{label}/{key}",
        reference=reference,
        actual=actual,
        tolerance=tol,
        basis=basis,
        reference_display=ref_display,
        actual_display=act_display,
    )


def _entries(doc: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    out = {doc["policy"]["label"]: doc}
    out.update({b["policy"]["label"]: b for b in doc.get("baselines", [])})
    return out


def compare_evidence(
    actual: Mapping[str, Any],
    reference: Mapping[str, Any],
    *,
    tolerances: Mapping[str, float] | None = None,
    z: float = DEFAULT_Z,
) -> Comparison:
    """Compare every metric (overall and per task) of every policy the reference holds with this run's.

    Tolerances: `tolerances` (the caller's), then the reference's own "tolerances", then binomial.
    Policies are matched by label; a policy, task or metric the run lacks is a "differs" row.
    """
    declared = {**reference.get("tolerances", {}), **(tolerances or {})}
    mine = _entries(actual)
    rows = []
    for label, ref_entry in _entries(reference).items():
        act_entry = mine.get(label, {})
        for metric, ref_value in ref_entry["metrics"].items():
            act_value = act_entry.get("metrics", {}).get(metric)
            rows.append(_metric_rows(label, metric, ref_value, act_value, declared, z))
        for task, ref_task in ref_entry.get("tasks", {}).items():
            act_task = act_entry.get("tasks", {}).get(task, {})
            for metric in COUNT_METRICS:
                if metric in ref_task:
                    rows.append(
                        _metric_rows(label, f"{task}/{metric}", ref_task[metric], act_task.get(metric), declared, z)
                    )
    return Comparison(actual_name=str(actual.get("name")), reference_name=str(reference.get("name")), rows=rows)


def write_comparison(path: Path, comparison: Comparison) -> Path:
    """Write comparison.json atomically; returns its path."""
    atomic_write_text(Path(path), json.dumps(comparison.to_dict(), indent=1) + "\n")
    return Path(path)


def compare_files(actual: Path, reference: Path, *, out: Path | None = None, z: float = DEFAULT_Z) -> Comparison:
    """Load both evidence files, compare, and write the comparison JSON to `out` when given."""
    comparison = compare_evidence(load_evidence(actual), load_evidence(reference), z=z)
    if out is not None:
        write_comparison(out, comparison)
    return comparison
