"""The run's PNG plots: each is a real PNG whose pixels show what its caption says."""

from __future__ import annotations

import json

import numpy as np
import pytest
from evidence_fixtures import make_evidence

from reproduction.recipes.recap import plots as recap_plots
from reproduction.run import plots

GREEN = np.array([0x1A, 0x7F, 0x37]) / 255
RED = np.array([0xCF, 0x22, 0x2E]) / 255


def _pixels(path):
    from matplotlib.image import imread

    image = imread(path)
    assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 400
    return image[..., :3]


def _share(image, colour, tol=0.06):
    return float(np.mean(np.all(np.abs(image - colour) < tol, axis=-1)))


def test_value_along_episodes_draws_successes_green_and_failures_red(tmp_path):
    rng = np.random.default_rng(0)
    episodes = [
        recap_plots.EpisodeTrace(values=np.linspace(-1, 0, 50) + rng.normal(0, 0.02, 50), success=True, label="ep 0"),
        recap_plots.EpisodeTrace(values=np.full(40, -0.9), success=False, label="ep 1", returns=np.full(40, -1.0)),
    ]
    out = recap_plots.plot_value_episodes(episodes, tmp_path / "plots/value_episodes.png")
    image = _pixels(out)
    assert _share(image, GREEN) > 0.001 and _share(image, RED) > 0.001
    only_success = _pixels(recap_plots.plot_value_episodes(episodes[:1], tmp_path / "s.png"))
    assert _share(only_success, RED) < 1e-4
    with pytest.raises(ValueError):
        recap_plots.plot_value_episodes([], tmp_path / "x.png")


def test_advantage_histogram_marks_the_positive_side(tmp_path):
    adv = np.random.default_rng(1).normal(size=2000)
    low = _share(_pixels(recap_plots.plot_advantage_histogram(adv, 1.5, tmp_path / "a.png")), GREEN)
    high = _share(_pixels(recap_plots.plot_advantage_histogram(adv, -1.5, tmp_path / "b.png")), GREEN)
    assert 0 < low < high  # more frames above a lower threshold: more green
    assert _share(_pixels(recap_plots.plot_advantage_histogram([0.0, 0.0], 0.0, tmp_path / "c.png")), GREEN) > 0
    with pytest.raises(ValueError):
        recap_plots.plot_advantage_histogram([float("nan")], 0.0, tmp_path / "d.png")


def test_training_curves_from_metrics_jsonl(tmp_path):
    log = tmp_path / "value/metrics.jsonl"
    log.parent.mkdir()
    records = [{"step": s, "split": "train", "time": 0.0, "metrics": {"loss": 1 / s, "lr": 1e-3}} for s in range(1, 30)]
    log.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"step": 30, "spl')  # a torn last line
    out = plots.plot_training_curves({"value": log, "policy": tmp_path / "absent.jsonl"}, tmp_path / "curves.png")
    image = _pixels(out)
    assert image.shape[0] > 500  # one panel per stage
    blue = np.array([0x09, 0x69, 0xDA]) / 255
    assert _share(image, blue) > 0.0005
    with pytest.raises(ValueError):
        plots.plot_training_curves({}, tmp_path / "none.png")


def _demo_like_logs() -> dict[str, list[dict]]:
    """What a demo's value folds and policy modes log: many scalars of very different scales, eval per dataset."""
    logs = {}
    for k, run in enumerate(("model_0", "model_1")):
        recs = []
        for step in range(10, 110, 10):
            train = {"loss": 5 - step / 50 - k / 10, "value_error": 0.3 - step / 1000, "grad_norm": 6.0 - step / 40}
            train |= {"samples_per_s": 500.0 + step, "lr_factor": 1.0, "skipped_steps": 0}
            recs.append({"step": step, "split": "train", "metrics": train})
            recs.append({"step": step, "split": "checkpoint", "metrics": {"save_s": 1.5}})
            if step % 50 == 0:
                ev = {"loss": 5.1 - step / 60, "value_spearman": step / 200, "num_frames": 200}
                ev |= {f"{d}.heldout/{m}": v for d in ("sft", "rollout") for m, v in ev.items()}
                recs.append({"step": step, "split": "eval", "metrics": ev})
        logs[f"value/{run}"] = recs
    for mode in ("recap", "bc", "filtered_bc"):
        logs[f"policy/{mode}"] = [
            {"step": s, "split": "train", "metrics": {"loss": 2 - s / 100, "grad_norm": 2.0, "samples_per_s": 600.0}}
            for s in range(10, 60, 10)
        ]
    return logs


def test_training_curves_one_panel_per_stage_and_metric_with_the_legend_beside(tmp_path):
    """The demo's logs (40-odd scalars per fold) give one row per stage, one panel per metric family with a few
    lines each (a colour per fold / mode, train solid, eval dashed), and each row's legend in its own column."""
    fig = plots.training_curves_figure(_demo_like_logs())
    curves = [ax for ax in fig.axes if ax.lines]
    titles = [ax.get_title() for ax in curves]
    assert titles == [
        "value: loss",
        "value: value error",
        "value: value spearman",
        "value: grad norm",
        "policy: loss",
        "policy: grad norm",
    ]
    assert all(ax.get_legend() is None for ax in curves)  # no legend over a curve
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    assert [[t.get_text() for t in lg.get_texts()] for lg in legends] == [
        ["model_0", "model_1", "eval", "train"],
        ["recap", "bc", "filtered_bc", "train"],
    ]
    assert all(not ax.axison and not ax.lines for ax in fig.axes if ax.get_legend() is not None)
    loss = curves[0]
    assert len(loss.lines) == 4  # 2 folds x (train, eval): the per-dataset evals are left to the overall one
    assert sorted(line.get_linestyle() for line in loss.lines) == ["-", "-", "--", "--"]
    assert len({line.get_color() for line in loss.lines}) == 2
    out = plots.plot_training_curves(_demo_like_logs(), tmp_path / "curves.png")
    image = _pixels(out)
    assert 1100 <= image.shape[1] <= 1400 and image.shape[0] <= 600  # legible at the report's 1100 px
    purple = np.array([0x82, 0x50, 0xDF]) / 255  # the second fold / mode
    assert _share(image, purple) > 0.0005
    only = plots.training_curves_figure(_demo_like_logs(), metrics=["value_spearman"])
    assert [ax.get_title() for ax in only.axes if ax.lines] == ["value: value spearman"]


def test_success_rates_per_task_and_guidance_scale(tmp_path):
    doc = make_evidence(recap=(38, 40), bc=(20, 40))
    other = make_evidence(recap=(30, 40))
    other["policy"] = {**other["policy"], "label": "recap cfg=3", "guidance_scale": 3.0}
    other["baselines"] = []
    out = plots.plot_success_rates([doc, other], tmp_path / "plots/success_rates.png")
    image = _pixels(out)
    for colour in ("#0969da", "#8250df", "#bf8700"):  # three bars per group: recap, bc, recap cfg=3
        rgb = np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)]) / 255
        assert _share(image, rgb) > 0.005, colour
    assert out.read_bytes() == plots.plot_success_rates([doc, other], tmp_path / "again.png").read_bytes()


def test_pick_episodes_takes_successes_and_failures_in_frame_order():
    episode_index = [0, 0, 0, 1, 1, 2, 2, 2, 3]
    values = [0.1, 0.2, 0.3, -1.0, -0.9, 0.5, 0.6, 0.7, -0.5]
    traces = recap_plots.pick_episodes(
        episode_index, values, {0: True, 1: False, 2: True, 3: False}, returns=[9.0] * 9, per_outcome=1
    )
    assert [(t.label, t.success, list(t.values)) for t in traces] == [
        ("episode 0", True, [0.1, 0.2, 0.3]),
        ("episode 1", False, [-1.0, -0.9]),
    ]
    assert list(traces[0].returns) == [9.0, 9.0, 9.0]
    assert len(recap_plots.pick_episodes(episode_index, values, {0: True, 1: False, 2: True, 3: False})) == 4
    with pytest.raises(ValueError):
        recap_plots.pick_episodes([0, 1], [0.1], {0: True})


def test_per_task_thresholds_use_the_stage_labels(tmp_path):
    adv = np.random.default_rng(2).normal(size=400)
    labels = adv >= np.where(np.arange(400) % 2 == 0, 0.0, 1.0)
    out = recap_plots.plot_advantage_histogram(
        adv, {"pick": 0.0, "push": 1.0}, tmp_path / "per_task.png", positive=labels.tolist()
    )
    assert _share(_pixels(out), GREEN) > 0.001
    with pytest.raises(ValueError, match="labels"):
        recap_plots.plot_advantage_histogram(adv, {"pick": 0.0, "push": 1.0}, tmp_path / "x.png")


def test_forced_positive_frames_are_drawn_apart_from_the_threshold_side(tmp_path):
    """No bar in the threshold-side green sits left of the dashed threshold: forced positives get their own shade."""
    adv = np.linspace(-1, 1, 400)
    positive = adv >= 0.5
    positive[:100] = True  # forced positive far below the threshold (sft / hold labels)
    image = _pixels(recap_plots.plot_advantage_histogram(adv, 0.5, tmp_path / "forced.png", positive=list(positive)))
    light = np.array([0xA5, 0xD6, 0xA7]) / 255
    assert _share(image, light, tol=0.03) > 0.001
    bars = image[int(0.80 * image.shape[0]) : int(0.86 * image.shape[0])]  # a strip just above the x axis
    green_cols = np.where(np.any(np.all(np.abs(bars - GREEN) < 0.06, axis=-1), axis=0))[0]
    light_cols = np.where(np.any(np.all(np.abs(bars - light) < 0.03, axis=-1), axis=0))[0]
    assert light_cols.min() < green_cols.min()  # forced frames sit left; threshold-side green only to the right
    plain = _pixels(recap_plots.plot_advantage_histogram(adv, 0.5, tmp_path / "plain.png", positive=list(adv >= 0.5)))
    assert _share(plain, light, tol=0.03) < 1e-4


def test_a_nearly_flat_bounded_panel_keeps_a_least_span(tmp_path):
    records = [{"step": s, "split": "eval", "metrics": {"value_spearman": 0.42 + 0.003 * (s == 2)}} for s in (1, 2)]
    fig = plots.training_curves_figure({"value": records})
    lo, hi = fig.axes[0].get_ylim()
    assert hi - lo == pytest.approx(0.2) and lo < 0.42 < 0.423 < hi


@pytest.mark.parametrize("family,span", [("success_at_end", 0.2), ("rollout_success", 0.2), ("loss", 1.0)])
def test_a_constant_zero_panel_gets_a_readable_axis(family, span):
    """audit55 I3: a GRPO quick demo's all-zero success was drawn on a +-2.5e-14 axis labelled "1e-14"."""
    records = [{"step": s, "split": "train", "metrics": {family: 0.0}} for s in (1, 2, 3)]
    fig = plots.training_curves_figure({"rl": records}, metrics=[family])
    ax = fig.axes[0]
    lo, hi = ax.get_ylim()
    assert hi - lo == pytest.approx(span) and lo < 0 < hi
    if span == 0.2:  # a rate's window stays within [0, 1] but for a sliver (audit55 review)
        assert lo == pytest.approx(-0.02)
    fig.canvas.draw()
    assert ax.yaxis.get_offset_text().get_text() == ""  # no "1e-14" multiplier above the axis


def test_success_bars_carry_wilson_intervals(tmp_path):
    from matplotlib.image import imread  # noqa: F401 (matplotlib is needed to draw)

    doc = make_evidence(recap=(40, 40), bc=(0, 40))  # a standard error is 0 at 0/n and n/n; Wilson's is not
    fig_path = plots.plot_success_rates(doc, tmp_path / "s.png")
    assert fig_path.stat().st_size > 10_000
    from reproduction.run.stats import wilson

    assert wilson(40, 40)[0] < 1.0 and wilson(0, 40)[1] > 0.0


def test_report_lists_stages_in_pipeline_order(tmp_path):
    import re

    from reproduction.recipes.recap.report import write_run_report

    names = ["advantages", "compare", "eval", "policy", "returns", "value"]  # run.json's (sorted) order
    state = {"run_id": "r", "stages": {n: {"status": "succeeded", "seconds": 1.0} for n in names}}
    (tmp_path / "run.json").write_text(json.dumps(state, sort_keys=True))
    html = write_run_report(tmp_path).read_text()
    table = html[html.index('<table id="stages">') :]
    shown = re.findall(r"<tr><td>(\w+)</td>", table[: table.index("</table>")])
    assert shown == ["returns", "value", "advantages", "policy", "eval", "compare"]
