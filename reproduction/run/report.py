"""report.html: one self-contained page a person opens (no network, no script): summary, comparison, plots, lineage.

Rendered with Jinja2 (autoescaped, so task names, paths and config strings cannot inject markup) from
reproduction/run/templates/report.html.j2; plots are embedded as base64 PNG `data:` URIs.
"""

from __future__ import annotations

import base64
import functools
import importlib.metadata
import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from reproduction.errors import InvalidInputError
from reproduction.fsio import atomic_write_text
from reproduction.run.evidence import Comparison, load_evidence
from reproduction.run.lineage import LINEAGE_DIR
from reproduction.run.lineage_check import Chain, lineage_chain
from reproduction.run.stale import stale_stages

TEMPLATES = Path(__file__).resolve().parent / "templates"
TEMPLATE = "report.html.j2"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@dataclass(kw_only=True, slots=True, frozen=True)
class StageSummary:
    """One row of the stages table."""

    name: str
    status: str
    """"ran", "skipped", "resumed from step_N", "failed", ..."""
    seconds: float | None = None
    note: str = ""


def stale_note(upstream: str | None) -> str:
    """The stages table's note for a stage whose results predate `upstream`'s outputs (runner.stale_stages; None:
    it does not): its results, in this report too, are of what came before."""
    if upstream is None:
        return ""
    return f"stale: ran before {upstream} changed; its results here are of the earlier {upstream} (--resume redoes it)"


def resumed_note(record: Mapping[str, Any]) -> str:
    """The stages table's note for a stage whose run.json record says it continued from a checkpoint
    (`resumed_from`: the step it resumed at), else ""; only what run.json records, nothing inferred."""
    step = record.get("resumed_from")
    if isinstance(step, int) and not isinstance(step, bool):
        return f"resumed from step {step}"
    return ""


def stage_note(record: Mapping[str, Any], upstream: str | None) -> str:
    """The stages table's note column of one run.json stage record: resumed (resumed_note), then stale
    (stale_note), joined by "; "."""
    return "; ".join(n for n in (resumed_note(record), stale_note(upstream)) if n)


def _and(names: Sequence[str]) -> str:
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else names[0]


def stale_banner(stale: Mapping[str, str], steps: Mapping[str, Any] | None = None) -> str | None:
    """The text shown where the verdict would be while stages hold results from before an upstream stage changed
    (`stale`: runner.stale_stages, in recipe order; `steps`: run.json's recorded step of each stage), None when
    none does: which stages, since which stage changed (at which step, when recorded), and that --resume redoes
    them. The CLI says the same and shows none of those results (cli.stale_line)."""
    if not stale:
        return None
    names = list(stale)
    ups = list(dict.fromkeys(stale.values()))
    now = [
        f"{u} is now at step {steps[u]}"
        for u in ups
        if isinstance((steps or {}).get(u), int) and not isinstance(steps[u], bool)
    ]
    one = len(names) == 1
    return (
        f"Stale: {_and(names)} ran before {_and(ups)} changed{f' ({_and(now)})' if now else ''}, so "
        f"{'its results' if one else 'their results'} below are of the earlier {_and(ups)}, not this run's; "
        f"`portable run ... --resume` (without --stages) redoes {'it' if one else 'them'}."
    )


def evidence_step(path: Path) -> int | None:
    """The step in an evidence file's name (eval_<policy>_<step>.json), None when the name ends in no number."""
    tail = Path(path).stem.rpartition("_")[2]
    return int(tail) if tail.isdigit() else None


def _by_step(paths: Sequence[Path]) -> list[Path]:
    # numeric, not lexicographic: eval_policy_30 comes before eval_policy_100
    return sorted(paths, key=lambda p: (evidence_step(p) if evidence_step(p) is not None else -1, p.name))


# Which stage evaluated is read from what run.json recorded, never from a stage's name: an out-of-tree recipe may
# call it `evaluate` (audit56 B1: with any name but `eval` the report showed an earlier evaluation as the run's,
# compare refused the folder and no stale warning was said).
FALLBACK_EVAL_STAGE = "eval"


def _read_state(run_dir: Path) -> Mapping[str, Any] | None:
    try:
        state = json.loads((Path(run_dir) / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return state if isinstance(state, Mapping) else None


def evidence_paths(run_dir: Path, stage: str, outputs: Any) -> list[Path]:
    """The <run>/evidence/eval_*.json paths (existing or not) among a stage record's `outputs`, which are recorded
    relative to the stage's folder (<run>/<stage>), so the run's evidence files read ../evidence/eval_*.json."""
    if not isinstance(outputs, Mapping):
        return []
    evidence = (run_dir / "evidence").resolve()
    found = []
    for rel in outputs:
        p = (run_dir / stage / str(rel)).resolve()
        if p.parent == evidence and p.name.startswith("eval_") and p.suffix == ".json":
            found.append(run_dir / "evidence" / p.name)
    return found


def evidence_stages(run_dir: Path, state: Mapping[str, Any] | None = None) -> list[str]:
    """The stages that evaluated the run: those whose run.json record (`state`, else read from <run>/run.json) lists
    evidence/eval_*.json among its outputs, whatever they are named, sorted by name. Several (a recipe with two
    evaluating stages) all count: the run's current evidence is every file they list, and any of them being stale
    or not complete makes it not current. When no record lists any (no evaluation recorded yet, or run.json
    missing), [FALLBACK_EVAL_STAGE], the built-in recipes' name, so their reports and warnings read as before.
    GRPO's rl stage records its live evaluations in rl/evidence/, not the run's evidence/, so it is not one."""
    run_dir = Path(run_dir)
    state = _read_state(run_dir) if state is None else state
    stages = (state or {}).get("stages")
    found = [
        name
        for name, rec in (stages.items() if isinstance(stages, Mapping) else ())
        if isinstance(rec, Mapping) and evidence_paths(run_dir, str(name), rec.get("outputs"))
    ]
    return sorted(found) or [FALLBACK_EVAL_STAGE]


def recorded_evidence(run_dir: Path) -> list[Path] | None:
    """The evaluation evidence files (evidence/eval_*.json, existing) that run.json's evaluating stages
    (evidence_stages) list as their outputs, by numeric step; None when run.json is missing or unreadable or no
    stage record lists an existing one."""
    run_dir = Path(run_dir)
    state = _read_state(run_dir)
    if state is None or not isinstance(state.get("stages"), Mapping):
        return None
    found: dict[str, Path] = {}
    for name in evidence_stages(run_dir, state):
        rec = state["stages"].get(name)
        for p in evidence_paths(run_dir, name, rec.get("outputs") if isinstance(rec, Mapping) else None):
            if p.is_file():
                found[p.name] = p
    return _by_step(list(found.values())) if found else None


def current_evidence(run_dir: Path) -> tuple[list[Path], list[Path]]:
    """(current, others) of <run>/evidence/eval_*.json, each by numeric step. Current: the files run.json's
    evaluating stages list (recorded_evidence); without such a record, those of the highest step in their names
    (all when no name has a step) among the run's own evaluations, `portable eval --checkpoint`'s eval_checkpoint_*
    only when there is nothing else. Others: every other eval_*.json there (an earlier step's evaluation kept by
    `--resume --target-step N`, or one `portable eval --checkpoint` added), never mixed into the current ones."""
    everything = _by_step(list(Path(run_dir, "evidence").glob("eval_*.json")))
    current = recorded_evidence(run_dir)
    if current is None:
        own = [p for p in everything if not p.name.startswith("eval_checkpoint_")] or everything
        steps = [evidence_step(p) for p in own]
        top = max((s for s in steps if s is not None), default=None)
        current = [p for p, s in zip(own, steps) if top is None or s == top]
    names = {p.name for p in current}
    return current, [p for p in everything if p.name not in names]


def other_evaluation(path: Path) -> dict[str, Any]:
    """One row of the report's "Earlier evaluations" list: file name, evidence name, policy labels, step, episodes
    (per policy); an unreadable file keeps only its name and why, so the report still renders."""
    row: dict[str, Any] = {"file": Path(path).name, "name": "", "policies": "", "step": None, "episodes": None}
    try:
        doc = load_evidence(path)
        policy = doc["policy"]
        row["name"] = str(doc.get("name", ""))
        row["policies"] = ", ".join(str(e["policy"]["label"]) for e in (doc, *doc.get("baselines", [])))
        row["step"] = (policy.get("checkpoint") or {}).get("step", evidence_step(path))
        row["episodes"] = doc["metrics"]["success_at_end"]["episodes"]
    except Exception as exc:  # a hand-edited or foreign file: listed, not fatal to the report
        row["name"] = f"not readable as evidence ({type(exc).__name__})"
    return row


@dataclass(kw_only=True, slots=True, frozen=True)
class _Plot:
    caption: str
    data: str
    width: int
    height: int


def _png(path: Path, caption: str) -> _Plot:
    data = Path(path).read_bytes()
    if not data.startswith(PNG_MAGIC) or data[12:16] != b"IHDR":
        raise InvalidInputError(
            f"{path} is not a PNG file", path=path, hint="plots are written by reproduction.run.plots"
        )
    width, height = struct.unpack(">II", data[16:24])
    return _Plot(caption=caption, data=base64.b64encode(data).decode("ascii"), width=width, height=height)


@functools.cache
def _version() -> str:
    try:
        return importlib.metadata.version("recap-portable")
    except importlib.metadata.PackageNotFoundError:
        return "dev"


@functools.cache
def _environment():
    """One Jinja environment per process: it caches the compiled template (compiling it took ~45 ms a report, which
    every `portable run` now pays through Recipe.report)."""
    from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

    return Environment(
        loader=FileSystemLoader(str(TEMPLATES)),
        autoescape=select_autoescape(("html", "j2")),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def render_report_html(
    *,
    title: str,
    run_id: str,
    run_dir: Path | None = None,
    evidence: Mapping[str, Any] | Sequence[Mapping[str, Any]] = (),
    comparison: Comparison | None = None,
    stages: Sequence[StageSummary] = (),
    plots: Mapping[str, Path] | None = None,
    chain: Chain | None = None,
    generated: datetime | None = None,
    stale: Mapping[str, str] | None = None,
    steps: Mapping[str, Any] | None = None,
    reference_note: str | None = None,
    paired: Sequence[str] = (),
    others: Sequence[Path] = (),
) -> str:
    """The report's HTML text. `evidence`: one evaluation evidence document or several (primaries and baselines
    all appear in the summary); `plots`: caption -> PNG path, in display order; `chain`: `lineage_chain(run)`.
    `stale` (runner.stale_stages) and `steps` (run.json's step per stage): a stale banner replaces the verdict
    banner (stale_banner), and the results of a stale evaluating stage (evidence_stages of `run_dir`'s run.json,
    else `eval`) / `compare` stage are marked as of the earlier
    upstream, not shown as the run's. `reference_note`: what the comparison section says when there is no
    comparison (the compare stage had no reference); `paired`: a heading line, then one line per task, of a
    within-run paired difference (GRPO's grpo - sft). `others`: evidence files beside `evidence` that are not the
    run's current result (current_evidence), listed apart under "Earlier evaluations", never in the tables."""
    docs = [evidence] if isinstance(evidence, Mapping) else list(evidence)
    evaluations = [e for d in docs for e in (d, *d.get("baselines", []))]
    per_task = sorted({t for e in evaluations for t in e["tasks"]})
    version = _version()
    evaluating = evidence_stages(run_dir) if run_dir is not None else [FALLBACK_EVAL_STAGE]
    when = (generated or datetime.now(timezone.utc)).astimezone(timezone.utc)
    return (
        _environment()
        .get_template(TEMPLATE)
        .render(
            title=title,
            run_id=run_id,
            run_dir=str(run_dir) if run_dir is not None else None,
            version=version,
            generated=when.strftime("%Y-%m-%d %H:%M UTC"),
            evaluations=evaluations,
            per_task=per_task,
            comparison=comparison,
            stages=list(stages),
            plots=[_png(path, caption) for caption, path in (plots or {}).items()],
            chain=chain.lines() if chain is not None else None,
            stale_banner=stale_banner(stale or {}, steps),
            stale_eval=next((stale[n] for n in evaluating if n in (stale or {})), None),
            eval_stages=f"{_and(evaluating)} stage{'s list' if len(evaluating) > 1 else ' lists'}",
            stale_compare=(stale or {}).get("compare"),
            reference_note=reference_note,
            paired_title=paired[0].rstrip(":") if paired else None,
            paired_rows=[line.strip() for line in paired[1:]],
            others=[other_evaluation(p) for p in others],
        )
    )


def write_report(out: Path, **kwargs: Any) -> Path:
    """Render the report (see `render_report_html` for the arguments) and write it atomically to `out`."""
    atomic_write_text(Path(out), render_report_html(**kwargs))
    return Path(out)


PLOT_CAPTIONS = {
    "success_rates": "Success rate per task and guidance scale, at the episode's last step (error bars: Wilson 95%)",
    "value_episodes": "Predicted value along episodes: successes solid green, failures dashed red",
    "advantages": "Advantages and the dashed threshold at or above which frames are labelled positive; frames "
    "forced positive below it (sft and hold-out labels) are drawn apart in light green",
    "training_curves": "Training curves (metrics.jsonl of each training stage)",
}


def write_run_report(
    run_dir: Path,
    *,
    title: str,
    run_id: str,
    stages: Sequence[StageSummary] = (),
    out: Path | None = None,
    stale: Mapping[str, str] | None = None,
    steps: Mapping[str, Any] | None = None,
) -> Path:
    """The report of a run folder from what it holds: its current evidence/eval_*.json (current_evidence; the
    others listed apart), evidence/comparison.json,
    plots/*.png (known plots first, in PLOT_CAPTIONS order) and lineage/. Writes <run>/report.html
    (or `out`) and returns its path; a part the run lacks is shown as absent, not an error. `stale`, `steps`: as
    render_report_html's; `stale` None (not given) reads both from run.json (stale.stale_stages), so a recipe's
    report shows the stale banner without passing them, and {} shows none."""
    run_dir = Path(run_dir)
    if stale is None:
        state = _read_state(run_dir) or {}
        stale = stale_stages(state)
        recs = state.get("stages") if isinstance(state.get("stages"), Mapping) else {}
        steps = {n: r.get("step") for n, r in recs.items() if isinstance(r, Mapping)} if steps is None else steps
    current, others = current_evidence(run_dir)
    evidence = [load_evidence(p) for p in current]
    comparison_file = run_dir / "evidence" / "comparison.json"
    comparison = None
    if comparison_file.is_file():
        comparison = Comparison.from_dict(json.loads(comparison_file.read_text(encoding="utf-8")))
    pngs = {p.stem: p for p in sorted((run_dir / "plots").glob("*.png"))}
    order = [name for name in PLOT_CAPTIONS if name in pngs] + [n for n in pngs if n not in PLOT_CAPTIONS]
    plots = {PLOT_CAPTIONS.get(name, name.replace("_", " ")): pngs[name] for name in order}
    chain = lineage_chain(run_dir) if any((run_dir / LINEAGE_DIR).glob("*.intoto.json")) else None
    return write_report(
        out or run_dir / "report.html",
        title=title,
        run_id=run_id,
        run_dir=run_dir,
        evidence=evidence,
        comparison=comparison,
        stages=stages,
        plots=plots,
        chain=chain,
        stale=stale,
        steps=steps,
        others=others,
    )
