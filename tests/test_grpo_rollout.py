"""GRPO rollouts and the loss on a tiny random policy in the real simulator: determinism, consistency, config."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from reproduction.errors import ConfigError
from reproduction.recipes.grpo.config import RlSection
from reproduction.recipes.grpo.rollout import PolicyHead, RolloutSpec, rollout
from reproduction.recipes.grpo.task import grpo_loss, loss_rows, noise_seed, pick_steps
from reproduction.run.config import to_plain

TASK = "FetchPush-v4"
SPEC = RolloutSpec(num_steps=3, noise_level=0.5, execute_steps=2, episode_steps=6)


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    from reproduction.recap.policy.model import build_policy_model, tiny_config
    from reproduction.recap.policy.task import PolicyCollator
    from reproduction.recap.tokenizer import train_tokenizer
    from reproduction.sim.tasks import get_task

    language = get_task(TASK).language
    tok = train_tokenizer([language], tmp_path_factory.mktemp("tok"))
    cfg = tiny_config(vocab_size=len(tok), state_dim=14, chunk=4, width=32, prefix_layers=1, expert_layers=1)
    model = build_policy_model(cfg, seed=0)
    with torch.no_grad():  # the adaRMS gates start at zero (identity blocks): open them so the head is not trivial
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    stats = {"state_mean": [0.0] * 14, "state_std": [1.0] * 14, "action_mean": [0.0] * 4, "action_std": [0.5] * 4}
    return PolicyHead(
        model=model.eval(),
        collator=PolicyCollator(tok, [language]),
        stats=stats,
        chunk=4,
        action_dim=4,
        env_action_dim=4,
        tasks=[language],
    )


@pytest.fixture(scope="module")
def sims():
    from reproduction.sim.evaluate import EnvPool, EvalConfig

    pool = EnvPool(EvalConfig(tasks=(TASK,), cameras=()))
    yield lambda n: pool.get(TASK, n)
    pool.close()


def _run(head, sims, resets, noises):
    return rollout(
        head, sims(len(resets)), reset_seeds=resets, noise_seeds=noises, task_ids=[0] * len(resets), spec=SPEC, ref=head
    )


def test_rollouts_are_deterministic_given_seeds_and_independent_of_the_batch(head, sims):
    resets, noises = [10, 10, 12, 12], [noise_seed(0, 0, p, g) for p in range(2) for g in range(2)]
    a, b = _run(head, sims, resets, noises), _run(head, sims, resets, noises)
    for name in ("state", "chain", "log_prob", "ref_mean", "success_once", "success_at_end"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    assert a.chain.shape == (4, 3, 4, 4, 4)  # n, D = 6 / 2 decisions, K + 1, H, A
    assert a.log_prob.shape == (4, 3, 3) and a.ref_mean.shape == (4, 3, 3, 2, 4)
    np.testing.assert_array_equal(a.state[0, 0], a.state[1, 0])  # one init state, two group members
    assert not np.array_equal(a.chain[0], a.chain[1])  # ...with their own noise
    alone = _run(head, sims, resets[2:], noises[2:])  # rows 2, 3 rolled out without rows 0, 1
    np.testing.assert_allclose(alone.chain, a.chain[2:], rtol=1e-5, atol=1e-5)


def test_rollouts_in_simulator_workers_are_the_same_bytes(head, sims):
    """Envs sliced over 2 spawn worker processes (the policy forward batched here) give the in-process rollout."""
    from reproduction.recipes.grpo.envs import EnvWorkers

    resets, noises = [10, 10, 12, 12, 14], [3, 4, 5, 6, 7]
    here = _run(head, sims, resets, noises)
    workers = EnvWorkers(TASK, len(resets), 2)
    try:
        assert workers.bounds == [0, 2, 5]
        there = rollout(head, workers, reset_seeds=resets, noise_seeds=noises, task_ids=[0] * 5, spec=SPEC, ref=head)
    finally:
        workers.close()
    for name in ("state", "chain", "log_prob", "ref_mean", "success_once", "success_at_end"):
        np.testing.assert_array_equal(getattr(here, name), getattr(there, name), err_msg=name)
    assert workers.procs == []


def test_loss_on_fresh_rollouts_is_on_policy_with_zero_kl_to_itself(head, sims):
    """Recomputed log-probs equal the rollout's (ratio 1), the KL to the same weights is 0, and the policy
    term's gradient is the policy gradient -mean(A * grad log pi)."""
    resets, noises = [10, 10, 12, 12], [noise_seed(0, 0, p, g) for p in range(2) for g in range(2)]
    r = _run(head, sims, resets, noises)
    adv = np.array([[1.0, -1.0], [0.5, -0.5]])
    rows = loss_rows(r, adv, pick_steps(noises, 3, 3, 2))
    assert rows["k"].shape == (4 * 3 * 2,)
    batch = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in rows.items() if k != "task_id"}
    batch.update(head.model_batch(rows["state"], rows["task_id"]))
    batch.update(reward_mean=torch.tensor(0.5), success_at_end=torch.tensor(0.5), zero_std_groups=torch.tensor(0.0))
    rl = {"noise_level": 0.5, "clip_eps": 0.2, "kl_coef": 0.1}
    head.model.zero_grad()
    loss, m = grpo_loss(head.model, batch, rl=rl, num_steps=3, dims=(2, 4))
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert m["kl"] == pytest.approx(0.0, abs=1e-10)
    assert m["clip_fraction"] == 0.0
    loss.backward()
    got = [p.grad.clone() for p in head.model.parameters() if p.grad is not None]
    head.model.zero_grad()
    from reproduction.recipes.grpo import sde

    k = batch["k"]
    t = sde.timesteps(3)[k].float()
    mean = sde.sde_mean(batch["x"], head.model(batch, batch["x"], t), k, 3, 0.5)[:, :2, :4]
    std = sde.step_stds(3, 0.5)[k].float().view(-1, 1, 1)
    logp = sde.gaussian_log_prob(batch["x_next"][:, :2, :4], mean, std).sum(dim=(1, 2))
    (-(batch["advantage"] * logp).mean()).backward()
    want = [p.grad for p in head.model.parameters() if p.grad is not None]
    for g1, g2 in zip(got, want):
        torch.testing.assert_close(g1, g2, rtol=1e-4, atol=1e-6)
    head.model.zero_grad()


def test_pick_steps_is_seeded_sorted_and_without_replacement():
    a, b = pick_steps([5, 6], 4, 10, 3), pick_steps([5, 6], 4, 10, 3)
    np.testing.assert_array_equal(a, b)
    assert a.shape == (2, 4, 3)
    assert all(len(set(row)) == 3 and list(row) == sorted(row) for row in a.reshape(-1, 3))
    assert not np.array_equal(a[0], a[1])
    np.testing.assert_array_equal(pick_steps([5], 2, 4, 9)[0], [[0, 1, 2, 3]] * 2)
    assert noise_seed(0, 1, 2, 3) == noise_seed(0, 1, 2, 3) != noise_seed(0, 1, 2, 4)


def test_rl_config_rules_name_the_field():
    with pytest.raises(ConfigError, match="rl.group_size=1"):
        RlSection(group_size=1)
    with pytest.raises(ConfigError, match="rl.save_every=5 is not a multiple of rl.updates_per_rollout=2"):
        RlSection(steps=10, save_every=5, eval_every=5, updates_per_rollout=2)
    with pytest.raises(ConfigError, match="micro_init_states"):
        RlSection(init_states=8, micro_init_states=3)
    with pytest.raises(ConfigError, match="cotrain_dataset"):
        RlSection(cotrain_weight=0.5)
    rl = RlSection(steps=40, init_states=8, micro_init_states=4, updates_per_rollout=2, lr=3e-4)
    train = rl.train_config()
    assert (train.max_steps, train.global_batch, train.micro_batch, train.grad_accum, train.lr) == (40, 8, 4, 2, 3e-4)
    assert not train.shuffle
    assert rl.train_config(max_steps=60).max_steps == 60
    with pytest.raises(ConfigError, match="target step 61"):
        rl.train_config(max_steps=61)


def test_collect_divides_the_centred_rewards_as_rl_advantage_scale_says(head):
    """The same round collected under `group` and `batch` rolls out the same episodes (the same log-probs); a flat
    group is zero under both; every other group keeps its signs and ratios, batch's advantages being the group's times
    one positive factor per group (its reward std over the std of all the round's rewards)."""
    from reproduction.recipes.grpo.task import GrpoBatcher

    base = dict(to_plain(RlSection(tasks=[TASK], init_states=3, micro_init_states=3, group_size=3)))
    base.update(reward="progress", logprob_steps=1)
    got = {}
    for scale in ("group", "batch"):
        batcher = GrpoBatcher(head=head, ref=None, rl={**base, "advantage_scale": scale}, spec=SPEC)
        got[scale] = batcher.collect(0, (0, 1, 2))
    g, b = got["group"], got["batch"]
    torch.testing.assert_close(g["old_log_prob"], b["old_log_prob"], rtol=0, atol=0)
    assert float(g["reward_mean"]) == float(b["reward_mean"])
    ga, ba = (x["advantage"].reshape(3, 3, -1) for x in (g, b))  # (group, rollout, rows of its decisions and steps)
    assert torch.equal(ga, ga[:, :, :1].expand_as(ga)) and torch.equal(ba, ba[:, :, :1].expand_as(ba))
    ga, ba = ga[:, :, 0], ba[:, :, 0]
    flat = (ga == 0).all(dim=1)
    assert torch.equal(flat, (ba == 0).all(dim=1)) and int((~flat).sum()) >= 2  # this round: one group flat, two not
    assert torch.allclose(ga.sum(dim=1), torch.zeros(3), atol=1e-5) and torch.allclose(
        ba.sum(dim=1), torch.zeros(3), atol=1e-5
    )
    ratio = ba[~flat] / ga[~flat]  # sigma_group / sigma_batch: one per group, positive
    assert (ratio > 0).all() and torch.allclose(ratio, ratio[:, :1].expand_as(ratio), rtol=1e-5)
    assert abs(float(ratio[0, 0]) - float(ratio[1, 0])) > 0.1  # the groups' spreads differ, so do their ratios


def test_cotrain_term_adds_the_weighted_flow_matching_loss(head, sims):
    """RL-Co's form: with a co-training batch the loss is the GRPO loss + weight x RECAP's flow-matching loss, on
    frames drawn by the step's (seed, epoch, position) uniforms (the same frames on a rerun)."""
    from reproduction.recap.policy.data import PolicyArrays
    from reproduction.recap.policy.task import PolicyCollator, PolicySamples
    from reproduction.recipes.grpo.task import GrpoBatcher
    from reproduction.train.task import BatchKeys

    n, rng = 12, np.random.default_rng(0)
    arrays = PolicyArrays(
        state=rng.standard_normal((n, 14)).astype(np.float32),
        chunk=np.minimum(np.arange(n)[:, None] + np.arange(4)[None], n - 1),
        action=rng.standard_normal((n, 4)).astype(np.float32),
        label=np.ones(n, bool),
        task_id=np.zeros(n, np.int64),
        source=np.zeros(n, np.int64),
        row=np.arange(n),
        episode=np.zeros(n, np.int64),
        frame=np.arange(n),
        tasks=list(head.tasks),
    )
    samples = PolicySamples(arrays, head.stats)
    rl = {"noise_level": 0.5, "clip_eps": 0.2, "kl_coef": 0.0, "cotrain_batch": 5, "cotrain_weight": 0.25}
    batcher = GrpoBatcher(
        head=head, ref=None, rl=rl, spec=SPEC, cotrain=(samples, PolicyCollator(head.collator.tokenizer, head.tasks))
    )
    keys = BatchKeys(indices=np.array([0, 1]), positions=np.array([0, 1]), epoch=3, seed=0)
    a, b = batcher.cotrain_batch(keys), batcher.cotrain_batch(keys)
    torch.testing.assert_close(a["actions"], b["actions"])
    assert a["state"].shape == (5, 14) and a["actions"].shape == (5, 4, 4)
    r = _run(head, sims, [10, 10], [1, 2])
    rows = loss_rows(r, np.array([[1.0, -1.0]]), pick_steps([1, 2], 3, 3, 1))
    batch = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in rows.items() if k not in ("task_id", "ref_mean")}
    batch.update(head.model_batch(rows["state"], rows["task_id"]))
    batch.update(reward_mean=torch.tensor(0.5), success_at_end=torch.tensor(0.5), zero_std_groups=torch.tensor(0.0))
    with torch.no_grad():
        plain, m0 = grpo_loss(head.model, batch, rl=rl, num_steps=3, dims=(2, 4))
        torch.manual_seed(5)
        both, m1 = grpo_loss(head.model, {**batch, "cotrain": a}, rl=rl, num_steps=3, dims=(2, 4))
    assert m0["cotrain_loss"] == 0.0 and m1["cotrain_loss"] > 0.0
    assert float(both) == pytest.approx(float(plain) + 0.25 * m1["cotrain_loss"], rel=1e-5)


def test_rollout_distances_match_the_sims_and_give_the_progress_reward(head, sims):
    """distances=True records each env's object-goal distance after reset and at the end (the same numbers the
    sims report, in workers too); the progress reward is success_at_end + clip(1 - end / start, -1, 1)."""
    from reproduction.recipes.grpo.envs import EnvWorkers
    from reproduction.recipes.grpo.objective import rollout_rewards

    resets, noises = [10, 10, 12, 12], [3, 4, 5, 6]
    envs = sims(4)
    r = rollout(head, envs, reset_seeds=resets, noise_seeds=noises, task_ids=[0] * 4, spec=SPEC, distances=True)
    assert r.distance_end.tolist() == [sim.goal_distance() for sim in envs]
    fresh = [envs[i].reset(s) and envs[i].goal_distance() for i, s in enumerate(resets)]
    assert r.distance_start.tolist() == fresh and r.distance_start[0] == r.distance_start[1]
    assert (r.distance_start > 0.0).all()
    gain = np.clip(1.0 - r.distance_end / r.distance_start, -1.0, 1.0)
    np.testing.assert_array_equal(rollout_rewards(r, "progress"), r.success_at_end + gain)
    np.testing.assert_array_equal(rollout_rewards(r, "success_at_end"), r.success_at_end.astype(float))
    workers = EnvWorkers(TASK, 4, 2)
    try:
        there = rollout(
            head, workers, reset_seeds=resets, noise_seeds=noises, task_ids=[0] * 4, spec=SPEC, distances=True
        )
    finally:
        workers.close()
    np.testing.assert_array_equal(there.distance_start, r.distance_start)
    np.testing.assert_array_equal(there.distance_end, r.distance_end)
    plain = _run(head, sims, resets, noises)
    assert plain.distance_start is None and plain.distance_end is None
    with pytest.raises(ValueError, match="needs rollouts with distances"):
        rollout_rewards(plain, "progress")


def test_progress_reward_by_hand():
    from types import SimpleNamespace

    from reproduction.recipes.grpo.objective import rollout_rewards

    r = SimpleNamespace(
        success_at_end=np.array([True, False, False, False]),
        success_once=np.array([True, True, False, False]),
        distance_start=np.array([0.2, 0.2, 0.1, 0.1]),
        distance_end=np.array([0.01, 0.1, 0.3, 0.1]),
    )
    np.testing.assert_allclose(rollout_rewards(r, "progress"), [1.95, 0.5, -1.0, 0.0])
    np.testing.assert_array_equal(rollout_rewards(r, "success_once"), [1.0, 1.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="unknown reward 'dense'"):
        rollout_rewards(r, "dense")
    with pytest.raises(ConfigError, match="rl.reward='dense' is not success_at_end, success_once or progress"):
        RlSection(reward="dense")
    with pytest.raises(ConfigError, match="rl.advantage_scale='rank' is not group, batch, none"):
        RlSection(advantage_scale="rank")
    with pytest.raises(ConfigError, match="rl.reward=progress needs the object-goal distance"):
        RlSection(reward="progress", tasks=["libero_10/0"], eval_episodes=2)
