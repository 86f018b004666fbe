"""Evaluation evidence: one JSON per evaluation, and its comparison with a bundle's reference evidence.

On disk (schema: evidence/evaluation.schema.json)::

    <run>/evidence/eval_<stage>_<step>.json
      {"format": "recap-portable-evaluation", "format_version": "2.0", "name", "run_id", ["created",]
       "policy":   {"label", "mode", "guidance_scale", "checkpoint": {"path", "sha256", "step"}},
       "seeds", "settings",
       "metrics":  {"success_once": {"successes": 386, "episodes": 500, "rate": 0.772,
                                     "display": "77.2% (386/500)", "wilson95": [0.733, 0.807]}, ...},
       "tasks":    {"<task text>": {"episodes": 50, "success_once": {...}, "success_at_end": {...},
                                    ["outcomes": {"reset_seeds" | "init_states": [...],
                                                  "success_once": "0110...", "success_at_end": "0100..."}]}},
       "baselines": [{"policy", "metrics", "tasks"}, ...],      # e.g. plain BC, other guidance scales
       ["margins": {"success_once": 0.05}], ["alpha": 0.05],     # optional: declared by a reference
       ["sequential": {"looks", "spend", "stopped_at_look", "stopped_early", "episodes_per_task",
                       "episodes_per_task_max", "level", "verdict", "why", ...}]}   # eval.sequential on
    <run>/evidence/comparison.json   (schema: evidence/comparison.schema.json)

Format 2.0 added `wilson95`, per-episode `outcomes`, `margins` and `alpha`; 1.x files (no intervals, a
`tolerances` field) are still read: their `tolerances` are read as margins.

The comparison (reproduction.run.comparison; its names are also importable from here) matches the
primary evaluation with the reference's primary and baselines by label and gives each rate one of
`reproduced` / `differs` / `inconclusive` by an equivalence test against a margin
(reproduction.run.stats: TOST with Newcombe's interval, or Tango's paired interval when both sides
carry per-episode outcomes of the same initial states). Plain-valued metrics (detours per episode,
...) are not binomial counts: they keep a declared tolerance, else must match to 1e-9, and are only
ever `reproduced` or `differs`. Stdlib only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from reproduction import strict_json
from reproduction.errors import InputNotFoundError, InvalidInputError, UnsupportedFormatError
from reproduction.fsio import atomic_write_text
from reproduction.redaction import redact
from reproduction.run.evidence_check import COUNT_METRICS, check_evidence
from reproduction.run.stats import wilson

FORMAT = "recap-portable-evaluation"
FORMAT_VERSION = "2.0"
READS = ("1", "2")
"""Major format versions this build reads (1.x: no intervals, `tolerances` read as margins)."""
EXACT = 1e-9


# -- building -----------------------------------------------------------------------------------


BAD_VALUE_HINT = (
    "hand the evidence API whole counts, 0 <= successes <= episodes (EvalRecord.result as reproduction.sim's "
    "EvalResult.to_dict() gives it); check the evaluation settings that produced them"
)
"""The hint under a value the evidence-building API refuses (InvalidInputError, exit 4): the caller's value (a
recipe's evaluation, a card's counts), never a bug here (audit47 F9: an impossible count was a plain ValueError,
which the CLI blamed on recap-portable)."""


def count_metric(successes: int, episodes: int) -> dict[str, Any]:
    """A success count as evidence shows it: {"successes", "episodes", "rate", "display", "wilson95": [lo, hi]}.
    InvalidInputError (a ValueError, exit 4) naming the call when the counts are not whole numbers with
    0 <= successes <= episodes."""
    whole = all(isinstance(v, int) and not isinstance(v, bool) for v in (successes, episodes))
    if not whole or episodes < 0 or not 0 <= successes <= episodes:
        raise InvalidInputError(
            f"count_metric(successes={successes!r}, episodes={episodes!r}): not a success count "
            "(whole numbers, 0 <= successes <= episodes)",
            field="episodes",
            hint=BAD_VALUE_HINT,
        )
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
    """A success count given as an int or as the text "k/n" (reproduction.sim's TaskResult.summary()), between 0 and
    `episodes`."""
    if isinstance(value, str):
        k, sep, n = value.partition("/")
        if not sep or not k.strip().isdigit() or not n.strip().isdigit() or int(n) != episodes:
            raise InvalidInputError(
                f"{where}: success count {value!r} is not k/{episodes}", field=where, hint=BAD_VALUE_HINT
            )
        value = int(k)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(f"{where}: success count {value!r} is not an integer", field=where, hint=BAD_VALUE_HINT)
    if not 0 <= value <= episodes:
        raise InvalidInputError(
            f"{where}: success count {value} of {episodes} episodes is impossible (0 <= successes <= episodes)",
            field=where,
            hint=BAD_VALUE_HINT,
        )
    return value


def _episodes(value: Any, where: str) -> int:
    """An episode count: a whole number >= 0 (an int, or a whole float or digit text as int() read them before)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    elif isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError(f"{where}: episodes is {value!r}, not a count >= 0", field=where, hint=BAD_VALUE_HINT)
    return value


def _task_details(row: Mapping[str, Any], where: str = "evaluation result") -> dict[str, float | None]:
    """The per-task numbers besides the counts (detours per episode, mean first-success step, ...); a NaN or an
    infinity is refused (InvalidInputError, exit 4, naming the field), as every other number evidence holds: it was
    written as a bare `NaN`, which is not JSON (audit59 C7)."""
    out = {
        str(k): (None if v is None else float(v))
        for k, v in sorted(row.items())
        if k not in COUNT_KEYS and (v is None or isinstance(v, (int, float)) and not isinstance(v, bool))
    }
    _check_details(out, where)
    return out


def _check_details(details: Any, where: str, hint: str = BAD_VALUE_HINT) -> None:
    """InvalidInputError (exit 4) unless `details` maps names to finite numbers or null (the schema's rule)."""
    if not isinstance(details, Mapping):
        raise InvalidInputError(f"{where}: details is {details!r}, not an object", field="details", hint=hint)
    for key, value in details.items():
        ok = value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value))
        if not ok:
            raise InvalidInputError(
                f"{where}: details[{key!r}] is {value!r}, not a finite number or null",
                field=f"details[{key!r}]",
                hint=hint,
            )


def _check_task_details(doc: Mapping[str, Any], path: Path) -> None:
    """Each policy's per-task details read back finite (`_check_details`): evidence_check does not look at them."""
    for entry in [doc, *(doc.get("baselines") or [])]:
        tasks = entry.get("tasks") if isinstance(entry, Mapping) else None
        for task, row in (tasks or {}).items() if isinstance(tasks, Mapping) else ():
            if isinstance(row, Mapping) and "details" in row:
                _check_details(row["details"], f"{path}: tasks[{task!r}]", f"fix or regenerate {path}")


RESULT_HINT = (
    "give EvalRecord(result={'tasks': {TASK: {'episodes': N, 'success_once': K, 'success_at_end': K}}}): counts, "
    "ints or 'K/N' texts, not rates (a simulator evaluation's EvalResult.to_dict() is one; docs/recipes.md)"
)
"""The fix for an EvalRecord.result without per-task counts: its shape, for a recipe with its own evaluation too (the
hint named only the simulator's EvalResult, audit65_B L6)."""


def _task_counts(result: Mapping[str, Any], who: str = "evaluation result") -> dict[str, dict[str, Any]]:
    """{task: {"episodes", "success_once", "success_at_end", "details"}} from an EvalResult.to_dict().

    Accepted: {"tasks": {task: counts}}, {"tasks": [{"task": ..., **counts}]}, {"per_task": ...} likewise,
    or a bare {task: counts}. Counts are ints or "k/n" texts; "success_at_end" defaults to "success_once".
    InvalidInputError naming `who` (the EvalRecord), the field and the value for a count that is not one.
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
            raise InvalidInputError(
                f"{who} for task {task!r} has no success_once count", field=str(task), hint=RESULT_HINT
            )
        episodes = _episodes(row["episodes"], f"{who}: tasks[{task!r}]")
        once = _successes(once, episodes, f"{who}: tasks[{task!r}].success_once")
        out[str(task)] = {
            "episodes": episodes,
            "success_once": once,
            "success_at_end": _successes(
                row.get("success_at_end", once), episodes, f"{who}: tasks[{task!r}].success_at_end"
            ),
            "details": _task_details(row, f"{who}: tasks[{task!r}]"),
        }
    for task, episodes in dict(result.get("per_episode") or {}).items():
        if str(task) in out and episodes:
            out[str(task)]["outcomes"] = _outcomes(episodes, out[str(task)], str(task))
    if not out:
        raise InvalidInputError(
            f"{who} holds no per-task counts (expected tasks: {{task: {{episodes, success_once, ...}}}})",
            hint=RESULT_HINT,
        )
    return out


def _outcomes(episodes: Sequence[Mapping[str, Any]], counts: Mapping[str, Any], task: str) -> dict[str, Any]:
    """Per-episode outcomes (EvalResult.to_dict()["per_episode"][task]) as evidence keeps them: the reset seeds
    (Fetch) or init-state indices (LIBERO: rows with `init_state`) in episode order and one "0"/"1" character per
    episode per metric, so a comparison can pair episodes by initial state."""
    rows = sorted(episodes, key=lambda e: e.get("episode", 0))
    if rows and all("init_state" in e for e in rows):
        out: dict[str, Any] = {"init_states": [int(e["init_state"]) for e in rows]}
    else:
        out = {"reset_seeds": [int(e["reset_seed"]) for e in rows]}
    for m in COUNT_METRICS:
        out[m] = "".join(_outcome(e[m], task, e.get("episode", i), m) for i, e in enumerate(rows))
        if len(rows) != counts["episodes"] or out[m].count("1") != counts[m]:
            raise InvalidInputError(
                f"per-episode outcomes of task {task!r} do not add up to its {m} count "
                f"{counts[m]}/{counts['episodes']}",
                field=f"per_episode[{task!r}]",
            )
    return out


def _outcome(value: Any, task: str, episode: Any, metric: str) -> str:
    """ "1" or "0" for one episode's outcome: a bool or the whole number 0 or 1 (numpy's bools and integers too).
    Anything else (0.5, NaN, "False", 2, None) is refused naming the task and episode: it was written as a success
    whenever truthy (audit50 C F5), and is no outcome docs/config.md's `is_success` rule would take."""
    kind = getattr(getattr(value, "dtype", None), "kind", "")
    numpy_whole = type(value).__module__ == "numpy" and kind in ("b", "i", "u")
    if (isinstance(value, (bool, int)) or numpy_whole) and getattr(value, "shape", ()) == () and value in (0, 1):
        return "1" if value else "0"
    raise InvalidInputError(
        f"per-episode outcome {metric} of task {task!r}, episode {episode!r}, is {value!r}: an outcome must be a "
        "bool or 0/1",
        field=f"per_episode[{task!r}][{episode!r}].{metric}",
        hint="have the evaluation record each episode's success as True/False (or 0/1); " + BAD_VALUE_HINT,
    )


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
    counts = _task_counts(record.result, who=f"EvalRecord {record.label!r}")
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
    only when given; `sequential` records a sequential evaluation's stop
    (reproduction.recipes.recap.policy.evaluate_sequentially), and is absent when the evaluation was fixed.

    Deterministic: the same results give the same bytes (an interrupted and resumed run's evidence equals an
    uninterrupted one's), so no clock is read; pass `created` to stamp a time (reference evidence does).
    """
    labels = [primary.label, *(b.label for b in baselines)]
    if len(set(labels)) != len(labels):
        raise InvalidInputError(
            f"build_evidence: evaluation labels must be unique, got {labels}",
            field="label",
            hint="give the primary EvalRecord and each baseline a label of its own",
        )
    doc: dict[str, Any] = {"format": FORMAT, "format_version": FORMAT_VERSION, "name": name, "run_id": run_id}
    if created is not None:
        doc["created"] = created.astimezone(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    doc |= {
        **evaluation_entry(primary),
        "seeds": _numbers("seeds", seeds, int),
        "settings": redact(dict(settings)),
        "baselines": [evaluation_entry(b) for b in baselines],
    }
    if tolerances:
        doc["tolerances"] = _numbers("tolerances", tolerances, float)
    if margins:
        doc["margins"] = _numbers("margins", margins, float)
    if alpha is not None:
        doc["alpha"] = _number("alpha", alpha, float)
    if sequential:
        doc["sequential"] = dict(sequential)
    return doc


ARGUMENT_HINT = (
    "hand build_evidence seeds as {name: whole number}, margins and tolerances as {key: number}, and alpha as a "
    "number (the values a recipe's eval config and its reference declare)"
)


def _number(where: str, value: Any, kind: type) -> Any:
    """`value` as `kind` (int for a seed, float for a margin, tolerance or alpha, finite), or InvalidInputError
    (exit 4) naming the argument and the value (audit47: a ValueError/TypeError here was an internal error, exit 1)."""
    try:
        if isinstance(value, bool):
            raise TypeError(value)
        out = kind(value)
    except (TypeError, ValueError, OverflowError):
        out = None
    if out is None or (kind is float and not math.isfinite(out)):
        want = "a whole number" if kind is int else "a finite number"
        raise InvalidInputError(
            f"build_evidence: {where} is {value!r}, not {want}", field=where.partition("[")[0], hint=ARGUMENT_HINT
        )
    return out


def _numbers(where: str, values: Any, kind: type) -> dict[str, Any]:
    if not isinstance(values, Mapping):
        raise InvalidInputError(
            f"build_evidence: {where} is {values!r}, not a mapping of names to numbers", field=where, hint=ARGUMENT_HINT
        )
    return {k: _number(f"{where}[{k!r}]", v, kind) for k, v in values.items()}


def write_evidence(path: Path, evidence: Mapping[str, Any]) -> Path:
    """Write an evidence document atomically (indented, keys in build order) and return its path. A write refused
    (a read-only evidence/ folder) is WriteFailedError (exit 8) naming the evidence file and what to fix; a full disk
    is left to the disk-full error, which says how much is needed."""
    from reproduction.errors import is_disk_full, os_error

    try:
        atomic_write_text(Path(path), json.dumps(evidence, indent=1) + "\n")
    except OSError as exc:
        if is_disk_full(exc):
            raise
        raise os_error(exc, "an evidence file", hint=_writable_hint(Path(path).parent)) from None
    return Path(path)


def refuse_unwritable_outputs(run_dir: Path, out_dir: Path) -> None:
    """WriteFailedError (exit 8) naming the folder and how to fix it when `run_dir`/evidence (the evidence file and
    its comparison) or `out_dir` (the simulator's output) cannot be written: an eval command checks before the first
    rollout, not after every export was evaluated (audit47 F17), and says what write_evidence would say at the end."""
    from reproduction.fsio import refuse_unwritable

    for folder, what in ((run_dir / "evidence", "an evidence file"), (out_dir, "the evaluation's output")):
        refuse_unwritable(folder, what, hint=_writable_hint(folder))


def _writable_hint(folder: Path) -> str:
    return f"make {folder} writable (its permissions, `chattr -i`, a read-write mount), then rerun the same command"


def write_eval_evidence(path: Path, primary: EvalRecord, **kwargs: Any) -> Path:
    """`build_evidence(primary, **kwargs)` written to `path`: the one call the runner makes per evaluation."""
    return write_evidence(path, build_evidence(primary, **kwargs))


def load_evidence(path: Path) -> dict[str, Any]:
    """Read an evidence file; refuses other formats, other major versions and malformed fields (counts, outcomes,
    alpha, margins: reproduction.run.evidence_check) with the fix named (InvalidInputError, exit 4; a missing file
    InputNotFoundError, exit 3)."""
    path = Path(path)
    try:
        doc, repeats = strict_json.loads_noting_repeats(path.read_text(encoding="utf-8"), named=_NAMED)
    except FileNotFoundError as exc:
        raise InputNotFoundError(
            f"evidence file {path} does not exist",
            path=path,
            hint="check the path (an evaluation writes evidence/eval_*.json)",
        ) from exc
    except (OSError, ValueError) as exc:
        raise InvalidInputError(
            f"evidence file {path} is not JSON: {exc}", path=path, hint=f"fix or regenerate {path}"
        ) from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else f"a JSON {type(doc).__name__}"
        raise InvalidInputError(
            f"{path} is not {FORMAT} evidence (format: {found!r})",
            path=path,
            field="format",
            hint="pass an evaluation's evidence/eval_*.json (or a bundle's evidence folder)",
        )
    version = str(doc.get("format_version", ""))
    if version.split(".")[0] not in READS:
        raise UnsupportedFormatError(
            f"{path} has evidence format {version!r}; this build reads {', '.join(v + '.x' for v in READS)}",
            path=path,
            field="format_version",
            hint="use the recap-portable release that wrote it, or upgrade this one",
        )
    for where, key, times in repeats:
        raise InvalidInputError(
            f"{path} is malformed evidence: the key {key!r} occurs {times} times in {where or 'the top level'}; "
            "JSON keeps only the last, so the others would be silently dropped",
            path=path,
            field=f"{where}[{key!r}]" if where else key,
            hint=f"keep one {key!r} in {where or 'the top level'} of {path} (merge or rename the others)",
        )
    check_evidence(doc, where=path)
    _check_task_details(doc, path)
    return doc


_NAMED = frozenset({"tasks", "margins", "tolerances"})
"""Objects keyed by a name (a task, a metric) rather than by a field: check_evidence names their entries [repr]."""


_COMPARISON = frozenset(
    {
        "COMPARISON_FORMAT",
        "Comparison",
        "MetricComparison",
        "compare_evidence",
        "compare_files",
        "overall_verdict",
        "write_comparison",
    }
)


def __getattr__(name: str) -> Any:
    """The comparison's names, which lived here before reproduction.run.comparison: imported on first use (the
    comparison imports this module, so a top-level import here would be circular)."""
    if name in _COMPARISON:
        from reproduction.run import comparison

        return getattr(comparison, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
