"""The Hub model card (`README.md`) of a published bundle, generated from its manifest and evidence.

The card says what the bundle holds (folders, sizes, layers), how to fetch, restore, check and run
it pinned to a commit, a summary of the reference evidence under `evidence/` (scalar metrics of each
JSON file), and the licenses it carries. It is plain Markdown with a YAML header the Hub reads.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from reproduction.release.manifest import Manifest
from reproduction.ui import human_bytes

_MAX_EVIDENCE_FILES = 12
_MAX_METRICS = 10


def render_model_card(manifest: Manifest, bundle: Path, *, repo_id: str, repo_type: str = "model") -> str:
    """Markdown for `README.md`; reads only `evidence/*.json` and `LICENSES/` names from `bundle`."""
    license_id = str(manifest.metadata.get("license") or "other")
    type_flag = "" if repo_type == "model" else f" --repo-type {repo_type}"
    lines = [
        "---",
        f"license: {license_id}",
        "tags:",
        "- recap-portable",
        "- robotics",
        "- reinforcement-learning",
        "---",
        "",
        f"# {manifest.name}",
        "",
        str(manifest.metadata.get("description") or "A RECAP release bundle packed by recap-portable."),
        "",
        "## What this bundle holds",
        "",
        f"{len(manifest.files)} files, {human_bytes(manifest.total_size)} in all, each pinned by "
        "SHA-256 in `bundle.json`.",
        "",
        "| folder | files | size |",
        "|---|---:|---:|",
    ]
    lines += [f"| `{folder}` | {n} | {human_bytes(size)} |" for folder, (n, size) in _folders(manifest).items()]
    if manifest.layers:
        lines += ["", "Layers restored in order:", ""]
        lines += [f"{layer.order}. `{layer.archive}` ({layer.kind}) -> `{layer.target}/`" for layer in manifest.layers]
    lines += [
        "",
        "## Restore and run",
        "",
        "```bash",
        f"portable fetch {repo_id} BUNDLE{type_flag} --revision <commit>   # every file checked against its sha256",
        "python3 BUNDLE/reproduction/portable.py restore BUNDLE    # extract and relocate the runtimes",
        "python3 BUNDLE/reproduction/portable.py check BUNDLE      # accelerator and toolchain probes",
        "python3 BUNDLE/reproduction/portable.py run BUNDLE        # the four RECAP stages, resumable",
        "```",
        "",
        "`portable fetch` downloads exactly the files `bundle.json` lists, pinned to one commit, and writes",
        "`bundle.json` last; `portable verify BUNDLE` re-checks a copy at any time.",
    ]
    lines += _evidence_section(manifest, bundle)
    lines += _license_section(manifest)
    return "\n".join(lines) + "\n"


def _folders(manifest: Manifest) -> dict[str, tuple[int, int]]:
    acc: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for entry in manifest.files:
        folder = entry.path.split("/", 1)[0] + "/" if "/" in entry.path else "(top level)"
        acc[folder][0] += 1
        acc[folder][1] += entry.size
    return {k: (v[0], v[1]) for k, v in sorted(acc.items())}


def _scalars(data: Any) -> list[tuple[str, Any]]:
    source = data.get("metrics", data) if isinstance(data, dict) else {}
    if not isinstance(source, dict):
        return []
    return [(k, v) for k, v in source.items() if isinstance(v, (int, float, str, bool)) and len(str(v)) <= 40]


def _evidence_section(manifest: Manifest, bundle: Path) -> list[str]:
    files = [e for e in manifest.files if e.path.startswith("evidence/") and e.path.endswith(".json")]
    if not files:
        return []
    lines = ["", "## Evidence", "", "Reference results recorded when this bundle was published:", ""]
    for entry in files[:_MAX_EVIDENCE_FILES]:
        try:
            data = json.loads((bundle / entry.path).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            lines.append(f"- `{entry.path}` (not readable as JSON)")
            continue
        pairs = _scalars(data)[:_MAX_METRICS]
        summary = ", ".join(f"{k} = {v}" for k, v in pairs) or "no scalar metrics"
        lines.append(f"- `{entry.path}`: {summary}")
    if len(files) > _MAX_EVIDENCE_FILES:
        lines.append(f"- ... and {len(files) - _MAX_EVIDENCE_FILES} more under `evidence/`")
    return lines


def _license_section(manifest: Manifest) -> list[str]:
    names = [e.path for e in manifest.files if e.path.startswith("LICENSES/")]
    declared = manifest.metadata.get("licenses")
    if not names and not declared:
        return ["", "## Licenses", "", "No license files are bundled; see the upstream projects' terms."]
    lines = ["", "## Licenses", ""]
    if isinstance(declared, dict):
        lines += [f"- {component}: {lic}" for component, lic in declared.items()]
    lines += [f"- `{name}`" for name in names]
    return lines
