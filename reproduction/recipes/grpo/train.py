"""`train_grpo`: write the rl stage's setup (refusing a changed one on resume) and run the trainer on task.py's job."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from reproduction.config_fields import added_defaults, output_free_keys
from reproduction.errors import CheckpointError, ConfigError
from reproduction.fsio import atomic_write_text
from reproduction.recipes.grpo.config import RlSection
from reproduction.recipes.grpo.task import LIVE_EVAL_PREFIX, SETUP_NAME, file_sha256, make_grpo_task

OUTPUT_FREE = output_free_keys(RlSection)
"""rl fields declared `same_outputs()` (config.py): left out of the stage's key and of grpo_setup.json, one of its
outputs (audit62 K: rl.rollout_workers there made the setup's bytes follow the worker count)."""
FREE_ON_RESUME = ("steps", *OUTPUT_FREE)
"""rl fields a resume may change: the step count (`--target-step` raises it) and the fields declared `same_outputs()`
(config.py): they shape neither the rollouts nor the updates. micro_init_states is not one of them: the batch
advantage scale, the co-training draws and the per-micro-batch loss mean depend on the split (audit56 D1). The rl
stage's key leaves out the same fields."""


def train_grpo(
    config: Any,
    sft_export: Path,
    out_dir: Path,
    *,
    resume: bool = False,
    target_step: int | None = None,
    cotrain: Any = None,
    ray_address: str | None = None,
    ui: Any = None,
    writers_lock: Path | None = None,
) -> dict[str, Any]:
    """GRPO from the policy export `sft_export` into `out_dir` (task.py's layout); returns files, step, summary.
    After training, live evaluations of steps above the step it ended at (an earlier, killed attempt's) are removed
    (`drop_live_evaluations_after`).

    Raises ConfigError when an rl task is not one the SFT policy knows or the policy reads a camera the rollouts
    cannot render, SimError when a LIBERO run's policy reads features LIBERO does not give, CheckpointError when
    resuming with a setup that changed (naming the fields) or when `resume` is off over existing checkpoints, and
    what the trainer raises."""
    from reproduction.recap.policy.export import read_export
    from reproduction.recipes.grpo.envs import export_cameras, is_libero, task_language
    from reproduction.run.config import to_plain
    from reproduction.train.api import train
    from reproduction.train.checkpoint import complete_steps

    out_dir, sft_export = Path(out_dir), Path(sft_export)
    rl = config.rl
    train_cfg = rl.train_config(max_steps=target_step)
    meta = read_export(sft_export)
    unknown = [t for t in rl.tasks if task_language(t) not in meta["tasks"]]
    if unknown:
        raise ConfigError(
            f"rl.tasks {unknown} are not tasks the SFT policy was trained on ({meta['tasks']})",
            field="rl.tasks",
            hint="train the SFT stage on demonstrations of those tasks, or pick rl.tasks among them",
        )
    libero = any(is_libero(t) for t in rl.tasks)
    # ConfigError for a camera the world's simulator does not render (a pinned Fetch export on LIBERO, say)
    cameras, _ = export_cameras(sft_export, libero=libero)
    if libero:  # SimError naming what LIBERO does not give (object state beside cameras, a Fetch-width state)
        from reproduction.sim.libero.protocol import check_export_features

        check_export_features(meta, cameras=bool(cameras), name=f"the SFT policy {sft_export}")
    trained = bool(complete_steps(out_dir / "checkpoints"))
    if trained and not resume:
        raise CheckpointError(
            f"{out_dir / 'checkpoints'} already holds checkpoints and resume is off",
            path=out_dir / "checkpoints",
            hint="pass --resume to continue, or train into a new folder",
        )
    plain_rl = to_plain(rl)
    setup = {
        "format_version": 1,
        # what the stage computes from: rl's fields but those declared same_outputs() (and so out of its key), and
        # of eval only the seed (its live evaluations' episodes); a worker count in this output made two runs of one
        # key differ in its bytes, and eval.workers or eval.episodes_per_task, which rl never reads, did too
        "rl": {k: v for k, v in plain_rl.items() if k not in OUTPUT_FREE},
        "eval": {"seed": config.eval.seed},
        "sft_export": str(sft_export.resolve()),
        "sft_weights_sha256": file_sha256(sft_export / "model.safetensors"),
        "model_config": json.loads((sft_export / "model_config.json").read_text(encoding="utf-8")),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    if cotrain is not None:
        setup["cotrain"] = _cotrain_arrays(cotrain, meta, out_dir)
    if trained:
        _refuse_changed(out_dir / SETUP_NAME, setup)
    atomic_write_text(out_dir / SETUP_NAME, json.dumps(setup, indent=1, sort_keys=True))
    result = train(
        functools.partial(
            make_grpo_task, setup_path=str((out_dir / SETUP_NAME).resolve()), rollout_workers=rl.rollout_workers
        ),
        train_cfg,
        out_dir=out_dir,
        resume=resume,
        ray_address=ray_address,
        ui=ui,
        writers_lock=writers_lock,
    )
    drop_live_evaluations_after(out_dir, result.step)
    files = [out_dir / SETUP_NAME] + sorted(p for p in result.export_dir.rglob("*") if p.is_file())
    return {
        "files": files,
        "step": result.step,
        "resumed_from": result.resumed_from,
        "resumed_from_dir": result.resumed_from_dir,
        "resumed_from_sha256": result.resumed_from_sha256,
        "summary": {
            "step": result.step,
            "train_metrics": result.train_metrics,
            "eval_metrics": result.eval_metrics,
            "export": str(result.export_dir),
        },
    }


def drop_live_evaluations_after(out_dir: Path, step: int) -> list[Path]:
    """Remove `out_dir`/evidence/eval_rl_<n>.json for every n > `step` (the step the stage ends at); returns them.

    Only an earlier attempt of this stage writes them: a `--target-step 10` continuation killed after its step-10
    live evaluation but before its step-10 checkpoint, then a `--resume --target-step 8` that ends the stage at
    step 8 (a plain `--resume` continues to 10, as the killed run asked: audit54 A6). Left in place they would be
    collected as the stage's outputs (the recipe's `evidence/eval_rl_*.json`): evaluations of weights the run does
    not hold (audit50 F5). A name whose step is not an integer is left alone (not the trainer's)."""
    dropped = []
    for path in sorted((Path(out_dir) / "evidence").glob(f"{LIVE_EVAL_PREFIX}*.json")):
        n = path.stem[len(LIVE_EVAL_PREFIX) :]
        if n.isdigit() and int(n) > step:
            path.unlink(missing_ok=True)
            dropped.append(path)
    return dropped


def _cotrain_arrays(dataset: Any, meta: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """The co-training dataset's flat BC arrays (RECAP's build_arrays, mode bc), task ids mapped onto the SFT
    policy's task list; saved as <out>/cotrain.npz. The dataset's folder and name go into the setup too: a policy
    that reads cameras decodes the co-training frames' images from it (task.py)."""
    import numpy as np

    from reproduction.recap.policy.data import PolicySource, build_arrays, open_policy_input

    source = PolicySource(path=str(dataset.root), type="sft", weight=1.0, name=dataset.name)
    arrays, summary = build_arrays(
        [
            open_policy_input(
                source,
                need_labels=False,
                dataset=dataset,
                state_keys=meta.get("state_keys") or (),
                state_dims=meta.get("state_dims"),
            )
        ],
        mode="bc",
        chunk=int(meta["chunk"]),
        hold_labels=False,
    )
    missing = [t for t in arrays.tasks if t not in meta["tasks"]]
    if missing:
        raise ConfigError(
            f"rl.cotrain_dataset holds tasks {missing} the SFT policy does not know", field="rl.cotrain_dataset"
        )
    mapping = np.array([meta["tasks"].index(t) for t in arrays.tasks], np.int64)
    arrays.task_id = mapping[arrays.task_id]
    arrays.tasks = list(meta["tasks"])
    path = out_dir / "cotrain.npz"
    arrays.save(path)
    return {
        "arrays": str(path.resolve()),
        "fingerprint": dataset.fingerprint,
        "frames": len(arrays),
        "path": str(dataset.root),
        "name": dataset.name,
    }


def _refuse_changed(path: Path, new: dict[str, Any]) -> None:
    """CheckpointError naming every field of the setup that changed since the checkpoints were written."""
    if not path.is_file():
        raise CheckpointError(f"cannot resume: {path} is missing", path=path, hint="train into a new folder")
    old = json.loads(path.read_text(encoding="utf-8"))
    old_rl = {**added_defaults(RlSection), **old["rl"]}  # a setup written before a field was added ran its default
    changes = [
        f"rl.{k}: {old_rl.get(k)!r} -> {new['rl'].get(k)!r}"
        for k in sorted(set(old_rl) | set(new["rl"]))
        if k not in FREE_ON_RESUME and old_rl.get(k) != new["rl"].get(k)
    ]
    for key in ("sft_weights_sha256", "model_config"):
        if old.get(key) != new.get(key):
            changes.append(f"{key} differs")
    if old.get("eval", {}).get("seed") != new["eval"].get("seed"):
        changes.append("eval.seed (the in-training evaluation's episodes)")
    if old.get("cotrain", {}).get("fingerprint") != new.get("cotrain", {}).get("fingerprint"):
        changes.append("the co-training dataset")
    if changes:
        raise CheckpointError(
            f"cannot resume {path.parent}: the setup changed ({'; '.join(changes)})",
            path=path,
            hint="restore those settings, or train into a new folder",
        )
