"""`portable demo --quick`: the embedded default end to end (CI's reduced demo), a rerun that reuses it, and a
rerun after the reference evidence changed that only recompares."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def portable(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return _python("-m", "reproduction.portable", *args, timeout=timeout)


def _python(*args: str, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled"}
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO,
    )


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_quick_demo_runs_every_stage_and_a_rerun_reuses_it(quick_demo, tmp_path):
    out, proc, first = quick_demo
    run = out / "run"
    assert proc.stdout.strip().splitlines()[-1] == str(run)
    print(proc.stderr[-2500:])
    print(f"quick demo: {first:.0f} s (shared 2 cores)")
    state = json.loads((run / "run.json").read_text())
    stages = state["stages"]
    assert set(stages) == {"returns", "value", "advantages", "policy", "eval", "compare"}
    assert "reference" not in stages["eval"]["key_parts"]["config"]["eval"]  # the compare stage's input only
    assert stages["compare"]["summary"]["reference"].endswith("evidence/eval_policy_1000.json")
    assert all(s["status"] == "complete" for s in stages.values())
    assert "world_size" not in stages["value"]["key_parts"]["config"]["value.train"]  # exempt from the key
    assert state["config"]["value"]["train"]["world_size"] == 2  # CI exercises world size 2
    assert state["config"]["value"]["infer"]["workers"] == 2
    evidence = json.loads(next((run / "evidence").glob("eval_policy_*.json")).read_text())
    labels = {evidence["policy"]["label"], *(b["policy"]["label"] for b in evidence["baselines"])}
    assert labels == {"recap w=1", "recap w=2", "bc", "filtered_bc"}
    assert evidence["metrics"]["success_at_end"]["episodes"] == 4
    for name in ("returns", "value", "advantages", "policy", "eval", "compare"):
        assert (run / "lineage" / f"{name}.intoto.json").is_file()
    # edges by producing stage and path: the policy's copy of the tokenizer is not the value's
    from reproduction.run.lineage_check import lineage_chain, verify_lineage

    lines = [(depth, node.label) for depth, node in lineage_chain(run).lines()]
    assert lines[:3] == [(0, "compare"), (1, "eval"), (2, "policy")], lines
    at = lines.index((3, "advantages"))
    below = [
        label
        for depth, label in lines[at + 1 :][: next((i for i, (d, _) in enumerate(lines[at + 1 :]) if d <= 3), None)]
    ]
    assert "value" in below and "policy" not in below, lines
    assert verify_lineage(run).exit_code == 0
    statement = json.loads((run / "lineage" / "value.intoto.json").read_text())
    deps = statement["predicate"]["buildDefinition"]["resolvedDependencies"]
    roles = {d["annotations"].get("role") for d in deps}
    assert {"bundle_manifest", "source", "dataset", "upstream_output", "weights"} <= roles, roles  # code, start weights
    for line in ("run: eval", "demo (total)", f"lineage:    {run / 'lineage'}", f"report:     {run / 'report.html'}"):
        assert line in proc.stderr
    assert f"demo: plots and report: -> {run / 'report.html'}" in proc.stderr  # the runner wrote it
    assert "RECAP run" in (run / "report.html").read_text()
    restored = out / "restored" / "recap-demo"
    assert (restored / "bundle.json").is_file() and (restored / "data" / "rollout" / "meta" / "info.json").is_file()
    assert "${BUNDLE}/data/rollout" in (restored / "config" / "run.yaml").read_text()
    # the tiny weights travel in the bundle, pinned by their manifests, and both models start from them
    for rel in (
        "weights/value-tiny/model.safetensors",
        "weights/policy-tiny/model.safetensors",
        "LICENSES/Apache-2.0.txt",
    ):
        assert (restored / rel).is_file(), rel
    for section, name in (("value", "value_tiny"), ("policy", "policy_tiny")):
        manifest = state["config"][section]["model"]["pretrained_manifest"]
        assert manifest == str(restored.resolve() / "weights_manifest" / f"{name}.json"), manifest

    _relative_run_gives_the_same_evidence(tmp_path, restored, run)

    t0 = time.perf_counter()
    again = portable("demo", "--quick", "--output", str(out), timeout=600)
    second = time.perf_counter() - t0
    assert again.returncode == 0, again.stderr[-3000:]
    print(f"rerun: {second:.0f} s")
    for name in ("generate", "pack"):
        assert f"demo: {name}: reused" in again.stderr
    table = [ln for ln in again.stderr.splitlines() if ln.startswith("run: ")]
    assert len(table) == 6 and all("skipped" in ln for ln in table), table
    assert json.loads((run / "run.json").read_text())["stages"]["policy"] == stages["policy"]

    # The reference evidence changes (a new published run; here: this run's own evidence): the bundle is
    # packed and restored again, and the run reuses every stage and only recompares, now paired by reset seed.
    refs = tmp_path / "new_reference"
    refs.mkdir()
    (refs / "eval_policy_reference.json").write_bytes(next((run / "evidence").glob("eval_policy_*.json")).read_bytes())
    code = (
        "import sys; from pathlib import Path; from reproduction.recipes.recap.demo import run_demo; "
        "sys.exit(run_demo(Path(sys.argv[1]), quick=True, reference=Path(sys.argv[2])))"
    )
    third = _python("-c", code, str(out), str(refs), timeout=600)
    assert third.returncode == 0, third.stderr[-3000:]
    assert "demo: pack: reused" not in third.stderr  # the bundle now carries the new reference
    table = [ln for ln in third.stderr.splitlines() if ln.startswith("run: ")]
    assert [ln.split()[1:3] for ln in table] == [
        *([name, "skipped"] for name in ("returns", "value", "advantages", "policy", "eval")),
        ["compare", "ran"],
    ], table
    # Its own evidence as the reference: every episode pairs by reset seed with no discordant one, yet 4
    # episodes a task cannot show equivalence within 0.05 (Tango's 90% interval for 0 of 4 is +-0.40), so the
    # honest verdict is "inconclusive" with nothing differing; the table says so.
    assert "against the reference evidence: inconclusive (0 differ" in third.stderr
    assert "diff [90% interval]" in third.stderr and "(tango-paired)" in third.stderr
    after = json.loads((run / "run.json").read_text())["stages"]
    assert after["eval"] == stages["eval"] and after["compare"]["summary"]["verdict"].startswith("inconclusive")
    assert after["compare"]["summary"]["reference"].endswith("evidence/eval_policy_reference.json")
    cmp = json.loads((run / "evidence" / "comparison.json").read_text())
    rates = [r for r in cmp["rows"] if r["kind"] == "rate"]
    assert cmp["verdict"] == "inconclusive" and rates and all(r["method"] == "tango-paired" for r in rates)
    assert all(r["difference"] == 0 and "0 succeeded only in the reference, 0 only here" in r["note"] for r in rates)
    assert all(r["verdict"] == "reproduced" for r in cmp["rows"] if r["kind"] == "value")


def _evidence_without_run_fields(run: Path) -> dict:
    """The run's primary evaluation evidence with what names the run (its folder, id, time) taken out."""
    doc = json.loads(next((run / "evidence").glob("eval_policy_*.json")).read_text())
    doc = json.loads(json.dumps(doc).replace(json.dumps(str(run))[1:-1], "<RUN>"))
    for key in ("run_id", "created"):
        doc.pop(key, None)
    return doc


def _relative_run_gives_the_same_evidence(tmp_path: Path, restored: Path, demo_run: Path) -> None:
    """The README's `portable run BUNDLE --output runs/x --config FILE` on the quick demo's restored bundle, every
    path relative to another working directory whose name holds a space and a non-ASCII letter. It used to train
    and then fail (exit 1: "... is not in the subpath of ..."); now it gives the demo run's evidence."""
    elsewhere = tmp_path / "another dir ü"
    elsewhere.mkdir()
    shutil.copy(restored / "config" / "run.yaml", elsewhere / "my run ü.yaml")
    reference = sorted((restored / "evidence").glob("*.json"))[0]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled"}
    argv = [
        sys.executable,
        str(REPO / "reproduction" / "portable.py"),
        "run",
        os.path.relpath(restored, elsewhere),
        "--output",
        "runs/quick run ü",
        "--config",
        "my run ü.yaml",
        f"eval.reference={reference}",
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1200, env=env, cwd=elsewhere)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = elsewhere / "runs" / "quick run ü"
    assert json.loads((run / "run.json").read_text())["stages"]["eval"]["status"] == "complete"
    assert _evidence_without_run_fields(run) == _evidence_without_run_fields(demo_run)
    html = (run / "report.html").read_text()  # `portable run` writes the recipe's report (Recipe.report)
    assert "RECAP run" in html and "recap w=1" in html and (run / "plots" / "success_rates.png").is_file()
