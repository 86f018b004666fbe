"""Statistics of a reproduction: intervals for success rates, equivalence tests against a margin, power.

A reproduction claim is an *equivalence* claim: "this run's success rate is within a margin of the
reference's". A difference test (the old "within three standard errors" rule) cannot make it: the fewer
episodes, the wider its band, so a small evaluation passes large gaps and nothing ever says "we cannot
tell". Here every rate comparison gets one of three verdicts from an interval on the difference
d = p_actual - p_reference and a margin m (absolute, e.g. 0.05 = five percentage points):

    reproduced    the (1 - 2 alpha*) interval lies inside (-m, +m): two one-sided tests (TOST, Schuirmann
                  1987, J Pharmacokinet Biopharm 15:657) each reject at level alpha*, where alpha* <= alpha is the
                  row's calibrated level (`calibrated_alpha`): the largest level at which the test's exact size at
                  the row's design (n_ref, n_act, m; paired: the matched n) is <= alpha, so a true |d| >= m is
                  called reproduced with probability at most alpha. The intervals are approximations: at alpha
                  itself one row's exact size (both binomials, or the paired multinomial, enumerated; audit46
                  stats F1) reached 0.0694 at margin 0.05 (0 vs 0.05, 52 a side), 0.0718 at 0.1 (0.9 vs 1.0, 25),
                  0.0859 at 0.2 (0.8 vs 1.0, 11), paired (Tango) the same at a rate of 0 or 1. The size is
                  sup over the nuisance rate (both signs of d) of P(region), the region being monotone in the
                  level (every interval here narrows as the level rises), so a bisection on log alpha* finds the
                  last level whose size is certified: a grid refined by branch and bound under bounds of the first
                  and second derivative in the nuisance (`_Design`), never a plain grid maximum. Only a row
                  reproduced at alpha is calibrated (one that is not cannot be at alpha* <= alpha); its interval
                  and confidence are then the (1 - 2 alpha*) ones, so "reproduced iff the interval shown lies
                  inside +-m" stays true (comparison rows carry `alpha_calibrated`). A design past
                  CALIBRATION_LIMIT (about 5,300 a side unpaired at margin 0.05, 1,731 paired) is judged at alpha,
                  with a note. Measured cost and sizes: evidence/README.md.
    differs       the same (1 - 2 alpha) interval lies wholly beyond the margin (lower bound > +m or
                  upper bound < -m): a one-sided test of H0 "d <= m" (resp. "d >= -m") rejects at level
                  alpha. The two events exclude each other, so a true |d| <= m is called differs with
                  probability about alpha, not at most alpha: the interval is an approximation. Exactly,
                  with 15 or more episodes a side, one row reaches 0.077 at |d| = m = 0.05 (0.47 vs 0.52,
                  18 a side; 0.065 at 44 a side), 0.074 at m = 0.1 (0.45 vs 0.55, 15 a side), and 0.071 at
                  equal rates (m = 0.05, p = 0.5, 16 vs 15); with fewer, more (0.109 at 5 vs 5 episodes, 0.25
                  at 1 vs 2, up to 0.18 with one side of 1 episode): evidence/README.md. The overall verdict
                  over many rows adjusts this by Holm (reproduction.run.comparison). A paired (Tango) row
                  of up to DIFFERS_LIMIT pairs also needs its exact p (`paired_differs_p`) <= alpha, so its
                  `differs` keeps alpha; an interval beyond the margin with a larger p is inconclusive. The
                  (1 - 2 alpha) interval, not (1 - alpha),
                  because each claim is one-sided, exactly as in TOST: it keeps both verdicts at the one
                  stated alpha and leaves the smallest band of "inconclusive".
    inconclusive  anything else: the interval straddles a margin, so more episodes are needed
                  (`episodes_needed` says how many).

Intervals (all behave at k = 0, k = n and small n, unlike the Wald interval):

- one rate: Wilson score interval (Wilson 1927, JASA 22:209), 95% where a rate is shown;
- two independent rates: Newcombe's hybrid score interval, method 10 of Newcombe 1998 (Stat Med
  17:873), built from the two Wilson intervals at the same level;
- two rates on the same episodes (both sides evaluated the same initial states, matched by reset
  seed): Tango's score interval for paired proportions (Tango 1998, Stat Med 17:891), the inversion of
  the score test on the discordant pairs that Tango derived for exactly this equivalence question. It
  is used, rather than Newcombe's paired method 10 (Stat Med 17:2635), because with no discordant pairs
  (identical deterministic reruns) Newcombe's paired interval collapses to nearly zero width, which
  overstates what 100 episodes show; Tango's stays honest (0 discordant of 100: +-0.026 at 90%).

Defaults: alpha = 0.05, margin = 0.05 absolute; a reference's declared margins (its "margins" field, or
the older "tolerances" field read as margins) override the default per metric or task.

Calibration needs numpy (like `exact_power`): compare imports it only when a rate row is reproduced at alpha.

Power: `episodes_needed` is the normal approximation for TOST of two independent proportions (Chow, Shao
& Wang 2008, Sample Size Calculations in Clinical Research, sec. 4.2), a quick estimate that fails near rates
0 and 1; `exact_power` / `episodes_exact` (what `portable eval --plan` uses) enumerate both binomials.
Stdlib only at import; the functions also take numpy arrays (used by `simulate` and `exact_power`, the only
parts that import numpy).

    python -m reproduction.run.stats simulate [--pairs 10000]     # the verdict-rate table
    python -m reproduction.run.stats simulate --sequential        # the same for the sequential rule
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

DEFAULT_ALPHA = 0.05
DEFAULT_MARGIN = 0.05
MIN_ALPHA = 1e-12
"""The smallest test level anything takes from a user (`--alpha`, a reference's `alpha`, a sequential record's
`level`, each look of eval.sequential): below about 5.6e-17, 1 - 2 alpha rounds to 1 and no interval can be
computed (it was an internal error, audit46 stats F5); at 1e-12 the interval's confidence still holds its level to
a relative 1e-4. (The p-value search of a row that differs, `comparison._p_differs`, goes on down to 1e-15.)"""
VERDICTS = ("reproduced", "differs", "inconclusive")


def z_value(confidence: float) -> float:
    """The two-sided standard normal quantile of a `confidence` interval (0.95 -> 1.95996)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence {confidence} must lie strictly between 0 and 1")
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def _np(x: Any) -> Any:
    """numpy when `x` is an array (simulation), else None (scalars: plain math)."""
    if type(x).__module__ == "numpy":
        import numpy

        return numpy
    return None


def _sqrt(x: Any) -> Any:
    np = _np(x)
    return np.sqrt(np.maximum(x, 0.0)) if np is not None else math.sqrt(max(x, 0.0))


def _where(cond: Any, a: Any, b: Any) -> Any:
    np = _np(cond)
    return np.where(cond, a, b) if np is not None else (a if cond else b)


def wilson(k: Any, n: Any, confidence: float = 0.95) -> tuple[Any, Any]:
    """Wilson's score interval (lo, hi) for a rate of k successes in n trials; (0, 1) when n is 0."""
    z = z_value(confidence)
    n_safe = _where(n > 0, n, 1)
    p = k / n_safe
    denom = 1 + z * z / n_safe
    centre = (p + z * z / (2 * n_safe)) / denom
    half = z * _sqrt(p * (1 - p) / n_safe + z * z / (4 * n_safe * n_safe)) / denom
    lo = _where(n > 0, _where(k <= 0, 0.0, centre - half), 0.0)
    hi = _where(n > 0, _where(k >= n, 1.0, centre + half), 1.0)
    return lo, hi


def newcombe_difference(k_ref: Any, n_ref: Any, k_act: Any, n_act: Any, confidence: float) -> tuple[Any, Any]:
    """Newcombe's hybrid score interval (method 10) for p_act - p_ref of two independent binomials."""
    p1, p2 = k_ref / _where(n_ref > 0, n_ref, 1), k_act / _where(n_act > 0, n_act, 1)
    l1, u1 = wilson(k_ref, n_ref, confidence)
    l2, u2 = wilson(k_act, n_act, confidence)
    d = p2 - p1
    return d - _sqrt((p2 - l2) ** 2 + (u1 - p1) ** 2), d + _sqrt((u2 - p2) ** 2 + (p1 - l1) ** 2)


def newcombe_counts(k_ref: Any, n_ref: int, k_act: Any, n_act: int, confidence: float) -> tuple[Any, Any]:
    """`newcombe_difference` over arrays of whole counts k_ref (of n_ref) and k_act (of n_act), the same floats:
    each side's rate, Wilson limits and squared distances are computed once per count (n + 1 values) and looked up,
    not once per cell of a grid (the planner's and the calibration's grids hold up to millions of cells; Wilson on
    them was most of `eval --plan`'s time)."""
    import numpy as np

    if n_ref < 1 or n_act < 1:
        return newcombe_difference(k_ref, np.full(np.shape(k_ref), float(n_ref)), k_act, float(n_act), confidence)

    def side(n: int) -> tuple[Any, Any, Any]:
        k = np.arange(n + 1.0)
        lo, hi = wilson(k, np.full(n + 1, float(n)), confidence)
        p = k / float(n)
        return p, (p - lo) ** 2, (hi - p) ** 2

    p1, below1, above1 = side(n_ref)
    p2, below2, above2 = side(n_act)
    i1, i2 = np.asarray(k_ref).astype(np.intp), np.asarray(k_act).astype(np.intp)
    d = p2[i2] - p1[i1]
    return d - _sqrt(below2[i2] + above1[i1]), d + _sqrt(above2[i2] + below1[i1])


def _tango_z(b: Any, c: Any, n: Any, delta: Any) -> Any:
    """Tango's score statistic for H0: p_act - p_ref = delta on n pairs, b = (ref yes, act no), c = (no, yes).

    The variance uses the restricted maximum-likelihood discordance under H0 (a closed-form quadratic root);
    for delta < 0 the roles of b and c swap, which keeps the root the non-negative one."""
    neg = delta < 0
    bb, cc, dd = _where(neg, c, b), _where(neg, b, c), _where(neg, -delta, delta)
    r = n - bb - cc
    big_b = bb * (1 - 3 * dd) + cc * (1 - dd) - 2 * r * dd
    q = (big_b + _sqrt(big_b * big_b + 8 * n * bb * dd * (1 - dd))) / (4 * n)
    var = n * (2 * q + dd - dd * dd)
    num = c - b - n * delta
    return _where(
        var > 1e-300, num / _sqrt(_where(var > 1e-300, var, 1.0)), _where(num > 0, 1e300, -1e300) * (num != 0)
    )


def tango_difference(b: Any, c: Any, n: Any, confidence: float) -> tuple[Any, Any]:
    """Tango's score interval for the paired difference (c - b) / n (bisection on the monotone statistic)."""
    z = z_value(confidence)
    d = (c - b) / n
    lo_a, lo_b = d * 0 - 1.0, d  # Z(lower) = +z: search in [-1, d]
    hi_a, hi_b = d, d * 0 + 1.0  # Z(upper) = -z: search in [d, 1]
    for _ in range(60):
        mid = (lo_a + lo_b) / 2
        above = _tango_z(b, c, n, mid) > z  # still below the lower limit
        lo_a, lo_b = _where(above, mid, lo_a), _where(above, lo_b, mid)
        mid = (hi_a + hi_b) / 2
        inside = _tango_z(b, c, n, mid) > -z
        hi_a, hi_b = _where(inside, mid, hi_a), _where(inside, hi_b, mid)
    return lo_b, hi_a


def verdict_of(lo: Any, hi: Any, margin: Any) -> Any:
    """The verdict of a (1 - 2 alpha) interval (lo, hi) on the difference against +-margin (see module doc)."""
    if _np(lo) is not None:
        np = _np(lo)
        out = np.full(np.shape(lo), "inconclusive", dtype=object)
        out[(lo > -margin) & (hi < margin)] = "reproduced"
        out[(lo > margin) | (hi < -margin)] = "differs"
        return out
    if -margin < lo and hi < margin:
        return "reproduced"
    if lo > margin or hi < -margin:
        return "differs"
    return "inconclusive"


@dataclass(kw_only=True, slots=True, frozen=True)
class RateTest:
    """The equivalence test of one rate against its reference."""

    difference: float
    """p_actual - p_reference (paired: the same, computed on the matched episodes)."""
    low: float
    high: float
    """The (1 - 2 alpha) interval on the difference."""
    confidence: float
    margin: float
    alpha: float
    method: str
    """"newcombe-10" (independent) or "tango-paired" (matched episodes)."""
    pairs: int | None = None
    """Matched episodes (paired only), with `discordant` = (reference only, actual only) successes."""
    discordant: tuple[int, int] | None = None

    @property
    def verdict(self) -> str:
        return verdict_of(self.low, self.high, self.margin)


def _check(alpha: float, margin: float) -> None:
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha {alpha} must lie in (0, 0.5)")
    if not 0 < margin < 1:
        raise ValueError(f"margin {margin} must lie in (0, 1)")


def equivalence_independent(k_ref: int, n_ref: int, k_act: int, n_act: int, *, margin: float, alpha: float) -> RateTest:
    """TOST of two independent success counts with Newcombe's method-10 interval at 1 - 2 alpha."""
    _check(alpha, margin)
    confidence = 1 - 2 * alpha
    lo, hi = newcombe_difference(k_ref, n_ref, k_act, n_act, confidence)
    d = k_act / n_act - k_ref / n_ref if n_ref and n_act else 0.0
    return RateTest(
        difference=d, low=lo, high=hi, confidence=confidence, margin=margin, alpha=alpha, method="newcombe-10"
    )


def equivalence_paired(reference: list[bool], actual: list[bool], *, margin: float, alpha: float) -> RateTest:
    """TOST of matched outcomes (episode i of both sides started from the same state) with Tango's interval."""
    _check(alpha, margin)
    if len(reference) != len(actual) or not reference:
        raise ValueError(
            f"paired outcomes must be two equally long non-empty lists, got {len(reference)}, {len(actual)}"
        )
    n = len(reference)
    b = sum(1 for r, a in zip(reference, actual) if r and not a)
    c = sum(1 for r, a in zip(reference, actual) if a and not r)
    confidence = 1 - 2 * alpha
    lo, hi = tango_difference(b, c, n, confidence)
    return RateTest(
        difference=(c - b) / n,
        low=lo,
        high=hi,
        confidence=confidence,
        margin=margin,
        alpha=alpha,
        method="tango-paired",
        pairs=n,
        discordant=(b, c),
    )


def episodes_needed(
    p_ref: float, *, margin: float, alpha: float = DEFAULT_ALPHA, power: float = 0.8, difference: float = 0.0
) -> int:
    """Episodes per side for a TOST of two independent rates to say `reproduced` with probability `power`
    when the true difference is `difference` (|difference| < margin) and the reference rate is p_ref.

    Normal approximation (Chow, Shao & Wang 2008, sec. 4.2): n = (z_{1-alpha} + z_{1-beta'})^2 * v / (m - |d|)^2,
    v = p1 (1 - p1) + p2 (1 - p2), beta' = beta / 2 at d = 0 (both one-sided tests can fail), else beta.
    A rate at 0 or 1 is floored at 1/(2n)-like 0.01 so the answer stays finite and honest."""
    _check(alpha, margin)
    if not 0 < power < 1:
        raise ValueError(f"power {power} must lie in (0, 1)")
    if abs(difference) >= margin:
        raise ValueError(f"true difference {difference} must be smaller than the margin {margin}")
    p1 = min(max(p_ref, 0.01), 0.99)
    p2 = min(max(p1 + difference, 0.01), 0.99)
    beta = (1 - power) / 2 if difference == 0 else 1 - power
    z = NormalDist().inv_cdf(1 - alpha) + NormalDist().inv_cdf(1 - beta)
    return math.ceil(z * z * (p1 * (1 - p1) + p2 * (1 - p2)) / (margin - abs(difference)) ** 2)


def _pmf(n: int, p: float) -> Any:
    """Binomial(n, p) probabilities of k = 0..n (numpy), from log-gamma so large n neither overflows nor underflows."""
    import numpy as np

    k = np.arange(n + 1)
    if p <= 0 or p >= 1:
        return (k == (0 if p <= 0 else n)).astype(float)
    lg = np.array([math.lgamma(i + 1) for i in range(n + 1)])
    return np.exp(lg[n] - lg - lg[::-1] + k * math.log(p) + (n - k) * math.log1p(-p))


def exact_power(
    p_ref: float, p_act: float, n_ref: int, n_act: int, *, margin: float, alpha: float, calibrated: bool = False
) -> float:
    """P(`reproduced`) of the unpaired test (Newcombe TOST) when the two sides' true rates are p_ref and p_act, by
    exact enumeration of both binomials (outcomes of probability < 1e-13 left out: the result is low by at most
    (n_ref + n_act + 2) 1e-13). calibrated=True: the test compare runs, at the design's calibrated level
    (`calibrated_alpha`; `episodes_exact` plans with it); by default the uncalibrated one at alpha (its size exceeds
    alpha on small designs)."""
    import numpy as np

    _check(alpha, margin)
    if calibrated and calibrable(n_ref, n_act, margin):  # past the limit compare judges at alpha too
        alpha = calibrated_alpha(n_ref, n_act, margin, alpha)
    pr, pa = _pmf(n_ref, p_ref), _pmf(n_act, p_act)
    kr, ka = np.nonzero(pr > 1e-13)[0], np.nonzero(pa > 1e-13)[0]
    k1, k2 = np.meshgrid(kr.astype(float), ka.astype(float), indexing="ij")
    lo, hi = newcombe_counts(k1, n_ref, k2, n_act, 1 - 2 * alpha)
    inside = (lo > -margin) & (hi < margin)
    return float(np.sum(np.outer(pr[kr], pa[ka]) * inside))


def episodes_exact(
    rows: list[tuple[float, int]] | list[tuple[float, int, float]],
    *,
    margin: float,
    alpha: float = DEFAULT_ALPHA,
    power: float = 0.8,
    difference: float = 0.0,
    limit: int = 1 << 20,
) -> int:
    """The episodes per task n at which the exact probability that *every* row says `reproduced` is at least
    `power`, unpaired, both sides evaluating n per task. A row is (reference rate p, tasks it pools) or (p, tasks,
    its own margin): a per-task row has 1, a policy's overall row the number of tasks T (it sees T n episodes a
    side); its true rate on this run is p + difference (p - difference where that would pass 1); a row without its
    own margin is tested at `margin`. The rows of one comparison are dependent, so the bound used is Bonferroni's:
    sum of (1 - exact power of each row) <= 1 - power over *all* rows, whatever their margins, which guarantees
    P(all) >= power (rows of several margins share the one budget: planning each margin alone with the whole
    1 - power and taking the largest n gave 0.72-0.75, audit46 stats F2).

    Searched on the exact power of the calibrated test compare runs (`exact_power(..., calibrated=True)`), not the
    normal approximation: near rates 0 and 1 that one promised 80% and delivered 0-60% (audit F3). Exponential
    search then bisection on the uncalibrated power (cheap; the calibrated test's power is no larger at any n), then
    steps of n / 64 up until the calibrated bound holds; the n returned itself satisfies it (the exact power is
    saw-toothed in n, so a few n above it may fall just short).
    Raises ValueError when no n up to `limit` does."""
    full = [(row[0], row[1], float(row[2] if len(row) > 2 else margin)) for row in rows]
    margins = sorted({m for _, _, m in full}) or [float(margin)]
    for m in margins:
        _check(alpha, m)
    if not 0 < power < 1:
        raise ValueError(f"power {power} must lie in (0, 1)")
    for m in margins:
        if not abs(difference) < m:
            raise ValueError(f"true difference {difference} must be smaller than the margin {m}")
    counts = {row: full.count(row) for row in full}
    cache: dict[tuple[float, int, float, bool], float] = {}

    def power_of(row: tuple[float, int, float], n: int, calibrated: bool) -> float:
        p, tasks, m = row
        key = (p, n * tasks, m, calibrated)
        if key not in cache:
            q = p + difference if 0 <= p + difference <= 1 else p - difference
            cache[key] = exact_power(p, q, n * tasks, n * tasks, margin=m, alpha=alpha, calibrated=calibrated)
        return cache[key]

    def shortfall(n: int, calibrated: bool = True) -> float:
        total = 0.0
        for row, times in counts.items():
            total += (1 - power_of(row, n, calibrated)) * times
        return total

    def fits(n: int) -> bool:
        """shortfall(n) <= budget, calibrating the designs (the costly part) smallest first and stopping once the
        rows' shortfall is sure to pass the budget: a row's calibrated shortfall is no smaller than its uncalibrated
        one (alpha* <= alpha, nested regions), so known calibrated terms plus the other rows' uncalibrated ones bound
        it from below (1e-9 of slack for the summation order). The answer is the full sum's, as before."""
        low = {row: 1 - power_of(row, n, False) for row in counts}
        for row in sorted(counts, key=lambda r: r[1]):
            if sum(low[r] * t for r, t in counts.items()) > budget + 1e-9:
                return False
            low[row] = 1 - power_of(row, n, True)
        return shortfall(n) <= budget

    def search(lo: int, hi: int, calibrated: bool) -> int:
        """Doubling from hi, then bisection: an n whose shortfall fits the budget (lo: one known not to)."""
        while shortfall(hi, calibrated) > budget:
            if hi >= limit:
                shown = ", ".join(f"{m:g}" for m in margins)
                raise ValueError(f"no n up to {limit} episodes per task gives power {power} at margin {shown}")
            lo, hi = hi, 2 * hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if shortfall(mid, calibrated) <= budget else (mid, hi)
        return hi

    budget = 1 - power + 1e-12
    # The calibrated test reproduces less often than the uncalibrated one at the same n (alpha* <= alpha, nested
    # regions), so the uncalibrated search (cheap) gives a start; from there the calibrated power is checked in steps
    # of 1/64 (each step calibrates the designs of one n) and the first n that fits is returned: at most 1/64 above
    # the smallest such n past the start, and it itself satisfies the bound.
    hi = search(0, 1, False)
    while not fits(hi):
        if hi >= limit:
            shown = ", ".join(f"{m:g}" for m in margins)
            raise ValueError(f"no n up to {limit} episodes per task gives power {power} at margin {shown}")
        hi = min(limit, hi + max(1, hi // 64))
    return hi


# -- size calibration -----------------------------------------------------------------------------

SIZE_SLACK = 1e-10
"""What the certified size bound must leave below alpha: room for the floating-point error of the enumeration."""
_BUDGET = 20_000
"""Nuisance points the certification of one level may evaluate per direction; past it the level counts as failed
(conservative: the bisection then settles lower)."""
_TAIL = 1e-15
"""Added to every evaluated probability: a bound of the binomial mass left outside the window each point enumerates
(+-sqrt(20 n) + 2 around the mean: Hoeffding's 2 exp(-40) = 8.5e-18 a side per binomial)."""
_LG_TABLE: list[Any] = []
"""[one read-only numpy array of log k!, k = 0..len-1]: replaced whole when it grows, never changed in place."""


def _lgamma_table(n: int) -> Any:
    """log k! for k = 0..n (numpy), grown once and shared.

    The array is built only when the table grows (a calibration asks for it ~1,000 times: np.array of a list each
    time was 7% of `eval --plan`). A grown table is summed in a local list and swapped in whole, so two threads
    growing it at once each return a correct table (the later swap may keep the shorter one: only a rebuild)."""
    import numpy as np

    table = _LG_TABLE[0] if _LG_TABLE else None
    if table is None or len(table) <= n:
        values = table.tolist() if table is not None else [0.0]
        while len(values) <= n:
            values.append(values[-1] + math.log(len(values)))
        table = np.array(values)
        table.flags.writeable = False
        _LG_TABLE[:] = [table]
    return table[: n + 1]


def _window(n: int, p_lo: float, p_hi: float) -> tuple[int, int]:
    """Counts k0..k1 (inclusive) holding all but _TAIL of Binomial(n, p)'s mass for every p in [p_lo, p_hi]."""
    t = math.sqrt(20 * n) + 2
    return max(0, math.floor(n * p_lo - t)), min(n, math.ceil(n * p_hi + t))


def _binom_window(n: int, ps: Any, k0: int, k1: int) -> Any:
    """Binomial(n, p) probabilities of k = k0..k1, one row per p in `ps` (numpy), from log-gamma."""
    import numpy as np

    lg = _lgamma_table(n)
    k = np.arange(k0, k1 + 1, dtype=float)
    p = np.clip(np.asarray(ps, dtype=float)[:, None], 0.0, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        lp = np.where(k == 0, 0.0, k * np.log(p))
        lq = np.where(k == n, 0.0, (n - k) * np.log1p(-p))
    return np.exp(lg[n] - lg[k0 : k1 + 1] - lg[n - k1 : n - k0 + 1][::-1] + lp + lq)


def _certify(f: Any, bounds: Any, a: float, b: float, target: float, start: int, tol: float = math.inf) -> float | None:
    """A certified upper bound of sup f over [a, b] when it is <= target, else None (f exceeds target somewhere, or the
    bound could not be brought under it within _BUDGET evaluations).

    f: vectorised over points; bounds(a, b) -> (L, M): bounds of |f'| and |f''| on [a, b]. On an interval of length
    h, f <= min((f(a) + f(b)) / 2 + L h / 2, max(f(a), f(b)) + M h^2 / 8). Intervals whose bound passes target, or
    the largest value met by more than `tol`, are halved (branch and bound); the others are dropped."""
    import numpy as np

    if b <= a:
        return None if float(f(np.array([a]))[0]) > target else target
    xs = np.linspace(a, b, start)
    fs = f(xs)
    if fs.max() > target:
        return None
    lo, hi, flo, fhi = xs[:-1], xs[1:], fs[:-1], fs[1:]
    seen, bound, used = float(fs.max()), float(fs.max()), start  # the largest value met; the bound of the dropped
    while True:
        big_l, big_m = bounds(lo, hi)
        h = hi - lo
        with np.errstate(invalid="ignore"):
            tent = np.minimum((flo + fhi) / 2 + big_l * h / 2, np.maximum(flo, fhi) + big_m * h * h / 8)
        bad = (tent > target) | (tent > seen + tol)
        if (~bad).any():
            bound = max(bound, float(tent[~bad].max()))
        if not bad.any():
            return bound
        lo, hi, flo, fhi = lo[bad], hi[bad], flo[bad], fhi[bad]
        used += lo.size
        if used > _BUDGET:
            return None
        mid = (lo + hi) / 2
        fm = f(mid)
        if fm.max() > target:
            return None
        seen = max(seen, float(fm.max()))
        bound = max(bound, seen)
        lo, hi = np.concatenate([lo, mid]), np.concatenate([mid, hi])
        flo, fhi = np.concatenate([flo, fm]), np.concatenate([fm, fhi])


def _chunks(xs: Any, size: int = 64) -> Any:
    """(positions, sorted points) in runs of `size`: sorted runs keep each run's binomial window narrow."""
    import numpy as np

    order = np.argsort(xs)
    for i in range(0, xs.size, size):
        yield order[i : i + size], xs[order[i : i + size]]


def _info(n: int, x: Any, y: Any) -> Any:
    """n / (p (1 - p)) at its largest over [x, y] (inf at p = 0 or 1): a binomial's Fisher information."""
    import numpy as np

    v = np.minimum(x * (1 - x), y * (1 - y))
    with np.errstate(divide="ignore"):
        return n / np.maximum(v, 0.0)


class _Design:
    """The reproduced region of one row's design at a level, and its certified exact size.

    The size at a nuisance value is P(region) under both binomials (paired: the multinomial of the discordant
    counts). Its derivatives in the nuisance obey, with S the score and I the Fisher information along the
    nuisance: |f'| = |E[S 1_R]| <= E|S| / 2 <= sqrt(I) / 2 (E S = 0), and |f'| <= n_ref + n_act (paired: 2 n; the
    total-variation rate of the trials); |f''| = |E[(S^2 + S') 1_R]| <= I (E[S^2 + S'] = 0, S' <= 0)."""

    def __init__(self, n_ref: int, n_act: int, margin: float, alpha: float, paired: bool):
        import numpy as np

        self.n_ref, self.n_act, self.margin, self.paired = n_ref, n_act, margin, paired
        self.start = int(48 + 2 * math.sqrt(n_ref + n_act))
        if paired:
            n = n_ref
            b, c = np.meshgrid(np.arange(n + 1.0), np.arange(n + 1.0), indexing="ij")
            keep = (b + c <= n) & (np.abs(c - b) < margin * n + 1)
            b, c = b[keep], c[keep]
            nn = np.full(b.shape, float(n))
            # reproduced at z iff Z(-m) > z and Z(+m) < -z (Tango's statistic falls in delta): below this critical z
            crit = np.minimum(_tango_z(b, c, nn, -margin + 0 * b), -_tango_z(b, c, nn, margin + 0 * b))
            inside = crit > z_value(1 - 2 * alpha) * (1 - 1e-9)
            self.b, self.c, self.crit = b[inside], c[inside], crit[inside]
            lg = _lgamma_table(n)
            self.lcoef = lg[n] - lg[self.b.astype(int)] - lg[self.c.astype(int)] - lg[(n - self.b - self.c).astype(int)]
        else:
            k1 = np.arange(n_ref + 1.0)
            start = np.floor((k1 / n_ref - margin) * n_act) - 1
            width = int(math.ceil(2 * margin * n_act)) + 4
            k2 = start[:, None] + np.arange(width)[None, :]
            valid = (k2 >= 0) & (k2 <= n_act)
            self.k1 = np.broadcast_to(k1[:, None], k2.shape)
            lo, hi = newcombe_counts(
                self.k1, n_ref, np.where(valid, k2, 0.0), n_act, 1 - 2 * min(alpha * (1 + 1e-9), 0.4999)
            )
            keep = valid & (lo > -margin - 1e-12) & (hi < margin + 1e-12)
            rows = keep.any(axis=1)
            self.k1, k2, self.keep = k1[rows], k2[rows], keep[rows]
            self.k2 = np.where(valid[rows], k2, 0.0)

    def region(self, level: float) -> Any:
        """The cells reproduced at `level`, slightly inflated (a superset: the certification stays conservative)."""
        import numpy as np

        if self.paired:
            return self.crit > z_value(1 - 2 * level) * (1 - 1e-9)
        shape = self.k2.shape
        lo, hi = newcombe_counts(
            np.broadcast_to(self.k1[:, None], shape),
            self.n_ref,
            self.k2,
            self.n_act,
            1 - 2 * min(level * (1 + 1e-9), 0.4999),
        )
        return self.keep & (lo > -self.margin - 1e-12) & (hi < self.margin + 1e-12)

    def size(self, level: float, target: float, tol: float = math.inf) -> float | None:
        """A certified bound of sup over the nuisance of P(reproduced at `level` | |d| = margin) if it is <= target,
        else None. Both directions d = +margin and d = -margin."""
        mask = self.region(level)
        if not mask.any():
            return 0.0
        worst = 0.0
        for sign in (1, -1):
            f, bounds, a, b = self._paired(mask, sign) if self.paired else self._unpaired(mask, sign)
            got = _certify(f, bounds, a, b, target, self.start, tol)
            if got is None:
                return None
            worst = max(worst, got)
        return worst

    def _unpaired(self, mask: Any, sign: int) -> Any:
        """P(reproduced) with p_ref = p, p_act = p + sign m; per reference count the reproduced k_act form a run (its
        hull, a superset, is used), so one row of cumulative sums answers them all."""
        import numpy as np

        m, n1, n2 = self.margin, self.n_ref, self.n_act
        any_row = mask.any(axis=1)
        width = mask.shape[1]
        first = np.argmax(mask, axis=1)[any_row]
        last = (width - 1 - np.argmax(mask[:, ::-1], axis=1))[any_row]
        rows = self.k1[any_row].astype(int)
        k2_hi = self.k2[any_row][np.arange(rows.size), last].astype(int)
        k2_lo = self.k2[any_row][np.arange(rows.size), first].astype(int)

        def f(ps: Any) -> Any:
            out = np.empty(ps.size)
            for where, p in _chunks(ps):
                q = p + sign * m
                a0, a1 = _window(n1, float(p[0]), float(p[-1]))
                b0, b1 = _window(n2, float(q.min()), float(q.max()))
                sel = (rows >= a0) & (rows <= a1)
                pr = _binom_window(n1, p, a0, a1)[:, rows[sel] - a0]
                cdf = np.concatenate([np.zeros((p.size, 1)), np.cumsum(_binom_window(n2, q, b0, b1), axis=1)], 1)
                top = np.clip(k2_hi[sel] + 1 - b0, 0, b1 - b0 + 1)
                bottom = np.clip(k2_lo[sel] - b0, 0, b1 - b0 + 1)
                out[where] = np.sum(pr * (cdf[:, top] - cdf[:, bottom]), axis=1) + 2 * _TAIL
            return out

        def bounds(x: Any, y: Any) -> Any:
            i1, i2 = _info(n1, x, y), _info(n2, x + sign * m, y + sign * m)
            big_l = np.minimum(float(n1), 0.5 * np.sqrt(i1)) + np.minimum(float(n2), 0.5 * np.sqrt(i2))
            return big_l, i1 + i2

        return f, bounds, *((0.0, 1 - m) if sign > 0 else (m, 1.0))

    def _paired(self, mask: Any, sign: int) -> Any:
        """P(reproduced) with discordance q10 = t, q01 = t + m (sign -1: swapped), t in [0, (1 - m) / 2]."""
        b, c = (self.b[mask], self.c[mask]) if sign > 0 else (self.c[mask], self.b[mask])
        return _trinomial(self.n_ref, self.margin, b, c, self.lcoef[mask])


def _trinomial(n: int, m: float, b: Any, c: Any, lcoef: Any) -> Any:
    """(f, bounds, a, b) for `_certify`: f(t) = P((b, c) in the cells given) when n pairs are discordant with
    q10 = t, q01 = t + m, t in [a, b] = [0, (1 - m) / 2]; lcoef the cells' log multinomial coefficients."""
    import numpy as np

    r = n - b - c

    def f(ts: Any) -> Any:
        out = np.empty(ts.size)
        for where, t in _chunks(ts):
            b0, b1 = _window(n, float(t[0]), float(t[-1]))
            c0, c1 = _window(n, float(t[0]) + m, float(t[-1]) + m)
            sel = (b >= b0) & (b <= b1) & (c >= c0) & (c <= c1)
            counts = np.stack([b[sel], c[sel], r[sel]], axis=1)
            probs = np.stack([t, t + m, np.clip(1 - 2 * t - m, 0.0, 1.0)])
            with np.errstate(divide="ignore"):
                logs = np.where(probs > 0, np.log(probs), -1e300)  # 0 * -1e300 = 0: a count of 0 at rate 0
            out[where] = np.exp(lcoef[sel][:, None] + counts @ logs).sum(axis=0) + 2 * _TAIL
        return out

    def bounds(x: Any, y: Any) -> Any:
        with np.errstate(divide="ignore"):
            info = n * (1 / x + 1 / (x + m) + 4 / np.maximum(1 - 2 * y - m, 0.0))
        return np.minimum(2.0 * n, 0.5 * np.sqrt(info)), info

    return f, bounds, 0.0, (1 - m) / 2


def _sup_relative(f: Any, bounds: Any, a: float, b: float, start: int, *, rel: float, floor: float) -> float | None:
    """A certified upper bound of sup f over [a, b] within a share `rel` of the largest value met (or within `floor`
    of it, for tinier values: `paired_differs_p`'s DIFFERS_FLOOR), or None past 5 x _BUDGET evaluations. f a
    probability P(R) in a parameter of Fisher information I: besides `bounds`' |f'| <= L,
    |d sqrt(f) / dt| = |E[S 1_R]| / (2 sqrt f) <= sqrt(I) / 2 (Cauchy-Schwarz, E S = 0), so on an interval of
    length h, sqrt f <= (sqrt f(a) + sqrt f(b)) / 2 + sqrt(I) h / 4: a bound relative to f itself, which a tiny
    p-value needs (`_certify`'s absolute bounds would need ~1e9 points for a p of 1e-8)."""
    import numpy as np

    xs = np.linspace(a, b, start)
    fs = f(xs)
    lo, hi, flo, fhi = xs[:-1], xs[1:], fs[:-1], fs[1:]
    seen, bound, used = float(fs.max()), float(fs.max()), start
    while True:
        big_l, info = bounds(lo, hi)
        h = hi - lo
        with np.errstate(invalid="ignore"):
            root = (np.sqrt(flo) + np.sqrt(fhi)) / 2 + np.sqrt(info) * h / 4
            tent = np.minimum((flo + fhi) / 2 + big_l * h / 2, root * root)
        bad = ~(tent <= max(seen * (1 + rel), seen + floor))  # NaN (info inf at an end) counts as not yet bounded
        if (~bad).any():
            bound = max(bound, float(tent[~bad].max()))
        if not bad.any():
            return bound
        lo, hi, flo, fhi = lo[bad], hi[bad], flo[bad], fhi[bad]
        used += lo.size
        if used > 5 * _BUDGET:
            return None
        mid = (lo + hi) / 2
        fm = f(mid)
        seen = max(seen, float(fm.max()))
        bound = max(bound, seen)
        lo, hi = np.concatenate([lo, mid]), np.concatenate([mid, hi])
        flo, fhi = np.concatenate([flo, fm]), np.concatenate([fm, fhi])


DIFFERS_FLOOR = 1e-6
"""How far down `paired_differs_p` certifies a p-value: a smaller one comes back as about this (the branch and bound
would need far more points to certify a bound relative to a p of 1e-9). `comparison` then uses Tango's approximate p,
whose size is still at most about this, since the exact p is below it (review61 1)."""

DIFFERS_LIMIT = 500
"""The most matched episodes at which `paired_differs_p` enumerates: its cells, half the (n + 1)^2 grid, cost
about 0.3 s there (3 s at 1,000). Past it a paired row's p_differs is Tango's approximate one (a note says so)."""


@functools.lru_cache(maxsize=4096)
def paired_differs_p(b: int, c: int, n: int, margin: float) -> float:
    """The exact p-value of a paired (Tango) row's `differs` for its side (c > b: H0 d <= +margin; else d >= -margin):
    sup over the nuisance discordance of P(Tango's statistic at the margin is at least the one observed | d = the
    margin), a certified upper bound within 0.5% of the supremum (branch and bound in the nuisance as for
    `calibrated_alpha`), certified down to DIFFERS_FLOOR: a smaller p comes back as about DIFFERS_FLOOR. For a row
    that differs (Tango's statistic at the margin above 0); 1.0 for a cell at or below 0, which is no evidence.

    Tango's approximate p (the level at which the interval just leaves the margin) is about twice its level when
    discordance is rare (rates near 0 or 1): exactly 0.0523 at 0.025 with 200 pairs, margin 0.02, so Holm's overall
    `differs` reached 0.10 with 10 tasks of 200 (audit60 C1). This one holds every level: P(p <= a) <= a at
    |d| <= margin. The observed cell is in the region, so the bound is never 0. Raises ValueError past
    DIFFERS_LIMIT."""
    import numpy as np

    _check(0.25, margin)
    if not 0 < n <= DIFFERS_LIMIT:
        raise ValueError(f"paired_differs_p takes 1..{DIFFERS_LIMIT} pairs, got {n}")
    if c - b < 0:  # the lower side: the mirror image (swap who succeeded alone)
        b, c = c, b
    z_seen = float(_tango_z(np.array([float(b)]), np.array([float(c)]), np.array([float(n)]), np.array([margin]))[0])
    if not z_seen > 0:  # not beyond the margin on either side: the region below would leave out cells as extreme
        return 1.0
    bb, cc = np.meshgrid(np.arange(n + 1.0), np.arange(n + 1.0), indexing="ij")
    keep = (bb + cc <= n) & (cc - bb > margin * n - 1)  # only these can have lo > m (Z > 0 needs c - b > n m)
    bb, cc = bb[keep], cc[keep]
    nn = np.full(bb.shape, float(n))
    z = _tango_z(bb, cc, nn, margin + 0 * bb)
    mask = z >= z_seen - 1e-9 * max(1.0, abs(z_seen))  # a superset of the cells at least as extreme: conservative
    lg = _lgamma_table(n)
    bb, cc = bb[mask], cc[mask]
    lcoef = lg[n] - lg[bb.astype(int)] - lg[cc.astype(int)] - lg[(n - bb - cc).astype(int)]
    f, bounds, lo, hi = _trinomial(n, margin, bb, cc, lcoef)
    got = _sup_relative(f, bounds, lo, hi, int(48 + 2 * math.sqrt(2 * n)), rel=0.005, floor=DIFFERS_FLOOR)
    return 1.0 if got is None else max(1e-15, min(1.0, got))


CALIBRATION_LIMIT = 3_000_000
"""The most cells a design may enumerate for `calibrated_alpha` (unpaired: (n_ref + 1) (2 m n_act + 4); paired: the
(n + 1)^2 grid of discordant counts, i.e. n up to 1,731). Beyond it the level is not calibrated (`calibrable`): the
time and memory would grow without bound (2M episodes a side is a valid evidence file), and there the uncalibrated
size was measured close to alpha (evidence/README.md)."""


def calibrable(n_ref: int, n_act: int, margin: float, paired: bool = False) -> bool:
    """Whether `calibrated_alpha` takes this design (CALIBRATION_LIMIT)."""
    cells = (n_ref + 1) ** 2 if paired else (n_ref + 1) * (2 * margin * n_act + 4)
    return cells <= CALIBRATION_LIMIT


@functools.lru_cache(maxsize=4096)
def calibrated_alpha(n_ref: int, n_act: int, margin: float, alpha: float, paired: bool = False) -> float:
    """The largest level a <= alpha (to a relative 5e-3, from below) at which the row's test keeps its exact size:
    sup over the nuisance rate of P(reproduced at a | |d| = margin) <= alpha, certified (see `exact_size`).

    Design: n_ref and n_act episodes (paired: n_ref = n_act = the matched episodes, the nuisance the discordance).
    The reproduced region grows with the level (every interval here narrows as the level rises), so the size does
    too, and a bisection on log a finds the last certified level."""
    _check(alpha, margin)
    if paired and n_ref != n_act:
        raise ValueError(f"a paired design has one n, got {n_ref} and {n_act}")
    if not calibrable(n_ref, n_act, margin, paired):
        raise ValueError(f"design {n_ref} / {n_act} (paired {paired}) is past CALIBRATION_LIMIT")
    if n_ref < 1 or n_act < 1:
        return alpha
    design = _Design(n_ref, n_act, margin, alpha, paired)
    target = alpha - SIZE_SLACK
    if design.size(alpha, target) is not None:
        return alpha
    hi, lo = alpha, alpha / 2
    while design.size(lo, target) is None:
        hi, lo = lo, lo / 2
        if lo < MIN_ALPHA:
            return min(MIN_ALPHA, alpha)  # a floor, but never above the level asked for
    seen = {int(design.region(lo).sum()): True, int(design.region(hi).sum()): False}
    while hi / lo > 1.005:
        mid = math.sqrt(lo * hi)
        cells = int(design.region(mid).sum())  # nested regions: the same count is the same region
        ok = seen.get(cells)
        if ok is None:
            ok = seen[cells] = design.size(mid, target) is not None
        lo, hi = (mid, hi) if ok else (lo, mid)
    return lo


def exact_size(
    n_ref: int, n_act: int, margin: float, level: float, *, paired: bool = False, alpha: float = 0.5, tol: float = 1e-5
) -> float | None:
    """A certified upper bound of the exact size at `level` (sup over the nuisance rate, both signs, of P(reproduced |
    |d| = margin)) within `tol` of the largest value met, or None when the size exceeds `alpha`. The sup is a grid
    refined by branch and bound under a Lipschitz bound of P(region) in the nuisance, |f'| <= min(n, sqrt(I) / 2)
    summed over the binomials (I their Fisher information; paired: min(2n, sqrt(I) / 2)), so no value between grid
    points can pass it."""
    design = _Design(n_ref, n_act, margin, max(level, 1e-12), paired)
    return design.size(level, alpha, tol)


# -- simulation -----------------------------------------------------------------------------------


def draw_outcomes(rng: Any, n: int, p: float, q: float, rho: float, pairs: int) -> Any:
    """`pairs` draws of one design's four counts, an int array (pairs, 4): both succeeded, only the reference, only
    the actual, neither, over n episodes a side from shared initial states. With probability rho an episode's
    actual outcome is the reference's uniform drawn again (the same state decides), else an independent one; rho 0
    gives two independent binomials (the unpaired design's counts are the column sums)."""
    import numpy as np

    both = rho * min(p, q) + (1 - rho) * p * q
    probs = np.clip([both, p - both, q - both, 1 - p - q + both], 0.0, 1.0)
    return rng.multinomial(n, probs / probs.sum(), size=pairs)


def outcomes_of(counts: Any) -> tuple[list[bool], list[bool]]:
    """Paired outcome lists (reference, actual) with the four counts of `draw_outcomes` (order does not matter to
    any test here)."""
    n11, n10, n01, n00 = (int(x) for x in counts)
    return [True] * (n11 + n10) + [False] * (n01 + n00), [True] * n11 + [False] * n10 + [True] * n01 + [False] * n00


def decide(counts: Any, n: int, *, paired: bool, margin: float, alpha: float) -> str:
    """compare's verdict (`comparison.rate_row`) on one draw: paired, the four counts of `draw_outcomes`; else
    (k_ref, k_act) of n episodes a side."""
    from reproduction.run.comparison import rate_row

    if paired:
        ref, act = outcomes_of(counts)
    else:
        k_ref, k_act = (int(x) for x in counts)
        ref, act = [True] * k_ref + [False] * (n - k_ref), [True] * k_act + [False] * (n - k_act)
    return rate_row(ref, act, paired=paired, margin=margin, alpha=alpha).verdict


def simulate(
    *,
    rates: tuple[float, ...] = (0.1, 0.5, 0.9),
    ns: tuple[int, ...] = (50, 100, 500),
    shifts: tuple[float, ...] = (0.0, 0.5, 1.0, 2.0),
    margin: float = DEFAULT_MARGIN,
    alpha: float = DEFAULT_ALPHA,
    pairs: int = 10_000,
    seed: int = 0,
    paired: bool = False,
    rho: float = 0.0,
) -> list[dict[str, Any]]:
    """Verdict rates of compare's own rate-row decision (`comparison.rate_row`: the test, pairing and calibration
    compare uses; a one-row comparison's overall verdict) over `pairs` simulated (reference, actual) draws per cell.

    A cell: reference rate p, n episodes each side, true difference shift * margin (the actual's rate is
    p + d, or p - d when p + d would pass 1). `paired`: both sides evaluated the same initial states, outcomes
    correlated by `rho` (`draw_outcomes`); else independent sides with no state shared (unpaired). The decision
    depends on the draw's counts alone, so each distinct count is decided once. Returns one dict per cell with the
    three verdicts' rates."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for p in rates:
        for n in ns:
            for s in shifts:
                d = s * margin
                q = p + d if p + d <= 1 else p - d
                counts = draw_outcomes(rng, n, p, q, rho if paired else 0.0, pairs)
                if not paired:  # the sides share no state: their two counts (k_ref, k_act) decide
                    counts = np.stack([counts[:, 0] + counts[:, 1], counts[:, 0] + counts[:, 2]], axis=1)
                keys, inverse = np.unique(counts, axis=0, return_inverse=True)
                decided = np.array([decide(k, n, paired=paired, margin=margin, alpha=alpha) for k in keys])
                v = decided[np.asarray(inverse).reshape(-1)]
                out.append(
                    {"rate": p, "n": n, "true_difference": round(q - p, 6), "shift": s, "pairs": pairs}
                    | {"paired": paired, "rho": rho if paired else 0.0}
                    | {name: float(np.mean(v == name)) for name in VERDICTS}
                )
    return out


def render_simulation(rows: list[dict[str, Any]], *, margin: float, alpha: float) -> str:
    head = f"{'rate':>5} {'n':>5} {'true d':>8}  {'reproduced':>10} {'differs':>8} {'inconclusive':>12}  expected"
    design = f"paired, rho {rows[0]['rho']:g}" if rows[0].get("paired") else "unpaired"
    lines = [
        f"compare's rate-row decision ({design}), margin {margin}, alpha {alpha}, {rows[0]['pairs']} pairs per cell",
        head,
    ]
    for r in rows:
        note = {0.0: "differs <= alpha", 1.0: "reproduced <= alpha", 2.0: "reproduced <= alpha"}.get(r["shift"], "")
        lines.append(
            f"{r['rate']:>5} {r['n']:>5} {r['true_difference']:>+8.3f}  {r['reproduced']:>10.4f} {r['differs']:>8.4f} "
            f"{r['inconclusive']:>12.4f}  {note}"
        )
    return "\n".join(lines)


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m reproduction.run.stats", description=__doc__.splitlines()[0], allow_abbrev=False
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    sim = sub.add_parser("simulate", allow_abbrev=False, help="the verdict-rate table of the equivalence test")
    sim.add_argument("--pairs", type=int, default=10_000)
    sim.add_argument("--margin", type=float, default=DEFAULT_MARGIN)
    sim.add_argument("--alpha", type=float, default=DEFAULT_ALPHA)
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument(
        "--sequential", action="store_true", help="the group-sequential rule (reproduction.run.sequential)"
    )
    sim.add_argument("--looks", type=int, default=4)
    sim.add_argument(
        "--paired", action="store_true", help="both sides evaluate the same initial states (compare's Tango row)"
    )
    sim.add_argument(
        "--rho", type=float, default=0.0, help="with --paired: P(an episode's outcome is decided by its state alone)"
    )
    sim.add_argument("--rates", type=_floats, help="reference rates, comma-separated (default 0.1,0.5,0.9)")
    sim.add_argument(
        "--n",
        type=_ints,
        help="episodes a side (n_max for --sequential), comma-separated (default 50,100,500; 50,100,500,2000 "
        "with --sequential)",
    )
    sim.add_argument(
        "--shifts",
        type=_floats,
        help="true differences in margins, comma-separated (default 0,0.5,1,2; 0,0.5,1,2,3 with --sequential)",
    )
    args = parser.parse_args(argv)
    grid = {k: v for k, v in (("rates", args.rates), ("ns", args.n), ("shifts", args.shifts)) if v is not None}
    if args.sequential and (args.paired or args.rho):
        parser.error("--sequential simulates the unpaired rule only; drop --paired/--rho")
    if args.rho and not args.paired:
        parser.error(f"--rho {args.rho:g} needs --paired (unpaired sides share no state to correlate)")
    if not 0 <= args.rho <= 1:
        parser.error(f"--rho {args.rho:g}: a probability, 0 to 1")
    if args.sequential:
        from reproduction.run.sequential import SequentialRule, render_sequential, simulate_sequential

        rule = SequentialRule(looks=args.looks, alpha=args.alpha, margin=args.margin)
        print(render_sequential(simulate_sequential(rule=rule, pairs=args.pairs, seed=args.seed, **grid), rule))
        return 0
    rows = simulate(
        margin=args.margin, alpha=args.alpha, pairs=args.pairs, seed=args.seed, paired=args.paired, rho=args.rho, **grid
    )
    print(render_simulation(rows, margin=args.margin, alpha=args.alpha))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
