"""User paths at the CLI boundary: a relative `--output` and `--config`, given from another working directory, in
folders whose names hold spaces and non-ASCII letters, give the evidence an absolute-path run gives.

Before the one normalisation (reproduction/fsio.py `user_path`, applied by run/cli.py `normalise_paths`), the
policy stage trained and then failed with "internal error: ValueError: ... is not in the subpath of ..." (exit 1):
the run folder stayed relative while the exports it derived were absolute. The pipeline is the smallest with every
stage (tests/test_run_kill.py's, one policy mode): simulator data of 2 + 4 episodes, 2 value folds, 2 steps each.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
pytest.importorskip("reproduction.sim.generate")
pytest.importorskip("reproduction.recap.policy.task")

CONFIG = """\
datasets:
  - {path: "DATA/sft", type: sft}
  - {path: "DATA/rollout", type: rollout}
returns: {failure_reward: -50.0}
value:
  model: {preset: tiny, cameras: {base_0_rgb: observation.images.agentview}, folds: 2, augment: false,
          eval_max_samples: 16, eval_micro_batch: 16}
  train: {max_steps: 2, global_batch: 8, micro_batch: 8, world_size: 1, launcher: inprocess, device: cpu,
          save_interval: 2, log_interval: 2}
  infer: {batch_size: 128, workers: 1, device: cpu}
advantages: {lookahead: 5}
policy:
  modes: [recap]
  model: {preset: tiny, chunk: 4, execute_steps: 2, num_steps: 2}
  train: {max_steps: 2, global_batch: 8, micro_batch: 8, launcher: inprocess, device: cpu, lr: 0.001,
          save_interval: 2, log_interval: 2}
eval:
  tasks: [FetchPickAndPlace-v4]
  episodes_per_task: 1
  seed: 100000
  guidance_scales: [1.0]
  workers: 1
  videos: 0
"""


def _portable(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled"}
    return subprocess.run(
        [sys.executable, "-m", "reproduction.portable", "-q", "run", *args],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=cwd,
    )


def evidence_of(run: Path) -> dict:
    """Each stage's output digests (setup files, which name the run folder, with it written as RUN) and the
    evaluation evidence without its run id: what must not depend on how the paths were written."""
    stages = json.loads((run / "run.json").read_text())["stages"]
    assert all(s["status"] == "complete" for s in stages.values()), {n: s["status"] for n, s in stages.items()}
    out = {n: {rel: v[2] for rel, v in s["outputs"].items()} for n, s in stages.items()}
    for name, rels in out.items():
        for rel in rels:
            path = run / name / rel
            if path.name in ("value_setup.json", "policy_setup.json"):
                text = json.dumps(json.loads(path.read_text()), ensure_ascii=False)  # the folder as written, unescaped
                rels[rel] = text.replace(str(run), "RUN")
            elif path.parent.name == "evidence":
                doc = json.loads(path.read_text())
                doc.pop("run_id")
                rels[rel] = doc
    return out


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_relative_output_and_config_from_another_folder_give_the_absolute_runs_evidence(tmp_path):
    from reproduction.sim.generate import DataMix, generate_mix

    root = tmp_path / "päths with spaces ü"
    data = root / "dätä set"
    generate_mix(
        DataMix(sft_episodes=2, rollout_episodes=4),
        data,
        tasks=("FetchPickAndPlace-v4",),
        seed=0,
        cameras=("agentview",),
        image_size=32,
    )
    (root / "cönfig dir").mkdir()
    cfg = root / "cönfig dir" / "run ä.yaml"
    cfg.write_text(CONFIG.replace("DATA", str(data)), encoding="utf-8")
    work = root / "wörk dir"
    work.mkdir()

    absolute = root / "äbs run"
    proc = _portable(REPO, "--config", str(cfg), "--output", str(absolute))
    assert proc.returncode == 0, proc.stderr[-3000:]

    relative = os.path.join("..", "rél runs", "run ü")  # from wörk dir: <root>/rél runs/run ü
    proc = _portable(work, "--config", os.path.join("..", "cönfig dir", "run ä.yaml"), "--output", relative)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = root / "rél runs" / "run ü"
    assert (run / "run.json").is_file() and not (work / "rél runs").exists()
    state = json.loads((run / "run.json").read_text())
    assert state["config"]["RUN"] == str(run.resolve())  # the run folder as an absolute path
    assert evidence_of(run) == evidence_of(absolute)

    # --resume with the relative forms again (from yet another folder): every stage is recognised and skipped
    proc = _portable(
        root,
        "--config",
        os.path.join("cönfig dir", "run ä.yaml"),
        "--output",
        os.path.join("rél runs", "run ü"),
        "--resume",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {s["action"] for s in json.loads(proc.stdout)["stages"]} == {"skipped"}
