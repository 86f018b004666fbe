"""`portable demo --quick`: the embedded default end to end (CI's reduced demo), a rerun that reuses it, a rerun
after the reference evidence changed that only recompares; and no planted token in any file the demo and two runs
wrote (scanned with secrets.find_secret), nor in what they printed.

One quick demo (~100 s on 2 cores) serves every test here (the module's `quick_demo`, run with the tokens planted
in its environment), then `portable run` with a token in a config override and in a config file's environment
interpolation. Planted: an HF-shaped token in HF_TOKEN and HUGGING_FACE_HUB_TOKEN (redacted by shape and by
value), a plain secret in a credential-named variable (RECAP_UPLOAD_TOKEN: redacted by value only), and the
Ray client address carrying a credential (ray_address=ray://<RAY_AUTH_TOKEN's value>@...: set on the
command line and through ${oc.env:...} in a config file; stage 1 needs no Ray, so it is only recorded).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from evidence_fixtures import validate_run_folder

from reproduction.redaction import find_secret
from reproduction.run.lineage import path_sha256

REPO = Path(__file__).resolve().parent.parent
HF = "hf_PlantedFakeTokenAbCdEf0123456789xyz"
UPLOAD = "planted-upload-secret-42"
RAY = "planted-ray-secret-77"
PLANTED = (HF, UPLOAD, RAY)


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled"}


def _planted_env() -> dict[str, str]:
    return {
        **_env(),
        "HF_TOKEN": HF,
        "HUGGING_FACE_HUB_TOKEN": HF,
        "RECAP_UPLOAD_TOKEN": UPLOAD,
        "RAY_AUTH_TOKEN": RAY,
        "RAY_CLIENT_ADDRESS": f"ray://{RAY}@127.0.0.1:10001",
    }


@pytest.fixture(scope="module")
def quick_demo(tmp_path_factory):
    """The module's one `portable demo --quick`, run with the tokens planted; (its --output folder, the
    CompletedProcess, its seconds)."""
    root = tmp_path_factory.mktemp("quick-demo")
    out = root / "demo"
    t0 = time.perf_counter()
    proc = _planted_portable("demo", "--quick", "--output", str(out), timeout=1400, cwd=root)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out, proc, time.perf_counter() - t0


def _planted_portable(*args: str, timeout: float, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "reproduction.portable", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_planted_env(),
        cwd=cwd,
    )


def portable(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return _python("-m", "reproduction.portable", *args, timeout=timeout)


def _python(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(),
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
    the policy and then fail (exit 1: "... is not in the subpath of ..."); now it gives the demo run's evidence.

    The run folder starts as a copy of the demo run's: its returns and value records name this bundle and this
    config and no run folder, so they are recognised and skipped (~50 s of Ray training not redone), and
    `--restart-stage advantages` runs the value inference on 2 Ray workers, trains the policy (where the crash
    was), evaluates and compares afresh in the relative folder. tests/test_run_paths.py runs every stage fresh
    from a relative --output on a smaller, Ray-free pipeline."""
    elsewhere = tmp_path / "another dir ü"
    elsewhere.mkdir()
    shutil.copy(restored / "config" / "run.yaml", elsewhere / "my run ü.yaml")
    reference = sorted((restored / "evidence").glob("*.json"))[0]
    run = elsewhere / "runs" / "quick run ü"
    shutil.copytree(demo_run, run)
    # written again by this run (or not there)
    for redone in ("advantages", "policy", "eval", "compare", "evidence", "plots", "report.html"):
        (shutil.rmtree if (run / redone).is_dir() else Path.unlink)(run / redone)
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
        "--restart-stage",
        "advantages",
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1200, env=env, cwd=elsewhere)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.split()[:2] == ["stage", "action"])  # print_report's table
    table = [ln.split()[:2] for ln in lines[at + 1 : at + 7]]
    assert table == [
        *([name, "skipped"] for name in ("returns", "value")),
        *([name, "ran"] for name in ("advantages", "policy", "eval", "compare")),
    ], proc.stderr[-3000:]
    assert json.loads((run / "run.json").read_text())["stages"]["eval"]["status"] == "complete"
    assert _evidence_without_run_fields(run) == _evidence_without_run_fields(demo_run)
    html = (run / "report.html").read_text()  # `portable run` writes the recipe's report (Recipe.report)
    assert "RECAP run" in html and "recap w=1" in html and (run / "plots" / "success_rates.png").is_file()


def _leaks(root: Path) -> list[str]:
    return [f"{token[:6]}... in {finding}" for token in PLANTED for finding in find_secret(root, token)]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_no_planted_token_in_any_file_a_demo_and_a_run_write(quick_demo, tmp_path):
    out, proc, _ = quick_demo  # run with the tokens planted; the test above has rerun it since
    run = out / "run"
    for must in ("run.json", "report.html", "check.json", "evidence", "lineage/eval.intoto.json"):
        assert (run / must).exists() or (out / must).exists(), must
    assert not any(token in proc.stdout + proc.stderr for token in PLANTED)
    counts = validate_run_folder(run)  # every evidence and lineage file against evidence/*.schema.json
    stages = json.loads((run / "run.json").read_text())["stages"]
    assert counts["evaluation"] >= 1 and counts["lineage"] == len(stages) >= 5, counts
    doc = json.loads(next((run / "evidence").glob("eval_policy_*.json")).read_text())
    for entry in (doc, *doc["baselines"]):
        assert entry["policy"]["checkpoint"]["sha256"] == path_sha256(run / entry["policy"]["checkpoint"]["path"])[0]

    # a token on the command line and one interpolated from the environment in a config file
    restored = out / "restored" / "recap-demo"
    extra = tmp_path / "extra.yaml"
    extra.write_text("ray_address: ${oc.env:RAY_CLIENT_ADDRESS}\n")
    runs = tmp_path / "runs"
    for name, args in (
        ("cli", [f"ray_address=ray://{RAY}@127.0.0.1:10001"]),
        ("file", ["--config", str(restored / "config" / "run.yaml"), "--config", str(extra)]),
    ):
        proc = _planted_portable(
            "run", str(restored), "--output", str(runs / name), "--stages", "returns", *args, timeout=300, cwd=tmp_path
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        state = json.loads((runs / name / "run.json").read_text())
        assert state["config"]["ray_address"] == "ray://<redacted>@127.0.0.1:10001"
        statement = json.loads((runs / name / "lineage" / "returns.intoto.json").read_text())
        params = statement["predicate"]["buildDefinition"]["externalParameters"]
        assert params["config"]["ray_address"] == "ray://<redacted>@127.0.0.1:10001"
        assert not any(token in proc.stdout + proc.stderr for token in PLANTED)
    leaks = _leaks(out) + _leaks(runs)
    assert not leaks, "planted tokens found:\n" + "\n".join(leaks)
    scanned = sum(1 for p in out.rglob("*") if p.is_file())
    print(f"scanned {scanned} files of the demo and {sum(1 for p in runs.rglob('*') if p.is_file())} of the runs")
