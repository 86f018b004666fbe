"""The checks an evaluation evidence document must pass before anything compares or plans with it.

One place (`check_evidence`) that both `load_evidence` (a file) and `compare_evidence` (a document built in
memory, a model card's results) call, so a malformed count, margin or outcome string is refused with the field
named (InvalidInputError, exit 4) instead of raising a bare KeyError/TypeError (exit 1) or giving a verdict.
Every problem is collected and raised at once, so one pass fixes them all.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from reproduction.errors import InvalidInputError
from reproduction.run.sequential import RecordError, record_level
from reproduction.run.stats import MIN_ALPHA

COUNT_METRICS = ("success_once", "success_at_end")
MAX_SHOWN = 8
MAX_COUNT = 2**53
"""The largest count evidence may hold: every integer up to it is a float exactly, and the statistics compute in
floats (a count of 10**300 was an OverflowError, exit 1; audit50 C F3)."""


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _count(value: Any, where: str, problems: list[tuple[str, str]], *, reference: bool) -> tuple[int, int] | None:
    """A count metric {"successes", "episodes", "rate", "display"}; its (successes, episodes) when sound."""
    if not isinstance(value, Mapping):
        problems.append((where, f"{where} is {value!r}, not a count {{successes, episodes, rate, display}}"))
        return None
    k, n = value.get("successes"), value.get("episodes")
    bad = len(problems)
    for key, x in (("successes", k), ("episodes", n)):
        if not _is_int(x) or x < 0:
            problems.append((f"{where}.{key}", f"{where}.{key} is {x!r}, not a whole number >= 0"))
        elif x > MAX_COUNT:
            problems.append(
                (
                    f"{where}.{key}",
                    f"{where}.{key} is a number of {len(str(x))} digits, above {MAX_COUNT} (2**53), the largest count "
                    "evidence holds (give the true count)",
                )
            )
    if len(problems) == bad and k > n:
        problems.append((where, f"{where}: successes {k} exceed episodes {n}"))
    if len(problems) == bad and reference and n == 0:
        problems.append((where, f"{where}: the reference has 0 episodes, so there is nothing to compare with"))
    rate = value.get("rate")
    if not _is_number(rate) or not 0 <= rate <= 1:
        problems.append((f"{where}.rate", f"{where}.rate is {rate!r}, not a number in [0, 1]"))
    elif len(problems) == bad and n and abs(rate - k / n) > 1e-6:
        problems.append((f"{where}.rate", f"{where}.rate {rate!r} is not successes/episodes = {k}/{n}"))
    if not isinstance(value.get("display"), str):
        problems.append(
            (f"{where}.display", f"{where}.display is {value.get('display')!r}, not a text such as '90.0% (90/100)'")
        )
    _wilson(value, where, problems)
    return (k, n) if len(problems) == bad else None


def _wilson(value: Mapping[str, Any], where: str, problems: list[tuple[str, str]]) -> None:
    """A count's `wilson95` (optional) is an interval of rates, [low, high] within [0, 1]: a text or a reversed or
    NaN interval was accepted and carried on as the schema's "Wilson 95% score interval" (audit54 B3)."""
    if "wilson95" not in value:
        return
    w = value["wilson95"]
    if not (isinstance(w, list) and len(w) == 2 and all(_is_number(x) and 0 <= x <= 1 for x in w) and w[0] <= w[1]):
        problems.append(
            (f"{where}.wilson95", f"{where}.wilson95 is {w!r}, not an interval [low, high] with 0 <= low <= high <= 1")
        )


def _metric(
    name: str, value: Any, where: str, problems: list[tuple[str, str]], *, reference: bool
) -> tuple[int, int] | None:
    if isinstance(value, Mapping) and "value" in value and not {"successes", "episodes", "rate"} & set(value):
        if not _is_number(value["value"]):
            problems.append((f"{where}.value", f"{where}.value is {value['value']!r}, not a finite number"))
        return None
    return _count(value, where, problems, reference=reference)


def _outcomes(o: Any, counts: Mapping[str, tuple[int, int]], where: str, problems: list[tuple[str, str]]) -> None:
    """Per-episode outcomes must be the episodes the task's counts count: one 0/1 character per episode,
    as many ones as successes, one initial state (an int) per episode."""
    if not isinstance(o, Mapping):
        problems.append((where, f"{where} is {o!r}, not {{reset_seeds | init_states, success_once, success_at_end}}"))
        return
    kinds = [k for k in ("reset_seeds", "init_states") if k in o]
    if len(kinds) != 1:
        problems.append(
            (where, f"{where} holds {kinds or 'neither'} of reset_seeds / init_states; it needs exactly one")
        )
        return
    states = o[kinds[0]]
    if not isinstance(states, list) or not all(_is_int(s) for s in states):
        problems.append(
            (
                f"{where}.{kinds[0]}",
                f"{where}.{kinds[0]} must be a list of whole numbers (one initial state per episode)",
            )
        )
        return
    for m, (k, n) in counts.items():
        text = o.get(m)
        if not isinstance(text, str) or set(text) - {"0", "1"}:
            problems.append((f"{where}.{m}", f"{where}.{m} must be a text of 0/1 characters, one per episode"))
        elif len(text) != n or len(states) != n or text.count("1") != k:
            problems.append(
                (
                    f"{where}.{m}",
                    f"{where}.{m} holds {text.count('1')} successes in {len(text)} episodes ({len(states)} "
                    f"{kinds[0]}), but the task's count is {k}/{n}",
                )
            )


def _entry(entry: Any, where: str, problems: list[tuple[str, str]], *, reference: bool) -> None:
    """One evaluated policy: {"policy": {"label"}, "metrics", "tasks"}."""
    if not isinstance(entry, Mapping):
        problems.append((f"{where or 'the document'}", f"{where or 'the document'} is not a JSON object"))
        return
    pre = f"{where}." if where else ""
    policy = entry.get("policy")
    if not isinstance(policy, Mapping) or not isinstance(policy.get("label"), str) or not policy["label"]:
        problems.append((f"{pre}policy.label", f"{pre}policy.label is missing or not a text (policy: {policy!r})"))
    metrics = entry.get("metrics")
    if not isinstance(metrics, Mapping) or not metrics:
        problems.append((f"{pre}metrics", f"{pre}metrics is missing or empty (metrics: {metrics!r})"))
        metrics = {}
    overall = {m: _metric(m, v, f"{pre}metrics.{m}", problems, reference=reference) for m, v in metrics.items()}
    _at_end_within_once(overall, f"{pre}metrics", problems)
    tasks = entry.get("tasks", {})
    if not isinstance(tasks, Mapping):
        problems.append((f"{pre}tasks", f"{pre}tasks is {type(tasks).__name__}, not an object of tasks"))
        return
    summed: dict[str, list[tuple[int, int] | None]] = {m: [] for m in COUNT_METRICS}
    for task, row in tasks.items():
        at = f"{pre}tasks[{task!r}]"
        if not isinstance(row, Mapping):
            problems.append((at, f"{at} is not an object"))
            continue
        counts = {}
        own = row.get("episodes")
        if "episodes" in row and (not _is_int(own) or not 0 <= own <= MAX_COUNT):
            # a text, list, null, bool or 100.0 skipped the cross-check below and was accepted (audit54 B3)
            problems.append((f"{at}.episodes", f"{at}.episodes is {own!r}, not a whole number >= 0"))
        for m in COUNT_METRICS:
            if m in row:
                got = _count(row[m], f"{at}.{m}", problems, reference=reference)
                if got is not None:
                    counts[m] = got
                if got is not None and _is_int(row.get("episodes")) and got[1] != row["episodes"]:
                    problems.append((f"{at}.{m}", f"{at}.{m} counts {got[1]} episodes, the task {row['episodes']}"))
            summed[m].append(counts.get(m))
        _at_end_within_once(counts, at, problems)
        if "outcomes" in row and len(counts) == sum(m in row for m in COUNT_METRICS):
            _outcomes(row["outcomes"], counts, f"{at}.outcomes", problems)
    _overall_is_the_tasks_sum(overall, summed, len(tasks), pre, problems)


def _at_end_within_once(
    counts: Mapping[str, tuple[int, int] | None], where: str, problems: list[tuple[str, str]]
) -> None:
    """success_at_end (success at the episode's last step) is within success_once (success at any step): on the
    same episodes its successes cannot be more (audit46 stats F9). Checked where both count the same episodes,
    as a task's two counts do (each counts the task's episodes) and a policy's overall two do."""
    once, end = counts.get("success_once"), counts.get("success_at_end")
    if once is None or end is None or once[1] != end[1] or end[0] <= once[0]:
        return
    problems.append(
        (
            f"{where}.success_at_end",
            f"{where}.success_at_end counts {end[0]} successes, more than {where}.success_once's {once[0]} on the "
            f"same {once[1]} episodes: an episode that succeeds at its end has succeeded at some step (correct the "
            "count that is wrong)",
        )
    )


def _overall_is_the_tasks_sum(
    overall: Mapping[str, tuple[int, int] | None],
    summed: Mapping[str, list[tuple[int, int] | None]],
    tasks: int,
    pre: str,
    problems: list[tuple[str, str]],
) -> None:
    """A policy's overall count of a metric is its tasks' counts added up, wherever every task has a sound count
    of it: a comparison pairs an overall row on the tasks' pooled outcomes, so an overall count that disagrees
    would be shown beside a test of other numbers (audit46 stats F3: 200/200 shown as `reproduced` against 106/200)."""
    for m, rows in summed.items():
        if not tasks or len(rows) != tasks or None in rows or overall.get(m) is None:
            continue
        k, n = overall[m]
        ks, ns = sum(r[0] for r in rows), sum(r[1] for r in rows)
        if (k, n) != (ks, ns):
            problems.append(
                (
                    f"{pre}metrics.{m}",
                    f"{pre}metrics.{m} counts {k}/{n}, but its tasks' {m} counts add up to {ks}/{ns}: an overall "
                    f"count must be the sum over the tasks (set it to {ks}/{ns}, or correct the task that is wrong)",
                )
            )


def _levels(doc: Mapping[str, Any], problems: list[tuple[str, str]]) -> None:
    """A reference's `alpha`, `margins`, `tolerances` and a sequential record's `level`."""
    if "alpha" in doc and not (_is_number(doc["alpha"]) and 0 < doc["alpha"] < 0.5):
        problems.append(
            ("alpha", f"alpha is {doc['alpha']!r}; it must be a number strictly between 0 and 0.5 (e.g. 0.05)")
        )
    elif "alpha" in doc and doc["alpha"] < MIN_ALPHA:
        problems.append(("alpha", _too_small("alpha", doc["alpha"])))
    for key, low_ok in (("margins", False), ("tolerances", True)):
        if key not in doc:
            continue
        if not isinstance(doc[key], Mapping):
            problems.append((key, f"{key} is {doc[key]!r}, not an object of metric -> margin"))
            continue
        for name, m in doc[key].items():
            if not _is_number(m) or m < 0 or (m == 0 and not low_ok) or (key == "margins" and m >= 1):
                rule = "a number >= 0" if low_ok else "a number strictly between 0 and 1 (e.g. 0.05)"
                problems.append((f"{key}[{name!r}]", f"{key}[{name!r}] is {m!r}; it must be {rule}"))
    seq = doc.get("sequential")
    if seq is not None:
        level = seq.get("level") if isinstance(seq, Mapping) else None
        if not isinstance(seq, Mapping) or ("level" in seq and not (_is_number(level) and 0 < level < 0.5)):
            problems.append(
                ("sequential.level", f"sequential.level is {level!r}; it must be a number strictly between 0 and 0.5")
            )
        elif "level" in seq and level < MIN_ALPHA:
            problems.append(("sequential.level", _too_small("sequential.level", level)))
        else:
            try:  # the level must be the one the record's own rule spends at its stopping look (audit50 C F1)
                record_level(seq)
            except RecordError as exc:
                problems.append((exc.field, str(exc)))


def _too_small(name: str, value: float) -> str:
    return (
        f"{name} is {value!r}, below {MIN_ALPHA:g}: the smallest test level recap-portable computes (1 - 2 alpha "
        "would round to 1); give one of at least that, e.g. 0.05"
    )


def _unique_labels(doc: Mapping[str, Any], baselines: Sequence[Any], problems: list[tuple[str, str]]) -> None:
    """Every policy's label (the primary's and each baseline's) differs from the others': a comparison matches
    policies by label, so a baseline labelled like the primary replaced it (audit46 stats F4)."""
    first: dict[str, str] = {}
    for where, entry in [("", doc), *((f"baselines[{i}]", b) for i, b in enumerate(baselines))]:
        policy = entry.get("policy") if isinstance(entry, Mapping) else None
        label = policy.get("label") if isinstance(policy, Mapping) else None
        if not isinstance(label, str) or not label:
            continue  # named by _entry
        field = f"{where}.policy.label" if where else "policy.label"
        if label in first:
            problems.append(
                (
                    field,
                    f"{field} {label!r} is also {first[label]}'s label: each policy needs its own label, since a "
                    "comparison matches policies by label (rename one of them)",
                )
            )
        else:
            first[label] = where or "the primary policy"


def _seeds_and_settings(doc: Mapping[str, Any], problems: list[tuple[str, str]]) -> None:
    """`seeds` and `settings` are objects (or null) and `settings.tasks` a list of texts: a comparison reads them
    key by key, so a text, list or number there was an internal error, exit 1 (audit54 B1)."""
    for key in ("seeds", "settings"):
        if doc.get(key) is not None and not isinstance(doc[key], Mapping):
            problems.append((key, f"{key} is {doc[key]!r}, not an object of name -> value"))
    settings = doc.get("settings")
    tasks = settings.get("tasks") if isinstance(settings, Mapping) else None
    if tasks is not None and not (isinstance(tasks, list) and all(isinstance(t, str) for t in tasks)):
        problems.append(("settings.tasks", f"settings.tasks is {tasks!r}, not a list of task names"))


def check_evidence(doc: Mapping[str, Any], *, where: str | Path, reference: bool = False) -> None:
    """Raise InvalidInputError (exit 4) listing every malformed field of an evidence document; `reference`: also
    refuse a count of 0 episodes (nothing to compare with). Returns None and changes nothing when all is well."""
    problems: list[tuple[str, str]] = []
    _entry(doc, "", problems, reference=reference)
    baselines = doc.get("baselines", [])
    if not isinstance(baselines, Sequence) or isinstance(baselines, str):
        problems.append(("baselines", f"baselines is {type(baselines).__name__}, not a list"))
        baselines = []
    for i, b in enumerate(baselines):
        _entry(b, f"baselines[{i}]", problems, reference=reference)
    _unique_labels(doc, baselines, problems)
    _seeds_and_settings(doc, problems)
    _levels(doc, problems)
    if problems:
        texts = [text for _, text in problems]
        shown = texts[:MAX_SHOWN] + ([f"... and {len(texts) - MAX_SHOWN} more"] if texts[MAX_SHOWN:] else [])
        first = problems[0][0]
        raise InvalidInputError(
            f"{where} is malformed evidence: " + "; ".join(shown),
            path=str(where),
            field=first,
            hint=f"fix {first} in {where} (counts are whole numbers with successes <= episodes, outcomes match "
            "the counts, alpha in (0, 0.5), margins in (0, 1)); evidence/evaluation.schema.json is the format",
        )
