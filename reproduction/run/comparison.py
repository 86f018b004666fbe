"""The comparison of a run's evaluation evidence with reference evidence: one row per metric, three verdicts.

On disk (schema: evidence/comparison.schema.json)::

    <run>/evidence/comparison.json
      {"format": "recap-portable-comparison", "format_version": "2.0", "actual", "reference", "alpha",
       "verdict": "reproduced"|"differs"|"inconclusive", "reproduced", "differs_rule": "holm",
       "differs_holm": {metric: level}, "notes": [...],
       "rows": [{"metric", "kind": "rate"|"value", "reference", "actual", "difference", "reference_counts",
                 "actual_counts", "interval", "confidence", "margin", "method", "reference_display",
                 "actual_display", "verdict", "note", "p_differs", "alpha_calibrated"}, ...]}

The overall verdict: `reproduced` when every row is; `differs` when a non-test row differs (missing metric,
plain value) or a rate row's differs survives Holm's step-down over the rate rows (`holm_differs`); else
`inconclusive`. An overall rate row whose two sides mix the tasks too differently (`UNEVEN`) is shown but not
counted (`counts_toward_verdict`): its policy's per-task rows decide.

Rates get the equivalence test of reproduction.run.stats (Newcombe, or Tango paired by reset seed or LIBERO
init state);
plain values a declared tolerance, else exact. 1.x comparison files are still read. Also importable
from reproduction.run.evidence (its historical home).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import math
import operator
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reproduction.errors import InputNotFoundError, InvalidInputError, UnsupportedFormatError
from reproduction.fsio import atomic_write_text
from reproduction.run.evidence import COUNT_METRICS, EXACT, FORMAT_VERSION, READS, load_evidence
from reproduction.run.evidence_check import check_evidence
from reproduction.run.stats import DEFAULT_ALPHA, DEFAULT_MARGIN, episodes_needed

COMPARISON_FORMAT = "recap-portable-comparison"
NO_EPISODES = "this run evaluated 0 episodes for this row: nothing was measured, so nothing is decided"
TOO_LARGE = (
    "level not calibrated: the design is past stats.CALIBRATION_LIMIT (the uncalibrated size was measured <= 0.0515 "
    "at margin 0.05 with 700-1,500 episodes a side, evidence/README.md)"
)
UNEVEN = (
    "not counted: the tasks' episode counts are not in the same proportion on both sides, and at the reference's "
    "task rates that different weighting alone moves this overall rate by more than a tenth of its margin; the "
    "verdict follows the per-task rows"
)
"""The note of an overall rate row that is shown but does not count toward the verdict (`counts_toward_verdict`):
its two pooled rates weight the tasks too differently to compare (audit54 B4, review R1)."""
REPEATS_NOTE = "compared unpaired: an initial state repeats within a task"
NOT_NESTED = (
    "compared unpaired on all episodes: one side's initial states are among the other's but, in some task, not its "
    "first ones (a nested run shares the first k), so which states are shared may depend on the outcomes"
)
"""The note of a rate row whose sides' states are nested but not as a prefix (`_prefix`, audit60 C2)."""
NOT_COUNTED = "not counted (uneven task mix)"
"""How a table shows an `UNEVEN` row: its verdict is `inconclusive`, but the overall verdict does not wait on it."""
NOT_COUNTED_ASIDE = "; {n} shown but not counted (uneven task mix)"
"""What every summary (the closing line, the run's compare summary, report.html's banner) appends when rows are
shown but not counted, so none of them reads as if all metrics were counted (audit54 review RV1)."""
MIXTURE_SHARE = 0.1
"""The largest mixture bias, as a share of a row's margin, at which an overall rate row is still tested pooled.

Two sides that weight the tasks differently (w_run[t] != w_ref[t], each side's per-task episode share) have pooled
rates that differ by |sum_t (w_run[t] - w_ref[t]) p[t]| even when every task's rate p[t] is the same on both. Up
to a tenth of the margin that shift is small next to the margin the test allows (a run one episode short on one
task of 1,000: 0.0002 at margin 0.05), so the pooled test stands; beyond it the pooled row could read `differs`
(or `reproduced`) from the mix alone, so it is shown but not counted (`UNEVEN`) and the per-task rows decide.
Exactly proportional counts (the project's own evaluations) never reach this test."""
DIFFERS_ALONE = "differs alone, not after Holm"
"""How a table shows a rate row whose test differs at alpha but not after Holm's step-down over the rate rows: the
overall verdict does not hold it to differ (audit51 G6: it showed `differs` under an `inconclusive` verdict)."""
NOT_CALIBRATED = (
    "level not calibrated: this Python has no numpy, so this row's test may exceed its alpha (up to 0.086 on small "
    "designs, evidence/README.md)"
)

EXACT_NOT_DIFFERS = (
    "the interval lies beyond the margin, but the exact p of a difference is {p:.3g} > alpha {alpha:g}: "
    "inconclusive (Tango's interval is about twice its level when discordance is rare, evidence/README.md)"
)
"""The note of a paired row whose approximate interval differs but whose exact p-value does not (audit60 C1)."""

DIFFERS_APPROXIMATE = (
    "p_differs approximate: past stats.DIFFERS_LIMIT pairs (or without numpy) Tango's approximate p is used, which "
    "can be about twice its level when discordance is rare (evidence/README.md)"
)


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
    p_differs: float | None = None
    """Rates that differ at alpha: the one-sided p-value of "differs", which the overall verdict's Holm step-down
    uses: for a paired row of up to 500 pairs the exact test's (`stats.paired_differs_p`), else the smallest level at
    which the row's interval still lies wholly beyond the margin. None otherwise."""
    alpha_calibrated: float | None = None
    """Rates reproduced at alpha: the calibrated level alpha* <= alpha at which the verdict and the interval shown are
    computed (`stats.calibrated_alpha`: the largest level whose exact size at this row's design is <= alpha); None on
    other rows, whose interval is at alpha."""
    counted: bool = True
    """False on an `UNEVEN` overall rate row, shown but not counted toward the verdict (`counts_toward_verdict`).
    Written to comparison.json as `"counted": false` on such rows only (absent means counted), so readers need not
    match the note's wording and every other file keeps its bytes (audit54 review RV5)."""

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
        row = {
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
            "p_differs": self.p_differs,
            "alpha_calibrated": self.alpha_calibrated,
        }
        if not self.counted:
            row["counted"] = False
        return row

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
            p_differs=row.get("p_differs"),
            alpha_calibrated=row.get("alpha_calibrated"),
            # files written before the field (this stop's earlier code) are known by the note alone
            counted=bool(row.get("counted", row.get("note", "") != UNEVEN)),
        )


def counts_toward_verdict(row: MetricComparison) -> bool:
    """Whether `row` counts toward the overall verdict: every row but an `UNEVEN` overall rate row, which is shown
    (its pooled rates would weight the tasks differently) while its policy's per-task rows decide. A sequential
    evaluation waits only on the rows that count. Read from the row's `counted` field, not its note's wording."""
    return row.counted


def overall_verdict(verdicts: Sequence[str]) -> str:
    """`reproduced` only when every row is; `differs` when any row differs; else `inconclusive` (the union rule:
    rows whose `differs` is a test at alpha each need `holm_differs` for the family-wise error of `differs`)."""
    if verdicts and all(v == "reproduced" for v in verdicts):
        return "reproduced"
    return "differs" if "differs" in verdicts or not verdicts else "inconclusive"


def _test_of(r: MetricComparison) -> tuple[Any, ...]:
    """What decides a rate row's test: two rows alike in all of it are one test."""
    return (r.reference_counts, r.actual_counts, r.method, r.margin, r.low, r.high, r.confidence, r.p_differs)


def same_as_overall(rows: Sequence[MetricComparison]) -> dict[str, str]:
    """{per-task metric: its policy's overall metric} of the tested per-task rate rows ("<label>/<task>/<m>")
    that are the same test as their policy's overall row ("<label>/<m>"): the same counts on both sides, margin,
    method and interval, as with a policy of one task (the overall row pools that task alone). `eval --plan`
    counts such a row once (`same_as_overall`); so does `holm_differs` (audit51 G10)."""
    rates = {r.metric: r for r in rows if r.kind == "rate" and r.low is not None}
    out = {}
    for r in rates.values():
        head, _, metric = r.metric.rpartition("/")
        parts = head.split("/")
        for i in range(1, len(parts)):  # a label or task may hold a "/": try each split of the head
            overall = rates.get("/".join(parts[:i]) + "/" + metric)
            if overall is not None and _test_of(overall) == _test_of(r):
                out[r.metric] = overall.metric
                break
    return out


def holm_differs(rows: Sequence[MetricComparison], alpha: float) -> dict[str, float]:
    """{metric: Holm level} of the rate rows whose `differs` survives Holm's (1979) step-down over the R distinct
    tests among the rate rows: sorted by p_differs, the i-th smallest (i = 0, 1, ...) is rejected at alpha / (R - i)
    while every smaller one was. Valid under any dependence between rows (overall vs per-task, success_once vs
    at_end): given that each row's own test of `differs` has size <= alpha, P(overall differs | every true
    |d| <= m) <= alpha, where the union of R tests at alpha each reached R alpha. It is no better than the rows'
    tests: a row's test exceeds alpha when a side is tiny or the sides very unequal (evidence/README.md, "Where one
    row's test exceeds alpha": 0.11 overall at 1 run episode against 200, audit59 C1; `_run_size_note` says so).
    A per-task row that is the same test as its overall row (`same_as_overall`) is counted once: it shares the
    overall row's decision and level (counting it twice made the family of a one-task run 16, not 8). A
    success_at_end row whose counts happen to equal success_once's is not merged with it: whether they are equal
    depends on the draw, and merging them took the overall `differs` at a true difference of the margin from 0.033
    to 0.071 (n 18, review59 S1 of audit59 C3)."""
    dup = same_as_overall(rows)
    tested = [
        r for r in rows if r.kind == "rate" and r.low is not None and r.metric not in dup and counts_toward_verdict(r)
    ]
    ranked = sorted((r for r in tested if r.p_differs is not None), key=lambda r: r.p_differs)
    out = {}
    for i, r in enumerate(ranked):
        level = alpha / (len(tested) - i)
        if r.p_differs > level:
            break
        out[r.metric] = level
    out |= {metric: out[overall] for metric, overall in dup.items() if overall in out}
    return out


@dataclass(kw_only=True, slots=True)
class Comparison:
    """Every metric of a run's evidence against the reference evidence."""

    actual_name: str
    reference_name: str
    rows: list[MetricComparison]
    alpha: float = DEFAULT_ALPHA
    notes: list[str] = field(default_factory=list)
    """Why a verdict may not mean what it seems: seeds or settings that differ, a reference too small."""
    differs_rule: str = "holm"
    """How rate rows that differ make the overall `differs`: "holm" (Holm's step-down over the rate rows, so the
    overall verdict keeps alpha), or "union" (any row at alpha: comparison files without `differs_rule`)."""

    def held_differs(self) -> set[str]:
        """The metrics the overall verdict holds to differ: under "holm", every row that differs without being a
        rate test (a missing policy or metric, a reference of no episodes, a plain value out of tolerance) and the
        rate rows whose differs survives `holm_differs`; under "union", every row that differs."""
        differs = [r for r in self.rows if r.verdict == "differs"]
        if self.differs_rule != "holm":
            return {r.metric for r in differs}
        held = holm_differs(self.rows, self.alpha)
        return {r.metric for r in differs if r.metric in held or not (r.kind == "rate" and r.low is not None)}

    def shown_verdicts(self) -> list[str]:
        """Each row's verdict as the tables show it, in row order: its own, except a row that differs alone but is
        not held to differ by the overall rule (`held_differs`), shown as DIFFERS_ALONE, so the table agrees with the
        verdict; a row that does not count toward the verdict (`counts_toward_verdict`) shows NOT_COUNTED. One Holm
        pass for all rows (per row, a 728-row report took 0.39 s: audit51 review R3)."""
        held = self.held_differs()
        return [
            NOT_COUNTED
            if not counts_toward_verdict(r)
            else DIFFERS_ALONE
            if r.verdict == "differs" and r.metric not in held
            else r.verdict
            for r in self.rows
        ]

    def counts(self) -> dict[str, int]:
        """{"differs": rows held to differ (`held_differs`), "differs_alone": rows that differ alone but not after
        Holm, "inconclusive", "reproduced", "metrics": all rows}: the counts every summary of this comparison
        states (the closing line, the run's compare summary, report.html's banner), so they agree with `verdict`.
        A row that does not count toward the verdict (`counts_toward_verdict`) is among "metrics" only; each
        summary names those rows with `not_counted_aside()`."""
        held = self.held_differs()
        differs = sum(r.verdict == "differs" for r in self.rows)
        return {
            "differs": len(held),
            "differs_alone": differs - len(held),
            "inconclusive": sum(r.verdict == "inconclusive" and counts_toward_verdict(r) for r in self.rows),
            "reproduced": sum(r.verdict == "reproduced" for r in self.rows),
            "metrics": len(self.rows),
        }

    def not_counted_aside(self) -> str:
        """`NOT_COUNTED_ASIDE` for this comparison's rows shown but not counted, or "" when every row counts."""
        n = sum(not counts_toward_verdict(r) for r in self.rows)
        return NOT_COUNTED_ASIDE.format(n=n) if n else ""

    def verdict_text(self) -> str:
        """The verdict with its counts: "reproduced", or e.g. "differs (4 differ, 0 inconclusive of 32 metrics)";
        rows that differ alone but not after Holm are counted apart ("..., 4 differ alone but not after Holm, ...")
        and never among those that differ. Rows shown but not counted are always named, with `NOT_COUNTED_ASIDE`:
        "reproduced (4 metrics equivalent; 2 shown but not counted (uneven task mix))", "differs (2 differ,
        0 inconclusive of 6 metrics; 2 shown but not counted (uneven task mix))" (audit54 review RV1)."""
        verdict = self.verdict
        c = self.counts()
        aside = self.not_counted_aside()
        if verdict == "reproduced":
            return f"{verdict} ({c['reproduced']} metrics equivalent{aside})" if aside else verdict
        alone = f"{c['differs_alone']} differ alone but not after Holm, " if c["differs_alone"] else ""
        counted = f"{c['inconclusive']} inconclusive of {c['metrics']} metrics"
        return f"{verdict} ({c['differs']} differ, {alone}{counted}{aside})"

    @property
    def verdict(self) -> str:
        """`reproduced` when every row that counts toward it (`counts_toward_verdict`) is; `differs` when a row is
        held to differ (`held_differs`) or there is no row; else `inconclusive`. A row shown but not counted (an
        `UNEVEN` overall row) leaves the verdict to its policy's per-task rows: every task within the margin puts
        any weighted mean of the tasks within it too."""
        counted = [r for r in self.rows if counts_toward_verdict(r)]
        if counted and all(r.verdict == "reproduced" for r in counted):
            return "reproduced"
        # no row at all: nothing the reference holds was found (the union rule's answer, kept)
        return "differs" if not self.rows or self.held_differs() else "inconclusive"

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
        held_set = self.held_differs()
        for r, shown in zip(self.rows, self.shown_verdicts(), strict=True):
            diff = "-" if r.difference is None else f"{r.difference:+.3f} {r.interval_text()}".rstrip()
            if r.kind == "value" and r.difference and f"{abs(r.difference):.3f}" == "0.000":
                diff = f"{r.difference:+.2g}"  # a value row differs beyond 1e-9: show how far (audit59 C6)
            kind = f"±{r.margin:.3f} ({r.method})" if r.kind == "rate" else f"±{r.margin:.3g} (value, {r.method})"
            body.append((r.metric, r.reference_display, r.actual_display, diff, kind, shown))
        widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [head, *body]]
        lines.append(
            f"rates: two one-sided tests at alpha {self.alpha:g} ({level} interval inside ±margin: reproduced; "
            "wholly beyond it: differs, a paired row's exact p at most alpha too; else inconclusive). values: not "
            "binomial, so a declared tolerance or exact."
        )
        lines += [f"note: {n}" for n in self.notes]
        if self.differs_rule == "holm" and any(r.verdict == "differs" and r.p_differs is not None for r in self.rows):
            dup = same_as_overall(self.rows)
            rates = sum(r.kind == "rate" and r.low is not None for r in self.rows)
            tested = f"{rates} rate rows"
            if dup:
                tested = (
                    f"{rates - len(dup)} distinct rate tests ({rates} rate rows; {len(dup)} per-task rows are the same "
                    "test as their policy's overall row and counted once)"
                )
            alone = sum(r.p_differs is not None for r in self.rows)
            held = sum(r.p_differs is not None and r.metric in held_set for r in self.rows)
            lines.append(
                f"overall: a rate differs only when its test survives Holm's step-down over the {tested} at alpha "
                f"{self.alpha:g} ({held} of {alone} rows that differ alone do"
                + (f"; the others show {DIFFERS_ALONE!r})" if held < alone else ")")
            )
        # rows pair policies by label; each side's name is its own primary (RECAP: recap at that side's best w)
        primaries = f"this run's primary: {self.actual_name}; the reference's: {self.reference_name}"
        lines.append(f"every policy vs the reference's of the same label ({primaries}): {self.verdict_text()}")
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
            differs_rule=str(data.get("differs_rule", "union")),
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
            "differs_rule": self.differs_rule,
            "differs_holm": holm_differs(self.rows, self.alpha) if self.differs_rule == "holm" else {},
            "notes": list(self.notes),
            "rows": [r.to_dict() for r in self.rows],
        }


def declared_margin(margins: Mapping[str, float], label: str, key: str) -> float | None:
    """The most specific margin `margins` declares for policy `label`'s row `key` ("<metric>", or "<task>/<metric>"
    for a task's row): "<label>/<key>", "<key>", then for a task's row its policy's "<label>/<metric>", then the
    metric alone. The one rule for `compare` and `eval --plan` (a "<label>/<metric>" margin covered the plan's task
    rows but not compare's, which judged them at the default: audit63 C F1)."""
    metric = key.rsplit("/", 1)[-1]
    for candidate in dict.fromkeys((f"{label}/{key}", key, f"{label}/{metric}", metric)):
        if candidate in margins:
            return float(margins[candidate])
    return None


@dataclass(kw_only=True, slots=True, frozen=True)
class _Side:
    """One side of a row: the count (or value) and, for rates, the per-episode outcomes keyed by reset seed."""

    metric: Mapping[str, Any] | None
    outcomes: dict[tuple[str, str, int], bool] | None = None
    repeats: bool = False
    """Some initial state occurs twice in one task: episodes cannot be matched one to one, so the row is unpaired."""


def _prefix(mine: Mapping[tuple[str, str, int], bool], other: Mapping[tuple[str, str, int], bool]) -> bool:
    """Whether, per task, the states of `mine` (a subset of `other`'s) are the first ones of `other`'s in its
    episode order, as in a nested run (fewer episodes per task evaluate the first k of the longer run's states).
    C-level passes (groupby, islice): 1e6 episodes a side."""
    need = collections.Counter(map(operator.itemgetter(0), mine))
    for task, group in itertools.groupby(other, key=operator.itemgetter(0)):
        k = need.get(task, 0)
        if k:
            head = list(itertools.islice(group, k))
            if not all(map(mine.__contains__, head)):
                return False
            need[task] = k - len(head)
    return True


def _paired(ref: _Side, act: _Side) -> tuple[list[bool], list[bool], list[bool], list[bool]] | str | None:
    """Both sides' outcomes on their shared initial states, in one order, and each side's outcomes beyond them, when
    one side's states contain the other's (the same states, or a run that evaluated every state of the reference
    and more, or only some of them: reset seeds depend on the seed, task and episode index alone, so a run with
    more episodes per task evaluates a superset). Else None: partly overlapping states are compared unpaired.
    Testing the shared episodes alone is unbiased only when which states are shared does not depend on any outcome:
    so a strict subset is paired only when, per task, it is the first states of the other side's episode order
    (`_prefix`, a nested run); else NOT_NESTED, and the full sides are compared unpaired (audit60 C2: a run of only
    the reference's 90 successful seeds was `reproduced`, 100% vs 100%). Pairing gives up the extra episodes
    (audit54 B2: 100 shared of 200 was `inconclusive` unpaired where the 100 pairs alone decided)."""
    if ref.outcomes is None or act.outcomes is None:
        return None
    # one pass over dicts, no sort of the keys (audit56 C2: sorting 1e6 tuple keys per row took minutes): pairs are
    # taken in the smaller side's own order, and the test depends on the pairs' counts alone, not their order
    mine, other = (
        (ref.outcomes, act.outcomes) if len(ref.outcomes) <= len(act.outcomes) else (act.outcomes, ref.outcomes)
    )
    if not mine or not mine.keys() <= other.keys():
        return None
    if len(mine) < len(other) and not _prefix(mine, other):
        return NOT_NESTED
    inner = list(map(other.__getitem__, mine))
    rest = [v for k, v in other.items() if k not in mine] if len(other) > len(mine) else []
    if mine is ref.outcomes:
        return list(mine.values()), inner, [], rest
    return inner, list(mine.values()), rest, []


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
    if a is None or not r["episodes"]:
        return MetricComparison(
            **common,
            actual=None if a is None else float(a["rate"]),
            method="newcombe-10",
            verdict="differs",
            actual_display="missing" if a is None else a["display"],
            note="this run has no such metric" if a is None else "no episodes on one side",
        )
    if not a["episodes"]:  # nothing measured is no evidence of a difference (it was `differs`, audit46 stats F7)
        return MetricComparison(
            **common,
            actual=None,  # no rate: 0/0 read as 0.0 gave a "difference" of -1.0 (audit59 C4)
            method="newcombe-10",
            verdict="inconclusive",
            actual_display=a["display"],  # the counts, 0/0; the difference column shows "-"
            actual_counts=(0, 0),
            note=NO_EPISODES,
        )
    pairs = None if ref.repeats or act.repeats else _paired(ref, act)
    nested_note = ""
    if isinstance(pairs, str):
        nested_note, pairs = pairs, None
    design: tuple[int, int, bool]
    if pairs is not None:
        ref_pairs, act_pairs, ref_rest, act_rest = pairs
        at = lambda level: equivalence_paired(ref_pairs, act_pairs, margin=margin, alpha=level)  # noqa: E731
        test = at(alpha)
        design = (len(ref_pairs), len(ref_pairs), True)
        b, c = test.discordant or (0, 0)
        by = "init state" if "init_states" in map(operator.itemgetter(1), ref.outcomes) else "reset seed"
        note = f"paired by {by}: {test.pairs} episodes, {b} succeeded only in the reference, {c} only here"
        if ref_rest or act_rest:
            # the row then shows both sides on the shared states, so its rates, difference and interval agree
            # (audit55 review: the whole run's rate beside the pairs' interval read -0.265 [-0.013, +0.013])
            from reproduction.run.evidence import count_metric

            r = count_metric(sum(ref_pairs), len(ref_pairs))
            a = count_metric(sum(act_pairs), len(act_pairs))
            common |= {"reference": r["rate"], "reference_display": r["display"]}
            common["reference_counts"] = (r["successes"], r["episodes"])
            rest, whose = (act_rest, "this run's") if act_rest else (ref_rest, "the reference's")
            note += (
                f"; both rates are on the initial states both sides evaluated: {whose} {len(rest)} other episodes "
                f"({100 * sum(rest) / len(rest):.1f}% success) are not in the test"
            )
    else:
        counts = (int(r["successes"]), int(r["episodes"]), int(a["successes"]), int(a["episodes"]))
        at = lambda level: equivalence_independent(*counts, margin=margin, alpha=level)  # noqa: E731
        test = at(alpha)
        design = (counts[1], counts[3], False)
        note = (
            f"{REPEATS_NOTE}, so episodes cannot be matched one to one" if ref.repeats or act.repeats else nested_note
        )
    test, calibrated, why = _judged(at, test, design, margin, alpha)
    p_differs, verdict = None, test.verdict
    if test.verdict == "differs":
        p_differs, why_p = _row_p_differs(at, test, margin, alpha)
        if p_differs > alpha:  # only an exact p is ever above alpha here: the approximate one is <= alpha by design
            # the row's own verdict agrees with its exact test, so one row's `differs` keeps alpha too and a
            # one-row comparison decides as the row does (audit60 C1: Tango's interval alone was 0.063 at 0.05)
            verdict, why_p = "inconclusive", EXACT_NOT_DIFFERS.format(p=p_differs, alpha=alpha)
            p_differs = None
        why = f"{why}; {why_p}" if why and why_p else why or why_p
    note = f"{note}; {why}" if note and why else note or why
    return MetricComparison(
        **common,
        actual=float(a["rate"]),
        method=test.method,
        verdict=verdict,
        actual_display=a["display"],
        actual_counts=(int(a["successes"]), int(a["episodes"])),
        low=float(test.low),
        high=float(test.high),
        confidence=test.confidence,
        note=note,
        p_differs=p_differs,
        alpha_calibrated=calibrated,
    )


def rate_row(
    reference: Sequence[bool], actual: Sequence[bool], *, paired: bool, margin: float, alpha: float
) -> MetricComparison:
    """compare's row for one task's rate from both sides' per-episode outcomes (`_rate_row`, calibration included):
    paired, episode i of both sides started from the same initial state (sides of unequal length are nested: the
    shorter one's states are the first of the longer one's); else no state is shared and the row is unpaired.
    The one place that answers "what does compare decide" for `stats.simulate` (audit56 C1); a comparison of one
    rate row has this row's verdict overall (Holm over one test is that test)."""
    from reproduction.run.evidence import count_metric

    def side(outcomes: Sequence[bool], start: int) -> _Side:
        outcomes = [bool(o) for o in outcomes]
        keys = (("t", "reset_seeds", start + i) for i in range(len(outcomes)))
        return _Side(metric=count_metric(sum(outcomes), len(outcomes)), outcomes=dict(zip(keys, outcomes)))

    ref = side(reference, 0)
    return _rate_row("t/rate", ref, side(actual, 0 if paired else len(reference)), margin, alpha)


def _judged(
    at: Any, test: Any, design: tuple[int, int, bool], margin: float, alpha: float
) -> tuple[Any, float | None, str]:
    """A row's test `at(alpha)` = `test` judged again at its design's calibrated level when it is reproduced (only
    these need it: a row not reproduced at alpha is not at alpha* <= alpha): (the test, alpha* or None, a note on a
    level that could not be calibrated). The one place compare calibrates; `identical_paired_episodes` asks it."""
    from reproduction.run.stats import calibrable, calibrated_alpha

    calibrated, why = None, ""
    if test.verdict == "reproduced":
        try:
            if calibrable(design[0], design[1], margin, design[2]):
                calibrated = calibrated_alpha(design[0], design[1], margin, alpha, design[2])
            else:
                why = TOO_LARGE
        except ImportError:  # a bare Python: compare still answers, and says what it could not check
            why = NOT_CALIBRATED
        if calibrated is not None and calibrated < alpha:
            test = at(calibrated)
    return test, calibrated, why


def identical_paired_episodes(margin: float, alpha: float) -> int:
    """The fewest episodes at which identical paired reruns (the reference's initial states, 0 discordant) are
    `reproduced` by compare's own row test, calibration included (`_judged`): 59 at margin 0.05, alpha 0.05,
    where the uncalibrated bound n > z^2 (1 - m) / m gave 52 (audit50 C F4). Searched upward from below that bound;
    what `portable eval --plan` prints as its paired hint."""
    from reproduction.run.stats import equivalence_paired, z_value

    z = z_value(1 - 2 * alpha)
    n = max(1, math.floor(0.9 * z * z * (1 - margin) / margin))
    while True:
        same = [True] * n
        at = lambda level, same=same: equivalence_paired(same, same, margin=margin, alpha=level)  # noqa: E731
        test, _, _ = _judged(at, at(alpha), (n, n, True), margin, alpha)
        if test.verdict == "reproduced":
            return n
        n += 1


def _row_p_differs(at: Any, test: Any, margin: float, alpha: float) -> tuple[float, str]:
    """(p_differs, a note or "") of a row that differs at alpha. A paired (Tango) row takes the exact p-value
    (`stats.paired_differs_p`): Tango's approximate one is about twice its level at the small levels Holm uses when
    discordance is rare, which took the overall `differs` to 0.10 at |d| = margin with 10 tasks of 200 pairs
    (audit60 C1). Past stats.DIFFERS_LIMIT pairs, or without numpy, the approximate one, with a note. Below
    2 x stats.DIFFERS_FLOOR the smaller of the two: the exact bound is certified no further down, and the size of that
    rule at any level is below 2e-6 still (review61 1: a paired row could not differ at alpha 5e-7)."""
    if test.method != "tango-paired":
        return _p_differs(at, alpha), ""
    from reproduction.run.stats import DIFFERS_FLOOR, DIFFERS_LIMIT, paired_differs_p

    b, c = test.discordant
    if test.pairs > DIFFERS_LIMIT:
        return _p_differs(at, alpha), DIFFERS_APPROXIMATE
    try:
        exact = paired_differs_p(b, c, test.pairs, margin)
    except ImportError:
        return _p_differs(at, alpha), DIFFERS_APPROXIMATE
    if exact < 2 * DIFFERS_FLOOR:  # certified only that far down: below it Tango's p, whose size is then < 2e-6 too
        return min(exact, _p_differs(at, alpha)), ""  # (a level of 5e-8, an early sequential look, still decides)
    return exact, ""


def _p_differs(at: Any, alpha: float) -> float:
    """The smallest level a <= alpha at which `at(a)`'s (1 - 2a) interval still lies beyond the margin (bisection
    on log a; the interval widens as a falls), to 1e-3 relative; 1e-15 when it does so even there."""
    lo, hi = math.log(1e-15), math.log(alpha)
    if at(math.exp(lo)).verdict == "differs":
        return 1e-15
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if at(math.exp(mid)).verdict == "differs" else (mid, hi)
        if hi - lo < 1e-3:
            break
    return math.exp(hi)


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
        reference_display=_value_text(reference, actual),
        actual_display="missing" if actual is None else _value_text(actual, reference),
        note="this run has no such metric" if actual is None else "",
    )


def _value_text(value: float, other: float | None) -> str:
    """`value` to 4 significant digits, or to as many more as tell it from `other` (2e-9 off showed 0.5 beside 0.5,
    `differs`, with no visible reason: audit59 C6)."""
    for digits in range(4, 18):
        text = f"{value:.{digits}g}"
        if other is None or value == other or math.isnan(other) or text != f"{other:.{digits}g}":
            return text
    return repr(value)


def _entries(doc: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    out = {doc["policy"]["label"]: doc}
    out.update({b["policy"]["label"]: b for b in doc.get("baselines", [])})
    return out


def _task_outcomes(entry: Mapping[str, Any], task: str, metric: str) -> dict[tuple[str, str, int], bool] | None:
    """{(task, kind, initial state): outcome}: keyed by Fetch reset seed or LIBERO init-state index (the kind
    is part of the key, so a seed never pairs with an init state of the same number). None when the task has
    no outcomes or an initial state repeats (`_repeats`: such episodes cannot be matched one to one)."""
    o = entry.get("tasks", {}).get(task, {}).get("outcomes")
    kind = "init_states" if o and "init_states" in o else "reset_seeds"
    if not o or len(o.get(kind, [])) != len(o.get(metric, "")) or _repeats(entry, task):
        return None
    keys = zip(itertools.repeat(task), itertools.repeat(kind), map(int, o[kind]))
    return dict(zip(keys, map("1".__eq__, o[metric])))  # C-level loops: 1e6 episodes a side (audit56 C2)


def _repeats(entry: Mapping[str, Any], task: str | None = None) -> bool:
    """Whether an initial state occurs twice within one task (of `task`, else of any task). The project's own
    evaluations never repeat one (Fetch reset seeds are distinct 31-bit hashes, bar a chance collision; LIBERO
    runs each of a task's init states once), but a dict keyed by state would silently drop the repeats."""
    tasks = entry.get("tasks", {})
    for name in [task] if task is not None else list(tasks):
        o = tasks.get(name, {}).get("outcomes") or {}
        states = o.get("init_states", o.get("reset_seeds", []))
        if len(set(states)) != len(states):
            return True
    return False


def _all_outcomes(entry: Mapping[str, Any], metric: str) -> dict[tuple[str, str, int], bool] | None:
    """The policy's outcomes over all its tasks, or None unless every task carries them (without repeats)."""
    out: dict[tuple[str, str, int], bool] = {}
    for task in entry.get("tasks", {}):
        one = _task_outcomes(entry, task, metric)
        if one is None:
            return None
        out |= one
    return out or None


def _like_with_like(entry: Mapping[str, Any], ref_entry: Mapping[str, Any]) -> tuple[Mapping[str, Any], list[str]]:
    """This run's policy `entry` restricted to the reference policy's tasks, and the tasks it left out.

    An overall rate row compares a policy's rate over the reference's tasks: a task only this run evaluated has
    nothing to be compared with, and pooled into the overall count (and outcomes) it made the two sides' overall
    rows rates over different tasks (audit50 C F2: 100/200 on the reference's task plus 0/1000 on another was
    `differs`, and the overall rows lost their pairing). So the overall counts are summed again over the
    reference's tasks (a count some kept task lacks is left out: the row then says the run has no such metric);
    plain values (means over all this run's episodes) are kept as they are. Unchanged when no task is extra or
    the reference lists no tasks."""
    from reproduction.run.evidence import count_metric

    tasks, theirs = entry.get("tasks", {}), ref_entry.get("tasks", {})
    extra = [t for t in tasks if t not in theirs] if theirs else []
    if not extra:
        return entry, []
    kept = {t: row for t, row in tasks.items() if t in theirs}
    metrics = {m: v for m, v in entry.get("metrics", {}).items() if m not in COUNT_METRICS}
    for m in COUNT_METRICS:
        if m in entry.get("metrics", {}) and kept and all(m in row for row in kept.values()):
            metrics[m] = count_metric(
                sum(row[m]["successes"] for row in kept.values()), sum(row[m]["episodes"] for row in kept.values())
            )
    return {**entry, "metrics": metrics, "tasks": kept}, extra


def _task_episodes(row: Any, metric: str) -> int | None:
    """A task's episode count of `metric`, None when the row has no such count."""
    count = row.get(metric) if isinstance(row, Mapping) else None
    return int(count["episodes"]) if isinstance(count, Mapping) and "episodes" in count else None


def _same_mixture(
    ref_entry: Mapping[str, Any], act_entry: Mapping[str, Any]
) -> tuple[Mapping[str, Any], Mapping[str, Any], list[str], dict[str, tuple[list[tuple[str, int, int]], float]]]:
    """The two policies as their overall rate rows compare them, the tasks left out, and per count metric whose
    kept tasks' episode counts are out of proportion between the sides: (those tasks, the mixture bias).

    A pooled rate is the tasks' rates weighted by the tasks' episode counts: two sides that weight the tasks
    differently have different pooled rates although every task's rate is the same (Simpson's paradox; audit54 B4:
    reference A 90/100 + B 10/100 against the run's A 90/100 + B 0/0 was 50.0% vs 90.0%, `differs`, exit 60). So a
    reference task this run evaluated 0 episodes of (or not at all) is left out of both sides' overall counts and
    outcomes, and where the kept tasks' counts are still not proportional (n_run[t] / n_ref[t] not the same for
    every t) the mixture bias |sum_t (w_run[t] - w_ref[t]) p_ref[t]| (w: each side's share of the kept tasks'
    episodes, p_ref: the reference's task rate) is what the different weighting alone moves the pooled rate by;
    the caller marks that metric's overall row `UNEVEN` (shown, not counted) only where the bias exceeds
    MIXTURE_SHARE of the row's margin (review R1: one episode short on one task of 1,000 made it inconclusive).
    Both entries are returned unchanged when the counts are proportional on every task (the project's
    own evaluations: the same episodes_per_task everywhere), when the run lists no tasks, or when it has no
    episode at all (then the overall row says so itself)."""
    from reproduction.run.evidence import count_metric

    theirs, ours = ref_entry.get("tasks", {}) or {}, act_entry.get("tasks", {}) or {}
    if not theirs or not ours:
        return ref_entry, act_entry, [], {}

    def episodes(row: Any) -> int:
        return max((_task_episodes(row, m) or 0 for m in COUNT_METRICS), default=0)

    dropped = [t for t in theirs if episodes(ours.get(t)) == 0]
    kept = [t for t in theirs if t not in dropped]
    if not kept:
        dropped = []
        kept = list(theirs)
    elif dropped:
        sides = []
        for entry, tasks in ((ref_entry, theirs), (act_entry, ours)):
            rows = {t: tasks[t] for t in kept if t in tasks}
            metrics = dict(entry.get("metrics", {}))
            for m in COUNT_METRICS:
                if m in metrics and all(m in row for row in rows.values()):
                    metrics[m] = count_metric(
                        sum(row[m]["successes"] for row in rows.values()),
                        sum(row[m]["episodes"] for row in rows.values()),
                    )
            sides.append({**entry, "metrics": metrics, "tasks": rows})
        ref_entry, act_entry = sides
    uneven: dict[str, tuple[list[tuple[str, int, int]], float]] = {}
    for m in COUNT_METRICS:
        counts = [(t, _task_episodes(theirs[t], m), _task_episodes(ours.get(t), m)) for t in kept]
        if any(n_ref is None or n_act is None for _, n_ref, n_act in counts):
            continue  # a task without this count: the row is no pooled rate of these tasks to begin with
        total_ref, total_act = sum(c[1] for c in counts), sum(c[2] for c in counts)
        off = [(t, n_ref, n_act) for t, n_ref, n_act in counts if n_act * total_ref != n_ref * total_act]
        if off:
            bias = sum(
                (n_act / total_act - n_ref / total_ref) * (theirs[t][m]["successes"] / n_ref if n_ref else 0.0)
                for t, n_ref, n_act in counts
            )
            uneven[m] = (off, abs(bias))
    return ref_entry, act_entry, dropped, uneven


def _mixture_notes(
    dropped: Mapping[str, Sequence[str]],
    uneven: Mapping[str, Mapping[str, Any]],
    absent: Mapping[str, Set[str]] | None = None,
) -> list[str]:
    """Per policy: the tasks left out of its overall rows (0 episodes in this run, or `absent` from it: those rows
    differ, as the README says of a task the run lacks, so the note says so rather than "0 episodes", whose rows are
    inconclusive: audit59 C5) and the tasks whose counts made its overall rate rows shown but not counted
    (`_same_mixture`, `UNEVEN`)."""
    notes = []
    for label, tasks in dropped.items():
        lacks = [t for t in tasks if t in (absent or {}).get(label, set())]
        for group, what, why in (
            ([t for t in tasks if t not in lacks], "this run evaluated 0 episodes of", ""),
            (lacks, "this run lacks", " (a task the run lacks differs: its rows say `missing`)"),
        ):
            if not group:
                continue
            more = f" and {len(group) - 3} more" if len(group) > 3 else ""
            notes.append(
                f"{label}: {what} {', '.join(repr(t) for t in group[:3])}{more}{why}, so "
                f"{'that task is' if len(group) == 1 else 'those tasks are'} left out of {label}'s overall rates on "
                "both sides (like with like: the reference's overall counts here are over the other tasks)"
            )
    for label, by_metric in uneven.items():
        if not by_metric:
            continue
        off = next(iter(by_metric.values()))
        parts = [f"{t!r} reference {n_ref}, this run {n_act}" for t, n_ref, n_act in off[:3]]
        more = f" and {len(off) - 3} more" if len(off) > 3 else ""
        notes.append(
            f"{label}: the tasks' episode counts are not in the same proportion on both sides ({'; '.join(parts)}"
            f"{more}), so {label}'s overall {' and '.join(by_metric)} rows would weight the tasks differently "
            f"(by more than {MIXTURE_SHARE:g} of the margin at the reference's task rates) and are shown but not "
            "counted: the verdict follows the per-task rows (evaluate the same episodes per task as the reference "
            "for overall rows that count)"
        )
    return notes


def _extra_task_notes(extra: Mapping[str, Sequence[str]]) -> list[str]:
    """The tasks this run evaluated that the reference does not have, per policy: left out of the overall rows."""
    notes = []
    for label, tasks in extra.items():
        if not tasks:
            continue
        more = f" and {len(tasks) - 3} more" if len(tasks) > 3 else ""
        notes.append(
            f"{label}: this run also evaluated {', '.join(repr(t) for t in tasks[:3])}{more}, which the reference "
            f"does not have: no row compares {'it' if len(tasks) == 1 else 'them'}, and {label}'s overall rates "
            "here are over the reference's tasks only (like with like), not the run's own overall counts"
        )
    return notes


def _setting_notes(actual: Mapping[str, Any], reference: Mapping[str, Any]) -> list[str]:
    """Seeds and settings that differ between the two sides: a rate then differs by sampling alone."""
    notes = []
    for what in ("seeds", "settings"):
        mine, theirs = actual.get(what, {}) or {}, reference.get(what, {}) or {}
        for key in sorted(set(mine) | set(theirs)):
            if what == "settings" and key == "tasks" and _same_tasks(actual, reference):
                continue  # one task spelt two ways (libero_spatial/0 and its instruction): evaluations key by id
            if mine.get(key) != theirs.get(key):
                notes.append(f"{what[:-1]} {key!r} differs: reference {theirs.get(key)!r}, this run {mine.get(key)!r}")
    libero = all((doc.get("settings") or {}).get("simulator") == "libero" for doc in (actual, reference))
    if any(n.startswith("seed 'eval'") for n in notes) and not libero:  # LIBERO's init states are fixed
        notes.append(
            "the evaluation seeds differ, so the two sides evaluated different initial states: the rates are "
            "compared unpaired and differ by sampling noise alone (see each row's interval)"
        )
    return notes


def _same_tasks(actual: Mapping[str, Any], reference: Mapping[str, Any]) -> bool:
    """Whether every policy of both files evaluated the same tasks, by the ids the evidence keys them by (a config
    may name a LIBERO task by its language instruction, which settings.tasks records as written: audit55 E5)."""
    mine, theirs = _entries(actual), _entries(reference)
    return set(mine) == set(theirs) and all(
        set(mine[k].get("tasks", {})) == set(theirs[k].get("tasks", {})) for k in mine
    )


def _first_of(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Whether the shorter of two state lists is the longer one's first states (in any order): `_prefix` per task."""
    short, long = (a, b) if len(a) <= len(b) else (b, a)
    return set(short) == set(long[: len(short)])


def _pairing_notes(actual: Mapping[str, Any], reference: Mapping[str, Any], settings: Sequence[str]) -> list[str]:
    """Why rows are unpaired although both sides carry outcomes, which the table did not say (audit46 stats F8):
    a task whose initial states overlap only in part between the files (rows pair on the shared states only when
    one side's include the other's, `_paired`) makes its rows and its policy's overall rows unpaired; tasks
    nested in opposite directions (more states than the reference in one, fewer in another) leave the tasks'
    rows paired but not the overall ones. Not repeated where the evaluation seeds differ (that note says it),
    nor for repeated states (the row's own note says it)."""
    if any(n.startswith("the evaluation seeds differ") for n in settings):
        return []
    notes = []
    mine = _entries(actual)
    for label, ref_entry in _entries(reference).items():
        act_tasks = mine.get(label, {}).get("tasks", {})
        found, more_here, fewer_here, unnested = [], [], [], []
        for task, ref_task in ref_entry.get("tasks", {}).items():
            o_ref, o_act = ref_task.get("outcomes"), act_tasks.get(task, {}).get("outcomes")
            if not o_ref or not o_act or _repeats(ref_entry, task) or _repeats(mine[label], task):
                continue
            kind = "init_states" if "init_states" in o_ref else "reset_seeds"
            if kind not in o_act:
                continue
            theirs, ours = set(o_ref.get(kind, [])), set(o_act.get(kind, []))
            if not (theirs <= ours or ours <= theirs):
                found.append((task, len(theirs - ours), len(theirs), len(ours), kind.replace("_", " ")))
            elif theirs != ours and not _first_of(o_ref[kind], o_act[kind]):
                unnested.append(task)
            elif theirs < ours:
                more_here.append(task)
            elif ours < theirs:
                fewer_here.append(task)
        if found:
            parts = [f"{t} ({d} of the reference's {n} not among this run's {m})" for t, d, n, m, _ in found[:3]]
            more = f" and {len(found) - 3} more tasks" if len(found) > 3 else ""
            notes.append(
                f"unpaired: {label}'s {found[0][4]} differ between the files in {', '.join(parts)}{more}, so the "
                f"rows of {'that task' if len(found) == 1 else 'those tasks'} and {label}'s overall rows are "
                "compared unpaired (pairing needs one side's initial states to include the other's)"
            )
        elif unnested:
            notes.append(
                f"unpaired: in {', '.join(unnested[:3])}"
                f"{f' and {len(unnested) - 3} more tasks' if len(unnested) > 3 else ''}"
                f" one side evaluated only some of {label}'s initial states of the other, not its first ones (a nested "
                "run shares the first k), so which states are shared may depend on the outcomes: those rows and the "
                "overall rows are compared unpaired on all episodes"
            )
        elif more_here and fewer_here:
            notes.append(
                f"unpaired: this run evaluated more initial states than the reference in {more_here[0]} and fewer "
                f"in {fewer_here[0]}, so {label}'s overall rows are compared unpaired (its tasks' rows are paired "
                "on the states both sides evaluated)"
            )
        elif more_here or fewer_here:
            tasks = more_here or fewer_here
            whose = "this run" if more_here else "the reference"
            notes.append(
                f"paired on the shared initial states: {whose} evaluated more initial states of {label} than the "
                f"other side in {', '.join(tasks[:3])}{f' and {len(tasks) - 3} more tasks' if len(tasks) > 3 else ''}"
                f"; those rows show and test both sides on the states both evaluated (each row's note, in "
                "comparison.json and --json, gives the rest's success rate, which is not in the test)"
            )
    return notes


def _empty_note(rows: Sequence[MetricComparison]) -> list[str]:
    """The rows this run evaluated no episode of (`inconclusive`): the table shows no interval for them."""
    empty = [r.metric for r in rows if r.note == NO_EPISODES]
    if not empty:
        return []
    more = f" and {len(empty) - 3} more" if len(empty) > 3 else ""
    return [
        f"this run evaluated 0 episodes for {', '.join(empty[:3])}{more}: nothing was measured there, so "
        f"{'that row is' if len(empty) == 1 else 'those rows are'} inconclusive"
    ]


def _calibration_note(rows: Sequence[MetricComparison], alpha: float) -> list[str]:
    """Which rows reproduced at alpha were judged at a lower calibrated level (stats.calibrated_alpha), and which
    reproduced rows could not be calibrated (their row note says why; the table shows no row notes, so a reader of
    the table alone was not told: audit63 C F3)."""
    notes = []
    lower = [r for r in rows if r.alpha_calibrated is not None and r.alpha_calibrated < alpha]
    if lower:
        kept = sum(r.verdict == "reproduced" for r in lower)
        levels = sorted(r.alpha_calibrated for r in lower if r.alpha_calibrated is not None)
        notes.append(
            f"{len(lower)} rate rows reproduced at alpha {alpha:g} were judged again at their design's calibrated "
            f"level ({levels[0]:.4g}-{levels[-1]:.4g}: the largest at which the test's exact size is <= alpha), and "
            f"their intervals are at that level; {kept} stayed reproduced"
        )
    for why in (TOO_LARGE, NOT_CALIBRATED):
        left = [r.metric for r in rows if r.verdict == "reproduced" and why in r.note]
        if left:
            notes.append(
                f"{len(left)} rate rows reproduced at alpha {alpha:g} (e.g. {left[0]}) are judged at alpha itself: "
                f"{why.removeprefix('level not calibrated: ')}"
            )
    return notes


def _power_note(rows: Sequence[MetricComparison], alpha: float, pairing: Sequence[str] = ()) -> list[str]:
    """A warning when the reference's own episodes cannot support its margin in an unpaired comparison, and what
    would let a paired test decide: the reference's initial states evaluated, unless the run did and the rows are
    unpaired for another reason (audit56 C3): states repeat within a task, or neither side's contain the other's
    (`pairing`: the `_pairing_notes`)."""
    short = []
    for r in rows:
        if r.kind != "rate" or r.method != "newcombe-10" or r.reference_counts is None:
            continue
        if r.actual is None and r.note != NO_EPISODES:  # a 0-episode row has no rate (audit59 C4), still a margin
            continue
        k, n = r.reference_counts
        need = episodes_needed(k / n if n else 0.5, margin=r.margin, alpha=alpha)
        if n < need:
            short.append((need - n, r.metric, n, need))
    if not short:
        return []
    _, metric, n, need = max(short)
    row = next(r for r in rows if r.metric == metric)
    if row.note.startswith(REPEATS_NOTE):
        fix = "an initial state repeats within a task here, so no pairing: evaluating each state once lets"
    elif any(p.startswith("unpaired:") for p in pairing):
        fix = (
            "the two files were compared unpaired (see the unpaired note): a run that evaluates all the "
            "reference's initial states (and more, if it likes) lets"
        )
    else:
        fix = "evaluating the reference's reset seeds lets"
    return [
        f"the reference is too small for its margins on {len(short)} of {len(rows)} rows: e.g. {metric} has "
        f"{n} episodes, and 80% power at alpha {alpha:g} needs {need} per side unpaired "
        f"(`portable eval --plan`); {fix} a paired test decide with fewer"
    ]


RUN_FEW = 15
"""Fewer run episodes than this in a row, or a reference RUN_RATIO times as large, and the row's unpaired `differs`
test exceeds alpha (evidence/README.md, "Where one row's test exceeds alpha"): `_run_size_note` says so."""
RUN_RATIO = 10


def _run_size_note(rows: Sequence[MetricComparison]) -> list[str]:
    """A warning, beside `_power_note`'s on the reference, when a rate row that differs unpaired has a run side too
    small or too unequal for its test's alpha: 1 run episode against 200 at equal true rates was `differs` (exit 60)
    about 11% of the time at alpha 0.05, with no word on the run's size (audit59 C1). The verdict stands."""
    short = []
    for r in rows:
        if r.kind != "rate" or r.method != "newcombe-10" or r.verdict != "differs" or r.p_differs is None:
            continue
        if r.actual_counts is None or r.reference_counts is None:
            continue
        n, n_ref = r.actual_counts[1], r.reference_counts[1]
        if n < RUN_FEW or n_ref > RUN_RATIO * n:
            short.append((n, r.metric, n_ref))
    if not short:
        return []
    n, metric, n_ref = min(short)
    return [
        f"this run is too small for a `differs` at alpha on {len(short)} of {len(rows)} rows: e.g. {metric} has "
        f"{n} episodes against the reference's {n_ref}, and an unpaired row's test of `differs` exceeds alpha with "
        f"fewer than about {RUN_FEW} episodes a side or sides more than {RUN_RATIO} times apart (evidence/README.md); "
        "evaluating more episodes, or the reference's reset seeds (paired), lets the verdict keep alpha"
    ]


def _sequential_level(
    sequential: Mapping[str, Any], alpha: float, reference: Mapping[str, Any]
) -> tuple[float, list[str]]:
    """The level the rates of a sequentially evaluated run are tested at, and the notes saying so: its stopping
    look's share of the comparison's `alpha` under the record's own spending rule (`sequential.record_level`, the
    one place that answers it), never above `alpha`; the record was checked by check_evidence."""
    from reproduction.run.sequential import record_level
    from reproduction.run.stats import MIN_ALPHA

    level = record_level(sequential, alpha)
    looks, stop, own = sequential["looks"], sequential["stopped_at_look"], float(sequential["alpha"])
    if level < MIN_ALPHA:
        raise InvalidInputError(
            f"alpha {alpha:g} gives look {stop} of this run's sequential evaluation the level {level:.3g}, below "
            f"{MIN_ALPHA:g}, the smallest recap-portable computes",
            field="alpha",
            hint="compare at a larger alpha (--alpha, or the reference's alpha)",
        )
    notes = [
        f"this run was evaluated sequentially and stopped at look {stop} of {len(looks)} ({looks[stop - 1]} of "
        f"{looks[-1]} episodes per task): rates are tested at that look's error-spending level {level:.3g}, its "
        f"share of alpha {alpha:g}, which keeps alpha {alpha:g} over all looks"
    ]
    if alpha != own:
        notes.append(
            f"the run spent alpha {own:g} over its looks (level {sequential['level']:.3g} at look {stop}); this "
            f"comparison's alpha {alpha:g} gives that look {level:.3g}, so its rate verdicts may differ from those "
            "the run stopped on"
        )
    if sequential.get("reference") != reference.get("name"):
        notes.append(
            f"its looks were decided against another reference ({sequential.get('reference')!r}), so the "
            "error rates stated hold for that reference, not this one"
        )
    return level, notes


def compare_evidence(
    actual: Mapping[str, Any],
    reference: Mapping[str, Any],
    *,
    margin: float | None = None,
    margins: Mapping[str, float] | None = None,
    alpha: float | None = None,
    tolerances: Mapping[str, float] | None = None,
    actual_where: str | None = None,
    reference_where: str | None = None,
) -> Comparison:
    """Compare every metric (overall and per task) of every policy the reference holds with this run's.

    Margin of a rate, most specific first: `margins`/`tolerances` (the caller's, per key), `margin` (the
    caller's, every rate), the reference's declared "margins", then its 1.x "tolerances" (read as margins),
    then DEFAULT_MARGIN. A plain value's tolerance: the same keys, else exact. `alpha`: the caller's, else the
    reference's "alpha", else DEFAULT_ALPHA. Policies are matched by label; a policy, task or metric the run lacks
    is a "differs" row. A row is paired (Tango) when both sides carry outcomes of the same reset seeds.

    A sequential evaluation (reproduction.recipes.recap.policy.evaluate_sequentially) looked at its counts
    several times; only at its stopping look's share of alpha does a verdict keep alpha over all looks, so the
    rates are tested at that share (`sequential.record_level`: the record's own rule, recomputed, at this
    comparison's alpha; never above it). At the alpha the run spent, it is the record's `level`, and the rate
    verdicts are exactly those it stopped on. The comparison's `alpha` is then that level.

    Raises InvalidInputError (exit 4) when the two share no policy label, or no task, so that no row could compare
    anything (`_refuse_disjoint`); `actual_where` / `reference_where` name the files in that message.
    """
    check_evidence(reference, where=f"the reference evidence {reference.get('name')!r}", reference=True)
    check_evidence(actual, where=f"the evidence {actual.get('name')!r}")
    _refuse_disjoint(
        actual,
        reference,
        actual_where or f"the evidence {actual.get('name')!r}",
        reference_where or f"the reference evidence {reference.get('name')!r}",
    )
    sequential = actual.get("sequential") if isinstance(actual.get("sequential"), Mapping) else None
    alpha = float(alpha if alpha is not None else reference.get("alpha", DEFAULT_ALPHA))
    seq_notes = []
    if sequential is not None:
        alpha, seq_notes = _sequential_level(sequential, alpha, reference)
    ref_declared = {**reference.get("tolerances", {}), **reference.get("margins", {})}
    mine_declared = {**(tolerances or {}), **(margins or {})}
    mine = _entries(actual)

    def margin_of(label: str, key: str) -> float | None:
        found = declared_margin(mine_declared, label, key)
        if found is None and margin is not None:
            return float(margin)
        found = found if found is not None else declared_margin(ref_declared, label, key)
        if found is not None and not 0 < found < 1:
            raise InvalidInputError(
                f"the margin of {label}/{key} is {found:g}; a rate's margin must lie strictly between 0 and 1",
                field="margins",
                hint=f"declare a margin such as 0.05 for {key!r} in the reference's margins (1.x: tolerances)",
            )
        return found

    rows, extra, dropped, uneven, absent = [], {}, {}, {}, {}
    shown: dict[str, dict[str, list[tuple[str, int, int]]]] = {}  # the UNEVEN rows' out-of-proportion tasks
    for label, ref_entry in _entries(reference).items():
        shown[label] = {}
        act_entry, extra[label] = _like_with_like(mine.get(label, {}), ref_entry)
        ref_over, act_over, dropped[label], uneven[label] = _same_mixture(ref_entry, act_entry)
        absent[label] = {t for t in dropped[label] if t not in act_entry.get("tasks", {})}
        for metric, ref_value in ref_entry["metrics"].items():
            act_value = act_entry.get("metrics", {}).get(metric)
            name = f"{label}/{metric}"
            if "rate" in ref_value:
                ref_side = _Side(
                    metric=ref_over["metrics"].get(metric, ref_value),
                    outcomes=_all_outcomes(ref_over, metric),
                    repeats=_repeats(ref_over),
                )
                act_side = _Side(
                    metric=act_over.get("metrics", {}).get(metric),
                    outcomes=_all_outcomes(act_over, metric) if act_over else None,
                    repeats=bool(act_over) and _repeats(act_over),
                )
                m = margin_of(label, metric)
                row = _rate_row(name, ref_side, act_side, DEFAULT_MARGIN if m is None else m, alpha)
                mixed = uneven[label].get(metric)
                if (  # a row paired on the shared states has one task mix on both sides (audit55 review2 P1)
                    mixed is not None
                    and row.method != "tango-paired"
                    and mixed[1] > MIXTURE_SHARE * row.margin
                    and row.actual_counts is not None
                    and row.actual_counts[1]
                ):
                    row = dataclasses.replace(row, verdict="inconclusive", p_differs=None, note=UNEVEN, counted=False)
                    shown[label][metric] = mixed[0]
                rows.append(row)
            else:
                tol = declared_margin(mine_declared, label, metric)  # the caller's rate `margin` is no value tolerance
                tol = tol if tol is not None else declared_margin(ref_declared, label, metric)
                rows.append(_value_row(name, ref_value, act_value, tol))
        for task, ref_task in ref_entry.get("tasks", {}).items():
            act_task = act_entry.get("tasks", {}).get(task, {})
            for metric in COUNT_METRICS:
                if metric in ref_task:
                    ref_side = _Side(
                        metric=ref_task[metric],
                        outcomes=_task_outcomes(ref_entry, task, metric),
                        repeats=_repeats(ref_entry, task),
                    )
                    act_side = _Side(
                        metric=act_task.get(metric),
                        outcomes=_task_outcomes(act_entry, task, metric) if act_task else None,
                        repeats=bool(act_task) and _repeats(act_entry, task),
                    )
                    m = margin_of(label, f"{task}/{metric}")
                    rows.append(
                        _rate_row(
                            f"{label}/{task}/{metric}", ref_side, act_side, DEFAULT_MARGIN if m is None else m, alpha
                        )
                    )
    settings = _setting_notes(actual, reference)
    notes = seq_notes + _extra_task_notes(extra) + _mixture_notes(dropped, shown, absent) + settings
    pairing = _pairing_notes(actual, reference, settings)
    notes += pairing
    notes += _empty_note(rows)
    notes += _power_note(rows, alpha, pairing)
    notes += _run_size_note(rows)
    notes += _calibration_note(rows, alpha)
    return Comparison(
        actual_name=str(actual.get("name")),
        reference_name=str(reference.get("name")),
        rows=rows,
        alpha=alpha,
        notes=notes,
    )


def _refuse_disjoint(
    actual: Mapping[str, Any], reference: Mapping[str, Any], actual_where: str, reference_where: str
) -> None:
    """Raise InvalidInputError when the two files share no policy label, or (both listing tasks) no task: every row
    would be `missing`, and `differs` (exit 60) would judge a comparison that compared nothing (audit51 G7: another
    recipe's or another task's evidence). A partial overlap is compared: what only one side has is a row of its own."""
    theirs, ref_tasks = evidence_labels_and_tasks(reference)
    mine, act_tasks = evidence_labels_and_tasks(actual)
    if not theirs & mine:
        raise InvalidInputError(
            f"{reference_where} and {actual_where} share no policy label: reference {sorted(theirs)}, "
            f"this run {sorted(mine)}, so nothing can be compared",
            field="policy.label",
            hint="compare with reference evidence of the same recipe (policies are matched by label)",
        )
    if ref_tasks and act_tasks and not ref_tasks & act_tasks:
        raise InvalidInputError(
            f"{reference_where} and {actual_where} share no task: reference {sorted(ref_tasks)}, "
            f"this run {sorted(act_tasks)}, so nothing can be compared",
            field="tasks",
            hint="compare with reference evidence evaluated on the same tasks (eval.tasks)",
        )


def evidence_labels_and_tasks(doc: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    """The policy labels of an evidence document (its policy and baselines) and the tasks any of them lists: what
    a comparison matches rows by, so what two evidence files, or a reference and a run's config, must share."""
    entries = _entries(doc)
    return set(entries), {t for e in entries.values() for t in e.get("tasks", {}) or {}}


def evaluated_task_keys(tasks: Sequence[str]) -> set[str] | None:
    """The task names the evaluation keys its evidence by for the configured `tasks`, canonicalised as it does
    (a Fetch task's `get_task(t).env_id`, variant kept, for its id, short name or description; a LIBERO index's
    `suite/index` from `parse_task_id`). None when any one's key is known only at eval time (a LIBERO glob or task
    name, which LIBERO resolves) or it does not parse (the config check reports that, not the reference check)."""
    from reproduction.errors import ConfigError, SimError
    from reproduction.sim.libero.tasks import is_libero_id, parse_task_id
    from reproduction.sim.tasks import get_task

    if not all(isinstance(t, str) for t in tasks):
        return None
    keys: set[str] = set()
    try:
        for task in tasks:
            if is_libero_id(task):
                ref = parse_task_id(task)
                if ref.index is None:
                    return None
                keys.add(str(ref))
            else:
                keys.add(get_task(task).env_id)
    except (SimError, ConfigError):
        return None
    return keys


def reference_overlap_problem(
    reference: str | Path,
    tasks: Sequence[str],
    labels: Sequence[str] | None = None,
    *,
    tasks_key: str = "eval.tasks",
) -> InvalidInputError | InputNotFoundError | None:
    """The problem a run's preflight reports, before any stage trains, when its reference evidence could compare
    nothing with the evidence the run will write: the error loading it (not evidence, a bad field), no policy label
    in common with `labels` (those the config evaluates; None: not checked), or no task in common with `tasks`
    (the config's `tasks_key`) — the refusals `_refuse_disjoint` would give at the compare stage, after all the
    training (exit 4). Tasks are compared by the keys the evaluation writes (`evaluated_task_keys`: a short name or
    description is its env id), and only when every one has such a key: a glob or a LIBERO task name is resolved
    by LIBERO at eval time, and a task that does not parse is the config check's to report. None when all is well."""
    try:
        doc = load_evidence(Path(reference))
        check_evidence(doc, where=f"the reference evidence {reference}", reference=True)
    except (InvalidInputError, InputNotFoundError, UnsupportedFormatError) as exc:
        return type(exc)(f"eval.reference: {exc.message}", hint=exc.hint)
    theirs, ref_tasks = evidence_labels_and_tasks(doc)
    if labels is not None and labels and not theirs & set(labels):
        return InvalidInputError(
            f"eval.reference: {reference} shares no policy label with the policies this run evaluates: reference "
            f"{sorted(theirs)}, this run {sorted(set(labels))}, so its compare stage could compare nothing",
            path=reference,
            field="eval.reference",
            hint="set eval.reference to evidence of the same recipe (policies are matched by label), or null",
        )
    keys = evaluated_task_keys(tasks)
    if keys and ref_tasks and not ref_tasks & keys:
        return InvalidInputError(
            f"eval.reference: {reference} shares no task with {tasks_key}: reference {sorted(ref_tasks)}, "
            f"{tasks_key} {list(tasks)}, so its compare stage could compare nothing",
            path=reference,
            field=tasks_key,
            hint=f"set {tasks_key}=[{','.join(sorted(ref_tasks))}] to evaluate the reference's tasks, or set "
            f"eval.reference to evidence evaluated on {', '.join(tasks)}",
        )
    return None


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
    comparison = compare_evidence(
        load_evidence(actual),
        load_evidence(reference),
        margin=margin,
        alpha=alpha,
        actual_where=str(actual),
        reference_where=str(reference),
    )
    if out is not None:
        write_comparison(out, comparison)
    return comparison
