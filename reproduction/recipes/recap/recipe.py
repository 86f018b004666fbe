"""The RECAP recipe: the four stages as data, the inputs it opens once, and its preflight.

    returns/<dataset>/returns_{tag}.parquet, stats.json            stage 1
    value/value_setup.json, crossfit.json, model_<k>/export/       stage 2 (checkpoints under model_<k>/)
    advantages/values/<dataset>.parquet                            stage 3: every frame's cross-fitted value
    advantages/<dataset>/advantages_{tag}.parquet, mixture_config.yaml

Each stage function takes the StageContext (typed config, opened datasets, upstream outputs) and
calls the stage's library function; none parses arguments or renders errors.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reproduction.data.info import feature_width
from reproduction.recap.policy import TRAINING_MODULES
from reproduction.recipe import Recipe, StageContext, StageOutput, StageSpec


@dataclass(kw_only=True)
class RunDataset:
    """A dataset of the run, opened once: the reader, its fingerprint and its run entry."""

    dataset: Any
    """reproduction.data.reader.Dataset"""
    type: str
    weight: float
    value: bool
    policy: bool
    digests: Any = field(default=None, repr=False)
    """The run's digest cache (reproduction.digest_cache.DigestCache) the content digest hashes through."""

    @property
    def name(self) -> str:
        return self.dataset.name

    @property
    def root(self) -> Path:
        return self.dataset.root

    _key: str | None = field(default=None, init=False, repr=False)

    @property
    def fingerprint(self) -> str:
        """What the stage keys pin: the data plane's fingerprint (info.json, episodes, key columns) and the
        content of every file (run/content.py), so an edited action, state or image column is named too."""
        if self._key is None:
            from reproduction.run.content import content_digest

            both = f"{self.dataset.fingerprint}\n{content_digest(self.root, self.digests)}"
            self._key = hashlib.sha256(both.encode()).hexdigest()
        return self._key


def open_datasets(config: Any, digests: Any = None) -> dict[str, RunDataset]:
    """Open every dataset of the run once (fingerprints computed here, cached by the data plane; files hashed
    through the run's `digests`)."""
    from reproduction.data.reader import open_dataset

    out = {}
    for entry in config.datasets:
        ds = open_dataset(Path(entry.path))
        out[ds.name] = RunDataset(
            dataset=ds, type=entry.type, weight=entry.weight, value=entry.value, policy=entry.policy, digests=digests
        )
        _ = out[ds.name].fingerprint
    return out


# -- stages ---------------------------------------------------------------------------------------


def returns_stage(ctx: StageContext) -> StageOutput:
    """Stage 1: returns sidecars for every dataset into returns/<dataset>/."""
    from reproduction.recap.returns import ReturnsConfig, compute_returns

    sec = ctx.config.returns
    datasets = list(ctx.inputs.values())
    cfg = ReturnsConfig(gamma=sec.gamma, failure_reward=sec.failure_reward, tag=sec.tag)
    results = compute_returns([d.dataset for d in datasets], ctx.out_dir, cfg, types=[d.type for d in datasets])
    files = [r.sidecar for r in results] + [r.sidecar.parent / "stats.json" for r in results]
    summary = {
        r.dataset.name: {
            "frames": r.num_frames,
            "episodes": r.num_episodes,
            "return_min": r.stats["return"]["min"],
            "return_max": r.stats["return"]["max"],
            "fingerprint": r.fingerprint,
        }
        for r in results
    }
    return StageOutput(files=files, summary=summary, result=results)


def value_config(ctx: StageContext) -> tuple[Any, Any, list[Any]]:
    """(ValueConfig, TrainConfig, training sources) of stage 2: the run config's value.model and value.train as
    they are (max_steps raised to `--target-step`), and the opened datasets marked `value` as ValueSources."""
    from dataclasses import replace

    from reproduction.recap.value.config import ValueSource

    cfg = ctx.config
    returns_dir = ctx.run_dir / "returns"
    sources = [
        ValueSource(
            path=str(d.root), type=d.type, weight=d.weight, name=d.name, returns=str(returns_dir), tag=cfg.returns.tag
        )
        for d in ctx.inputs.values()
        if d.value
    ]
    train = cfg.value.train
    if ctx.target_step is not None:
        train = replace(train, max_steps=ctx.target_step)
    return cfg.value.model, train, sources


def no_ray(config: Any) -> bool:
    """StageSpec.uses_ray of a stage that never runs workers on Ray (returns, eval, compare: eval's workers are a
    process pool), so a dead --ray-address does not stop it."""
    return False


def value_uses_ray(config: Any) -> bool:
    """Whether the value stage trains on Ray (its StageSpec.uses_ray and what value_stage hands ctx.ray_for)."""
    return config.value.train.launcher == "ray"


def advantages_uses_ray(config: Any) -> bool:
    """Whether the advantages stage infers on Ray: several value.infer.workers (infer_values then runs them as Ray
    tasks). Its StageSpec.uses_ray and what advantages_stage hands ctx.ray_for (audit56 R4)."""
    return config.value.infer.workers > 1


def policy_uses_ray(config: Any) -> bool:
    """Whether the policy stage trains on Ray (its StageSpec.uses_ray and what policy.py's policy_stage hands
    ctx.ray_for)."""
    return config.policy.train.launcher == "ray"


def value_stage(ctx: StageContext) -> StageOutput:
    """Stage 2: one value model per cross-fitting fold into value/model_<k>/ (continues from checkpoints)."""
    from reproduction.recap.value.data import check_state_finite
    from reproduction.recap.value.stage import train_value

    model, train, sources = value_config(ctx)
    opened = {d.name: d.dataset for d in ctx.inputs.values() if d.value}  # the run opened them once
    # Stage 3 scores the `value: false` datasets too: refuse their bad state now, not after training (audit60_E E2)
    check_state_finite([d.dataset for d in ctx.inputs.values() if not d.value], model.state_keys, model.state_dims)
    ray_address = ctx.ray_for(value_uses_ray(ctx.config))  # train.launcher is the config's (max_steps aside)
    result = train_value(
        model,
        train,
        ctx.out_dir,
        sources=sources,
        datasets=opened,
        resume=ctx.resume,
        ray_address=ray_address,
        ui=ctx.ui,
        writers_lock=ctx.writers_lock,
    )
    files = [ctx.out_dir / "value_setup.json", ctx.out_dir / "crossfit.json"]
    for d in result.export_dirs:
        files += [p for p in Path(d).rglob("*") if p.is_file()]
    # One statement names one checkpoint: the one the stage's resumed_from step comes from (audit53 U1)
    resumed = sorted((r for r in result.results if r.resumed_from is not None), key=lambda r: r.resumed_from)
    return StageOutput(
        files=files,
        summary=_jsonable(result.summary()),
        result=result,
        step=min(r.step for r in result.results),
        resumed_from=resumed[0].resumed_from if resumed else None,
        resumed_from_path=resumed[0].resumed_from_dir if resumed else None,
        resumed_from_sha256=resumed[0].resumed_from_sha256 if resumed else None,
        world_size=train.world_size,
        device=train.device,
    )


def advantages_stage(ctx: StageContext) -> StageOutput:
    """Stage 3: every frame's cross-fitted value, then N-step advantages, thresholds and labels."""
    from dataclasses import replace

    from reproduction.recap.advantage_inputs import load_dataset_arrays
    from reproduction.recap.advantages import compute_advantages
    from reproduction.recap.labels import hold_frames
    from reproduction.recap.value.infer import open_value_stage
    from reproduction.recap.value.stage import infer_values

    cfg = ctx.config
    inf = cfg.value.infer
    # Opened once for every dataset: the fold plan, the heads (return range and bins), the models.
    value = open_value_stage(ctx.run_dir / "value", device=inf.device)
    head = value.head
    adv = replace(cfg.advantages, returns_tag=cfg.returns.tag)
    values_dir = ctx.out_dir / "values"
    inputs, files, inferred, flags = [], [], {}, {}
    ray_address = ctx.ray_for(advantages_uses_ray(cfg))
    for d in ctx.inputs.values():
        out = values_dir / f"{d.name}.parquet"
        inferred[d.name] = infer_values(
            value,
            d.dataset,
            out,
            workers=inf.workers,
            batch_size=inf.batch_size,
            ray_address=ray_address,
            ui=ctx.ui,
            writers_lock=ctx.writers_lock,
        )
        files.append(out)
        inp = load_dataset_arrays(
            d.dataset, ctx.run_dir / "returns", out, dataset_type=d.type, returns_tag=cfg.returns.tag
        )
        flags[d.name] = _frame_flags_of(d.dataset, inp.sidecar)
        if adv.hold_labels and flags[d.name][2] is not None:
            inp.hold = hold_frames(flags[d.name][0], flags[d.name][2])
        inputs.append(inp)
    report = compute_advantages(inputs, adv, head, out_dirs=[ctx.out_dir / d.name for d in ctx.inputs.values()])
    files += report.sidecars
    quality = _label_quality(ctx, value.plan, report.sidecars, flags)
    files.append(ctx.out_dir / "label_quality.json")
    summary = {
        **report.to_dict(),
        "label_quality": quality,
        "inference": inferred,
        "value_head": head.to_dict(),
    }
    return StageOutput(files=files, summary=_jsonable(summary), result=report)


def _frame_flags_of(dataset: Any, returns_sidecar: Path) -> tuple[Any, Any, Any, Any]:
    """(episode_index, frame_index, is_success, harm) in the returns sidecar's row order, read once
    for hold labels and label quality; the flags None without `is_success` / `sim.harm`."""
    import pyarrow.parquet as pq

    from reproduction.recap.labels import frame_flags

    t = pq.read_table(returns_sidecar, columns=["episode_index", "frame_index"])
    ep, fr = t.column("episode_index").to_numpy(), t.column("frame_index").to_numpy()
    return (ep, fr, *frame_flags(dataset, ep, fr))


def _label_quality(
    ctx: StageContext, plan: Any, sidecars: list[Path], flags: dict[str, tuple[Any, Any, Any, Any]]
) -> dict[str, Any]:
    """label_quality.json: per dataset, positive rates by kind of frame (harm vs clean when the data
    marks `sim.harm`) and the value model's Spearman per fold; one line per dataset on stderr.
    `flags` are `_frame_flags_of` per dataset, reused when the sidecar has the same rows; `plan` is the
    value stage's fold plan (which model labelled which episode)."""
    import json

    import numpy as np
    import pyarrow.parquet as pq

    from reproduction.fsio import atomic_write_text
    from reproduction.recap.labels import dataset_label_report, format_report, frame_flags
    from reproduction.ui import say

    out: dict[str, Any] = {}
    for d, path in zip(ctx.inputs.values(), sidecars):
        t = pq.read_table(path, columns=["episode_index", "frame_index", "advantage", "value_current", "return"])
        ep, fr = t.column("episode_index").to_numpy(), t.column("frame_index").to_numpy()
        f_ep, f_fr, ok, harm = flags[d.name]
        if not (np.array_equal(ep, f_ep) and np.array_equal(fr, f_fr)):
            ok, harm = frame_flags(d.dataset, ep, fr)
        out[d.name] = dataset_label_report(t, ok, harm, plan.models_for(d.name, ep))
        say(f"labels {format_report(d.name, out[d.name])}", options=ctx.ui)
    atomic_write_text(ctx.out_dir / "label_quality.json", json.dumps(_jsonable(out), indent=1) + "\n")
    return out


def _jsonable(obj: Any) -> Any:
    import json

    return json.loads(json.dumps(obj, default=str))


# -- preflight ------------------------------------------------------------------------------------


def preflight(
    config: Any, run_dir: Path, opened: dict[str, Any], stages: list[str] | None = None, digests: Any = None
) -> list[Any]:
    """Every problem with the run's inputs beyond the runner's checks of every run (run/preflight.py's
    run_problems: placeholders, the bundle's weights and files), collected as errors (nothing is started or
    written). The datasets it opens go into `opened` (RunDataset by name), so the run opens each once; the
    datasets' files are hashed through the run's `digests`."""
    from reproduction.data.reader import open_dataset
    from reproduction.errors import ConfigError, DatasetError, InputNotFoundError, PortableError
    from reproduction.run.preflight import MISSING_DATASET_HINT, disk_problems

    problems: list[Any] = []
    if not config.datasets:
        problems.append(
            ConfigError("datasets: the run names no dataset", field="datasets", hint="add datasets: [{path: ...}]")
        )
    names: dict[str, str] = {}
    clashed: set[str] = set()  # datasets[i] whose folder name an earlier one has: told once, here
    read: list[tuple[str, Any, Any]] = []  # (datasets[i].path, entry, opened dataset): what feature_problems reads
    for i, entry in enumerate(config.datasets):
        key = f"datasets[{i}]"
        if entry.type not in ("sft", "rollout"):
            problems.append(ConfigError(f"{key}.type: {entry.type!r} is not sft or rollout", field=f"{key}.type"))
        if "/path/to/" in entry.path:
            continue
        path = Path(entry.path)
        if path.name in names:
            problems.append(  # audit62 L3: the generic "fix it" hint said neither why nor how
                ConfigError(
                    f"{key}.path: folder name {path.name!r} is also {names[path.name]}'s; the run keys each dataset's "
                    "sidecars, values and metrics by its folder name",
                    field=key,
                    hint=f"rename or copy one of the two dataset folders (e.g. {path.parent.name}_{path.name}) and "
                    "point its path at the new name",
                )
            )
            clashed.add(key)
        names[path.name] = key
        if not path.exists():
            problems.append(
                InputNotFoundError(f"{key}.path: dataset {path} does not exist", path=path, hint=MISSING_DATASET_HINT)
            )
            continue
        try:
            ds = open_dataset(path)
            if ds.num_frames == 0:
                problems.append(DatasetError(f"{key}.path: dataset {path} holds no frames", path=path))
            read.append((f"{key}.path", entry, ds))
            opened[ds.name] = RunDataset(
                dataset=ds,
                type=entry.type,
                weight=entry.weight,
                value=entry.value,
                policy=entry.policy,
                digests=digests,
            )
            missing = [k for k in ("observation.state", "action") if k not in ds.info.features]
            if entry.policy and "policy" in (stages or []) and missing:
                problems.append(
                    DatasetError(
                        f"{key}.path: dataset {path} has no {' or '.join(missing)}, which the policy stage trains on",
                        path=path,
                        hint=f"set {key}.policy=false, or run only --stages returns,value,advantages",
                    )
                )
            lacking = [k for k in config.value.model.state_keys if k not in ds.info.features]
            if entry.value and lacking and "value" in (stages or ["value"]):
                problems.append(
                    DatasetError(
                        f"{key}.path: dataset {path} has no {lacking[0]!r}, which value.model.state_keys reads",
                        path=path,
                        field="value.model.state_keys",
                        hint="set value.model.state_keys=[] (no state input) or name features the dataset has",
                    )
                )
        except PortableError as exc:
            problems.append(type(exc)(f"{key}.path: {exc.message}", hint=exc.hint))
        except OSError as exc:
            problems.append(DatasetError(f"{key}.path: dataset {path} is unreadable ({exc.strerror or exc})"))
    problems += feature_problems(config, read, stages)
    problems += training_set_problems(config, read, stages, complete=len(read) == len(config.datasets))
    if config.datasets and not any(e.value for e in config.datasets):
        problems.append(ConfigError("datasets: no dataset has value: true; the value model would train on nothing"))
    from reproduction.data.duplicates import duplicate_dataset_problems  # audit54 D6: one dataset listed twice

    twice = duplicate_dataset_problems(config.datasets, opened)
    problems += [p for p in twice if p.field.removesuffix(".path") not in clashed]  # a name clash told it
    for section, model in (("value", config.value.model), ("policy", config.policy.model)):
        for name in ("tokenizer", "pretrained_manifest", "weights_dir", "norm_stats"):
            value = getattr(model, name, None)
            if value and "/path/to/" not in value and not Path(value).exists():
                problems.append(
                    InputNotFoundError(
                        f"{section}.model.{name}: {value} does not exist",
                        path=value,
                        hint=f"set {section}.model.{name} to a path that exists (or null)",
                    )
                )
    reference = config.eval.reference
    reads = "compare" in (stages or []) or ("eval" in (stages or []) and config.eval.sequential.enabled)
    if reads and reference and "/path/to/" not in reference and not Path(reference).is_file():
        problems.append(InputNotFoundError(f"eval.reference: {reference} is not a file", path=reference))
    elif reads and reference and "/path/to/" not in reference:  # disjoint evidence: found now, not after training
        from reproduction.recipes.recap.policy import evaluations
        from reproduction.run.comparison import reference_overlap_problem

        labels = [label for label, *_ in evaluations(config)]
        problem = reference_overlap_problem(reference, list(config.eval.tasks), labels)
        problems += [problem] if problem is not None else []
    if "eval" in (stages or []):
        from reproduction.recipes.recap.eval_world import eval_world_problems

        problems += libero_problems(config.eval.tasks)
        problems += eval_world_problems(config, read, stages)  # audit62 H1: found now, not after training
    problems += [ConfigError(p, field="min_free_gb") for p in disk_problems(run_dir, config.min_free_gb)]
    return problems


def training_set_problems(
    config: Any, read: list[tuple[str, Any, Any]], stages: list[str] | None, *, complete: bool = True
) -> list[Any]:
    """ConfigErrors (exit 4) for a training stage that could not take one optimizer step, found from the opened
    datasets' headers (frame counts, the episode table) before any stage runs (audit65_E M1, L1): `value.model.folds`
    above a `value: true` dataset's episode count (a fold would be empty), a value model's training set (each
    cross-fitting model's: the episodes outside its fold, mixed by recap/value/mixture.py's rule)
    smaller than `value.train.global_batch`, and the `policy: true` datasets' frames fewer than
    `policy.train.global_batch` (every frame is a sample for recap and bc; filtered_bc keeps the successful episodes'
    frames, fewer still: policy/task.py train_policy refuses those by the same key once it read is_success). `read`:
    (datasets[i].path, entry, opened dataset) of the datasets that opened; `complete`: all of them did (else a
    training set's size is unknown and only the per-dataset fold check runs: the unopened one is a problem already).
    """
    import numpy as np

    from reproduction.errors import ConfigError
    from reproduction.recap.value.crossfit import split_folds
    from reproduction.recap.value.mixture import mixture_counts

    out: list[Any] = []
    if stages is None or "value" in stages:
        model, gb = config.value.model, config.value.train.global_batch
        group = [(key, entry, ds) for key, entry, ds in read if entry.value]
        lengths: dict[str, dict[int, int]] = {}
        short: list[tuple[str, str, int]] = []  # (datasets[i], name, episodes) of those with fewer than the folds
        for key, _, ds in group:
            ids = ds.episodes.column("episode_index").to_numpy().astype(np.int64)
            size = ds.episodes.column("length").to_numpy().astype(np.int64)
            lengths[ds.name] = dict(zip(ids[size > 0].tolist(), size[size > 0].tolist()))
            if model.folds > 1 and len(lengths[ds.name]) < model.folds:
                short.append((key.removesuffix(".path"), ds.name, len(lengths[ds.name])))
        if short:
            told = "; ".join(f"{key} ({name}) has {have} episode(s)" for key, name, have in short)
            out.append(
                ConfigError(
                    f"value.model.folds={model.folds}: {told}, fewer than the folds (cross-fitting holds out at least "
                    "one episode of every `value: true` dataset per fold)",
                    field="value.model.folds",
                    hint=f"lower value.model.folds to at most {max(1, min(h for *_, h in short))} (1 = no "
                    f"cross-fitting), add episodes, or set {short[0][0]}.value=false",
                )
            )
        names = [ds.name for _, _, ds in group]
        if group and complete and not out and len(set(names)) == len(names) and all(lengths.values()):
            plan = split_folds({n: list(lengths[n]) for n in names}, folds=model.folds, seed=model.fold_seed)
            weights = [entry.weight for _, entry, _ in group]
            counts = []
            for k in range(plan.folds):
                sizes = [sum(lengths[n][int(e)] for e in plan.train_episodes(k, n)) for n in names]
                counts.append(int(mixture_counts(sizes, weights, balance_weights=model.balance_weights).sum()))
            k = int(np.argmin(counts))
            if counts[k] < gb:
                which = f" (model {k} of {plan.folds} trains without fold {k}'s episodes)" if plan.folds > 1 else ""
                fewer = ", add data, or lower value.model.folds" if plan.folds > 1 else ", or add data"
                out.append(
                    ConfigError(
                        f"value.train.global_batch={gb}: the value model's training set has {counts[k]} samples"
                        f"{which}, fewer than one global batch",
                        field="value.train.global_batch",
                        hint=f"lower value.train.global_batch to at most {counts[k]} (a multiple of "
                        f"value.train.micro_batch x world_size){fewer}",
                    )
                )
    if stages is None or "policy" in stages:
        gb = config.policy.train.global_batch
        group = [(key, entry, ds) for key, entry, ds in read if entry.policy]
        frames = sum(ds.num_frames for _, _, ds in group)
        if group and complete and frames < gb:
            out.append(
                ConfigError(
                    f"policy.train.global_batch={gb}: the policy's training set has {frames} samples (the frames of "
                    "the `policy: true` datasets), fewer than one global batch",
                    field="policy.train.global_batch",
                    hint=f"lower policy.train.global_batch to at most {frames} (a multiple of "
                    "policy.train.micro_batch x world_size), or add data",
                )
            )
    return out


NO_CAMERA_KEY = "observation.images.none"
"""The documented way to give the value model no image (value.model.cameras cannot be empty): a key no dataset has
on purpose (the demo's configs), so the unknown-camera check lets it through."""


def _numeric(dtype: str) -> bool:
    return dtype == "bool" or dtype.startswith(("float", "int", "uint"))


def feature_problems(config: Any, read: list[tuple[str, Any, Any]], stages: list[str] | None) -> list[Any]:
    """ConfigErrors (exit 4) for state and camera settings the datasets' meta/info.json features cannot serve,
    found before any stage runs (audit54 D1, D3, D4; no frame is read): a state feature that is not numeric
    (dtype string, image, video); state features of different widths in two datasets one model reads (value:
    every dataset, as stage 3 scores them all; policy: the `policy` datasets, their action too); a camera map
    none of whose keys any dataset has while the datasets do have image/video features (a typo, or the default
    observation.images.image on a dataset whose camera is named otherwise, would train an image-less model
    without a word). On datasets none of which has any image feature, a camera map the user wrote is refused too
    (audit55 E3: --no-cameras data under the release config trained on placeholders and claimed two cameras);
    value.model.cameras' default there keeps the absent-camera rule, and NO_CAMERA_KEY (the no-image idiom) is
    always accepted. A policy.model.state_keys feature a policy dataset lacks is refused (audit55 E4); other
    missing features are left to the missing-feature checks. With state_dims set (audit54 RV4): an index past a
    dataset's state width, and datasets where the picked indices land on different features (widths differing up
    to the last feature a pick lies in); widths after that may differ. Negative and repeated indices are refused
    when the config loads."""
    from reproduction.errors import ConfigError

    problems: list[Any] = []
    runs = set(stages) if stages is not None else {"value", "advantages"}
    value_model, policy_model = config.value.model, config.policy.model
    groups: list[tuple[str, list[tuple[str, Any, Any]], Any, Any]] = []
    if runs & {"value", "advantages"} and value_model.state_keys:
        keys = list(value_model.state_keys)
        groups.append(("value.model.state_keys", read, lambda ds, keys=keys: keys, value_model.state_dims))
    if "policy" in runs:
        pol = [r for r in read if r[1].policy]

        def policy_keys(ds: Any) -> list[str]:
            goal = ["observation.goal"] if "observation.goal" in ds.info.features else []
            return list(policy_model.state_keys) or ["observation.state", *goal]

        field = "policy.model.state_keys" if policy_model.state_keys else "the policy's default state"
        groups.append((field, pol, policy_keys, policy_model.state_dims))
        groups.append(("the policy's action", pol, lambda ds: ["action"], None))
    for field, group, keys_of, dims in groups:
        first: tuple[str, list[tuple[str, list[int]]]] | None = None
        for where, _entry, ds in group:
            feats = ds.info.features
            keys = [k for k in keys_of(ds) if k in feats]
            bad = [k for k in keys if not _numeric(str(feats[k].get("dtype")))]
            if bad:
                problems.append(
                    ConfigError(
                        f"{where}: dataset {ds.root}: feature {bad[0]!r} is dtype {feats[bad[0]].get('dtype')!r}; "
                        f"{field} takes numeric features (float, int, bool)",
                        field=field,
                        hint=f"drop {bad[0]} from {field}",
                    )
                )
                continue
            absent = [k for k in keys_of(ds) if k not in feats and k != "observation.state"]
            if field == "policy.model.state_keys" and absent:  # audit55 E4: found now, not after value trained
                have = ", ".join(
                    k for k in sorted(feats) if k not in _BOOKKEEPING and _numeric(str(feats[k].get("dtype")))
                )
                problems.append(
                    ConfigError(
                        f"{field}: {where}: dataset {ds.root} has no {absent[0]!r} (its numeric features: {have})",
                        field=field,
                        hint=f"name features every policy: true dataset has in {field}, or set "
                        f"{where.removesuffix('.path')}.policy=false",
                    )
                )
                continue
            shapes = [(k, feats[k].get("shape") or [1]) for k in keys]
            if len(keys) < len(keys_of(ds)) or any(feature_width(sh) is None for _k, sh in shapes):
                continue  # a missing feature is reported on its own, an unreadable shape by the reader
            named = f"{where} ({ds.name})"
            if dims is not None:  # audit54 RV4: each index must pick the same component in every dataset
                widths = [feature_width(sh) or 0 for _k, sh in shapes]
                if max(dims) >= sum(widths):
                    problems.append(_dims_problem(field, list(dims), named, shapes))
                    break
                if first is None:
                    first = (named, shapes)
                    continue
                other = [feature_width(sh) or 0 for _k, sh in first[1]]
                if [_picked(widths, d) for d in dims] != [_picked(other, d) for d in dims]:
                    upto = max(_picked(widths, max(dims))[0], _picked(other, max(dims))[0]) + 1
                    problems.append(_width_problem(field, (first[0], first[1][:upto]), (named, shapes[:upto])))
                    break
                continue
            if first is None:
                first = (named, shapes)
            elif [(k, feature_width(sh)) for k, sh in shapes] != [(k, feature_width(sh)) for k, sh in first[1]]:
                problems.append(_width_problem(field, first, (named, shapes)))
                break
    cams = [("value.model.cameras", value_model.cameras, read, "value" in runs)]
    cams.append(("policy.model.cameras", policy_model.cameras, [r for r in read if r[1].policy], "policy" in runs))
    for field, cameras, group, on in cams:
        have = sorted({k for _w, _e, ds in group for k in ds.info.camera_keys})
        named = {slot: key for slot, key in dict(cameras).items() if key != NO_CAMERA_KEY}
        if on and group and not have and named and dict(cameras) != _DEFAULT_VALUE_CAMERAS:
            problems.append(_no_camera_problem(config, field, named, group))
            continue
        # Only a map none of whose keys any dataset has: a slot absent everywhere beside one that is read (e.g.
        # upstream's wrist slot on one-camera data) is the documented absent camera and keeps working.
        if not on or not have or not named or any(key in have for key in named.values()):
            continue
        slots = ", ".join(f"{slot} = {key}" for slot, key in named.items())
        first = next(iter(named))
        none = f"{{{first}: {NO_CAMERA_KEY}}}" if field.startswith("value") else "{}"
        hint = f"set {field}={{{first}: {have[0]}}} (a feature the datasets have), or {field}={none} for no image"
        if field.startswith("policy") and "eval" in runs:  # audit63 M2: a camera the eval world renders, too
            from reproduction.recipes.recap.eval_world import WITHOUT_EVAL, eval_renders

            world, renders = eval_renders(config)
            fit = [k for k in have if k in renders]
            hint = (
                f"set {field}={{{first}: {fit[0]}}} (a feature the datasets have and {world} renders), or "
                f"{field}={none} for no image"
                if fit
                else f"set {field}={none} for no image (the eval stage's {world} renders none of the datasets' "
                f"cameras), or map {first} to {have[0]} and {WITHOUT_EVAL}"
            )
        problems.append(
            ConfigError(
                f"{field}: no dataset has {slots} (the datasets' image/video features: {', '.join(have)}), so the "
                "model would train without any image",
                field=field,
                hint=hint,
            )
        )
    return problems


_BOOKKEEPING = frozenset({"timestamp", "frame_index", "episode_index", "index", "task_index"})
"""LeRobot's per-frame bookkeeping columns: numeric, but never a state a model could read."""

_DEFAULT_VALUE_CAMERAS = {"base_0_rgb": "observation.images.image"}
"""value.model.cameras' default: on data without any camera it is the documented absent camera (no image), not a
request for one; a map the user wrote (any other) on such data is refused (audit55 E3)."""


def _no_camera_problem(config: Any, field: str, named: dict[str, str], group: list[tuple[str, Any, Any]]) -> Any:
    """The ConfigError for a camera map the user wrote while none of the datasets the model reads has any image or
    video feature (e.g. --no-cameras data under the release config): the model would train on placeholders only,
    yet its export would claim the cameras and the evaluation render them."""
    from reproduction.errors import ConfigError

    slots = ", ".join(f"{slot} = {key}" for slot, key in named.items())
    sets = ", ".join(f"{where} ({ds.name})" for where, _e, ds in group)
    first = next(iter(named))
    off = f"{field}={{{first}: {NO_CAMERA_KEY}}}" if field.startswith("value") else f"{field}={{}}"
    if not field.startswith("value") and any("/" in task for task in config.eval.tasks):
        off += " and eval.libero.cameras=false"
    return ConfigError(
        f"{field}: names {slots}, but no dataset it reads has any image or video feature ({sets}), so the model "
        "would train without any image",
        field=field,
        hint=f"generate the data with cameras (the LIBERO generator without --no-cameras), or set {off} for no image",
    )


def _picked(widths: list[int], index: int) -> tuple[int, int]:
    """(feature position, component within it) of component `index` of a state of features of `widths`
    concatenated (index < sum(widths))."""
    start = 0
    for i, w in enumerate(widths):
        if index < start + w:
            return i, index - start
        start += w
    return len(widths) - 1, index - start


def _dims_problem(field: str, dims: list[int], named: str, shapes: list[tuple[str, Any]]) -> Any:
    """The ConfigError for a state_dims index past the components the state_keys features of dataset `named` have
    (the stage would only find it after the stages before it ran)."""
    from reproduction.errors import ConfigError

    key = field.replace("state_keys", "state_dims")
    total = sum(feature_width(sh) or 0 for _k, sh in shapes)
    feats = " + ".join(f"{k} (shape {sh}, width {feature_width(sh)})" for k, sh in shapes)
    return ConfigError(
        f"{key}: index {max(dims)} of {dims} is past the {total} components of {feats} in {named}",
        field=key,
        hint=f"keep {key} below {total}, or add the feature holding component {max(dims)} to {field}",
    )


def _width_problem(field: str, a: tuple[str, list[tuple[str, Any]]], b: tuple[str, list[tuple[str, Any]]]) -> Any:
    """The ConfigError naming the first feature whose shape differs between datasets a and b (where, shapes)."""
    from reproduction.errors import ConfigError

    sa, sb = dict(a[1]), dict(b[1])
    k = (
        [k for k in sa if k not in sb or feature_width(sa[k]) != feature_width(sb[k])] + [k for k in sb if k not in sa]
    )[0]
    shown = {w: f"shape {d[k]}" if k in d else "absent" for w, d in ((a[0], sa), (b[0], sb))}
    if field.startswith("value"):
        hint = "name features of one width in every dataset in value.model.state_keys, or drop the odd dataset " + (
            "(a dataset with value: false is still scored by the value model)"
        )
    elif k == "action":
        hint = "set policy: false on the odd dataset: the policy predicts one action width"
    else:
        hint = "set policy: false on the odd dataset, or name features of one width in every dataset in " + (
            "policy.model.state_keys"
        )
    return ConfigError(
        f"{field}: {k} is {shown[a[0]]} in {a[0]} but {shown[b[0]]} in {b[0]}; one model reads both datasets, "
        "so its inputs must have one width",
        field=field,
        hint=hint,
    )


def libero_problems(tasks: list[str]) -> list[Any]:
    """LIBERO tasks in eval.tasks with LIBERO not installed (the one-line error naming the extra), or a task name
    the installed LIBERO does not know; found before any stage trains. Suites and indices were checked at config
    load; names need LIBERO's task lists, so only a name makes this import LIBERO (a few seconds)."""
    from reproduction.errors import MissingDependencyError, PortableError
    from reproduction.sim.libero import (
        INSTALL_HINT,
        available,
        check_render_backend,
        is_libero_id,
        parse_task_id,
        resolve_tasks,
    )

    libero = [t for t in tasks if is_libero_id(t)]
    if not libero:
        return []
    if not available():
        return [
            MissingDependencyError(
                f"eval.tasks names LIBERO tasks ({', '.join(libero)}) but LIBERO is not installed", hint=INSTALL_HINT
            )
        ]
    if any(parse_task_id(t).name is not None for t in libero):
        try:
            resolve_tasks(libero)
        except PortableError as exc:
            return [exc]
    try:  # a MUJOCO_GL mujoco cannot import with: exit 46 now, not after the stages before eval (audit51 H2)
        check_render_backend()
    except PortableError as exc:
        return [exc]
    return []


def _has(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


POLICY_STAGES = (
    StageSpec(
        name="policy",
        fn="reproduction.recipes.recap.policy:policy_stage",
        needs=("advantages",),
        config=("datasets", "advantages.tag", "policy"),
        outputs=("*/policy_setup.json", "*/export/**/*"),
        training="policy.train.max_steps",
        weights=("policy.model",),
        code=TRAINING_MODULES,
        uses_ray=policy_uses_ray,
    ),
    StageSpec(
        name="eval",
        fn="reproduction.recipes.recap.policy:eval_stage",
        needs=("policy",),
        config=("eval", "policy.modes", "policy.model.execute_steps"),
        # eval.reference and eval.workers are declared same_outputs() (the reference is the compare stage's
        # input, which names it) and so out of this key; a sequential evaluation reads the reference, by content:
        files_if=(("eval.reference", "eval.sequential.enabled"),),
        inputs=False,
        outputs=("**/*.json",),
        code=(
            "reproduction.sim.evaluate",
            "reproduction.sim.libero.protocol",
            "reproduction.recap.policy.export",
            "reproduction.run.sequential",
        ),
        uses_ray=no_ray,
    ),
    StageSpec(
        name="compare",
        fn="reproduction.recipes.recap.policy:compare_stage",
        needs=("eval",),
        config=("eval.reference",),
        files=("eval.reference",),
        inputs=False,
        outputs=("compare.json",),
        code=("reproduction.run.evidence", "reproduction.run.comparison", "reproduction.run.stats"),
        redo_on_change=True,  # a new reference recompares (a second), never re-evaluates
        uses_ray=no_ray,
    ),
)
"""Stages 4 to 6, present where the policy stage and the simulator are installed."""

RECAP = Recipe(
    name="recap",
    open_inputs="reproduction.recipes.recap.recipe:open_datasets",
    config_schema="reproduction.recipes.recap.config:RunConfig",
    evaluate="reproduction.recipes.recap.eval_cmd:cmd_eval",
    headline="reproduction.run.compare_cmd:run_results_lines",  # rates, intervals, verdict
    report="reproduction.recipes.recap.report:write_run_report",  # plots/ and report.html after `portable run`
    preflight="reproduction.recipes.recap.recipe:preflight",
    stages=(
        StageSpec(
            name="returns",
            fn="reproduction.recipes.recap.recipe:returns_stage",
            config=("datasets", "returns"),
            outputs=("*/returns*.parquet", "*/stats.json"),
            code=("reproduction.recap.returns", "reproduction.recap.sidecars"),
            uses_ray=no_ray,
        ),
        StageSpec(
            name="value",
            fn="reproduction.recipes.recap.recipe:value_stage",
            needs=("returns",),
            config=("datasets", "returns.tag", "value.model", "value.train"),
            outputs=("value_setup.json", "crossfit.json", "model_*/export/**/*"),
            training="value.train.max_steps",
            weights=("value.model",),
            code=(
                "reproduction.recap.value.task",
                "reproduction.recap.value.model",
                "reproduction.recap.value.data",
                "reproduction.recap.value.loss",
            ),
            uses_ray=value_uses_ray,
        ),
        StageSpec(
            name="advantages",
            fn="reproduction.recipes.recap.recipe:advantages_stage",
            needs=("returns", "value"),
            config=("datasets", "returns.tag", "advantages", "value.infer.batch_size"),
            outputs=("values/*.parquet", "*/advantages*.parquet", "*/mixture_config.yaml"),
            code=("reproduction.recap.advantages", "reproduction.recap.value.infer"),
            uses_ray=advantages_uses_ray,  # value.infer.workers: same_outputs(), so not among its config keys
        ),
    )
    + (POLICY_STAGES if _has("reproduction.recap.policy.task") and _has("reproduction.sim.evaluate") else ()),
)
