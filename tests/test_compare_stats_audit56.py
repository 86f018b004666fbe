"""Audit 56 C: `stats simulate` measures compare's own row decision (C1), pairing a million episodes is linear work
(C2), and the "reference is too small" note names the real reason a row is unpaired (C3)."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from reproduction.run import comparison, stats
from reproduction.run.comparison import NOT_NESTED, _paired, _Side, compare_evidence, rate_row
from reproduction.run.evidence import EvalRecord, build_evidence


def _evidence(seeds: list[int], outcomes: list[int], name: str) -> dict:
    k = int(sum(outcomes))
    result = {
        "tasks": {"t": {"episodes": len(outcomes), "success_once": k, "success_at_end": k}},
        "per_episode": {
            "t": [
                {"episode": j, "reset_seed": int(s), "success_once": bool(c), "success_at_end": bool(c)}
                for j, (s, c) in enumerate(zip(seeds, outcomes))
            ]
        },
    }
    record = EvalRecord(result=result, label="recap", mode="recap")
    return build_evidence(record, name=name, run_id="r", seeds={"eval": 1}, settings={})


def _direct(counts: np.ndarray, n: int, *, paired: bool, margin: float, alpha: float) -> dict[str, float]:
    """compare's decision function called once per draw, with no shortcut."""
    verdicts = []
    for c in counts:
        if paired:
            ref, act = stats.outcomes_of(c)
        else:
            k_ref, k_act = int(c[0] + c[1]), int(c[0] + c[2])
            ref, act = [True] * k_ref + [False] * (n - k_ref), [True] * k_act + [False] * (n - k_act)
        verdicts.append(rate_row(ref, act, paired=paired, margin=margin, alpha=alpha).verdict)
    return {v: verdicts.count(v) / len(verdicts) for v in stats.VERDICTS}


@pytest.mark.parametrize("paired,rho", [(False, 0.0), (True, 0.5)])
def test_simulate_is_compares_decision_at_the_audited_cell(paired, rho):
    # 0.8 vs 1.0, 11 a side, margin 0.2: the old simulate (uncalibrated Newcombe) said reproduced 0.089 > alpha,
    # compare 0 (audit56 C1).
    (row,) = stats.simulate(
        rates=(0.8,), ns=(11,), shifts=(1.0,), margin=0.2, alpha=0.05, pairs=2000, seed=1, paired=paired, rho=rho
    )
    assert row["true_difference"] == 0.2 and row["reproduced"] <= 0.05
    assert (row["reproduced"], row["differs"]) == (0.0, 0.011)
    counts = stats.draw_outcomes(np.random.default_rng(1), 11, 0.8, 1.0, rho, 2000)
    direct = _direct(counts, 11, paired=paired, margin=0.2, alpha=0.05)
    assert {v: row[v] for v in stats.VERDICTS} == direct
    assert direct["reproduced"] == 0.0


def test_simulate_cli_prints_compares_rate(capsys):
    assert stats.main(["simulate", "--rates", "0.8", "--n", "11", "--shifts", "1", "--margin", "0.2", "--pairs",
                       "2000", "--seed", "1"]) == 0  # fmt: skip
    line = capsys.readouterr().out.splitlines()[-1].split()
    assert line[:4] == ["0.8", "11", "+0.200", "0.0000"]
    with pytest.raises(SystemExit) as e:
        stats.main(["simulate", "--sequential", "--paired"])
    assert e.value.code == 2


def _old_paired(ref: _Side, act: _Side):
    """The pairing before audit56 C2 (sorted keys), kept to check the new one against."""
    if ref.outcomes is None or act.outcomes is None:
        return None
    theirs, ours = set(ref.outcomes), set(act.outcomes)
    shared = theirs & ours
    if not shared or shared not in (theirs, ours):
        return None
    keys = sorted(shared)
    ref_rest = [ref.outcomes[k] for k in sorted(theirs - shared)]
    act_rest = [act.outcomes[k] for k in sorted(ours - shared)]
    return [ref.outcomes[k] for k in keys], [act.outcomes[k] for k in keys], ref_rest, act_rest


def _canonical(p):
    if p is None:
        return None
    r, a, rr, ar = p
    return sorted(zip(r, a)), sorted(rr), sorted(ar)


def test_pairing_gives_the_old_rows_on_random_evidence():
    rng = np.random.default_rng(56)
    for _ in range(400):
        first = [int(s) for s in rng.choice(40, size=int(rng.integers(0, 30)), replace=False)]
        second = [int(s) for s in rng.choice(40, size=int(rng.integers(0, 30)), replace=False)]
        if rng.random() < 0.5 and first:  # nested in, or equal to, the other side's states
            second = first[: int(rng.integers(1, len(first) + 1))]
        sides = [{("t", "reset_seeds", s): bool(rng.random() < 0.5) for s in states} for states in (first, second)]
        if rng.random() < 0.5:
            sides.reverse()
        ref, act = (_Side(metric=None, outcomes=o or None) for o in sides)
        got = _paired(ref, act)
        if got == NOT_NESTED:  # a strict subset that is not the other's first states: unpaired (audit60 C2)
            short, long = sorted((list(sides[0]), list(sides[1])), key=len)
            assert set(short) < set(long) and set(short) != set(long[: len(short)])
            continue
        assert _canonical(got) == _canonical(_old_paired(ref, act))


@pytest.mark.slow
def test_comparing_1e5_paired_episodes_is_linear_work():
    # 1e6 episodes a side took 2 min 56 s (audit56 C2: 1e6 tuple keys sorted per row); bound compare's own work by
    # a multiple of reading the files (JSON), which is linear: the old pairing took ~48x, the new ~18x.
    n = 100_000
    u = np.random.default_rng(0).random(n)
    ref = _evidence(list(range(n)), list((u < 0.5).astype(int)), "ref")
    act = _evidence(list(range(n)), list((u < 0.5).astype(int)), "act")
    base = min(_cpu(lambda: [json.loads(json.dumps(d)) for d in (ref, act)]) for _ in range(3))
    took = _cpu(lambda: compare_evidence(act, ref))
    assert took < 32 * base, (took, base)
    assert compare_evidence(act, ref).verdict == "reproduced"


def _cpu(f) -> float:
    t = time.process_time()
    f()
    return time.process_time() - t


def test_too_small_note_names_the_real_reason():
    ref = _evidence(list(range(100)), [1] * 50 + [0] * 50, "ref")
    dup = _evidence([i % 50 for i in range(100)], [1] * 100, "dup")
    partial = _evidence(list(range(50, 150)), [1] * 50 + [0] * 50, "partial")
    disjoint = _evidence(list(range(1000, 1100)), [1] * 50 + [0] * 50, "far")

    def note(act):
        (found,) = [n for n in compare_evidence(act, ref).notes if n.startswith("the reference is too small")]
        return found.split("(`portable eval --plan`); ")[1]

    assert note(dup) == (
        "an initial state repeats within a task here, so no pairing: evaluating each state once lets a paired "
        "test decide with fewer"
    )
    nested = (
        "the two files were compared unpaired (see the unpaired note): a run that evaluates all the "
        "reference's initial states (and more, if it likes) lets a paired test decide with fewer"
    )
    assert note(partial) == note(disjoint) == nested
    assert comparison.REPEATS_NOTE in compare_evidence(dup, ref).rows[0].note


def test_newcombe_over_counts_gives_the_floats_of_newcombe_per_cell():
    """The planner's and calibration's grids take Wilson's limits once per count (stats.newcombe_counts): the very
    floats newcombe_difference computes cell by cell, so every plan and calibrated level is unchanged."""
    from reproduction.run.stats import newcombe_counts, newcombe_difference

    rng = np.random.default_rng(56)
    for n1, n2 in [(1, 1), (5, 7), (100, 100), (2644, 2644), (50, 3000)]:
        for conf in (0.5, 0.9, 0.95, 0.9999):
            k1 = rng.integers(0, n1 + 1, size=(40, 30)).astype(float)
            k2 = rng.integers(0, n2 + 1, size=(40, 30)).astype(float)
            want = newcombe_difference(k1, np.full(k1.shape, float(n1)), k2, np.full(k2.shape, float(n2)), conf)
            got = newcombe_counts(k1, n1, k2, n2, conf)
            assert np.array_equal(want[0], got[0]) and np.array_equal(want[1], got[1]), (n1, n2, conf)
