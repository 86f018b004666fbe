"""A group-sequential equivalence rule: look after each batch of episodes, stop once the verdict is settled.

The reference's counts are fixed; this run's episodes arrive in K looks up to `n_max`. At look k the
rule computes the Newcombe interval (reproduction.run.stats) at confidence 1 - 2 a_k (a run evaluated through
compare pairs a look with the reference on the initial states both evaluated, Tango's interval, where its
episodes are a part of the reference's; the union bound below holds alike) and stops with
`reproduced` when it lies inside (-m, +m) or `differs` when it lies wholly beyond; at the last look it
gives the ordinary verdict (`inconclusive` included). The a_k are increments of the power-family
error-spending function a(t) = alpha * t^rho (Kim & DeMets 1987; Jennison & Turnbull 2000, ch. 7),
rho = 3 by default (close to O'Brien-Fleming: little is spent early, so the last look loses little).

`reproduced` is exact: a look whose interval at a_k lies inside the margin is judged again at its design's
calibrated level a_k* = stats.calibrated_alpha(n_ref, n at the look, m, a_k) <= a_k (`level`), the largest whose
exact size at that design is <= a_k, as compare judges a fixed row at alpha (the plain interval's exact size can
exceed a_k: 0.0076 at a_2 = 0.0055 for 100 reference episodes, 50 at the look, m 0.2). So P(look k falsely says
reproduced) <= a_k exactly, and by the union bound P(some look does) <= sum_k a_k = alpha whatever the looks'
correlation. That is conservative (it ignores the looks' positive correlation) but needs no numerical boundary.
A design past stats.CALIBRATION_LIMIT, or a Python without numpy, is judged at a_k (its guarantee the measured
one, as a fixed row's). `differs` is still approximate for an unpaired look: the plain interval at a_k (compare keeps
it for fixed rows too), so its union bound holds only as far as each look's approximate size is <= a_k (measured,
evidence/README.md); a paired look of up to 500 pairs also needs its exact p <= a_k, as a fixed paired row does.

Looks need not be equally spaced: a run looks at whole batches of episodes (`sizes(n_max, step)`), and
`spend(fractions)` spends alpha * t^rho at each look's own fraction t of n_max, fixed before any episode
runs, which is all error spending asks. `simulate_sequential` measures the rule: error rates and mean
episodes against the fixed design at n_max. A run uses it with eval.sequential.enabled
(reproduction.recipes.recap.policy.evaluate_sequentially): each look compares every rate with the reference
evidence at its a_k through compare, which calibrates each reproduced row the same way, and the evaluation stops
once none that counts toward the verdict is inconclusive (`comparison.counts_toward_verdict`); its record keeps
the level each look's reproduced rows used (`reproduced_levels`).
`record_level` is the one place that says what level a recorded stop is compared at: the record's rule recomputed
from its looks and spend (a `level` it does not give is refused), the stopping look's share of the comparison's
alpha.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from reproduction.run.stats import (
    DEFAULT_ALPHA,
    DEFAULT_MARGIN,
    VERDICTS,
    calibrable,
    calibrated_alpha,
    newcombe_difference,
    verdict_of,
)


@dataclass(kw_only=True, slots=True, frozen=True)
class SequentialRule:
    """When to look and how much error each look may spend."""

    looks: int = 4
    """Looks at n_max * k / looks episodes, k = 1..looks."""
    rho: float = 3.0
    """Power-family spending exponent: a(t) = alpha * t^rho."""
    alpha: float = DEFAULT_ALPHA
    margin: float = DEFAULT_MARGIN

    def __post_init__(self) -> None:
        if self.looks < 1:
            raise ValueError(f"looks {self.looks} must be >= 1")
        if self.rho <= 0:
            raise ValueError(f"rho {self.rho} must be > 0")

    def spend(self, fractions: list[float] | None = None) -> list[float]:
        """a_k, the level each look's one-sided tests use; they sum to alpha.

        `fractions`: each look's share of n_max (ascending, the last 1), for looks that are not equally
        spaced (a run looks at whole batches); None: k / looks. Error spending allows any looks fixed in
        advance, so the union bound holds for these too."""
        t = [k / self.looks for k in range(1, self.looks + 1)] if fractions is None else list(fractions)
        if not t or t[-1] != 1 or any(b <= a for a, b in zip([0.0, *t], t)):
            raise ValueError(f"look fractions {t} must rise strictly and end at 1")
        cum = [0.0, *(self.alpha * x**self.rho for x in t)]
        return [cum[k] - cum[k - 1] for k in range(1, len(cum))]

    def sizes(self, n_max: int, step: int = 1) -> list[int]:
        """Episodes at each look: n_max * k / looks, rounded up to whole multiples of `step` (a run's batch
        of episodes) when step > 1, capped at n_max; looks that would repeat a size are dropped."""
        if step <= 1:
            out = [max(1, round(n_max * k / self.looks)) for k in range(1, self.looks + 1)]
        else:
            out = [min(n_max, -(-n_max * k // (self.looks * step)) * step) for k in range(1, self.looks + 1)]
        return sorted(set(out))

    def level(self, n_ref: int, n_act: int, look: int, spend: list[float] | None = None) -> float:
        """The level `reproduced` is tested at in `look` (0-based) with n_ref reference and n_act episodes at the
        look: the calibrated a_k* = stats.calibrated_alpha(n_ref, n_act, margin, a_k) <= a_k, whose exact size is
        <= a_k; a_k itself past stats.CALIBRATION_LIMIT or without numpy. `spend`: the looks' a_k (default
        `spend()`). Cached by stats.calibrated_alpha (per design and a_k)."""
        a = (self.spend() if spend is None else spend)[look]
        try:
            if calibrable(n_ref, n_act, self.margin):
                return calibrated_alpha(n_ref, n_act, self.margin, a)
        except ImportError:
            pass
        return a

    def decide(self, k_ref: int, n_ref: int, k_act: int, n_act: int, look: int) -> str | None:
        """The verdict to stop with at `look` (0-based), or None to go on; the last look always decides.

        `differs` and `inconclusive` come from the interval at a_k; a `reproduced` there is judged again at the
        look's calibrated level (`level`), where it stays `reproduced` or becomes `inconclusive`."""
        a = self.spend()[look]
        lo, hi = newcombe_difference(k_ref, n_ref, k_act, n_act, 1 - 2 * a)
        verdict = verdict_of(lo, hi, self.margin)
        if verdict == "reproduced":
            calibrated = self.level(n_ref, n_act, look)
            if calibrated < a:
                verdict = verdict_of(*newcombe_difference(k_ref, n_ref, k_act, n_act, 1 - 2 * calibrated), self.margin)
        if verdict == "inconclusive" and look < self.looks - 1:
            return None
        return verdict

    def record(self, verdict: str, look: int, n_used: int, n_max: int, n_ref: int | None = None) -> dict[str, Any]:
        """What evidence keeps about a sequential stop (its "sequential" field). With `n_ref` (the reference's
        episodes) it also keeps `reproduced_levels`: the level each look run tested `reproduced` at (`level`)."""
        out = {
            "rule": f"power-family error spending, rho {self.rho:g}, {self.looks} looks, Bonferroni over looks",
            "alpha": self.alpha,
            "margin": self.margin,
            "looks": self.sizes(n_max),
            "stopped_at_look": look + 1,
            "episodes": n_used,
            "episodes_max": n_max,
            "verdict": verdict,
            "why": "the last look" if look == self.looks - 1 else f"settled at look {look + 1}: {verdict}",
        }
        if n_ref is not None:
            sizes = self.sizes(n_max)
            out["reproduced_levels"] = [self.level(n_ref, sizes[k], k) for k in range(min(look + 1, len(sizes)))]
        return out


class RecordError(ValueError):
    """A sequential record (evidence's "sequential") that is not one the rule writes; `field` names what is wrong."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _record_fields(record: Mapping[str, Any]) -> tuple[float, list[int], int, list[float], float]:
    """(alpha, looks, stopped_at_look, spend, level) of a record, each of its type, else RecordError."""

    def number(x: Any) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

    def whole(x: Any) -> bool:
        return isinstance(x, int) and not isinstance(x, bool)

    alpha, looks, stop = record.get("alpha"), record.get("looks"), record.get("stopped_at_look")
    spend, level = record.get("spend"), record.get("level")
    if not number(alpha) or not 0 < alpha < 0.5:
        raise RecordError("sequential.alpha", f"sequential.alpha is {alpha!r}, not a number strictly between 0 and 0.5")
    if not isinstance(looks, list) or not looks or not all(whole(n) and n >= 1 for n in looks):
        raise RecordError("sequential.looks", f"sequential.looks is {looks!r}, not a list of episode counts >= 1")
    if any(b <= a for a, b in zip(looks, looks[1:])):
        raise RecordError("sequential.looks", f"sequential.looks {looks} do not rise strictly")
    if not whole(stop) or not 1 <= stop <= len(looks):
        raise RecordError(
            "sequential.stopped_at_look", f"sequential.stopped_at_look is {stop!r}, not a look 1..{len(looks)}"
        )
    if not isinstance(spend, list) or len(spend) != len(looks) or not all(number(a) and a > 0 for a in spend):
        raise RecordError(
            "sequential.spend", f"sequential.spend is {spend!r}, not one level > 0 per look ({len(looks)} looks)"
        )
    if not number(level):
        raise RecordError("sequential.level", f"sequential.level is {level!r}, not a number")
    return float(alpha), looks, stop, [float(a) for a in spend], float(level)


def record_level(record: Mapping[str, Any], alpha: float | None = None) -> float:
    """The level a comparison tests the rates of a sequentially evaluated run at: its stopping look's share of
    `alpha` (default: the record's own `alpha`) under the record's spending rule, so that the union bound over the
    looks keeps `alpha` whichever look the run stopped at. Never above `alpha`.

    The rule is recomputed from what the record holds, with `SequentialRule.spend` (what the eval stage spent):
    the looks' fractions `looks[k] / looks[-1]`, rho from the first look's spend (a_1 = alpha t_1^rho), and then
    every recorded a_k and the stopping look's `level` must be that rule's (to a relative 1e-9). RecordError
    (a ValueError naming the field) otherwise: a record cannot choose its own test level (audit50 C F1: a `level`
    of 0.3 turned `inconclusive` into `reproduced`). Changes nothing."""
    own, looks, stop, spend, level = _record_fields(record)
    most = record.get("episodes_per_task_max", looks[-1])
    if most != looks[-1]:
        raise RecordError(
            "sequential.episodes_per_task_max",
            f"sequential.episodes_per_task_max is {most!r}, not the last look's {looks[-1]} (the looks end there)",
        )
    fractions = [n / looks[-1] for n in looks]
    rho = 3.0  # one look: it spends all of alpha whatever rho
    if len(looks) > 1:
        try:
            rho = math.log(spend[0] / own) / math.log(fractions[0])
        except ValueError:
            rho = math.nan
    try:
        expected = SequentialRule(looks=len(looks), rho=rho, alpha=own).spend(fractions)
    except ValueError:
        expected = []
    if len(expected) != len(spend) or not all(math.isclose(a, b, rel_tol=1e-9) for a, b in zip(spend, expected)):
        raise RecordError(
            "sequential.spend",
            f"sequential.spend {spend} is not alpha {own:g} spent as alpha t^rho over the looks {looks}: it must "
            "sum to alpha and rise with the looks as the rule's does",
        )
    if not math.isclose(level, expected[stop - 1], rel_tol=1e-9):
        raise RecordError(
            "sequential.level",
            f"sequential.level is {level!r}, but look {stop} of the looks {looks} spends {expected[stop - 1]!r} of "
            f"alpha {own:g} (sequential.spend): the level must be the stopping look's spend (a run's evidence "
            "cannot choose its own test level; was the file edited?)",
        )
    if alpha is None or alpha == own:
        return min(level, own)
    return min(level * (alpha / own), alpha)


def simulate_sequential(
    *,
    rule: SequentialRule,
    rates: tuple[float, ...] = (0.1, 0.5, 0.9),
    ns: tuple[int, ...] = (50, 100, 500, 2000),
    shifts: tuple[float, ...] = (0.0, 0.5, 1.0, 2.0, 3.0),
    pairs: int = 10_000,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Per cell (reference rate p, n = n_ref = n_max, true difference shift * margin): each verdict's rate and
    the mean episodes this run used, beside the fixed design's verdict rates at n_max on the same draws.

    The default grid is issue 24's (rates 0.1/0.5/0.9, n 50/100/500, true difference 0, m/2, m, 2m, the fixed
    test's table) plus n_max 2000 and 3m, where the fixed design has the power to decide and the rule saves."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    spend = rule.spend()
    levels: dict[tuple[int, int, float], float] = {}  # calibrated level per (n_ref, n at the look, a_k)
    for p in rates:
        for n in ns:
            sizes = rule.sizes(n)
            for s in shifts:
                d = s * rule.margin
                q = p + d if p + d <= 1 else p - d
                k_ref = rng.binomial(n, p, size=pairs).astype(float)
                # this run's outcomes arrive in looks: cumulative counts of independent increments
                steps = np.diff([0, *sizes])
                k_act = np.cumsum(np.stack([rng.binomial(int(m), q, size=pairs) for m in steps]), axis=0)
                verdict = np.full(pairs, None, dtype=object)
                used = np.zeros(pairs)
                nn = np.full(pairs, float(n))
                for look, (size, a) in enumerate(zip(sizes, spend)):
                    open_ = verdict == None  # noqa: E711 (numpy elementwise)
                    ks, ns_ = k_act[look].astype(float), np.full(pairs, float(size))
                    v = verdict_of(*newcombe_difference(k_ref, nn, ks, ns_, 1 - 2 * a), rule.margin)
                    # `reproduced` at a_k is judged again at the look's calibrated level, as `decide` does
                    if (n, size, a) not in levels:
                        levels[(n, size, a)] = rule.level(n, size, look, spend)
                    calibrated = levels[(n, size, a)]
                    again = v == "reproduced"
                    if calibrated < a and again.any():
                        lo, hi = newcombe_difference(k_ref[again], nn[again], ks[again], ns_[again], 1 - 2 * calibrated)
                        v[again] = verdict_of(lo, hi, rule.margin)
                    settle = open_ & ((v != "inconclusive") | (look == len(sizes) - 1))
                    verdict[settle] = v[settle]
                    used[settle] = size
                lo, hi = newcombe_difference(k_ref, nn, k_act[-1].astype(float), nn, 1 - 2 * rule.alpha)
                fixed = verdict_of(lo, hi, rule.margin)
                out.append(
                    {"rate": p, "n": n, "shift": s, "true_difference": round(q - p, 6), "pairs": pairs}
                    | {v: float(np.mean(verdict == v)) for v in VERDICTS}
                    | {f"fixed_{v}": float(np.mean(fixed == v)) for v in VERDICTS}
                    | {"mean_episodes": float(used.mean()), "saving": float(1 - used.mean() / n)}
                )
    return out


def render_sequential(rows: list[dict[str, Any]], rule: SequentialRule) -> str:
    lines = [
        f"sequential: {rule.looks} looks, rho {rule.rho:g}, margin {rule.margin}, alpha {rule.alpha}, "
        f"{rows[0]['pairs']} pairs per cell; reference n fixed = n_max",
        f"{'rate':>5} {'n_max':>6} {'true d':>8}  {'reproduced':>10} {'differs':>8} {'inconcl.':>8}  "
        f"{'fixed: repr.':>12} {'differs':>8}  {'mean episodes':>13} {'saving':>7}",
    ]
    for r in rows:
        lines.append(
            f"{r['rate']:>5} {r['n']:>6} {r['true_difference']:>+8.3f}  {r['reproduced']:>10.4f} {r['differs']:>8.4f} "
            f"{r['inconclusive']:>8.4f}  {r['fixed_reproduced']:>12.4f} {r['fixed_differs']:>8.4f}  "
            f"{r['mean_episodes']:>13.1f} {r['saving']:>7.1%}"
        )
    return "\n".join(lines)
