"""The GRPO rl stage at world size 2 (two Ray trainer ranks, gloo, CPU, FSDP2), through the runner.

From the same SFT weights, one rank and two ranks take the same first step: each rank rolls out its half of the
step's init states on an unsharded copy of the policy (task.RolloutCopy), so the rollouts' successes and flat groups
are the same and the mean reward and the loss agree to float rounding (one README run of the suite saw the mean
reward of the in-process rank and of the Ray ranks differ by 1.7e-9: the forwards of two processes are not
guaranteed to round alike, and a progress reward carries that into its last bits). A two-rank run resumed with
--target-step 4 from its step-2 checkpoint ends with the bytes of a two-rank run trained 4 steps at once: the copy is
synced from the restored weights, the rollouts and updates repeat exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("reproduction.sim.generate")
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "bundle" / "grpo" / "config.yaml"
TINY = [
    "sft.train.max_steps=20",
    "sft.train.global_batch=64",
    "sft.train.micro_batch=64",
    "sft.model.num_steps=4",
    "rl.init_states=4",
    "rl.micro_init_states=1",
    "rl.group_size=2",
    "rl.updates_per_rollout=1",
    "rl.logprob_steps=2",
    "rl.rollout_workers=1",
    "rl.eval_every=2",
    "rl.save_every=2",
    "rl.eval_episodes=1",
    "rl.cpu_threads=1",
]
"""One torch thread in every trainer, in-process or a Ray worker (Ray gives its workers one): forwards that split
their sums over another number of threads round differently, and the rollouts would differ in the last bits. K = 4
denoising steps with 2 of them in the loss (the bundle's 10 and 10): every rollout decision and every loss step is
cheaper, and the identities this file checks hold for any K."""


def _run(tmp_path: Path, name: str, over: list[str], **opts):
    from reproduction.recipes.grpo import GRPO
    from reproduction.recipes.grpo.config import GrpoRunConfig
    from reproduction.run.config import load_config
    from reproduction.run.runner import RunOptions, run_recipe

    run = tmp_path / name
    cfg = load_config([CONFIG], [*TINY, *over], bundle=tmp_path, run_dir=run, schema=GrpoRunConfig)
    run_recipe(GRPO, cfg, run, RunOptions(stages=["sft", "rl"], **opts))
    return run


def _train_records(run: Path) -> list[dict]:
    lines = (run / "rl" / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(x) for x in lines]
    return [
        {k: v for k, v in r["metrics"].items() if k != "samples_per_s"} for r in records if r.get("split") == "train"
    ]


def test_two_ranks_take_the_first_step_of_one_and_resume_exactly(tmp_path, ray_address):
    from reproduction.sim.generate import GenConfig, generate_dataset

    generate_dataset(GenConfig(kind="sft", tasks=("FetchPush-v4",), episodes_per_task=3, cameras=()), tmp_path / "sft")
    data = f"sft.datasets=[{{path: {tmp_path / 'sft'}}}]"
    one = _run(tmp_path, "one", [data, "rl.steps=2"])
    pinned = [data, f"sft.export={one / 'sft' / 'export'}"]
    two = [*pinned, "rl.world_size=2", "rl.launcher=ray"]
    run2 = _run(tmp_path, "two", [*two, "rl.steps=2"], ray_address=ray_address)

    manifest = json.loads((run2 / "rl" / "checkpoints" / "step_2" / "manifest.json").read_text())
    assert manifest["world_size"] == 2  # trained sharded over two ranks, not silently on one
    state = json.loads((run2 / "run.json").read_text())
    assert state["stages"]["rl"]["step"] == 2
    first_one, first_two = _train_records(one)[0], _train_records(run2)[0]
    for k in ("rollout_success", "zero_std_groups"):  # the same rollouts
        assert first_two[k] == first_one[k], k
    assert first_two["reward_mean"] == pytest.approx(first_one["reward_mean"], rel=1e-5, abs=1e-7)
    assert first_two["loss"] == pytest.approx(first_one["loss"], rel=1e-5, abs=1e-6)
    assert (run2 / "rl" / "evidence" / "eval_rl_2.json").is_file()  # rank 0 wrote the live evaluation

    _run(tmp_path, "two", [*two, "rl.steps=2"], ray_address=ray_address, resume=True, target_step=4)
    straight = _run(tmp_path, "straight", [*two, "rl.steps=4"], ray_address=ray_address)
    resumed = (run2 / "rl" / "export" / "model.safetensors").read_bytes()
    assert (straight / "rl" / "export" / "model.safetensors").read_bytes() == resumed
    assert _train_records(run2) == _train_records(straight) and len(_train_records(straight)) == 4
    for name in ("eval_rl_2.json", "eval_rl_4.json"):
        a, b = (json.loads((r / "rl" / "evidence" / name).read_text()) for r in (run2, straight))
        a.pop("run_id"), b.pop("run_id")
        assert a == b, name
