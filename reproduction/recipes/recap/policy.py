"""RECAP stages 4 and 5: train the policies (RECAP and its baselines) and evaluate them in the simulator.

policy/<mode>/            one training-core out_dir per mode (checkpoints/, export/, policy_setup.json)
eval/<label>/             the simulator's per-policy output (episodes, videos)
evidence/eval_policy_<step>.json    evaluation evidence (primary: recap at its best guidance scale)
compare/compare.json      the compare stage: which evidence against which reference (path, sha256), verdict
evidence/comparison.json  its comparison with the bundle's reference evidence (eval.reference), when one is set

The comparison is its own cheap stage: the reference is no input of the evaluation, so a new reference
evidence recompares without evaluating again. Except with eval.sequential.enabled: then the evaluation
runs in looks and stops once every rate compared with the reference is settled (`evaluate_sequentially`),
so the reference's content is an input of the eval stage too, and the evidence records the stop.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from reproduction.errors import CheckpointError
from reproduction.recipe import StageContext, StageOutput
from reproduction.recipes.recap.recipe import policy_uses_ray


def policy_config(ctx: StageContext, mode: str) -> tuple[list[Any], Any, Any]:
    """(opened policy inputs, PolicyConfig, TrainConfig) of one mode: the opened datasets marked `policy` with the
    advantage labels (recap), and the run config's policy.model and policy.train as they are (max_steps raised to
    `--target-step`)."""
    from reproduction.recap.policy.data import PolicySource, open_policy_input

    cfg = ctx.config
    train = cfg.policy.train
    if ctx.target_step is not None:
        train = replace(train, max_steps=ctx.target_step)
    stage = cfg.policy.model
    inputs = []
    for d in ctx.inputs.values():
        if not d.policy:
            continue
        source = PolicySource(
            path=str(d.root),
            type=d.type,
            weight=d.weight,
            name=d.name,
            advantages=str(ctx.run_dir / "advantages"),
            tag=cfg.advantages.tag,
        )
        inputs.append(
            open_policy_input(
                source,
                need_labels=mode == "recap",
                dataset=d.dataset,
                state_keys=stage.state_keys,
                state_dims=stage.state_dims,
            )
        )
    return inputs, stage, train


def _refuse_mixed_steps(ctx: StageContext, summary: dict[str, dict[str, Any]]) -> None:
    """CheckpointError naming each mode's step unless every mode ended at the same step: the stage records one
    step, and the RECAP-vs-BC comparison it exists for is only fair between policies trained equally long. The
    loop resumes every mode to exactly its max_steps (audit55 G2), so this guards an internal invariant."""
    ended = {mode: entry["step"] for mode, entry in summary.items()}
    if len(set(ended.values())) > 1:
        named = ", ".join(f"{mode} {step}" for mode, step in ended.items())
        raise CheckpointError(
            f"{ctx.out_dir}: the policy modes ended at different steps ({named}); the stage is not recorded "
            "complete over mixed step counts",
            path=ctx.out_dir,
            hint="rerun with --resume (or --target-step at least the highest step named) so every mode reaches "
            "the same step, or retrain the stage with --restart-stage policy",
        )


def policy_stage(ctx: StageContext) -> StageOutput:
    """Stage 4: one policy per `policy.modes` into policy/<mode>/ (each continues from its checkpoints)."""
    from reproduction.recap.policy.task import train_policy

    files, summary, steps, resumed = [], {}, [], []
    ray_address = ctx.ray_for(policy_uses_ray(ctx.config))
    for mode in ctx.config.policy.modes:
        inputs, stage, train = policy_config(ctx, mode)
        result = train_policy(
            inputs,
            stage,
            ctx.out_dir / mode,
            mode=mode,
            train=train,
            resume=ctx.resume,
            ray_address=ray_address,
            ui=ctx.ui,
            writers_lock=ctx.writers_lock,
            batch_key="policy.train.global_batch",
        )
        files += list(result.files)
        steps.append(result.step)
        if result.resumed_from is not None:
            resumed.append(result)
        summary[mode] = {
            "step": result.step,
            "export": str(Path(result.export_dir).relative_to(ctx.run_dir)),
            "train_metrics": result.train_metrics,
            "samples_per_s": result.samples_per_s,
            "data": result.summary,
        }
    _refuse_mixed_steps(ctx, summary)
    train = ctx.config.policy.train
    # One statement names one checkpoint: the one the stage's resumed_from step comes from (audit53 U1)
    first = min(resumed, key=lambda r: r.resumed_from) if resumed else None
    return StageOutput(
        files=files,
        summary=_jsonable(summary),
        step=min(steps),
        resumed_from=first.resumed_from if first is not None else None,
        resumed_from_path=first.resumed_from_dir if first is not None else None,
        resumed_from_sha256=first.resumed_from_sha256 if first is not None else None,
        world_size=train.world_size,
        device=train.device,
    )


def evaluations(config: Any, labels: dict[str, str] | None = None) -> list[tuple[str, str, float]]:
    """(label, mode, guidance scale) of every evaluation: recap at each scale, baselines at 1, each baseline labelled
    by its mode unless `labels` names it otherwise ({mode: label}: another recipe's export, e.g. GRPO's `sft`)."""
    out = []
    for mode in config.policy.modes:
        if mode == "recap":
            out += [(f"recap w={w:g}", mode, float(w)) for w in config.eval.guidance_scales]
        else:
            out.append(((labels or {}).get(mode, mode), mode, 1.0))
    return out


def eval_stage(ctx: StageContext) -> StageOutput:
    """Stage 5: evaluate every policy in the simulator; write the evaluation evidence."""
    exports = {
        mode: (ctx.run_dir / "policy" / mode / "export", ctx.upstream["policy"].summary.get(mode, {}).get("step"))
        for mode in ctx.config.policy.modes
    }
    return evaluate_exports(ctx.config, exports, ctx.out_dir, ctx.run_dir, ui=ctx.ui)


EXPORT_CAMERA_HINT = (
    "a policy reads the cameras it was trained on: train it on data that hold one of {valid}, with "
    "policy.model.cameras mapping its slots to them, or leave eval out (portable run ... "
    "--stages returns,value,advantages,policy)"
)
"""The eval stage's hint for an export reading a camera the simulator does not render: remapping a trained policy's
cameras cannot fix it, and a new run's preflight refuses a map the dataset lacks (audit63 M2: the two hints sent the
user in a circle); its data must hold the camera."""


def evaluate_exports(
    config: Any,
    exports: dict[str, tuple[Path, int | None]],
    out_dir: Path,
    run_dir: Path,
    *,
    name: str = "policy",
    ui: Any = None,
    evaluate_libero: Any = None,
    libero_factory: Any = None,
    labels: dict[str, str] | None = None,
    export_execute_steps: bool = False,
    resume: bool = True,
) -> StageOutput:
    """Evaluate the policy exports ({mode: (export folder, step)}) in the simulator into `out_dir`, and
    write `run_dir`/evidence/eval_<name>_<step>.json (compare it with `compare_with_reference`). `labels`: the
    evidence label of a baseline mode's export when it is not the mode's name (`evaluations`).

    Each chunk executes `policy.model.execute_steps` actions, the value the eval stage is keyed on; with
    `export_execute_steps` (`portable eval --checkpoint`: an export of this run or of another) the value the
    export's policy.json recorded, as the policy it is was meant to run (review62 S M1).

    LIBERO task ids in eval.tasks go to `evaluate_libero` (default reproduction.sim.libero.evaluate_libero), the
    rest to the Fetch simulator. `libero_factory(export_dir, guidance_scale)` -> a picklable zero-argument policy
    factory (default the export's PolicyFactory); both are seams tests swap (a fake protocol, a scripted expert).
    `resume`: the caller is the run's eval stage (a killed worker's hint continues it with --resume), not
    `portable eval` (a plain rerun)."""
    from reproduction.errors import killed_worker_hint
    from reproduction.recipes.recap.config import is_libero_task

    killed = killed_worker_hint("eval.workers", resume=resume)
    if any(is_libero_task(t) for t in config.eval.tasks):
        return _evaluate_libero_exports(
            config,
            exports,
            run_dir,
            name=name,
            ui=ui,
            evaluate_fn=evaluate_libero,
            make_factory=libero_factory,
            labels=labels,
            killed_hint=killed,
        )
    from reproduction.recap.policy.export import PolicyFactory, export_image_size, read_export
    from reproduction.run.lineage import path_sha256
    from reproduction.sim.cameras import camera_names
    from reproduction.sim.evaluate import EvalConfig, EvalJob, check_export_for_fetch, evaluate_many

    ev = config.eval
    results, digests = {}, {}
    todo, jobs = [], []
    for label, mode, w in evaluations(config, labels):
        if mode not in exports:
            continue
        export, step = exports[mode]
        meta = read_export(export)
        check_export_for_fetch(meta, name=f"the {mode} policy export {export}", tasks=ev.tasks)
        cameras = dict(meta.get("cameras") or {})  # rendered as the policy was trained on them, at its resolution
        if mode not in digests:  # the export's tree digest, as lineage pins it (one per export, not per scale)
            digests[mode] = path_sha256(Path(export))[0]
        sim_cfg = EvalConfig(
            tasks=tuple(ev.tasks),
            episodes_per_task=ev.episodes_per_task,
            seed=ev.seed,
            # the eval stage: the config's, which keys it (its export's was the policy stage's value when it trained:
            # the field is same_outputs() there, so a changed one redid eval with the old value under the new record)
            execute_steps=int(
                meta.get("execute_steps", config.policy.model.execute_steps)
                if export_execute_steps
                else config.policy.model.execute_steps
            ),
            videos=ev.videos,
            workers=ev.workers,
            cameras=camera_names(
                cameras, key=f"the {mode} policy export {export} (policy.json cameras)", hint=EXPORT_CAMERA_HINT
            ),
            image_size=export_image_size(export) if cameras else 64,
        )
        out = Path(out_dir) / label.replace(" ", "_").replace("=", "")
        todo.append((label, mode, w, export, step))
        jobs.append(
            EvalJob(factory=PolicyFactory(export_dir=str(export), guidance_scale=w), config=sim_cfg, out_dir=out)
        )
    # one worker pool for every policy: worker start-up and env creation are paid once
    if ev.sequential.enabled:
        outcome, sequential = evaluate_sequentially(
            jobs,
            lambda partial: _evidence(config, _records(todo, partial, digests, run_dir), run_dir),
            Path(ev.reference),
            looks=ev.sequential.looks,
            rho=ev.sequential.rho,
            ui=ui,
            killed_hint=killed,
        )
    else:
        outcome, sequential = evaluate_many(jobs, ui=ui, killed_hint=killed), None
    for (label, *_), result in zip(todo, outcome):
        results[label] = {
            "tasks": _counts(result)["tasks"],
            "summary": result.to_dict()["tasks"],
            "seconds": round(result.seconds, 3),
        }
    records = _records(todo, outcome, digests, run_dir)
    return _write_evidence(config, records, results, run_dir, name, sequential=sequential)


def _write_evidence(
    config: Any,
    records: list[Any],
    results: dict[str, Any],
    run_dir: Path,
    name: str,
    *,
    settings: dict[str, Any] | None = None,
    sequential: dict[str, Any] | None = None,
) -> StageOutput:
    """The evidence file of an evaluation (the best recap scale as primary, the rest as baselines) and the
    stage's output."""
    from reproduction.run import evidence

    doc = _evidence(config, records, run_dir, settings=settings, sequential=sequential)
    step = doc["policy"]["checkpoint"]["step"] or 0
    path = evidence.write_evidence(Path(run_dir) / "evidence" / f"eval_{name}_{step}.json", doc)
    summary = {"evidence": str(path.relative_to(run_dir)), "results": results}
    if sequential is not None:
        summary["sequential"] = sequential
    return StageOutput(files=[path], summary=_jsonable(summary), device="cpu", world_size=config.eval.workers)


def _records(todo: list[tuple[Any, ...]], outcome: list[Any], digests: dict[str, str], run_dir: Path) -> list[Any]:
    """One EvalRecord per evaluation (`todo`: label, mode, scale, export, step) from its simulator result."""
    return [
        _record(entry, _counts(result), digests[entry[1]], run_dir, _mechanism(result))
        for entry, result in zip(todo, outcome)
    ]


def _record(entry: tuple[Any, ...], doc: dict[str, Any], digest: str, run_dir: Path, extra: dict[str, float]) -> Any:
    """The EvalRecord of one evaluation (`entry`: label, mode, scale, export, step) with its counts `doc`; the
    export is named relative to the run folder when it lies inside it."""
    from reproduction.run import evidence

    label, mode, w, export, step = entry
    inside = Path(export).resolve().is_relative_to(Path(run_dir).resolve())
    return evidence.EvalRecord(
        result=doc,
        label=label,
        mode=mode,
        guidance_scale=w if mode == "recap" else None,
        checkpoint=str(Path(export).resolve().relative_to(Path(run_dir).resolve()) if inside else export),
        checkpoint_sha256=digest,
        step=step,
        extra_metrics=extra,
    )


def _evidence(
    config: Any,
    records: list[Any],
    run_dir: Path,
    *,
    settings: dict[str, Any] | None = None,
    sequential: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The evaluation evidence of `records` (primary: recap at its best guidance scale), not yet written."""
    from reproduction.run import evidence

    ev = config.eval
    primary = _best_recap(records) or records[0]
    step = primary.step or 0
    return evidence.build_evidence(
        primary,
        name=f"{primary.label} after {step} steps",
        run_id=Path(run_dir).name,
        seeds={"eval": ev.seed, "policy": config.policy.train.seed, "value": config.value.train.seed},
        settings=settings or {"tasks": list(ev.tasks), "episodes_per_task": ev.episodes_per_task},
        baselines=[r for r in records if r is not primary],
        sequential=sequential,
    )


def evaluate_sequentially(
    jobs: list[Any],
    evidence_of: Any,
    reference_path: Path,
    *,
    looks: int,
    rho: float,
    ui: Any = None,
    killed_hint: str | None = None,
) -> tuple[list[Any], dict[str, Any]]:
    """Evaluate `jobs` in looks and stop once every rate the comparison with the reference tests is settled.

    Look k evaluates the next whole batches of every task of every job (reproduction.sim.evaluate's
    `looks`: the very episodes a fixed evaluation runs, in its order), then compares `evidence_of(results so
    far)` with the reference evidence exactly as the compare stage does, at the look's error-spending level
    a_k (reproduction.run.sequential; alpha is the reference's, else 0.05): it stops when no rate row that counts
    toward the verdict (`comparison.counts_toward_verdict`: not an uneven overall row) is inconclusive, or at the
    last look. A row reproduced at a_k is judged again at its design's calibrated level
    a_k* <= a_k (compare's `alpha_calibrated`), whose exact size is <= a_k. Returns the results of the looks run
    and the evidence's "sequential" record (the looks, where and why it stopped, and per look run the level each
    row reproduced at a_k was judged at, `reproduced_levels`); deterministic, so a rerun gives the same bytes."""
    import hashlib

    from reproduction.errors import ConfigError
    from reproduction.run.comparison import Comparison, compare_evidence, counts_toward_verdict
    from reproduction.run.evidence import load_evidence
    from reproduction.run.sequential import SequentialRule
    from reproduction.run.stats import DEFAULT_ALPHA, MIN_ALPHA
    from reproduction.sim.evaluate import evaluate_many

    reference = load_evidence(reference_path)
    rule = SequentialRule(looks=looks, rho=rho, alpha=float(reference.get("alpha", DEFAULT_ALPHA)))
    n_max = jobs[0].config.episodes_per_task
    sizes = rule.sizes(n_max, max(job.config.batch_size for job in jobs))
    spend = rule.spend([n / n_max for n in sizes])
    low = min(range(len(spend)), key=spend.__getitem__)
    if spend[low] < MIN_ALPHA:  # before any episode: 1 - 2 a_k would round to 1 at that look (audit46 stats F5)
        raise ConfigError(
            f"eval.sequential.rho={rho} with the reference's alpha {rule.alpha:g} gives look {low + 1} of "
            f"{len(sizes)} ({sizes[low]} of {n_max} episodes per task) the test level {spend[low]:.3g}, below "
            f"{MIN_ALPHA:g}, the smallest recap-portable computes",
            field="eval.sequential.rho",
            hint="3 (the default) spends little alpha at the early looks; 1 spends it evenly",
        )

    used: dict[int, dict[str, float]] = {}  # per look: the level each row reproduced at a_k was judged at

    def rate_rows(outcome: list[Any], look: int) -> list[Any]:
        # compare calibrates every row reproduced at a_k (stats.calibrated_alpha, cached per design and level)
        comparison = compare_evidence(evidence_of(outcome), reference, alpha=spend[look])
        rows = [r for r in comparison.rows if r.kind == "rate" and counts_toward_verdict(r)]
        used[look] = {
            r.metric: r.alpha_calibrated if r.alpha_calibrated is not None else spend[look]
            for r in rows
            if r.alpha_calibrated is not None or r.verdict == "reproduced"
        }
        return rows

    def rates(outcome: list[Any], look: int) -> list[str]:
        return [r.verdict for r in rate_rows(outcome, look)]

    outcome = evaluate_many(
        jobs,
        ui=ui,
        looks=sizes,
        go_on=lambda look, partial: "inconclusive" in rates(partial, look),
        killed_hint=killed_hint,
    )
    look = sizes.index(max(t.episodes for t in outcome[0].tasks.values()))
    final = rate_rows(outcome, look)
    verdicts = [r.verdict for r in final]
    counts = {v: verdicts.count(v) for v in ("reproduced", "differs", "inconclusive")}
    tally = f"{counts['reproduced']} reproduced, {counts['differs']} differ, {counts['inconclusive']} inconclusive"
    early = look < len(sizes) - 1
    per_look = sum(len(job.config.tasks) for job in jobs)
    return outcome, {
        "rule": f"power-family error spending (Kim & DeMets 1987), rho {rule.rho:g}, Bonferroni over looks",
        "alpha": rule.alpha,
        "looks": sizes,
        "spend": spend,
        "stopped_at_look": look + 1,
        "stopped_early": early,
        "episodes_per_task": sizes[look],
        "episodes_per_task_max": n_max,
        "episodes": sizes[look] * per_look,
        "episodes_max": n_max * per_look,
        "level": spend[look],
        "reproduced_levels": [used.get(k, {}) for k in range(look + 1)],
        "verdict": Comparison(actual_name="", reference_name="", rows=final, alpha=spend[look]).verdict,  # Holm
        "rates": counts,
        "reference": reference.get("name"),
        "reference_sha256": hashlib.sha256(Path(reference_path).read_bytes()).hexdigest(),
        "why": (
            f"every compared rate settled at look {look + 1} of {len(sizes)}: {tally}"
            if early
            else f"the last look ({len(sizes)} of {len(sizes)}) decides: {tally}"
        ),
    }


def _evaluate_libero_exports(
    config: Any,
    exports: dict[str, tuple[Path, int | None]],
    run_dir: Path,
    *,
    name: str,
    ui: Any,
    evaluate_fn: Any = None,
    make_factory: Any = None,
    labels: dict[str, str] | None = None,
    killed_hint: str | None = None,
) -> StageOutput:
    """`evaluate_exports` for LIBERO task ids: every export's features are checked against LIBERO's before any
    env is built (a Fetch policy is refused by name), then each policy runs upstream's protocol (the tasks'
    first N init states, the suite's step limit, settle steps, action chunks; docs/libero.md) and its counts go
    into the evidence per task and per init state (`outcomes.init_states`), so two runs pair state by state."""
    from reproduction.recap.policy.export import read_export
    from reproduction.run.lineage import path_sha256
    from reproduction.sim.libero.protocol import LazyPolicy, check_export_features

    if evaluate_fn is None:
        from reproduction.sim.libero.protocol import evaluate_libero as evaluate_fn
    ev, lib = config.eval, config.eval.libero
    todo = [(label, mode, w, *exports[mode]) for label, mode, w in evaluations(config, labels) if mode in exports]
    for mode in dict.fromkeys(m for _, m, *_ in todo):  # every export checked before the first env
        meta = read_export(exports[mode][0])
        check_export_features(meta, cameras=lib.cameras, name=f"the {mode} policy ({exports[mode][0]})")
    records, results, digests, settle = [], {}, {}, None
    for label, mode, w, export, step in todo:
        if mode not in digests:
            digests[mode] = path_sha256(Path(export))[0]
        # built in the process that steps the env (each spawn worker its own copy), as the Fetch path does
        factory = (make_factory or _export_factory)(str(export), w)
        policy = LazyPolicy(factory)
        result = evaluate_fn(
            list(ev.tasks),
            ev.episodes_per_task,
            policy,
            chunk=lib.chunk,
            cameras=lib.cameras,
            image_size=lib.image_size,
            max_steps=lib.max_steps,
            workers=ev.workers,
            seed=ev.seed,
            ui=ui,
            killed_hint=killed_hint,
        )
        doc, settle = result.evidence_counts(), result.settle_steps
        results[label] = {
            "tasks": doc["tasks"],
            "per_init_state": result.per_init_state(),
            "seconds": round(result.seconds, 3),
            "steps": result.steps,
        }
        firsts = [e.first_success_step for e in result.episodes if e.first_success_step is not None]
        extra = {"mean_first_success_step": sum(firsts) / len(firsts)} if firsts else {}
        records.append(_record((label, mode, w, export, step), doc, digests[mode], run_dir, extra))
    settings = {
        "tasks": list(ev.tasks),
        "episodes_per_task": ev.episodes_per_task,
        "simulator": "libero",
        "libero": {
            "protocol": "first N init states in order; suite step limit; success = LIBERO's check_success()",
            "chunk": lib.chunk,
            "cameras": lib.cameras,
            # a camera-free evaluation is a CPU tier's shortcut, never upstream's protocol: the evidence says so
            "observation": "images + state"
            if lib.cameras
            else "no images: state, and LIBERO's privileged object state in the observation",
            "image_size": lib.image_size if lib.cameras else None,
            "max_steps": lib.max_steps,
            "settle_steps": settle,
        },
    }
    return _write_evidence(config, records, results, run_dir, name, settings=settings)


def compare_with_reference(evidence_file: Path, reference: Path, out: Path) -> dict[str, Any]:
    """Compare an evaluation's evidence with reference evidence, write the comparison JSON to `out`, and
    return its dict (rows, verdict). Raises what loading either file raises (InvalidInputError, OSError)."""
    from reproduction.run import evidence

    return evidence.compare_files(Path(evidence_file), Path(reference), out=Path(out)).to_dict()


def compare_stage(ctx: StageContext) -> StageOutput:
    """Stage 6: the eval stage's evidence against `eval.reference` -> evidence/comparison.json, and
    compare/compare.json saying what was compared (with no reference: that there was none, and no
    comparison.json is left from an earlier reference)."""
    import hashlib
    import json

    from reproduction.fsio import atomic_write_text

    evidence_rel = ctx.upstream["eval"].summary["evidence"]
    reference = ctx.config.eval.reference
    cmp_path = ctx.run_dir / "evidence" / "comparison.json"
    doc: dict[str, Any] = {"evidence": evidence_rel, "reference": reference or None}
    files = []
    if reference:
        comparison = compare_with_reference(ctx.run_dir / evidence_rel, Path(reference), cmp_path)
        doc["reference_sha256"] = hashlib.sha256(Path(reference).read_bytes()).hexdigest()
        doc["comparison"] = str(cmp_path.relative_to(ctx.run_dir))
        from reproduction.run.comparison import Comparison

        # the counts of the closing line: rows held to differ by the overall rule, not rows that differ alone (G6)
        doc["verdict"] = Comparison.from_dict(comparison).verdict_text()
        files.append(cmp_path)
    else:
        cmp_path.unlink(missing_ok=True)
        doc["verdict"] = None
    record = ctx.out_dir / "compare.json"
    atomic_write_text(record, json.dumps(doc, indent=1) + "\n")
    summary = {**doc, **({"comparison": comparison} if reference else {})}
    return StageOutput(files=[record, *files], summary=_jsonable(summary))


def _counts(result: Any) -> dict[str, Any]:
    """The evaluation's per-task counts as the evidence expects them (ints), and each episode's outcome and reset
    seed (so a comparison can pair episodes by initial state), from the simulator's EvalResult."""
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


def _export_factory(export_dir: str, guidance_scale: float) -> Any:
    from reproduction.recap.policy.export import PolicyFactory

    return PolicyFactory(export_dir=export_dir, guidance_scale=guidance_scale)


def _mechanism(result: Any) -> dict[str, float]:
    """Mechanism numbers beside the success rates (DEMO_LAB: detours, time to success): means over all episodes
    of every task (mean first-success step: over the episodes that succeeded), rounded as each task's summary
    rounds them (so one task's numbers are its summary's). A mean of the per-task means weighed a task with few
    successes like one with many (audit46 eval F4)."""
    import numpy as np

    episodes = [e for t in result.tasks.values() for e in t.episode_metrics]
    out: dict[str, float] = {}
    for key, field, digits in (
        ("detours_per_episode", "detours", 4),
        ("mean_first_success_step", "first_success_step", 3),
        ("stalls_per_episode", "stalls", 4),
        ("drops_per_episode", "drops", 4),
    ):
        vals = [float(e[field]) for e in episodes if isinstance(e.get(field), (int, float))]
        if vals:
            out[key] = round(float(np.mean(vals)), digits)
    return out


def _best_recap(records: list[Any]) -> Any:
    recap = [r for r in records if r.mode == "recap"]
    if not recap:
        return None
    return max(recap, key=lambda r: (_rate(r.result), -(r.guidance_scale or 0)))


def _rate(result: dict[str, Any]) -> float:
    tasks = result.get("tasks", result.get("per_task", {}))
    rows = tasks.values() if isinstance(tasks, dict) else tasks
    eps = sum(int(r.get("episodes", 0)) for r in rows)
    ok = sum(int(r.get("success_at_end", r.get("success_once", 0))) for r in rows)
    return ok / eps if eps else 0.0


def _jsonable(obj: Any) -> Any:
    import json

    return json.loads(json.dumps(obj, default=str))
