"""`portable compare` (two evidence files, outside a run), `portable eval --plan` (episodes a margin needs), and
the results a finished run prints (`run_results_lines`: headline rates with intervals, the verdict).

Exit codes of `compare`: 0 reproduced, 60 differs, 61 inconclusive; a bad file is 3 (missing) or 4
(not evidence, unknown format version, no policy label or no task in common with the other file), a bad flag 2.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reproduction.errors import UsageError
from reproduction.ui import UiOptions, options_from_args, progress

EXIT_DIFFERS = 60
EXIT_INCONCLUSIVE = 61
EXIT_OF = {"reproduced": 0, "differs": EXIT_DIFFERS, "inconclusive": EXIT_INCONCLUSIVE}


def cmd_compare(args: Any) -> int:
    """Compare ACTUAL with REFERENCE; the table (or --json) on stdout; the exit code is the verdict's."""
    from reproduction.run.evidence import compare_evidence, write_comparison

    _check_level("margin", args.margin, 0, 1)
    _check_level("alpha", args.alpha, 0, 0.5)
    from reproduction.run.comparison import evidence_labels_and_tasks
    from reproduction.run.evidence_check import check_evidence

    quiet = bool(getattr(args, "quiet", False))
    reference = load_source(args.reference, quiet=quiet)  # the reference's own errors first, named as such
    check_evidence(reference, where=args.reference, reference=True)  # a count of 0 episodes, named by its path
    # the reference's policy labels pick among a run's several current evaluations (one per evaluating stage)
    actual = load_source(args.actual, quiet=quiet, labels=evidence_labels_and_tasks(reference)[0])
    comparison = compare_evidence(
        actual,
        reference,
        margin=args.margin,
        alpha=args.alpha,
        actual_where=args.actual,
        reference_where=args.reference,
    )
    if args.out:
        write_comparison(Path(args.out), comparison)
    if args.json:
        sys.stdout.write(json.dumps(comparison.to_dict(), indent=1) + "\n")
    else:
        print(comparison.render())
    return EXIT_OF[comparison.verdict]


def load_source(text: str, *, quiet: bool = False, labels: set[str] | None = None) -> dict[str, Any]:
    """Evidence from a file, a folder holding one eval_*.json, a model card (*.md: its model-index), or
    `hub:OWNER/NAME[@REVISION]` (the published card's model-index, read through the Hub). `quiet` (-q): no line
    saying which of a run folder's evaluations was chosen; the warning that it is not the run's current one stays.
    `labels` (the other side's policy labels) choose among a run's several current evaluations (_by_labels)."""
    from reproduction.run.card_evidence import evidence_from_card
    from reproduction.run.evidence import load_evidence

    if text.startswith("hub:"):
        return evidence_from_card(_hub_card(text[4:]), where=text)
    path = _evidence_path(Path(text), quiet=quiet, labels=labels)
    if path.suffix.lower() == ".md":
        from reproduction.errors import os_error

        try:
            return evidence_from_card(path.read_text(encoding="utf-8"), where=str(path))
        except OSError as exc:
            raise os_error(exc, str(path), op="read") from exc
    return load_evidence(path)


def _hub_card(spec: str) -> str:
    """The README.md (model card) of a Hub model repo at a revision (default main)."""
    from reproduction.release.hub_transfer import HubSettings, fetch_small, hub_import

    hf_hub_url = hub_import("huggingface_hub").hf_hub_url

    repo, _, revision = spec.partition("@")
    if repo.count("/") != 1:
        raise UsageError(f"hub:{spec} is not hub:OWNER/NAME[@REVISION]", hint="e.g. hub:alice/recap-demo")
    settings = HubSettings.from_env()
    url = hf_hub_url(repo, "README.md", revision=revision or "main", endpoint=settings.resolved_endpoint())
    return fetch_small(url, what=f"read {repo}'s model card", settings=settings, limit=4 << 20).decode(
        "utf-8", "replace"
    )


def _evidence_path(path: Path, *, quiet: bool = False, who: str = "compare", labels: set[str] | None = None) -> Path:
    """A file as given, or the one evidence JSON of a folder (a fetched bundle's evidence/ or the bundle itself,
    whose model card's results `fetch` keeps as evidence/*.json); of a run folder (or its evidence/) holding several,
    the one its run.json's eval record lists (_recorded_one, whose stderr line starts with `who` and is left out when
    `quiet`); of several current ones (two evaluating stages), the one sharing a policy label with `labels`
    (_by_labels). For `compare` (who == "compare"), a warning when that evaluation is not the run's current result
    (_warn_not_current, said even when quiet: it changes what the verdict means); `eval --plan` only reads the
    reference's rates and episode counts, and says nothing of a verdict it does not give."""
    if path.is_dir():
        for folder in (path, path / "evidence"):
            found = sorted(p for p in folder.glob("eval_*.json")) if folder.is_dir() else []
            chosen = (
                found[0] if len(found) == 1 else _recorded_one(folder, found, quiet, who, labels) if found else None
            )
            if chosen is not None:
                if who == "compare":
                    _warn_not_current(folder, chosen)
                return chosen
            if found:
                names = ", ".join(p.name for p in found)
                raise UsageError(f"{folder} holds several evidence files ({names})", hint="name one of them")
        from reproduction.errors import InputNotFoundError  # not found (exit 3), as a missing evidence file is

        raise InputNotFoundError(f"{path} holds no eval_*.json evidence", path=path, hint="pass an evidence file")
    return path


def _warn_not_current(folder: Path, chosen: Path) -> None:
    """One stderr line when `folder` is a run folder's evidence/ whose run.json says `chosen`, the evaluation there
    compared, is not the run's current result: the evaluating stage whose record lists it (report.evidence_stages:
    whatever its name; every evaluating stage when none lists it) did not complete (killed, failed: the file is an
    earlier evaluation) or predates an upstream stage's outputs (after `--target-step N --stages rl`); of several,
    the first by name that is not current. Compare still answers; the verdict is then about that earlier policy
    (audit55 K2: a run killed in its eval stage was compared silently; audit56 B1: said only of a stage named `eval`;
    audit58 B4: with two evaluating stages, another stage's state says nothing of the file compared)."""
    from reproduction.run.report import evidence_paths, evidence_stages
    from reproduction.run.stale import stale_stages

    run_json = folder.parent / "run.json"
    if folder.name != "evidence" or not run_json.is_file():
        return
    try:
        state = json.loads(run_json.read_text(encoding="utf-8"))
        stale = stale_stages(state)
        names = evidence_stages(folder.parent, state)
        listing = [
            name
            for name in names
            if chosen.name
            in {p.name for p in evidence_paths(folder.parent, name, state["stages"][name].get("outputs"))}
        ]
        records = {name: state["stages"][name] for name in listing or names}
        statuses = {name: rec["status"] for name, rec in records.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return
    for name, status in statuses.items():
        up = stale.get(name)
        if status != "complete":
            why = f"its {name} stage is {status}, not complete, so this is the evaluation it last completed"
        elif up is not None:
            why = f"its {name} stage ran before stage {up}'s outputs changed, so this evidence is of the earlier {up}"
        else:
            continue
        tail = "`portable run ... --resume` evaluates the current one"
        print(f"warning: {folder.parent}: {why}; {tail}", file=sys.stderr)
        return


def _recorded_one(
    folder: Path, found: list[Path], quiet: bool, who: str, labels: set[str] | None = None
) -> Path | None:
    """The one of `found` (folder's eval_*.json) that run.json's evaluating stages list (report.recorded_evidence),
    when `folder` is a run folder's evidence/ (run.json beside or above it) and they list exactly one of them; the
    choice is said on one stderr line starting with `who` unless `quiet` (stdout stays the table or --json). When
    they list several (two evaluating stages), the one `labels` picks (_by_labels, exit 2 when none or several do).
    None otherwise: without run.json nothing tells them apart."""
    from reproduction.run.report import recorded_evidence

    run_dir = folder.parent
    if folder.name != "evidence" or not (run_dir / "run.json").is_file():
        return None
    recorded = {p.resolve() for p in recorded_evidence(run_dir) or []}
    mine = [p for p in found if p.resolve() in recorded]
    if len(mine) > 1:
        return _by_labels(run_dir, found, mine, quiet, who, labels)
    if len(mine) != 1:
        return None
    rest = ", ".join(p.name for p in found if p is not mine[0])
    if not quiet:
        print(
            f"{who}: using {mine[0]}, the evaluation {run_dir / 'run.json'} records (also there: {rest})",
            file=sys.stderr,
        )
    return mine[0]


def _by_labels(
    run_dir: Path, found: list[Path], current: list[Path], quiet: bool, who: str, labels: set[str] | None
) -> Path:
    """Of a run's several current evaluations (`current`, the files run.json's evaluating stages list, e.g. evala's
    eval_alpha_10.json and evalb's eval_beta_10.json), the one sharing a policy label with `labels` (the reference's,
    for compare's run side), said on one stderr line naming it and its stage unless `quiet`. Raises UsageError (exit
    2) naming the stages and their current files only (not the earlier ones kept beside them) when `labels` is None
    (the reference side, `eval --plan`) or none or several of them share one (audit58 B4: refused with the message
    for a folder without run.json, listing earlier files too)."""
    from reproduction.run.comparison import evidence_labels_and_tasks
    from reproduction.run.evidence import load_evidence

    stage_of = _listing_stages(run_dir, current)
    listed = "; ".join(f"{stage_of[p]}: {p.name}" for p in current)
    stages = sorted({name for names in stage_of.values() for name in names.split(", ")})
    several = f"{run_dir / 'run.json'}'s stages {', '.join(stages)} list several current evidence files ({listed})"
    hint = f"name one of them, e.g. {current[0]}"
    if labels is None:
        raise UsageError(several, hint=hint)
    shared = {p: sorted(evidence_labels_and_tasks(load_evidence(p))[0] & labels) for p in current}
    match = [p for p in current if shared[p]]
    if len(match) != 1:
        theirs = ", ".join(sorted(labels))
        why = (
            f"none has a policy label of the reference ({theirs})"
            if not match
            else "more than one shares a policy label with the reference ("
            + "; ".join(f"{p.name}: {', '.join(shared[p])}" for p in match)
            + ")"
        )
        raise UsageError(f"{several}, and {why}", hint=hint)
    chosen = match[0]
    if not quiet:
        rest = ", ".join(p.name for p in found if p is not chosen)
        print(
            f"{who}: using {chosen}, the evaluation stage {stage_of[chosen]} of {run_dir / 'run.json'} records, the "
            f"current one sharing policy labels ({', '.join(shared[chosen])}) with the reference (also there: {rest})",
            file=sys.stderr,
        )
    return chosen


def _listing_stages(run_dir: Path, current: list[Path]) -> dict[Path, str]:
    """Each of `current` with the evaluating stage(s) whose run.json record lists it ("evala", or "evala, evalb" for a
    file two records list)."""
    from reproduction.run.report import evidence_paths, evidence_stages

    try:
        state = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
        stages = state["stages"]
        lists = {
            name: {p.name for p in evidence_paths(run_dir, name, stages[name].get("outputs"))}
            for name in evidence_stages(run_dir, state)
            if name in stages
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        lists = {}  # read a moment ago by recorded_evidence; a change since leaves the stage unnamed
    return {p: ", ".join(n for n, names in lists.items() if p.name in names) or "?" for p in current}


def _check_level(name: str, value: float | None, low: float, high: float, example: str = "0.05") -> None:
    if value is not None and not low < value < high:
        raise UsageError(
            f"--{name} {value:g} must lie strictly between {low:g} and {high:g}", hint=f"e.g. --{name} {example}"
        )
    if name == "alpha" and value is not None:
        from reproduction.run.stats import MIN_ALPHA

        if value < MIN_ALPHA:
            raise UsageError(
                f"--alpha {value:g} is below {MIN_ALPHA:g}, the smallest test level recap-portable computes (1 - 2 "
                "alpha would round to 1)",
                hint=f"e.g. --alpha {example}",
            )


def _plan_targets(doc: dict[str, Any], rates: list[float]) -> list[dict[str, Any]]:
    """The rate rows to plan for: the rates given (one row each), then every rate row the comparison with the
    reference tests: each policy's overall metric (pooling its T tasks) and each of its tasks' metrics."""
    from reproduction.run.comparison import declared_margin
    from reproduction.run.evidence import COUNT_METRICS

    targets = [{"metric": f"rate {p:g}", "rate": p, "reference_episodes": None, "tasks": 1, "own": None} for p in rates]
    declared = {**doc.get("tolerances", {}), **doc.get("margins", {})}
    for entry in [doc, *doc.get("baselines", [])] if doc else []:
        label, tasks = entry["policy"]["label"], entry.get("tasks", {})
        for m in COUNT_METRICS:
            count = entry["metrics"].get(m)
            if count is None:
                continue
            own = declared_margin(declared, label, m)
            targets.append(
                {"metric": f"{label}/{m}", "rate": float(count["rate"]), "reference_episodes": int(count["episodes"])}
                | {"tasks": max(len(tasks), 1), "own": own}
            )
            for task, row in tasks.items():
                if m in row:
                    own_t = declared_margin(declared, label, f"{task}/{m}")
                    targets.append(
                        {"metric": f"{label}/{task}/{m}", "rate": float(row[m]["rate"])}
                        | {"reference_episodes": int(row[m]["episodes"]), "tasks": 1, "own": own_t}
                        | {"same_as_overall": len(tasks) == 1}  # one task: the same counts as the overall row
                    )
    return targets


def plan_rows(
    *,
    reference: Path | None,
    rates: list[float],
    margin: float | None,
    alpha: float | None,
    power: float,
    difference: float,
    ui: UiOptions | None = None,
) -> list[dict[str, Any]]:
    """One row per rate to plan for (`_plan_targets`), each with the episodes per side its own test needs for
    `power` (exact, unpaired); with a reference, a last row "every rate row" with the episodes per task at which
    the whole verdict (every row reproduced) has at least that power (Bonferroni over the rows' exact powers).
    A bar on stderr counts the searches (seconds each: `ui`, none when quiet or not a terminal)."""
    from reproduction.run.evidence import load_evidence
    from reproduction.run.evidence_check import check_evidence
    from reproduction.run.stats import DEFAULT_ALPHA, DEFAULT_MARGIN, episodes_exact

    doc: dict[str, Any] = {}
    if reference is not None:
        doc = load_evidence(reference)
        check_evidence(doc, where=reference, reference=True)
    targets = _plan_targets(doc, rates)
    if not targets:
        raise UsageError("--plan needs --reference FILE or --rate P", hint="e.g. portable eval --plan --rate 0.8")
    alpha = float(alpha if alpha is not None else doc.get("alpha", DEFAULT_ALPHA))
    margins = [
        float(margin if margin is not None else t["own"] if t["own"] is not None else DEFAULT_MARGIN) for t in targets
    ]
    for m in margins:
        if abs(difference) >= m:
            raise UsageError(
                f"--difference {difference:g} must be smaller than the margin {m:g}", hint="e.g. --difference 0"
            )
    searches = {(t["rate"], m) for t, m in zip(targets, margins)}
    joint = [
        (t["rate"], t["tasks"], m)
        for t, m in zip(targets, margins)
        if t["reference_episodes"] is not None and not t.get("same_as_overall")
    ]
    with progress(ui) as bars:
        bar, started, done = bars.task("planning episodes", total=len(searches) + bool(joint)), time.monotonic(), [0]
        bar.show(rate="")  # the bar's own rate column says bytes/s

        def tick() -> None:
            done[0] += 1
            bar.advance()
            bar.show(rate=f"{(time.monotonic() - started) / done[0]:.1f} s/search")

        rows = _plan_row_searches(targets, margins, alpha, power, difference, tick)
        if joint:
            # one n for every row, whatever its margin: the shortfalls of all rows share the one 1 - power (planning
            # each margin's rows alone and taking the largest n let each spend all of it, audit46 stats F2)
            per_task = episodes_exact(joint, margin=joint[0][2], alpha=alpha, power=power, difference=difference)
            tick()
            rows.append(
                {"metric": "every rate row", "rate": None, "margin": margin, "alpha": alpha, "power": power}
                | {"difference": difference, "episodes_per_side": None, "reference_episodes": None}
                | {"basis": "bonferroni", "rows": len(joint), "episodes_per_task": per_task}
            )
    return rows


def _plan_row_searches(
    targets: list[dict[str, Any]],
    margins: list[float],
    alpha: float,
    power: float,
    difference: float,
    tick: Callable[[], None],
) -> list[dict[str, Any]]:
    """`plan_rows`' rows alone, one search per distinct (rate, margin): rows share rates (a one-task reference's
    task rows are its overall rows), and a search is seconds of exact power and size calibration."""
    from reproduction.run.stats import episodes_exact

    rows, found = [], {}
    for t, m in zip(targets, margins):
        if (t["rate"], m) not in found:
            found[t["rate"], m] = episodes_exact(
                [(t["rate"], 1)], margin=m, alpha=alpha, power=power, difference=difference
            )
            tick()
        need = found[t["rate"], m]
        rows.append(
            {"metric": t["metric"], "rate": t["rate"], "margin": m, "alpha": alpha, "power": power}
            | {"difference": difference, "episodes_per_side": need, "reference_episodes": t["reference_episodes"]}
            | {"basis": "exact"}
        )
    return rows


def cmd_plan(args: Any) -> int:
    """`portable eval --plan`: episodes per side for `power` at alpha, per rate; --json for the rows."""
    import math

    _check_level("margin", args.margin, 0, 1)
    _check_level("alpha", args.alpha, 0, 0.5)
    _check_level("power", args.power, 0, 1, "0.8")
    for p in args.rate or []:
        if not 0 <= p <= 1:
            raise UsageError(f"--rate {p:g} is not a success rate", hint="give one between 0 and 1, e.g. --rate 0.8")
    if not math.isfinite(args.difference):
        raise UsageError(f"--difference {args.difference:g} is not a number", hint="e.g. --difference 0")
    rows = plan_rows(
        # a folder holding one eval_*.json is that file, as in `compare` (audit47 F11: a folder was exit 4, Errno 21)
        # no warning that a run's evaluation is an earlier one: the plan gives no verdict (audit56 F3)
        reference=_evidence_path(Path(args.reference), quiet=bool(getattr(args, "quiet", False)), who="eval --plan")
        if args.reference
        else None,
        rates=list(args.rate or []),
        margin=args.margin,
        alpha=args.alpha,
        power=args.power,
        difference=args.difference,
        ui=options_from_args(args),
    )
    if args.json:
        sys.stdout.write(json.dumps(rows, indent=1) + "\n")
        return 0
    single = [r for r in rows if r["rate"] is not None]
    width = max(len(r["metric"]) for r in single)
    r0 = rows[0]
    print(
        f"episodes per side for {100 * r0['power']:g}% power to say `reproduced` (two one-sided tests at alpha "
        f"{r0['alpha']:g}, unpaired, true difference {r0['difference']:g}{_sign_text(r0['difference'])}; exact "
        "binomial power), each row alone:"
    )
    for r in single:
        ref = r["reference_episodes"]
        short = (
            "" if ref is None else f"   reference has {ref}" + (" (too few)" if ref < r["episodes_per_side"] else "")
        )
        print(
            f"  {r['metric']:<{width}}  p={r['rate']:.3f}  margin ±{r['margin']:g}  {r['episodes_per_side']:>6}{short}"
        )
    if r0["difference"]:
        print(_other_sign_line(r0))
    for r in rows[len(single) :]:
        print(
            f"the whole verdict (all {r['rows']} rate rows reproduced, each policy's overall and per-task rows) needs "
            f"{r['episodes_per_task']} episodes per task a side for {100 * r['power']:g}% power (exact power of "
            "each row, Bonferroni over the rows, so at least that)"
        )
    print(_paired_hint(r0["margin"], r0["alpha"]))
    return 0


def _sign_text(difference: float) -> str:
    """What the sign of --difference means: it is run minus reference, and a plan holds for that sign only (0.03
    planned 212 episodes at rate 0.9, margin 0.1, which gave 71% power when the run was 0.03 worse: audit59 C2)."""
    if not difference:
        return ""
    return f" (this run's rate minus the reference's: the run {'better' if difference > 0 else 'worse'})"


def _other_sign_line(row: dict[str, Any]) -> str:
    """One line: the episodes per side the first row needs at the other sign of --difference (one more search)."""
    from reproduction.run.stats import episodes_exact

    other = -row["difference"]
    need = episodes_exact(
        [(row["rate"], 1)], margin=row["margin"], alpha=row["alpha"], power=row["power"], difference=other
    )
    return (
        f"the other sign, --difference {other:g} (the run {'better' if other > 0 else 'worse'} by as much), needs "
        f"{need} per side for {row['metric']} (p={row['rate']:.3f}): plan for the larger if either sign may hold"
    )


def _paired_hint(margin: float, alpha: float) -> str:
    """The plan's last line: how few episodes identical paired reruns need, from compare's own calibrated row test
    (`comparison.identical_paired_episodes`; the uncalibrated n > z^2 (1 - m) / m said 52 at margin 0.05, where
    nothing is reproduced before 59: audit50 C F4)."""
    from reproduction.run.comparison import identical_paired_episodes

    n = identical_paired_episodes(margin, alpha)
    return (
        "paired by reset seed (evaluating the reference's own initial states): identical reruns (no "
        f"discordant episode) are first `reproduced` at {n} episodes at margin {margin:g}, alpha {alpha:g} (compare's "
        "calibrated paired test)"
    )


def run_results_lines(run_dir: Path, *, table: bool = False) -> list[str]:
    """RECAP's and GRPO's headline (their Recipe.headline): success rates per policy (the `eval` stage's summary
    `results`) with Wilson 95% intervals, then the verdict against the reference (the `compare` stage's summary;
    `table`: the whole comparison table before it). [] before any eval.

    Never raises on what run.json holds: a summary entry not of their shape (a hand-edited run.json, another
    recipe's stage of the same name) is left out, so a finished run never fails on its own headline. "No
    reference evidence" is said only when the compare stage ran with none, and "in the bundle" only of a run with
    a bundle."""
    from reproduction.run.evidence import Comparison

    try:
        state = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return []
    stages = _mapping(_mapping(state).get("stages"))
    # by name on purpose: this headline is RECAP's and GRPO's own, of their `eval` stage's summary shape
    ev = _mapping(_mapping(stages.get("eval")).get("summary"))
    compare = _mapping(stages.get("compare"))
    compared = _mapping(compare.get("summary"))
    out = [line for label, doc in _mapping(ev.get("results")).items() if (line := _rate_line(str(label), doc))]
    seq = _mapping(ev.get("sequential"))
    if seq.get("why") and "episodes_per_task" in seq and "episodes_per_task_max" in seq:
        out.append(
            f"sequential evaluation: {seq['episodes_per_task']} of {seq['episodes_per_task_max']} episodes per task; "
            f"{seq['why']}"
        )
    verdict = compared.get("verdict")
    verdict = verdict if isinstance(verdict, str) and verdict else None
    cmp_file = run_dir / "evidence" / "comparison.json"
    if table and verdict and cmp_file.is_file():
        try:
            out += ["", Comparison.from_dict(json.loads(cmp_file.read_text())).render(), ""]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass  # the verdict line below still says what the compare stage found
    if verdict:
        out.append(f"against the reference evidence: {verdict}")
    elif compare.get("status") == "complete" and "reference" in compared and not compared["reference"]:
        if _mapping(state.get("config")).get("BUNDLE"):
            out.append("no reference evidence in the bundle to compare with")
        else:
            out.append("no reference evidence to compare with (eval.reference is not set)")
    return out + ([""] if out else [])


def _mapping(value: Any) -> dict[str, Any]:
    """`value` when it is a JSON object, else {} (run.json read as it is, never trusted for shape)."""
    return value if isinstance(value, dict) else {}


def _rate_line(label: str, doc: Any) -> str | None:
    """One policy's line of the headline from its eval summary entry ({"tasks": {task: {"episodes",
    "success_at_end", "success_once"}}} or a list of such rows); None when the entry is of another shape, holds a
    count that is not a whole number >= 0 or more successes than episodes, or no episodes."""
    from reproduction.run.stats import wilson

    tasks = _mapping(doc).get("tasks", {})
    rows = list(tasks.values()) if isinstance(tasks, dict) else tasks if isinstance(tasks, list) else None
    if rows is None or not all(isinstance(r, dict) for r in rows):
        return None
    counts = [[_count(r.get(k, 0)) for r in rows] for k in ("episodes", "success_at_end", "success_once")]
    if any(c is None for column in counts for c in column):
        return None
    eps, end, once = (sum(column) for column in counts)
    if not eps or end > eps or once > eps:
        return None
    lo, hi = wilson(end, eps)
    return (
        f"{label:<14} success at end {end / eps:6.1%} ({end}/{eps}, 95% CI {lo:.1%}-{hi:.1%}), "
        f"at any step {once / eps:6.1%}"
    )


def _count(value: Any) -> int | None:
    """A count as a summary holds it (an int, or a whole float or digit string as int() read them before); None
    for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    elif isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    return value if isinstance(value, int) and value >= 0 else None
