"""A RECAP run's plots and report.html, from what its stages wrote (run.json, sidecars, values, metrics, evidence).

    <run>/plots/value_episodes.png  advantages.png  training_curves.png  success_rates.png
    <run>/report.html

Uses run/'s plotting and report functions (plots.py, report.py, lineage_check.py) and RECAP's plots (plots.py here);
a plot whose inputs a run does not have (no eval stage yet, say) is left out. `write_run_report` is the recipe's
`report` (recipe.py): the runner calls it after the stages of every `portable run` (and so of the demos).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_plots(run_dir: Path) -> dict[str, Path]:
    """Write the plots the run's outputs allow; returns {plot name: path}."""
    import pyarrow.parquet as pq

    from reproduction.recipes.recap import plots as recap_plots
    from reproduction.run import plots

    run_dir = Path(run_dir)
    out_dir = run_dir / "plots"
    out_dir.mkdir(parents=True, exist_ok=True)
    stages = json.loads((run_dir / "run.json").read_text())["stages"]
    written: dict[str, Path] = {}
    adv_files = sorted((run_dir / "advantages").glob("*/advantages*.parquet"))
    rollout = [p for p in adv_files if "rollout" in p.parent.name] or adv_files
    if rollout:
        t = pq.read_table(rollout[0])
        thresholds = stages.get("advantages", {}).get("summary", {}).get("thresholds", {"*": 0.0})
        written["advantages"] = recap_plots.plot_advantage_histogram(
            t.column("advantage_continuous").to_numpy(),
            thresholds,
            out_dir / "advantages.png",
            positive=t.column("advantage").to_numpy(zero_copy_only=False),
        )
        success = _episode_success(t)
        traces = recap_plots.pick_episodes(
            t.column("episode_index").to_pylist(), t.column("value_current").to_pylist(), success
        )
        if traces:
            written["value_episodes"] = recap_plots.plot_value_episodes(traces, out_dir / "value_episodes.png")
    logs = {
        f"{stage}/{p.parent.name}": p
        for stage in ("value", "policy")
        for p in sorted((run_dir / stage).glob("*/metrics.jsonl"))
    }
    from reproduction.run.report import current_evidence

    evidence = current_evidence(run_dir)[0]  # the run's own, by numeric step (not eval_policy_100 < eval_policy_30)
    doc = json.loads(evidence[-1].read_text()) if evidence else None
    # a policy is its mode: policy/<mode>/ trains it, its evidence entries (one per guidance scale) carry the mode
    entries = [doc, *doc.get("baselines", [])] if doc else []
    modes = {e["policy"]["label"]: e["policy"].get("mode") or e["policy"]["label"] for e in entries}
    trained = [key.partition("/")[2] for key in logs if key.startswith("policy/")]
    colours = plots.policy_colours([*trained, *modes.values()])
    if logs:
        curve_colours = {f"policy/{mode}": colours[mode] for mode in trained}
        written["training_curves"] = plots.plot_training_curves(
            logs, out_dir / "training_curves.png", colours=curve_colours
        )
    if doc:
        written["success_rates"] = plots.plot_success_rates(
            doc,
            out_dir / "success_rates.png",
            metric="success_at_end",
            colours={label: colours[mode] for label, mode in modes.items()},
        )
    return written


def _episode_success(table: Any) -> dict[int, bool]:
    """An episode's outcome from the advantages sidecar: its last frame's raw reward sum is 0 on success
    only where the return at the last frame is 0 (the reward rule: 0 on success, failure_reward else)."""
    ep = table.column("episode_index").to_numpy()
    ret = table.column("return").to_numpy()
    out: dict[int, bool] = {}
    for i in range(len(ep)):
        if i + 1 == len(ep) or ep[i + 1] != ep[i]:
            out[int(ep[i])] = bool(ret[i] == 0.0)
    return out


PIPELINE = ("returns", "value", "advantages", "policy", "eval", "compare")
"""The RECAP stages in the order they run (reproduction.recipes.recap.recipe.RECAP)."""


def write_run_report(run_dir: Path, *, bundle: Path | None = None) -> Path:
    """Plots, then <run>/report.html (summary, stages table, plots inline, the lineage chain). Stages run.json
    records as resumed say so in the stages table; while eval/compare are stale (runner.stale_stages) a stale
    banner replaces the verdict and their results are marked as of the earlier policy. The Summary and per-task
    tables hold the run's current evaluation only (report.current_evidence: what run.json's eval record lists);
    other evidence/eval_*.json are listed apart under "Earlier evaluations"."""
    from reproduction.run import report
    from reproduction.run.evidence import Comparison, compare_evidence, load_evidence
    from reproduction.run.runner import stale_stages

    run_dir = Path(run_dir)
    state = json.loads((run_dir / "run.json").read_text())
    written = write_plots(run_dir)
    order = {name: i for i, name in enumerate(PIPELINE)}  # pipeline order, not run.json's (alphabetical) one
    stale = stale_stages(state)
    stages = [
        report.StageSummary(
            name=name,
            status=rec.get("status", ""),
            seconds=rec.get("seconds"),
            note=report.stage_note(rec, stale.get(name)),
        )
        for name, rec in sorted(state["stages"].items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0]))
    ]
    current, others = report.current_evidence(run_dir)  # others: listed apart, never in the Summary (audit55 I1)
    docs = [load_evidence(p) for p in current]
    comparison = None
    compared = run_dir / "evidence" / "comparison.json"  # the compare stage's, against eval.reference
    refs = sorted((Path(bundle) / "evidence").glob("*.json")) if bundle is not None else []
    if compared.is_file():
        comparison = Comparison.from_dict(json.loads(compared.read_text(encoding="utf-8")))
    elif docs and refs:
        try:
            comparison = compare_evidence(docs[-1], load_evidence(refs[0]))
        except Exception:  # a reference of another shape: the report still renders, without it
            comparison = None
    chain = None
    try:
        from reproduction.run.lineage_check import lineage_chain

        chain = lineage_chain(run_dir)
    except Exception:
        chain = None
    captions = getattr(report, "PLOT_CAPTIONS", {})
    return report.write_report(
        run_dir / "report.html",
        title="RECAP run",
        run_id=state.get("run_id", ""),
        run_dir=run_dir,
        evidence=docs,
        comparison=comparison,
        stages=stages,
        plots={captions.get(k, k): v for k, v in written.items()},
        chain=chain,
        stale={name: stale[name] for name in sorted(stale, key=lambda n: (order.get(n, len(order)), n))},
        steps={name: rec.get("step") for name, rec in state["stages"].items() if isinstance(rec, dict)},
        others=others,
    )
