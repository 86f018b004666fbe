"""bench/grpo_cotrain.py's pieces that can go wrong without running it: the two runs' configs, reading the
evidence, pairing by reset seed, the table and the last line (fast; the bench itself is run by hand)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "grpo_cotrain.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("grpo_cotrain_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_two_configs(bench, tmp_path):
    argv = ["rl.steps=4", "rl.cotrain_weight=0.25", "eval.tasks=[FetchPickAndPlace-v4]"]
    plain_ov, cot_ov = bench.overrides(tmp_path, argv)
    plain = bench.load(tmp_path, tmp_path / "run", plain_ov)
    cot = bench.load(tmp_path, tmp_path / "run_cotrain", cot_ov)
    for cfg in (plain, cot):
        assert cfg.rl.steps == 4 and cfg.rl.tasks == ["FetchPush-v4"]
        assert cfg.eval.tasks == [bench.SIM, bench.REAL]  # both worlds, whatever argv said
        assert [d.path for d in cfg.sft.datasets] == [str(tmp_path / "data" / "sft"), str(tmp_path / "data" / "real")]
    assert plain.rl.cotrain_dataset is None and plain.rl.cotrain_weight == 0 and plain.sft.export is None
    assert cot.rl.cotrain_dataset == str(tmp_path / "data" / "real") and cot.rl.cotrain_weight == 0.25
    assert cot.sft.export == str(tmp_path / "run" / "sft" / "export")  # the same SFT weights for both GRPO runs
    _, default = bench.overrides(tmp_path, [])
    assert bench.load(tmp_path, tmp_path / "c", default).rl.cotrain_weight == bench.WEIGHT
    _, off = bench.overrides(tmp_path, ["rl.cotrain_weight=0"])
    with pytest.raises(SystemExit, match="rl.cotrain_weight=0"):
        bench.load(tmp_path, tmp_path / "c", off)


def _evidence(rows: dict[str, dict[str, list[int]]], seeds: dict[str, list[int]]) -> dict:
    """An evidence document in the eval stage's format: {label: {task: one 0/1 per episode}}."""
    from reproduction.run import evidence

    records = []
    for label, tasks in rows.items():
        result = {
            "tasks": {
                t: {"episodes": len(v), "success_once": sum(v), "success_at_end": sum(v)} for t, v in tasks.items()
            },
            "per_episode": {
                t: [
                    {"episode": i, "reset_seed": s, "success_once": bool(e), "success_at_end": bool(e)}
                    for i, (e, s) in enumerate(zip(v, seeds[t]))
                ]
                for t, v in tasks.items()
            },
        }
        records.append(evidence.EvalRecord(result=result, label=label, mode="bc"))
    return evidence.build_evidence(
        records[0], name="t", run_id="r", seeds={"eval": 1}, settings={}, baselines=records[1:]
    )


def test_outcomes_pairing_table_and_delta(bench):
    sim, real = bench.SIM, bench.REAL
    seeds = {sim: [11, 13, 15, 17], real: [11, 13, 15, 17]}
    plain = bench.outcomes(
        _evidence(
            {"grpo": {sim: [1, 1, 1, 0], real: [0, 0, 0, 0]}, "sft": {sim: [1, 0, 0, 0], real: [1, 1, 0, 0]}}, seeds
        )
    )
    cot = bench.outcomes(
        _evidence(
            {"grpo": {sim: [1, 1, 0, 0], real: [1, 1, 1, 0]}, "sft": {sim: [1, 0, 0, 0], real: [1, 1, 0, 0]}}, seeds
        )
    )
    assert plain["grpo"][sim]["k"] == 3 and plain["grpo"][sim]["seeds"] == seeds[sim]
    results = bench.combine(plain, cot)
    assert bench.paired(results["grpo"][real], results["sft"][real]) == (-0.5, 0, 2)
    assert bench.paired(results["grpo+cotrain"][real], results["sft"][real]) == (0.25, 1, 0)
    lines = bench.table(results)
    assert lines[2].startswith("| sft | 1/4 (") and lines[3].startswith("| grpo | 3/4 (")
    assert "+0.50 (2 / 0)" in lines[3] and "-0.50 (0 / 2)" in lines[3] and lines[4].startswith("| grpo+cotrain |")
    assert bench.delta_line(results).startswith(
        "delta: real +0.25 with co-training, -0.50 without; sim +0.25 with, +0.50 without"
    )


def test_mismatches_are_refused(bench):
    sim, real = bench.SIM, bench.REAL
    a = {"seeds": [1, 3], "ends": [True, False]}
    with pytest.raises(ValueError, match="reset seeds differ"):
        bench.paired(a, {"seeds": [1, 5], "ends": [True, True]})
    seeds = {sim: [1, 3], real: [1, 3]}
    plain = bench.outcomes(_evidence({"grpo": {sim: [1, 0], real: [1, 0]}, "sft": {sim: [1, 0], real: [0, 0]}}, seeds))
    other = bench.outcomes(_evidence({"grpo": {sim: [1, 0], real: [1, 0]}, "sft": {sim: [1, 1], real: [0, 0]}}, seeds))
    with pytest.raises(ValueError, match="sft evaluation differs"):
        bench.combine(plain, other)


def test_a_resumed_stage_is_named_skipped_not_zero_seconds(bench):
    from types import SimpleNamespace

    assert bench._stage(SimpleNamespace(name="rl", action="skipped", seconds=0.0)) == "rl skipped"
    assert bench._stage(SimpleNamespace(name="rl", action="ran", seconds=12.4)) == "rl 12"
