"""`portable demo --world libero`: the demo's LIBERO tier (issue 22 item 5), LIBERO-10 task 0 on CPU.

The Fetch demo's pipeline (reproduction/recipes/recap/demo.py) on upstream's RECAP task: the scripted expert
generates the LIBERO datasets, the tier packs them with a source snapshot and its run config (bundle/demo_libero.toml),
restores a copy, runs `check` on it, runs the four RECAP stages with tiny presets, evaluates BC (all data),
filtered BC and RECAP (w = 1 and w = 2) from LIBERO-10 task 0's official init states by LIBERO's protocol,
compares with the tier's reference evidence (evidence/demo_libero/) and prints the step table.

PRIVILEGED STATE: no camera is rendered anywhere. The datasets hold LIBERO's 8-dim robot state and its
privileged object state (`observation.object_state`, the simulator's object poses), both models read those, and
the evaluation observes the same. A CPU shortcut (a step with both cameras costs ~0.3 CPU-s, one without
~25 ms); the real release reads images + proprio only. The evidence (`settings.libero.observation`), the bundle's
evidence/README.md, `tier.json` and the summary all say so.

    <output>/
      src/                 data/libero10_task0/{sft,rollouts_train}, project/, configs/run.yaml, evidence/
      bundle/              the packed bundle
      restored/recap-demo-libero/   the same bundle copied elsewhere and restored there
      check.json           `portable check` on the restored bundle
      run/ (run-seedN/)    the run of training seed 0 (N): run.json, stages, evidence/, lineage/, report.html
      tier.json            (tier-seedN.json) the note, the step times, peak RSS, label quality and mechanism

A rerun reuses every step whose inputs are unchanged (as the Fetch demo); `--seed N` reuses the data, bundle,
restore and check of the folder and trains and evaluates in run-seedN/.
"""

from __future__ import annotations

import contextlib
import json
import resource
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from reproduction.recipes.recap.demo import (
    DATA,
    MARKER,
    DemoReport,
    _check,
    _pack,
    _plots_and_report,
    _restore,
    _run,
    _stamp,
    check_overrides,
    demo_folder,
)
from reproduction.recipes.recap.demo import _write_sources as write_sources
from reproduction.recipes.recap.demo import check_checkout as _check_checkout
from reproduction.ui import UiOptions, say

SPEC = DATA / "bundle" / "demo_libero.toml"
CONFIGS = DATA / "bundle" / "demo_libero"
REFERENCE = DATA / "evidence" / "demo_libero"
"""The tier's reference evidence (its own full run's eval JSON; README there says how it was made)."""
NEEDS = ("bundle/demo_libero.toml", "bundle/demo_libero", "evidence/demo_libero")
"""What the LIBERO tier reads from the checkout's data folders."""


def check_checkout() -> None:
    """InputNotFoundError (exit 3) naming the first of NEEDS missing, before any work (audit60 N1)."""
    _check_checkout(NEEDS)


REFERENCE_FILE = {False: "eval_policy_1500.json", True: "eval_policy_10.json"}
"""The reference each tier compares with (full, quick): its own evaluation at its policy step count."""
TASK = "libero_10/0"
DATA = "libero10_task0"
NOTE = (
    "PRIVILEGED STATE, NO IMAGES: this LIBERO tier generates its data without cameras, and its value and policy "
    "models read LIBERO's 8-dim robot state plus the simulator's privileged object state "
    "(observation.object_state); its evaluation observes the same. A CPU shortcut: the real release "
    "(bundle/libero10/config.yaml) reads images + proprio only. Training episodes start from the same 50 official "
    "init states the evaluation uses (LIBERO ships no others), so success is measured in distribution."
)
SEEDED = ("value.train.seed", "value.model.model_seed", "policy.train.seed", "policy.model.model_seed")
"""What `--seed N` sets (the value's fold split, the data and the evaluation stay the same)."""


@dataclass(kw_only=True, slots=True)
class LiberoTierData:
    """What the scripted expert generates for the tier (no cameras)."""

    sft: int = 20
    """Clean expert episodes (successes kept)."""
    rollouts: int = 60
    """Mixed episodes, outcome in is_success."""
    modes: dict[str, float] = field(default_factory=lambda: {"expert": 0.2, "detour": 0.4, "noise": 0.2, "drop": 0.2})
    """Rollout injections (generate.py LiberoMode): detours are harmful but recoverable, drops and noise fail."""
    sft_max_steps: int = 420
    rollout_max_steps: int = 420
    """Step limits of generation (the expert succeeds in 290-333 steps; a failure runs to the limit)."""
    seed: int = 0
    workers: int = 2


FULL = LiberoTierData()
QUICK = LiberoTierData(
    sft=2, rollouts=2, modes={"expert": 0.5, "drop": 0.5}, sft_max_steps=340, rollout_max_steps=40, workers=1
)


def run_libero_demo(
    output: Path | None,
    *,
    quick: bool = False,
    seed: int | None = None,
    overrides: list[str] | None = None,
    ui: UiOptions | None = None,
    reference: Path = REFERENCE,
) -> int:
    """Build and run the LIBERO tier under `output` (default ./runs/demo-libero, or ./runs/demo-libero-quick); see
    the module docstring. `seed` (>= 0) sets the training seeds (SEEDED) and, above 0, the run folder
    run-seedN. Prints the summary on stderr and the run folder on stdout; returns 0. Raises
    MissingDependencyError (exit 10) without the libero extra before anything is written, RunStateError for a
    bad output folder, ConfigError for a negative seed, and what the steps raise."""
    from reproduction.errors import ConfigError, MissingDependencyError
    from reproduction.sim.libero._runtime import available

    if seed is not None and seed < 0:
        raise ConfigError(f"--seed {seed} must be >= 0", field="--seed")
    if not available():
        raise MissingDependencyError(
            "the LIBERO tier needs LIBERO, which is not installed", hint="pip install -e '.[libero]'"
        )
    default = "demo-libero-quick" if quick else "demo-libero"
    config = CONFIGS / ("quick.yaml" if quick else "run.yaml")
    check_overrides(config, overrides, output, default, "recap-demo-libero")  # before any work (audit46 F19)
    out = demo_folder(output, default)
    with _folder_lock(out), RssSampler() as sampler:
        (out / MARKER).write_text(json.dumps({"quick": quick, "world": "libero"}) + "\n")
        return _run_tier(
            out, quick=quick, seed=seed, overrides=list(overrides or []), sampler=sampler, ui=ui, reference=reference
        )


def _run_tier(
    out: Path,
    *,
    quick: bool,
    seed: int | None,
    overrides: list[str],
    sampler: RssSampler,
    ui: UiOptions | None,
    reference: Path,
) -> int:
    """run_libero_demo's steps in the checked folder `out`, `sampler` running."""
    data = QUICK if quick else FULL
    suffix = f"-seed{seed}" if seed else ""
    report = DemoReport(output=out)
    peaks: dict[str, float] = {}
    t_all = time.perf_counter()
    say(f"demo (LIBERO tier): {NOTE}", options=ui)

    cpu: dict[str, float] = {}

    def step(name: str, fn: Callable[[], str]) -> None:
        t0, c0 = time.perf_counter(), _cpu_s()
        sampler.take()
        what = fn()
        report.steps.append((name, what, time.perf_counter() - t0))
        peaks[name], cpu[name] = sampler.take(), round(_cpu_s() - c0, 1)
        say(f"demo: {name}: {what} ({time.perf_counter() - t0:.1f} s)", options=ui)

    src, bundle, restored = out / "src", out / "bundle", out / "restored" / "recap-demo-libero"
    step("generate", lambda: _generate(src / "data" / DATA, data, ui=ui))
    _write_sources(src, quick=quick, reference=reference)
    step("pack", lambda: _pack(src, bundle, ui=ui, spec=SPEC))
    step("restore", lambda: _restore(bundle, restored, ui=ui))
    step("check", lambda: _check(restored, out / "check.json", ui=ui))
    run_dir = out / f"run{suffix}"
    seeded = [f"{k}={seed}" for k in SEEDED] if seed is not None else []
    ref = restored / "evidence" / REFERENCE_FILE[quick]  # the full and the quick tier each have their own
    seeded.append(f"eval.reference={ref if ref.is_file() else 'null'}")
    t0, c0 = time.perf_counter(), _cpu_s()
    sampler.take()
    report.run = _run(restored, run_dir, seeded + overrides, ui=ui)
    cpu["run"] = round(_cpu_s() - c0, 1)
    for s in report.run.stages:
        report.steps.append((f"run: {s.name}", s.action, s.seconds))
    report.steps.append(("run (total)", "", time.perf_counter() - t0))
    peaks["run"] = sampler.take()
    step("plots and report", lambda: _plots_and_report(report.run))
    report.steps.append(("demo (total)", "", time.perf_counter() - t_all))
    tier = tier_summary(run_dir, report, seed=seed or 0, data=data, peaks=peaks)
    tier["cpu_s"] = cpu  # this process and its waited-for children (workers), user + system
    _write_json(out / f"tier{suffix}.json", tier)
    _summary(report, run_dir, tier, ui=ui)
    print(run_dir)
    return 0


# -- steps ----------------------------------------------------------------------------------------


_SIM_MODULES = ("generate", "expert", "env", "tasks", "_runtime")


def _generate(root: Path, data: LiberoTierData, *, ui: UiOptions | None) -> str:
    """root/sft and root/rollouts_train from the scripted expert, no cameras; reused when the stamp (settings +
    the LIBERO generator's code) matches."""
    from reproduction.run.stage_keys import module_digest
    from reproduction.sim.libero.generate import LiberoGenConfig, close_envs, generate_libero_dataset

    code = [module_digest(f"reproduction.sim.libero.{m}") for m in _SIM_MODULES]
    stamp = _stamp({"task": TASK, "data": asdict(data), "code": code})
    marker = root / "generated.json"
    if marker.is_file() and json.loads(marker.read_text()).get("stamp") == stamp:
        return "reused"
    if root.exists():
        shutil.rmtree(root)
    common = dict(task=TASK, seed=data.seed, cameras=False)
    sets = (
        ("sft", LiberoGenConfig(kind="sft", episodes=data.sft, max_steps=data.sft_max_steps, **common)),
        (
            "rollouts_train",
            LiberoGenConfig(
                kind="rollout",
                episodes=data.rollouts,
                modes=dict(data.modes),
                max_steps=data.rollout_max_steps,
                **common,
            ),
        ),
    )
    results = {}
    try:
        for name, cfg in sets:
            results[name] = generate_libero_dataset(cfg, root / name, workers=data.workers, ui=ui, keep_env=True)
    finally:
        close_envs()
    doc = {
        "stamp": stamp,
        "note": NOTE,
        "sets": {
            n: {
                "episodes": r.episodes_written,
                "frames": r.frames,
                "steps_run": r.steps_run,
                "seconds": round(r.seconds, 1),
                "per_mode": r.per_mode,
            }
            for n, r in results.items()
        },
    }
    _write_json(marker, doc)
    episodes = sum(r.episodes_written for r in results.values())
    frames = sum(r.frames for r in results.values())
    wins = sum(c["success"] for c in results["rollouts_train"].per_mode.values())
    return f"{episodes} episodes, {frames} frames ({wins}/{data.rollouts} rollouts succeed)"


def _write_sources(src: Path, *, quick: bool, reference: Path) -> None:
    """The Fetch demo's sources (the runner's snapshot, the run config, exactly `reference`'s JSON files) with the
    tier's configs and an evidence README that carries the privileged-state note."""
    readme = (
        "Reference evidence of the LIBERO tier's own full run (evidence/demo_libero/ in the project); "
        f"`portable demo --world libero` compares its evaluation with it.\n\n{NOTE}\n"
    ).encode()
    write_sources(src, quick=quick, reference=reference, configs=CONFIGS, readme=readme)


@contextlib.contextmanager
def _folder_lock(out: Path) -> Iterator[None]:
    """Hold `out`/.demo.lock for the whole tier: a second tier in the same folder (e.g. another --seed) would
    regenerate, repack and re-restore the bundle a running one reads when the code changed in between, so it is
    refused (RunStateError) instead. The lock is released when this process ends, however it ends."""
    import fcntl

    from reproduction.errors import RunStateError

    with open(out / ".demo.lock", "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunStateError(
                f"another `portable demo` is running in {out}",
                path=out,
                hint="wait for it (seeds in one folder run one after another), or pass another --output",
            ) from None
        yield


def _cpu_s() -> float:
    """CPU seconds (user + system) of this process and of its children waited for so far."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


class RssSampler:
    """Samples, every `interval` s on a daemon thread, the RSS of this process's descendants (Linux /proc) and
    keeps the peak of each: the memory one generation or evaluation worker (one LIBERO env each) holds. `peak()`
    is the largest since the last `take()`, which also resets it."""

    def __init__(self, interval: float = 1.0) -> None:
        import threading

        self.interval, self._peak, self._stop = interval, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def take(self) -> float:
        peak, self._peak = self._peak, 0.0
        return round(peak)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            for mb in _descendant_rss_mb():
                self._peak = max(self._peak, mb)


def _descendant_rss_mb() -> list[float]:
    """RSS (MB) of every descendant of this process ([] where /proc cannot be read)."""
    import os

    parents: dict[int, int] = {}
    rss: dict[int, float] = {}
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        parents[pid] = int(fields.get("PPid", "0").strip() or 0)
        if "VmRSS" in fields:
            rss[pid] = int(fields["VmRSS"].split()[0]) / 1024
    me, out = os.getpid(), []
    for pid, mb in rss.items():
        p, seen = parents.get(pid, 0), 0
        while p and p != me and seen < 64:
            p, seen = parents.get(p, 0), seen + 1
        if p == me:
            out.append(mb)
    return out


def _write_json(path: Path, doc: Any) -> None:
    from reproduction.fsio import atomic_write_text

    atomic_write_text(path, json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n")


# -- what the tier shows --------------------------------------------------------------------------


def tier_summary(
    run_dir: Path, report: DemoReport, *, seed: int, data: LiberoTierData, peaks: dict[str, float]
) -> dict[str, Any]:
    """tier.json: the note, the data, each step's seconds, peak RSS (driver, largest worker), success per policy,
    stage 3's label quality and the mechanism (negative-label rate by rollout mode and kind of frame)."""
    state = json.loads((run_dir / "run.json").read_text())
    adv = state["stages"]["advantages"]["summary"]
    results = state["stages"]["eval"]["summary"]["results"]
    rates = {label: dict(r["tasks"][TASK]) for label, r in results.items()}  # counts: episodes, success_*
    self_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "note": NOTE,
        "task": TASK,
        "seed": seed,
        "data": asdict(data),
        "steps": [{"step": n, "result": w, "seconds": round(s, 1)} for n, w, s in report.steps],
        "peak_rss_mb": {"driver": round(self_mb), "largest_worker_by_step": peaks},
        "success": rates,
        "label_quality": adv.get("label_quality"),
        "mechanism": mechanism(run_dir, state),
    }


def mechanism(run_dir: Path, state: dict[str, Any]) -> dict[str, Any]:
    """What RECAP's labels remove: per rollout mode (expert, detour, noise, drop) and for detour frames
    (`sim.harm`), failed episodes and the clean frames of successful ones, the fraction of frames labelled
    negative (the frames the positive prompt is not trained on)."""
    import numpy as np
    import pyarrow.parquet as pq

    from reproduction.data.reader import open_dataset
    from reproduction.sim.libero.generate import LiberoMode

    datasets = {Path(d["path"]).name: Path(d["path"]) for d in state["config"]["datasets"]}
    path = datasets.get("rollouts_train")
    sidecars = [Path(p) for p in state["stages"]["advantages"]["summary"].get("sidecars", [])]
    sidecar = next((p for p in sidecars if p.parent.name == "rollouts_train"), None)
    if path is None or sidecar is None:
        return {}
    ds = open_dataset(path)
    t = ds.frame_table(["episode_index", "frame_index", "is_success", "sim.mode", "sim.harm"])
    key = lambda e, f: e.astype(np.int64) * 100_000 + f.astype(np.int64)  # noqa: E731
    ep, fr = t.column("episode_index").to_numpy(), t.column("frame_index").to_numpy()
    a = pq.read_table(sidecar, columns=["episode_index", "frame_index", "advantage"])
    lab = dict(
        zip(
            key(a.column("episode_index").to_numpy(), a.column("frame_index").to_numpy()).tolist(),
            a.column("advantage").to_numpy(zero_copy_only=False).tolist(),
        )
    )
    neg = np.array([not lab[k] for k in key(ep, fr).tolist()])
    mode = t.column("sim.mode").to_numpy().reshape(-1)
    harm = np.asarray(t.column("sim.harm").to_numpy(zero_copy_only=False), bool).reshape(-1)
    ok = np.asarray(t.column("is_success").to_numpy(zero_copy_only=False), bool).reshape(-1)
    last = {int(e): bool(s) for e, s in zip(ep, ok)}  # rows in (episode, frame) order: the last row wins
    success = np.array([last[int(e)] for e in ep])

    def rate(mask: np.ndarray) -> dict[str, Any]:
        return {"negative": round(float(neg[mask].mean()), 3) if mask.any() else None, "frames": int(mask.sum())}

    out = {"by_mode": {m.name.lower(): rate(mode == int(m)) for m in LiberoMode}}
    out["detour_frames"] = rate(harm)
    out["failed_episodes"] = rate(~success)
    out["clean_frames_of_successes"] = rate(success & ~harm)
    out["all"] = rate(np.ones(neg.size, bool))
    return out


def _summary(report: DemoReport, run_dir: Path, tier: dict[str, Any], *, ui: UiOptions | None) -> None:
    from reproduction.recipes.recap.demo import _results_lines

    width = max(len(s[0]) for s in report.steps)
    lines = ["", f"{'step':<{width}}  {'result':<40}  seconds"]
    lines += [f"{name:<{width}}  {what[:40]:<40}  {sec:7.1f}" for name, what, sec in report.steps]
    rss = tier["peak_rss_mb"]
    workers = ", ".join(f"{k} {v:.0f}" for k, v in rss["largest_worker_by_step"].items() if v)
    lines.append(
        f"peak RSS: driver {rss['driver']} MB; largest child process (a LIBERO worker: one env) per step, MB: "
        f"{workers or 'none started'}"
    )
    mech = tier.get("mechanism") or {}
    if mech:
        parts = [f"{k} {v['negative']:.2f}" for k, v in mech["by_mode"].items() if v["negative"] is not None]
        lines.append(
            "negative labels (frames RECAP's prompt is not trained on): "
            + ", ".join(parts)
            + (f"; detour frames {mech['detour_frames']['negative']}" if mech["detour_frames"]["frames"] else "")
            + f"; failed episodes {mech['failed_episodes']['negative']}"
        )
    lines += ["", *_results_lines(run_dir), "", NOTE, ""]
    lines += [
        f"run folder: {run_dir}",
        f"evidence:   {run_dir / 'evidence'}",
        f"tier:       {report.output / ('tier.json' if run_dir.name == 'run' else f'tier-{run_dir.name[4:]}.json')}",
        f"report:     {run_dir / 'report.html'}",
    ]
    say("\n".join(lines), options=ui)
