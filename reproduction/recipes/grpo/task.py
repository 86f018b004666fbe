"""The `rl` stage's training job: GRPO as a `TrainTask` for the project's trainer (FSDP2, DCP, exact resume).

    <out>/grpo_setup.json     the RL config (fields not declared same_outputs()), eval.seed, the SFT export it
                              starts from (path, sha256 of its weights), tasks
    <out>/checkpoints/ metrics.jsonl    the trainer's (reproduction/train): DCP step_N/ every rl.save_every
    <out>/evidence/eval_rl_<step>.json  the live policy's evaluation every rl.eval_every steps (evidence format;
                              those above the step the stage ends at are removed: train.drop_live_evaluations_after)
    <out>/export/             model.safetensors, model_config.json, policy.json, tokenizer/ (load_policy reads it)

One trainer "sample" is one initial state: step s (epoch s - 1; the data set has exactly B = rl.init_states
items, unshuffled) belongs to rollout round r = (s - 1) // mu (mu = rl.updates_per_rollout), and position p of
the step's batch is init state i = r * B + p, reset from `reset_seed(rl.seed, "rollout", task, i)` (even
seeds, disjoint from the odd evaluation seeds). `make_batch` rolls out its micro batch's groups with the
CURRENT weights at the round's first step and keeps them for the round's mu updates; the loss is the PPO-clip +
KL objective on every (rollout, decision, denoising step). Rollout noise comes from per-rollout generators
seeded by (rl.seed, round, position, g), the trainer's RNG states are in every checkpoint, and checkpoints fall
on round boundaries (config rule), so a killed run resumed from its newest checkpoint takes the same steps.
With several trainer ranks each rank rolls out its own positions on a `RolloutCopy` (the sharded model's forward
is a collective; the copy's is not), synced from the trained weights at each round's first micro batch.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from reproduction.fsio import atomic_write_text

SETUP_NAME = "grpo_setup.json"
LIVE_EVAL_PREFIX = "eval_rl_"
"""<out>/evidence/<prefix><step>.json: the live evaluation of step <step> (train.drop_live_evaluations_after)."""


def init_reset_seed(seed: int, task: str, index: int) -> Any:
    """What RL init state `index` of `task` resets from (envs.init_reset: a Fetch seed of the "rollout" split, even
    seeds; a LIBERO (init-state index, seed) pair)."""
    from reproduction.recipes.grpo.envs import init_reset

    return init_reset(seed, task, index)


def noise_seed(seed: int, round_: int, position: int, member: int) -> int:
    """The seed of rollout `member` of the group of `position` in rollout round `round_`."""
    return int(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, 7, round_, position, member]).generate_state(1)[0])


def loss_rows(r: Any, advantages: np.ndarray, steps: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Rollouts -> one row per (rollout i, decision d, denoising step k): the loss's inputs as arrays, and the
    row's `decision` (i * D + d: its entry in decision_inputs(r), whose camera frames it reads).

    `steps` (n, D, K') picks K' of the K denoising steps of each decision (None: all K)."""
    n, d, k = r.log_prob.shape
    if steps is None:
        steps = np.broadcast_to(np.arange(k), (n, d, k))
    kp = steps.shape[2]
    i, dd = (a.reshape(-1) for a in np.meshgrid(np.arange(n), np.arange(d), np.arange(kp), indexing="ij")[:2])
    kk = np.asarray(steps, np.int64).reshape(-1)
    rows = {
        "state": r.state[i, dd],
        "task_id": r.task_id[i],
        "x": r.chain[i, dd, kk],
        "x_next": r.chain[i, dd, kk + 1],
        "k": kk,
        "old_log_prob": r.log_prob[i, dd, kk],
        "advantage": np.asarray(advantages, np.float32).reshape(-1)[i],
    }
    if r.ref_mean is not None:
        rows["ref_mean"] = r.ref_mean[i, dd, kk]
    rows["decision"] = i * d + dd
    return rows


def decision_inputs(r: Any) -> dict[str, np.ndarray]:
    """Rollouts -> one entry per (rollout i, decision d), at i * D + d: what the policy's prefix reads (state, task
    id, uint8 camera frames as FRAME + slot). A decision's K' loss rows share it, so the update builds images and
    runs the prefix once per decision, not once per row (loss_batch)."""
    n, d = r.state.shape[:2]
    out = {"state": r.state.reshape(n * d, *r.state.shape[2:]), "task_id": np.repeat(np.asarray(r.task_id), d)}
    for slot, f in (r.frames or {}).items():
        out[FRAME + slot] = f.reshape(n * d, *f.shape[2:])
    return out


def loss_batch(head: Any, parts: list[tuple[Any, np.ndarray, np.ndarray | None]]) -> dict[str, Any]:
    """The update's loss batch (CPU tensors) of (rollouts, advantages, steps) parts, in order: loss_rows' arrays,
    and the model's batch of their decisions with `prefix_index` mapping each row to its decision
    (PolicyHead.model_batch `rows`). With cameras 10 loss steps cost one image batch and one prefix per decision,
    not ten. Camera-free tiny: the same tensors as a batch built row by row."""
    import torch

    row_parts, dec_parts, offset = [], [], 0
    for r, advantages, steps in parts:
        rows, dec = loss_rows(r, advantages, steps), decision_inputs(r)
        rows["decision"] = rows["decision"] + offset
        offset += len(dec["task_id"])
        row_parts.append(rows)
        dec_parts.append(dec)
    rows = {k: np.concatenate([p[k] for p in row_parts]) for k in row_parts[0]}
    dec = {k: np.concatenate([p[k] for p in dec_parts]) for k in dec_parts[0]}
    batch = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in rows.items() if k not in ("task_id", "decision")}
    batch.update(head.model_batch(dec["state"], dec["task_id"], frames_of(dec), rows=rows["decision"]))
    return batch


FRAME = "frame:"
"""Prefix of decision_inputs' camera-frame arrays (FRAME + slot); model_batch turns them into images and masks."""


def frames_of(inputs: dict[str, Any]) -> dict[str, Any]:
    """{slot: frames} of decision_inputs (empty for a camera-free policy)."""
    return {k[len(FRAME) :]: v for k, v in inputs.items() if k.startswith(FRAME)}


def pick_steps(seeds: list[int], decisions: int, num_steps: int, count: int) -> np.ndarray:
    """(n, D, count) sorted denoising-step indices per (rollout, decision), drawn without replacement from a
    generator of each rollout's own seed (RLinf trains on one random denoising step per sampling call, the same for
    every env of the batch; count=K is all)."""
    if count >= num_steps:
        return np.broadcast_to(np.arange(num_steps), (len(seeds), decisions, num_steps)).copy()
    out = np.empty((len(seeds), decisions, count), np.int64)
    for i, s in enumerate(seeds):
        u = np.random.default_rng([int(s), 1]).random((decisions, num_steps))
        out[i] = np.sort(np.argsort(u, axis=1)[:, :count], axis=1)
    return out


@dataclass(kw_only=True)
class GrpoBatcher:
    """The trainer's `make_batch`: a micro batch of init states -> rollouts (once per round) -> loss rows."""

    head: Any
    """PolicyHead over the model being trained (the very module the trainer steps)."""
    ref: Any
    """PolicyHead of the frozen reference (SFT) policy, or None when kl_coef is 0."""
    rl: dict[str, Any]
    """The `rl` section (plain)."""
    spec: Any
    """RolloutSpec."""
    cotrain: Any = None
    """(PolicySamples, PolicyCollator) of the co-training dataset, or None."""
    copy: RolloutCopy | None = None
    """Several trainer ranks: the unsharded copy the rollouts run on (synced at each round's first batch)."""
    _cache: dict[Any, Any] = field(default_factory=dict)
    _pools: dict[str, Any] = field(default_factory=dict)

    def envs(self, task: str, n: int) -> Any:
        """n envs of `task`: FetchSims of this process, or (rl.rollout_workers > 1) an EnvWorkers group kept per
        (task, n) across rounds; LIBERO envs (5-15 s to build each) live in a LocalEnvs group kept per (task, n)."""
        from reproduction.recipes.grpo.envs import EnvWorkers, LocalEnvs, is_libero, make_sims

        workers = int(self.rl.get("rollout_workers", 1))
        cameras, size = self.head.sim_cameras(task), self.head.image_size  # what the policy reads, at its size
        if workers > 1 or is_libero(task):
            key = (task, n)
            if key not in self._pools:
                self._pools[key] = (
                    EnvWorkers(task, n, workers, cameras=cameras, image_size=size)
                    if workers > 1
                    else LocalEnvs(make_sims(task, n, cameras, size), owned=True)
                )
            return self._pools[key]
        from reproduction.sim.evaluate import EnvPool, EvalConfig

        pool = self._pools.get("pool")
        if pool is None:
            pool = self._pools["pool"] = EnvPool(EvalConfig(tasks=(task,), cameras=cameras, image_size=size, videos=0))
        return pool.get(task, n)

    def round_of(self, epoch: int) -> int:
        return epoch // int(self.rl["updates_per_rollout"])

    def __call__(self, keys: Any) -> dict[str, Any]:
        rnd = self.round_of(int(keys.epoch))
        positions = tuple(int(p) for p in keys.positions)
        key = (rnd, positions)
        if key not in self._cache:
            if self.copy is not None and not any(k[0] == rnd for k in self._cache):
                self.copy.sync()  # the round's first micro batch, on every rank at the same step
            self._cache = {k: v for k, v in self._cache.items() if k[0] == rnd}
            self._cache[key] = self.collect(rnd, positions)
        batch = dict(self._cache[key])
        if self.cotrain is not None:
            batch["cotrain"] = self.cotrain_batch(keys)
        return batch

    def collect(self, rnd: int, positions: tuple[int, ...]) -> dict[str, Any]:
        """Roll out the groups of `positions` in round `rnd` and build the loss batch (CPU tensors)."""
        import torch

        from reproduction.recipes.grpo.envs import episode_steps, task_language
        from reproduction.recipes.grpo.objective import group_advantages, rollout_rewards
        from reproduction.recipes.grpo.rollout import rollout

        rl, g_size, b = self.rl, int(self.rl["group_size"]), int(self.rl["init_states"])
        tasks = list(rl["tasks"])
        by_task: dict[str, list[tuple[int, int]]] = {}
        for p in positions:
            by_task.setdefault(tasks[p % len(tasks)], []).append((p, rnd * b + p))
        rolled, rewards_all, succ = [], [], []
        head = self.head if self.copy is None else self.copy.head
        was_training = head.model.training
        head.model.eval()
        try:
            for task, members in by_task.items():
                task_id = head.tasks.index(task_language(task))
                spec = dataclasses.replace(self.spec, episode_steps=episode_steps(task, rl.get("max_steps")))
                resets = [init_reset_seed(int(rl["seed"]), task, idx) for _, idx in members for _ in range(g_size)]
                noises = [noise_seed(int(rl["seed"]), rnd, p, g) for p, _ in members for g in range(g_size)]
                r = rollout(
                    head,
                    self.envs(task, len(resets)),
                    reset_seeds=resets,
                    noise_seeds=noises,
                    task_ids=[task_id] * len(resets),
                    spec=spec,
                    ref=self.ref,
                    distances=rl["reward"] == "progress",
                )
                rewards_all.append(rollout_rewards(r, str(rl["reward"])).reshape(len(members), g_size))
                steps = pick_steps(noises, r.log_prob.shape[1], self.spec.num_steps, int(rl["logprob_steps"]))
                rolled.append((r, steps))
                succ.append(r.success_at_end)
        finally:
            head.model.train(was_training)
        # after every task's groups: a batch scale divides by the std over all the groups collected together
        rewards = np.concatenate(rewards_all)
        advantages = group_advantages(rewards, str(rl["advantage_scale"]))
        bounds = np.cumsum([0, *(len(x) for x in rewards_all)])
        batch = loss_batch(
            self.head, [(r, advantages[lo:hi], steps) for (r, steps), lo, hi in zip(rolled, bounds, bounds[1:])]
        )
        batch["reward_mean"] = torch.tensor(float(rewards.mean()))
        batch["success_at_end"] = torch.tensor(float(np.concatenate(succ).mean()))
        batch["zero_std_groups"] = torch.tensor(float((rewards.std(axis=1) < 1e-8).mean()))
        return batch

    def cotrain_batch(self, keys: Any) -> dict[str, Any]:
        """A flow-matching batch of the co-training dataset: frames drawn by (seed, epoch, position) uniforms; with
        cameras (or state text) through stage 4's per-sample collator, which decodes each frame's images."""
        samples, collator = self.cotrain
        n = int(self.rl["cotrain_batch"])
        u = keys.uniforms(n)[0]  # n draws tied to the micro batch's first position
        idx = np.minimum((u * len(samples)).astype(np.int64), len(samples) - 1)
        if collator.cameras or collator.state_text:
            # BC rows: kind 0, label true, as collate_arrays gives them
            return collator([{**samples[int(i)], "kind": 0, "label": True} for i in idx])
        a = samples.arrays
        return collator.collate_arrays(
            state=samples.state[idx],
            actions=samples.action[a.chunk[idx]],
            task_ids=np.asarray(a.task_id[idx], np.int64),
            kinds=np.zeros(n, np.int64),
            labels=np.ones(n, bool),
        )


@dataclass(kw_only=True)
class RolloutCopy:
    """An unsharded copy of the trained policy for ranks that roll out on their own.

    With several trainer ranks the trained model is FSDP2-sharded, and its forward all-gathers weights: every rank
    would have to call it in lock step, but each rank rolls out its own init states (episodes of different lengths,
    another number of forwards). So each rank rolls out (and evaluates) on a whole copy, whose weights `sync` gathers
    from the trained model. The copy computes in fp32 (a bf16 trainer's rollout log-probs then differ from its
    training forward by bf16 rounding, as an inference engine's do)."""

    head: Any
    """PolicyHead over the copy (loaded from the SFT export, then synced)."""
    source: Any
    """The trained (sharded) module."""

    def sync(self) -> Any:
        """Collective: load the trained weights into the copy (moved to their device); returns the copy's head."""
        from reproduction.train.fsdp import full_state_dict

        full = full_state_dict(self.source)
        device = next(iter(full.values())).device
        self.head.model.to(device).load_state_dict(full, strict=True)
        self.head.model.eval().requires_grad_(False)  # never trained: no dropout, no gradients
        return self.head


def grpo_loss(model: Any, batch: dict[str, Any], *, rl: dict[str, Any], num_steps: int, dims: tuple[int, int]) -> Any:
    """The GRPO loss (objective.py) of a loss batch from `GrpoBatcher`; metrics with fixed keys."""
    import torch

    from reproduction.recipes.grpo import sde
    from reproduction.recipes.grpo.objective import ppo_clip_loss

    h, a = dims
    a_noise = float(rl["noise_level"])
    k = batch["k"]
    t = sde.timesteps(num_steps).to(k.device)[k].float()
    x = batch["x"]
    v = model(batch, x, t)
    mean = sde.sde_mean(x, v, k, num_steps, a_noise)[:, :h, :a]
    std = sde.step_stds(num_steps, a_noise).to(k.device)[k].float().view(-1, 1, 1)
    log_prob = sde.gaussian_log_prob(batch["x_next"][:, :h, :a], mean, std).sum(dim=(1, 2))
    kl = sde.step_kl(mean, batch["ref_mean"], std).sum(dim=(1, 2)) if "ref_mean" in batch else None
    loss, metrics = ppo_clip_loss(
        log_prob,
        batch["old_log_prob"],
        batch["advantage"],
        clip_eps=float(rl["clip_eps"]),
        kl=kl,
        kl_coef=float(rl["kl_coef"]),
    )
    cot = torch.zeros((), device=loss.device)
    if "cotrain" in batch:
        from reproduction.recap.policy.task import policy_loss

        cot, _ = policy_loss(model, batch["cotrain"])
        loss = loss + float(rl["cotrain_weight"]) * cot
    metrics.update(
        reward_mean=float(batch["reward_mean"]),
        rollout_success=float(batch["success_at_end"]),
        zero_std_groups=float(batch["zero_std_groups"]),
        cotrain_loss=float(cot.detach()),
    )
    return loss, metrics


def canary_batch(head: Any, num_steps: int, dims: tuple[int, int], with_ref: bool) -> dict[str, Any]:
    """A fixed loss batch (seeded arrays, not rollouts) whose loss the trainer checks after every load."""
    import torch

    rng = np.random.default_rng(0xC0FFEE)
    n, s = 4, len(head.stats["state_mean"])
    shape = (n, head.chunk, head.action_dim)
    rows = {
        "state": rng.standard_normal((n, s)).astype(np.float32),
        "x": rng.standard_normal(shape).astype(np.float32),
        "x_next": rng.standard_normal(shape).astype(np.float32),
        "k": (np.arange(n) % num_steps).astype(np.int64),
        "old_log_prob": rng.standard_normal(n).astype(np.float32),
        "advantage": np.array([1.0, -1.0, 0.5, -0.5], np.float32),
    }
    if with_ref:
        rows["ref_mean"] = rng.standard_normal((n, *dims)).astype(np.float32)
    size = head.image_size
    frames = {slot: rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8) for slot in sorted(head.cameras)}
    batch = {k: torch.from_numpy(v) for k, v in rows.items() if k != "state"}
    batch.update(head.model_batch(rows["state"], np.zeros(n, np.int64), frames))
    for name in ("reward_mean", "success_at_end", "zero_std_groups"):
        batch[name] = torch.tensor(0.0)
    return batch


def make_grpo_task(rank: int, world_size: int, *, setup_path: str, rollout_workers: int = 1) -> Any:
    """The trainer's factory (bind with functools.partial): the GRPO TrainTask of the setup at `setup_path`, its
    rollouts' envs over `rollout_workers` simulator processes (a same_outputs() field, so not in the setup)."""
    from reproduction.recap.policy.model import PolicyModelConfig, build_policy_model
    from reproduction.recap.policy.task import policy_blocks
    from reproduction.recipes.grpo.rollout import RolloutSpec, load_head
    from reproduction.train.task import TrainTask

    setup = json.loads(Path(setup_path).read_text(encoding="utf-8"))
    rl, sft = {**setup["rl"], "rollout_workers": int(rollout_workers)}, Path(setup["sft_export"])
    meta = json.loads((sft / "policy.json").read_text(encoding="utf-8"))
    mcfg = PolicyModelConfig.from_dict(setup["model_config"])
    head = load_head(sft, model=build_policy_model(mcfg, seed=0))
    ref = None
    if float(rl["kl_coef"]) > 0:
        ref = load_head(sft)
        ref.model.eval().requires_grad_(False)
    spec = RolloutSpec(
        num_steps=int(meta["num_steps"]), noise_level=float(rl["noise_level"]), execute_steps=int(meta["execute_steps"])
    )
    dims = (min(spec.execute_steps, head.chunk), head.env_action_dim)
    cotrain = _cotrain_inputs(setup, head) if setup.get("cotrain") else None
    copy = RolloutCopy(head=load_head(sft), source=head.model) if world_size > 1 else None
    return TrainTask(
        model=head.model,
        train_dataset=list(range(int(rl["init_states"]))),
        collate=_no_collate,
        loss=functools.partial(grpo_loss, rl=rl, num_steps=spec.num_steps, dims=dims),
        make_batch=GrpoBatcher(head=head, ref=ref, rl=rl, spec=spec, cotrain=cotrain, copy=copy),
        canary_batch=canary_batch(head, spec.num_steps, dims, ref is not None),
        evaluate=functools.partial(
            evaluate_live, head=head, meta=meta, setup=setup, out_dir=str(Path(setup_path).parent), copy=copy
        ),
        fsdp_units=policy_blocks,
        export_extras=functools.partial(write_export_extras, sft=str(sft), meta=meta),
        model_config=mcfg.to_dict(),
    )


def _no_collate(samples: list[Any]) -> Any:
    raise RuntimeError("the GRPO task builds its batches with make_batch (rollouts), never by collate")


def _cotrain_inputs(setup: dict[str, Any], head: Any) -> tuple[Any, Any]:
    """(PolicySamples, PolicyCollator) of the co-training dataset, normalised with the SFT policy's stats. A policy
    that reads cameras (or pi05's state text) gets stage 4's samples and collator: each frame's images decoded from
    the dataset (fingerprint-checked against the setup's), as the SFT stage trained on them."""
    from reproduction.recap.policy.data import PolicyArrays
    from reproduction.recap.policy.task import PolicyCollator, PolicySamples

    cot = setup["cotrain"]
    arrays = PolicyArrays.load(Path(cot["arrays"]))  # task ids already on the SFT task list
    if head.cameras or head.state_text:
        samples = PolicySamples(
            arrays,
            head.stats,
            cameras=head.cameras,
            sources=[{"path": cot["path"], "name": cot["name"]}],
            fingerprints={cot["name"]: cot["fingerprint"]},
            image_size=head.image_size,
        )
        return samples, head.collator
    samples = PolicySamples(arrays, head.stats)
    return samples, PolicyCollator(head.collator.tokenizer, head.tasks, action_dim=head.action_dim)


def evaluate_live(
    model: Any,
    ctx: Any,
    *,
    head: Any,
    meta: dict[str, Any],
    setup: dict[str, Any],
    out_dir: str,
    copy: RolloutCopy | None = None,
) -> dict[str, float]:
    """Success of the live weights (the export's ODE sampler) on the first `rl.eval_episodes` held-out episodes
    per task; rank 0 writes them as evidence (reproduction/run/evidence.py) to <out>/evidence/eval_rl_<step>.json.
    With several ranks (`copy`) every rank evaluates the same episodes on its synced copy: the same rates on
    each, no collective inside the episodes."""
    from reproduction.recap.policy.export import GuidedPolicy
    from reproduction.recipes.grpo.envs import is_libero
    from reproduction.recipes.grpo.stages import _counts, libero_settings
    from reproduction.run import evidence

    rl, ev = setup["rl"], setup["eval"]
    if copy is not None:
        model = copy.sync().model
    policy = GuidedPolicy(
        model=model,
        meta=meta,
        tokenizer=head.collator.tokenizer,
        guidance_scale=1.0,
        num_steps=int(meta["num_steps"]),
        seed=0,
    )
    tasks, episodes = list(rl["tasks"]), int(rl["eval_episodes"])
    settings: dict[str, Any] = {"tasks": tasks, "episodes_per_task": episodes, "recipe": "grpo"}
    if any(is_libero(t) for t in tasks):  # LIBERO's protocol on the first N init states, rl's horizon
        from reproduction.sim.libero.protocol import evaluate_libero

        cameras = head.sim_cameras(tasks[0])
        found = evaluate_libero(
            tasks,
            episodes,
            policy,
            chunk=int(meta["execute_steps"]),
            cameras=bool(cameras),
            image_size=head.image_size,
            max_steps=rl.get("max_steps"),
            seed=int(ev["seed"]),
        )
        counts = found.evidence_counts()
        settings.update(
            simulator="libero",
            libero=libero_settings(rl.get("max_steps"), head.cameras if cameras else None, head.image_size),
        )
        n = max(1, len(found.episodes))
        rates = {
            "success_at_end": sum(bool(e.success_at_end) for e in found.episodes) / n,
            "success_once": sum(e.success_once for e in found.episodes) / n,
        }
    else:
        from reproduction.sim.evaluate import EvalConfig, evaluate

        cfg = EvalConfig(
            tasks=tuple(tasks),
            episodes_per_task=episodes,
            seed=int(ev["seed"]),
            execute_steps=int(meta["execute_steps"]),
            videos=0,
            workers=1,
            cameras=head.sim_cameras(tasks[0]),  # the cameras the policy reads, at its size (camera-free: none)
            image_size=head.image_size,
        )
        result = evaluate(lambda: policy, cfg)
        counts = _counts(result)
        rates = {"success_at_end": result.success_at_end_rate, "success_once": result.success_once_rate}
    if ctx.rank == 0:
        record = evidence.EvalRecord(result=counts, label="grpo", mode="other", step=ctx.step)
        doc = evidence.build_evidence(
            record,
            name=f"grpo during training, step {ctx.step}",
            run_id=Path(out_dir).parent.name,
            seeds={"eval": int(ev["seed"]), "rl": int(rl["seed"])},
            settings=settings,
        )
        evidence.write_evidence(Path(out_dir) / "evidence" / f"{LIVE_EVAL_PREFIX}{ctx.step}.json", doc)
    return rates


def write_export_extras(folder: Path, *, sft: str, meta: dict[str, Any]) -> None:
    """policy.json (the SFT export's, marked as GRPO-trained) and the tokenizer, next to the weights."""
    out = dict(meta)
    out["algorithm"] = "grpo"
    atomic_write_text(Path(folder) / "policy.json", json.dumps(out, indent=1, sort_keys=True))
    shutil.copytree(Path(sft) / meta["tokenizer"], Path(folder) / meta["tokenizer"], dirs_exist_ok=True)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
