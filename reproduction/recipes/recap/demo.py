"""`portable demo`: the embedded default end to end, on CPU, with no download.

Generates the simulator datasets, packs the demo bundle (bundle/demo.toml), restores a copy
elsewhere, runs `check` on it, runs every RECAP stage from the restored bundle (bundle/demo/run.yaml,
or quick.yaml with `--quick`), evaluates RECAP against the BC baselines, compares with the bundle's
reference evidence, and prints a table with the time of each step. Running it again reuses every
step whose inputs are unchanged (generation and packing by stamps, restore by its receipt, the run
by its stage keys).

    <output>/
      src/                 generated sources: data/{sft,rollout} project/ (recap, sim, data code) configs/ evidence/
      bundle/              the packed bundle
      restored/recap-demo/ the same bundle copied elsewhere and restored there
      check.json           `portable check` on the restored bundle
      run/                 the run: run.json, stage folders, evidence/, lineage/, plots/, report.html
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from reproduction.release.weights_manifest import project_path, project_root
from reproduction.ui import UiOptions, say

REPO = Path(__file__).resolve().parents[3]
"""The folder holding `reproduction/`: the source snapshot the demo bundle carries comes from there."""
DATA = project_root()
"""The folder holding the checkout's data folders (bundle/, evidence/); a non-editable install has none."""
SPEC = DATA / "bundle" / "demo.toml"
CONFIGS = DATA / "bundle" / "demo"
MARKER = "demo.json"
"""Marks a folder `portable demo` built (a rerun may reuse it; another non-empty folder is refused)."""
REFERENCE = DATA / "evidence" / "demo"
"""The demo's reference evidence (a published demo run's eval JSON), packed into the bundle's evidence/."""
NEEDS = ("bundle/demo.toml", "bundle/demo", "evidence/demo")
"""What the demo reads from the checkout's data folders (SPEC, CONFIGS, REFERENCE)."""


def check_checkout(needs: tuple[str, ...] = NEEDS) -> None:
    """InputNotFoundError (exit 3) naming the first of `needs` missing, before the demo generates anything: a
    non-editable install carries no bundle/ or evidence/, and the demo used to fail only after generating
    for a minute (audit60 N1)."""
    for rel in needs:
        project_path(rel, needed_by="portable demo")


@dataclass(kw_only=True, slots=True)
class DemoData:
    """What the simulator generates for the demo (DEMO_LAB.md mix1, scaled to the CPU budget)."""

    sft_episodes: int = 30
    rollout_episodes: int = 150
    tasks: tuple[str, ...] = ("FetchPickAndPlace-v4",)
    seed: int = 0
    cameras: tuple[str, ...] = ("agentview",)
    image_size: int = 64
    workers: int = 2


FULL = DemoData()
QUICK = DemoData(sft_episodes=4, rollout_episodes=12, workers=1)


@dataclass(kw_only=True)
class DemoReport:
    output: Path
    steps: list[tuple[str, str, float]] = field(default_factory=list)
    """(step, what happened, seconds)."""
    run: Any = None
    first_run: dict[str, float | None] = field(default_factory=dict)
    """What this process paid once (imports, one env), measured at the start (`_first_run_costs`)."""
    workers: dict[str, int] = field(default_factory=dict)
    """Simulator worker processes each step started (each pays its own start, imports and env)."""


def demo_folder(output: Path | str | None, default: str) -> Path:
    """The demo's output folder, absolute (default runs/<default>), created: a new or empty folder, or one an
    earlier demo built (it holds MARKER). RunStateError (exit 55) for a file or another non-empty folder."""
    from reproduction.errors import RunStateError
    from reproduction.fsio import make_output_folder

    out = Path(output or Path("runs") / default).absolute()
    if out.exists() and not out.is_dir():
        raise RunStateError(f"output {out} is a file, not a folder", path=out, hint="pass a folder with --output")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file():
        raise RunStateError(
            f"{out} is not empty and is not a demo folder (no {MARKER})",
            path=out,
            hint="pass a new or empty folder with --output, or the folder of an earlier demo to reuse it",
        )
    make_output_folder(out, command="demo")
    return out


def check_overrides(
    config: Path, overrides: list[str] | None, output: Path | str | None, default: str, name: str
) -> None:
    """Load the demo's run `config` (the file its bundle carries as config/run.yaml) with the user's `overrides` as
    the run will, so a typo is refused (ConfigError, exit 4) before anything is generated, packed or restored; the
    placeholders point where the demo will put the restored bundle (`name`) and the run."""
    from reproduction.recipes.recap.config import load_config

    given = list(overrides or [])
    if not given:
        return
    if not any(o.startswith("eval.reference=") for o in given):
        given.append("eval.reference=null")  # the demo sets it to the bundle's reference file (checked by the run)
    out = Path(output or Path("runs") / default).absolute()
    load_config([config], given, bundle=out / "restored" / name, run_dir=out / "run")


def run_demo(
    output: Path | None,
    *,
    quick: bool = False,
    overrides: list[str] | None = None,
    ui: UiOptions | None = None,
    reference: Path = REFERENCE,
) -> int:
    """Build and run the demo under `output` (default ./runs/demo, or ./runs/demo-quick); see the module
    docstring. `reference`: the folder of reference evidence the bundle carries (the published demo run's).
    Prints the summary table on stderr and the run folder on stdout; returns 0. Raises what the steps
    raise (release, check, config and run errors, each with its exit code)."""

    default = "demo-quick" if quick else "demo"
    check_overrides(CONFIGS / ("quick.yaml" if quick else "run.yaml"), overrides, output, default, "recap-demo")
    out = demo_folder(output, default)
    (out / MARKER).write_text(json.dumps({"quick": quick}) + "\n")
    data = QUICK if quick else FULL
    report = DemoReport(output=out)
    t_all = time.perf_counter()

    def step(name: str, fn: Callable[[], str]) -> None:
        t0 = time.perf_counter()
        what = fn()
        report.steps.append((name, what, time.perf_counter() - t0))
        say(f"demo: {name}: {what} ({time.perf_counter() - t0:.1f} s)", options=ui)

    report.first_run = _first_run_costs(data.tasks[0])
    src, bundle, restored = out / "src", out / "bundle", out / "restored" / "recap-demo"
    step("generate", lambda: _generate(src / "data", data, ui=ui))
    if data.workers > 1 and report.steps[-1][1] != "reused":
        report.workers["generate"] = data.workers
    _write_sources(src, quick=quick, reference=reference)
    step("pack", lambda: _pack(src, bundle, ui=ui))
    step("restore", lambda: _restore(bundle, restored, ui=ui))
    step("check", lambda: _check(restored, out / "check.json", ui=ui))
    run_dir = out / "run"
    t0 = time.perf_counter()
    report.run = _run(restored, run_dir, overrides or [], ui=ui)
    for s in report.run.stages:
        report.steps.append((f"run: {s.name}", s.action, s.seconds))
    report.workers.update(_eval_workers(run_dir, report.run))
    report.steps.append(("run (total)", "", time.perf_counter() - t0))
    step("plots and report", lambda: _plots_and_report(report.run))
    report.steps.append(("demo (total)", "", time.perf_counter() - t_all))
    _summary(report, run_dir, ui=ui)
    print(run_dir)
    return 0


# -- steps ----------------------------------------------------------------------------------------


def _stamp(doc: Any) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def _generate(root: Path, data: DemoData, *, ui: UiOptions | None) -> str:
    """Simulator datasets at root/sft and root/rollout; reused when the stamp (settings + simulator code) matches."""
    from reproduction.run.stage_keys import module_digest
    from reproduction.sim.generate import DataMix, generate_mix

    stamp = _stamp({"data": asdict(data), "code": [module_digest(f"reproduction.sim.{m}") for m in _SIM_MODULES]})
    marker = root / "generated.json"
    if marker.is_file() and json.loads(marker.read_text()).get("stamp") == stamp:
        return "reused"
    if root.exists():
        shutil.rmtree(root)
    results = generate_mix(
        DataMix(sft_episodes=data.sft_episodes, rollout_episodes=data.rollout_episodes),
        root,
        tasks=data.tasks,
        seed=data.seed,
        workers=data.workers,
        ui=ui,
        cameras=data.cameras,
        image_size=data.image_size,
    )
    frames = sum(r.frames for r in results.values())
    episodes = sum(r.episodes for r in results.values())
    from reproduction.fsio import atomic_write_text

    atomic_write_text(marker, json.dumps({"stamp": stamp, "episodes": episodes, "frames": frames}) + "\n")
    return f"{episodes} episodes, {frames} frames"


SNAPSHOT = ("recap", "sim", "data")
"""The algorithm code the demo release pins as its source layer (the bundle carries the runner at reproduction/)."""
_SIM_MODULES = ("generate", "env", "experts", "behaviours", "episode", "tasks", "seeds")


README = b"Reference evidence of the published demo run; `portable demo` compares its evaluation with it.\n"


def put_if_changed(path: Path, data: bytes) -> None:
    """Write `data` to `path` atomically unless it already holds exactly that: unchanged files keep their mtime,
    so a demo's pack step (stamped by sizes and mtimes) is reused."""
    from reproduction.fsio import atomic_write_bytes

    if not path.is_file() or path.read_bytes() != data:
        atomic_write_bytes(path, data)


def sync_snapshot(project: Path, packages: tuple[str, ...]) -> None:
    """Make `project` hold exactly the .py files of reproduction/<package> for each of `packages` (a bundle's source
    snapshot): changed files rewritten, files the tree no longer holds removed, the rest untouched."""
    wanted = {p.relative_to(REPO): p for pkg in packages for p in sorted((REPO / "reproduction" / pkg).rglob("*.py"))}
    for rel, p in wanted.items():
        put_if_changed(project / rel, p.read_bytes())
    for p in sorted(project.rglob("*.py")) if project.exists() else []:
        if p.relative_to(project) not in wanted:
            p.unlink()


def _write_sources(
    src: Path, *, quick: bool, reference: Path = REFERENCE, configs: Path = CONFIGS, readme: bytes = README
) -> None:
    """The bundle's other sources: the runner's source snapshot, the run config (`configs`' quick.yaml or
    run.yaml), the reference evidence (exactly `reference`'s JSON files: one it no longer holds is removed) and
    its `readme`. Unchanged files keep their mtime, so pack is reused."""
    put = put_if_changed
    sync_snapshot(src / "project", SNAPSHOT)
    put(src / "configs" / "run.yaml", (configs / ("quick.yaml" if quick else "run.yaml")).read_bytes())
    evidence = src / "evidence"
    refs = sorted(reference.glob("*.json")) if reference.is_dir() else []
    for p in refs:
        put(evidence / p.name, p.read_bytes())
    for p in sorted(evidence.glob("*.json")) if evidence.is_dir() else []:
        if p.name not in {r.name for r in refs}:
            p.unlink()
    put(evidence / "README.md", readme)


def _tree_stamp(root: Path) -> str:
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name != "generated.json")
    return _stamp([(str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns) for p in files])


def _pack(src: Path, bundle: Path, *, ui: UiOptions | None, spec: Path = SPEC) -> str:
    """Pack `spec` (bundle/demo.toml) from `src` (pack builds the tiny weights its [[weights]] manifests pin, in
    seconds); reused when the sources, the spec and those manifests are unchanged."""
    from reproduction.fsio import atomic_write_text
    from reproduction.release.pack import pack_bundle
    from reproduction.release.spec import load_spec

    manifests = [w.manifest.read_bytes().hex() for w in load_spec(spec, root=src).weights]
    stamp = _stamp([_tree_stamp(src), spec.read_bytes().hex(), manifests])
    marker = bundle.parent / "bundle.stamp"
    if (bundle / "bundle.json").is_file() and marker.is_file() and marker.read_text().strip() == stamp:
        return "reused"
    if bundle.exists():
        shutil.rmtree(bundle)
    manifest = pack_bundle(spec, bundle, root=src, ui=ui)
    atomic_write_text(marker, stamp + "\n")
    return f"{len(manifest.files)} files, {len(manifest.layers)} layers"


def _restore(bundle: Path, restored: Path, *, ui: UiOptions | None) -> str:
    """Copy the bundle elsewhere and restore it there (its receipt makes a second restore a stat pass)."""
    from reproduction.release.restore import restore_bundle

    same = (restored / "bundle.json").is_file() and (restored / "bundle.json").read_bytes() == (
        bundle / "bundle.json"
    ).read_bytes()
    if not same:
        if restored.exists():
            shutil.rmtree(restored)
        shutil.copytree(bundle, restored, symlinks=True)
    report = restore_bundle(restored, ui=ui)
    return ("reused copy; " if same else "copied; ") + report.summary().splitlines()[0]


def _check(restored: Path, json_path: Path, *, ui: UiOptions | None) -> str:
    from reproduction.checks.report import run_checks

    code = run_checks(bundle=restored, jit_smoke=False, json_path=json_path, device="cpu", ui=ui)
    if code not in (0,):
        from reproduction.errors import PortableError

        err = PortableError(
            f"`portable check` on the restored demo bundle failed (exit {code}); details in {json_path}",
            hint=f"run `portable check {restored}` to see each finding",
        )
        err.exit_code = code
        raise err
    return "passed"


def _run(restored: Path, run_dir: Path, overrides: list[str], *, ui: UiOptions | None) -> Any:
    from reproduction.recipes.recap.config import load_config
    from reproduction.recipes.recap.recipe import RECAP
    from reproduction.run.record import make_recorder
    from reproduction.run.runner import RunOptions, read_state, run_recipe_redoing_changed

    overrides = list(overrides)
    reference = sorted((restored / "evidence").glob("*.json"))
    if not any(o.startswith("eval.reference=") for o in overrides):
        overrides.append(f"eval.reference={reference[0]}" if reference else "eval.reference=null")
    config = load_config([restored / "config" / "run.yaml"], overrides, bundle=restored, run_dir=run_dir)
    resume = read_state(run_dir) is not None if run_dir.is_dir() else False
    # The demo's inputs are its own: a stage whose key changed (new code, config or data since the last
    # demo in this folder) is redone with what follows, where `portable run --resume` would refuse.
    opts = RunOptions(resume=resume, argv=["portable", "demo"], ui=ui, recorder=make_recorder(restored))
    return run_recipe_redoing_changed(RECAP, config, run_dir, opts)


def _plots_and_report(run: Any) -> str:
    """Where the run's plots and report.html are: the runner wrote them after the stages (Recipe.report), or left
    them when it redid nothing; a report that failed was a warning line of the run's."""
    return f"-> {run.report}" if run.report is not None else "not written (see the warning above)"


FIRST_RUN_IMPORTS = (
    ("torch", ("torch",)),
    ("transformers", ("transformers",)),
    ("mujoco+gymnasium", ("mujoco", "gymnasium_robotics")),
)
"""The heavy imports a first run pays (label, modules), inside whichever step first needs them."""


def _first_run_costs(task: str) -> dict[str, float | None]:
    """Wall seconds this process pays once: each heavy import (None: loaded before the demo began) and
    one simulator env of `task`. Measured here, up front, because inside the steps they hide in the
    first step that needs them; the imports would be paid there anyway (the env, ~0.3 s, is extra)."""
    import contextlib
    import importlib
    import io

    costs: dict[str, float | None] = {}
    for label, modules in FIRST_RUN_IMPORTS:
        if all(m in sys.modules for m in modules):
            costs[label] = None
            continue
        t0 = time.perf_counter()
        with contextlib.redirect_stderr(io.StringIO()):  # gymnasium_robotics prints a notice on import
            for m in modules:
                importlib.import_module(m)
        costs[label] = time.perf_counter() - t0
    from reproduction.sim.env import _make_gym_env

    t0 = time.perf_counter()
    with contextlib.redirect_stderr(io.StringIO()):
        _make_gym_env(task).close()
    costs[f"one {task} env"] = time.perf_counter() - t0
    return costs


def _eval_workers(run_dir: Path, run: Any) -> dict[str, int]:
    """{'eval': n} when this run's eval stage ran in n > 1 simulator worker processes (none when reused)."""
    ran = {s.name for s in getattr(run, "stages", []) if getattr(s, "action", "") not in ("reused", "skipped")}
    try:
        n = int(json.loads((run_dir / "run.json").read_text())["config"]["eval"]["workers"])
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return {"eval": n} if "eval" in ran and n > 1 else {}


def first_run_lines(costs: dict[str, float | None], *, workers: dict[str, int], ray_starts: list[float]) -> list[str]:
    """The summary's lines on what a first run pays that the step table does not show on its own line:
    the imports and env creation of this process (`_first_run_costs`), the local Ray starts, and the
    simulator worker processes, each of which pays its own Python start, imports and env again."""
    parts = [f"{k} {v:.1f} s" if v is not None else f"{k} (already loaded)" for k, v in costs.items()]
    total = sum(v for v in costs.values() if v is not None)
    ray = f"Ray start {sum(ray_starts):.1f} s ({len(ray_starts)}x)" if ray_starts else "Ray not started"
    lines = [
        f"first-run costs inside the steps (this process, measured): {', '.join(parts)}; total {total:.1f} s; {ray}"
    ]
    if workers:
        each = ", ".join(f"{k} {n}" for k, n in workers.items())
        lines.append(
            f"  plus {sum(workers.values())} simulator worker processes ({each}), each paying its own start, "
            "imports and env again"
        )
    return lines


def step_table(steps: list[tuple[str, str, float]]) -> list[str]:
    """The demo's closing table (a blank line, then step, result, seconds): the result column is as wide as its
    longest entry (at least 40), never cut, since a result is often a path a reader copies (audit55 I4)."""
    width = max(len(s[0]) for s in steps)
    result = max([40, *(len(s[1]) for s in steps)])
    lines = ["", f"{'step':<{width}}  {'result':<{result}}  seconds"]
    return lines + [f"{name:<{width}}  {what:<{result}}  {sec:7.1f}" for name, what, sec in steps]


def _summary(report: DemoReport, run_dir: Path, *, ui: UiOptions | None) -> None:
    from reproduction.train.ray_connect import START_SECONDS

    lines = step_table(report.steps)
    lines += first_run_lines(report.first_run, workers=report.workers, ray_starts=list(START_SECONDS))
    lines.append("")
    lines += _results_lines(run_dir)
    lines += [
        f"run folder: {run_dir}",
        f"evidence:   {run_dir / 'evidence'}",
        f"lineage:    {run_dir / 'lineage'}  (portable lineage {run_dir} --verify)",
        f"plots:      {run_dir / 'plots'}",
        f"report:     {run_dir / 'report.html'}",
    ]
    say("\n".join(lines), options=ui)


def _results_lines(run_dir: Path) -> list[str]:
    """Success rates per policy with their Wilson intervals, and the comparison table and verdict against the
    reference (reproduction.run.compare_cmd.run_results_lines)."""
    from reproduction.run.compare_cmd import run_results_lines
    from reproduction.run.runner import read_state

    lines = run_results_lines(run_dir, table=True)
    verdict = ((read_state(run_dir) or {}).get("stages", {}).get("compare", {}).get("summary") or {}).get("verdict")
    # the summary's verdict is the closing line's text: "reproduced" may carry its counts (rows shown but not counted)
    differs = isinstance(verdict, str) and verdict.split(" ", 1)[0] != "reproduced"
    return lines + (numerics_lines(run_dir.parent / "check.json") if differs else [])


def numerics_lines(check_json: Path) -> list[str]:
    """Why a CPU demo may not reproduce its reference evidence: when the demo's own `portable check` (`check_json`)
    measured that this CPU's pinned kernels compute other bits than the machines that made it (its host.cpu_numerics
    row), the demo trained other weights, and its comparison says so. [] when the bits are the reference's (the
    difference is then not the CPU's) or the row is not there."""
    try:
        rows = json.loads(Path(check_json).read_text(encoding="utf-8")).get("results") or []
        row = next(r for r in rows if r.get("name") == "host.cpu_numerics")
        digest, reference = row["details"]["digest"], row["details"]["reference"]
    except (OSError, ValueError, AttributeError, StopIteration, KeyError, TypeError):
        return []
    if digest == reference:
        return []
    return [
        f"note: this CPU computes other bits than the machines that made the reference evidence (numerics probe "
        f"{digest}, theirs {reference}), so the demo trained other weights here; README, 'CPU kernels'",
        "",
    ]
