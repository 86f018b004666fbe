"""No planted token leaks into anything a run writes: a full `portable demo --quick` (generate, pack, restore,
check, the five stages, evaluation, plots, report) run with tokens in the environment (the session's quick demo,
conftest.py, which tests/test_run_demo.py also checks and reruns), then `portable run`
with a token in a config override and in a config file's environment interpolation; every file both
write is scanned with secrets.find_secret.

Planted (tests/planted.py): an HF-shaped token in HF_TOKEN and HUGGING_FACE_HUB_TOKEN (redacted by shape and by
value), a plain secret in a credential-named variable (RECAP_UPLOAD_TOKEN: redacted by value only), and the
Ray client address carrying a credential (ray_address=ray://<RAY_AUTH_TOKEN's value>@...: set on the
command line and through ${oc.env:...} in a config file; stage 1 needs no Ray, so it is only recorded).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from evidence_fixtures import validate_run_folder
from planted import PLANTED, RAY, planted_env

from reproduction.run.lineage import path_sha256
from reproduction.run.secrets import find_secret


def portable(*args: str, timeout: float, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "reproduction.portable", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=planted_env(),
        cwd=cwd,
    )


def _leaks(root: Path) -> list[str]:
    return [f"{token[:6]}... in {finding}" for token in PLANTED for finding in find_secret(root, token)]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_no_planted_token_in_any_file_a_demo_and_a_run_write(quick_demo, tmp_path):
    out, proc, _ = quick_demo  # the session's quick demo (conftest.py), run with the tokens planted
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
        proc = portable(
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
