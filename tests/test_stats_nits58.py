"""stats.py's shared log-gamma table under threads, and calibrated_alpha's floor (fix57-A review nits).

- The table was grown in place by appending `_LG[-1] + log(len(_LG))`: two threads growing it at once could append
  a value for the wrong k, and every later exact test would read it. It is now summed in a local list and swapped
  in whole; every table any thread gets must equal log k! exactly as one thread sums it.
- calibrated_alpha's floor MIN_ALPHA (1e-12) is capped at the alpha asked for (a guard: below 1e-12 the reproduced
  region is empty and the level is certified as asked before the floor is reached, so this pins the promise only).
"""

from __future__ import annotations

import math
import sys
import threading

import numpy as np
import pytest

from reproduction.run import stats


def _expected(n: int) -> np.ndarray:
    values = [0.0]
    while len(values) <= n:
        values.append(values[-1] + math.log(len(values)))
    return np.array(values)


def test_the_log_gamma_table_is_right_when_threads_grow_it_at_once(monkeypatch):
    monkeypatch.setattr(stats, "_LG_TABLE", [])
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter allows: the old code tore every time
    got: list[list[np.ndarray]] = [[] for _ in range(8)]
    start = threading.Barrier(8)

    def grow(mine: list[np.ndarray]) -> None:
        start.wait(timeout=30)
        for n in range(1, 3000):  # one new entry per call: the most chances for two threads to grow it at once
            mine.append(stats._lgamma_table(n))

    try:
        threads = [threading.Thread(target=grow, args=(mine,)) for mine in got]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        sys.setswitchinterval(old)
    assert not any(t.is_alive() for t in threads)
    full = _expected(3000)
    for mine in got:
        assert [len(table) for table in mine] == list(range(2, 3001))
        for table in mine:
            assert np.array_equal(table, full[: len(table)])  # the same floats as one thread's sum, not merely close
    final = stats._lgamma_table(2999)
    assert np.array_equal(final, full[:3000])
    assert not final.flags.writeable
    assert abs(final[2999] - math.lgamma(3000)) < 1e-12 * final[2999]


def test_calibrated_alpha_never_returns_a_level_above_the_one_asked_for():
    stats.calibrated_alpha.cache_clear()
    for alpha in (1e-13, 5e-13):
        level = stats.calibrated_alpha(20, 20, 0.2, alpha)
        assert 0 < level <= alpha
    # above the floor nothing changed: a level the design certifies is returned as asked
    assert stats.calibrated_alpha(20, 20, 0.2, 0.05) <= 0.05


@pytest.mark.parametrize("n", [0, 1, 2, 170])
def test_the_table_matches_lgamma(monkeypatch, n):
    monkeypatch.setattr(stats, "_LG_TABLE", [])
    table = stats._lgamma_table(n)
    assert len(table) == n + 1
    assert np.allclose(table, [math.lgamma(k + 1) for k in range(n + 1)], rtol=1e-12, atol=0)
