"""The real release runs to the end (issue 22 item 6): `portable run --config bundle/libero10/config.yaml` on a
tiny generated LIBERO-10 task-0 dataset, through all six stages and a reduced LIBERO evaluation.

The config is the release's own file, unchanged; the overrides only shrink it for CPU: the tiny presets instead
of SigLIP2+Gemma3 / pi0.5 (whose pinned weights and tokenizers live in a restored release bundle, not here),
one in-process trainer on the CPU, a few steps, and two init states with a low step limit. The data are generated
with upstream's two cameras at 32 px (the config reads `observation.images.image` / `wrist_image` at any size)
into `<folder>/data/libero10_task0/{sft,rollouts_train,rollouts_eval}`, so `${BUNDLE}` is a plain folder as in
the Fetch tests. Needs the libero extra; skipped without it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reproduction.sim.libero._runtime import available
from reproduction.ui import UiOptions

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not available(), reason="LIBERO is not installed (the libero extra: pip install -e '.[libero]')"
    ),
]

REPO = Path(__file__).resolve().parent.parent
IMAGE = 32
TRAIN = "{world_size: 1, launcher: inprocess, device: cpu, micro_batch: 8, global_batch: 8, warmup_steps: 0}"
OVERRIDES = [
    # value: the tiny preset, tokenizer trained in-process, no pinned start weights
    "value.model.preset=tiny",
    "value.model.tokenizer=null",
    "value.model.pretrained_manifest=null",
    "value.model.weights_dir=null",
    "value.model.augment=false",
    "value.model.eval_max_samples=64",
    "value.model.eval_micro_batch=32",
    f"value.train={TRAIN}",
    "value.train.max_steps=2",
    "value.train.save_interval=2",
    "value.train.eval_interval=2",
    "value.train.mixed_precision=fp32",
    "value.infer={batch_size: 64, workers: 1, device: cpu}",
    # policy: the tiny preset at the data's image size, recap only (the release's mode)
    "policy.model.preset=tiny",
    "policy.model.tokenizer=null",
    f"policy.model.image_size={IMAGE}",
    "policy.model.chunk=4",
    "policy.model.num_steps=2",
    f"policy.train={TRAIN}",
    "policy.train.max_steps=2",
    "policy.train.save_interval=2",
    "policy.train.lr=0.001",
    # eval: upstream's protocol on libero_10/0, reduced to two init states and a few steps, cameras as the data
    "eval.episodes_per_task=2",
    f"eval.libero.image_size={IMAGE}",
    "eval.libero.max_steps=10",
]


def _python(*args: str, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)


@pytest.mark.timeout(600)
def test_release_config_runs_every_stage_and_evaluates_in_libero(tmp_path, libero_sft_32):
    import jsonschema

    bundle = tmp_path / "bundle"
    data = bundle / "data" / "libero10_task0"
    t0 = time.perf_counter()
    # The expert needs ~290-333 steps for its first success on libero_10/0 (the sft set keeps successes only):
    # that set (1 episode, 32 px, max_steps 340) is conftest's libero_sft_32, rendered once a session and shared
    # with tests/test_grpo_libero.py. The rollouts and eval rollouts only need to exist, so they are cut at 30
    # steps. Generated in this process (the data are this test's input, not what it checks): the two sets share
    # one env build, as generate_libero_data does with one worker, instead of two `generate` interpreters.
    from reproduction.sim.libero.generate import FOLDERS, LiberoGenConfig, close_envs, generate_libero_dataset

    data.mkdir(parents=True)
    libero_sft_32(data / FOLDERS["sft"])
    modes = {"expert": 0.5, "drop": 0.5}
    try:
        for kind, episodes, max_steps in (("rollout", 2, 30), ("eval", 1, 30)):
            cfg = LiberoGenConfig(kind=kind, episodes=episodes, modes=modes, image_size=IMAGE, max_steps=max_steps)
            generate_libero_dataset(cfg, data / FOLDERS[kind], ui=UiOptions(progress=False), keep_env=True)
    finally:
        close_envs()
    assert sorted(p.name for p in data.iterdir()) == ["rollouts_eval", "rollouts_train", "sft"]
    t_gen = time.perf_counter() - t0

    run = tmp_path / "run"
    t0 = time.perf_counter()
    proc = _python(
        "-m",
        "reproduction.portable",
        "run",
        str(bundle),
        *("--output", str(run), "--config", str(REPO / "bundle" / "libero10" / "config.yaml")),
        *OVERRIDES,
        timeout=400,
    )
    t_run = time.perf_counter() - t0
    print(f"generate {t_gen:.0f} s, run {t_run:.0f} s")
    assert proc.returncode == 0, proc.stderr[-4000:]

    state = json.loads((run / "run.json").read_text())
    stages = state["stages"]
    assert set(stages) == {"returns", "value", "advantages", "policy", "eval", "compare"}
    assert all(s["status"] == "complete" for s in stages.values()), {n: s["status"] for n, s in stages.items()}
    assert state["config"]["eval"]["tasks"] == ["libero_10/0"]
    assert state["config"]["datasets"][0]["path"] == str(data.resolve() / "sft")

    # the tiny policy read LIBERO's 8-dim state and 7-dim action and upstream's two cameras
    meta = json.loads((run / "policy" / "recap" / "export" / "policy.json").read_text())
    assert {k: len(v) for k, v in meta["stats"].items()} == {
        "state_mean": 8,
        "state_std": 8,
        "action_mean": 7,
        "action_std": 7,
    }
    assert sorted(meta["cameras"].values()) == ["observation.images.image", "observation.images.wrist_image"]

    (path,) = (run / "evidence").glob("eval_policy_*.json")
    doc = json.loads(path.read_text())
    jsonschema.validate(doc, json.loads((REPO / "evidence" / "evaluation.schema.json").read_text()))
    outcomes = doc["tasks"]["libero_10/0"]["outcomes"]
    assert outcomes["init_states"] == [0, 1]
    assert len(outcomes["success_once"]) == len(outcomes["success_at_end"]) == 2
    libero = doc["settings"]["libero"]
    assert libero["cameras"] is True and libero["image_size"] == IMAGE and libero["max_steps"] == 10

    rows = stages["eval"]["summary"]["results"]["recap w=1"]["per_init_state"]["libero_10/0"]
    assert [(r["init_index"], r["steps"]) for r in rows] == [(0, 10), (1, 10)]

    verify = _python("-m", "reproduction.portable", "lineage", str(run), "--verify", timeout=120)
    assert verify.returncode == 0, verify.stdout[-2000:] + verify.stderr[-2000:]
