"""`portable demo --recipe grpo`: GRPO from scratch on CPU, with no download, from a packed bundle.

Generates scripted FetchPush-v4 demonstrations in the simulator (rendering the cameras the config's
sft.model.cameras read: none by default), packs them with a source snapshot and the run configs into the GRPO
bundle (bundle/grpo.toml), restores a copy elsewhere, runs `check` on it, then runs the
GRPO recipe through the runner from the restored bundle (its config/run.yaml = bundle/grpo/config.yaml;
`--quick` layers config/quick.yaml = bundle/grpo/quick.yaml on it): sft (BC on the demonstrations) -> rl (GRPO
in the simulator) -> eval (sft and grpo on the same held-out episodes) -> compare (against eval.reference when
one is given), with the plots and report.html the runner writes after the stages, and prints the rates. The steps
are RECAP's demo's (reproduction/recipes/recap/demo.py: pack, restore, check), so the lineage names the bundle
manifest and its source layer, and a file of the restored bundle changed after restore stops the run with
`portable verify`'s exit code. A rerun reuses what is valid (the data by its stamp, the bundle by its sources'
stamp, the restore by its receipt, the run by its stage keys; a stage whose key changed is redone with what
follows).

    <output>/
      demo.json             marks a folder this demo built
      src/                  data/sft/ (the demonstrations), project/, configs/{run,quick}.yaml, evidence/README.md
      bundle/               the packed bundle
      restored/grpo-demo/   the same bundle copied elsewhere and restored there
      check.json            `portable check` on the restored bundle
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

from reproduction.recipes.recap.demo import check_checkout as _check_checkout
from reproduction.release.weights_manifest import project_root
from reproduction.ui import UiOptions, say

DATA = project_root()
"""The folder holding the checkout's data folders (bundle/); a non-editable install has none."""
SPEC = DATA / "bundle" / "grpo.toml"
CONFIGS = DATA / "bundle" / "grpo"
NEEDS = ("bundle/grpo.toml", "bundle/grpo/config.yaml", "bundle/grpo/quick.yaml")
"""What the GRPO demo reads from the checkout's data folders."""


def check_checkout() -> None:
    """InputNotFoundError (exit 3) naming the first of NEEDS missing, before any work (audit60 N1)."""
    _check_checkout(NEEDS)


MARKER = "demo.json"
RESTORED = "grpo-demo"
"""The restored bundle's folder name under <output>/restored/ (the spec's name)."""
SNAPSHOT = ("recipes/grpo", "recap", "sim", "data")
"""The code the bundle pins as its source layer (under reproduction/; the runner itself is not in it)."""
README = (
    b"Reference evidence of the GRPO demo: none yet (eval.reference stays null, and the compare stage records that\n"
    b"there was none). A file placed here is packed with the bundle; `portable run ... eval.reference=FILE` compares\n"
    b"the run's evaluation with it.\n"
)


@dataclass(kw_only=True, slots=True, frozen=True)
class DemoData:
    """The demonstrations the simulator generates for the SFT stage."""

    sft_episodes: int = 30
    """Scripted expert episodes per task (30: BC reaches ~25% push success, room for RL; docs/grpo.md)."""
    tasks: tuple[str, ...] = ("FetchPush-v4",)
    seed: int = 0
    cameras: tuple[str, ...] = ()
    """Simulator cameras rendered into the demonstrations: those the run config's sft.model.cameras read."""
    image_size: int = 64
    """Their resolution: the model's (sft.model.render_size)."""


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
    from reproduction.fsio import make_output_folder

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
    src = out / "src"
    data = _with_cameras(QUICK if quick else FULL, src, quick, list(overrides or []))  # a bad override: nothing made
    make_output_folder(out, command="demo")
    marker.write_text(json.dumps({"recipe": "grpo", "quick": quick}) + "\n")
    steps: list[tuple[str, str, float]] = []
    t_all = time.perf_counter()

    def step(name: str, fn: Callable[[], str]) -> None:
        t0 = time.perf_counter()
        what = fn()
        steps.append((name, what, time.perf_counter() - t0))
        say(f"demo: {name}: {what} ({time.perf_counter() - t0:.1f} s)", options=ui)

    from reproduction.recipes.recap.demo import _check, _pack, _restore  # RECAP's demo steps, shared

    bundle, restored = out / "bundle", out / "restored" / RESTORED
    step("generate", lambda: _generate(src / "data" / "sft", data))
    _write_sources(src)
    step("pack", lambda: _pack(src, bundle, ui=ui, spec=SPEC))
    step("restore", lambda: _restore(bundle, restored, ui=ui))
    step("check", lambda: _check(restored, out / "check.json", ui=ui))
    run_dir = out / "run"
    t0 = time.perf_counter()
    report = _run(restored, run_dir, quick=quick, overrides=list(overrides or []), ui=ui)
    steps += [(f"run: {s.name}", s.action, s.seconds) for s in report.stages]
    steps.append(("run (total)", "", time.perf_counter() - t0))
    step("plots and report", lambda: _report(report))
    steps.append(("demo (total)", "", time.perf_counter() - t_all))
    configs = " ".join(f"--config {p}" for p in _config_files(restored, quick))
    resume = f"portable run {restored} {configs} --output {run_dir} --resume --target-step N"
    _summary(steps, run_dir, ui=ui, resume=resume, bundle=bundle)
    print(run_dir)
    return 0


def _with_cameras(data: DemoData, src: Path, quick: bool, overrides: list[str]) -> DemoData:
    """`data` rendering the cameras the run's policy reads (bundle/grpo's configs with `overrides`: sft.model.cameras
    at sft.model.render_size); unchanged for a camera-free policy. Raises what the config loader raises."""
    from dataclasses import replace

    from reproduction.recipes.grpo.config import GrpoRunConfig, camera_names
    from reproduction.run.config import load_config

    files = [CONFIGS / "config.yaml"] + ([CONFIGS / "quick.yaml"] if quick else [])
    model = load_config(files, overrides, bundle=src, run_dir=src / "run", schema=GrpoRunConfig).sft.model
    cameras = camera_names(model.cameras)
    return replace(data, cameras=cameras, image_size=model.render_size) if cameras else data


def _generate(root: Path, data: DemoData) -> str:
    """Scripted demonstrations at `root`; reused when the stamp (settings + simulator code) matches. The stamp file
    is <root>/../../generated.json (src/generated.json: outside the packed data, left out of pack's stamp)."""
    from reproduction.fsio import atomic_write_text
    from reproduction.run.stage_keys import module_digest
    from reproduction.sim.generate import GenConfig, generate_dataset

    modules = ("generate", "env", "experts", "episode", "tasks", "seeds")
    fields = asdict(data)
    if not data.cameras:  # a camera-free demo keeps the stamp it had before cameras existed
        del fields["cameras"], fields["image_size"]
    doc = {"data": fields, "code": [module_digest(f"reproduction.sim.{m}") for m in modules]}
    stamp = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
    done = root.parent.parent / "generated.json"
    if done.is_file() and root.is_dir() and json.loads(done.read_text()).get("stamp") == stamp:
        return "reused"
    shutil.rmtree(root, ignore_errors=True)
    cfg = GenConfig(
        kind="sft",
        tasks=data.tasks,
        episodes_per_task=data.sft_episodes,
        seed=data.seed,
        cameras=tuple(data.cameras),
        image_size=data.image_size,
    )
    result = generate_dataset(cfg, root)
    atomic_write_text(done, json.dumps({"stamp": stamp}) + "\n")
    return f"{result.episodes} episodes, {result.frames} frames"


def _write_sources(src: Path) -> None:
    """The bundle's other sources beside the data: the source snapshot (SNAPSHOT; a file the tree no longer holds
    is removed), configs/run.yaml and quick.yaml (bundle/grpo/config.yaml and quick.yaml) and evidence/README.md.
    Unchanged files keep their mtime, so pack is reused."""
    from reproduction.recipes.recap.demo import put_if_changed as put
    from reproduction.recipes.recap.demo import sync_snapshot

    sync_snapshot(src / "project", SNAPSHOT)
    put(src / "configs" / "run.yaml", (CONFIGS / "config.yaml").read_bytes())
    put(src / "configs" / "quick.yaml", (CONFIGS / "quick.yaml").read_bytes())
    put(src / "evidence" / "README.md", README)


def _config_files(restored: Path, quick: bool) -> list[Path]:
    """The restored bundle's run configs: config/run.yaml, and config/quick.yaml layered on it with --quick."""
    return [restored / "config" / "run.yaml"] + ([restored / "config" / "quick.yaml"] if quick else [])


def _run(restored: Path, run_dir: Path, *, quick: bool, overrides: list[str], ui: UiOptions | None) -> Any:
    """The recipe through the runner from the restored bundle (${BUNDLE}; lineage records its manifest and source
    layer), resumed when the folder holds a run; a stage whose key changed (new code, config or data since the last
    demo here) is redone with what follows, where `portable run --resume` refuses."""
    from reproduction.recipes.grpo import RECIPE
    from reproduction.recipes.grpo.config import GrpoRunConfig
    from reproduction.run.config import load_config
    from reproduction.run.record import make_recorder
    from reproduction.run.runner import RunOptions, read_state, run_recipe_redoing_changed
    from reproduction.run.stage_decide import config_layers

    files = _config_files(restored, quick)
    layers = config_layers(files)  # hashed as read, not when a stage completes (audit52 review R8)
    config = load_config(files, overrides, bundle=restored, run_dir=run_dir, schema=GrpoRunConfig)
    resume = run_dir.is_dir() and read_state(run_dir) is not None
    argv = ["portable", "demo", "--recipe", "grpo", *(["--quick"] if quick else []), *overrides]
    opts = RunOptions(
        resume=resume,
        argv=argv,
        ui=ui,
        recorder=make_recorder(restored),
        recipe_ref="grpo",
        config_files=layers,  # a later `portable run --resume` without quick.yaml is told (I4)
    )
    return run_recipe_redoing_changed(RECIPE, config, run_dir, opts)


def _report(run: Any) -> str:
    """Where the run's plots and report.html are: the runner wrote them after the stages (Recipe.report), or left
    them when it redid nothing; a report that failed was a warning line of the run's."""
    return f"-> {run.report}" if run.report is not None else "not written (see the warning above)"


def _summary(
    steps: list[tuple[str, str, float]], run_dir: Path, *, ui: UiOptions | None, resume: str, bundle: Path
) -> None:
    from reproduction.recipes.grpo.report import improvement_lines, newest_evidence
    from reproduction.recipes.recap.demo import step_table
    from reproduction.run.compare_cmd import run_results_lines

    lines = step_table(steps)
    lines.append("")
    lines += run_results_lines(run_dir, table=True)
    newest = newest_evidence(run_dir)
    if newest is not None:
        lines += [*improvement_lines(json.loads(newest.read_text(encoding="utf-8"))), ""]
    lines += [
        f"bundle:     {bundle}  (bundle/grpo.toml; restored copy: {bundle.parent / 'restored' / RESTORED})",
        f"run folder: {run_dir}",
        f"evidence:   {run_dir / 'evidence'}  (eval_grpo_<step>.json: grpo, baseline sft, the same held-out seeds)",
        f"lineage:    {run_dir / 'lineage'}  (portable lineage {run_dir} --verify)",
        f"report:     {run_dir / 'report.html'}",
        f"train on:   {resume}",
    ]
    say("\n".join(lines), options=ui)
