"""The packed GRPO bundle (bundle/grpo.toml) through the real CLI: `portable pack` from the demo's sources,
`portable restore`, `portable run` of the quick grpo config from the restored bundle (lineage names the bundle
manifest and its source layer, as RECAP's does), and a restored file changed afterwards refused with `portable
verify`'s exit code (14 for a digest), as RECAP's runs refuse it (tests/test_run_bundle_inputs.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "bundle" / "grpo.toml"


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


def _sources(src: Path) -> None:
    """What `portable demo --recipe grpo --quick` generates under <output>/src: 3 push demonstrations, the source
    snapshot, the two run configs and the evidence README."""
    from reproduction.recipes.grpo.demo import _write_sources
    from reproduction.sim.generate import GenConfig, generate_dataset

    generate_dataset(
        GenConfig(kind="sft", tasks=("FetchPush-v4",), episodes_per_task=3, cameras=()), src / "data" / "sft"
    )
    _write_sources(src)


def test_pack_restore_and_run_the_quick_grpo_config_from_the_restored_bundle(tmp_path):
    src, bundle, run = tmp_path / "src", tmp_path / "grpo-bundle", tmp_path / "run"
    dry = portable("pack", str(SPEC), "--out", str(bundle), "--dry-run", cwd=tmp_path)
    assert dry.returncode == 3 and "portable demo --recipe grpo --quick" in dry.stdout + dry.stderr, dry.stderr
    _sources(src)
    assert (
        portable("pack", str(SPEC), "--root", str(src), "--out", str(bundle), "--dry-run", cwd=tmp_path).returncode == 0
    )
    packed = portable("pack", str(SPEC), "--root", str(src), "--out", str(bundle), "--json", cwd=tmp_path)
    assert packed.returncode == 0, packed.stderr
    doc = json.loads(packed.stdout)
    assert (doc["name"], doc["layers"]) == ("grpo-demo", 1)
    manifest = json.loads((bundle / "bundle.json").read_text())
    files = {f["path"] for f in manifest["files"]}
    assert {"config/run.yaml", "config/quick.yaml", "evidence/README.md"} <= files
    assert any(p.startswith("data/sft/data/") for p in files) and manifest["entry_config"] == "config/run.yaml"
    # without the restore, the run is refused: the source layer is not extracted (exit 57, as RECAP's)
    configs = ("--config", str(bundle / "config" / "run.yaml"), "--config", str(bundle / "config" / "quick.yaml"))
    # (quick.yaml's batch: these 150 SFT frames fill no run.yaml batch of 256, refused beside it: audit65_E M1)
    early = portable("run", str(bundle), *configs, "--output", str(tmp_path / "early"), cwd=tmp_path)
    assert early.returncode == 57, early.stderr

    restored = portable("restore", str(bundle), cwd=tmp_path)
    assert restored.returncode == 0, restored.stderr
    assert (bundle / "source" / "grpo-demo" / "reproduction" / "recipes" / "grpo" / "rollout.py").is_file()

    ran = portable("run", str(bundle), *configs, "--output", str(run), "--json", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert {s["stage"]: s["action"] for s in json.loads(ran.stdout)["stages"]} == dict.fromkeys(
        ("sft", "rl", "eval", "compare"), "ran"
    )
    state = json.loads((run / "run.json").read_text())
    assert state["recipe"] == "grpo" and state["stages"]["rl"]["step"] == 4  # quick.yaml's 4 steps
    assert state["config"]["sft"]["datasets"][0]["path"] == str(bundle / "data" / "sft")
    for stage in ("sft", "rl", "eval", "compare"):
        statement = json.loads((run / "lineage" / f"{stage}.intoto.json").read_text())
        deps = statement["predicate"]["buildDefinition"]["resolvedDependencies"]
        roles = {d["annotations"].get("role"): d for d in deps}
        assert {"bundle_manifest", "source"} <= set(roles), (stage, sorted(roles))
        assert roles["source"]["name"] == "source/grpo-demo.tar.zst"
    verify = portable("lineage", str(run), "--verify", cwd=tmp_path)
    assert verify.returncode == 0, verify.stderr

    # A restored file changed afterwards: the run stops before anything starts, with verify's code.
    data_file = next(p for p in sorted((bundle / "data" / "sft" / "data").rglob("*.parquet")))
    blob = bytearray(data_file.read_bytes())
    blob[40] ^= 1
    data_file.write_bytes(bytes(blob))
    refused = portable("run", str(bundle), *configs, "--output", str(tmp_path / "again"), cwd=tmp_path)
    assert refused.returncode == 14, refused.stderr
    rel = data_file.relative_to(bundle).as_posix()
    assert f"digest {rel}: expected sha256" in refused.stderr and "Traceback" not in refused.stderr
    assert not (tmp_path / "again").exists()  # nothing started, nothing written
    assert portable("verify", str(bundle), cwd=tmp_path).returncode == 14  # the code verify gives
