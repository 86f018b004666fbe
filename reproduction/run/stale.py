"""Which complete stages of a run hold results older than their upstream stages' outputs, read from run.json alone.

The one home of that rule: the runner's headline, the reports and `lineage --verify` (which imports only the
standard library and recap-portable's own light modules) all ask it here. A stage's record pins each upstream
stage's outputs by `outputs_digest` in `key_parts.upstream`; when the upstream stage's recorded outputs no longer
digest to that value (`--target-step N --stages policy` moved the policy on), the stage and every stage after it
are stale until a `--resume` redoes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reproduction.digests import json_sha256


def outputs_digest(recorded: Mapping[str, Any]) -> str:
    """The digest a downstream stage's key pins of a stage's recorded outputs ({rel: [size, mtime_ns, sha256]}):
    their paths and contents, not their times."""
    return json_sha256({rel: v[2] for rel, v in recorded.items()})


def stale_stages(state: Mapping[str, Any]) -> dict[str, str]:
    """run.json's complete stages whose results predate their upstream stages' outputs:
    {stage: the upstream stage whose outputs changed since it ran, directly or through another stale stage}. After
    `--target-step N --stages policy` (or a raised step count with --stages) eval and compare still hold the
    results of the earlier policy until a --resume redoes them; the headline and the report say so instead of
    showing those results as the run's. A record too damaged to digest counts as unchanged (lineage --verify
    reads run.json as it finds it)."""
    stages = {n: r for n, r in (state.get("stages") or {}).items() if isinstance(r, dict)}
    stale: dict[str, str] = {}
    changed = True
    while changed:
        changed = False
        for name, rec in stages.items():
            if name in stale or rec.get("status") != "complete":
                continue
            upstream = (rec.get("key_parts") or {}).get("upstream") or {}
            for need, recorded in upstream.items() if isinstance(upstream, dict) else ():
                up = stages.get(need, {})
                try:
                    moved = isinstance(up.get("outputs"), dict) and outputs_digest(up["outputs"]) != recorded
                except (TypeError, IndexError, KeyError):
                    moved = False
                if need in stale:
                    stale[name] = stale[need]
                elif moved:
                    stale[name] = need
                else:
                    continue
                changed = True
                break
    return stale
