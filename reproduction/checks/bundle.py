"""Bundle probes: BUNDLE is a bundle, it is restored where it now lives, and its run fits on the disk.

"Restored" is read from the receipt (`<bundle>/.portable/receipt.json`, reproduction/release/receipt.py,
imported lazily): every layer of the manifest must be recorded with the archive digest the manifest
pins, and (for layers whose files hold a build prefix) relocated to the layer's current path.
Free disk needed for a run: the manifest's `metadata.run_disk_bytes` when the bundle declares it,
else twice the size of weights/ (checkpoints of each stage) plus 1 GiB (datasets' sidecars, logs,
evidence).
A value export the bundle carries or its run configs name is read with the one reader stage 3 uses
(reproduction/value_export.py: format version, return range, bins), so a bad one fails here, before a run.
"""

from __future__ import annotations

import importlib
import os
import shutil
from pathlib import Path
from typing import Any

from reproduction.checks.probe import BUNDLE, ProbeResult, fail, ok, warn
from reproduction.errors import PortableError

GIB = 1024**3


def bundle_interpreter(bundle: Path, manifest: Any) -> Path | None:
    """The restored runtime's interpreter: bin/python3 (else bin/python) of the last runtime layer that has one."""
    for layer in reversed([layer for layer in manifest.layers if layer.kind == "runtime"]):
        for name in ("python3", "python"):
            candidate = Path(bundle) / layer.target / "bin" / name
            if candidate.exists():
                return candidate
    return None


def load_bundle(bundle: Path) -> tuple[Any | None, ProbeResult]:
    """(manifest or None, the `bundle` row)."""
    from reproduction.release.manifest import load_manifest

    if not Path(bundle).is_dir():
        return None, fail(
            "bundle", BUNDLE, f"{bundle} is not a folder", "pass the bundle folder (the one holding bundle.json)"
        )
    try:
        manifest = load_manifest(Path(bundle))
    except PortableError as exc:
        return None, fail(
            "bundle",
            BUNDLE,
            f"{bundle} is not a usable bundle: {exc.message}",
            exc.hint or "fetch or pack the bundle again",
            path=str(bundle),
        )
    return manifest, ok(
        "bundle",
        f"{manifest.name}: {len(manifest.files)} files, {len(manifest.layers)} layers, "
        f"format {manifest.format_version}",
        name=manifest.name,
        path=str(Path(bundle).resolve()),
    )


def probe_restored(bundle: Path, manifest: Any) -> ProbeResult:
    """The `bundle.restore` row: every layer recorded in the receipt, with the pinned digest, at this path."""
    if not manifest.layers:
        return ok("bundle.restore", "no layers to restore (the bundle runs with the current interpreter)")
    fix = f"portable restore {bundle}"
    try:
        # Looked up lazily (restore owns the format); a runner without it still checks everything else.
        receipt_mod = importlib.import_module("reproduction.release.receipt")
    except ImportError as exc:
        return warn(
            "bundle.restore", f"cannot read restore receipts in this version ({exc})", f"run `{fix}` to be sure"
        )
    path = receipt_mod.receipt_path(bundle)
    if not path.is_file():
        return fail("bundle.restore", BUNDLE, f"not restored: no receipt at {path}", f"run `{fix}`")
    receipt = receipt_mod.load_receipt(bundle)
    problems = []
    for layer in manifest.layers:
        entry = manifest.file(layer.archive)
        got = receipt.layers.get(layer.archive)
        here = str((Path(bundle) / layer.target).resolve())
        if got is None:
            problems.append(f"{layer.archive} not restored")
        elif entry is not None and got.sha256 != entry.sha256:
            problems.append(
                f"{layer.archive} restored from another archive (sha256 {got.sha256[:12]}..., "
                f"manifest {entry.sha256[:12]}...)"
            )
        elif _needs_relocation(layer) and os.path.realpath(got.prefix) != here:
            problems.append(
                f"{layer.target} was relocated to {got.prefix}, the bundle is now at {Path(bundle).resolve()}"
            )
        elif not (Path(bundle) / layer.target).is_dir():
            problems.append(f"{layer.target} is missing")
    if problems:
        return fail(
            "bundle.restore", BUNDLE, "restore incomplete: " + "; ".join(problems), f"run `{fix}`", problems=problems
        )
    return ok("bundle.restore", f"{len(manifest.layers)} layers restored and relocated here", receipt=str(path))


def _needs_relocation(layer: Any) -> bool:
    # Same rule as restore: only layers whose files hold a build prefix care where they live.
    return bool(getattr(layer, "prefix_files", ()) or getattr(layer, "foreign_prefix_files", None))


def run_disk_need(bundle: Path, manifest: Any) -> tuple[int, str]:
    """(bytes a run needs, how it was computed)."""
    declared = manifest.metadata.get("run_disk_bytes")
    if isinstance(declared, int) and declared >= 0:
        return declared, "metadata.run_disk_bytes"
    weights = sum(e.size for e in manifest.files if e.path.startswith("weights/"))
    return 2 * weights + GIB, f"2 x weights ({weights / GIB:.1f} GiB) + 1 GiB"


def probe_disk(bundle: Path, manifest: Any, work_dir: Path) -> ProbeResult:
    """The `bundle.disk` row: free space where runs/ will be written against what the run needs."""
    need, how = run_disk_need(bundle, manifest)
    where = Path(work_dir)
    while not where.exists() and where != where.parent:
        where = where.parent
    free = shutil.disk_usage(where).free
    details = {"need": need, "free": free, "path": str(work_dir), "rule": how}
    if free < need:
        return fail(
            "bundle.disk",
            BUNDLE,
            f"{free / GIB:.1f} GiB free at {work_dir}, the run needs {need / GIB:.1f} GiB ({how})",
            "free space or run from a folder on a bigger disk",
            **details,
        )
    return ok(
        "bundle.disk", f"{free / GIB:.1f} GiB free at {work_dir} >= {need / GIB:.1f} GiB needed ({how})", **details
    )


# -- value exports --------------------------------------------------------------------------------


def value_exports(bundle: Path, manifest: Any) -> dict[Path, str]:
    """{value export folder (or value-stage folder): what names it} for every value export the bundle
    carries or its run configs name: a value_head.json listed in bundle.json, and any config string
    (with ${BUNDLE} replaced; relative paths are under the bundle) naming a value_head.json, a folder
    holding one, or a value-stage folder (crossfit.json + model_<k>/export/)."""
    from reproduction.checks import configs
    from reproduction.value_export import HEAD_NAME

    bundle = Path(bundle)
    found: dict[Path, str] = {}
    for entry in manifest.files:
        if Path(entry.path).name == HEAD_NAME:
            found.setdefault(bundle / Path(entry.path).parent, f"bundle.json: {entry.path}")
    for path in configs.config_files(bundle):
        data, _ = configs.load_config(path)
        for key, text in _strings(data or {}):
            if "${" in text.replace("${BUNDLE}", ""):
                continue
            target = Path(text.replace("${BUNDLE}", str(bundle)))
            target = target if target.is_absolute() else bundle / target
            try:
                if target.name == HEAD_NAME and target.is_file():
                    target = target.parent
                elif not ((target / HEAD_NAME).is_file() or (target / "crossfit.json").is_file()):
                    continue
            except OSError:  # a string that is no path (too long, bad bytes)
                continue
            found.setdefault(target, f"{path.relative_to(bundle)}: {key}")
    return found


def _strings(node: Any, prefix: str = "") -> list[tuple[str, str]]:
    """(dotted key, value) of every string leaf of a parsed config."""
    if isinstance(node, dict):
        return [kv for k, v in node.items() for kv in _strings(v, f"{prefix}{k}.")]
    if isinstance(node, list):
        return [kv for i, v in enumerate(node) for kv in _strings(v, f"{prefix[:-1]}[{i}].")]
    return [(prefix[:-1], node)] if isinstance(node, str) and node else []


def probe_value_exports(bundle: Path, manifest: Any) -> list[ProbeResult]:
    """The `bundle.value_export` row: every value export the bundle carries or its configs name, read with
    the one reader stage 3 uses (format version, return range, bins); no row when there is none."""
    from reproduction.value_export import read_value_head, read_value_stage_head

    exports = value_exports(bundle, manifest)
    if not exports:
        return []
    good, bad = [], []
    for folder, named in sorted(exports.items()):
        try:
            is_stage = (folder / "crossfit.json").is_file()
            head = read_value_stage_head(folder) if is_stage else read_value_head(folder)
        except PortableError as exc:
            bad.append((named, exc))
            continue
        rr = head.return_range
        good.append(f"{named} ({head.num_bins} bins, returns [{rr.return_min:g}, {rr.return_max:g}])")
    if bad:
        named, exc = bad[0]
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        return [
            fail(
                "bundle.value_export",
                BUNDLE,
                f"value export named by {named}: {exc.message}{more}",
                exc.hint or "export the value model again with this version (stage 2 writes value_head.json)",
                problems=[f"{n}: {e.message}" for n, e in bad],
                field=getattr(exc, "field", None),
            )
        ]
    return [ok("bundle.value_export", f"{len(good)} value export(s) valid: " + "; ".join(good), exports=good)]
