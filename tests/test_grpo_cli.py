"""The GRPO recipe through the real CLI: `portable run --config bundle/grpo/config.yaml` (the config says
`recipe: grpo`; the runner writes report.html with the grpo and sft rates), `--resume` (a no-op: the same evidence
bytes and report), `--target-step` (rl trains on), a reference (compare redone, eval not), `portable lineage
--verify`, and `portable eval --checkpoint STEP`."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "bundle" / "grpo" / "config.yaml"
TINY = [
    "sft.train.max_steps=20",
    "sft.train.global_batch=64",
    "sft.train.micro_batch=64",
    "rl.steps=2",
    "rl.init_states=2",
    "rl.micro_init_states=1",
    "rl.group_size=2",
    "rl.updates_per_rollout=1",
    "rl.eval_every=2",
    "rl.save_every=2",
    "rl.eval_episodes=1",
    "rl.rollout_workers=1",
    "eval.episodes_per_task=3",
]
"""A run of seconds: 20 BC steps, 2 GRPO steps of 2 init states x 2 rollouts, 3 held-out episodes per policy."""


def portable(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "reproduction.portable", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=cwd,
    )


def _digests(run: Path) -> dict[str, str]:
    files = [*(run / "evidence").glob("*.json"), *(run / "rl" / "evidence").glob("*.json"), run / "run.json"]
    return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(files)}


def _evidence_rates(path: Path) -> dict[str, tuple[str, str]]:
    """{policy label: (success once, success at end)} as the evidence displays them."""
    doc = json.loads(path.read_text())
    return {
        e["policy"]["label"]: (e["metrics"]["success_once"]["display"], e["metrics"]["success_at_end"]["display"])
        for e in (doc, *doc["baselines"])
    }


def _report_rates(run: Path) -> dict[str, tuple[str, str]]:
    """The same, read from report.html's summary table (the runner writes it after the stages: Recipe.report)."""
    html = (run / "report.html").read_text()
    assert "GRPO run" in html and html.count("data:image/png;base64,") == 2, html[:2000]
    assert sorted(p.name for p in (run / "plots").glob("*.png")) == ["success_rates.png", "training_curves.png"]
    summary = html.split('<table id="summary">', 1)[1].split("</table>", 1)[0]
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", row, re.S) for row in summary.split("<tr>")[2:]]
    return {r[0]: tuple(re.sub(r"\s*<span.*", "", r[i], flags=re.S).strip() for i in (3, 4)) for r in rows}


def _actions(proc: subprocess.CompletedProcess) -> dict[str, str]:
    assert proc.returncode == 0, proc.stderr
    return {s["stage"]: s["action"] for s in json.loads(proc.stdout)["stages"]}


def test_grpo_runs_resumes_and_trains_on_through_portable_run(tmp_path):
    from reproduction.sim.generate import GenConfig, generate_dataset

    bundle = tmp_path / "bundle"  # ${BUNDLE}: the config reads ${BUNDLE}/data/sft
    generate_dataset(
        GenConfig(kind="sft", tasks=("FetchPush-v4",), episodes_per_task=3, cameras=()), bundle / "data" / "sft"
    )
    run = tmp_path / "run"
    base = ("run", str(bundle), "--config", str(CONFIG), "--output", str(run), "--json")

    first = portable(*base, *TINY, cwd=tmp_path)
    assert _actions(first) == dict.fromkeys(("sft", "rl", "eval", "compare"), "ran")
    state = json.loads((run / "run.json").read_text())
    assert (state["recipe"], state["recipe_ref"], state["config"]["recipe"]) == ("grpo", "grpo", "grpo")
    assert state["stages"]["rl"]["step"] == 2 and state["stages"]["sft"]["step"] == 20
    doc = json.loads((run / "evidence" / "eval_grpo_2.json").read_text())
    assert doc["policy"]["label"] == "grpo" and doc["baselines"][0]["policy"]["label"] == "sft"
    assert doc["tasks"]["FetchPush-v4"]["episodes"] == 3
    assert (run / "rl" / "evidence" / "eval_rl_2.json").is_file()
    assert sorted(p.name for p in (run / "lineage").glob("*.intoto.json")) == [
        f"{n}.intoto.json" for n in ("compare", "eval", "rl", "sft")
    ]

    assert _report_rates(run) == _evidence_rates(run / "evidence" / "eval_grpo_2.json")  # the runner wrote it

    before = _digests(run)
    report = (run / "report.html").stat().st_mtime_ns
    again = portable(*base, "--resume", *TINY, cwd=tmp_path)
    assert _actions(again) == dict.fromkeys(("sft", "rl", "eval", "compare"), "skipped")
    assert _digests(run) == before  # nothing rewritten: the same evidence, the same run.json
    assert (run / "report.html").stat().st_mtime_ns == report  # and the same report

    on = portable(*base, "--resume", "--target-step", "4", *TINY, cwd=tmp_path)
    assert _actions(on) == {"sft": "skipped", "rl": "continued", "eval": "ran", "compare": "ran"}
    state = json.loads((run / "run.json").read_text())
    assert state["stages"]["rl"]["step"] == 4 and state["stages"]["rl"]["resumed_from"] == 2
    doc = json.loads((run / "evidence" / "eval_grpo_4.json").read_text())
    assert doc["policy"]["checkpoint"]["step"] == 4
    assert json.loads((run / "rl" / "evidence" / "eval_rl_4.json").read_text())["policy"]["checkpoint"]["step"] == 4
    assert _report_rates(run) == _evidence_rates(run / "evidence" / "eval_grpo_4.json")  # rewritten: step 4's

    # A reference: only the compare stage is redone (eval.reference is declared same_outputs() for eval).
    reference = tmp_path / "reference.json"
    shutil.copy(run / "evidence" / "eval_grpo_2.json", reference)
    compared = portable(*base, "--resume", *TINY, f"eval.reference={reference}", cwd=tmp_path)
    assert _actions(compared) == {"sft": "skipped", "rl": "skipped", "eval": "skipped", "compare": "ran"}
    record = json.loads((run / "compare" / "compare.json").read_text())
    assert record["verdict"] in ("reproduced", "differs", "inconclusive") and (run / record["comparison"]).is_file()

    verify = portable("lineage", str(run), "--verify", cwd=tmp_path)
    assert verify.returncode == 0, verify.stderr
    assert "lineage verified" in verify.stderr + verify.stdout

    # `portable eval --checkpoint STEP`: the rl export of that step against its sft baseline, beside the run's evidence.
    evaluated = portable("eval", "--checkpoint", "4", "--output", str(run), "eval.episodes_per_task=2", cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr
    doc = json.loads((run / "evidence" / "eval_checkpoint_4.json").read_text())
    assert (doc["policy"]["label"], doc["policy"]["checkpoint"]["step"]) == ("grpo", 4)
    assert doc["baselines"][0]["policy"]["label"] == "sft" and doc["tasks"]["FetchPush-v4"]["episodes"] == 2
    assert "evidence/eval_checkpoint_4.json" in evaluated.stderr
    wrong = portable("eval", "--checkpoint", "3", "--output", str(run), cwd=tmp_path)
    assert wrong.returncode == 50 and "only the last step is exported" in wrong.stderr, wrong.stderr
    again = portable(*base, "--resume", *TINY, f"eval.reference={reference}", cwd=tmp_path)
    assert set(_actions(again).values()) == {"skipped"}  # eval --checkpoint left the run's stages as they were


def test_the_grpo_demo_runs_from_scratch_and_reuses_its_run(tmp_path):
    """`portable demo --recipe grpo --quick`: demonstrations -> pack -> restore -> check -> sft -> rl -> eval ->
    compare, report.html; the run folder on stdout; a second call reuses everything; a folder another demo (or
    nothing) built is refused."""
    out = tmp_path / "demo"
    proc = portable("demo", "--recipe", "grpo", "--quick", "--output", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run = out / "run"
    assert proc.stdout.strip() == str(run)
    state = json.loads((run / "run.json").read_text())
    assert (
        state["recipe"] == "grpo"
        and [state["stages"][n]["status"] for n in ("sft", "rl", "eval", "compare")] == ["complete"] * 4
    )
    assert state["stages"]["rl"]["step"] == 4 and (run / "evidence" / "eval_grpo_4.json").is_file()
    html = (run / "report.html").read_text()
    assert "GRPO run" in html and html.count("data:image/png;base64,") == 2
    assert "grpo - sft, success at end, paired by reset seed:" in proc.stderr
    # RECAP's demo steps: pack bundle/grpo.toml, restore a copy, check it; the run reads the restored bundle
    for name in ("generate", "pack", "restore", "check"):
        assert f"\n{name} " in proc.stderr, name
    restored = out / "restored" / "grpo-demo"
    assert (out / "bundle" / "bundle.json").is_file() and (restored / "bundle.json").is_file()
    assert state["config"]["BUNDLE"] == str(restored)
    build = json.loads((run / "lineage" / "sft.intoto.json").read_text())["predicate"]["buildDefinition"]
    roles = {d["annotations"].get("role") for d in build["resolvedDependencies"]}
    assert {"bundle_manifest", "source", "dataset"} <= roles, roles

    again = portable("demo", "--recipe", "grpo", "--quick", "--output", str(out), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "generate          reused" in again.stderr and "pack              reused" in again.stderr
    assert all(f"run: {n}" in again.stderr for n in ("sft", "rl", "eval", "compare"))
    assert again.stderr.count(" skipped ") == 4, again.stderr

    other = tmp_path / "other"
    other.mkdir()
    (other / "file").write_text("x")
    refused = portable("demo", "--recipe", "grpo", "--quick", "--output", str(other), cwd=tmp_path)
    assert refused.returncode == 55 and "is not a GRPO demo folder" in refused.stderr, refused.stderr
    unknown = portable("demo", "--recipe", "nosuch", "--output", str(tmp_path / "n"), cwd=tmp_path)
    assert unknown.returncode == 2 and "--recipe 'nosuch' has no demo" in unknown.stderr
