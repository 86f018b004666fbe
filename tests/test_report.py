"""report.html: self-contained, autoescaped, and rendered by headless Chromium (DOM and screenshot inspected)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from evidence_fixtures import PICK, PUSH, make_evidence, make_run

from reproduction.recipes.recap import plots as recap_plots
from reproduction.run import plots
from reproduction.run.evidence import compare_evidence
from reproduction.run.lineage_check import lineage_chain
from reproduction.run.report import StageSummary, render_report_html, write_report

EVIL_TASK = 'stack <script>alert("x")</script> & "quote" it'
CHROMIUM_NAMES = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome", "headless_shell")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)


class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def _parse(html: str) -> _Collect:
    parser = _Collect()
    parser.feed(html)
    return parser


@pytest.fixture
def report(tmp_path) -> Path:
    """A full report of a synthetic run: 4 plots, a comparison with one policy that differs, the lineage chain."""
    fake = make_run(tmp_path)
    evidence = json.loads(fake.evidence.read_text())
    evidence["tasks"][EVIL_TASK] = evidence["tasks"].pop(PICK)
    reference = make_evidence(name="reference", recap=(38, 40), bc=(39, 40))
    reference["tasks"][EVIL_TASK] = reference["tasks"].pop(PICK)
    # A declared margin wide enough for 40 episodes on RECAP's overall rates only, so the page shows all
    # three verdicts: 2 rows reproduced, RECAP's 4 per-task rows inconclusive (their own margin 0.05: a
    # "recap/<metric>" margin covers the policy's task rows too since audit63 C F1), BC's 6 differ.
    reference["margins"] = {"recap/success_once": 0.2, "recap/success_at_end": 0.2} | {
        f"recap/{task}/{metric}": 0.05 for task in (EVIL_TASK, PUSH) for metric in ("success_once", "success_at_end")
    }
    comparison = compare_evidence(evidence, reference)
    assert [r.verdict for r in comparison.rows].count("reproduced") == 2
    assert [r.verdict for r in comparison.rows].count("inconclusive") == 4
    rng = np.random.default_rng(0)
    folder = fake.run / "plots"
    figures = {
        "Value along episodes": recap_plots.plot_value_episodes(
            [
                recap_plots.EpisodeTrace(values=np.linspace(-1, 0, 30), success=True),
                recap_plots.EpisodeTrace(values=np.full(30, -0.8), success=False),
            ],
            folder / "value_episodes.png",
        ),
        "Advantages": recap_plots.plot_advantage_histogram(rng.normal(size=500), 0.5, folder / "advantages.png"),
        "Training curves": plots.plot_training_curves(
            {"value": [{"step": s, "split": "train", "metrics": {"loss": 1 / s}} for s in range(1, 20)]},
            folder / "training_curves.png",
        ),
        "Success rates": plots.plot_success_rates(evidence, folder / "success_rates.png"),
    }
    return write_report(
        fake.run / "report.html",
        title="RECAP demo <run>",
        run_id="run-test",
        run_dir=fake.run,
        evidence=evidence,
        comparison=comparison,
        stages=[StageSummary(name="returns", status="ran", seconds=1.25), StageSummary(name="value", status="skipped")],
        plots=figures,
        chain=lineage_chain(fake.run),
    )


def test_report_is_self_contained_and_escaped(report):
    html = report.read_text()
    page = _parse(html)
    images = [attrs for tag, attrs in page.tags if tag == "img"]
    assert len(images) == 4 and all(a["src"].startswith("data:image/png;base64,") for a in images)
    assert [a["alt"] for a in images] == ["Value along episodes", "Advantages", "Training curves", "Success rates"]
    # Nothing the page would fetch: no scripts, stylesheets, frames or remote URLs.
    assert not [t for t, a in page.tags if t in ("script", "link", "iframe", "object", "embed")]
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", html)
    # Autoescaped: the task name and the title show as text, never as markup.
    assert "<script>alert" not in html and "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in html
    assert "RECAP demo &lt;run&gt;" in html
    text = " ".join(page.text)
    assert "95.0% (38/40)" in text and "50.0% (20/40)" in text and "1.2 s" in text
    assert "Differs: 6 of 12 metrics" in text
    # The lineage names every mode's policy output and the starting weights.
    outputs = re.findall(r'<li class="output"[^>]*>= output <span class="label">([^<]+)</span> (\S+) ', html)
    assert outputs == [(m, f"policy/{m}/export") for m in ("recap", "bc", "filtered_bc")]
    assert "3 model exports: recap, bc, filtered_bc" in text
    assert "weights_manifest/policy_tiny.json" in text and "weights/value-tiny/model.safetensors" in text
    assert text.count("starting weights, in bundle.json") == 4


def test_report_without_evaluation_or_lineage_still_renders():
    html = render_report_html(title="empty", run_id="r")
    assert "No evaluation in this run." in html and "No lineage recorded." in html


def _chromium() -> str | None:
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def _run_chromium(exe: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    profile.mkdir(parents=True, exist_ok=False)  # a new, empty profile each time
    return subprocess.run(
        [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


# Injected into a copy of the report only: records what the browser made of the page.
PROBE = """<script>
window.__alerts = 0; window.alert = function () { window.__alerts += 1; };
window.addEventListener("load", function () {
  var imgs = Array.prototype.slice.call(document.images), b = document.body;
  b.setAttribute("data-images", imgs.length);
  b.setAttribute("data-decoded", imgs.filter(function (i) { return i.complete && i.naturalWidth > 300; }).length);
  b.setAttribute("data-overflow", document.documentElement.scrollWidth > window.innerWidth ? "yes" : "no");
  b.setAttribute("data-alerts", window.__alerts);
  b.setAttribute("data-verdicts", document.querySelectorAll("#comparison .verdict").length);
  b.setAttribute("data-chain", document.querySelectorAll("#chain li").length);
});
</script>"""


@pytest.mark.slow  # two Chromium starts: 7-13 s on the shared 2 cores
def test_chromium_renders_the_report(report, tmp_path):
    exe = _chromium()
    if exe is None:
        pytest.skip(
            "no Chromium found (looked for " + ", ".join(CHROMIUM_NAMES) + "); "
            "install it with: apt-get update && apt-get install -y chromium-headless-shell"
        )
    probe = report.with_name("report_probe.html")
    probe.write_text(report.read_text().replace("<head>", "<head>\n" + PROBE, 1))
    done = _run_chromium(
        exe, tmp_path / "p1", "--window-size=1024,800", "--virtual-time-budget=5000", "--dump-dom", probe.as_uri()
    )
    assert done.returncode == 0, done.stderr[-2000:]
    body = re.search(r"<body([^>]*)>", done.stdout)
    assert body, done.stdout[:2000]
    attrs = dict(re.findall(r'data-([a-z]+)="([^"]*)"', body.group(1)))
    # chain: 11 stage and input lines, the 4 starting weights (value's and policy's manifest and file) and the
    # policy's 3 mode exports listed by name.
    assert attrs == {"images": "4", "decoded": "4", "overflow": "no", "alerts": "0", "verdicts": "12", "chain": "18"}
    assert "Differs: 6 of 12 metrics" in done.stdout

    shot = tmp_path / "report.png"
    done = _run_chromium(exe, tmp_path / "p2", "--window-size=1280,3600", f"--screenshot={shot}", report.as_uri())
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    from matplotlib.image import imread

    image = imread(shot)[..., :3]
    assert image.shape[:2] == (3600, 1280)

    def share(hex_colour: str, tol: float = 0.03) -> float:
        rgb = np.array([int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)]) / 255
        return float(np.mean(np.all(np.abs(image - rgb) < tol, axis=-1)))

    assert share("#ffebe9") > 0.002  # the red "differs" banner and verdict cells
    assert share("#dafbe1") > 0.0003  # green "reproduced" verdict cells
    assert share("#fff8c5") > 0.0006  # yellow "inconclusive" verdict cells
    assert share("#1a7f37", 0.06) > 0.0005  # the plots' success green (images decoded and painted)
    assert share("#ffffff") < 0.95  # not a blank page
    rows_with_ink = np.mean(np.any(image < 0.5, axis=(1, 2)))
    assert rows_with_ink > 0.4  # content runs down most of the page, not just a header


def test_run_report_collects_what_the_run_folder_holds(tmp_path):
    from reproduction.run.evidence import Comparison, write_comparison
    from reproduction.run.report import write_run_report

    fake = make_run(tmp_path)
    evidence = json.loads(fake.evidence.read_text())
    comparison = compare_evidence(evidence, make_evidence(name="reference"))
    write_comparison(fake.run / "evidence/comparison.json", comparison)
    assert Comparison.from_dict(comparison.to_dict()).to_dict() == comparison.to_dict()
    plots.plot_success_rates(evidence, fake.run / "plots/success_rates.png")
    recap_plots.plot_advantage_histogram([0.1, 0.5, 0.9], 0.5, fake.run / "plots/advantages.png")
    out = write_run_report(fake.run, title="run", run_id="run-test", stages=[StageSummary(name="eval", status="ran")])
    page = _parse(out.read_text())
    alts = [a["alt"] for t, a in page.tags if t == "img"]
    assert alts[0].startswith("Success rate per task") and alts[1].startswith("Advantages")
    text = " ".join(page.text)
    assert "Inconclusive: 12 of 12 metrics" in text and "bundle_manifest" in text and "eval" in text
    empty = tmp_path / "empty_run"
    empty.mkdir()
    html = write_run_report(empty, title="nothing yet", run_id="r").read_text()
    assert "No evaluation in this run." in html and "No lineage recorded." in html
