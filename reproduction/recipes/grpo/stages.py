"""The GRPO recipe's stage functions: sft, rl, eval, compare (each takes the runner's StageContext).

sft/export/                    the SFT policy (BC on sft.datasets, or a copy of the pinned sft.export)
rl/grpo_setup.json rl/checkpoints/ rl/metrics.jsonl rl/export/      GRPO training (task.py)
eval/<label>/                  the simulator's per-policy output
evidence/eval_grpo_<step>.json evaluation evidence: primary "grpo", baseline "sft", per-episode reset seeds
compare/compare.json, evidence/comparison.json    the evidence against eval.reference (when set)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from reproduction.recipe import StageContext, StageOutput
from reproduction.recipes.grpo.recipe import rl_uses_ray, sft_uses_ray


class OpenedDataset:
    """A dataset of the run opened once; the runner keys stages on `.fingerprint`, lineage names `.root`."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    @property
    def root(self) -> Path:
        return Path(self.dataset.root)

    @property
    def fingerprint(self) -> str:
        return self.dataset.fingerprint


def open_inputs(config: Any) -> dict[str, OpenedDataset]:
    """The sft datasets (unless an export is pinned) and the co-training dataset, opened once."""
    from reproduction.data.reader import open_dataset

    paths = [] if config.sft.export else [d.path for d in config.sft.datasets]
    if config.rl.cotrain_dataset:
        paths.append(config.rl.cotrain_dataset)
    out = {}
    for p in paths:
        ds = open_dataset(Path(p))
        out[str(Path(p))] = OpenedDataset(ds)
    return out


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))


# -- sft ------------------------------------------------------------------------------------------


def sft_stage(ctx: StageContext) -> StageOutput:
    """BC on sft.datasets with RECAP's policy training (mode bc), or a copy of the pinned sft.export."""
    from reproduction.recap.policy.export import export_step, read_export

    cfg = ctx.config.sft
    export = ctx.out_dir / "export"
    if cfg.export:
        read_export(Path(cfg.export))  # refuses a folder that is not a policy export, naming it
        staging = ctx.out_dir / "export.partial"
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(cfg.export, staging)
        shutil.rmtree(export, ignore_errors=True)
        staging.rename(export)
        files = sorted(p for p in export.rglob("*") if p.is_file())
        # step None: nothing was trained, so a raised sft.train.max_steps does not make --resume train on from it;
        # the step the pinned export was trained to goes in the summary (and eval's baseline: `sft_step`)
        summary = {"pinned": str(cfg.export), "step": export_step(export)}
        return StageOutput(files=files, summary=summary, step=None)
    from dataclasses import replace

    from reproduction.recap.policy.data import PolicySource, open_policy_input
    from reproduction.recap.policy.task import PolicyConfig, train_policy
    from reproduction.run.config import to_plain

    train = cfg.train if ctx.target_step is None else replace(cfg.train, max_steps=ctx.target_step)
    stage = PolicyConfig(**to_plain(cfg.model))
    inputs = []
    for d in cfg.datasets:
        opened = ctx.inputs[str(Path(d.path))].dataset
        source = PolicySource(path=str(opened.root), type="sft", weight=d.weight, name=opened.name)
        inputs.append(
            open_policy_input(
                source, need_labels=False, dataset=opened, state_keys=stage.state_keys, state_dims=stage.state_dims
            )
        )
    ray_address = ctx.ray_for(sft_uses_ray(ctx.config))  # train.launcher is the config's (max_steps aside)
    result = train_policy(
        inputs,
        stage,
        ctx.out_dir,
        mode="bc",
        train=train,
        resume=ctx.resume,
        ray_address=ray_address,
        ui=ctx.ui,
        writers_lock=ctx.writers_lock,
        batch_key="sft.train.global_batch",
    )
    return StageOutput(
        files=list(result.files),
        summary=_jsonable({"step": result.step, "train_metrics": result.train_metrics, "data": result.summary}),
        step=result.step,
        resumed_from=result.resumed_from,
        resumed_from_path=result.resumed_from_dir,
        resumed_from_sha256=result.resumed_from_sha256,
        world_size=train.world_size,
        device=train.device,
    )


def sft_step(recorded: Any, export: Path) -> int | None:
    """The SFT policy's step as evidence names it: the sft record's `step` when the stage trained it (BC), else
    its `export`'s (`export_step`: a pinned sft.export copied as is records no step, run/stage_decide.trains_on).
    None only when neither says: a pinned export without a train_config.json holding an integer max_steps."""
    from reproduction.recap.policy.export import export_step

    return recorded if isinstance(recorded, int) and not isinstance(recorded, bool) else export_step(export)


# -- rl -------------------------------------------------------------------------------------------


def rl_stage(ctx: StageContext) -> StageOutput:
    """GRPO from sft/export into rl/ (continues from its newest checkpoint with --resume)."""
    from reproduction.recipes.grpo.train import train_grpo

    cfg = ctx.config
    cotrain = ctx.inputs.get(str(Path(cfg.rl.cotrain_dataset))) if cfg.rl.cotrain_dataset else None
    result = train_grpo(
        cfg,
        ctx.run_dir / "sft" / "export",
        ctx.out_dir,
        resume=ctx.resume,
        target_step=ctx.target_step,
        cotrain=cotrain.dataset if cotrain is not None else None,
        ray_address=ctx.ray_for(rl_uses_ray(cfg)),
        ui=ctx.ui,
        writers_lock=ctx.writers_lock,
    )
    return StageOutput(
        files=result["files"],
        summary=_jsonable(result["summary"]),
        step=result["step"],
        resumed_from=result["resumed_from"],
        resumed_from_path=result["resumed_from_dir"],
        resumed_from_sha256=result["resumed_from_sha256"],
        world_size=cfg.rl.world_size,
        device=cfg.rl.device,
    )


# -- eval -----------------------------------------------------------------------------------------


def eval_stage(ctx: StageContext) -> StageOutput:
    """The SFT and the GRPO policy on the same held-out episodes -> evidence/eval_grpo_<step>.json."""
    exports = {
        "grpo": (ctx.run_dir / "rl" / "export", ctx.upstream["rl"].step),
        "sft": (ctx.run_dir / "sft" / "export", sft_step(ctx.upstream["sft"].step, ctx.run_dir / "sft" / "export")),
    }
    return evaluate_exports(ctx.config, exports, ctx.out_dir, ctx.run_dir, ui=ctx.ui)


def evaluate_exports(
    config: Any,
    exports: dict[str, tuple[Path, int | None]],
    out_dir: Path,
    run_dir: Path,
    *,
    name: str = "grpo",
    ui: Any = None,
    resume: bool = True,
) -> StageOutput:
    """Evaluate {label: (export, step)} and write the evidence (reproduction/run/evidence.py) to
    <run>/evidence/eval_<name>_<step>.json: the first label is the primary, the rest baselines. Fetch tasks run in
    reproduction/sim/evaluate.py (one worker pool for all; episodes keyed by reset seed; the cameras each policy
    reads rendered), LIBERO tasks by LIBERO's protocol (sim/libero/protocol.py: the first N init states in order,
    rendering LIBERO's cameras for a policy that reads them, else privileged state; episodes keyed by init state),
    each export's features checked against LIBERO's before any env is built. `resume`: the caller is the run's eval
    stage (a killed worker's hint continues it with --resume), not `portable eval` (a plain rerun)."""
    from reproduction.errors import killed_worker_hint
    from reproduction.recipes.grpo.envs import is_libero
    from reproduction.run import evidence
    from reproduction.run.lineage import path_sha256

    ev = config.eval
    libero = any(is_libero(t) for t in ev.tasks)
    killed = killed_worker_hint("eval.workers", resume=resume)
    outcome = (_run_libero if libero else _run_fetch)(config, exports, Path(out_dir), ui, killed)
    records, results = [], {}
    for (label, (export, step)), (counts, seconds) in zip(exports.items(), outcome):
        inside = Path(export).resolve().is_relative_to(Path(run_dir).resolve())
        records.append(
            evidence.EvalRecord(
                result=counts,
                label=label,
                mode="other" if label == "grpo" else "bc",
                checkpoint=str(Path(export).resolve().relative_to(Path(run_dir).resolve())) if inside else str(export),
                checkpoint_sha256=path_sha256(Path(export))[0],
                step=step,
            )
        )
        results[label] = {"tasks": counts["tasks"], "seconds": round(seconds, 3)}
    primary = records[0]
    step = primary.step or 0
    settings = {"tasks": list(ev.tasks), "episodes_per_task": ev.episodes_per_task, "recipe": "grpo"}
    if libero:
        from reproduction.recap.policy.export import read_export
        from reproduction.recipes.grpo.envs import export_cameras

        first = next(iter(exports.values()))[0]  # the primary's observation (its baselines are of its kind)
        cameras, size = export_cameras(first, libero=True)
        reads = dict(read_export(first).get("cameras") or {}) if cameras else None
        settings.update(simulator="libero", libero=libero_settings(ev.max_steps, reads, size))
    doc = evidence.build_evidence(
        primary,
        name=f"grpo after {step} steps",
        run_id=Path(run_dir).name,
        seeds={"eval": ev.seed, "rl": config.rl.seed, "sft": config.sft.train.seed},
        settings=settings,
        baselines=records[1:],
    )
    path = evidence.write_evidence(Path(run_dir) / "evidence" / f"eval_{name}_{step}.json", doc)
    summary = {"evidence": str(path.relative_to(run_dir)), "results": results}
    return StageOutput(files=[path], summary=_jsonable(summary), world_size=ev.workers)


def _run_fetch(
    config: Any, exports: dict[str, tuple[Path, int | None]], out_dir: Path, ui: Any, killed_hint: str | None = None
) -> list[Any]:
    """[(counts, seconds)] per export from the Fetch simulator (one worker pool for all), each export's episodes
    rendering the cameras it reads (envs.export_cameras)."""
    from reproduction.recap.policy.export import PolicyFactory, read_export
    from reproduction.recipes.grpo.envs import export_cameras
    from reproduction.sim.evaluate import EvalConfig, EvalJob, evaluate_many

    ev, jobs = config.eval, []
    for label, (export, _) in exports.items():
        meta = read_export(export)
        cameras, size = export_cameras(export)  # render what the policy reads, at its size (none: state only)
        sim_cfg = EvalConfig(
            tasks=tuple(ev.tasks),
            episodes_per_task=ev.episodes_per_task,
            seed=ev.seed,
            execute_steps=int(meta["execute_steps"]),
            videos=ev.videos,
            workers=ev.workers,
            cameras=cameras,
            image_size=size,
        )
        jobs.append(EvalJob(factory=PolicyFactory(export_dir=str(export)), config=sim_cfg, out_dir=out_dir / label))
    return [(_counts(result), result.seconds) for result in evaluate_many(jobs, ui=ui, killed_hint=killed_hint)]


def _run_libero(
    config: Any, exports: dict[str, tuple[Path, int | None]], out_dir: Path, ui: Any, killed_hint: str | None = None
) -> list[Any]:
    """[(counts, seconds)] per export by LIBERO's protocol, observed as the rollouts are (LIBERO's cameras at the
    export's size for a policy that reads them, else privileged state), executing each export's execute_steps
    actions per call; every export's features are checked before the first env."""
    from reproduction.recap.policy.export import PolicyFactory, read_export
    from reproduction.recipes.grpo.envs import export_cameras
    from reproduction.sim.libero.protocol import LazyPolicy, check_export_features, evaluate_libero

    ev, metas, views = config.eval, {}, {}
    for label, (export, _) in exports.items():
        meta = metas[label] = read_export(export)
        cameras, size = views[label] = export_cameras(export, libero=True)
        check_export_features(meta, cameras=bool(cameras), name=f"the {label} policy ({export})")
    out = []
    for label, (export, _) in exports.items():
        cameras, size = views[label]
        result = evaluate_libero(
            list(ev.tasks),
            ev.episodes_per_task,
            LazyPolicy(PolicyFactory(export_dir=str(export))),
            chunk=int(metas[label]["execute_steps"]),
            cameras=bool(cameras),
            image_size=size,
            max_steps=ev.max_steps,
            workers=ev.workers,
            seed=ev.seed,
            ui=ui,
            killed_hint=killed_hint,
        )
        out.append((result.evidence_counts(), result.seconds))
    return out


def libero_settings(
    max_steps: int | None, cameras: dict[str, str] | None = None, image_size: int | None = None
) -> dict[str, Any]:
    """The evidence's `settings.libero`: the protocol, and what the policy observed: privileged state, no images
    (`cameras` None: `cameras` false), or the camera map {slot: LIBERO image key} rendered at `image_size`."""
    out: dict[str, Any] = {
        "protocol": "first N init states in order; suite step limit; success = LIBERO's check_success()",
        "cameras": False,
        "observation": "no images: state, and LIBERO's privileged object state in the observation",
        "max_steps": max_steps,
    }
    if cameras:
        out.update(
            cameras=dict(cameras),
            image_size=image_size,
            observation="camera images (180-degree rotated, as RLinf/openpi) and the robot state; no object state",
        )
    return out


def _counts(result: Any) -> dict[str, Any]:
    """Per-task counts and each episode's outcome and reset seed (RECAP's eval records the same shape)."""
    keys = ("episode", "reset_seed", "success_once", "success_at_end")
    return {
        "tasks": {
            name: {"episodes": t.episodes, "success_once": t.success_once, "success_at_end": t.success_at_end}
            for name, t in result.tasks.items()
        },
        "per_episode": {
            name: [{k: e[k] for k in keys if k in e} for e in t.episode_metrics] for name, t in result.tasks.items()
        },
    }


# -- compare --------------------------------------------------------------------------------------


def compare_stage(ctx: StageContext) -> StageOutput:
    """The eval stage's evidence against eval.reference -> evidence/comparison.json and compare/compare.json."""
    import hashlib

    from reproduction.fsio import atomic_write_text
    from reproduction.run import evidence

    evidence_rel = ctx.upstream["eval"].summary["evidence"]
    reference = ctx.config.eval.reference
    cmp_path = ctx.run_dir / "evidence" / "comparison.json"
    doc: dict[str, Any] = {"evidence": evidence_rel, "reference": reference or None, "verdict": None}
    files = []
    if reference:
        comparison = evidence.compare_files(ctx.run_dir / evidence_rel, Path(reference), out=cmp_path).to_dict()
        doc["reference_sha256"] = hashlib.sha256(Path(reference).read_bytes()).hexdigest()
        doc["comparison"] = str(cmp_path.relative_to(ctx.run_dir))
        doc["verdict"] = comparison["verdict"]
        files.append(cmp_path)
    else:
        cmp_path.unlink(missing_ok=True)
    record = ctx.out_dir / "compare.json"
    atomic_write_text(record, json.dumps(doc, indent=1) + "\n")
    return StageOutput(files=[record, *files], summary=_jsonable(doc))
