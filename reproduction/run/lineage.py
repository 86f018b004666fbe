"""Lineage: one in-toto Statement v1 (SLSA provenance v1 predicate) per stage run, written as the run goes.

On disk::

    <run>/lineage/<stage>.intoto.json    the statement of the stage run that wrote the stage's current outputs

A statement's `subject` lists the stage's outputs, `resolvedDependencies` the bytes it read (bundle
manifest, runtime and source layers, datasets, upstream outputs, the checkpoint it resumed from), each
as a ResourceDescriptor with `digest.sha256`. A folder (a dataset, a checkpoint) is pinned by its
tree digest: sha256 over the sorted lines "<relative path>\\0<file sha256>\\n" of its files, which
can also be recomputed from `bundle.json`'s entries, so a dataset links to the bundle manifest by
digests alone. `annotations.root` says where `annotations.path` is relative to: "run" (the run folder,
so a moved run still verifies), "bundle" (the bundle folder, `externalParameters.bundle`) or "file"
(an absolute path, the `uri`).

This module records; reproduction/run/lineage_check.py reads the statements back, walks the chain
and verifies it. Stdlib only: the control plane's `portable lineage` imports both.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from reproduction.digest_cache import DigestCache, tree_files, tree_lines
from reproduction.digests import sha256_file, sha256_files
from reproduction.errors import InvalidInputError
from reproduction.fsio import atomic_write_text
from reproduction.numerics import cpu_kernels
from reproduction.redaction import redact, redact_argv, redact_text, secret_values

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "urn:recap-portable:buildtype:stage:v1"
BUILDER_ID = "urn:recap-portable:builder:portable-run"
LINEAGE_DIR = "lineage"
SUFFIX = ".intoto.json"
ROLES = (
    "bundle_manifest",
    "runtime_layer",
    "source",
    "dataset",
    "weights",
    "config",
    "upstream_output",
    "checkpoint",
    "input_file",
    "other",
)
STATUSES = ("succeeded", "failed", "cancelled")
TREE_LISTED = 64
"""A folder of at most this many files lists them in its annotations."""


# -- digests ------------------------------------------------------------------------------------


def tree_digests(root: Path) -> dict[str, str]:
    """{relative posix path: sha256} of every file under a folder, hashed in parallel threads."""
    root = Path(root)
    return {p.relative_to(root).as_posix(): d for p, d in sha256_files(tree_files(root)).items()}


def tree_sha256(root: Path, digests: Mapping[str, str] | None = None) -> str:
    """Tree digest of a folder (see the module docstring), from `digests` when the caller has them."""
    return hashlib.sha256(tree_lines(tree_digests(root) if digests is None else digests)).hexdigest()


def tree_changes(recorded: Mapping[str, str], current: Mapping[str, str]) -> list[str]:
    """What differs between two {path: sha256} listings: "changed: a", "missing: b", "added: c", sorted by path."""
    out = []
    for rel in sorted(set(recorded) | set(current)):
        if rel not in current:
            out.append(f"missing: {rel}")
        elif rel not in recorded:
            out.append(f"added: {rel}")
        elif recorded[rel] != current[rel]:
            out.append(f"changed: {rel}")
    return out


def path_sha256(path: Path) -> tuple[str, str]:
    """(sha256, kind) of a file ("file") or a folder ("tree"); raises FileNotFoundError when absent."""
    path = Path(path)
    if path.is_dir():
        return tree_sha256(path), "tree"
    if path.is_file():
        return sha256_file(path), "file"
    raise FileNotFoundError(path)


def manifest_tree_sha256(manifest: Mapping[str, Any], prefix: str) -> str | None:
    """The tree digest of bundle folder `prefix` computed from bundle.json's file entries; None if none listed."""
    prefix = prefix.rstrip("/") + "/"
    entries = {
        f["path"][len(prefix) :]: f["sha256"] for f in manifest.get("files", []) if f.get("path", "").startswith(prefix)
    }
    return hashlib.sha256(tree_lines(entries)).hexdigest() if entries else None


# -- recording ----------------------------------------------------------------------------------


@dataclass(kw_only=True, slots=True, frozen=True)
class Artifact:
    """A file or folder a stage read or wrote."""

    path: Path
    """The file or folder (absolute, or relative to the current directory)."""
    role: str = "upstream_output"
    """For inputs, one of ROLES; ignored for outputs."""
    sha256: str | None = None
    """A digest already computed by the caller (file digest, or tree digest for a folder); hashed when None."""
    kind: str | None = None
    """"file" or "tree" for a pre-computed digest of a path that may be gone (a pruned checkpoint); None: told
    from the path."""

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"Artifact.role {self.role!r} is not one of {', '.join(ROLES)}")


@dataclass(kw_only=True, slots=True)
class StageRun:
    """Everything one stage run's statement records; the runner fills it from what the stage returned."""

    stage: str
    """Stage name: returns, value, advantages, policy, eval (or a toy recipe's names)."""
    run_id: str
    """The run's id (runDetails.metadata.invocationId)."""
    run_dir: Path
    """The run folder; the statement goes to <run_dir>/lineage/<stage>.intoto.json."""
    outputs: Sequence[Path | Artifact]
    """The files and folders the stage wrote (at least one: a failed stage names its log)."""
    inputs: Sequence[Artifact]
    """What it read: bundle manifest, runtime layers, source, datasets, upstream outputs, weights."""
    argv: Sequence[str]
    """The command line (redacted before writing)."""
    config: Mapping[str, Any]
    """The resolved config (redacted before writing)."""
    world_size: int
    """Number of workers (ranks)."""
    device: str
    """Device kind the workers used: cpu, cuda, npu."""
    started_on: datetime | float
    """Start time (aware datetime or Unix seconds)."""
    finished_on: datetime | float
    """End time."""
    status: str = "succeeded"
    """One of STATUSES."""
    resumed_from: Artifact | None = None
    """The checkpoint the stage continued from (also recorded as a dependency with role "checkpoint")."""
    bundle_dir: Path | None = None
    """The restored bundle the run reads from; inputs inside it are recorded relative to it."""
    versions: Mapping[str, str | None] | None = None
    """torch / CUDA / CANN / driver / python versions; collected with `runtime_versions()` when None."""
    environ: Mapping[str, str] | None = field(default=None, repr=False)
    """The environment whose credential-named variables are redacted (default: os.environ)."""
    cache: DigestCache | None = field(default=None, repr=False)
    """The run's digest cache (reproduction/digest_cache.py): a file the run hashed already is not hashed again."""
    target_step: int | None = None
    """The --target-step the stage trained to (`externalParameters.target_step`), explicit or inherited by a plain
    --resume whose argv does not say it (audit55 G1); None: no such key is written."""


def runtime_versions() -> dict[str, str | None]:
    """Versions the results may depend on: python, recap-portable, torch and its CUDA, torch_npu, CANN, driver, the
    CPU kernels and OMP_NUM_THREADS (None where unset).

    Imports neither torch (its CUDA version is read from torch/version.py unless torch is loaded already)
    nor torch_npu (it patches torch on import); the driver and CANN are read by `portable check`'s probes
    (reproduction/checks/: nvidia-smi with a 5 s bound, the CANN toolkit's version files).
    """
    out: dict[str, str | None] = {"python": platform.python_version(), "platform": platform.platform()}
    for dist in ("recap-portable", "torch", "torch_npu", "numpy"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    out["cuda"] = _torch_cuda() if out["torch"] is not None else None
    out["cann"] = _cann_version()
    out["driver"] = _nvidia_driver()
    out["cpu_kernels"] = cpu_kernels()  # CPU results depend on the kernels' instruction set (reproduction.numerics)
    # A trainer whose `cpu_threads` is 0 runs as many intra-op threads as OMP_NUM_THREADS says (torch's own default
    # where it is unset), and a reduction split over another count of threads rounds otherwise: the same run resumed
    # under another value ends with other bytes (audit52 T2), so the record names the value each invocation saw.
    out["omp_num_threads"] = os.environ.get("OMP_NUM_THREADS")
    return out


def _torch_cuda() -> str | None:
    """torch.version.cuda, read from torch/version.py unless torch is already imported (importing costs seconds)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return getattr(getattr(torch, "version", None), "cuda", None)
    spec = importlib.util.find_spec("torch")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        try:
            text = (Path(folder) / "version.py").read_text(encoding="utf-8")
        except OSError:
            continue
        for line in text.splitlines():
            name, sep, value = line.partition("=")
            if sep and name.split(":")[0].strip() == "cuda":
                value = value.strip().strip("'\"")
                return None if value == "None" else value
    return None


def _cann_version() -> str | None:
    """The CANN toolkit's version as `portable check` finds it (checks/accelerator_ascend.py), or None."""
    from reproduction.checks.accelerator_ascend import find_cann
    from reproduction.checks.context import CheckContext

    cann = find_cann(CheckContext.live())
    return (cann.version or None) if cann is not None else None


def _nvidia_driver() -> str | None:
    """The NVIDIA driver as `portable check` reads it (checks/accelerator_cuda.py; nvidia-smi, 5 s bound), or None."""
    from reproduction.checks.accelerator_cuda import driver_version
    from reproduction.checks.context import CheckContext

    return driver_version(CheckContext.live(), timeout=5.0)


def _timestamp(value: datetime | float) -> str:
    when = value if isinstance(value, datetime) else datetime.fromtimestamp(float(value), tz=timezone.utc)
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _locate(path: Path, run_dir: Path, bundle_dir: Path | None) -> tuple[str, str]:
    """(root, path relative to it): "run", "bundle" or "file" (absolute)."""
    path = Path(os.path.abspath(path))
    for root, base in (("run", run_dir), ("bundle", bundle_dir)):
        if base is None:
            continue
        base = Path(os.path.abspath(base))
        if path == base or base in path.parents:
            return root, path.relative_to(base).as_posix() or "."
    return "file", str(path)


def _descriptor(item: Path | Artifact, run: StageRun, *, role: str | None) -> dict[str, Any]:
    artifact = item if isinstance(item, Artifact) else Artifact(path=Path(item))
    path = Path(artifact.path)
    files = None
    if artifact.sha256 is not None:
        digest, kind = artifact.sha256, artifact.kind or ("tree" if path.is_dir() else "file")
    else:
        digest, kind, files = (run.cache or DigestCache()).path(path)
    root, rel = _locate(path, Path(run.run_dir), run.bundle_dir)
    annotations: dict[str, Any] = {"kind": kind, "root": root, "path": rel}
    if files is not None and len(files) <= TREE_LISTED and root != "bundle":
        # Small folders (checkpoints, exports) list their files so --verify can name the one that changed;
        # a bundle folder's files are already listed in bundle.json.
        annotations["files"] = files
    if role is not None:
        annotations["role"] = role
    return {
        "name": rel,
        "uri": Path(os.path.abspath(path)).as_uri(),
        "digest": {"sha256": digest},
        "annotations": annotations,
    }


def bundle_inputs(bundle_dir: Path) -> list[Artifact]:
    """The bundle manifest and its runtime and source layer archives, as inputs every stage of a run read.

    Layer digests come from bundle.json (restore verified them; `lineage --verify` rehashes), so a
    multi-GB runtime is not hashed again per stage. [] when `bundle_dir` holds no bundle.json;
    InvalidInputError when bundle.json is not JSON.
    """
    manifest_path = Path(bundle_dir) / "bundle.json"
    if not manifest_path.is_file():
        return []
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InvalidInputError(f"{manifest_path} is not readable JSON: {exc}", path=manifest_path) from exc
    pinned = {f.get("path"): f.get("sha256") for f in manifest.get("files", []) if isinstance(f, dict)}
    out = [Artifact(path=manifest_path, role="bundle_manifest")]
    layers = sorted(manifest.get("layers", []), key=lambda layer: layer.get("order", 0))
    for layer in layers:
        archive, kind = layer.get("archive"), layer.get("kind")
        if archive in pinned and kind in ("runtime", "source") and (Path(bundle_dir) / archive).is_file():
            role = "runtime_layer" if kind == "runtime" else "source"
            out.append(Artifact(path=Path(bundle_dir) / archive, role=role, sha256=pinned[archive]))
    return out


def build_statement(run: StageRun) -> dict[str, Any]:
    """The in-toto Statement (a JSON-ready dict) for one stage run; hashes every output and input not pre-hashed.

    Raises ValueError for an unknown status or no outputs, FileNotFoundError for an output or input that
    does not exist. Command line, config, device, versions and environment-derived strings are redacted.
    """
    if run.status not in STATUSES:
        raise ValueError(f"StageRun.status {run.status!r} is not one of {', '.join(STATUSES)}")
    if not run.outputs:
        raise ValueError(f"stage {run.stage!r}: a statement needs at least one output (a failed stage names its log)")
    subjects = []
    for item in run.outputs:
        d = _descriptor(item, run, role=None)
        subjects.append({"name": d["name"], "digest": d["digest"], "annotations": d["annotations"]})
    inputs = list(run.inputs)
    if run.resumed_from is not None:
        r = run.resumed_from
        inputs.append(Artifact(path=r.path, role="checkpoint", sha256=r.sha256, kind=r.kind))
    dependencies = [_descriptor(a, run, role=a.role) for a in inputs]
    resumed = None
    if run.resumed_from is not None:
        resumed = {k: dependencies[-1][k] for k in ("name", "uri", "digest")}
    secrets = secret_values(run.environ)
    external = {
        "stage": run.stage,
        "argv": redact_argv(list(run.argv), secrets=secrets),
        "config": redact(dict(run.config), secrets=secrets),
        "bundle": str(Path(os.path.abspath(run.bundle_dir))) if run.bundle_dir else None,
    }
    if run.target_step is not None:  # absent otherwise: statements of runs without a target keep their bytes
        external["target_step"] = int(run.target_step)
    # Redacted as run.json's copy is (a version string is environment-derived): a statement written again from run.json
    # (runner._rewrite_lost_statement) then has the same bytes.
    versions = redact(dict(run.versions) if run.versions is not None else runtime_versions(), secrets=secrets)
    return {
        "_type": STATEMENT_TYPE,
        "subject": subjects,
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": external,
                "internalParameters": {
                    "world_size": int(run.world_size),
                    "device": redact_text(str(run.device), secrets=secrets) if run.device is not None else None,
                    "versions": versions,
                    "status": run.status,
                    "resumed_from": resumed,
                },
                "resolvedDependencies": dependencies,
            },
            "runDetails": {
                "builder": {"id": BUILDER_ID, "version": {"recap-portable": versions.get("recap-portable") or "dev"}},
                "metadata": {
                    "invocationId": run.run_id,
                    "startedOn": _timestamp(run.started_on),
                    "finishedOn": _timestamp(run.finished_on),
                },
            },
        },
    }


def statement_path(run_dir: Path, stage: str) -> Path:
    return Path(run_dir) / LINEAGE_DIR / f"{stage}{SUFFIX}"


def write_stage_statement(run: StageRun) -> Path:
    """Build the statement and write it atomically to <run_dir>/lineage/<stage>.intoto.json (replacing an older one)."""
    statement = build_statement(run)
    path = statement_path(run.run_dir, run.stage)
    atomic_write_text(path, json.dumps(statement, indent=1, sort_keys=False, default=str) + "\n")
    return path
