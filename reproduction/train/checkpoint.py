"""All checkpoint logic: the commit protocol, resume discovery, DCP load with resharding, exports.

    <out_dir>/checkpoints/
      LATEST                 "step_12\\n" (a hint for people and tools; resume scans for the newest)
      step_8/                complete: DCP files (.metadata, __<rank>_0.distcp) + manifest.json
      step_12/
      step_16.partial/       being written, or left by a kill: removed on resume, never loaded
    <out_dir>/export/        model-only: model.safetensors, model_config.json, train_config.json, extras

Commit protocol: every rank writes its DCP shard into `step_N.partial/` -> barrier -> rank 0 hashes
the files and writes manifest.json (file digests, world size and the world sizes of every invocation that trained
its steps, versions (with the CPU kernels of a CPU run), config digest, data cursor, RNG states per rank, canary
loss) -> rename to `step_N/` -> atomic `LATEST` -> keep-last-k -> barrier.
A directory is a checkpoint only when it is named `step_N` and holds manifest.json; a kill at any
moment leaves the previous complete checkpoint untouched.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import platform
import random
import re
import shutil
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from reproduction import __version__
from reproduction.config_fields import added_defaults, recorded_train, unrecorded_filled
from reproduction.digests import sha256_files
from reproduction.errors import (
    DISK_FULL_ERRNOS,
    RESUME_HINT,
    CheckpointError,
    CheckpointKernelsChangedError,
    disk_full_error,
    is_disk_full,
    os_error,
)
from reproduction.fsio import atomic_write_text, free_bytes, fsync_dir
from reproduction.train import dist

FORMAT = "recap-portable/train-checkpoint"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
STEP_RE = re.compile(r"^step_(\d+)$")
KERNELS = "cpu_kernels"
"""The manifest's `versions` key for the CPU kernels its steps were computed with: lineage's name and value
(reproduction.numerics.cpu_kernels)."""


# -- discovery ----------------------------------------------------------------------------------


def complete_steps(root: Path) -> list[int]:
    """Steps with a complete checkpoint under `root`, ascending."""
    if not Path(root).is_dir():
        return []
    steps = []
    for child in Path(root).iterdir():
        m = STEP_RE.match(child.name)
        if m and (child / MANIFEST).is_file():
            steps.append(int(m.group(1)))
    return sorted(steps)


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step_{step}"


def clean_stale(root: Path) -> list[Path]:
    """Remove `step_*.partial/` left by a killed save and `step_*.pruned/` by a killed prune (rank 0 only); returns
    what was removed."""
    removed = []
    if Path(root).is_dir():
        for child in sorted([*Path(root).glob("step_*.partial"), *Path(root).glob("step_*.pruned")]):
            shutil.rmtree(child, ignore_errors=True)
            removed.append(child)
    return removed


def tidy(root: Path, keep_last: int) -> list[int]:
    """Before a resume (rank 0): remove what killed saves and prunes left (`clean_stale`), prune to the newest
    `keep_last` complete steps and point LATEST at the newest, as a save that finished would have left them; returns
    the complete steps, ascending. A kill between a checkpoint's rename to step_N and its LATEST write or its prune
    left LATEST at an older step or an old step kept for good: a resume whose final step already existed saved
    nothing again to repair them (audit47 kill2 F2)."""
    clean_stale(root)
    steps = _prune(root, keep_last)
    if steps:
        latest = Path(root) / "LATEST"
        want = f"{step_dir(root, steps[-1]).name}\n"
        try:
            current = latest.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            current = None
        if current != want:
            atomic_write_text(latest, want)
    return steps


def cut_back(root: Path, max_step: int) -> list[int]:
    """Rank 0, before a resume that trains to `max_step`: remove every complete step above it (each as `_remove_step`
    does) and point LATEST at the newest left; returns the steps left, ascending. A killed longer attempt's later
    checkpoints would otherwise outlive the metrics and live evaluations the shorter run cuts back, and a later
    resume to their step would load one and train nothing, logging no step of it (audit55 review)."""
    steps = complete_steps(root)
    for step in steps:
        if step > max_step:
            _remove_step(step_dir(root, step))
    kept = [s for s in steps if s <= max_step]
    if kept:
        atomic_write_text(Path(root) / "LATEST", f"{step_dir(root, kept[-1]).name}\n")
    return kept


def _prune(root: Path, keep_last: int) -> list[int]:
    """Keep-last-k: remove all but the newest `keep_last` complete steps (0 keeps every one); returns those kept."""
    steps = complete_steps(root)
    for old in steps[:-keep_last]:
        _remove_step(step_dir(root, old))
    return steps[-keep_last:] if keep_last else steps


def _remove_step(folder: Path) -> None:
    """Remove a complete checkpoint folder so that no kill leaves a part of it that still counts as complete: renamed
    out of the `step_N` names first (one atomic rename), then deleted. rmtree alone, killed midway, left a step_N/
    holding its manifest and no shard, which complete_steps counted and a resume would load (audit47 kill F2)."""
    if not folder.exists():
        return
    doomed = folder.with_name(folder.name + ".pruned")
    shutil.rmtree(doomed, ignore_errors=True)
    os.replace(folder, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


# -- RNG ----------------------------------------------------------------------------------------


def capture_rng(accel=None) -> dict[str, Any]:
    """This process's torch/numpy/python (and accelerator) RNG states as JSON-able values."""
    np_state = np.random.get_state()
    py_state = random.getstate()
    state = {
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "python": [py_state[0], list(py_state[1]), py_state[2]],
    }
    if accel is not None:
        state["accel"] = base64.b64encode(accel.get_rng_state().cpu().numpy().tobytes()).decode()
    return state


def restore_rng(state: dict[str, Any], accel=None) -> None:
    """Inverse of `capture_rng`."""
    raw = np.frombuffer(base64.b64decode(state["torch"]), dtype=np.uint8).copy()
    torch.set_rng_state(torch.from_numpy(raw))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if accel is not None and "accel" in state:
        accel.set_rng_state(torch.from_numpy(np.frombuffer(base64.b64decode(state["accel"]), dtype=np.uint8).copy()))


# -- save ---------------------------------------------------------------------------------------


def save(
    root: Path,
    step: int,
    model: torch.nn.Module,
    optim: torch.optim.Optimizer,
    *,
    config_digest: str,
    resume_key: dict,
    data_cursor: dict,
    trainer: dict,
    canary_loss: float,
    keep_last: int,
    accel=None,
    kernels: str | None = None,
    world_sizes: Sequence[int] = (),
) -> Path:
    """Commit a checkpoint of `step` (collective: every rank calls it); returns `step_N/`.

    `kernels` (`kernels_for(device)`: None on an accelerator) goes into the manifest's `versions.cpu_kernels`;
    `world_sizes`, the world sizes that trained the steps before this invocation (`trained_world_sizes` of the
    checkpoint it resumed from, empty for a fresh start), into `world_sizes` with this one's appended.

    On failure before the rename the previous checkpoints are untouched and `step_N.partial/` is
    left for the next resume to clean. A save that does not fit on the disk (DCP's CheckpointException
    wrapping ENOSPC on any rank, or the manifest write) raises WriteFailedError (exit 8) on every rank,
    naming the folder, the bytes the checkpoint needs and what was free; `step_N.partial/` is removed.
    Ctrl-C or SIGTERM during DCP's write raises KeyboardInterrupt (`interrupt_in`), not the CheckpointException DCP
    wraps it in, so `portable run` exits 130 with the stage recorded `interrupted`; `step_N.partial/` is left for
    the next resume to clean.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict

    root = Path(root)
    partial = root / f"step_{step}.partial"
    try:
        if dist.is_main():
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
    except OSError as exc:
        raise os_error(exc, f"checkpoint folder {partial}") from None
    dist.barrier()
    model_sd, optim_sd = get_state_dict(model, optim)
    need = _need_bytes(root, sum(dist.all_gather_object(_state_bytes((model_sd, optim_sd)))))
    free = free_bytes(partial)
    with noting_interrupts() as arrived:
        try:
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(partial))
        except (Exception, CheckpointException) as exc:  # CheckpointException is a BaseException
            interrupt = interrupt_in(exc, arrived)
            if interrupt is not None:  # Ctrl-C / SIGTERM: step_N.partial/ is left, never taken as a checkpoint
                raise interrupt from None
            if not is_disk_full(exc) and free_bytes(partial) >= need:
                raise
            if dist.is_main():
                shutil.rmtree(partial, ignore_errors=True)
            raise disk_full_error(f"checkpoint step {step}", partial, need=need, free=free, hint=_room(need)) from None
    rng = dist.all_gather_object(capture_rng(accel))
    dist.barrier()
    final = step_dir(root, step)
    if dist.is_main():
        try:
            fields = {
                "world_sizes": _with_world(world_sizes, dist.world_size()),
                "config_digest": config_digest,
                "resume_key": resume_key,
                "data_cursor": data_cursor,
                "trainer": trainer,
                "canary_loss": canary_loss,
            }
            _commit(partial, final, root, step=step, rng=rng, keep_last=keep_last, kernels=kernels, fields=fields)
        except OSError as exc:
            shutil.rmtree(partial, ignore_errors=True)
            if exc.errno in DISK_FULL_ERRNOS:
                raise disk_full_error(
                    f"checkpoint step {step}", partial, need=need, free=free, hint=_room(need)
                ) from None
            raise os_error(exc, f"checkpoint {final}") from None
    dist.barrier()
    return final


@contextmanager
def noting_interrupts() -> Iterator[list[KeyboardInterrupt]]:
    """Inside, the KeyboardInterrupts that the SIGINT and SIGTERM handlers raise (Python's own for Ctrl-C,
    `portable run`'s for SIGTERM: guards.sigterm_as_interrupt) are noted in the list it yields as they pass,
    each handler otherwise unchanged and put back after. A no-op off the main thread (no handler runs there) and
    for a signal whose handler is no Python function (SIG_DFL, SIG_IGN)."""
    import signal
    import threading

    arrived: list[KeyboardInterrupt] = []
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            handler = signal.getsignal(signum)
            if callable(handler):
                previous[signum] = handler
                signal.signal(signum, functools.partial(_noting, handler, arrived))
    try:
        yield arrived
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _noting(handler: Any, arrived: list[KeyboardInterrupt], signum: int, frame: Any) -> None:
    try:
        handler(signum, frame)
    except KeyboardInterrupt as exc:
        arrived.append(exc)
        raise


def interrupt_in(exc: BaseException, arrived: Sequence[KeyboardInterrupt] = ()) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt to raise for `exc`, a DCP save or load that failed, when an interrupt stopped it: one
    that DCP's CheckpointException holds for a rank, or one a signal handler raised inside it (`arrived`:
    noting_interrupts). DCP pickles each rank's error to gather it, which drops its __context__, and an interrupt
    that lands inside torch.save's zip writer surfaces as the writer's RuntimeError ("unexpected pos"): only the
    handler saw it. None when no interrupt did."""
    for failure in (getattr(exc, "failures", None) or {}).values():  # torch DCP: {rank: (exc, frames)}
        cause = failure[0] if isinstance(failure, tuple) else failure
        if isinstance(cause, KeyboardInterrupt):
            return KeyboardInterrupt(*cause.args)
    return KeyboardInterrupt(*arrived[0].args) if arrived else None


def _need_bytes(root: Path, state_bytes: int) -> int:
    """Bytes the next checkpoint takes: the newest complete one's size (the same model and optimizer), or
    for a first one the tensors' bytes plus 64 KiB (DCP's per-tensor records, .metadata, manifest.json).
    Rank 0 decides, so every rank names the same number."""
    size = None
    if dist.is_main():
        steps = complete_steps(root)
        if steps:
            size = sum(p.stat().st_size for p in step_dir(root, steps[-1]).rglob("*") if p.is_file())
    size = dist.broadcast_object(size)
    return size if size is not None else state_bytes + (64 << 10)


def _room(need: int) -> str:
    from reproduction.ui import human_bytes

    return f"free at least {human_bytes(need)} there (or lower keep_last), {RESUME_HINT}"


def _state_bytes(obj: Any) -> int:
    """Bytes of every tensor (this rank's local shard of a DTensor) in a nested state dict."""
    if isinstance(obj, dict):
        return sum(_state_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_state_bytes(v) for v in obj)
    if isinstance(obj, torch.Tensor):
        local = obj.to_local() if hasattr(obj, "to_local") else obj
        return local.numel() * local.element_size()
    return 0


def _commit(
    partial: Path,
    final: Path,
    root: Path,
    *,
    step: int,
    rng: list,
    keep_last: int,
    fields: dict,
    kernels: str | None = None,
) -> None:
    """Rank 0: manifest.json into `partial`, rename to `final`, LATEST, keep-last-k."""
    manifest = _manifest(partial, step=step, rng=rng, **fields)
    if kernels is not None:
        manifest["versions"][KERNELS] = kernels
    atomic_write_text(partial / MANIFEST, json.dumps(manifest, indent=1))
    _remove_step(final)  # only when re-saving a step after resuming before it
    os.replace(partial, final)
    fsync_dir(root)
    atomic_write_text(root / "LATEST", f"{final.name}\n")
    _prune(root, keep_last)


def _manifest(folder: Path, *, step: int, rng: list, **fields: Any) -> dict[str, Any]:
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)
    digests = sha256_files(files)
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "step": step,
        "world_size": dist.world_size(),
        "files": {p.relative_to(folder).as_posix(): {"size": p.stat().st_size, "sha256": digests[p]} for p in files},
        "versions": {
            "reproduction": __version__,
            "torch": torch.__version__,
            "numpy": np.__version__,
            "python": platform.python_version(),
        },
        "rng": rng,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **fields,
    }


# -- what computed the steps --------------------------------------------------------------------


def kernels_for(device: torch.device) -> str | None:
    """The CPU kernels that compute a training step on `device`, as lineage words them (numerics.cpu_kernels: the
    pinned variables or `native`, and the CPU's widest unit), for a CPU device; None for an accelerator. On a GPU or
    NPU every forward, backward and optimizer step runs in the accelerator's kernels and the CPU only batches the
    data (copies and integer indexing, which no vector width changes), so its kernel choice does not change the
    trained bits: a GPU checkpoint records none and a GPU resume compares none (audit52 T1)."""
    if device.type != "cpu":
        return None
    from reproduction.numerics import cpu_kernels

    return cpu_kernels()


def trained_world_sizes(manifest: dict[str, Any]) -> list[int]:
    """The world sizes of the invocations that trained a checkpoint's steps, oldest first (consecutive repeats
    merged); a manifest written before `world_sizes` was recorded gives its one `world_size`."""
    sizes = manifest.get("world_sizes")
    if isinstance(sizes, list) and sizes and all(isinstance(n, int) for n in sizes):
        return list(sizes)
    return [manifest["world_size"]] if isinstance(manifest.get("world_size"), int) else []


def _with_world(sizes: Sequence[int], world: int) -> list[int]:
    return [*sizes] if sizes and sizes[-1] == world else [*sizes, world]


def _in_force(kernels: str) -> str:
    """What decides the arithmetic in a `cpu_kernels` record: with both variables pinned the CPU's unit does not
    (pinning is what lets a run move between x86-64 servers; a CPU that computes the pinned kernels otherwise, as
    README's AVX-512 Intel Xeon does, is told by `portable check`'s host.cpu_numerics, not by its unit);
    `native` kernels, or one variable left to the CPU, follow the CPU, so its unit counts."""
    words = kernels.split()
    settings = [w for w in words if not w.startswith("cpu=")]
    from reproduction.numerics import PINNED

    pinned = all(any(w.startswith(f"{name}=") for w in settings) for name in PINNED)
    return " ".join(settings if pinned else words)


def check_kernels(folder: Path, manifest: dict[str, Any], kernels: str | None) -> None:
    """Raise CheckpointKernelsChangedError (exit 52) when the checkpoint in `folder` recorded other CPU kernels
    (`versions.cpu_kernels`) than `kernels`, this run's (`kernels_for`): the resumed steps would be computed
    otherwise than the saved ones, and the stage's one lineage record would be false for some of them. Nothing is
    compared for an accelerator run (`kernels` None) or a manifest without the field (written before it was
    recorded, or by an accelerator run): those resume as before."""
    versions = manifest.get("versions")
    saved = versions.get(KERNELS) if isinstance(versions, dict) else None
    if kernels is None or not isinstance(saved, str) or not saved.split() or _in_force(saved) == _in_force(kernels):
        return
    from reproduction.numerics import PINNED, SETTING

    settings = _in_force(saved)
    if settings.split() == [f"{k}={v}" for k, v in PINNED.items()]:
        back = f"{SETTING}=avx2 (the default: unset {SETTING})"
    elif settings.split()[:1] == ["native"]:
        back = f"{SETTING}=native"
        if kernels.split()[:1] == ["native"] and "cpu=" in settings:  # the same setting: native follows the CPU
            back += f" on a CPU with {settings.split('cpu=')[-1]}"
    else:  # the user's own values of the variables
        back = " ".join(w for w in settings.split() if not w.startswith("cpu="))
    stage = _stage_of(folder)
    redo = (
        f"pass --restart-stage {stage} to train it anew under these kernels"
        if stage
        else "start over in a new out_dir (resume=False) under these kernels"
    )
    raise CheckpointKernelsChangedError(
        f"{f'stage {stage}: ' if stage else ''}cannot resume {folder}: {KERNELS} changed since its steps were "
        f"computed: {saved!r} -> {kernels!r} (the CPU kernels change the trained bits)",
        path=folder,
        field=KERNELS,
        expected=saved,
        actual=kernels,
        hint=f"continue with {back}, or {redo}",
    )


def _stage_of(folder: Path) -> str | None:
    """The stage whose checkpoint `folder` is: the first folder under the run folder (the nearest one above holding
    run.json) on its path; None outside a run (the trainer called on its own)."""
    folder = Path(os.path.abspath(folder))
    for parent in folder.parents:
        if (parent / "run.json").is_file():
            return folder.relative_to(parent).parts[0]
    return None


# -- load ---------------------------------------------------------------------------------------


def read_manifest(folder: Path) -> dict[str, Any]:
    """The manifest of a complete checkpoint; CheckpointError when absent, torn or of another format."""
    path = Path(folder) / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(
            f"{folder} is not a complete checkpoint: {MANIFEST} is missing",
            path=folder,
            hint="resume from the newest complete step_N/ (incomplete ones end in .partial)",
        ) from None
    except ValueError as exc:  # not JSON, or not UTF-8 (a flipped bit): a damaged checkpoint, not a bug
        raise CheckpointError(
            f"{path} is not valid JSON: {exc}",
            path=path,
            hint="resume from another complete step_N/ or delete this one",
        ) from None
    if not isinstance(manifest, dict):
        raise CheckpointError(
            f"{path} is not a checkpoint manifest (a JSON {type(manifest).__name__}, not an object)",
            path=path,
            hint="resume from another complete step_N/ or delete this one",
        )
    if manifest.get("format") != FORMAT or manifest.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: format {manifest.get('format')!r} version {manifest.get('format_version')!r} is not "
            f"{FORMAT!r} version {FORMAT_VERSION}",
            path=path,
            hint="use the reproduction version that wrote it",
        )
    return manifest


def verify_files(folder: Path, manifest: dict[str, Any]) -> list[str]:
    """Every mismatch between the folder's files and the manifest (missing, size, digest)."""
    folder = Path(folder)
    problems, present = [], []
    for rel, entry in sorted(manifest["files"].items()):
        path = folder / rel
        if not path.is_file():
            problems.append(f"missing {rel}")
        elif path.stat().st_size != entry["size"]:
            problems.append(f"size {rel}: {path.stat().st_size} != {entry['size']}")
        else:
            present.append(path)
    for path, digest in sha256_files(present).items():
        rel = path.relative_to(folder).as_posix()
        if digest != manifest["files"][rel]["sha256"]:
            problems.append(f"digest {rel}")
    return problems


def setup_train(folder: Path) -> dict[str, Any] | None:
    """The train config the stage beside checkpoint `folder` (<out_dir>/checkpoints/step_N) records it trained with
    (`config_fields.recorded_train` of its out_dir: its setup's `stage.train`, else its export's train_config.json).
    None when neither says."""
    return recorded_train(Path(folder).parent.parent)


def load(
    folder: Path,
    model: torch.nn.Module,
    optim: torch.optim.Optimizer,
    *,
    resume_key: dict,
    accel=None,
    kernels: str | None = None,
    ran_with: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Load a checkpoint into the sharded `model` and `optim` (collective); returns its manifest.

    `ran_with`: the train config the checkpoint was saved under, where the caller knows it (else `setup_train`'s),
    read only for a field its manifest's resume key lacks (saved before the field was keyed).

    Raises CheckpointError when the files do not match the manifest or the config's resume key
    differs (naming the fields), CheckpointKernelsChangedError (exit 52) when `kernels` (this run's CPU
    kernels: `kernels_for`) differ from those its steps were computed with (`check_kernels`). DCP reshards when
    the world size changed; RNG states are restored only when it did not (the caller reseeds otherwise).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    folder = Path(folder)
    manifest = read_manifest(folder)
    problems = dist.broadcast_object(verify_files(folder, manifest) if dist.is_main() else None)
    if problems:
        raise CheckpointError(
            f"checkpoint {folder} does not match its manifest: {'; '.join(problems[:5])}"
            + (f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""),
            path=folder,
            problems=problems,
            hint="delete this step_N/ to resume from an older one",
        )
    from reproduction.train.config import TrainConfig  # here: config.py is the caller's, checkpoint.py the format's

    # a field the key gained after this checkpoint was written takes the value the stage's setup recorded, by the
    # one rule stage keys use too (config_fields.unrecorded_filled: audit56 review2 S1/S5); none at all stays a
    # change of every field
    saved_key = manifest.get("resume_key") or {}
    if saved_key:
        known = ran_with if ran_with is not None else setup_train(folder)
        saved_key, untold = unrecorded_filled(saved_key, resume_key, known, added=added_defaults(TrainConfig))
        if untold:
            raise CheckpointError(
                f"cannot resume {folder}: it was saved before {untold[0]} entered the resume key, and the value it "
                "was trained with cannot be told (no setup or export beside checkpoints/ records it)",
                path=folder,
                fields_changed=untold,
                hint="train it again from scratch: `portable run --restart-stage <stage>`, or resume=False",
            )
    changed = sorted(k for k in set(saved_key) | set(resume_key) if saved_key.get(k) != resume_key.get(k))
    if changed:
        diff = ", ".join(f"{k}: {saved_key.get(k)!r} -> {resume_key.get(k)!r}" for k in changed)
        raise CheckpointError(
            f"cannot resume {folder}: the config changed ({diff})",
            path=folder,
            fields_changed=changed,
            hint="restore those settings, or start over in a new out_dir (resume=False)",
        )
    check_kernels(folder, manifest, kernels)
    model_sd, optim_sd = get_state_dict(model, optim)
    state = {"model": model_sd, "optim": optim_sd}
    from torch.distributed.checkpoint.api import CheckpointException

    with noting_interrupts() as arrived:
        try:
            dcp.load(state, checkpoint_id=str(folder))
        except (Exception, CheckpointException) as exc:  # an interrupt while loading is an interrupt, as in `save`
            interrupt = interrupt_in(exc, arrived)
            if interrupt is not None:
                raise interrupt from None
            raise
    set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
    if manifest["world_size"] == dist.world_size():
        restore_rng(manifest["rng"][dist.rank()], accel)
    return manifest


def check_canary(expected: float, actual: float, *, rtol: float, folder: Path) -> None:
    """Raise CheckpointError when the canary loss after a load differs from the saved one."""
    if not np.isfinite(actual) or abs(actual - expected) > 1e-6 + rtol * abs(expected):
        raise CheckpointError(
            f"canary loss after loading {folder} is {actual!r}, the checkpoint recorded {expected!r} "
            f"(rtol {rtol}): the weights or the model code do not match what was saved",
            path=folder,
            expected=expected,
            actual=actual,
            hint="resume with the model code/config that wrote the checkpoint, or start over (resume=False)",
        )


# -- model-only export --------------------------------------------------------------------------


def export(model: torch.nn.Module, out: Path, *, model_config: dict, train_config: dict, extras=None) -> Path | None:
    """Write `out/` (model.safetensors + configs + task extras) atomically via `out.partial/`.

    Collective (gathers the full state dict); rank 0 writes and returns `out`, others return None.
    A disk that fills raises WriteFailedError (exit 8, the bytes needed) and leaves no `out.partial/`;
    the previous `out/`, if any, is untouched.
    """
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not dist.is_main():
        return None
    out = Path(out)
    tmp = out.with_name(out.name + ".partial")
    need, free = _state_bytes(full), free_bytes(out.parent)
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        save_file({k: v.contiguous() for k, v in full.items()}, str(tmp / "model.safetensors"))
        atomic_write_text(tmp / "model_config.json", json.dumps(model_config, indent=1, sort_keys=True))
        atomic_write_text(tmp / "train_config.json", json.dumps(train_config, indent=1, sort_keys=True))
        if extras is not None:
            extras(tmp)
    except Exception as exc:  # safetensors words ENOSPC in a SafetensorError, not an OSError
        shutil.rmtree(tmp, ignore_errors=True)
        if is_disk_full(exc):
            raise disk_full_error(f"the model export {out}", tmp, need=need, free=free, hint=_room(need)) from None
        if isinstance(exc, OSError):
            raise os_error(exc, f"the model export {out}") from None
        raise
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


def load_export(folder: Path) -> dict[str, torch.Tensor]:
    """The state dict of a model-only export; InputNotFound-style CheckpointError when absent."""
    from safetensors.torch import load_file

    path = Path(folder) / "model.safetensors"
    if not path.is_file():
        raise CheckpointError(
            f"{path} does not exist: not a model export",
            path=path,
            hint="point at the export/ folder a training run wrote",
        )
    return load_file(str(path))


def load_strict(model: torch.nn.Module, state: dict[str, torch.Tensor], *, source: str = "state dict") -> None:
    """`model.load_state_dict(state)` that names every missing/unexpected key (upstream used strict=False
    and silently trained from an untrained head when a path was wrong)."""
    expected = set(model.state_dict())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise CheckpointError(
            f"{source} does not fit the model: missing {missing[:8]}{'...' if len(missing) > 8 else ''}, "
            f"unexpected {unexpected[:8]}{'...' if len(unexpected) > 8 else ''}",
            missing=missing,
            unexpected=unexpected,
            hint="check the checkpoint path and the model preset",
        )
    model.load_state_dict(state, strict=True)
