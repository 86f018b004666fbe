"""GRPO with cameras and the pi05 preset: the config rules, tiny-with-cameras rollouts (the same bytes for any number
of simulator workers, the prefix run once per decision, the update's log-probs equal to the rollout's), a
reduced-width pi05 through one rollout and one update, and a tiny camera run through sft -> rl -> eval."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from reproduction.errors import ConfigError, FingerprintMismatchError
from reproduction.recipes.grpo.rollout import PolicyHead, RolloutSpec, rollout
from reproduction.recipes.grpo.task import (
    FRAME,
    decision_inputs,
    frames_of,
    grpo_loss,
    loss_batch,
    loss_rows,
    noise_seed,
    pick_steps,
)

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "bundle" / "grpo" / "config.yaml"
TASK = "FetchPush-v4"
SIZE = 32
CAMERAS = {"base_0_rgb": "observation.images.agentview", "left_wrist_0_rgb": "observation.images.wrist"}
SPEC = RolloutSpec(num_steps=3, noise_level=0.5, execute_steps=2, episode_steps=6)
RL = {"noise_level": 0.5, "clip_eps": 0.2, "kl_coef": 0.1}


def _load(overrides: list[str], tmp_path: Path, files: list[Path] | None = None):
    from reproduction.recipes.grpo.config import GrpoRunConfig
    from reproduction.run.config import load_config

    return load_config(files or [CONFIG], overrides, bundle=tmp_path, run_dir=tmp_path / "run", schema=GrpoRunConfig)


def _jiggle(model) -> None:
    """Open the adaRMS gates (they start at zero: identity blocks), so the head is not trivial."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))


class Counting:
    """Counts a model's prefix passes (encode_prefix calls)."""

    def __init__(self, model) -> None:
        self.model, self.calls = model, 0
        inner = model.encode_prefix

        def encode_prefix(batch):
            self.calls += 1
            return inner(batch)

        model.encode_prefix = encode_prefix


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    from reproduction.recap.policy.model import build_policy_model, tiny_config
    from reproduction.recap.policy.task import PolicyCollator
    from reproduction.recap.tokenizer import train_tokenizer
    from reproduction.sim.tasks import get_task

    language = get_task(TASK).language
    tok = train_tokenizer([language], tmp_path_factory.mktemp("tok"))
    slots = tuple(CAMERAS)
    cfg = tiny_config(
        vocab_size=len(tok), state_dim=14, cameras=slots, image_size=SIZE, width=32, prefix_layers=1, expert_layers=1
    )
    model = build_policy_model(cfg, seed=0)
    _jiggle(model)
    stats = {"state_mean": [0.0] * 14, "state_std": [1.0] * 14, "action_mean": [0.0] * 4, "action_std": [0.5] * 4}
    return PolicyHead(
        model=model.eval(),
        collator=PolicyCollator(tok, [language], cameras=slots, image_size=SIZE, action_dim=4),
        stats=stats,
        chunk=4,
        action_dim=4,
        env_action_dim=4,
        tasks=[language],
        cameras=dict(CAMERAS),
        image_size=SIZE,
    )


@pytest.fixture(scope="module")
def sims():
    from reproduction.sim.evaluate import EnvPool, EvalConfig

    pool = EnvPool(EvalConfig(tasks=(TASK,), cameras=("agentview", "wrist"), image_size=SIZE))
    yield lambda n: pool.get(TASK, n)
    pool.close()


def test_the_config_names_the_simulators_cameras_and_pi05s_size():
    from reproduction.recap.policy.model import PRESETS
    from reproduction.recap.policy.pi05 import pi05_config
    from reproduction.recipes.grpo import config
    from reproduction.sim.env import CAMERAS
    from reproduction.sim.evaluate import CAMERA_NAMES

    assert config.SIM_CAMERAS == CAMERAS == CAMERA_NAMES and config.PRESETS == PRESETS
    assert pi05_config(state_dim=14).image_size == config.PI05_IMAGE_SIZE


def test_camera_config_loads_and_its_errors_are_one_line(tmp_path):
    cfg = _load(["sft.model.cameras={base_0_rgb: observation.images.wrist}", "sft.model.image_size=32"], tmp_path)
    assert cfg.sft.model.cameras == {"base_0_rgb": "observation.images.wrist"} and cfg.sft.model.render_size == 32
    pi05 = _load(["sft.model.preset=pi05", "sft.model.cameras={base_0_rgb: observation.images.agentview}"], tmp_path)
    assert pi05.sft.model.render_size == 224
    for overrides, field, words in [
        (
            ["sft.model.cameras={base_0_rgb: observation.images.side}"],
            "sft.model.cameras",
            "'observation.images.side' is not a camera the simulator renders "
            "(valid: observation.images.agentview, observation.images.wrist)",
        ),
        (["sft.model.preset=pi05"], "sft.model.cameras", "sft.model.preset='pi05' reads cameras"),
        (["sft.model.preset=pi0"], "sft.model.preset", "is not one of tiny, pi05"),
        (["sft.model.image_size=40"], "sft.model.image_size", "multiple of 16"),
    ]:
        with pytest.raises(ConfigError) as err:
            _load(overrides, tmp_path)
        assert words in err.value.message and "\n" not in err.value.message, (overrides, err.value.message)
        assert err.value.field == field and err.value.exit_code == 4


def test_camera_rollouts_are_the_same_bytes_in_simulator_workers_and_run_the_prefix_once_per_decision(head, sims):
    from reproduction.recipes.grpo.envs import EnvWorkers

    resets, noises = [10, 10, 12], [3, 4, 5]
    counting = Counting(head.model)
    try:
        here = rollout(head, sims(3), reset_seeds=resets, noise_seeds=noises, task_ids=[0] * 3, spec=SPEC, ref=head)
        assert counting.calls == 2 * 3  # D = 3 decisions: one prefix for the policy, one for the reference, not K
    finally:
        del head.model.encode_prefix
    assert set(here.frames) == set(CAMERAS)
    for f in here.frames.values():
        assert f.dtype == np.uint8 and f.shape == (3, 3, SIZE, SIZE, 3) and f.std() > 0
    assert not np.array_equal(here.frames["base_0_rgb"][:, 0], here.frames["base_0_rgb"][:, 2])  # the arm moved
    workers = EnvWorkers(TASK, 3, 2, cameras=("agentview", "wrist"), image_size=SIZE)
    try:
        there = rollout(head, workers, reset_seeds=resets, noise_seeds=noises, task_ids=[0] * 3, spec=SPEC, ref=head)
    finally:
        workers.close()
    for name in ("state", "chain", "log_prob", "ref_mean", "success_once", "success_at_end"):
        np.testing.assert_array_equal(getattr(here, name), getattr(there, name), err_msg=name)
    for slot in CAMERAS:
        np.testing.assert_array_equal(here.frames[slot], there.frames[slot], err_msg=slot)


def test_the_update_recomputes_the_rollouts_log_probs_from_its_frames(head, sims):
    """At the sampling weights the PPO ratio is 1 and the KL to the same weights 0: the loss batch rebuilt from the
    recorded uint8 frames gives the velocities the rollout sampled with. The batch holds each decision's images once
    (12 decisions, 24 loss rows) and the model runs 12 prefixes; the loss and every gradient equal those of the batch
    built row by row (24 images, 24 prefixes) to float32 rounding."""
    resets, noises = [10, 10, 12, 12], [noise_seed(0, 0, p, g) for p in range(2) for g in range(2)]
    r = rollout(head, sims(4), reset_seeds=resets, noise_seeds=noises, task_ids=[0] * 4, spec=SPEC, ref=head)
    advantages, steps = np.array([[1.0, -1.0], [0.5, -0.5]]), pick_steps(noises, 3, 3, 2)
    batch = loss_batch(head, [(r, advantages, steps)])
    batch.update(reward_mean=torch.tensor(0.5), success_at_end=torch.tensor(0.5), zero_std_groups=torch.tensor(0.0))
    assert batch["images"]["base_0_rgb"].shape == (4 * 3, 3, SIZE, SIZE) and batch["x"].shape[0] == 4 * 3 * 2
    np.testing.assert_array_equal(batch["prefix_index"].numpy(), np.repeat(np.arange(12), 2))
    assert batch["state"].shape == (24, 14) and all(bool(mask.all()) for mask in batch["image_masks"].values())
    counting = Counting(head.model)
    try:
        loss, m = grpo_loss(head.model, batch, rl=RL, num_steps=3, dims=(2, 4))
    finally:
        del head.model.encode_prefix
    assert counting.calls == 1
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-5) and m["clip_fraction"] == 0.0
    assert m["kl"] == pytest.approx(0.0, abs=1e-9)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in head.model.named_parameters() if p.grad is not None}
    head.model.zero_grad()
    vision = [g for n, g in grads.items() if n.startswith("vision.")]
    assert vision and any(bool(g.abs().sum() > 0) for g in vision)  # the frames get a gradient

    rows, dec = loss_rows(r, advantages, steps), decision_inputs(r)  # the same batch, row by row
    assert (dec[FRAME + "base_0_rgb"].shape, len(rows["decision"])) == ((12, SIZE, SIZE, 3), 24)
    per_row = {k: v for k, v in batch.items() if k not in ("images", "image_masks", "prefix_index", "state")}
    frames = {slot: f[rows["decision"]] for slot, f in frames_of(dec).items()}
    per_row.update(head.model_batch(rows["state"], rows["task_id"], frames))
    assert per_row["images"]["base_0_rgb"].shape == (24, 3, SIZE, SIZE) and "prefix_index" not in per_row
    loss_rowwise, m_rowwise = grpo_loss(head.model, per_row, rl=RL, num_steps=3, dims=(2, 4))
    assert float(loss_rowwise.detach()) == pytest.approx(float(loss.detach()), rel=1e-5, abs=1e-7)
    assert m_rowwise["kl"] == pytest.approx(m["kl"], abs=1e-9)
    loss_rowwise.backward()
    for n, p in head.model.named_parameters():
        if p.grad is not None or n in grads:
            torch.testing.assert_close(p.grad, grads[n], rtol=1e-4, atol=1e-6, msg=n)
    head.model.zero_grad()


def test_a_reduced_width_pi05_runs_one_grpo_rollout_and_one_update(sims, tmp_path):
    """pi05 (lerobot's architecture at test widths, tests/test_policy_pi05.py REDUCED): the state as text in the
    prompt, one camera resized from the envs' 32 px to its 16, actions padded to 6 dims of which the env takes 4; then
    a co-training batch through stage 4's collator (images decoded from a camera dataset, the state as text) and its
    loss, and a co-training dataset changed since the setup named by its fingerprint."""
    from reproduction.recap.policy.model import build_policy_model
    from reproduction.recap.policy.pi05 import pi05_config, pi05_prompt
    from reproduction.recap.policy.task import PolicyCollator
    from reproduction.recap.tokenizer import train_tokenizer
    from reproduction.sim.tasks import get_task
    from tests.test_policy_pi05 import REDUCED

    language = get_task(TASK).language
    tok = train_tokenizer([language, pi05_prompt(language, " ".join(map(str, range(256))))], tmp_path / "tok")
    cfg = pi05_config(state_dim=14, chunk=4, cameras=("base_0_rgb",), reduced={**REDUCED, "vocab_size": len(tok)})
    model = build_policy_model(cfg, seed=0)
    _jiggle(model)
    stats = {"state_mean": [0.0] * 14, "state_std": [1.0] * 14, "action_mean": [0.0] * 4, "action_std": [0.5] * 4}
    head = PolicyHead(
        model=model.eval(),
        collator=PolicyCollator(
            tok, [language], cameras=("base_0_rgb",), image_size=cfg.image_size, state_text=True, action_dim=6
        ),
        stats=stats,
        chunk=4,
        action_dim=cfg.action_dim,
        env_action_dim=4,
        tasks=[language],
        cameras={"base_0_rgb": "observation.images.agentview"},
        image_size=cfg.image_size,
        state_text=True,
    )
    spec = RolloutSpec(num_steps=2, noise_level=0.5, execute_steps=2, episode_steps=4)
    noises = [noise_seed(0, 0, 0, g) for g in range(2)]
    r = rollout(head, sims(2), reset_seeds=[10, 10], noise_seeds=noises, task_ids=[0, 0], spec=spec, ref=head)
    assert r.chain.shape == (2, 2, 3, 4, 6) and r.ref_mean.shape == (2, 2, 2, 2, 4)
    assert r.frames["base_0_rgb"].shape == (2, 2, SIZE, SIZE, 3)
    batch = loss_batch(head, [(r, np.array([[1.0, -1.0]]), pick_steps(noises, 2, 2, 2))])
    assert batch["images"]["base_0_rgb"].shape == (2 * 2, 3, 16, 16) and cfg.image_size == 16  # once per decision
    assert batch["x"].shape[0] == 2 * 2 * 2 and batch["prefix_index"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    prompt = tok.decode(batch["input_ids"][0].tolist())
    assert "State" in prompt  # pi0.5's prompt carries the state as text
    batch.update(reward_mean=torch.tensor(0.5), success_at_end=torch.tensor(0.0), zero_std_groups=torch.tensor(0.0))
    model.train()
    loss, m = grpo_loss(model, batch, rl=RL, num_steps=2, dims=(2, 4))
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-4) and m["kl"] == pytest.approx(0.0, abs=1e-8)
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss.backward()
    opt.step()
    moved = sum(not torch.equal(a, p.detach()) for a, p in zip(before, model.parameters()))
    assert moved > 0 and np.isfinite(float(loss.detach()))

    # co-training (RL-Co's SFT term) with pi05: stage 4's samples and collator, the images decoded from the dataset
    from types import SimpleNamespace

    from reproduction.data.reader import open_dataset
    from reproduction.recap.policy.data import PolicyArrays
    from reproduction.recap.policy.task import policy_loss
    from reproduction.recipes.grpo.task import GrpoBatcher, _cotrain_inputs
    from reproduction.sim.generate import GenConfig, generate_dataset

    real = tmp_path / "real"
    generate_dataset(
        GenConfig(kind="sft", tasks=(TASK,), episodes_per_task=1, cameras=("agentview",), image_size=SIZE), real
    )
    rng, n = np.random.default_rng(0), 5
    rows = np.arange(n)
    PolicyArrays(
        state=rng.standard_normal((n, 14)).astype(np.float32),
        chunk=np.minimum(rows[:, None] + np.arange(4), n - 1),
        action=rng.standard_normal((n, 4)).astype(np.float32),
        label=np.ones(n, bool),
        task_id=np.zeros(n, np.int64),
        source=np.zeros(n, np.int64),
        row=rows * 10,
        episode=np.zeros(n, np.int64),
        frame=rows * 10,
        tasks=[language],
    ).save(tmp_path / "cotrain.npz")
    cot = {"arrays": str(tmp_path / "cotrain.npz"), "path": str(real), "name": "real"}
    setup = {"cotrain": {**cot, "fingerprint": open_dataset(real).fingerprint}}
    batcher = GrpoBatcher(head=head, ref=None, rl={"cotrain_batch": 3}, spec=spec, cotrain=_cotrain_inputs(setup, head))
    cot_batch = batcher.cotrain_batch(SimpleNamespace(uniforms=lambda k: np.linspace(0.1, 0.9, k)[None]))
    assert cot_batch["images"]["base_0_rgb"].shape == (3, 3, 16, 16)
    assert bool(cot_batch["image_masks"]["base_0_rgb"].all()) and float(cot_batch["images"]["base_0_rgb"].std()) > 0
    assert "State" in tok.decode(cot_batch["input_ids"][0].tolist()) and cot_batch["actions"].shape == (3, 4, 6)
    cot_loss, _ = policy_loss(model, cot_batch)
    assert np.isfinite(float(cot_loss.detach())) and float(cot_loss.detach()) > 0
    setup["cotrain"]["fingerprint"] = "0" * 64  # the dataset changed since the setup was written: named, not read
    changed = GrpoBatcher(head=head, ref=None, rl={"cotrain_batch": 3}, spec=spec, cotrain=_cotrain_inputs(setup, head))
    with pytest.raises(FingerprintMismatchError, match="the dataset changed since the policy setup was written"):
        changed.cotrain_batch(SimpleNamespace(uniforms=lambda k: np.linspace(0.1, 0.9, k)[None]))


@pytest.mark.timeout(300)
def test_a_tiny_camera_run_through_sft_rl_and_eval(tmp_path, monkeypatch):
    """The runner end to end with one 32 px agentview camera: SFT data rendered with it, stage 4 trains on it, the
    export names it, the rollouts (2 simulator workers) and both evaluations render it, the co-training loss reads
    its frames' images from the co-training dataset (RL-Co's form with cameras); a camera the SFT or the co-training
    data lack is a preflight problem."""
    from reproduction.recipes.grpo import GRPO
    from reproduction.run.record import make_recorder
    from reproduction.run.runner import RunOptions, run_recipe
    from reproduction.sim.generate import GenConfig, generate_dataset

    gen = GenConfig(kind="sft", tasks=(TASK,), episodes_per_task=2, cameras=("agentview",), image_size=SIZE)
    generate_dataset(gen, tmp_path / "sft")
    generate_dataset(dataclasses.replace(gen, seed=7), tmp_path / "real")
    import reproduction.recap.policy.batches as batches

    decoded = []  # (source dataset, sample) of every frame a PolicySamples read: stage 4's and the co-training's
    getitem = batches.PolicySamples.__getitem__

    def spy(self, i):
        sample = getitem(self, i)
        decoded.append(([s["name"] for s in self.sources], sample))
        return sample

    monkeypatch.setattr(batches.PolicySamples, "__getitem__", spy)
    over = [
        f"sft.datasets=[{{path: {tmp_path / 'sft'}}}]",
        "sft.model.cameras={base_0_rgb: observation.images.agentview}",
        f"sft.model.image_size={SIZE}",
        "sft.model.width=32",
        "sft.model.num_steps=3",
        "sft.train.max_steps=4",
        "sft.train.global_batch=16",
        "sft.train.micro_batch=16",
        "rl.steps=1",
        "rl.init_states=1",
        "rl.micro_init_states=1",
        "rl.group_size=2",
        "rl.updates_per_rollout=1",
        "rl.rollout_workers=2",
        "rl.eval_every=1",
        "rl.save_every=1",
        "rl.eval_episodes=1",
        "eval.episodes_per_task=2",
        f"rl.cotrain_dataset={tmp_path / 'real'}",
        "rl.cotrain_weight=0.5",
        "rl.cotrain_batch=4",
    ]
    import reproduction.sim.evaluate as sim_eval

    rendered = []  # (cameras, image_size) of every evaluation: the live one in rl, and the eval stage's
    evaluate, evaluate_many = sim_eval.evaluate, sim_eval.evaluate_many
    monkeypatch.setattr(
        sim_eval, "evaluate", lambda f, c, **kw: rendered.append((c.cameras, c.image_size)) or evaluate(f, c, **kw)
    )
    monkeypatch.setattr(
        sim_eval,
        "evaluate_many",
        lambda jobs, **kw: (
            rendered.extend((j.config.cameras, j.config.image_size) for j in jobs) or evaluate_many(jobs, **kw)
        ),
    )
    run = tmp_path / "run"
    cfg = _load(over, tmp_path)
    report = run_recipe(GRPO, cfg, run, RunOptions(recorder=make_recorder(None)))
    assert [(s.name, s.action) for s in report.stages] == [(n, "ran") for n in ("sft", "rl", "eval", "compare")]
    policy = json.loads((run / "rl" / "export" / "policy.json").read_text())
    assert policy["cameras"] == {"base_0_rgb": "observation.images.agentview"} and policy["algorithm"] == "grpo"
    model = json.loads((run / "sft" / "export" / "model_config.json").read_text())
    assert model["cameras"] == ["base_0_rgb"] and model["vision"]["image_size"] == SIZE
    metrics = [json.loads(line) for line in (run / "rl" / "metrics.jsonl").read_text().splitlines()]
    train = [m for m in metrics if m["split"] == "train"]
    assert [m["step"] for m in train] == [1] and 0 < train[0]["metrics"]["cotrain_loss"] < 100
    setup = json.loads((run / "rl" / "grpo_setup.json").read_text())
    assert setup["cotrain"]["path"] == str((tmp_path / "real").resolve()) and setup["cotrain"]["name"] == "real"
    decoded = [d for names, d in decoded if names == ["real"]]  # one co-training batch of 4 frames
    assert len(decoded) == 4 and all(set(d["images"]) == {"base_0_rgb"} for d in decoded)
    assert all(
        d["images"]["base_0_rgb"].shape == (3, SIZE, SIZE) and d["images"]["base_0_rgb"].std() > 0 for d in decoded
    )
    doc = json.loads((run / "evidence" / "eval_grpo_1.json").read_text())
    assert doc["tasks"][TASK]["episodes"] == 2 and doc["baselines"][0]["policy"]["label"] == "sft"
    assert set(rendered) == {(("agentview",), SIZE)} and len(rendered) >= 3  # rl's live evaluation, eval's two

    from reproduction.recipes.grpo.preflight import preflight

    wrist = _load([*over, "sft.model.cameras={base_0_rgb: observation.images.wrist}"], tmp_path)
    problems = [p.message for p in preflight(wrist, tmp_path / "run2", {})]
    for key in ("sft.datasets[0].path", "rl.cotrain_dataset"):
        assert any(
            m.startswith(f"{key}: ") and "has no observation.images.wrist, which sft.model.cameras reads" in m
            for m in problems
        ), problems


def test_the_demo_generates_its_sft_data_with_the_cameras_the_config_reads(tmp_path):
    from reproduction.recipes.grpo.demo import QUICK, _with_cameras

    assert _with_cameras(QUICK, tmp_path, True, []) is QUICK  # camera-free: the same data (and stamp) as before
    wrist = ["sft.model.cameras={base_0_rgb: observation.images.wrist}", "sft.model.image_size=32"]
    data = _with_cameras(QUICK, tmp_path, True, wrist)
    assert (data.cameras, data.image_size, data.sft_episodes) == (("wrist",), 32, QUICK.sft_episodes)
    pi05 = _with_cameras(QUICK, tmp_path, False, ["sft.model.preset=pi05", wrist[0]])
    assert (pi05.cameras, pi05.image_size) == (("wrist",), 224)


def test_sft_model_takes_every_policy_model_field_but_the_conditioning_ones(tmp_path):
    """GRPO's sft.model is RECAP's policy.model without conditioning: a field stage 4's trainer gains (as pi05's
    discrete_state_input, norm, norm_stats and image_augment did) must reach GRPO's SFT too, checked by the same rules,
    and at its default leave the stage keys of runs recorded before it as they were (added_field)."""
    from reproduction.config_fields import ADDED
    from reproduction.recap.policy.config import PolicyConfig
    from reproduction.recipes.grpo.config import PolicyModelSection
    from reproduction.recipes.grpo.preflight import preflight
    from reproduction.run.config import to_plain

    policy = {f.name: f for f in dataclasses.fields(PolicyConfig)}
    sft = {f.name: f for f in dataclasses.fields(PolicyModelSection)}
    assert set(policy) - set(sft) == {"positive_only", "condition_dropout", "hold_labels"} and set(sft) <= set(policy)
    for name in ("discrete_state_input", "norm", "norm_stats", "image_augment"):
        assert sft[name].default == policy[name].default and sft[name].metadata.get(ADDED), name

    cameras = "sft.model.cameras={base_0_rgb: observation.images.agentview}"
    cfg = _load(["sft.model.preset=pi05", cameras, "sft.model.norm=zscore", "sft.model.image_augment=false"], tmp_path)
    stage = PolicyConfig(**to_plain(cfg.sft.model))  # what the sft stage hands stage 4's trainer
    assert (stage.norm, stage.image_augment, stage.discrete_state_input) == ("zscore", False, False)
    cfg = _load(["sft.model.preset=pi05", cameras, "sft.model.discrete_state_input=true"], tmp_path)
    assert PolicyConfig(**to_plain(cfg.sft.model)).discrete_state_input is True
    for overrides, field, words in [
        (["sft.model.discrete_state_input=true"], "sft.model.discrete_state_input", "applies to pi05"),
        (["sft.model.norm=minmax"], "sft.model.norm", "minmax"),
        (["sft.model.norm_stats=/x/norm_stats.json"], "sft.model.norm_stats", "the normalisation is z-score"),
    ]:
        with pytest.raises(ConfigError) as err:
            _load(overrides, tmp_path)
        assert words in err.value.message and "\n" not in err.value.message, (overrides, err.value.message)
        assert err.value.field == field and err.value.exit_code == 4

    missing = tmp_path / "nowhere" / "norm_stats.json"
    cfg = _load(["sft.model.preset=pi05", cameras, f"sft.model.norm_stats={missing}"], tmp_path)
    problems = [str(p) for p in preflight(cfg, tmp_path / "run", {}, stages=["sft"])]
    assert f"sft.model.norm_stats: {missing} does not exist" in problems, problems
