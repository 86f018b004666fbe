"""kill -9 `portable run` at points spread over every stage (inside checkpoint saves, right after sidecar and
values writes, at random times), then `--resume` until done: the outputs are byte-identical to an
uninterrupted run's (CPU, same seeds). RUN_KILL_TRIALS sets the number of trials (default 10)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from value_synth import CAMERA, write_value_dataset

REPO = Path(__file__).resolve().parent.parent
TRIALS = int(os.environ.get("RUN_KILL_TRIALS", "10"))
CONFIG = """\
datasets:
  - {path: "DATA", type: rollout}
returns: {failure_reward: -30}
value:
  model: {cameras: {base_0_rgb: "CAMERA"}, folds: 2, eval_micro_batch: 16, augment: false}
  train: {max_steps: 6, global_batch: 8, micro_batch: 8, save_interval: 2, lr: 0.001}
advantages: {lookahead: 3}
"""


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def _cmd(cfg: Path, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "reproduction.portable",
        "-q",
        "run",
        "--config",
        str(cfg),
        "--output",
        str(out),
        "--stages",
        "returns,value,advantages",  # the dataset has no state/action for a policy
        *extra,
    ]


def _outputs(run: Path) -> dict[str, dict[str, str]]:
    """Each stage's output digests; value_setup.json names the run folder, so it is compared with that
    folder written as RUN."""
    stages = json.loads((run / "run.json").read_text())["stages"]
    out = {n: {rel: v[2] for rel, v in s["outputs"].items()} for n, s in stages.items()}
    out["value"]["value_setup.json"] = (run / "value" / "value_setup.json").read_text().replace(str(run), "RUN")
    return out


# Kill points: a predicate over the run folder (checked every few ms), or a time fraction of a clean run.
def _in_value_save(run: Path) -> bool:
    return any(run.glob("value/model_*/checkpoints/step_*.partial"))


def _returns_written(run: Path) -> bool:
    return any(run.glob("returns/*/returns.parquet"))


def _values_written(run: Path) -> bool:
    return any(run.glob("advantages/values/*.parquet"))


def _second_fold(run: Path) -> bool:
    return (run / "value" / "model_1").is_dir()


def _export_written(run: Path) -> bool:
    return any(run.glob("value/model_0/export/value_head.json"))


POINTS = [_returns_written, _in_value_save, _second_fold, _export_written, _values_written]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("kill")
    data = root / "data" / "rollouts"
    write_value_dataset(data, episodes=6, seed=4, runs=root / "scratch")
    cfg = root / "run.yaml"
    cfg.write_text(CONFIG.replace("DATA", str(data)).replace("CAMERA", CAMERA))
    t0 = time.perf_counter()
    proc = subprocess.run(_cmd(cfg, root / "clean"), env=_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return cfg, root / "clean", time.perf_counter() - t0


def _kill_when(proc: subprocess.Popen, run: Path, point, deadline_s: float) -> str:
    t0 = time.perf_counter()
    while proc.poll() is None and time.perf_counter() - t0 < deadline_s:
        if (callable(point) and point(run)) or (not callable(point) and time.perf_counter() - t0 >= point):
            os.killpg(proc.pid, signal.SIGKILL)  # the run and any worker it started
            proc.wait(timeout=60)
            return "killed"
        time.sleep(0.005)
    proc.wait(timeout=600)
    return "finished first"


@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_kill_nine_anywhere_then_resume_gives_identical_outputs(setup, tmp_path):
    cfg, clean, seconds = setup
    reference = _outputs(clean)
    rng = random.Random(13)
    points = [POINTS[i % len(POINTS)] for i in range(TRIALS)]
    points = [p if i < len(POINTS) else rng.uniform(0.05, 0.95) * seconds for i, p in enumerate(points)]
    outcomes = []
    for i, point in enumerate(points):
        run = tmp_path / f"t{i}"
        proc = subprocess.Popen(
            _cmd(cfg, run), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        outcome = _kill_when(proc, run, point, deadline_s=seconds * 4)
        resumes = 0
        while True:
            done = subprocess.run(_cmd(cfg, run, "--resume"), env=_env(), capture_output=True, text=True, timeout=900)
            resumes += 1
            if done.returncode == 0 or resumes > 2:
                break
        assert done.returncode == 0, f"trial {i} ({point}): {done.stderr[-3000:]}"
        assert _outputs(run) == reference, f"trial {i} ({getattr(point, '__name__', point)}) differs"
        outcomes.append((point.__name__ if callable(point) else f"t={point:.1f}s", outcome))
    print(f"{len(outcomes)} kill trials over a {seconds:.0f} s run: {outcomes}")
    assert sum(o == "killed" for _, o in outcomes) >= len(outcomes) * 0.7
