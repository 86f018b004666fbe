"""The statistics audit's second round (audit46 stats F2-F9): the plan over several margins, evidence whose overall
counts, labels or JSON keys contradict themselves, a test level too small to compute, a run-side row of 0
episodes, and reset seeds that only partly overlap. Each test fails on the code before its fix."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
from evidence_fixtures import control_plane_cli as portable
from evidence_fixtures import eval_result
from evidence_fixtures import write_json as _write

from reproduction.errors import InvalidInputError
from reproduction.run import stats
from reproduction.run.evidence import EvalRecord, build_evidence, load_evidence
from reproduction.run.evidence_check import check_evidence

ROOT = Path(__file__).resolve().parent.parent


# -- F2: `eval --plan --reference` with metrics of different margins ----------------------------------------------


def _plan_reference(tmp_path: Path, p_once: float, p_end: float, margins: dict) -> str:
    """A reference of one task, 100,000 episodes (so its own counts are no constraint), with declared margins."""
    n = 100_000
    record = EvalRecord(
        result=eval_result({"t0": (round(p_once * n), n)}, at_end={"t0": round(p_end * n)}), label="pol", mode="bc"
    )
    doc = build_evidence(record, name="ref", run_id="r", seeds={"eval": 1}, settings={}, margins=margins)
    return _write(tmp_path / "plan_ref.json", doc)


def _every_row_reproduced(n: int, p_once: float, end_given_once: float, m_once: float, m_end: float) -> float:
    """P(both rows reproduced) at n episodes a side, equal true rates, success_at_end inside success_once: 200,000
    seeded draws (standard error about 0.0008)."""
    rng = np.random.default_rng(46)
    once = rng.binomial(n, p_once, (2, 200_000))
    end = rng.binomial(once, end_given_once)
    nn = np.full(200_000, float(n))
    ok = np.ones(200_000, bool)
    for k, m in ((once, m_once), (end, m_end)):
        lo, hi = stats.newcombe_difference(k[0].astype(float), nn, k[1].astype(float), nn, 0.9)
        ok &= (lo > -m) & (hi < m)
    return float(ok.mean())


@pytest.mark.parametrize(
    "p_once, m_once, m_end",
    [(0.5, 0.1, 0.0995), (0.8, 0.08, 0.09)],  # the audit's t3b_plan_groups cases (0.751 and 0.722 before)
)
def test_plan_over_several_margins_keeps_the_promised_power(tmp_path, p_once, m_once, m_end):
    ref = _plan_reference(tmp_path, p_once, 0.9 * p_once, {"success_once": m_once, "success_at_end": m_end})
    out = portable("eval", "--plan", "--reference", ref, "--json")
    assert out.returncode == 0, out.stderr
    last = json.loads(out.stdout)[-1]
    assert last["metric"] == "every rate row" and last["rows"] == 2
    n = last["episodes_per_task"]
    # Bonferroni over both rows' exact powers: one budget of 1 - power for the two margins together ...
    short = sum(
        1 - stats.exact_power(p, p, n, n, margin=m, alpha=0.05, calibrated=True)
        for p, m in ((p_once, m_once), (0.9 * p_once, m_end))
    )
    assert short <= 0.2, (n, short)
    # ... so the whole verdict has the power the plan promises (the audit measured 0.751 / 0.722 at 430 / 428)
    assert _every_row_reproduced(n, p_once, 0.9, m_once, m_end) >= 0.8


def test_plan_with_one_margin_is_unchanged(tmp_path):
    ref = _plan_reference(tmp_path, 0.5, 0.45, {"success_once": 0.1, "success_at_end": 0.1})
    out = portable("eval", "--plan", "--reference", ref, "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    # the audit's figures for this plan before the fix were 537 and [416, 416, 415, 415] (uncalibrated test); the
    # plan now searches the calibrated test compare runs (stats.calibrated_alpha), which needs a few more
    assert rows[-1]["episodes_per_task"] == 545
    assert [r["episodes_per_side"] for r in rows[:-1]] == [440, 440, 433, 433]
    # episodes_exact: rows with their own margin equal to the keyword's give the same n as rows without one
    plain = stats.episodes_exact([(0.9, 2), (0.9, 1)], margin=0.05)
    assert stats.episodes_exact([(0.9, 2, 0.05), (0.9, 1, 0.05)], margin=0.1) == plain


# -- evidence with per-episode outcomes (pairable) ---------------------------------------------------------------


def _paired(name: str, tasks: dict[str, str], label: str = "recap", seed0: int = 0, baselines=()) -> dict:
    """Evidence of one policy whose tasks carry outcomes: {task: success_once bits}; success_at_end = once."""
    return build_evidence(
        _record(label, tasks, seed0),
        baselines=[_record(lab, t, seed0) for lab, t in baselines],
        name=name,
        run_id="r",
        seeds={"eval": 1000},
        settings={},
    )


def _record(label: str, tasks: dict[str, str], seed0: int = 0) -> EvalRecord:
    episodes = {
        task: [
            {"episode": i, "reset_seed": seed0 + 1000 * j + i, "success_once": b == "1", "success_at_end": b == "1"}
            for i, b in enumerate(bits)
        ]
        for j, (task, bits) in enumerate(tasks.items())
    }
    counts = {task: (bits.count("1"), len(bits)) for task, bits in tasks.items()}
    return EvalRecord(result=eval_result(counts) | {"per_episode": episodes}, label=label, mode="recap")


def _bits(rng: np.random.Generator, n: int, p: float) -> str:
    return "".join("1" if x else "0" for x in rng.random(n) < p)


# -- F3: overall counts that are not the sum of the tasks' --------------------------------------------------------


def test_overall_counts_must_be_the_sum_of_the_tasks(tmp_path):
    rng = np.random.default_rng(3)
    tasks = {"pick": _bits(rng, 100, 0.5), "push": _bits(rng, 100, 0.5)}
    ref = _paired("ref", tasks)
    act = copy.deepcopy(ref) | {"name": "act"}
    k = sum(b.count("1") for b in tasks.values())
    for m in ("success_once", "success_at_end"):  # the audit's case: 200/200 claimed, the tasks as the reference's
        act["metrics"][m] = {"successes": 200, "episodes": 200, "rate": 1.0, "display": "100.0% (200/200)"}
    # before: the paired overall rows tested the tasks' outcomes, showed 200/200 and said `reproduced` (exit 0)
    out = portable("compare", _write(tmp_path / "ref.json", ref), _write(tmp_path / "act.json", act))
    path = tmp_path / "act.json"
    assert out.returncode == 4 and out.stdout == ""
    assert out.stderr.splitlines()[0] == f"error: {path} is malformed evidence: " + "; ".join(
        f"metrics.{m} counts 200/200, but its tasks' {m} counts add up to {k}/200: an overall count must be the sum "
        f"over the tasks (set it to {k}/200, or correct the task that is wrong)"
        for m in ("success_once", "success_at_end")
    )
    # a baseline's, and a task that the overall count leaves out
    two = _paired("two", tasks, baselines=[("bc", tasks)])
    two["baselines"][0]["tasks"]["extra"] = copy.deepcopy(two["tasks"]["push"])
    with pytest.raises(InvalidInputError) as err:
        check_evidence(two, where="x.json")
    assert err.value.field == "baselines[0].metrics.success_once"
    assert f"baselines[0].metrics.success_once counts {k}/200, but its tasks' success_once counts add up to " in str(
        err.value
    )
    # the project's own writer always agrees with itself, and so does every evidence file in the repository
    check_evidence(ref, where="ref")
    for path in sorted((ROOT / "evidence").rglob("eval_*.json")):
        load_evidence(path)


# -- F4: two policies of one label, a JSON key twice ---------------------------------------------------------------


def test_a_label_used_twice_is_refused(tmp_path):
    rng = np.random.default_rng(4)
    tasks = {"pick": _bits(rng, 100, 0.5), "push": _bits(rng, 100, 0.5)}
    act = _paired("act", tasks)
    # the reference's baseline, labelled like its primary, failed every episode: it replaced the primary, so an
    # identical run said `differs` (exit 60)
    ref = _paired("ref", tasks, baselines=[("bc", {t: "0" * 100 for t in tasks})])
    ref["baselines"][0]["policy"]["label"] = "recap"
    out = portable("compare", _write(tmp_path / "ref.json", ref), _write(tmp_path / "act.json", act))
    assert out.returncode == 4 and out.stdout == ""
    assert out.stderr.splitlines()[0] == (
        f"error: {tmp_path / 'ref.json'} is malformed evidence: baselines[0].policy.label 'recap' is also the "
        "primary policy's label: each policy needs its own label, since a comparison matches policies by label "
        "(rename one of them)"
    )
    # the run's side too, and two baselines alike
    act["baselines"] = [copy.deepcopy(ref["baselines"][0]) | {"policy": {"label": "bc"}} for _ in range(2)]
    with pytest.raises(InvalidInputError) as err:
        check_evidence(act, where="act")
    assert err.value.field == "baselines[1].policy.label" and "is also baselines[0]'s label" in str(err.value)


def test_a_json_key_twice_is_refused_where_evidence_is_loaded(tmp_path):
    rng = np.random.default_rng(5)
    ref = _paired("ref", {"pick": _bits(rng, 100, 0.5), "push": _bits(rng, 100, 0.5)})
    zero = {"episodes": 100, "success_once": {"successes": 0, "episodes": 100, "rate": 0.0, "display": "0.0% (0/100)"}}
    # a raw file whose tasks name "pick" twice, the first 0/100: json kept the last, and the run was `reproduced`
    text = json.dumps(ref).replace('"tasks": {', '"tasks": {"pick": ' + json.dumps(zero) + ", ", 1)
    (tmp_path / "act.json").write_text(text)
    out = portable("compare", _write(tmp_path / "ref.json", ref), str(tmp_path / "act.json"))
    assert out.returncode == 4 and out.stdout == ""
    assert out.stderr.splitlines() == [
        f"error: {tmp_path / 'act.json'} is malformed evidence: the key 'pick' occurs 2 times in tasks; JSON keeps "
        "only the last, so the others would be silently dropped",
        f"hint: keep one 'pick' in tasks of {tmp_path / 'act.json'} (merge or rename the others)",
    ]
    # anywhere in the document: a baseline's metric, a top-level field
    (tmp_path / "b.json").write_text(
        json.dumps(ref | {"baselines": [{"policy": {"label": "bc"}, "metrics": {"x": {"value": 1}}}]})
        .replace('"metrics": {"x"', '"metrics": {"x": {"value": 2}, "x"')
        .replace('"run_id": "r"', '"run_id": "r", "run_id": "s"')
    )
    with pytest.raises(InvalidInputError) as err:
        load_evidence(tmp_path / "b.json")
    assert err.value.field == "run_id" and "the key 'run_id' occurs 2 times in the top level" in str(err.value)
    doc = json.loads((tmp_path / "b.json").read_text().replace('"run_id": "r", ', ""))
    (tmp_path / "c.json").write_text(json.dumps(doc).replace('"metrics": {"x"', '"metrics": {"x": 0, "x"'))
    with pytest.raises(InvalidInputError) as err:
        load_evidence(tmp_path / "c.json")
    assert err.value.field == "baselines[0].metrics['x']"


# -- F5: a test level too small to compute -------------------------------------------------------------------------


def test_alpha_below_the_smallest_computable_level_is_refused_at_every_entry(tmp_path):
    rng = np.random.default_rng(6)
    tasks = {"pick": _bits(rng, 100, 0.5)}
    ref, act = _write(tmp_path / "ref.json", _paired("ref", tasks)), _write(tmp_path / "act.json", _paired("a", tasks))
    # each was "error: internal error: ValueError: confidence 1.0 must lie strictly between 0 and 1" (exit 1)
    for args in (["compare", ref, act, "--alpha", "1e-20"], ["eval", "--plan", "--rate", "0.5", "--alpha", "1e-20"]):
        out = portable(*args)
        assert out.returncode == 2 and out.stdout == "", (args, out.stderr)
        assert out.stderr.splitlines() == [
            "error: --alpha 1e-20 is below 1e-12, the smallest test level recap-portable computes (1 - 2 alpha would "
            "round to 1)",
            "hint: e.g. --alpha 0.05",
        ]
    assert portable("compare", ref, act, "--alpha", "1e-12").returncode in (0, 61)  # the bound itself is fine
    zero = portable("compare", ref, act, "--alpha", "0")  # outside (0, 0.5): the message it always had
    assert zero.returncode == 2
    assert zero.stderr.splitlines()[0] == "error: --alpha 0 must lie strictly between 0 and 0.5"
    tiny = _write(tmp_path / "tiny.json", _paired("ref", tasks) | {"alpha": 1e-20})
    for args in (["compare", tiny, act], ["eval", "--plan", "--reference", tiny]):
        out = portable(*args)
        assert out.returncode == 4 and out.stdout == "", (args, out.stderr)
        assert out.stderr.splitlines()[0] == (
            f"error: {tiny} is malformed evidence: alpha is 1e-20, below 1e-12: the smallest test level "
            "recap-portable computes (1 - 2 alpha would round to 1); give one of at least that, e.g. 0.05"
        )
    seq = _write(tmp_path / "seq.json", _paired("a", tasks) | {"sequential": {"level": 1e-300}})
    out = portable("compare", ref, seq)
    assert out.returncode == 4 and out.stderr.splitlines()[0] == (
        f"error: {seq} is malformed evidence: sequential.level is 1e-300, below 1e-12: the smallest test level "
        "recap-portable computes (1 - 2 alpha would round to 1); give one of at least that, e.g. 0.05"
    )


def test_a_sequential_rho_whose_looks_test_below_the_smallest_level_is_a_config_error():
    from reproduction.errors import ConfigError
    from reproduction.recipes.recap.config import load_config

    base = ["eval.tasks=[FetchPush-v4]", "eval.sequential.enabled=true", "eval.reference=/r.json"]
    with pytest.raises(ConfigError) as err:  # look 1's share of alpha: 0.5^100 = 7.9e-31
        load_config(None, [*base, "eval.sequential.rho=100"])
    assert err.value.exit_code == 4 and err.value.field == "eval.sequential.rho"
    assert str(err.value).splitlines()[0] == (
        "command line: eval.sequential.rho=100.0 with eval.sequential.looks=4 leaves look 1 of 2 (25 of 50 episodes "
        "per task) a share 7.89e-31 of alpha: its test level would be below 1e-12, the smallest recap-portable "
        "computes, whatever the reference's alpha"
    )
    with pytest.raises(ConfigError, match="leaves look 2 of 2 .* a share 0 of alpha"):  # rho near 0: the last look
        load_config(None, [*base, "eval.sequential.rho=1e-20"])
    assert load_config(None, [*base, "eval.sequential.rho=30"]).eval.sequential.rho == 30  # 0.5^30: still fine
    load_config(None, base[:1] + ["eval.sequential.rho=100"])  # off: rho is not used


def test_the_reference_alpha_with_the_looks_is_checked_before_the_first_episode(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from reproduction.errors import ConfigError
    from reproduction.recipes.recap.policy import evaluate_sequentially

    ran = []
    monkeypatch.setattr("reproduction.sim.evaluate.evaluate_many", lambda *a, **k: ran.append(a) or [])
    ref = _write(tmp_path / "ref.json", _paired("ref", {"pick": "01" * 50}) | {"alpha": 0.001})
    job = SimpleNamespace(config=SimpleNamespace(episodes_per_task=1000, batch_size=25, tasks=("pick",)))
    with pytest.raises(ConfigError) as err:  # 0.001 * 0.25^15 = 9.3e-13 at look 1 (0.5 * 0.25^15 passes the load)
        evaluate_sequentially([job], lambda partial: None, Path(ref), looks=4, rho=15.0)
    assert ran == [] and err.value.exit_code == 4 and err.value.field == "eval.sequential.rho"
    assert str(err.value).splitlines()[0] == (
        "eval.sequential.rho=15.0 with the reference's alpha 0.001 gives look 1 of 4 (250 of 1000 episodes per "
        "task) the test level 9.31e-13, below 1e-12, the smallest recap-portable computes"
    )


# -- F7: a row this run evaluated no episode of --------------------------------------------------------------------


def test_a_row_of_no_episodes_on_the_run_side_is_inconclusive(tmp_path):
    rng = np.random.default_rng(7)
    pick, push = _bits(rng, 100, 0.5), _bits(rng, 100, 0.5)
    ref = _write(tmp_path / "ref.json", _paired("ref", {"pick": pick, "push": push}))
    act = _write(tmp_path / "act.json", _paired("act", {"pick": "", "push": push}))  # pick: 0 episodes
    out = portable("compare", ref, act, "--margin", "0.3")
    assert out.returncode == 61, out.stderr  # was `differs` (exit 60): nothing measured is no difference
    lines = out.stdout.splitlines()
    row = next(x for x in lines if x.startswith("recap/pick/success_once"))
    assert row.split()[-1] == "inconclusive" and "0.0% (0/0)" in row
    assert (
        "note: this run evaluated 0 episodes for recap/pick/success_once, recap/pick/success_at_end: nothing was "
        "measured there, so those rows are inconclusive"
    ) in lines
    assert lines[-1].endswith(": inconclusive (0 differ, 2 inconclusive of 6 metrics)")
    doc = json.loads(portable("compare", ref, act, "--margin", "0.3", "--json").stdout)
    rows = {r["metric"]: r for r in doc["rows"]}
    assert rows["recap/pick/success_once"]["verdict"] == "inconclusive"
    assert rows["recap/pick/success_once"]["note"] == (
        "this run evaluated 0 episodes for this row: nothing was measured, so nothing is decided"
    )
    assert rows["recap/pick/success_once"]["interval"] is None and doc["verdict"] == "inconclusive"
    # a metric the run lacks still differs
    missing = _paired("act", {"pick": pick, "push": push})
    del missing["metrics"]["success_at_end"]
    assert portable("compare", ref, _write(tmp_path / "m.json", missing)).returncode == 60


# -- F8: reset seeds that only partly overlap -----------------------------------------------------------------------


def test_partly_overlapping_reset_seeds_say_why_the_rows_are_unpaired(tmp_path):
    rng = np.random.default_rng(8)
    tasks = {"pick": _bits(rng, 100, 0.5), "push": _bits(rng, 100, 0.5)}
    ref = _paired("ref", tasks)
    act = copy.deepcopy(ref) | {"name": "act"}
    act["tasks"]["pick"]["outcomes"]["reset_seeds"][0] = 99_999_999  # one seed of 200 differs
    refp, actp = _write(tmp_path / "ref.json", ref), _write(tmp_path / "act.json", act)
    note = (
        "unpaired: recap's reset seeds differ between the files in pick (1 of the reference's 100 not among this "
        "run's 100), so the rows of that task and recap's overall rows are compared unpaired (pairing needs one side's "
        "initial states to include the other's)"
    )
    out = portable("compare", refp, actp)
    assert out.returncode == 61 and f"note: {note}" in out.stdout.splitlines()
    doc = json.loads(portable("compare", refp, actp, "--json").stdout)
    assert note in doc["notes"]
    rows = {r["metric"]: r["method"] for r in doc["rows"]}  # the verdicts are what they were: only pick is unpaired
    assert rows["recap/pick/success_once"] == rows["recap/success_once"] == "newcombe-10"
    assert rows["recap/push/success_once"] == "tango-paired"
    # seeds 50..149 against 0..99 in both tasks
    half = _write(tmp_path / "half.json", _paired("act", tasks, seed0=50))
    lines = portable("compare", refp, half).stdout.splitlines()
    assert (
        "note: unpaired: recap's reset seeds differ between the files in pick (50 of the reference's 100 not among "
        "this run's 100), push (50 of the reference's 100 not among this run's 100), so the rows of those tasks and "
        "recap's overall rows are compared unpaired (pairing needs one side's initial states to include the other's)"
    ) in lines
    # the same seeds: no such note; another eval seed: the note that says so already, not this one
    assert not any("unpaired:" in x for x in portable("compare", refp, refp).stdout.splitlines())
    other = _write(tmp_path / "other.json", _paired("act", tasks, seed0=50) | {"seeds": {"eval": 7}})
    lines = portable("compare", refp, other).stdout.splitlines()
    assert any(x.startswith("note: the evaluation seeds differ") for x in lines)
    assert not any("unpaired:" in x for x in lines)


# -- audit54 B2: a run that evaluated the reference's initial states and more (or a part of them) --------------------


def _seeded(name: str, tasks: dict[str, list[tuple[int, str]]], settings: dict | None = None) -> dict:
    """Evidence of policy recap from {task: [(reset seed, "1"/"0"), ...]}; success_at_end = success_once."""
    episodes = {
        task: [
            {"episode": i, "reset_seed": s, "success_once": b == "1", "success_at_end": b == "1"}
            for i, (s, b) in enumerate(eps)
        ]
        for task, eps in tasks.items()
    }
    counts = {task: (sum(b == "1" for _, b in eps), len(eps)) for task, eps in tasks.items()}
    record = EvalRecord(result=eval_result(counts) | {"per_episode": episodes}, label="recap", mode="recap")
    return build_evidence(record, name=name, run_id="r", seeds={"eval": 1000}, settings=settings or {})


def test_nested_reset_seeds_pair_on_the_shared_states(tmp_path):
    rng = np.random.default_rng(54)
    shared = {
        t: list(zip(range(1000 * j, 1000 * j + 100), _bits(rng, 100, 0.7))) for j, t in enumerate(("pick", "push"))
    }
    # the same eval seed with 200 episodes per task: the reference's 100 states and 100 more, the shared ones
    # solved alike and the others far less often, so only the shared states can make the rows reproduced
    extra = {
        t: list(zip(range(10**6 + 1000 * j, 10**6 + 1000 * j + 100), _bits(rng, 100, 0.2)))
        for j, t in enumerate(shared)
    }
    refp = _write(tmp_path / "ref.json", _seeded("ref", shared))
    morep = _write(tmp_path / "more.json", _seeded("more", {t: shared[t] + extra[t] for t in shared}))
    out = portable("compare", refp, morep, "--json")
    doc = json.loads(out.stdout)
    rows = {r["metric"]: r for r in doc["rows"]}
    for name in ("recap/pick/success_once", "recap/push/success_at_end", "recap/success_once"):
        assert rows[name]["method"] == "tango-paired", name
        assert rows[name]["verdict"] == "reproduced", name
    pick = rows["recap/pick/success_once"]
    rest = sum(b == "1" for _, b in extra["pick"])
    assert pick["note"] == (
        "paired by reset seed: 100 episodes, 0 succeeded only in the reference, 0 only here; both rates are on the "
        f"initial states both sides evaluated: this run's 100 other episodes ({rest:.1f}% success) are not in the test"
    )
    # the row's rates, counts and difference are the tested ones (the shared states), inside their own interval
    k = sum(b == "1" for _, b in shared["pick"])
    assert pick["reference_counts"] == pick["actual_counts"] == [k, 100] and pick["difference"] == 0.0
    assert pick["interval"][0] <= pick["difference"] <= pick["interval"][1]
    assert rows["recap/success_once"]["note"].startswith("paired by reset seed: 200 episodes")
    assert not any(n.startswith("unpaired:") for n in doc["notes"])
    assert (
        "paired on the shared initial states: this run evaluated more initial states of recap than the other side "
        "in pick, push; those rows show and test both sides on the states both evaluated (each row's note, in "
        "comparison.json and --json, gives the rest's success rate, which is not in the test)"
    ) in doc["notes"]
    assert out.returncode == 0 and doc["verdict"] == "reproduced"
    # the other way round: the run evaluated a part of the reference's states
    back = json.loads(portable("compare", morep, refp, "--json").stdout)
    row = {r["metric"]: r for r in back["rows"]}["recap/pick/success_once"]
    assert row["method"] == "tango-paired" and row["note"].endswith(
        f"the reference's 100 other episodes ({rest:.1f}% success) are not in the test"
    )
    # nested in opposite directions: the tasks pair, the overall rows cannot, and a note says so
    mixed = _write(
        tmp_path / "mixed.json", _seeded("mixed", {"pick": shared["pick"] + extra["pick"], "push": shared["push"][:50]})
    )
    doc = json.loads(portable("compare", refp, mixed, "--json").stdout)
    rows = {r["metric"]: r for r in doc["rows"]}
    assert rows["recap/push/success_once"]["method"] == rows["recap/pick/success_once"]["method"] == "tango-paired"
    assert rows["recap/success_once"]["method"] == "newcombe-10"
    assert (
        "unpaired: this run evaluated more initial states than the reference in pick and fewer in push, so recap's "
        "overall rows are compared unpaired (its tasks' rows are paired on the states both sides evaluated)"
    ) in doc["notes"]


def test_an_overall_row_paired_on_the_shared_states_is_counted_whatever_the_task_counts():
    """audit55 review2 P1: more states in pick only made the overall counts out of proportion (200 + 100 against
    100 + 100), so the overall row was shown `not counted (uneven task mix)` although its pairs, on the shared
    states, have one task mix on both sides."""
    from reproduction.run.comparison import compare_evidence

    rng = np.random.default_rng(54)
    shared = {
        t: list(zip(range(1000 * j, 1000 * j + 100), _bits(rng, 100, 0.7 if t == "pick" else 0.2)))
        for j, t in enumerate(("pick", "push"))
    }
    extra = list(zip(range(10**6, 10**6 + 100), _bits(rng, 100, 0.2)))
    ref = _seeded("ref", shared)
    act = _seeded("act", {"pick": shared["pick"] + extra, "push": shared["push"]})
    row = {r.metric: r for r in compare_evidence(act, ref).rows}["recap/success_once"]
    assert (row.method, row.counted, row.verdict) == ("tango-paired", True, "reproduced")
    assert row.reference_counts == row.actual_counts == (sum(b == "1" for t in shared for _, b in shared[t]), 200)


def test_one_task_spelt_two_ways_in_settings_is_no_setting_difference(tmp_path):
    """audit55 E5: a LIBERO task named by its instruction in one config and by its id in the other; the evidence
    keys both by id, so the sides evaluated the same tasks and no "setting 'tasks' differs" note is due."""
    rng = np.random.default_rng(5)
    shared = {"libero_spatial/0": list(zip(range(50), _bits(rng, 50, 0.5)))}
    ref = _write(tmp_path / "ref.json", _seeded("ref", shared, {"tasks": ["libero_spatial/0"]}))
    spelt = {
        "tasks": ["libero_spatial/pick up the black bowl between the plate and the ramekin and place it on the plate"]
    }
    act = _write(tmp_path / "act.json", _seeded("act", shared, spelt))
    doc = json.loads(portable("compare", ref, act, "--json").stdout)
    assert not any(n.startswith("setting 'tasks'") for n in doc["notes"])
    # another task set is still said (here as a task this run evaluated beyond the reference's, and the setting)
    more = {**shared, "libero_spatial/1": list(zip(range(50), _bits(rng, 50, 0.5)))}
    other = _write(tmp_path / "other.json", _seeded("other", more, {"tasks": ["libero_spatial/0", "libero_spatial/1"]}))
    doc = json.loads(portable("compare", ref, other, "--json").stdout)
    assert any(n.startswith("setting 'tasks' differs") for n in doc["notes"])


# -- F9: success at the end above success at any step ---------------------------------------------------------------


def test_success_at_end_above_success_once_on_the_same_episodes_is_refused(tmp_path):
    rng = np.random.default_rng(9)
    tasks = {"pick": _bits(rng, 100, 0.5), "push": _bits(rng, 100, 0.5)}
    ref = _paired("ref", tasks)
    act = copy.deepcopy(ref) | {"name": "act"}
    once = act["tasks"]["pick"]["success_once"]["successes"]
    full = {"successes": 100, "episodes": 100, "rate": 1.0, "display": "100.0% (100/100)"}
    act["tasks"]["pick"]["success_at_end"] = full  # the audit's case: 100/100 at the end, fewer at any step
    act["tasks"]["pick"]["outcomes"]["success_at_end"] = "1" * 100
    k = 100 + act["tasks"]["push"]["success_at_end"]["successes"]
    act["metrics"]["success_at_end"] = {"successes": k, "episodes": 200, "rate": k / 200, "display": "x"}
    out = portable("compare", _write(tmp_path / "ref.json", ref), _write(tmp_path / "act.json", act))
    assert out.returncode == 4 and out.stdout == ""  # it was accepted and given a verdict
    first = out.stderr.splitlines()[0]
    assert first.startswith(f"error: {tmp_path / 'act.json'} is malformed evidence: ")
    assert first.split("malformed evidence: ", 1)[1].split("; ") == [
        f"metrics.success_at_end counts {k} successes, more than metrics.success_once's "
        f"{act['metrics']['success_once']['successes']} on the same 200 episodes: an episode that succeeds at its "
        "end has succeeded at some step (correct the count that is wrong)",
        f"tasks['pick'].success_at_end counts 100 successes, more than tasks['pick'].success_once's {once} on the "
        "same 100 episodes: an episode that succeeds at its end has succeeded at some step (correct the count that "
        "is wrong)",
    ]
    # counts of different episodes (overall counts of a file without tasks) are not compared
    doc = copy.deepcopy(ref)
    del doc["tasks"]
    doc["metrics"]["success_at_end"] = {"successes": 150, "episodes": 300, "rate": 0.5, "display": "50.0% (150/300)"}
    doc["metrics"]["success_once"] = {"successes": 100, "episodes": 200, "rate": 0.5, "display": "50.0% (100/200)"}
    check_evidence(doc, where="doc")
