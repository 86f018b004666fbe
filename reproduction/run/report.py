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
) -> str:
    """The report's HTML text. `evidence`: one evaluation evidence document or several (primaries and baselines
    all appear in the summary); `plots`: caption -> PNG path, in display order; `chain`: `lineage_chain(run)`."""
    docs = [evidence] if isinstance(evidence, Mapping) else list(evidence)
    evaluations = [e for d in docs for e in (d, *d.get("baselines", []))]
    per_task = sorted({t for e in evaluations for t in e["tasks"]})
    version = _version()
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
) -> Path:
    """The report of a run folder from what it holds: evidence/eval_*.json, evidence/comparison.json,
    plots/*.png (known plots first, in PLOT_CAPTIONS order) and lineage/. Writes <run>/report.html
    (or `out`) and returns its path; a part the run lacks is shown as absent, not an error."""
    run_dir = Path(run_dir)
    evidence = [load_evidence(p) for p in sorted((run_dir / "evidence").glob("eval_*.json"))]
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
    )
