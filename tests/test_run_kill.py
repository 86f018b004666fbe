"""kill -9 `portable run` in every stage, then `--resume`: the evidence equals an uninterrupted run's (CPU, same seeds).

The smallest run that still has every stage: simulator datasets of 2 + 4 Fetch episodes (32 px), two
value folds and two policies (recap, bc) of 4 steps each, saving every 2 steps, 2 evaluation episodes
per policy. Kill points:
- deterministic, planted through the seam in tests/kill_points.py (a library function wrapped before
  `portable` runs): after a returns sidecar, inside a value DCP save (shards written, no manifest),
  inside a value export, between folds, after the values parquet, before the mixture config, half-way
  through policy_setup.json, inside a policy DCP save, between policies, inside a policy export, between
  evaluation batches, between evaluated policies, half-way through the evidence JSON;
- random moments inside the value, advantages, policy and eval stages.
The kills come in turn, as a run that keeps being killed meets them: each `portable run --resume` starts from
what the previous kill left and must reach the next point (and die there) before the last resume completes
the run. One pass costs one run plus a process start per kill, not a run per kill, and a resume that
recovered wrongly from any kill shows in the end; compared then: every stage's recorded outputs (sidecars,
value and policy exports, setups with the run folder written as RUN) and the evaluation evidence JSON
without its run id.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
pytest.importorskip("reproduction.sim.generate")
pytest.importorskip("reproduction.recap.policy.task")
from kill_points import POINTS  # noqa: E402

CONFIG = """\
datasets:
  - {path: "DATA/sft", type: sft}
  - {path: "DATA/rollout", type: rollout}
returns: {failure_reward: -50.0}
value:
  model: {preset: tiny, cameras: {base_0_rgb: observation.images.agentview}, folds: 2, augment: false,
          eval_max_samples: 32, eval_micro_batch: 32}
  train: {max_steps: 4, global_batch: 8, micro_batch: 8, world_size: 1, launcher: inprocess, device: cpu,
          save_interval: 2, log_interval: 2}
  infer: {batch_size: 128, workers: 1, device: cpu}
advantages: {lookahead: 5}
policy:
  modes: [recap, bc]
  model: {preset: tiny, chunk: 4, execute_steps: 2, num_steps: 2}
  train: {max_steps: 4, global_batch: 16, micro_batch: 16, launcher: inprocess, device: cpu, lr: 0.001,
          save_interval: 2, log_interval: 2}
eval:
  tasks: [FetchPickAndPlace-v4]
  episodes_per_task: 2
  seed: 100000
  guidance_scales: [1.0, 2.0]
  workers: 1
  videos: 0
"""
CHAIN = (
    "returns_sidecar",
    "value_dcp_save",
    "value_export",
    "value_second_fold",
    "advantages_values",
    "advantages_sidecar",
    "policy_setup",
    "policy_dcp_save",
    "policy_second_mode",
    "policy_export",
    "eval_episodes",
    "eval_second_policy",
    "eval_evidence_write",
)
"""Every point of POINTS in the order a run killed at the one before meets it: a resume after a kill inside the first
policy's save trains that policy again and saves three times before the second policy's first save (call 3), so
policy_second_mode comes before policy_export (then the second policy's export, the same code)."""
RANDOM_STAGES = ("value", "advantages", "policy", "eval")


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{REPO}{os.pathsep}{HERE}"}


def _cmd(cfg: Path, out: Path, *extra: str, point: str | None = None) -> list[str]:
    args = ["-q", "run", "--config", str(cfg), "--output", str(out), *extra]
    if point is None:
        return [sys.executable, "-m", "reproduction.portable", *args]
    return [sys.executable, str(HERE / "kill_points.py"), point, "--", *args]


def evidence_of(run: Path) -> dict:
    """What must not depend on a kill: each stage's output digests (files naming the run folder are compared with
    it written as RUN) and the evaluation evidence without its run id."""
    stages = json.loads((run / "run.json").read_text())["stages"]
    assert all(s["status"] == "complete" for s in stages.values()), {n: s["status"] for n, s in stages.items()}
    out = {n: {rel: v[2] for rel, v in s["outputs"].items()} for n, s in stages.items()}
    for name, rels in out.items():
        for rel in rels:
            path = run / name / rel
            if path.name in ("value_setup.json", "policy_setup.json"):
                rels[rel] = path.read_text().replace(str(run), "RUN")
            elif path.parent.name == "evidence":
                doc = json.loads(path.read_text())
                doc.pop("run_id")
                rels[rel] = doc
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Datasets, the config, a clean uninterrupted run and its stages' durations."""
    from reproduction.sim.generate import DataMix, generate_mix

    root = tmp_path_factory.mktemp("kill")
    generate_mix(
        DataMix(sft_episodes=2, rollout_episodes=4),
        root / "data",
        tasks=("FetchPickAndPlace-v4",),
        seed=0,
        cameras=("agentview",),
        image_size=32,
    )
    cfg = root / "run.yaml"
    cfg.write_text(CONFIG.replace("DATA", str(root / "data")))
    clean = subprocess.run(_cmd(cfg, root / "clean"), env=_env(), capture_output=True, text=True, timeout=900)
    assert clean.returncode == 0, clean.stderr[-3000:]
    stages = json.loads((root / "clean" / "run.json").read_text())["stages"]
    return cfg, root / "clean", {n: s["ended"] - s["started"] for n, s in stages.items()}


def _statuses(run: Path) -> dict[str, str]:
    state = json.loads((run / "run.json").read_text()) if (run / "run.json").is_file() else {"stages": {}}
    return {n: s["status"] for n, s in state["stages"].items()}


def _kill_inside(proc: subprocess.Popen, run: Path, stage: str, seconds: float) -> str:
    """Kill `seconds` after run.json first says `stage` is running in this process's run (a stage that completed
    meanwhile is past: the kill lands where the run is then)."""
    t0 = time.perf_counter()
    while proc.poll() is None and time.perf_counter() - t0 < 900:
        try:
            if json.loads((run / "run.json").read_text())["stages"][stage]["status"] == "running":
                break
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.01)
    try:
        proc.wait(timeout=seconds)
        return "finished first"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the run and any worker it started
        proc.wait(timeout=60)
        return "killed"


def _resume_completes(cfg: Path, run: Path, what: str) -> dict:
    done = subprocess.run(_cmd(cfg, run, "--resume"), env=_env(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"resume after {what} ({_statuses(run)}): {done.stderr[-3000:]}"
    return evidence_of(run)


@pytest.fixture(scope="module")
def reference(world):
    return evidence_of(world[1])


def test_the_chain_meets_every_kill_point_once_in_stage_order():
    order = ["returns", *RANDOM_STAGES]
    assert sorted(CHAIN) == sorted(POINTS)
    stages = [order.index(POINTS[p][0]) for p in CHAIN]
    assert stages == sorted(stages)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_kill_nine_at_every_point_in_turn_then_resume_gives_the_same_evidence(world, reference, tmp_path):
    cfg, run, met = world[0], tmp_path / "run", []
    for point in CHAIN:
        extra = ("--resume",) if (run / "run.json").is_file() else ()
        proc = subprocess.run(
            _cmd(cfg, run, *extra, point=point),
            env=_env(),
            capture_output=True,
            text=True,
            timeout=900,
            start_new_session=True,
        )
        assert proc.returncode == -signal.SIGKILL, (
            f"{point} was never reached after the kills at {met}: rc {proc.returncode}\n{proc.stderr[-3000:]}"
        )
        met.append(f"{point} {_statuses(run)}")
    got = _resume_completes(cfg, run, met[-1])
    for name in reference:
        assert got[name] == reference[name], f"after kills at {met}, stage {name} differs"
    assert got == reference
    # the "half" points leave a temp file as a killed atomic write does: --resume removes it
    assert not sorted(run.rglob(".*.portable-tmp")), "a killed write's temp file outlived --resume"


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_kill_nine_at_random_moments_in_each_stage_then_resume_gives_the_same_evidence(world, reference, tmp_path):
    cfg, run, seconds = world[0], tmp_path / "run", world[2]
    rng = random.Random(13)
    outcomes = []
    for stage in RANDOM_STAGES:
        fraction = round(rng.uniform(0.05, 0.95), 3)
        extra = ("--resume",) if (run / "run.json").is_file() else ()
        proc = subprocess.Popen(
            _cmd(cfg, run, *extra),
            env=_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        outcome = _kill_inside(proc, run, stage, fraction * seconds[stage])
        outcomes.append(f"{stage} at {fraction}: {outcome} {_statuses(run)}")
    assert sum("killed" in o for o in outcomes) >= 2, outcomes  # most moments fall inside the run
    got = _resume_completes(cfg, run, outcomes[-1])
    for name in reference:
        assert got[name] == reference[name], f"after kills {outcomes}, stage {name} differs"
    assert got == reference
    print("; ".join(outcomes))


@pytest.mark.slow
def test_the_evidence_pins_each_evaluated_export_by_its_digest_and_validates(world):
    import jsonschema

    from reproduction.run.lineage import path_sha256

    clean = world[1]
    doc = json.loads(next((clean / "evidence").glob("eval_policy_*.json")).read_text())
    schema = json.loads((REPO / "evidence" / "evaluation.schema.json").read_text())
    jsonschema.validate(doc, schema)
    for entry in (doc, *doc["baselines"]):
        ckpt = entry["policy"]["checkpoint"]
        assert ckpt["path"] == f"policy/{entry['policy']['mode']}/export"
        assert ckpt["sha256"] == path_sha256(clean / ckpt["path"])[0]
    lineage = json.loads((clean / "lineage" / "policy.intoto.json").read_text())
    subjects = {s["name"] for s in lineage["subject"]}
    assert "policy/recap/export/model.safetensors" in subjects


# -- changed inputs after a stage completed: detected and named (exit 52), for every stage ---------------


def _resume_refused(world, tmp_path, *overrides: str) -> str:
    cfg, clean = world[0], world[1]
    run = tmp_path / "run"
    if not run.exists():
        shutil.copytree(clean, run, symlinks=True)
    before = (run / "run.json").read_text()
    proc = subprocess.run(
        _cmd(cfg, run, "--resume", *overrides), env=_env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 52, proc.stderr[-3000:]
    assert (run / "run.json").read_text() == before  # nothing redone, nothing recorded
    return proc.stderr.splitlines()[0]


@pytest.mark.slow
@pytest.mark.parametrize(
    "override,line",
    [
        (
            "policy.train.lr=0.002",
            "stage policy: its inputs changed since it ran: config.policy.train.lr: 0.001 -> 0.002",
        ),
        (
            "policy.model.chunk=5",
            "stage policy: its inputs changed since it ran: config.policy.model.chunk: 4 -> 5",
        ),
        (
            "eval.episodes_per_task=3",
            "stage eval: its inputs changed since it ran: config.eval.episodes_per_task: 2 -> 3",
        ),
        (
            "eval.guidance_scales=[1.0,3.0]",
            "stage eval: its inputs changed since it ran: config.eval.guidance_scales: [1.0, 2.0] -> [1.0, 3.0]",
        ),
    ],
    ids=["policy.train.lr", "policy.model.chunk", "eval.episodes_per_task", "eval.guidance_scales"],
)
def test_a_changed_config_value_of_policy_or_eval_is_named(world, tmp_path, override, line):
    assert _resume_refused(world, tmp_path, override) == f"error: {line}"


@pytest.mark.slow
@pytest.mark.parametrize(
    "rel,named",
    [
        (
            "policy/bc/export/model_config.json",
            "stage policy: its outputs changed after it completed: bc/export/model_config.json was modified",
        ),
        (
            "evidence/eval_policy_4.json",
            "stage eval: its outputs changed after it completed: ../evidence/eval_policy_4.json was modified",
        ),
    ],
    ids=["policy export", "evidence"],
)
def test_an_edited_policy_export_or_evidence_file_is_named(world, tmp_path, rel, named):
    run = tmp_path / "run"
    shutil.copytree(world[1], run, symlinks=True)
    path = run / rel
    path.write_text(path.read_text().replace("\n", "\n ", 1))
    assert _resume_refused(world, tmp_path) == f"error: {named}"


@pytest.mark.slow
@pytest.mark.parametrize("column", ["is_success", "action"])
def test_an_edited_dataset_file_is_named(world, tmp_path, column):
    """A data parquet edited in place (same path, same config): a success flag (a key column of the data
    plane's fingerprint) or an action (only the content digest sees it) is named as the dataset's change."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = next((world[0].parent / "data" / "rollout").glob("data/*/*.parquet"))
    original, stat = data.read_bytes(), data.stat()
    try:
        table = pq.read_table(data)
        values = table.column(column).to_pylist()
        values[-1] = (not values[-1]) if column == "is_success" else [v + 0.5 for v in values[-1]]
        edited = pa.array(values, type=table.schema.field(column).type)
        pq.write_table(table.set_column(table.column_names.index(column), column, edited), data)
        first = _resume_refused(world, tmp_path)
        assert first.startswith("error: stage returns: its inputs changed since it ran: inputs.rollout: "), first
        assert "config." not in first and "inputs.sft" not in first
    finally:
        data.write_bytes(original)
        os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_the_content_digest_sees_every_byte_and_rehashes_only_changed_files(tmp_path, monkeypatch):
    from reproduction.digest_cache import DigestCache
    from reproduction.digests import sha256_file
    from reproduction.run.content import content_digest
    from reproduction.run.lineage import tree_sha256

    monkeypatch.setenv("PORTABLE_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "ds"
    (root / "data").mkdir(parents=True)
    (root / "data" / "a.parquet").write_bytes(b"a" * 100)
    (root / "meta.json").write_text("{}")
    hashed: list[Path] = []

    def fresh() -> DigestCache:  # a new process each time: only the cache on disk carries over
        return DigestCache(hasher=lambda p: hashed.append(p) or sha256_file(p))

    first = content_digest(root, fresh())
    assert first == tree_sha256(root) and len(hashed) == 2
    assert content_digest(root, fresh()) == first and len(hashed) == 2  # unchanged: a stat per file
    (root / "data" / "a.parquet").write_bytes(b"a" * 99 + b"b")
    assert content_digest(root, fresh()) != first and len(hashed) == 3
