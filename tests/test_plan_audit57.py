"""`portable eval --plan` (audit57 A): the same numbers with less work, one search per distinct row, and a bar."""

from __future__ import annotations

import json

import pytest
from evidence_fixtures import make_evidence

from reproduction.run import stats
from reproduction.run.compare_cmd import plan_rows


@pytest.mark.parametrize(
    ("rate", "margin", "difference", "need"),
    [(0.88, 0.05, 0.0, 749), (0.5, 0.1, 0.0, 440), (0.99, 0.1, 0.03, 103), (0.02, 0.1, 0.03, 117)],
)
def test_episodes_exact_keeps_the_numbers_the_plan_printed(rate, margin, difference, need):
    # the numbers `eval --plan` printed before the search was made cheaper (audit57 A: stdout compared byte for byte)
    assert stats.episodes_exact([(rate, 1)], margin=margin, difference=difference) == need


def test_the_joint_search_calibrates_no_design_it_can_rule_out(monkeypatch):
    # At n = 643 per task the four one-task rows' calibrated shortfall alone passes the budget, so the two-task rows'
    # 1,286-episode design (the costliest calibration of that step) need not be calibrated; the answer is unchanged.
    asked = []
    calibrate = stats.calibrated_alpha

    def recording(n_ref, n_act, margin, alpha, paired=False):
        asked.append(n_ref)
        return calibrate(n_ref, n_act, margin, alpha, paired)

    monkeypatch.setattr(stats, "calibrated_alpha", recording)
    rows = [(0.5, 1, 0.1)] * 4 + [(0.5, 2, 0.1)] * 2
    assert stats.episodes_exact(rows, margin=0.1) == 653
    assert 1286 not in asked and sorted(set(asked)) == [643, 653, 1306]


def test_plan_rows_search_each_distinct_rate_once(tmp_path, monkeypatch):
    # a two-task reference has 12 rate rows of 2 distinct (rate, margin): 2 row searches and the joint one, not 13
    ref = tmp_path / "ref.json"
    ref.write_text(json.dumps(make_evidence(name="ref", recap=(88, 100), bc=(52, 100))))
    searched = []

    def fake(rows, **kw):
        searched.append(list(rows))
        return 700 + 10 * len(searched)

    monkeypatch.setattr(stats, "episodes_exact", fake)
    rows = plan_rows(reference=ref, rates=[0.88], margin=None, alpha=None, power=0.8, difference=0.0)
    assert searched[:2] == [[(0.88, 1)], [(0.52, 1)]] and len(searched) == 3 and len(searched[2]) == 12
    assert [r["episodes_per_side"] for r in rows] == [710] * 7 + [720] * 6 + [None]
    assert rows[-1]["episodes_per_task"] == 730 and rows[-1]["rows"] == 12


def test_the_log_gamma_table_is_shared_and_read_only():
    import math

    lg = stats._lgamma_table(50)
    assert lg.size == 51 and lg[50] == pytest.approx(math.lgamma(51), rel=1e-12)
    assert not lg.flags.writeable  # shared across calls: no caller may change it
    assert stats._lgamma_table(10).tolist() == lg[:11].tolist()
