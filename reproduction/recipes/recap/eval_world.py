"""RECAP's preflight of the evaluation world: the policy datasets' state and action against what eval.tasks' world
observes and takes, from meta/info.json alone, before any stage trains (audit62 H1, M1).

A policy trained on a 5-value state (or a 6-dim action) was found to misfit Fetch only at the eval stage, after
value and policy had trained: exit 1 "internal error" for the state, a LIBERO hint for the action. The widths are
the ones the policy stage trains on (policy.model.state_keys, or observation.state ++ observation.goal where the
dataset has it; state_dims) and the ones the world gives (sim/spaces.py: the export's rule in that world).

The same holds for the policy's cameras (audit63 M2): policy.model.cameras naming a key the world of eval.tasks does
not render (Fetch: sim/cameras.py CAMERA_NAMES; LIBERO: LIBERO_IMAGE_KEYS, none with eval.libero.cameras false)
trained value, advantages and the policy, then was refused by the eval stage, whose hint and the preflight's sent the
user in a circle. It is refused here, as GRPO refuses sft.model.cameras when its config loads.
"""

from __future__ import annotations

from typing import Any

ONLY_TRAIN = "--stages returns,value,advantages,policy"
"""The stages of a run that trains the policy without evaluating it (eval and compare left out)."""


def eval_world_problems(config: Any, read: list[tuple[str, Any, Any]], stages: list[str] | None) -> list[Any]:
    """One ConfigError (exit 4, field eval.tasks) for the first `policy: true` dataset whose state or action the
    world of eval.tasks cannot give the policy (`read`: (datasets[i].path, entry, opened dataset)), and one (field
    policy.model.cameras) for a policy camera map that world does not render; none when the eval stage is not
    selected. Datasets of different widths are feature_problems' to name; one is enough here."""
    from reproduction.recipes.recap.config import is_libero_task
    from reproduction.sim.spaces import dataset_shape, fetch_world, libero_world, world_problem

    if "eval" not in (stages or []):
        return []
    tasks = list(config.eval.tasks)
    libero = any(is_libero_task(t) for t in tasks)
    world = libero_world(cameras=bool(config.eval.libero.cameras)) if libero else fetch_world()
    other = fetch_world() if libero else libero_world(cameras=False)
    model = config.policy.model
    problems = []
    for where, entry, ds in read:
        if not entry.policy:
            continue
        shape = dataset_shape(ds.info.features, state_keys=model.state_keys, state_dims=model.state_dims)
        problem = world_problem(shape, world, other, where=f"{where} ({ds.name})", key="eval.tasks", tasks=tasks)
        if problem is not None:
            problem.hint += f" {WITHOUT_EVAL}"
            problems.append(problem)
            break
    camera = camera_problem(config, read, libero=libero, tasks=tasks)
    return problems + ([camera] if camera is not None else [])


WITHOUT_EVAL = (
    f"train the policy without eval and compare: portable run ... {ONLY_TRAIN} (nothing was started or written)"
)
"""The way out every eval-world refusal ends with: the run without the stage that cannot run."""


def rendered(*, libero: bool, libero_cameras: bool = True) -> list[str]:
    """The observation keys of the cameras the eval world renders: Fetch's observation.images.<camera> for
    CAMERA_NAMES; a rendering LIBERO env's LIBERO_IMAGE_KEYS, none without cameras (no LIBERO import)."""
    from reproduction.sim.cameras import CAMERA_NAMES, IMAGE_PREFIX, LIBERO_IMAGE_KEYS

    if libero:
        return list(LIBERO_IMAGE_KEYS) if libero_cameras else []
    return [IMAGE_PREFIX + c for c in CAMERA_NAMES]


def eval_renders(config: Any) -> tuple[str, list[str]]:
    """(the world of eval.tasks, the observation keys of the cameras it renders)."""
    from reproduction.recipes.recap.config import is_libero_task

    libero = any(is_libero_task(t) for t in config.eval.tasks)
    return ("LIBERO" if libero else "Fetch"), rendered(libero=libero, libero_cameras=bool(config.eval.libero.cameras))


def camera_problem(config: Any, read: list[tuple[str, Any, Any]], *, libero: bool, tasks: list[str]) -> Any:
    """The ConfigError (exit 4, field policy.model.cameras) for a policy camera map with a key the world of
    eval.tasks does not render (the eval stage would refuse the export after everything trained), or None. Its hint
    gives a way out that passes when followed: the map with each such slot set to a camera the policy datasets have
    and the world renders (when they have one), eval.libero.cameras=true where LIBERO would then render the map's
    keys and observe the state the data have, and always the run without eval."""
    from reproduction.errors import ConfigError
    from reproduction.sim.spaces import dataset_shape, libero_world, misfits

    key = "policy.model.cameras"
    cameras = dict(config.policy.model.cameras)
    lib_cameras = bool(config.eval.libero.cameras)
    name, renders = eval_renders(config)
    bad = {slot: cam for slot, cam in cameras.items() if cam not in renders}
    if not bad:
        return None
    slots = ", ".join(f"{slot} = {cam}" for slot, cam in bad.items())
    verb = "is not a camera" if len(bad) == 1 else "are not cameras"
    what = f"it renders {', '.join(renders)}" if renders else "it renders none: eval.libero.cameras is false"
    message = (
        f"{key}: {slots} {verb} {name} renders ({what}), so the {name} tasks of eval.tasks ({', '.join(tasks)}) "
        "could not run the policy"
    )
    policy_sets = [ds for _where, entry, ds in read if entry.policy]
    have = {k for ds in policy_sets for k in ds.info.camera_keys}
    fits = [k for k in renders if k in have]
    ways = []
    if fits:
        spare, mapped = [k for k in fits if k not in cameras.values()], {}
        for slot, cam in cameras.items():
            if cam in renders:
                mapped[slot] = cam
            elif spare:
                mapped[slot] = spare.pop(0)
        text = ", ".join(f"{slot}: {cam}" for slot, cam in mapped.items())
        ways.append(f"set {key}={{{text}}} (cameras the data have and {name} renders)")
    elif libero and not lib_cameras:  # the camera-free tier: render them, or train the policy without images
        model, would = config.policy.model, rendered(libero=True)
        shapes = [
            dataset_shape(ds.info.features, state_keys=model.state_keys, state_dims=model.state_dims)
            for ds in policy_sets
        ]
        fit = not any(s is not None and misfits(libero_world(cameras=True), s) for s in shapes)
        if fit and all(cam in would for cam in bad.values()):
            ways.append(f"set eval.libero.cameras=true (LIBERO then renders {', '.join(would)})")
        if model.preset != "pi05":  # pi05 reads cameras (refused without)
            ways.append(f"set {key}={{}} for a policy without images")
    else:
        held = ", ".join(sorted(have)) or "none"
        ways.append(f"train on data holding a camera {name} renders (the policy datasets hold: {held})")
    return ConfigError(message, field=key, hint=", or ".join([*ways, WITHOUT_EVAL]))
