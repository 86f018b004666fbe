"""audit56 F3: a policy has one colour in every plot of a run's report (training curves and success rates), in
RECAP's report and in GRPO's; the figures the recipes' write_plots save are inspected, not their pixels."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from evidence_fixtures import make_evidence
from matplotlib.colors import to_hex
from matplotlib.container import BarContainer


def _capture(monkeypatch) -> dict[str, object]:
    """{png name: the matplotlib Figure write_plots saved as it}."""
    from reproduction.run import plots

    figures: dict[str, object] = {}

    def save(fig, out):
        figures[Path(out).name] = fig
        return Path(out)

    monkeypatch.setattr(plots, "save", save)
    return figures


def _log(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    records = [{"step": s, "split": "train", "metrics": {"loss": 1 / s}} for s in range(1, 5)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def _curve_colours(fig) -> dict[str, set[str]]:
    """{panel title's stage: the colours of its lines}."""
    out: dict[str, set[str]] = {}
    for ax in fig.axes:
        if ax.get_title():
            out.setdefault(ax.get_title().split(":")[0], set()).update(to_hex(line.get_color()) for line in ax.lines)
    return out


def _bars(fig) -> dict[str, tuple[str, str | None]]:
    """{bar legend label: (face colour, hatch)} of the success plot."""
    (ax,) = fig.axes
    bars = [c for c in ax.containers if isinstance(c, BarContainer)]
    return {c.get_label(): (to_hex(c.patches[0].get_facecolor()), c.patches[0].get_hatch()) for c in bars}


def test_recap_report_draws_each_policy_in_one_colour(tmp_path, monkeypatch):
    from reproduction.recipes.recap.report import write_plots
    from reproduction.run.plots import policy_colours

    run = tmp_path / "run"
    for mode in ("recap", "bc"):
        _log(run / "policy" / mode / "metrics.jsonl")
    doc = make_evidence(name="eval_policy_4")  # recap at cfg 1.5, baseline bc
    other_scale = copy.deepcopy({k: v for k, v in doc.items() if k != "baselines"})
    other_scale["policy"] |= {"label": "recap w=1", "guidance_scale": 1.0}
    doc["baselines"].append(other_scale)
    (run / "evidence").mkdir()
    (run / "evidence" / "eval_policy_4.json").write_text(json.dumps(doc))
    (run / "run.json").write_text(json.dumps({"format_version": 1, "run_id": "r", "stages": {}}))
    figures = _capture(monkeypatch)
    write_plots(run)

    colours = policy_colours(["bc", "recap"])
    assert colours == {"bc": "#0969da", "recap": "#8250df"}
    # the curves numbered their lines by policy/ folder (bc first), the bars by evidence entry (recap first)
    (curves,) = [c for stage, c in _curve_colours(figures["training_curves.png"]).items() if stage == "policy"]
    assert curves == {colours["bc"], colours["recap"]}
    fig = figures["training_curves.png"]
    legend = {
        t.get_text(): to_hex(h.get_color())
        for ax in fig.axes
        if ax.get_legend()
        for h, t in zip(ax.get_legend().legend_handles, ax.get_legend().get_texts())
        if t.get_text() in colours
    }
    assert legend == colours
    assert _bars(figures["success_rates.png"]) == {
        "recap (cfg=1.5)": (colours["recap"], None),
        "bc": (colours["bc"], None),
        "recap w=1 (cfg=1)": (colours["recap"], "//"),  # the same policy at another scale: hatched, same colour
    }


def test_grpo_report_draws_each_policy_in_one_colour(tmp_path, monkeypatch):
    from reproduction.recipes.grpo.report import write_plots
    from reproduction.run.plots import policy_colours

    run = tmp_path / "run"
    for stage in ("sft", "rl"):
        _log(run / stage / "metrics.jsonl")
    doc = make_evidence(name="eval_grpo_4")
    doc["policy"]["label"], doc["baselines"][0]["policy"]["label"] = "grpo", "sft"
    doc["policy"]["guidance_scale"] = None  # GRPO's evidence has no guidance scale
    (run / "evidence").mkdir()
    (run / "evidence" / "eval_grpo_4.json").write_text(json.dumps(doc))
    figures = _capture(monkeypatch)
    write_plots(run)

    colours = policy_colours(["grpo", "sft"])
    assert colours == {"grpo": "#0969da", "sft": "#8250df"}
    # each stage's row drew its one run in PALETTE[0]: sft's curve was grpo's colour in the success plot
    assert _curve_colours(figures["training_curves.png"]) == {"sft": {colours["sft"]}, "rl": {colours["grpo"]}}
    assert _bars(figures["success_rates.png"]) == {"grpo": (colours["grpo"], None), "sft": (colours["sft"], None)}
