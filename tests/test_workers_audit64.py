"""audit64 kev: a `kill -9` of one worker of a spawn pool (run_units: the eval stage's and `portable eval`'s
evaluation, the data generators) was reported only once another worker returned a result. From Python 3.11 the pool
starts a worker per submit after waking its manager thread, which may already wait again on the workers started
before, without the new one's sentinel; with one unit per worker (the evaluation's groups) the death went unseen
until the other worker had finished its whole share (17 s in a small `portable eval --checkpoint` on a loaded
machine, the whole evaluation in a long one), and the error then named the wrong unit. run_units now wakes the
manager after its last submit. A slow worker start (as on a loaded machine) makes the race certain here."""

from __future__ import annotations

import multiprocessing.context
import time

import pytest

from reproduction.errors import WorkerFailedError
from reproduction.sim.workers import run_units

SLOW = "__import__('time').sleep(20)"
DIE = "__import__('os').kill(__import__('os').getpid(), 9)"


def test_a_killed_worker_is_reported_at_once_when_the_other_works_on(monkeypatch):
    start = multiprocessing.context.SpawnProcess.start

    def slow_start(self):  # the pool registers the worker this much later, as under load
        start(self)
        time.sleep(0.5)

    monkeypatch.setattr(multiprocessing.context.SpawnProcess, "start", slow_start)
    t0 = time.monotonic()
    with pytest.raises(WorkerFailedError) as caught:
        list(run_units(eval, [SLOW, DIE], workers=2, killed_hint="continue"))
    took = time.monotonic() - t0
    err = caught.value
    assert err.exit_code == 51 and str(err).startswith("simulator worker died while running unit 0"), str(err)
    assert err.hint == "continue"
    assert took < 10, f"the death was seen after {took:.1f} s (the other worker's unit takes 20 s)"
