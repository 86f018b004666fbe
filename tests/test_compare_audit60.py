"""audit60 C1/C2: a paired row's `differs` holds its level near rates 0 and 1; a subset is paired only as a prefix."""

from __future__ import annotations

import math

import pytest

from reproduction.run.comparison import NOT_NESTED, compare_evidence, rate_row
from reproduction.run.evidence import EvalRecord, build_evidence

np = pytest.importorskip("numpy")


def _size(n: int, margin: float, pvalue: dict[tuple[int, int], float], level: float) -> float:
    """max over the discordance t (grid) of P(p <= level | q10 = t, q01 = t + margin), enumerating (b, c)."""
    cells = [(b, c) for (b, c), p in pvalue.items() if p <= level]
    lg = [math.lgamma(i + 1) for i in range(n + 1)]
    worst = 0.0
    for t in np.concatenate([np.linspace(0, 0.05, 101), np.linspace(0.05, (1 - margin) / 2, 60)]):
        probs = (t, t + margin, 1 - 2 * t - margin)
        total = 0.0
        for b, c in cells:
            r = n - b - c
            if (probs[0] == 0 and b) or (probs[2] <= 0 and r):
                continue
            total += math.exp(
                lg[n]
                - lg[b]
                - lg[c]
                - lg[r]
                + (b * math.log(probs[0]) if b else 0.0)
                + c * math.log(probs[1])
                + (r * math.log(probs[2]) if r else 0.0)
            )
        worst = max(worst, total)
    return worst


def test_paired_row_p_differs_holds_its_level_exactly():
    """Every outcome of 60 pairs through compare's own row: the size of `p_differs <= level` at d = +margin is at most
    the level at alpha and Holm's alpha / 2 and alpha / 8 (Tango's approximate p gave 0.037 at 0.025 here, audit60
    C1), and a row differs exactly when it carries a p, so its own verdict keeps alpha too."""
    n, margin = 60, 0.1
    pvalue = {}
    for b in range(n + 1):
        for c in range(b + int(margin * n), n + 1 - b):
            ref = [True] * b + [False] * c + [True] * (n - b - c)
            act = [False] * b + [True] * c + [True] * (n - b - c)
            row = rate_row(ref, act, paired=True, margin=margin, alpha=0.05)
            assert (row.verdict == "differs") == (row.p_differs is not None), (b, c, row)
            if row.p_differs is not None:
                pvalue[(b, c)] = row.p_differs
    for level in (0.05, 0.025, 0.00625):
        assert _size(n, margin, pvalue, level) <= level


@pytest.mark.parametrize(
    "b, c, verdict, p",
    [
        (0, 8, "inconclusive", 0.0526),
        (0, 9, "differs", 0.0255),
        (1, 11, "inconclusive", 0.0544),
        (1, 12, "differs", 0.0272),
    ],
)
def test_a_paired_rows_own_verdict_follows_its_exact_p(b, c, verdict, p):
    """200 pairs, margin 0.02: the 90% interval lies above the margin in all four, but at (0, 8) and (1, 11) the
    exact p is above alpha, so the row is `inconclusive` and says why (its own `differs` had size 0.063 at 0.05)."""
    n = 200
    ref = [True] * b + [False] * c + [True] * (n - b - c)
    act = [False] * b + [True] * c + [True] * (n - b - c)
    row = rate_row(ref, act, paired=True, margin=0.02, alpha=0.05)
    assert row.method == "tango-paired" and row.low > 0.02
    assert row.verdict == verdict
    if verdict == "differs":
        assert row.p_differs == pytest.approx(p, abs=5e-5)  # within 0.5% above the supremum (p_tight: 0.025419)
    else:
        assert row.p_differs is None
        assert f"the exact p of a difference is {p:.3g} > alpha 0.05: inconclusive" in row.note


def _evidence(outcomes: list[int], seeds: list[int], name: str) -> dict:
    n = len(outcomes)
    result = {
        "tasks": {"t": {"episodes": n, "success_once": sum(outcomes), "success_at_end": sum(outcomes)}},
        "per_episode": {
            "t": [
                {"episode": j, "reset_seed": s, "success_once": bool(o), "success_at_end": bool(o)}
                for j, (s, o) in enumerate(zip(seeds, outcomes))
            ]
        },
    }
    record = EvalRecord(result=result, label="recap", mode="recap")
    return build_evidence(record, name=name, run_id="r", seeds={"eval": 1}, settings={})


def test_a_run_of_only_the_references_successes_is_not_paired():
    """The reference fails on seeds 5, 15, ..., 95; a run of its 90 other seeds, all successes, was `reproduced`
    100% (90/90) vs 100% (90/90) paired on them (audit60 C2). Not a prefix: compared unpaired on all episodes."""
    ref_out = [0 if s % 10 == 5 else 1 for s in range(100)]
    ref = _evidence(ref_out, list(range(100)), "ref")
    seeds = [s for s in range(100) if s % 10 != 5]
    cmp = compare_evidence(_evidence([1] * 90, seeds, "act"), ref, margin=0.05, alpha=0.05)
    assert cmp.verdict != "reproduced"
    row = next(r for r in cmp.rows if r.metric == "recap/t/success_once")
    assert row.method == "newcombe-10"
    assert row.reference_counts == (90, 100)
    assert row.reference_display == "90.0% (90/100)"
    assert row.actual_counts == (90, 90)
    assert row.verdict == "differs"
    assert NOT_NESTED in row.note
    assert any(n.startswith("unpaired: in t one side evaluated only some of recap's") for n in cmp.notes)


def test_a_nested_run_of_the_first_states_stays_paired():
    """A run of the reference's first 90 seeds (a nested run) is still paired on them (audit54 B2)."""
    ref_out = [1] * 90 + [0] * 10
    ref = _evidence(ref_out, list(range(100)), "ref")
    cmp = compare_evidence(_evidence([1] * 90, list(range(90)), "act"), ref, margin=0.05, alpha=0.05)
    row = next(r for r in cmp.rows if r.metric == "recap/t/success_once")
    assert row.method == "tango-paired"
    assert row.reference_counts == (90, 90)
    assert NOT_NESTED not in row.note
    assert not any(n.startswith("unpaired:") for n in cmp.notes)


@pytest.mark.parametrize("alpha", [1e-5, 1e-6, 5e-7, 1e-9])
def test_a_paired_row_far_past_the_margin_differs_at_tiny_levels(alpha):
    """500 pairs, 0 vs 100 discordant (+0.20 against a margin of 0.02): the exact bound is certified down to 1e-6
    only, and the row was `inconclusive` at alpha 5e-7 ("the exact p ... is 1e-06"), at 1e-9 too (review61 1).
    Below the floor the row takes Tango's p, whose size is then still below 2e-6."""
    n, b, c = 500, 0, 100
    ref = [True] * b + [False] * c + [True] * (n - b - c)
    act = [False] * b + [True] * c + [True] * (n - b - c)
    row = rate_row(ref, act, paired=True, margin=0.02, alpha=alpha)
    assert row.verdict == "differs"
    assert row.p_differs <= alpha


def test_the_exact_p_of_a_cell_not_past_the_margin_is_one():
    """A cell whose Tango statistic at the margin is <= 0 is no evidence of `differs`: the region would leave out
    cells as extreme, so the p is 1.0, not a smaller number (review61 7)."""
    from reproduction.run.stats import paired_differs_p

    assert paired_differs_p(10, 10, 100, 0.05) == 1.0
    assert paired_differs_p(10, 12, 100, 0.05) == 1.0  # +0.02 < margin 0.05
    assert 0.05 < paired_differs_p(240, 260, 500, 0.001) < 1.0  # past the margin, not far enough
