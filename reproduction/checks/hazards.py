"""Hazard probes: known ways a run crashes hours in, or quietly goes wrong, found before it starts.

Fail (exit 23): TensorFlow older than 2.18 (or of unknown version) importable next to NumPy >= 2;
`transfer_to_npu` in the bundle's sources or configs; torch-npu installed without a CANN toolkit;
`/path/to/` placeholders in configs; save_interval not a multiple of val_check_interval; a global
batch that does not divide into micro batches across workers (RLinf's keys, and recap-portable's own in any section:
`policy.train.save_interval`/`eval_interval`, `rl.save_every`/`eval_every`, `value.train.global_batch`/
`micro_batch`/`world_size`). Warn: TensorFlow >= 2.18 next to
NumPy 2 (it imports, but transfer_to_npu's module walk still loads it); Hub access configured
(HF_HUB_OFFLINE unset) while the bundle carries its datasets.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from reproduction.checks import configs
from reproduction.checks.accelerator_ascend import find_cann
from reproduction.checks.context import CheckContext, version_tuple
from reproduction.checks.probe import HAZARD, ProbeResult, fail, ok, skip, warn

TF_NUMPY2 = (2, 18)
"""First TensorFlow release built against NumPy 2."""
SCAN_SUFFIXES = {".py", ".yaml", ".yml", ".toml", ".json", ".sh", ".cfg", ".ini"}
SCAN_MAX_BYTES = 4 * 1024 * 1024
PLACEHOLDER = re.compile(r"/path/to/", re.IGNORECASE)
_SHOWN = 5


def probe_hazards(ctx: CheckContext, manifest: Any | None) -> list[ProbeResult]:
    """All hazard rows; bundle-based ones are skipped without a bundle."""
    if ctx.facts_error:
        results = [
            skip(n, f"interpreter not probed: {ctx.facts_error}") for n in ("hazard.tensorflow", "hazard.torch_npu")
        ]
    else:
        results = [tensorflow_numpy(ctx), torch_npu_without_cann(ctx)]
    if ctx.bundle is None or manifest is None:
        why = "no bundle given" if ctx.bundle is None else "the bundle could not be read"
        return results + [
            skip(name, why)
            for name in (
                "hazard.transfer_to_npu",
                "hazard.hub_offline",
                "hazard.placeholders",
                "hazard.intervals",
                "hazard.batch",
            )
        ]
    files = configs.config_files(ctx.bundle)
    return results + [
        transfer_to_npu(ctx.bundle, manifest),
        hub_offline(ctx),
        placeholders(ctx.bundle, files),
        *config_rules(ctx.bundle, files),
    ]


def tensorflow_numpy(ctx: CheckContext) -> ProbeResult:
    name = "hazard.tensorflow"
    tf_at = ctx.module("tensorflow")
    numpy = ctx.dist_version("numpy")
    if not tf_at:
        return ok(name, "TensorFlow not importable")
    tf = ctx.dist_version("tensorflow", "tensorflow-cpu")
    details = {"tensorflow": tf, "tensorflow_at": tf_at, "numpy": numpy}
    if version_tuple(numpy)[:1] < (2,):
        return ok(name, f"TensorFlow {tf or '(unknown version)'} with NumPy {numpy or 'absent'} (< 2)", **details)
    fix = "remove TensorFlow from the runtime (pip uninstall tensorflow; the pipeline does not use it) or pin numpy<2"
    if tf and version_tuple(tf) >= TF_NUMPY2:
        return warn(
            name,
            f"TensorFlow {tf} importable next to NumPy {numpy}: supported, but transfer_to_npu-style module "
            "walks import it (slow start)",
            fix,
            **details,
        )
    return fail(
        name,
        HAZARD,
        f"TensorFlow {tf or '(unknown version)'} at {tf_at} importable next to NumPy {numpy}: "
        "anything that imports it (transfer_to_npu's module walk did) segfaults",
        fix,
        **details,
    )


def torch_npu_without_cann(ctx: CheckContext) -> ProbeResult:
    name = "hazard.torch_npu"
    at = ctx.module("torch_npu")
    if not at:
        return ok(name, "torch-npu not installed")
    cann = find_cann(ctx)
    if cann is None:
        return fail(
            name,
            HAZARD,
            f"torch-npu installed ({at}) but no CANN toolkit: plain `import torch` fails "
            "(Failed to load the backend extension: torch_npu)",
            "pip uninstall torch-npu on machines without Ascend NPUs (or set TORCH_DEVICE_BACKEND_AUTOLOAD=0); "
            "on Ascend, install CANN and source its set_env.sh",
            torch_npu_at=at,
        )
    return ok(
        name, f"torch-npu installed with CANN {cann.version} at {cann.home}", torch_npu_at=at, cann=str(cann.home)
    )


def _scan_roots(bundle: Path, manifest: Any) -> list[Path]:
    roots = [Path(bundle) / layer.target for layer in manifest.layers if layer.kind == "source"]
    return [r for r in roots + [Path(bundle) / "config"] if r.is_dir()]


def _matching_lines(roots: list[Path], pattern: re.Pattern[str], suffixes: set[str], comment: str = "#") -> list[str]:
    hits = []
    for root in roots:
        for path in sorted(p for p in root.rglob("*") if p.suffix.lower() in suffixes and p.is_file()):
            try:
                if path.stat().st_size > SCAN_MAX_BYTES:
                    continue
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            if not pattern.search(text):
                continue
            for number, line in enumerate(text.splitlines(), 1):
                if pattern.search(line) and not line.lstrip().startswith(comment):
                    hits.append(f"{path}:{number}")
    return hits


def transfer_to_npu(bundle: Path, manifest: Any) -> ProbeResult:
    name = "hazard.transfer_to_npu"
    roots = _scan_roots(bundle, manifest)
    hits = _matching_lines(roots, re.compile(r"transfer_to_npu"), SCAN_SUFFIXES)
    if hits:
        return fail(
            name,
            HAZARD,
            f"transfer_to_npu used in {len(hits)} place(s): {', '.join(hits[:_SHOWN])}"
            + (" ..." if len(hits) > _SHOWN else "")
            + " (it patches torch globally and walked into TensorFlow)",
            "import torch_npu explicitly and use device 'npu' (the runner does); delete the transfer_to_npu import",
            hits=hits,
        )
    return ok(name, f"no transfer_to_npu in {len(roots)} source/config folder(s)", scanned=[str(r) for r in roots])


def hub_offline(ctx: CheckContext) -> ProbeResult:
    name = "hazard.hub_offline"
    data = Path(ctx.bundle) / "data"
    has_data = data.is_dir() and any(data.iterdir())
    offline = ctx.env.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    if not has_data:
        return ok(name, "the bundle carries no datasets")
    if offline:
        return ok(name, "HF_HUB_OFFLINE=1 and the datasets are local")
    return warn(
        name,
        f"the bundle carries its datasets ({data}) but Hub access is on (HF_HUB_OFFLINE unset): "
        "libraries that ask the Hub for dataset versions hang or fail on offline servers",
        "export HF_HUB_OFFLINE=1 before the run",
        data=str(data),
    )


def placeholders(bundle: Path, files: list[Path]) -> ProbeResult:
    name = "hazard.placeholders"
    hits = _matching_lines([Path(bundle) / "config"], PLACEHOLDER, set(configs.CONFIG_SUFFIXES)) if files else []
    if hits:
        return fail(
            name,
            HAZARD,
            f"placeholder paths (/path/to/) left in configs: {', '.join(hits[:_SHOWN])}"
            + (" ..." if len(hits) > _SHOWN else ""),
            "replace them with real paths or ${BUNDLE}/... placeholders",
            hits=hits,
        )
    return ok(name, f"no /path/to/ placeholders in {len(files)} config file(s)")


Pair = tuple[str, int]


def _intervals(data: dict[str, Any]) -> list[tuple[Pair, Pair]]:
    """(save, eval) interval pairs a config sets, both > 0: RLinf's (runner.save_interval, ...), then each section
    of recap-portable's own (`policy.train.save_interval`/`eval_interval`, `rl.save_every`/`eval_every`)."""
    out = []
    save, val = configs.first_int(data, configs.SAVE_KEYS), configs.first_int(data, configs.VAL_KEYS)
    if save and val and save[1] > 0 and val[1] > 0:
        out.append((save, val))
    for prefix, section in configs.sections(data):
        for save_name, val_name in configs.OWN_INTERVALS:
            save, val = configs.first_int(section, (save_name,)), configs.first_int(section, (val_name,))
            if save and val and save[1] > 0 and val[1] > 0:
                out.append(((prefix + save_name, save[1]), (prefix + val_name, val[1])))
    return out


def _batches(data: dict[str, Any]) -> list[tuple[Pair, Pair, Pair]]:
    """(global batch, micro batch, (how the workers were found, workers)) a config sets: RLinf's, then each section
    of recap-portable's own training cores (`value.train.global_batch`, `micro_batch`, `world_size` default 1)."""
    out = []
    micro, total = configs.first_int(data, configs.MICRO_KEYS), configs.first_int(data, configs.GLOBAL_KEYS)
    workers = configs.worker_count(data) or ("(no worker count: 1)", 1)
    if micro and total and micro[1] > 0 and workers[1] > 0:
        out.append((total, micro, workers))
    total_name, micro_name, world_name = configs.OWN_BATCH
    for prefix, section in configs.sections(data):
        total, micro = configs.first_int(section, (total_name,)), configs.first_int(section, (micro_name,))
        world = configs.first_int(section, (world_name,))
        workers = (prefix + world_name, world[1]) if world else (f"no {prefix}{world_name}: 1", 1)
        if micro and total and micro[1] > 0 and workers[1] > 0:
            out.append(((prefix + total_name, total[1]), (prefix + micro_name, micro[1]), workers))
    return out


def config_rules(bundle: Path, files: list[Path]) -> list[ProbeResult]:
    """hazard.intervals and hazard.batch over every config file (each file is checked on its own)."""
    interval_bad, batch_bad, unread, seen = [], [], [], {"intervals": 0, "batch": 0}
    for path in files:
        data, why = configs.load_config(path)
        if data is None:
            unread.append(f"{path.name} ({why})")
            continue
        rel = path.relative_to(bundle)
        intervals, batches = _intervals(data), _batches(data)
        seen["intervals"] += bool(intervals)
        seen["batch"] += bool(batches)
        for (save_key, save), (val_key, val) in intervals:
            if save % val:
                interval_bad.append(f"{rel}: {save_key}={save} is not a multiple of {val_key}={val}")
        for (total_key, total), (micro_key, micro), (workers_from, workers) in batches:
            if total % (micro * workers):
                batch_bad.append(
                    f"{rel}: {total_key}={total} does not divide into {micro_key}={micro} x "
                    f"{workers} workers ({workers_from})"
                )
    note = f"; not read: {', '.join(unread)}" if unread else ""
    rows = []
    if interval_bad:
        rows.append(
            fail(
                "hazard.intervals",
                HAZARD,
                "; ".join(interval_bad) + note,
                "make each save interval (save_interval, save_every) a multiple of its evaluation interval "
                "(val_check_interval, eval_interval, eval_every) so every checkpoint has a validation",
                problems=interval_bad,
            )
        )
    else:
        rows.append(ok("hazard.intervals", f"save/val intervals consistent in {seen['intervals']} config(s){note}"))
    if batch_bad:
        rows.append(
            fail(
                "hazard.batch",
                HAZARD,
                "; ".join(batch_bad) + note,
                "set the global batch (global_batch_size, global_batch) to a multiple of the micro batch "
                "(micro_batch_size, micro_batch) x workers",
                problems=batch_bad,
            )
        )
    else:
        rows.append(ok("hazard.batch", f"batch sizes divide across workers in {seen['batch']} config(s){note}"))
    return rows
