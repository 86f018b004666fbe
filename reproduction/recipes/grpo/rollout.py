"""Group rollouts: B initial states x G rollouts each, stepped in lockstep with one batched policy forward.

    for each decision (every `execute_steps` env steps, 50 / 2 = 25 per Fetch episode):
        observation (n, S) -> normalised state (and the cameras the policy reads, uint8 frames); the model batch
        as stage 4 builds it; the prefix (cameras + prompt) ONCE, then one flow-SDE chain for all n = B * G envs
        (sde.sample_chain): one batched expert (velocity) pass per denoising step over that prefix; the reference
        policy's step means at the same points (its own prefix once, one expert pass over n * K rows); the
        executed actions step every env
    reward of a rollout = success at the episode's end (or at any step), in {0, 1}, or (Fetch) that success plus
    the share of the object's distance to the goal the episode removed (objective.rollout_rewards)

Deterministic given the seeds: an env's reset seed fixes its initial state, and its noise (initial noise and
every step's z) comes from its own torch.Generator seeded by `noise_seeds[i]`, drawn in a fixed order, so a
rollout does not depend on which other rows share the batch. The envs step in this process or in simulator
worker processes (envs.py); the policy forward stays one batched call over all rows here. `PolicyHead` adapts a
stage-4 policy (reproduction/recap/policy: `tiny`, camera-free or with cameras, and `pi05`) for batched calls over
arrays; its state is the export's (Fetch: state + goal; LIBERO: the export's state_keys and state_dims, as
GuidedPolicy reads them). A camera-free tiny batch carries each distinct prompt once (its prefix runs once per
prompt); a batch with cameras, or pi05's (openpi's prompt, pi05.PROMPTS: the state as text only for an export trained
with discrete_state_input), goes through stage 4's collator sample by sample, each frame through `to_pixels`, as
GuidedPolicy.batch builds it; states and actions are (un)normalised as the export's stats say (normalize.py).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from reproduction.recipes.grpo import sde


@dataclass(kw_only=True)
class PolicyHead:
    """Batched velocity of a stage-4 policy over (normalised state, task id[, camera frames]) rows."""

    model: Any
    collator: Any
    """recap.policy.task.PolicyCollator with the export's tasks."""
    stats: dict[str, Any]
    chunk: int
    action_dim: int
    """The model's action width (the env's 4 for tiny)."""
    env_action_dim: int
    tasks: list[str]
    state_keys: list[str] = dataclasses.field(default_factory=list)
    """The observation features the policy's state concatenates (the export's; [] = state, and goal where given)."""
    state_dims: list[int] | None = None
    """Indices of that vector the policy reads (the export's; None = all)."""
    cameras: dict[str, str] = dataclasses.field(default_factory=dict)
    """Model camera slot -> observation key (the export's; {} = camera-free)."""
    image_size: int = 64
    """The model's camera resolution: the envs render at it (to_pixels then keeps the frame, as stage 4 would
    resize any other); 64, unused, for a camera-free policy."""
    state_text: bool = False
    """pi05: a pi0.5 prompt (the collator's state_text: the per-sample path; the state is in the text only for an
    export trained with discrete_state_input)."""

    def sim_cameras(self, task: str) -> tuple[str, ...]:
        """The cameras `task`'s envs render for this policy (() for a camera-free one): Fetch's camera names, or
        LIBERO's (a LIBERO env renders both when it renders any)."""
        from reproduction.recipes.grpo.envs import is_libero
        from reproduction.sim.cameras import camera_names

        return camera_names(self.cameras, key="the policy's cameras", libero=is_libero(task))

    @property
    def plain(self) -> bool:
        """A camera-free, text-state-free head: batches carry each distinct prompt once."""
        return not self.cameras and not self.state_text

    def frames(self, obs: list[dict[str, Any]]) -> dict[str, np.ndarray]:
        """{slot: (n, H, W, 3) uint8} the frames of the cameras the policy reads ({} for a camera-free head)."""
        return {slot: np.stack([np.asarray(o[key], np.uint8) for o in obs]) for slot, key in self.cameras.items()}

    def raw_state(self, obs: list[dict[str, Any]]) -> np.ndarray:
        """(n, S) the policy's raw state of n observations, as the export's GuidedPolicy builds it: the export's
        state_keys concatenated (LIBERO: robot state + privileged object state), its state_dims picked."""
        keys = self.state_keys or ["observation.state"] + (["observation.goal"] if "observation.goal" in obs[0] else [])
        raw = np.stack([np.concatenate([np.asarray(o[k], np.float32).reshape(-1) for k in keys]) for o in obs])
        return raw[:, list(self.state_dims)] if self.state_dims is not None else raw

    @property
    def s_mean(self) -> np.ndarray:
        return np.asarray(self.stats["state_mean"], np.float32)

    @property
    def s_std(self) -> np.ndarray:
        return np.asarray(self.stats["state_std"], np.float32)

    def normalise_state(self, raw: np.ndarray) -> np.ndarray:
        """The export's normalisation (recap/policy/normalize.py: z-score, or pi05's quantiles)."""
        from reproduction.recap.policy.normalize import Normalizer

        return Normalizer(self.stats).state(raw)

    def to_env(self, x: np.ndarray) -> np.ndarray:
        """Normalised actions (..., A) -> env actions (..., env dims), as the export's GuidedPolicy unnormalises."""
        from reproduction.recap.policy.normalize import Normalizer

        return Normalizer(self.stats).unaction(x[..., : self.env_action_dim])

    def model_batch(
        self,
        state: np.ndarray,
        task_ids: np.ndarray,
        frames: dict[str, np.ndarray] | None = None,
        rows: np.ndarray | None = None,
    ) -> dict[str, Any]:
        """The model's batch for rows (normalised state, task id, and `frames` {slot: (n, H, W, 3) uint8} when the
        policy reads cameras). Camera-free tiny: each distinct prompt once (its prefix runs once). Otherwise stage
        4's inference batch (GuidedPolicy.batch): samples through the collator, every frame through to_pixels at
        the model's size, the plain prompt (pi05: with the state as text); input_ids, attention_mask, images,
        image_masks, state.

        `rows` (m,) int64: the batch's rows are rows[j] of the n given (GRPO's update: a decision's K loss rows share
        its state and frames). With cameras (or pi05) the images and prompts stay one per given row and
        `prefix_index` = rows maps each batch row to its prefix, which the model then runs n times, not m; the
        state is per batch row. Camera-free tiny: the rows expanded (its prompts are de-duplicated anyway)."""
        if self.plain:
            tids = np.asarray(task_ids, np.int64)
            if rows is not None:
                state, tids = state[rows], tids[rows]
            ids, mask, index = self.collator.prompt_table(tids, np.zeros(len(tids), np.int64))
            return {
                "state": torch.from_numpy(np.ascontiguousarray(state, np.float32)),
                "prompt_ids": ids,
                "prompt_mask": mask,
                "prompt_index": index,
            }
        from reproduction.recap.policy.conditioning import PLAIN
        from reproduction.recap.value.data import to_pixels

        frames = frames or {}
        missing = [slot for slot in self.cameras if slot not in frames]
        if missing:
            raise ValueError(f"the policy reads cameras {missing}: pass their frames")
        samples = []
        for i, tid in enumerate(np.asarray(task_ids, np.int64).tolist()):
            sample = {"state": np.asarray(state[i], np.float32), "actions": np.zeros((1, 1), np.float32)}
            sample.update(task_id=tid, label=True, kind=PLAIN)
            sample["images"] = {slot: to_pixels(frames[slot][i], self.image_size) for slot in self.cameras}
            samples.append(sample)
        out = self.collator(samples)
        keep = ("state", "input_ids", "attention_mask", "images", "image_masks")
        batch = {k: out[k] for k in keep if k in out}
        if rows is not None:
            index = torch.from_numpy(np.ascontiguousarray(rows, np.int64))
            batch["prefix_index"] = index
            if "state" in batch:
                batch["state"] = batch["state"].index_select(0, index)
        return batch

    def velocity(self, batch: dict[str, torch.Tensor], x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """The model's forward (prefix and expert) on `batch`: what the loss differentiates."""
        return self.model(batch, x, t)

    @property
    def sharded(self) -> bool:
        """An FSDP2-sharded model (one trainer rank in bf16; several ranks roll out on an unsharded copy,
        task.RolloutCopy): its root weights are gathered in `forward` only, so the rollout runs the whole forward per
        denoising step instead of reusing a prefix cache."""
        from torch.distributed.fsdp import FSDPModule

        return isinstance(self.model, FSDPModule)

    def step_velocity(self, batch: dict[str, Any]) -> Any:
        """velocity(x, t) of `batch`'s rows for a sampler: the prefix once, then the expert alone per call (the
        whole forward per call on a sharded model)."""
        if self.sharded:
            return lambda x, t: self.velocity(batch, x, t)
        cache = self.prefix(batch)
        return lambda x, t: self.model.velocity(cache, x, t)

    def prefix(self, batch: dict[str, Any], rows: torch.Tensor | None = None) -> Any:
        """The model's prefix cache of `batch` (cameras + prompt through the VLM, once), for its rows or, with
        `rows` (m,) int64, for rows[j] of the batch at position j (the prefix still runs once per batch row).
        `self.model.velocity(cache, x, t)` then runs the expert alone: what each denoising step reuses."""
        prefix, valid, index = self.model.encode_prefix(batch)
        state = batch["state"]
        if rows is not None:
            index = rows if index is None else index.index_select(0, rows)
            state = state.index_select(0, rows)
        return self.model.prefix_cache(prefix, valid, index, state)


def load_head(export_dir: Path | str, *, model: Any = None) -> PolicyHead:
    """The PolicyHead of a policy export (its weights loaded strictly into `model`, or a new model)."""
    from reproduction.recap.policy.export import read_export
    from reproduction.recap.policy.model import PolicyModelConfig, build_policy_model
    from reproduction.recap.policy.pi05 import export_prompt_style
    from reproduction.recap.policy.task import PolicyCollator
    from reproduction.recap.tokenizer import load_tokenizer
    from reproduction.recap.value.weights import load_safetensors_strict

    export_dir = Path(export_dir)
    meta = read_export(export_dir)
    mcfg = PolicyModelConfig.from_dict(json.loads((export_dir / "model_config.json").read_text(encoding="utf-8")))
    if model is None:
        model = build_policy_model(mcfg)
    load_safetensors_strict(model, export_dir / "model.safetensors")
    pi05 = mcfg.preset == "pi05"
    tokenizer = load_tokenizer(export_dir / meta["tokenizer"])
    if mcfg.cameras or pi05:  # stage 4's collator, as make_policy_task builds it
        collator = PolicyCollator(
            tokenizer,
            list(meta["tasks"]),
            cameras=mcfg.cameras,
            image_size=mcfg.image_size,
            action_dim=mcfg.action_dim,
            prompt=export_prompt_style(meta),  # pi05: openpi's prompt (the state as text only if trained so)
        )
    else:
        collator = PolicyCollator(tokenizer, list(meta["tasks"]))
    return PolicyHead(
        model=model,
        collator=collator,
        stats=meta["stats"],
        chunk=int(meta["chunk"]),
        action_dim=mcfg.action_dim,
        env_action_dim=len(meta["stats"]["action_mean"]),
        tasks=list(meta["tasks"]),
        state_keys=list(meta.get("state_keys") or []),
        state_dims=None if meta.get("state_dims") is None else [int(d) for d in meta["state_dims"]],
        cameras=dict(meta.get("cameras") or {}),
        image_size=mcfg.image_size if mcfg.cameras else 64,
        state_text=pi05,
    )


@dataclass(kw_only=True, frozen=True)
class RolloutSpec:
    """How rollouts sample and step."""

    num_steps: int
    """K denoising steps."""
    noise_level: float
    """Flow-SDE noise level a."""
    execute_steps: int
    """Actions of each chunk executed before the next decision."""
    episode_steps: int = 50
    """Policy steps per episode (Fetch: always 50; LIBERO: the suite's limit or rl.max_steps; envs.episode_steps)."""


@dataclass(kw_only=True)
class Rollouts:
    """n rollouts' decisions (D per episode) as arrays; row i of every array is rollout i."""

    state: np.ndarray
    """(n, D, S) float32 normalised state + goal at each decision."""
    task_id: np.ndarray
    """(n,) int64 index into the head's task list."""
    chain: np.ndarray
    """(n, D, K + 1, H, A) float32 the SDE chains (x_0 noise ... x_K the chunk)."""
    log_prob: np.ndarray
    """(n, D, K) float32 each step's log-prob under the sampling policy (executed dims)."""
    ref_mean: np.ndarray | None
    """(n, D, K, h, a) float32 the reference policy's step means at the chain's points (executed dims)."""
    frames: dict[str, np.ndarray] | None = None
    """{slot: (n, D, H, W, 3) uint8} the camera frames each decision read (None for a camera-free policy): the
    update recomputes the velocities from them."""
    success_once: np.ndarray
    success_at_end: np.ndarray
    """(n,) bool outcomes."""
    distance_start: np.ndarray | None = None
    distance_end: np.ndarray | None = None
    """(n,) float64 metres from object to goal after reset and at the end (Fetch; None unless asked for)."""


def rollout(
    head: PolicyHead,
    envs: Any,
    *,
    reset_seeds: list[int],
    noise_seeds: list[int],
    task_ids: list[int],
    spec: RolloutSpec,
    ref: PolicyHead | None = None,
    distances: bool = False,
) -> Rollouts:
    """Run len(envs) episodes in lockstep (module docstring); env i is reset with `reset_seeds[i]`.

    `reset_seeds`: what each env's reset takes (envs.init_reset: a Fetch seed, or a LIBERO (init index, seed)).
    `distances`: also record the object-goal distance after reset and at the end (envs.goal_distance: Fetch only).
    `envs`: a list of FetchSims of this process, or an env group (envs.py: LocalEnvs, EnvWorkers). The models are
    only read (no grad); the envs' state is mutated. Raises what the sim (or a dead worker) raises."""
    from reproduction.recipes.grpo.envs import LocalEnvs

    if isinstance(envs, list):
        envs = LocalEnvs(envs)
    n, k_steps = len(envs), spec.num_steps
    h, a = min(spec.execute_steps, head.chunk), head.env_action_dim
    gens = []
    for s in noise_seeds:
        g = torch.Generator()
        g.manual_seed(int(s))
        gens.append(g)
    obs = envs.reset([k if isinstance(k, tuple) else int(k) for k in reset_seeds])
    d_start = envs.goal_distance() if distances else None
    tids = np.asarray(task_ids, np.int64)
    states, chains, logps, refs = [], [], [], []
    frames: dict[str, list[np.ndarray]] = {slot: [] for slot in head.cameras}
    once = np.zeros(n, bool)
    shape = (head.chunk, head.action_dim)
    step = 0
    with torch.no_grad():
        while step < spec.episode_steps:
            state = head.normalise_state(head.raw_state(obs))
            seen = head.frames(obs)
            velocity = head.step_velocity(head.model_batch(state, tids, seen))  # prefix once, reused by the K steps
            draws = [torch.randn((1 + k_steps, *shape), generator=g) for g in gens]  # per env, fixed order
            noise = torch.stack([d[0] for d in draws])
            step_noise = torch.stack([d[1:] for d in draws], dim=1)  # (K, n, H, A)
            chain, _, logp = sde.sample_chain(velocity, noise, step_noise, k_steps, spec.noise_level, (h, a))
            if ref is not None:
                refs.append(reference_means(ref, state, tids, chain, spec, frames=seen)[..., :h, :a])
            states.append(state)
            for slot, f in seen.items():
                frames[slot].append(f)
            chains.append(chain.numpy())
            logps.append(logp.numpy())
            j = min(h, spec.episode_steps - step)
            obs, hit = envs.step(head.to_env(chain[:, -1, :j].numpy()))
            once |= hit
            step += j
    return Rollouts(
        state=np.stack(states, 1),
        task_id=tids,
        chain=np.stack(chains, 1).astype(np.float32),
        log_prob=np.stack(logps, 1).astype(np.float32),
        ref_mean=np.stack(refs, 1).astype(np.float32) if ref is not None else None,
        frames={slot: np.stack(f, 1) for slot, f in frames.items()} if head.cameras else None,
        success_once=once,
        success_at_end=np.asarray(envs.success(), bool),
        distance_start=d_start,
        distance_end=envs.goal_distance() if distances else None,
    )


def reference_means(
    ref: PolicyHead,
    state: np.ndarray,
    task_ids: np.ndarray,
    chain: torch.Tensor,
    spec: RolloutSpec,
    frames: dict[str, np.ndarray] | None = None,
) -> np.ndarray:
    """(n, K, H, A) the reference policy's SDE step means at the chain's points x_0..x_{K-1}: its prefix once per
    row (`frames`: the rows' camera frames), one expert pass over the n * K points."""
    n, k_steps = chain.shape[0], spec.num_steps
    x = chain[:, :k_steps].reshape(n * k_steps, *chain.shape[2:])
    kk = torch.arange(k_steps).repeat(n)
    t = sde.timesteps(k_steps)[kk].float()
    rows = np.repeat(np.arange(n), k_steps)
    if ref.sharded:  # the whole forward over the n * K rows (with cameras: the prefix once per row of n)
        v = ref.velocity(ref.model_batch(state, task_ids, frames, rows=rows), x, t)
    else:
        v = ref.model.velocity(ref.prefix(ref.model_batch(state, task_ids, frames), rows=torch.from_numpy(rows)), x, t)
    mean = sde.sde_mean(x, v, kk, k_steps, spec.noise_level)
    return mean.reshape(n, k_steps, *chain.shape[2:]).numpy()
