"""Small Fetch-shaped LeRobot datasets for the policy tests: state, goal, 4-D actions, is_success, labels; and a
smaller rollout with the overrides that run the value stages on it in seconds (write_small_rollout, tiny_value).

In write_policy_dataset a point moves in 3-D toward a goal. "Good" episodes step toward the goal (action =
clipped goal - position, gripper +1) and succeed; "bad" ones push a fixed wrong direction and fail. Advantage labels
(written as a stage-3 sidecar with the dataset's fingerprint) are True on good episodes' frames. Episode ids are
non-contiguous (3*i + 2) to keep joins by id honest.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

TASK = "push the cube to the target"
CAMERA = "observation.images.agentview"


def write_policy_dataset(
    root: Path, *, episodes: int = 12, length: int = 10, seed: int = 0, camera: bool = False, success: bool = True
) -> Path:
    """Write the dataset at `root` (half good, half bad episodes); `success=False` omits is_success."""
    from reproduction.data.writer import EpisodeData, write_dataset

    rng = np.random.default_rng(seed)
    eps = []
    for i in range(episodes):
        good = i % 2 == 0
        pos = rng.uniform(-0.3, 0.3, size=3).astype(np.float32)
        goal = rng.uniform(-0.3, 0.3, size=3).astype(np.float32)
        states, actions, ok = [], [], []
        for _ in range(length):
            if good:
                act = np.clip((goal - pos) * 5, -1, 1)
            else:
                act = np.array([0.5, -0.5, 0.0])
            act = np.r_[act, 1.0 if good else -1.0].astype(np.float32)
            states.append(np.r_[pos, np.zeros(2)].astype(np.float32))
            actions.append(act)
            pos = (pos + 0.05 * act[:3]).astype(np.float32)
            ok.append(bool(np.linalg.norm(pos - goal) < 0.05))
        n = length
        frames = {
            "observation.state": np.stack(states),
            "observation.goal": np.repeat(goal[None], n, axis=0),
            "action": np.stack(actions),
        }
        if success:
            frames["is_success"] = np.array(ok) if good else np.zeros(n, bool)
            if good:
                frames["is_success"][-1] = True
        if camera:
            img = np.zeros((n, 32, 32, 3), np.uint8)
            img[:, :, :, 0] = 200 if good else 20
            frames[CAMERA] = img
        eps.append(EpisodeData(episode_index=3 * i + 2, task=TASK, frames=frames))
    features = {
        "observation.state": {"dtype": "float32", "shape": [5]},
        "observation.goal": {"dtype": "float32", "shape": [3]},
        "action": {"dtype": "float32", "shape": [4]},
    }
    if success:
        features["is_success"] = {"dtype": "bool", "shape": [1]}
    if camera:
        features[CAMERA] = {"dtype": "image", "shape": [32, 32, 3]}
    write_dataset(root, eps, fps=10, features=features, tasks=[TASK], allow_id_gaps=True)  # ids 3i + 2
    return Path(root)


def write_labels(root: Path, out: Path, *, tag: str = "t", drop: int = 0) -> Path:
    """An advantages sidecar for `root` in `out/<name>/`: label = good episode; `drop` rows left out."""
    import pyarrow as pa

    from reproduction.data.reader import open_dataset
    from reproduction.recap.sidecars import sidecar_name, write_sidecar

    ds = open_dataset(root)
    table = ds.frame_table(["episode_index", "frame_index"])
    ep = table.column("episode_index").to_numpy().astype(np.int64)
    fr = table.column("frame_index").to_numpy().astype(np.int64)
    label = ((ep - 2) // 3) % 2 == 0
    keep = slice(0, len(ep) - drop)
    t = pa.table(
        {
            "episode_index": ep[keep],
            "frame_index": fr[keep],
            "advantage_continuous": label[keep].astype(np.float64),
            "advantage": label[keep],
        }
    )
    meta = {"kind": "advantages", "tag": tag, "dataset": ds.name, "dataset_fingerprint": ds.fingerprint}
    write_sidecar(Path(out) / ds.name / sidecar_name("advantages", tag), t, meta)
    return Path(out)


SMALL_FEATURES = {
    "observation.state": {"dtype": "float32", "shape": [3]},
    "observation.goal": {"dtype": "float32", "shape": [2]},
    "action": {"dtype": "float32", "shape": [2]},
    "is_success": {"dtype": "bool", "shape": [1]},
}


def write_small_rollout(root: Path, *, bad: str | None = None, value=np.nan) -> Path:
    """Three episodes of 3, 5 and 4 frames (task "pick", each a success at its last frame) at `root`; `bad` (a
    feature) holds `value` at episode 1 frames 3 and 1 (component 1) when given."""
    from reproduction.data.writer import EpisodeData, write_dataset

    eps = []
    for e, n in enumerate([3, 5, 4]):
        frames = {
            "observation.state": np.full((n, 3), e, np.float32),
            "observation.goal": np.ones((n, 2), np.float32),
            "action": np.full((n, 2), 0.5 * e, np.float32),
            "is_success": np.arange(n) == n - 1,
        }
        if bad and e == 1:
            frames[bad][[3, 1], 1] = value
        eps.append(EpisodeData(episode_index=e, task="pick", frames=frames))
    return write_dataset(root, eps, fps=10, features=SMALL_FEATURES)


def tiny_value(workers: int) -> list[str]:
    """`portable run` overrides for write_small_rollout's datasets: a tiny value model trained in process on CPU for
    two steps, inferred by `workers` (Ray workers when more than one), advantages with lookahead 2."""
    return [
        "value.model.preset=tiny",
        "value.model.folds=1",
        "value.model.augment=false",
        "value.model.cameras={base_0_rgb: observation.images.none}",
        "value.train.max_steps=2",
        "value.train.global_batch=4",
        "value.train.micro_batch=4",
        "value.train.launcher=inprocess",
        "value.train.device=cpu",
        f"value.infer.workers={workers}",
        "value.infer.device=cpu",
        "advantages.lookahead=2",
    ]
