"""The equivalence statistics behind `compare` (intervals against published values, error rates by simulation,
the power planner) and the `portable compare` / `portable eval --plan` commands' outputs and exit codes."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from evidence_fixtures import PICK, make_evidence, schema_errors
from evidence_fixtures import control_plane_cli as portable

from reproduction.run import stats


def test_wilson_and_newcombe_match_the_published_examples():
    # Newcombe 1998 (Stat Med 17:873) Table II, method 10: 56/70 - 48/80 -> [0.0524, 0.3339]; 0/10 - 0/20 ->
    # [-0.1611, 0.2775]; 10/10 - 0/20... the 95% Wilson interval of 0/10 is [0, 0.2775] (Wilson 1927).
    lo, hi = stats.newcombe_difference(48, 80, 56, 70, 0.95)
    assert (round(lo, 4), round(hi, 4)) == (0.0524, 0.3339)
    lo, hi = stats.newcombe_difference(0, 20, 0, 10, 0.95)
    assert (round(lo, 4), round(hi, 4)) == (-0.1611, 0.2775)
    assert [round(x, 4) for x in stats.wilson(0, 10)] == [0.0, 0.2775]
    assert [round(x, 4) for x in stats.wilson(10, 10)] == [0.7225, 1.0]
    assert stats.wilson(0, 0) == (0.0, 1.0)


def test_tango_paired_interval():
    # No discordant pair: the score interval solves n d / (1 - d) = z^2 in closed form.
    z = stats.z_value(0.9)
    lo, hi = stats.tango_difference(0, 0, 100, 0.9)
    assert hi == pytest.approx(z * z / (100 + z * z), abs=1e-9) and lo == pytest.approx(-hi, abs=1e-9)
    # Symmetric in the discordant counts, contains the estimate, narrows with more pairs.
    lo1, hi1 = stats.tango_difference(5, 2, 50, 0.95)
    lo2, hi2 = stats.tango_difference(2, 5, 50, 0.95)
    assert (lo1, hi1) == pytest.approx((-hi2, -lo2), abs=1e-9) and lo1 < -3 / 50 < hi1
    assert stats.tango_difference(50, 20, 500, 0.95)[1] - stats.tango_difference(50, 20, 500, 0.95)[0] < hi1 - lo1
    test = stats.equivalence_paired([True] * 60, [True] * 60, margin=0.05, alpha=0.05)
    assert test.verdict == "reproduced" and test.discordant == (0, 0)
    assert stats.equivalence_paired([True] * 40, [True] * 40, margin=0.05, alpha=0.05).verdict == "inconclusive"


def test_simulated_error_rates_stay_at_alpha():
    """False `reproduced` at a true difference of one margin and false `differs` at equality stay <= alpha.

    2,000 pairs a cell: the Monte Carlo standard error at 0.05 is 0.005, so 0.065 is three of them; the old
    3-SE difference rule fails this at once (it calls most pairs at the margin reproduced)."""
    rows = stats.simulate(pairs=2000, seed=1)
    assert len(rows) == 3 * 3 * 4
    for r in rows:
        assert r["reproduced"] + r["differs"] + r["inconclusive"] == pytest.approx(1.0)
        if r["shift"] == 1.0:
            assert r["reproduced"] <= 0.065, r
        if r["shift"] == 0.0:
            assert r["differs"] <= 0.065, r
        if r["shift"] == 2.0:
            assert r["reproduced"] <= 0.01, r
    # Equal rates at n = 500 and p = 0.9: the test decides most pairs (it has the power there).
    cell = next(r for r in rows if (r["rate"], r["n"], r["shift"]) == (0.9, 500, 0.0))
    assert cell["reproduced"] > 0.5
    # The old rule on the same draws at the margin, for contrast.
    rng = np.random.default_rng(1)
    k1, k2 = rng.binomial(50, 0.5, 2000), rng.binomial(50, 0.55, 2000)
    p = (k1 + k2 + 1) / 102
    old = np.abs(k2 - k1) / 50 <= 3 * np.sqrt(p * (1 - p) * (2 / 50))
    assert old.mean() > 0.9


def test_planner_gives_the_power_it_promises():
    n = stats.episodes_needed(0.5, margin=0.1, alpha=0.05, power=0.8)
    z = stats.z_value(0.9) + stats.z_value(0.8)  # z_{1-alpha} + z_{1-beta/2}
    assert n == math.ceil(z * z * 0.5 / 0.01) == 429
    rng = np.random.default_rng(2)
    k1, k2 = rng.binomial(n, 0.5, 4000).astype(float), rng.binomial(n, 0.5, 4000).astype(float)
    nn = np.full(4000, float(n))
    lo, hi = stats.newcombe_difference(k1, nn, k2, nn, 0.9)
    power = np.mean(stats.verdict_of(lo, hi, 0.1) == "reproduced")
    assert 0.76 < power < 0.86, power
    assert stats.episodes_needed(0.88, margin=0.05) == 724
    with pytest.raises(ValueError, match="smaller than the margin"):
        stats.episodes_needed(0.5, margin=0.05, difference=0.05)


def test_compare_command_exit_codes_and_json(tmp_path):
    def write(name: str, **kw) -> str:
        (tmp_path / name).write_text(json.dumps(make_evidence(name=name, **kw)))
        return str(tmp_path / name)

    ref = write("ref.json", recap=(1800, 2000), bc=(1000, 2000))
    same = portable("compare", ref, write("same.json", recap=(1800, 2000), bc=(1000, 2000)))
    assert same.returncode == 0, same.stderr
    assert same.stdout.splitlines()[-1].endswith(": reproduced")
    far = portable("compare", ref, write("far.json", recap=(1500, 2000), bc=(1000, 2000)), "--json")
    assert far.returncode == 60, far.stderr
    doc = json.loads(far.stdout)
    assert doc["verdict"] == "differs" and schema_errors("comparison", doc) == []
    row = doc["rows"][0]
    assert row["reference_counts"] == [1800, 2000] and row["actual_counts"] == [1500, 2000]
    assert row["margin"] == 0.05 and row["method"] == "newcombe-10" and row["interval"][1] < -0.05
    small = portable("compare", write("r40.json"), write("a40.json"))
    assert small.returncode == 61 and "inconclusive" in small.stdout.splitlines()[-1]
    assert "the reference is too small for its margins" in small.stdout  # 40 episodes cannot support 0.05
    assert portable("compare", write("r40b.json"), write("a40b.json"), "--margin", "0.3").returncode == 0
    missing = portable("compare", ref, str(tmp_path / "absent.json"))
    assert (
        missing.returncode == 3
        and missing.stderr.startswith("error: evidence file")
        and "absent.json" in missing.stderr
    )
    (tmp_path / "junk.json").write_text("[1")
    junk = portable("compare", str(tmp_path / "junk.json"), ref)
    assert junk.returncode == 4 and len(junk.stderr.splitlines()) <= 2 and "junk.json" in junk.stderr
    bad = portable("compare", ref, ref, "--margin", "1.5")
    assert bad.returncode == 2 and "--margin 1.5" in bad.stderr


def test_eval_plan_prints_the_episodes_needed(tmp_path):
    ref = tmp_path / "ref.json"
    ref.write_text(json.dumps(make_evidence(name="ref", recap=(88, 100), bc=(52, 100))))
    out = portable("eval", "--plan", "--reference", str(ref))
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if "recap/success_once" in x)
    assert line.split()[1:5] == ["p=0.880", "margin", "±0.05", "749"] and "reference has 100 (too few)" in line
    # Two tasks: the whole verdict needs every per-task row too, so the last line plans episodes per task.
    assert f"recap/{PICK}/success_once" in out.stdout
    assert "the whole verdict (all 12 rate rows reproduced" in out.stdout.splitlines()[-2]
    rows = json.loads(portable("eval", "--plan", "--rate", "0.5", "--margin", "0.1", "--json").stdout)
    assert rows == [
        {
            "metric": "rate 0.5",
            "rate": 0.5,
            "margin": 0.1,
            "alpha": 0.05,
            "power": 0.8,
            "difference": 0.0,
            "episodes_per_side": 440,
            "reference_episodes": None,
            "basis": "exact",
        }
    ]
    assert portable("eval", "--plan").returncode == 2
    assert portable("eval").returncode == 2
    for flags, hint in [
        (["--rate", "1.5"], "--rate 0.8"),
        (["--rate", "-0.1"], "--rate 0.8"),
        (["--rate", "nan"], "--rate 0.8"),
        (["--rate", "0.5", "--difference", "nan"], "--difference 0"),
        (["--rate", "0.5", "--power", "1"], "--power 0.8"),
    ]:
        bad = portable("eval", "--plan", *flags)
        assert bad.returncode == 2 and bad.stderr.splitlines()[-1].endswith(hint), (flags, bad.stderr)


def test_plan_searches_the_exact_power_so_its_promise_holds_near_0_and_1():
    # The normal approximation said 17 at p = 1.0, m = 0.1, where `reproduced` cannot happen (exact power 0),
    # and 68 at p = 0.99, m = 0.05 (exact power 0.375: audit power_plan.out).
    for p, m, d in [(1.0, 0.1, 0.0), (0.0, 0.1, 0.0), (0.99, 0.05, 0.0), (0.02, 0.1, 0.0), (0.95, 0.1, 0.05)]:
        n = stats.episodes_exact([(p, 1)], margin=m, difference=d)
        # planned with the calibrated test (the one compare runs), stepping up from the uncalibrated search's n
        assert stats.exact_power(p, p + d, n, n, margin=m, alpha=0.05, calibrated=True) >= 0.8, (p, m, n)
        assert stats.exact_power(p, p + d, n // 2, n // 2, margin=m, alpha=0.05) < 0.8 or n == 1
    assert stats.exact_power(1.0, 1.0, 17, 17, margin=0.1, alpha=0.05) == 0.0
    # exact_power against a direct sum over every pair of counts (small n, no trimming).
    from math import comb

    n, p, q = 30, 0.8, 0.85
    direct = sum(
        comb(n, i) * p**i * (1 - p) ** (n - i) * comb(n, j) * q**j * (1 - q) ** (n - j)
        for i in range(n + 1)
        for j in range(n + 1)
        if stats.equivalence_independent(i, n, j, n, margin=0.3, alpha=0.05).verdict == "reproduced"
    )
    assert stats.exact_power(p, q, n, n, margin=0.3, alpha=0.05) == pytest.approx(direct, abs=1e-9)
    # Several rows: the union bound makes every row's shortfall add up to at most 1 - power.
    rows = [(0.9, 2), (0.9, 1), (0.9, 1)]
    per = stats.episodes_exact(rows, margin=0.05)
    short = sum(1 - stats.exact_power(p, p, per * t, per * t, margin=0.05, alpha=0.05) for p, t in rows)
    assert short <= 0.2 and per > stats.episodes_exact([(0.9, 1)], margin=0.05)


def test_sequential_rule_keeps_its_error_rates_and_saves_episodes():
    from reproduction.run.sequential import SequentialRule, simulate_sequential

    rule = SequentialRule()
    assert sum(rule.spend()) == pytest.approx(0.05) and rule.spend()[0] < rule.spend()[-1]
    rows = simulate_sequential(rule=rule, rates=(0.5, 0.9), ns=(500, 2000), shifts=(0.0, 1.0, 3.0), pairs=2000, seed=3)
    cell = {(r["rate"], r["n"], r["shift"]): r for r in rows}
    for r in rows:
        if r["shift"] == 1.0:
            assert r["reproduced"] <= 0.065 and r["differs"] <= 0.065, r  # at the margin: neither claim > alpha
        if r["shift"] == 0.0:
            assert r["differs"] <= 0.065, r
        if r["shift"] == 3.0:
            assert r["reproduced"] == 0.0, r
    # >= 30% fewer episodes when the rates are far apart (3 margins) or equal where n_max has the power.
    assert cell[(0.5, 500, 3.0)]["saving"] >= 0.3 and cell[(0.9, 2000, 3.0)]["saving"] >= 0.6
    assert cell[(0.9, 2000, 0.0)]["saving"] >= 0.3 and cell[(0.9, 2000, 0.0)]["reproduced"] > 0.95
    # Near the margin it rarely stops early: the saving there is small, and that is the price of the error rates.
    assert cell[(0.9, 2000, 1.0)]["saving"] < 0.05
    stop = rule.decide(1800, 2000, 450, 500, 0)
    assert stop is None and rule.decide(1800, 2000, 900, 1000, 1) == "reproduced"
    rec = rule.record("reproduced", 1, 1000, 2000)
    assert rec["stopped_at_look"] == 2 and rec["episodes"] == 1000 and rec["looks"] == [500, 1000, 1500, 2000]


def test_sequential_decide_tests_reproduced_at_the_looks_calibrated_level():
    """Look 2 of 4 (a_2 = 0.0055) with 100 reference episodes, 50 at the look, margin 0.2: the plain interval at a_2
    has exact size 0.0076 > a_2, so the union bound over looks would not hold exactly. The rule tests `reproduced`
    at the design's calibrated level (<= a_2 exactly): 15/100 vs 4/50, reproduced at a_2, goes on instead."""
    from reproduction.run.sequential import SequentialRule

    rule = SequentialRule(margin=0.2)
    a = rule.spend()[1]
    assert stats.exact_size(100, 50, 0.2, a) > a
    assert stats.verdict_of(*stats.newcombe_difference(15, 100, 4, 50, 1 - 2 * a), 0.2) == "reproduced"
    assert rule.decide(15, 100, 4, 50, 1) is None
    level = stats.calibrated_alpha(100, 50, 0.2, a)
    assert level < a and rule.level(100, 50, 1) == level
    bound = stats.exact_size(100, 50, 0.2, level, alpha=a)
    assert bound is not None and bound <= a
    # `differs` keeps the interval at a_k, as compare's fixed rows keep it at alpha (at the calibrated level this
    # count would not differ)
    assert stats.verdict_of(*stats.newcombe_difference(0, 100, 18, 50, 1 - 2 * level), 0.2) == "inconclusive"
    assert rule.decide(0, 100, 18, 50, 1) == "differs"
    rec = rule.record("inconclusive", 1, 50, 100, n_ref=100)
    assert rec["reproduced_levels"] == [rule.level(100, 25, 0), level] and rec["looks"] == [25, 50, 75, 100]
    assert "reproduced_levels" not in rule.record("inconclusive", 1, 50, 100)


def test_sequential_simulation_judges_reproduced_at_each_looks_calibrated_level(monkeypatch):
    """At the margin (m 0.25, p 0.05, n_max 50) the plain interval at each a_k let 3.7% of pairs falsely say
    reproduced; at the looks' calibrated levels 2.5% do (each look's exact size <= a_k, their sum alpha)."""
    from reproduction.run.sequential import SequentialRule, simulate_sequential

    grid = {"rates": (0.05,), "ns": (50,), "shifts": (1.0,), "pairs": 20_000, "seed": 1}
    (row,) = simulate_sequential(rule=SequentialRule(margin=0.25), **grid)
    assert row["reproduced"] < 0.03, row
    monkeypatch.setattr(SequentialRule, "level", lambda self, n_ref, n_act, look, spend=None: spend[look])
    (plain,) = simulate_sequential(rule=SequentialRule(margin=0.25), **grid)
    assert plain["reproduced"] > 0.035 and plain["differs"] == row["differs"], plain


def test_sequential_looks_in_whole_batches_spend_alpha_at_their_own_fractions():
    from reproduction.run.sequential import SequentialRule

    rule = SequentialRule(looks=4)
    assert rule.sizes(100, step=25) == [25, 50, 75, 100]
    assert rule.sizes(50, step=25) == [25, 50]  # four looks at 12.5-episode steps would cut batches: two remain
    assert rule.sizes(60, step=25) == [25, 50, 60] and rule.sizes(10, step=25) == [10]
    spend = rule.spend([25 / 60, 50 / 60, 1.0])
    assert sum(spend) == pytest.approx(0.05) and spend[0] == pytest.approx(0.05 * (25 / 60) ** 3)
    assert rule.spend() == pytest.approx(rule.spend([0.25, 0.5, 0.75, 1.0]))
    with pytest.raises(ValueError, match="rise strictly and end at 1"):
        rule.spend([0.5, 0.5, 1.0])


def test_sequential_simulation_covers_the_issue_grid_and_takes_grid_flags(capsys):
    import inspect

    from reproduction.run.sequential import simulate_sequential

    # The default grid holds issue 24's (rates 0.1/0.5/0.9, n 50/100/500, d 0, m/2, m, 2m) plus n 2000 and 3m.
    defaults = {k: v.default for k, v in inspect.signature(simulate_sequential).parameters.items()}
    assert {0.1, 0.5, 0.9} <= set(defaults["rates"]) and {50, 100, 500, 2000} <= set(defaults["ns"])
    assert {0.0, 0.5, 1.0, 2.0, 3.0} <= set(defaults["shifts"])
    assert (
        stats.main(
            ["simulate", "--sequential", "--pairs", "50", "--rates", "0.5", "--n", "50,100", "--shifts", "0,0.5"]
        )
        == 0
    )
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("0.5", "50", "+0.000"),
        ("0.5", "50", "+0.025"),
        ("0.5", "100", "+0.000"),
        ("0.5", "100", "+0.025"),
    ]
    assert stats.main(["simulate", "--pairs", "50", "--rates", "0.9", "--n", "50", "--shifts", "1"]) == 0
    assert capsys.readouterr().out.splitlines()[2].split()[:3] == ["0.9", "50", "+0.050"]


def _drawn(rng: np.random.Generator, n: int, p: float, name: str) -> dict:
    """The audit's 12-row design: two policies x two tasks, n episodes a task, success_once ~ Bin(n, p) and
    success_at_end ~ Bin(success_once, 0.9); counts only, so every row is compared unpaired."""
    from evidence_fixtures import PICK, PUSH, eval_result

    from reproduction.run.evidence import EvalRecord, build_evidence

    def record(label: str) -> EvalRecord:
        once = {t: int(rng.binomial(n, p)) for t in (PICK, PUSH)}
        end = {t: int(rng.binomial(k, 0.9)) for t, k in once.items()}
        return EvalRecord(result=eval_result({t: (k, n) for t, k in once.items()}, end), label=label, mode=label)

    return build_evidence(record("recap"), baselines=[record("bc")], name=name, run_id="r", seeds={}, settings={})


def test_overall_differs_keeps_alpha_over_all_rate_rows():
    # Every row at alpha each, the union said `differs` for 24-28% of equal-rate pairs at n 10-25 a task (the
    # audit's multi.out, 2,000 draws). Holm's step-down over the 12 rate rows keeps it <= alpha.
    from reproduction.run.comparison import compare_evidence

    rng = np.random.default_rng(7)
    for n in (10, 25):
        draws = 300
        verdicts = [
            compare_evidence(_drawn(rng, n, 0.5, "a"), _drawn(rng, n, 0.5, "ref")).verdict for _ in range(draws)
        ]
        rate = verdicts.count("differs") / draws
        assert rate <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / draws), (n, rate)


def test_a_row_that_differs_alone_needs_holm_for_the_overall_verdict():
    from evidence_fixtures import PICK, eval_result

    from reproduction.run.comparison import Comparison, compare_evidence
    from reproduction.run.evidence import EvalRecord, build_evidence

    def one(k: int, seed: int, at_end: int | None = None) -> dict:
        rec = EvalRecord(result=eval_result({PICK: (k, 100)}, {PICK: at_end or k}), label="recap", mode="recap")
        return build_evidence(rec, name=f"k{k}", run_id="r", seeds={"eval": seed}, settings={})

    reference = one(80, 0)
    # 64/100, at end 63/100, against 80/100: each of the 4 rate rows differs at alpha 0.05 alone (p 0.042, 0.030),
    # not at 0.05 / 2: one task, so its rows are the same 2 tests as the overall rows (audit51 G10; 62/100, p 0.021,
    # now survives); success_at_end apart from success_once, or the two are one test (audit59 C3)
    weak = compare_evidence(one(64, 1, at_end=63), reference)
    assert {r.verdict for r in weak.rows} == {"differs"} and weak.verdict == "inconclusive"
    assert all(0.025 < r.p_differs < 0.05 for r in weak.rows)
    doc = weak.to_dict()
    assert doc["differs_rule"] == "holm" and doc["differs_holm"] == {} and doc["rows"][0]["p_differs"] > 0.025
    assert schema_errors("comparison", doc) == [] and Comparison.from_dict(doc).verdict == "inconclusive"
    assert "Holm's step-down over the 2 distinct rate tests (4 rate rows; 2 per-task rows" in weak.render()
    # 58/100 (p 0.0047 < 0.05 / 2): every row survives, and the overall says differs.
    strong = compare_evidence(one(58, 1), reference)
    assert strong.verdict == "differs" and len(strong.to_dict()["differs_holm"]) == 4
    # A comparison written before the rule (no differs_rule) keeps its union verdict when read back.
    old = {k: v for k, v in doc.items() if k not in ("differs_rule", "differs_holm")}
    assert Comparison.from_dict(old).verdict == "differs"
