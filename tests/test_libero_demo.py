"""`portable demo --world libero --quick`: the demo's LIBERO tier end to end (generate, pack, restore, check, the
four stages, LIBERO evaluation of the four policies, the comparison with the tier's reference, tier.json), and
its refusals. The end-to-end test needs the libero extra and is skipped without it; the refusals run anywhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reproduction.sim.libero._runtime import available

REPO = Path(__file__).resolve().parent.parent
NEEDS_LIBERO = pytest.mark.skipif(
    not available(), reason="LIBERO is not installed (the libero extra: pip install -e '.[libero]')"
)


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
@pytest.mark.timeout(600)
@NEEDS_LIBERO
def test_quick_libero_tier_runs_end_to_end_and_says_it_reads_privileged_state(tmp_path):
    out = tmp_path / "tier"
    t0 = time.perf_counter()
    proc = portable("demo", "--world", "libero", "--quick", "--output", str(out), timeout=500)
    took = time.perf_counter() - t0
    print(f"quick LIBERO tier: {took:.0f} s")
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = out / "run"
    assert proc.stdout.strip() == str(run)

    # the privileged-state note: in the summary, tier.json, the generated data's metadata and the evidence
    assert "PRIVILEGED STATE, NO IMAGES" in proc.stderr
    tier = json.loads((out / "tier.json").read_text())
    assert tier["note"].startswith("PRIVILEGED STATE, NO IMAGES") and tier["task"] == "libero_10/0"
    info = json.loads((out / "src" / "data" / "libero10_task0" / "sft" / "meta" / "info.json").read_text())
    assert info["generation"]["cameras"] is False
    assert "observation.object_state" in info["features"]
    assert not any(k.startswith("observation.images") for k in info["features"])
    readme = (out / "restored" / "recap-demo-libero" / "evidence" / "README.md").read_text()
    assert "PRIVILEGED STATE, NO IMAGES" in readme

    # every stage ran; the policies read the robot state and the chosen object-state components
    state = json.loads((run / "run.json").read_text())
    assert {n: s["status"] for n, s in state["stages"].items()} == dict.fromkeys(
        ("returns", "value", "advantages", "policy", "eval", "compare"), "complete"
    )
    meta = json.loads((run / "policy" / "recap" / "export" / "policy.json").read_text())
    assert meta["state_keys"] == ["observation.state", "observation.object_state"]
    assert len(meta["stats"]["state_mean"]) == len(meta["state_dims"]) == 26 and meta["cameras"] == {}

    # LIBERO evidence for BC, filtered BC, RECAP w=1 and w=2, camera-free and saying so
    (path,) = (run / "evidence").glob("eval_policy_*.json")
    doc = json.loads(path.read_text())
    assert doc["settings"]["simulator"] == "libero" and doc["settings"]["libero"]["cameras"] is False
    assert "privileged object state" in doc["settings"]["libero"]["observation"]
    assert set(tier["success"]) == {"bc", "filtered_bc", "recap w=1", "recap w=2"}
    assert all(r["episodes"] == 1 for r in tier["success"].values())
    assert doc["tasks"]["libero_10/0"]["outcomes"]["init_states"] == [0]

    # the comparison with the tier's reference (evidence/demo_libero/): a verdict, written as a file
    cmp_path = run / "evidence" / "comparison.json"
    assert cmp_path.is_file(), state["stages"]["compare"]["summary"]
    verdict = json.loads(cmp_path.read_text())["verdict"]
    assert verdict == "inconclusive"  # one init state cannot settle a 5-point margin; nothing differs
    assert "against the reference evidence: inconclusive (0 differ" in proc.stderr

    # the tier's own numbers: step times, stage 3's label quality, the mechanism by rollout mode
    steps = {s["step"] for s in tier["steps"]}
    assert {"generate", "pack", "restore", "check", "run: eval", "demo (total)"} <= steps
    assert "rollouts_train" in tier["label_quality"]
    assert set(tier["mechanism"]["by_mode"]) == {"expert", "detour", "noise", "drop"}
    assert tier["cpu_s"]["generate"] > 0

    # a rerun reuses every step
    again = portable("demo", "--world", "libero", "--quick", "--output", str(out), timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    after = json.loads((out / "tier.json").read_text())
    assert {s["step"]: s["result"] for s in after["steps"]}["generate"] == "reused"


def test_seed_is_refused_without_the_libero_world(tmp_path):
    proc = portable("demo", "--seed", "1", "--output", str(tmp_path / "x"), timeout=60)
    assert proc.returncode == 2  # an option another one needs: a usage error
    assert proc.stderr.splitlines()[0] == "error: --seed is an option of the LIBERO tier only"
    assert not (tmp_path / "x").exists()


def test_libero_tier_refuses_a_negative_seed_and_a_foreign_folder(tmp_path):
    from reproduction.errors import ConfigError, RunStateError
    from reproduction.recipes.recap.demo_libero import run_libero_demo

    with pytest.raises(ConfigError, match="--seed -1 must be >= 0"):
        run_libero_demo(tmp_path / "a", seed=-1)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "notes.txt").write_text("mine")
    if available():
        with pytest.raises(RunStateError, match="is not a demo folder"):
            run_libero_demo(tmp_path / "b")


def test_libero_tier_without_libero_names_the_extra_and_writes_nothing(tmp_path, monkeypatch):
    from reproduction.errors import MissingDependencyError
    from reproduction.recipes.recap import demo_libero
    from reproduction.sim.libero import _runtime

    monkeypatch.setattr(_runtime, "available", lambda: False)
    with pytest.raises(MissingDependencyError) as info:
        demo_libero.run_libero_demo(tmp_path / "out")
    assert info.value.exit_code == 10 and "pip install -e '.[libero]'" in info.value.hint
    assert not (tmp_path / "out").exists()


def test_a_second_tier_in_a_busy_folder_is_refused(tmp_path, monkeypatch):
    """Two tiers in one folder (e.g. --seed 1 while --seed 0 runs) would rebuild the bundle the first one reads."""
    import fcntl

    from reproduction.errors import RunStateError
    from reproduction.recipes.recap import demo_libero
    from reproduction.sim.libero import _runtime

    monkeypatch.setattr(_runtime, "available", lambda: True)
    out = tmp_path / "tier"
    out.mkdir()
    (out / "demo.json").write_text('{"quick": true, "world": "libero"}\n')
    with open(out / ".demo.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(RunStateError, match="another `portable demo` is running in"):
            demo_libero.run_libero_demo(out, quick=True, seed=1)
    assert sorted(p.name for p in out.iterdir()) == [".demo.lock", "demo.json"]


@NEEDS_LIBERO
def test_a_typo_in_a_tier_override_is_refused_before_any_work(tmp_path):
    """audit46 newcomer F19: the override is checked against the tier's run config before generate, pack, restore."""
    from reproduction.errors import ConfigError
    from reproduction.recipes.recap.demo_libero import run_libero_demo

    with pytest.raises(ConfigError, match=r"^command line: unknown config key `value.trian`$") as info:
        run_libero_demo(tmp_path / "out", quick=True, overrides=["value.trian.lr=1"])
    assert info.value.hint == "did you mean `value.train`?" and info.value.exit_code == 4
    assert not (tmp_path / "out").exists()
