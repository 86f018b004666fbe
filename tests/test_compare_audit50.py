"""The statistics audit of `portable compare` with simulated truth (audit50 C F1-F5): a sequential record that
picks its own test level, a task the reference does not have pooled into the overall rows, counts too large for
a float, the plan's paired hint, and per-episode outcomes that are no bool. Each test fails on the code before its
fix."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from reproduction.errors import InvalidInputError
from reproduction.run.evidence import EvalRecord, build_evidence

ROOT = Path(__file__).resolve().parent.parent


def portable(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "reproduction/portable.py"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
    )


def _write(path: Path, doc: dict) -> str:
    path.write_text(json.dumps(doc))
    return str(path)


def _result(tasks: dict[str, str], seed0: int = 1000) -> dict:
    """An EvalResult.to_dict() of per-episode outcomes: {task: "0110..."} (success once = success at end)."""
    out: dict = {"tasks": {}, "per_episode": {}}
    for i, (task, text) in enumerate(tasks.items()):
        k = text.count("1")
        out["tasks"][task] = {"episodes": len(text), "success_once": k, "success_at_end": k}
        out["per_episode"][task] = [
            {"episode": j, "reset_seed": seed0 + 10_000 * i + j, "success_once": c == "1", "success_at_end": c == "1"}
            for j, c in enumerate(text)
        ]
    return out


def _evidence(tasks: dict[str, str], name: str = "e", **extra) -> dict:
    record = EvalRecord(result=_result(tasks), label="recap", mode="recap")
    return build_evidence(record, name=name, run_id="r", seeds={"eval": 1}, settings={}, **extra)


# -- F3: counts too large for a float -------------------------------------------------------------------------


def test_a_count_too_large_for_a_float_is_malformed_evidence_naming_the_field(tmp_path):
    """10**300 episodes (valid JSON) was an OverflowError in stats.wilson: exit 1, "internal error"."""
    ref = _evidence({"t": "01" * 50}, name="ref")
    act = _evidence({"t": "01" * 50}, name="act")
    act["metrics"]["success_once"] = {"successes": 10**300, "episodes": 2 * 10**300, "rate": 0.5, "display": "x"}
    del act["tasks"]
    out = portable("compare", _write(tmp_path / "ref.json", ref), bad := _write(tmp_path / "act.json", act))
    assert out.returncode == 4 and out.stdout == "", out.stderr
    assert out.stderr.splitlines()[0] == (
        f"error: {bad} is malformed evidence: metrics.success_once.successes is a number of 301 digits, above "
        "9007199254740992 (2**53), the largest count evidence holds (give the true count); "
        "metrics.success_once.episodes is a number of 301 digits, above 9007199254740992 (2**53), the largest count "
        "evidence holds (give the true count)"
    )
    # 2**53 itself is still a count: a verdict (the task the reference has is missing here, so `differs`)
    act["metrics"]["success_once"] = {"successes": 2**52, "episodes": 2**53, "rate": 0.5, "display": "x"}
    out = portable("compare", str(tmp_path / "ref.json"), _write(tmp_path / "act.json", act))
    assert out.returncode == 60 and out.stderr == "", out.stderr


# -- F5: per-episode outcomes that are no bool -----------------------------------------------------------------


@pytest.mark.parametrize("bad", [0.5, float("nan"), "False", 2, 1.0, np.float64(1.0), None])
def test_build_evidence_refuses_an_outcome_that_is_not_a_bool_or_0_1_naming_task_and_episode(bad):
    """0.5, NaN, "False" and 2 were written as "1" (a success) whenever the task's count agreed."""
    result = _result({"t": "11"})
    result["per_episode"]["t"][0]["success_once"] = bad
    with pytest.raises(InvalidInputError) as err:
        build_evidence(
            EvalRecord(result=result, label="recap", mode="recap"), name="x", run_id="r", seeds={}, settings={}
        )
    assert err.value.exit_code == 4 and err.value.field == "per_episode['t'][0].success_once"
    assert str(err.value).startswith(f"per-episode outcome success_once of task 't', episode 0, is {bad!r}")


@pytest.mark.parametrize("good", [True, 1, np.bool_(True), np.int64(1), np.uint8(1)])
def test_build_evidence_takes_bools_and_0_1_numpy_ones_included(good):
    result = _result({"t": "10"})
    result["per_episode"]["t"][0]["success_once"] = good
    result["per_episode"]["t"][1]["success_once"] = 0
    doc = build_evidence(
        EvalRecord(result=result, label="recap", mode="recap"), name="x", run_id="r", seeds={}, settings={}
    )
    assert doc["tasks"]["t"]["outcomes"]["success_once"] == "10"
