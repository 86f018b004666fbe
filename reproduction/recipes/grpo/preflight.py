"""The GRPO recipe's preflight: every problem with its inputs, collected before anything runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def preflight(config: Any, run_dir: Path, opened: dict[str, Any], stages: list[str] | None = None) -> list[Any]:
    """Problems (errors) beyond the runner's checks of every run (run/preflight.py's run_problems: placeholders, a
    restored bundle's weights and files, its layers restored): the sft inputs (each sft dataset, and the
    co-training dataset, must hold the cameras sft.model.cameras reads; the sft datasets' frames, one
    sft.train.global_batch at least), the tasks, the reference and the disk;
    datasets it opens go into `opened` (keyed like stages.open_inputs) so the run opens each once. Writes nothing."""
    from reproduction.data.reader import open_dataset
    from reproduction.errors import ConfigError, DatasetError, InputNotFoundError, PortableError
    from reproduction.recipes.grpo.stages import OpenedDataset
    from reproduction.run.preflight import MISSING_DATASET_HINT, disk_problems

    problems: list[Any] = []
    sft = config.sft
    if sft.export:
        if not (Path(sft.export) / "policy.json").is_file():
            problems.append(InputNotFoundError(f"sft.export: {sft.export} is not a policy export", path=sft.export))
    elif not sft.datasets:
        problems.append(
            ConfigError("sft: neither sft.datasets nor sft.export is set", field="sft", hint="add sft.datasets")
        )
    paths = [] if sft.export else [(f"sft.datasets[{i}].path", d.path) for i, d in enumerate(sft.datasets)]
    from reproduction.data.duplicates import duplicate_dataset_problems  # audit54 D6: by resolved folder only

    problems += duplicate_dataset_problems([] if sft.export else sft.datasets, {}, key="sft.datasets")
    if config.rl.cotrain_dataset:
        paths.append(("rl.cotrain_dataset", config.rl.cotrain_dataset))
    for key, path in paths:
        if not Path(path).exists():
            problems.append(
                InputNotFoundError(f"{key}: dataset {path} does not exist", path=path, hint=MISSING_DATASET_HINT)
            )
            continue
        try:
            opened[str(Path(path))] = OpenedDataset(open_dataset(Path(path)))
        except PortableError as exc:
            problems.append(type(exc)(f"{key}: {exc.message}", hint=exc.hint))
            continue
        if key.startswith("sft.datasets"):  # audit62 H1: a state or action the RL or eval world cannot give
            problems += _world_problems(config, key, opened[str(Path(path))].dataset, stages)[:1]
        lacking = [c for c in sft.model.cameras.values() if c not in opened[str(Path(path))].dataset.camera_keys]
        if lacking:  # stage 4 (or the co-training loss) would train those slots blank, the rollouts render them
            problems.append(
                DatasetError(
                    f"{key}: dataset {path} has no {', '.join(lacking)}, which sft.model.cameras reads",
                    hint="generate the demonstrations with those cameras, or drop them from sft.model.cameras",
                )
            )
    sft_sets = [key for key, path in paths if key.startswith("sft.datasets") and str(Path(path)) in opened]
    if sft_sets and len(sft_sets) == len(sft.datasets) and "sft" in (stages or ["sft"]):
        # BC trains on every frame: a set smaller than one global batch is refused now, not when sft starts
        frames = sum(opened[str(Path(d.path))].dataset.num_frames for d in sft.datasets)
        if frames < sft.train.global_batch:
            problems.append(
                ConfigError(
                    f"sft.train.global_batch={sft.train.global_batch}: the SFT training set has {frames} samples (the "
                    "frames of sft.datasets), fewer than one global batch",
                    field="sft.train.global_batch",
                    hint=f"lower sft.train.global_batch to at most {frames} (a multiple of sft.train.micro_batch x "
                    "world_size), or add demonstrations",
                )
            )
    for name in ("tokenizer", "pretrained_manifest", "weights_dir", "norm_stats"):  # as RECAP's policy.model's
        value = getattr(sft.model, name)
        if value and not sft.export and "/path/to/" not in value and not Path(value).exists():
            problems.append(InputNotFoundError(f"sft.model.{name}: {value} does not exist", path=value))
    problems += _tasks_problems((("rl.tasks", list(config.rl.tasks)), ("eval.tasks", list(config.eval.tasks))))
    reference = config.eval.reference
    if reference and "compare" in (stages or ["compare"]) and not Path(reference).is_file():
        problems.append(InputNotFoundError(f"eval.reference: {reference} is not a file", path=reference))
    elif reference and "compare" in (stages or ["compare"]):  # as RECAP's: disjoint tasks found before training
        from reproduction.run.comparison import reference_overlap_problem

        problem = reference_overlap_problem(reference, list(config.eval.tasks))
        problems += [problem] if problem is not None else []
    problems += [ConfigError(p, field="min_free_gb") for p in disk_problems(run_dir, config.min_free_gb)]
    return problems


def _world_problems(config: Any, where: str, dataset: Any, stages: list[str] | None) -> list[Any]:
    """ConfigErrors (exit 4) for an SFT dataset whose state or action (as sft.model reads them) the world of rl.tasks
    (the rollouts) or eval.tasks cannot give the policy, found before SFT trains: the rollouts died on the first
    batch after SFT had trained (audit62 H1)."""
    from reproduction.recipes.grpo.envs import is_libero
    from reproduction.sim.spaces import dataset_shape, fetch_world, libero_world, world_problem

    model = config.sft.model
    shape = dataset_shape(dataset.info.features, state_keys=model.state_keys, state_dims=model.state_dims)
    out = []
    for stage, key in (("rl", "rl.tasks"), ("eval", "eval.tasks")):
        tasks = list(getattr(config, stage).tasks)
        if stage not in (stages or [stage]) or not tasks:
            continue
        libero = any(is_libero(t) for t in tasks)
        world = libero_world(cameras=bool(model.cameras)) if libero else fetch_world()
        other = fetch_world() if libero else libero_world(cameras=not model.cameras)
        # rl and eval run in one world, with that world's reward and limits: one config layer switches them all
        # (review62 S L2: `rl.tasks=[libero_10/0]` alone was refused twice more)
        switch = (
            "--config bundle/grpo/libero.yaml over config.yaml"
            if other.name == "LIBERO"
            else "rl.tasks and eval.tasks of Fetch, e.g. [FetchPush-v4]"
        )
        problem = world_problem(
            shape,
            world,
            other,
            where=f"{where} ({dataset.name})",
            key=key,
            tasks=tasks,
            instead=f"{switch}; docs/grpo.md in the repository checkout",
        )
        if problem is not None:
            problem.hint += (
                " give SFT demonstrations with the state and action of that world (nothing was started or written)"
            )
            out.append(problem)
    return out


def _tasks_problems(keyed: tuple[tuple[str, list[str]], ...]) -> list[Any]:
    """task_problems of every key, with LIBERO missing as one problem naming every key that needs it (two of them
    were "preflight found 2 problems", exit 56 without the install hint, where the docs promise exit 10 and the
    hint: audit51 H4), and, with LIBERO installed, a `MUJOCO_GL` mujoco cannot import with (RenderUnavailableError,
    exit 46, before sft trains: audit51 H2)."""
    from reproduction.errors import MissingDependencyError, RenderUnavailableError
    from reproduction.recipes.grpo.envs import is_libero
    from reproduction.sim.libero import INSTALL_HINT, available, check_render_backend

    libero = {key: [t for t in tasks if is_libero(t)] for key, tasks in keyed}
    needing = [key for key, tasks in libero.items() if tasks]
    if needing and not available():
        names = sorted({t for tasks in libero.values() for t in tasks})
        out: list[Any] = [
            MissingDependencyError(
                f"{' and '.join(needing)} name{'s' if len(needing) == 1 else ''} LIBERO tasks ({', '.join(names)}) "
                "but LIBERO is not installed",
                hint=INSTALL_HINT,
            )
        ]
        return out + [p for key, tasks in keyed if key not in needing for p in task_problems(key, tasks)]
    out = [p for key, tasks in keyed for p in task_problems(key, tasks)]
    if needing:
        try:
            check_render_backend()
        except RenderUnavailableError as exc:
            out.append(exc)
    return out


def task_problems(key: str, tasks: list[str]) -> list[Any]:
    """Problems with `key`'s tasks that need more than the config: a Fetch id the simulator does not know; LIBERO
    tasks with LIBERO not installed (MissingDependencyError, exit 10, naming the extra, as RECAP's preflight), or a
    LIBERO task name the installed LIBERO does not know (resolving names imports LIBERO: a few seconds)."""
    from reproduction.errors import ConfigError, MissingDependencyError, PortableError
    from reproduction.recipes.grpo.envs import is_libero

    libero = [t for t in tasks if is_libero(t)]
    if not libero:
        from reproduction.sim.tasks import get_task

        out: list[Any] = []
        for task in tasks:
            try:
                get_task(task)
            except PortableError as exc:
                out.append(ConfigError(f"{key}: {exc.message}", field=key, hint=exc.hint))
        return out
    from reproduction.sim.libero import INSTALL_HINT, available, parse_task_id, resolve_tasks

    if not available():
        return [
            MissingDependencyError(
                f"{key} names LIBERO tasks ({', '.join(libero)}) but LIBERO is not installed", hint=INSTALL_HINT
            )
        ]
    if any(parse_task_id(t).name is not None for t in libero):
        try:
            resolve_tasks(libero)
        except PortableError as exc:
            return [ConfigError(f"{key}: {exc.message}", field=key, hint=exc.hint)]
    return []
