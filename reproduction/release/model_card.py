"""The Hub model card (`README.md`) of a published bundle, generated from its manifest and evidence.

The card says what the bundle holds (folders, sizes, layers), how to fetch, restore, check and run
it pinned to a commit, a summary of the reference evidence under `evidence/` (scalar metrics of each
JSON file), and the licenses it carries. It is plain Markdown with a YAML header the Hub reads.

The header's `model-index` holds the evaluation results of every recap-portable evidence file, one
result per policy and task, each metric with its counts and Wilson 95% interval in `args` (the Hub
shows `value`; n and the interval travel beside it), written as one JSON line (JSON is YAML).
run/card_evidence.py's `evidence_from_card` reads them back as evidence (no per-episode outcomes: comparisons
are unpaired), so `portable compare hub:OWNER/NAME ACTUAL.json` compares against what the Hub shows; it lives in
run/ so that release/ imports no pipeline package (docs/architecture.md).

No `.eval_results/*.yaml` is written: that Hub format (hub-docs docs/hub/eval-results.md) needs a registered
benchmark dataset and task id per value and has one model a repo, which simulator evaluations of several
policies do not have; README "Publish and fetch" says why.
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
    license_id = str(manifest.metadata.get("license") or _single_license_id(manifest, bundle) or "other")
    type_flag = "" if repo_type == "model" else f" --repo-type {repo_type}"
    lines = [
        "---",
        f"license: {license_id}",
        "tags:",
        "- recap-portable",
        "- robotics",
        "- reinforcement-learning",
        *_model_index_lines(manifest, bundle),
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
    lines += _weights_section(manifest)
    lines += _license_section(manifest, bundle)
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


def _license_index(bundle: Path) -> dict[str, Any]:
    try:
        data = json.loads((bundle / "LICENSES" / "index.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data.get("licenses", {}) if isinstance(data, dict) else {}


def _single_license_id(manifest: Manifest, bundle: Path) -> str | None:
    """The one license id every carried license file has (then the Hub header can name it), else None."""
    declared = manifest.metadata.get("licenses")
    index = _license_index(bundle)
    if not isinstance(declared, dict) or not declared:
        return None
    ids = {index.get(str(f).removeprefix("LICENSES/"), {}).get("id") for f in declared.values()}
    return ids.pop() if len(ids) == 1 and None not in ids else None


def _weights_section(manifest: Manifest) -> list[str]:
    items = manifest.metadata.get("weights")
    if not isinstance(items, list) or not items:
        return []
    lines = [
        "",
        "## Pinned weights",
        "",
        "Each weights file is checked against its manifest (upstream repo, commit, sha256) by `portable restore`:",
        "",
    ]
    lines += [f"- `{i.get('manifest')}` -> `{i.get('dest', 'weights')}/`" for i in items if isinstance(i, dict)]
    return lines


def _license_section(manifest: Manifest, bundle: Path) -> list[str]:
    """Every license the bundle carries, per component, with what a gated one asks the user to accept."""
    names = [e.path for e in manifest.files if e.path.startswith("LICENSES/") and e.path != "LICENSES/index.json"]
    declared = manifest.metadata.get("licenses")
    if not names and not declared:
        return ["", "## Licenses", "", "No license files are bundled; see the upstream projects' terms."]
    index = _license_index(bundle)
    lines = ["", "## Licenses", ""]
    if isinstance(declared, dict) and declared:
        lines += ["| component | license | file |", "|---|---|---|"]
        for component, file in declared.items():
            entry = index.get(str(file).removeprefix("LICENSES/"), {})
            name = entry.get("name", "see the file") + (" (**gated**)" if entry.get("gated") else "")
            lines.append(f"| {component} | {name} | `{file}` |")
        gated = {
            f: index[f]
            for f in (str(v).removeprefix("LICENSES/") for v in declared.values())
            if index.get(f, {}).get("gated")
        }
        for file, entry in sorted(gated.items()):
            lines += ["", f"**{entry.get('name', file)} is gated.** {entry.get('accept', '')}".rstrip()]
            if entry.get("url"):
                lines.append(f"The terms: {entry['url']} (notice: `LICENSES/{file}`).")
        lines.append("")
    lines += [f"- `{name}`" for name in names]
    return lines


_COUNT_METRICS = ("success_once", "success_at_end")


def _evaluations(manifest: Manifest, bundle: Path) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for entry in manifest.files:
        if entry.path.startswith("evidence/") and entry.path.endswith(".json"):
            try:
                data = json.loads((bundle / entry.path).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(data, dict) and data.get("format") == "recap-portable-evaluation":
                out.append((entry.path, data))
    return out


def model_index(name: str, evaluations: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The Hub's `model-index` of recap-portable evaluation evidence: one result per (policy, task)."""
    results = []
    for path, doc in evaluations:
        for entry in [doc, *doc.get("baselines", [])]:
            policy = entry["policy"]
            for task, row in entry.get("tasks", {}).items():
                metrics = []
                for m in _COUNT_METRICS:
                    c = row.get(m)
                    if not isinstance(c, dict) or "rate" not in c:
                        continue
                    args = {"successes": c["successes"], "episodes": c["episodes"]}
                    if "wilson95" in c:
                        args["wilson95"] = c["wilson95"]
                    metrics.append({"type": m, "name": f"{m} ({policy['label']})", "value": c["rate"], "args": args})
                results.append(
                    {
                        "task": {"type": "robotics", "name": str(policy["label"])},
                        "dataset": {"type": "simulation", "name": str(task)},
                        "metrics": metrics,
                        "source": {
                            "name": f"recap-portable evidence {path}",
                            "url": path,
                        },
                        "policy": {k: policy.get(k) for k in ("label", "mode", "guidance_scale")},
                        "evidence": {"name": doc.get("name"), "seeds": doc.get("seeds", {})},
                    }
                )
    return [{"name": name, "results": results}] if results else []


def _model_index_lines(manifest: Manifest, bundle: Path) -> list[str]:
    index = model_index(manifest.name, _evaluations(manifest, bundle))
    return [f"model-index: {json.dumps(index, sort_keys=True)}"] if index else []


def card_model_index(text: str) -> list[dict[str, Any]]:
    """The `model-index` of a card's YAML header ([] when it has none): our one JSON line, else PyYAML."""
    import re

    header = re.match(r"---\s*\n(.*?)\n---", text, re.S)
    if not header:
        return []
    line = re.search(r"^model-index:\s*(\[.*\])\s*$", header.group(1), re.M)
    if line:
        try:
            return list(json.loads(line.group(1)))
        except ValueError:
            pass
    try:
        import yaml
    except ImportError:
        return []
    try:
        data = yaml.safe_load(header.group(1)) or {}
    except yaml.YAMLError:
        return []
    return list(data.get("model-index") or []) if isinstance(data, dict) else []
