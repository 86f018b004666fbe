"""The seam between the runner and the lineage writer: one StageRecord in, one in-toto Statement out.

The runner calls `make_recorder(...)` once per run; it returns None when the lineage module
(reproduction/run/lineage.py) is not installed, so the runner works without it. Each stage's
statement lists its outputs (with the digests run.json holds), the datasets it read, the upstream
outputs, the bundle manifest with its runtime and source layers, and the checkpoint it continued from.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


def make_recorder(bundle: Path | None) -> Callable[[Any], None] | None:
    """A recorder writing <run>/lineage/<stage>.intoto.json per stage, or None without the lineage module."""
    try:
        from reproduction.run import lineage
    except ImportError:
        return None
    if not hasattr(lineage, "write_stage_statement"):
        return None
    cache = lineage.DigestCache() if hasattr(lineage, "DigestCache") else None

    def record(rec: Any) -> None:
        A = lineage.Artifact
        # The bundle manifest and its runtime/source layer archives (digests from bundle.json, which restore
        # verified): every stage ran that code on that runtime.
        inputs = list(lineage.bundle_inputs(Path(bundle))) if bundle is not None else []
        for item in rec.inputs.values():
            root = getattr(item, "root", None)
            if root is not None:
                inputs.append(A(path=Path(root), role="dataset"))
        for rel, sha in rec.upstream_files.items():
            inputs.append(A(path=rec.run_dir / rel, role="upstream_output", sha256=sha))
        for path, sha in getattr(rec, "input_files", {}).items():  # files a stage reads by path (a reference)
            inputs.append(A(path=Path(path), role="input_file", sha256=sha))
        resumed = None
        if rec.resumed_from_path is not None and Path(rec.resumed_from_path).exists():
            resumed = A(path=Path(rec.resumed_from_path), role="checkpoint")
        outputs = [A(path=rec.run_dir / rel, sha256=sha) for rel, sha in rec.subjects.items()]
        lineage.write_stage_statement(
            lineage.StageRun(
                stage=rec.stage,
                run_id=rec.run_id,
                run_dir=rec.run_dir,
                outputs=outputs,
                inputs=inputs,
                argv=rec.argv,
                config=rec.config,
                world_size=rec.world_size,
                device=rec.device,
                started_on=rec.started,
                finished_on=rec.ended,
                status="succeeded",
                resumed_from=resumed,
                bundle_dir=Path(bundle) if bundle is not None else None,
                cache=cache,
            )
        )

    return record
