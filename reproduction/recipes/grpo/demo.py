"""`portable demo --recipe grpo`: GRPO from scratch on CPU, with no download.

Generates scripted FetchPush-v4 demonstrations in the simulator, then runs the GRPO recipe through the runner
(bundle/grpo/config.yaml; `--quick` layers bundle/grpo/quick.yaml on it): sft (BC on the demonstrations) -> rl
(GRPO in the simulator) -> eval (sft and grpo on the same held-out episodes) -> compare (against eval.reference
when one is given), then writes the plots and report.html and prints the rates. A rerun reuses what is valid (the
data by its stamp, the run by its stage keys; a stage whose key changed is redone with what follows).

Unlike the RECAP demo it packs, restores and checks no bundle: <output>/bundle is a plain folder standing in for
${BUNDLE}, so `portable run <output>/bundle --config ... --output <output>/run --resume --target-step N` (printed at
the end) trains the demo's run on.

    <output>/
      demo.json             marks a folder this demo built
      bundle/data/sft/      the demonstrations (LeRobot, state only)
      run/                  run.json, sft/ rl/ eval/ compare/, evidence/, lineage/, plots/, report.html
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from reproduction.ui import UiOptions, say

REPO = Path(__file__).resolve().parents[3]
CONFIGS = REPO / "bundle" / "grpo"
MARKER = "demo.json"


@dataclass(kw_only=True, slots=True, frozen=True)
class DemoData:
    """The demonstrations the simulator generates for the SFT stage."""

    sft_episodes: int = 30
    """Scripted expert episodes per task (30: BC reaches ~25% push success, room for RL; docs/grpo.md)."""
    tasks: tuple[str, ...] = ("FetchPush-v4",)
    seed: int = 0


FULL = DemoData()
QUICK = DemoData(sft_episodes=3)


def run_demo(
    output: Path | None, *, quick: bool = False, overrides: list[str] | None = None, ui: UiOptions | None = None
) -> int:
    """Build and run the GRPO demo under `output` (default ./runs/demo-grpo, or ./runs/demo-grpo-quick); see the
    module docstring. Prints the step table and the rates on stderr, the run folder on stdout; returns 0. Raises
    RunStateError for an output that is a file or a non-empty folder this demo did not build, and what the config
    loader and the runner raise."""
    from reproduction.errors import RunStateError

    out = Path(output or Path("runs") / ("demo-grpo-quick" if quick else "demo-grpo")).absolute()
    if out.exists() and not out.is_dir():
        raise RunStateError(f"output {out} is a file, not a folder", path=out, hint="pass a folder with --output")
    marker = out / MARKER
    mine = marker.is_file() and json.loads(marker.read_text()).get("recipe") == "grpo"
    if out.is_dir() and any(out.iterdir()) and not mine:
        raise RunStateError(
            f"{out} is not empty and is not a GRPO demo folder (no {MARKER} naming recipe grpo)",
            path=out,
            hint="pass a new or empty folder with --output, or the folder of an earlier GRPO demo to reuse it",
        )
    out.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps({"recipe": "grpo", "quick": quick}) + "\n")
    steps: list[tuple[str, str, float]] = []
    t_all = time.perf_counter()

    def step(name: str, fn: Callable[[], str]) -> None:
        t0 = time.perf_counter()
        what = fn()
        steps.append((name, what, time.perf_counter() - t0))
        say(f"demo: {name}: {what} ({time.perf_counter() - t0:.1f} s)", options=ui)

    bundle = out / "bundle"
    step("generate", lambda: _generate(bundle / "data" / "sft", QUICK if quick else FULL))
    run_dir = out / "run"
    t0 = time.perf_counter()
    report = _run(bundle, run_dir, quick=quick, overrides=list(overrides or []), ui=ui)
    steps += [(f"run: {s.name}", s.action, s.seconds) for s in report.stages]
    steps.append(("run (total)", "", time.perf_counter() - t0))
    step("plots and report", lambda: _report(run_dir))
    steps.append(("demo (total)", "", time.perf_counter() - t_all))
    configs = " ".join(f"--config {CONFIGS / n}" for n in ("config.yaml", *(("quick.yaml",) if quick else ())))
    resume = f"portable run {bundle} {configs} --output {run_dir} --resume --target-step N"
    _summary(steps, run_dir, ui=ui, resume=resume)
    print(run_dir)
    return 0


def _generate(root: Path, data: DemoData) -> str:
    """Scripted demonstrations at `root`; reused when the stamp (settings + simulator code) matches."""
    from reproduction.fsio import atomic_write_text
    from reproduction.run.runner import module_digest
    from reproduction.sim.generate import GenConfig, generate_dataset

    modules = ("generate", "env", "experts", "episode", "tasks", "seeds")
    doc = {"data": asdict(data), "code": [module_digest(f"reproduction.sim.{m}") for m in modules]}
    stamp = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
    done = root.parent / "sft.generated.json"
    if done.is_file() and root.is_dir() and json.loads(done.read_text()).get("stamp") == stamp:
        return "reused"
    shutil.rmtree(root, ignore_errors=True)
    cfg = GenConfig(kind="sft", tasks=data.tasks, episodes_per_task=data.sft_episodes, seed=data.seed, cameras=())
    result = generate_dataset(cfg, root)
    atomic_write_text(done, json.dumps({"stamp": stamp}) + "\n")
    return f"{result.episodes} episodes, {result.frames} frames"


def _run(bundle: Path, run_dir: Path, *, quick: bool, overrides: list[str], ui: UiOptions | None) -> Any:
    """The recipe through the runner, resumed when the folder holds a run; a stage whose key changed (new code,
    config or data since the last demo here) is redone with what follows, where `portable run --resume` refuses."""
    from reproduction.recipes.grpo import RECIPE
    from reproduction.recipes.grpo.config import GrpoRunConfig
    from reproduction.run.config import load_config
    from reproduction.run.record import make_recorder
    from reproduction.run.runner import RunOptions, read_state, run_recipe_redoing_changed

    files = [CONFIGS / "config.yaml"] + ([CONFIGS / "quick.yaml"] if quick else [])
    config = load_config(files, overrides, bundle=bundle, run_dir=run_dir, schema=GrpoRunConfig)
    resume = run_dir.is_dir() and read_state(run_dir) is not None
    argv = ["portable", "demo", "--recipe", "grpo", *(["--quick"] if quick else []), *overrides]
    opts = RunOptions(resume=resume, argv=argv, ui=ui, recorder=make_recorder(None), recipe_ref="grpo")
    return run_recipe_redoing_changed(RECIPE, config, run_dir, opts)


def _report(run_dir: Path) -> str:
    from reproduction.recipes.grpo.report import write_run_report

    return f"-> {write_run_report(run_dir)}"


def _summary(steps: list[tuple[str, str, float]], run_dir: Path, *, ui: UiOptions | None, resume: str) -> None:
    from reproduction.recipes.grpo.report import improvement_lines, newest_evidence
    from reproduction.run.compare_cmd import run_results_lines

    width = max(len(s[0]) for s in steps)
    lines = ["", f"{'step':<{width}}  {'result':<40}  seconds"]
    lines += [f"{name:<{width}}  {what[:40]:<40}  {sec:7.1f}" for name, what, sec in steps]
    lines.append("")
    lines += run_results_lines(run_dir, table=True)
    newest = newest_evidence(run_dir)
    if newest is not None:
        lines += [*improvement_lines(json.loads(newest.read_text(encoding="utf-8"))), ""]
    lines += [
        f"run folder: {run_dir}",
        f"evidence:   {run_dir / 'evidence'}  (eval_grpo_<step>.json: grpo, baseline sft, the same held-out seeds)",
        f"lineage:    {run_dir / 'lineage'}  (portable lineage {run_dir} --verify)",
        f"report:     {run_dir / 'report.html'}",
        f"train on:   {resume}",
    ]
    say("\n".join(lines), options=ui)
