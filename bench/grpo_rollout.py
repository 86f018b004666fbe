"""Bench GRPO's rollout throughput: simulator steps/s of `rollout()` against the raw loop with the same policy forward.

    python bench/grpo_rollout.py EXPORT [n_envs]      EXPORT: a tiny policy export (e.g. a GRPO run's sft/export)

Both step the same n FetchPush-v4 envs (one process) for one 50-step episode from the same reset seeds. The raw
loop asks the policy every `execute_steps` steps with the export's Euler sampler (K batched velocity forwards);
`rollout()` runs the flow-SDE chain (K forwards, log-probs), the reference policy's step means (one forward over
n x K rows) and keeps the arrays the loss reads. Best of ROUNDS alternating rounds; last line
`ratio: X.XX (goal >= 0.8)`.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ROUNDS = 3


def main(argv: list[str]) -> int:
    import numpy as np
    import torch

    from reproduction.recap.policy.flow import euler_sample
    from reproduction.recipes.grpo.rollout import RolloutSpec, load_head, rollout
    from reproduction.sim.evaluate import EnvPool, EvalConfig

    torch.set_num_threads(1)
    head, ref = load_head(argv[0]), load_head(argv[0])
    n = int(argv[1]) if len(argv) > 1 else 64
    spec = RolloutSpec(num_steps=10, noise_level=0.5, execute_steps=2)
    pool = EnvPool(EvalConfig(tasks=("FetchPush-v4",), cameras=()))
    sims = pool.get("FetchPush-v4", n)
    seeds = list(range(0, 2 * n, 2))

    def raw() -> None:
        obs = [sim.reset(s) for sim, s in zip(sims, seeds)]
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for step in range(0, spec.episode_steps, spec.execute_steps):
                raw_state = np.stack([np.concatenate([o["observation.state"], o["observation.goal"]]) for o in obs])
                batch = head.model_batch(head.normalise_state(raw_state), np.zeros(n, np.int64))
                noise = torch.randn((n, head.chunk, head.action_dim), generator=g)
                x = euler_sample(lambda x, t: head.velocity(batch, x, t), noise, spec.num_steps)
                actions = head.to_env(x.numpy())
                for j in range(spec.execute_steps):
                    obs = [sim.step(actions[i, j])[0] for i, sim in enumerate(sims)]

    def grpo() -> None:
        rollout(head, sims, reset_seeds=seeds, noise_seeds=list(range(n)), task_ids=[0] * n, spec=spec, ref=ref)

    times: dict[str, list[float]] = {"raw": [], "grpo": []}
    for _ in range(ROUNDS):
        for name, fn in (("raw", raw), ("grpo", grpo)):
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    pool.close()
    steps = n * spec.episode_steps
    rates = {k: steps / min(v) for k, v in times.items()}
    print(f"raw loop: {rates['raw']:.0f} sim steps/s; grpo rollout: {rates['grpo']:.0f} sim steps/s ({n} envs)")
    print(f"ratio: {rates['grpo'] / rates['raw']:.2f} (goal >= 0.8)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
