"""`portable demo --quick`: the embedded default end to end (CI's reduced demo), and a rerun that reuses it."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NEEDS = ("reproduction.sim.generate", "reproduction.sim.evaluate", "reproduction.recap.policy.task")


def _missing() -> list[str]:
    out = []
    for name in NEEDS:
        try:
            if importlib.util.find_spec(name) is None:
                out.append(name)
        except ModuleNotFoundError:
            out.append(name)
    return out


pytestmark = pytest.mark.skipif(bool(_missing()), reason=f"the demo needs {', '.join(_missing())}")


def portable(*args: str, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled"}
    return subprocess.run(
        [sys.executable, "-m", "reproduction.portable", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO,
    )


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_quick_demo_runs_every_stage_and_a_rerun_reuses_it(tmp_path):
    out = tmp_path / "demo"
    t0 = time.perf_counter()
    proc = portable("demo", "--quick", "--output", str(out), timeout=1400)
    first = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = out / "run"
    assert proc.stdout.strip().splitlines()[-1] == str(run)
    print(proc.stderr[-2500:])
    print(f"quick demo: {first:.0f} s (shared 2 cores)")
    state = json.loads((run / "run.json").read_text())
    stages = state["stages"]
    assert set(stages) == {"returns", "value", "advantages", "policy", "eval"}
    assert all(s["status"] == "complete" for s in stages.values())
    assert "world_size" not in stages["value"]["key_parts"]["config"]["value.train"]  # exempt from the key
    assert state["config"]["value"]["train"]["world_size"] == 2  # CI exercises world size 2
    assert state["config"]["value"]["infer"]["workers"] == 2
    evidence = json.loads(next((run / "evidence").glob("eval_policy_*.json")).read_text())
    labels = {evidence["policy"]["label"], *(b["policy"]["label"] for b in evidence["baselines"])}
    assert labels == {"recap w=1", "recap w=2", "bc", "filtered_bc"}
    assert evidence["metrics"]["success_at_end"]["episodes"] == 4
    for name in ("returns", "value", "advantages", "policy", "eval"):
        assert (run / "lineage" / f"{name}.intoto.json").is_file() or not _has_lineage()
    for line in ("run: eval", "demo (total)", f"lineage:    {run / 'lineage'}", f"report:     {run / 'report.html'}"):
        assert line in proc.stderr
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

    t0 = time.perf_counter()
    again = portable("demo", "--quick", "--output", str(out), timeout=600)
    second = time.perf_counter() - t0
    assert again.returncode == 0, again.stderr[-3000:]
    print(f"rerun: {second:.0f} s")
    for name in ("generate", "pack"):
        assert f"demo: {name}: reused" in again.stderr
    table = [ln for ln in again.stderr.splitlines() if ln.startswith("run: ")]
    assert len(table) == 5 and all("skipped" in ln for ln in table), table
    assert json.loads((run / "run.json").read_text())["stages"]["policy"] == stages["policy"]


def _has_lineage() -> bool:
    return importlib.util.find_spec("reproduction.run.lineage") is not None
