"""audit46 stats F1: the exact size of `reproduced` (P(reproduced) at a true |d| = m), pinned to the figures the
docs quote, so the table in evidence/README.md cannot drift from the code. Exact: the binomials (paired: the
discordant-pair multinomial at p10 = 0, where b is always 0) are enumerated in full."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from reproduction.run import stats

ROOT = Path(__file__).resolve().parents[1]


def _paired_size_at_zero(n: int, margin: float, alpha: float) -> float:
    """P(reproduced) of the paired (Tango) row when p10 = 0 and p01 = margin: b = 0, c ~ Binomial(n, margin)."""
    total = 0.0
    for c in range(n + 1):
        lo, hi = stats.tango_difference(0, c, n, 1 - 2 * alpha)
        if -margin < lo and hi < margin:
            total += math.comb(n, c) * margin**c * (1 - margin) ** (n - c)
    return total


@pytest.mark.parametrize(
    ("p_ref", "p_act", "n", "margin", "size"),
    [(0.9, 1.0, 25, 0.1, "0.0718"), (0.0, 0.05, 52, 0.05, "0.0694"), (0.8, 1.0, 11, 0.2, "0.0859")],
)
def test_exact_size_above_alpha_is_the_documented_figure(p_ref, p_act, n, margin, size):
    got = stats.exact_power(p_ref, p_act, n, n, margin=margin, alpha=0.05)
    assert f"{got:.4f}" == size
    assert f"{_paired_size_at_zero(n, margin, 0.05):.4f}" == size  # Tango equals Newcombe at a rate of 0
    assert (
        f"| {margin:.2f} | {size} ({min(p_ref, p_act):g} vs {max(p_ref, p_act):g}"
        in (ROOT / "evidence" / "README.md").read_text()
    )
    assert size in (ROOT / "reproduction" / "run" / "stats.py").read_text()


@pytest.mark.parametrize(("margin", "alpha"), [(0.05, 0.04), (0.1, 0.03), (0.2, 0.03), (0.25, 0.025)])
def test_documented_smaller_alpha_keeps_the_rate_0_cells_at_most_005(margin, alpha):
    """The table's --alpha per margin holds where today's rule is worst (one side's rate 0), at every n 10-80."""
    rows = (ROOT / "evidence" / "README.md").read_text().splitlines()
    row = next(r for r in rows if r.startswith(f"| {margin:.2f} |"))
    assert f"| {alpha:g} (0.0" in row
    worst = max(stats.exact_power(0.0, margin, n, n, margin=margin, alpha=alpha) for n in range(10, 81))
    assert worst <= 0.05
    assert max(_paired_size_at_zero(n, margin, alpha) for n in (10, 25, 52, 80)) <= 0.05
