"""A GRPO run's plots and report.html, from what its stages wrote (run.json, metrics.jsonl, evidence).

    <run>/plots/training_curves.png   sft loss; rl loss, KL, rollout success, live evaluation
    <run>/plots/success_rates.png     the eval stage's newest evidence: grpo and its sft baseline
    <run>/report.html

Only run/'s generic pieces (plots.py, report.py): GRPO has no plot of its own. It is the recipe's `report` (recipe.py):
the runner writes it after the stages of every `portable run` (and so of the demo); `python -m
reproduction.recipes.grpo.report RUN` rewrites it by hand.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

CURVES = ("loss", "kl", "rollout_success", "success_at_end")
"""Metric families drawn per training stage (those it logged): sft logs loss; rl all four (success_at_end from the
live evaluation every rl.eval_every steps)."""
POLICY_OF_STAGE = {"sft": "sft", "rl": "grpo"}
"""The policy (its evidence label) each training stage trains: the key of its colour in every plot."""
CAPTIONS = {
    "training_curves": "Training curves: sft (BC) loss; rl loss, KL to the sft policy, training rollouts' success, "
    "and the live evaluation every rl.eval_every steps (dashed)",
    "success_rates": "Success at the episode's end on the same held-out episodes: grpo and its sft baseline "
    "(error bars: Wilson 95%)",
}


def newest_evidence(run_dir: Path) -> Path | None:
    """The run's current evidence/eval_grpo_<step>.json: the one run.json's eval record lists, else the highest step
    (a run trained on with --target-step keeps the earlier ones); None before the eval stage."""
    from reproduction.run.report import recorded_evidence

    recorded = [p for p in recorded_evidence(run_dir) or [] if p.name.startswith("eval_grpo_")]
    found = recorded or sorted(
        (p for p in Path(run_dir, "evidence").glob("eval_grpo_*.json") if p.stem.rpartition("_")[2].isdigit()),
        key=lambda p: int(p.stem.rpartition("_")[2]),
    )
    return found[-1] if found else None


def improvement_lines(doc: dict, metric: str = "success_at_end") -> list[str]:
    """The GRPO policy against its sft baseline in one evaluation evidence document, paired by reset seed (LIBERO:
    by init state; both ran the same held-out episodes): per task and over all, the difference of rates, the
    episodes only one of them solved, and Tango's 95% interval of the paired difference (reproduction/run/stats.py).
    [] without a baseline."""
    from reproduction.run.stats import tango_difference

    base = next((b for b in doc.get("baselines", []) if b["policy"]["label"] == "sft"), None)
    if base is None:
        return []
    rows, total, by = [], [0, 0, 0], "reset seed"
    for task, mine in sorted(doc["tasks"].items()):
        theirs = base["tasks"].get(task, {}).get("outcomes", {})
        ours = mine.get("outcomes", {})
        key = "init_states" if "init_states" in ours else "reset_seeds"  # LIBERO's episodes start from init states
        by = "init state" if key == "init_states" else by
        if ours.get(key) != theirs.get(key) or metric not in ours:
            rows.append(f"{task}: not paired (the policies ran different episodes)")
            continue
        a, b = ours[metric], theirs[metric]
        only_grpo = sum(x == "1" and y == "0" for x, y in zip(a, b))
        only_sft = sum(x == "0" and y == "1" for x, y in zip(a, b))
        total = [total[0] + len(a), total[1] + only_grpo, total[2] + only_sft]
        rows.append(_paired(task, len(a), only_grpo, only_sft, tango_difference))
    if len(rows) > 1 and total[0]:
        rows.append(_paired("all tasks", *total, tango_difference))
    return [f"grpo - sft, {metric.replace('_', ' ')}, paired by {by}:"] + [f"  {r}" for r in rows]


def _paired(name: str, n: int, only_grpo: int, only_sft: int, interval) -> str:
    lo, hi = interval(only_sft, only_grpo, n, 0.95)
    return (
        f"{name}: {(only_grpo - only_sft) / n:+.2f} on {n} episodes ({only_grpo} solved only by grpo, {only_sft} only "
        f"by sft; 95% CI {float(lo):+.2f} to {float(hi):+.2f})"
    )


def write_plots(run_dir: Path) -> dict[str, Path]:
    """Write the plots the run's outputs allow; returns {plot name: path}."""
    from reproduction.run import plots

    run_dir = Path(run_dir)
    out_dir = run_dir / "plots"
    out_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    logs = {stage: run_dir / stage / "metrics.jsonl" for stage in ("sft", "rl")}
    logs = {k: v for k, v in logs.items() if v.is_file()}
    newest = newest_evidence(run_dir)
    doc = json.loads(newest.read_text(encoding="utf-8")) if newest is not None else None
    labels = [e["policy"]["label"] for e in ([doc, *doc.get("baselines", [])] if doc else [])]
    # one colour per policy in both plots: the sft stage trains `sft`, the rl stage `grpo` (evidence labels)
    colours = plots.policy_colours([*POLICY_OF_STAGE.values(), *labels])
    if logs:
        written["training_curves"] = plots.plot_training_curves(
            logs,
            out_dir / "training_curves.png",
            metrics=CURVES,
            colours={stage: colours[POLICY_OF_STAGE[stage]] for stage in logs},
        )
    if doc is not None:
        written["success_rates"] = plots.plot_success_rates(
            doc,
            out_dir / "success_rates.png",
            metric="success_at_end",
            title="Held-out success: grpo vs sft",
            colours={label: colours[label] for label in labels},
        )
    return written


def write_run_report(run_dir: Path) -> Path:
    """Plots, then <run>/report.html: the newest evaluation (grpo, its sft baseline), the comparison against
    eval.reference when the compare stage made one (else that it compared with nothing), grpo - sft paired per task
    (improvement_lines, as the demo prints it), the stages in recipe order (resumed / stale noted), the plots, the
    lineage chain; while eval/compare are stale a stale banner replaces the verdict.
    Raises what reading run.json raises (RunStateError when it is not a run folder's)."""
    from reproduction.recipes.grpo.recipe import GRPO
    from reproduction.run import report
    from reproduction.run.evidence import Comparison, load_evidence
    from reproduction.run.lineage import LINEAGE_DIR
    from reproduction.run.lineage_check import lineage_chain
    from reproduction.run.runner import read_state, stale_stages

    run_dir = Path(run_dir)
    state = read_state(run_dir) or {}
    written = write_plots(run_dir)
    stale = stale_stages(state)
    stages = [
        report.StageSummary(
            name=s.name,
            status=rec.get("status", ""),
            seconds=rec.get("seconds"),
            note=report.stage_note(rec, stale.get(s.name)),
        )
        for s in GRPO.stages
        if (rec := state.get("stages", {}).get(s.name)) is not None
    ]
    newest = newest_evidence(run_dir)
    others = [p for p in sorted(Path(run_dir, "evidence").glob("eval_*.json")) if p != newest]  # listed apart
    compared = run_dir / "evidence" / "comparison.json"  # the compare stage's, against eval.reference
    comparison = None
    if compared.is_file():
        comparison = Comparison.from_dict(json.loads(compared.read_text(encoding="utf-8")))
    chain = lineage_chain(run_dir) if any((run_dir / LINEAGE_DIR).glob("*.intoto.json")) else None
    doc = load_evidence(newest) if newest is not None else None
    records = state.get("stages", {})
    return report.write_report(
        run_dir / "report.html",
        title="GRPO run",
        run_id=state.get("run_id", ""),
        run_dir=run_dir,
        evidence=[doc] if doc is not None else [],
        comparison=comparison,
        stages=stages,
        plots={CAPTIONS.get(k, k.replace("_", " ")): v for k, v in written.items()},
        chain=chain,
        stale={s.name: stale[s.name] for s in GRPO.stages if s.name in stale},
        steps={name: rec.get("step") for name, rec in records.items() if isinstance(rec, dict)},
        reference_note=None if comparison is not None else no_reference_note(records.get("compare")),
        paired=improvement_lines(doc) if doc is not None else [],
        others=sorted(others, key=lambda p: (report.evidence_step(p) or -1, p.name)),  # numeric step order
    )


def no_reference_note(compare: object) -> str | None:
    """What the report says of a complete compare stage that recorded no reference (compare/compare.json's
    "reference": null), None otherwise: it compared with nothing, so there is no verdict."""
    if not isinstance(compare, dict) or compare.get("status") != "complete":
        return None
    summary = compare.get("summary")
    if not isinstance(summary, dict) or "reference" not in summary or summary["reference"]:
        return None
    return (
        "No reference evidence: compared with nothing (eval.reference is not set), so there is no verdict; "
        "set eval.reference to an evaluation evidence file to compare this run's evaluation with it."
    )


def main(argv: list[str] | None = None) -> int:
    """`python -m reproduction.recipes.grpo.report RUN`: rewrite a GRPO run's plots and report.html. A folder
    without run.json is exit 3 and another recipe's run exit 4 (its report is not this one), one line each, with
    nothing written."""
    import argparse

    from reproduction.errors import InputNotFoundError, InvalidInputError, PortableError
    from reproduction.run.runner import read_state

    parser = argparse.ArgumentParser(
        prog="python -m reproduction.recipes.grpo.report",
        description="Rewrite a GRPO run's plots/ and report.html.",
        allow_abbrev=False,
    )
    parser.add_argument("run_dir", type=Path, help="the run folder (`portable run --output`) of a grpo run")
    args = parser.parse_args(argv)
    try:
        state = read_state(args.run_dir) if args.run_dir.is_dir() else None
        if state is None:
            raise InputNotFoundError(
                f"{args.run_dir} holds no run (no run.json)",
                path=args.run_dir,
                hint="name a grpo run's --output folder",
            )
        if state.get("recipe") != "grpo":
            raise InvalidInputError(
                f"{args.run_dir} holds a {state.get('recipe')!r} run, not a grpo run",
                hint="`portable run --resume` on that run folder rewrites its own recipe's report",
            )
        print(write_run_report(args.run_dir))
    except PortableError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":  # pragma: no cover - exercised through main() in tests
    sys.exit(main())
