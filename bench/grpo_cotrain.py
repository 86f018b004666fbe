"""The co-training demonstration (issue 23): GRPO in the simulator with and without an SFT term on "real" data.

    python bench/grpo_cotrain.py OUT [overrides ...]      e.g. rl.steps=60 rl.cotrain_weight=0.1

The "real" world is a physics variant of the simulator, FetchPush-v4:slippery (cube and table sliding friction
halved: reproduction/sim/tasks.py); the policy is not told which world it acts in (the same task string). Writes

    OUT/data/sft       30 FetchPush-v4 expert demonstrations (seed 0: bench/grpo_push.py's)
    OUT/data/real      30 FetchPush-v4:slippery expert demonstrations (seed 1: other start states), the "real" data
    OUT/run            sft: BC on both datasets (RL-Co's first stage) -> rl: GRPO in the simulator -> eval
    OUT/run_cotrain    sft: the same export, pinned -> rl: GRPO + rl.cotrain_weight x flow matching on OUT/data/real
                       (RL-Co's PPO + SFT form) -> eval

Both runs use bundle/grpo/config.yaml with the overrides given (rl.cotrain_* only reach the co-trained run; its
weight defaults to WEIGHT) and evaluate on eval.episodes_per_task held-out episodes in BOTH worlds (eval.tasks is
set to [FetchPush-v4, FetchPush-v4:slippery]: a variant's episode i starts where the simulator's does). Prints
each policy's success_at_end per world with its Wilson interval and the paired difference to the SFT policy (by
reset seed: episodes only it solved / only SFT solved), each stage's seconds, and last
`delta: real +X.XX with co-training, +Y.YY without; sim +A.AA with, +B.BB without (vs sft; goal: ...)`.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CONFIG = Path(__file__).resolve().parent.parent / "bundle" / "grpo" / "config.yaml"
SIM = "FetchPush-v4"
REAL = "FetchPush-v4:slippery"
"""The world that stands in for the real robot (its demonstrations are the co-training data)."""
DEMOS = 30
"""Expert demonstrations per world."""
WEIGHT = 0.02
"""Default rl.cotrain_weight: 1.0 and 0.1 held the policy at the SFT policy in both worlds (the flow-matching
gradient, ~0.8 at weight 1, took most of each clipped step); 0.02 left RL the step and kept the slippery world's
success while the simulator's rose (docs/grpo.md, Co-training). `rl.cotrain_weight=W` changes it."""
LABELS = ("sft", "grpo", "grpo+cotrain")


def overrides(out: Path, argv: list[str]) -> tuple[list[str], list[str]]:
    """(the plain run's overrides, the co-trained run's): BC on both datasets (an argv `sft.datasets=` replaces
    that), the user's argv, the co-training term off / on, both worlds evaluated (set last: the table needs both).
    The co-trained run pins the plain run's SFT export, so both GRPO runs start from the same weights."""
    first = ['sft.datasets=[{path: "${BUNDLE}/data/sft"}, {path: "${BUNDLE}/data/real"}]']
    last = [f"eval.tasks=[{SIM}, {REAL}]"]
    plain = [*first, *argv, "rl.cotrain_dataset=null", "rl.cotrain_weight=0", *last]
    cot = [
        *first,
        'rl.cotrain_dataset="${BUNDLE}/data/real"',
        f"rl.cotrain_weight={WEIGHT}",
        *argv,
        f'sft.export="{out / "run" / "sft" / "export"}"',
        *last,
    ]
    return plain, cot


def load(out: Path, run: Path, overrides_: list[str]) -> Any:
    """The GRPO run config of `run` (bundle/grpo/config.yaml, ${BUNDLE} = out). SystemExit naming the override
    when a co-trained run's weight is 0 (it would be the plain run again)."""
    from reproduction.recipes.grpo.config import GrpoRunConfig
    from reproduction.run.config import load_config

    config = load_config([CONFIG], overrides_, bundle=out, run_dir=run, schema=GrpoRunConfig)
    if config.sft.export and not config.rl.cotrain_weight > 0:
        raise SystemExit(f"rl.cotrain_weight={config.rl.cotrain_weight}: the co-trained run needs a weight > 0")
    return config


def generate(out: Path) -> None:
    """OUT/data/sft (the simulator's demonstrations) and OUT/data/real (the variant's), each unless present."""
    from reproduction.sim.generate import GenConfig, generate_dataset

    for name, task, seed in (("sft", SIM, 0), ("real", REAL, 1)):
        path = out / "data" / name
        if not path.exists():
            cfg = GenConfig(kind="sft", tasks=(task,), episodes_per_task=DEMOS, cameras=(), seed=seed)
            result = generate_dataset(cfg, path)
            print(f"{name}: {DEMOS} {task} demonstrations, expert success {result.success_rate:.2f}", file=sys.stderr)


def outcomes(evidence: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """{policy label: {task: {"k", "n", "wilson95", "seeds", "ends"}}} of one evidence file (primary and
    baselines); `ends` holds one bool per episode (success_at_end), in the order of `seeds`."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for entry in [evidence, *evidence.get("baselines", [])]:
        per_task = {}
        for task, row in entry["tasks"].items():
            m = row["success_at_end"]
            per_task[task] = {
                "k": m["successes"],
                "n": m["episodes"],
                "wilson95": m["wilson95"],
                "seeds": list(row["outcomes"]["reset_seeds"]),
                "ends": [c == "1" for c in row["outcomes"]["success_at_end"]],
            }
        out[entry["policy"]["label"]] = per_task
    return out


def paired(policy: dict[str, Any], base: dict[str, Any]) -> tuple[float, int, int]:
    """(difference of success rates, episodes only `policy` solved, only `base` solved), paired by reset seed.
    ValueError when the two did not run the same episodes."""
    if policy["seeds"] != base["seeds"]:
        raise ValueError("the two evaluations ran different episodes (reset seeds differ): nothing to pair")
    only_p = sum(p and not b for p, b in zip(policy["ends"], base["ends"]))
    only_b = sum(b and not p for p, b in zip(policy["ends"], base["ends"]))
    return (only_p - only_b) / max(len(policy["ends"]), 1), only_p, only_b


def combine(plain: dict[str, Any], cot: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """{sft, grpo, grpo+cotrain} from the two runs' outcomes. ValueError when the co-trained run's SFT policy did
    not give the plain run's results (it is the same export on the same episodes: anything else is a bug)."""
    if cot["sft"] != plain["sft"]:
        raise ValueError("the co-trained run's sft evaluation differs from the plain run's: not the same export?")
    return {"sft": plain["sft"], "grpo": plain["grpo"], "grpo+cotrain": cot["grpo"]}


def table(results: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """The result table (markdown), one row per policy, a success and a paired-difference column per world."""
    head = "| policy |" + "".join(
        f" {t} success_at_end (Wilson 95%) | vs sft (only it / only sft) |" for t in (SIM, REAL)
    )
    lines = [head, "|---|" + "---|---|" * 2]
    for label in LABELS:
        cells = []
        for task in (SIM, REAL):
            r = results[label][task]
            lo, hi = r["wilson95"]
            cells.append(f" {r['k']}/{r['n']} ({lo:.2f}-{hi:.2f}) |")
            if label == "sft":
                cells.append(" |")
            else:
                d, a, b = paired(r, results["sft"][task])
                cells.append(f" {d:+.2f} ({a} / {b}) |")
        lines.append(f"| {label} |" + "".join(cells))
    return lines


def delta_line(results: dict[str, dict[str, dict[str, Any]]]) -> str:
    """The last line: each GRPO policy's paired difference to SFT in the real world, then in the simulator."""
    d = {
        (label, task): paired(results[label][task], results["sft"][task])[0]
        for label in LABELS[1:]
        for task in (SIM, REAL)
    }
    return (
        f"delta: real {d['grpo+cotrain', REAL]:+.2f} with co-training, {d['grpo', REAL]:+.2f} without; "
        f"sim {d['grpo+cotrain', SIM]:+.2f} with, {d['grpo', SIM]:+.2f} without "
        "(vs sft; goal: real >= 0 with co-training while sim rises)"
    )


def _stage(stage: Any) -> str:
    """`name seconds`, or `name skipped` for a stage a resumed run found complete (its seconds are not this run's)."""
    return f"{stage.name} skipped" if stage.action == "skipped" else f"{stage.name} {stage.seconds:.0f}"


def _run(config: Any, run: Path) -> tuple[dict[str, Any], Any, float]:
    from reproduction.recipes.grpo import GRPO
    from reproduction.run.runner import RunOptions, run_recipe

    t0 = time.perf_counter()
    report = run_recipe(GRPO, config, run, RunOptions(resume=run.exists()))
    wall = time.perf_counter() - t0
    stage = next(s for s in report.stages if s.name == "eval")
    evidence = json.loads((run / stage.output.summary["evidence"]).read_text(encoding="utf-8"))
    return outcomes(evidence), report, wall


def main(argv: list[str]) -> int:
    from reproduction.numerics import pin_cpu_kernels

    pin_cpu_kernels()  # the kernels `portable run` pins, before torch loads: the bits the CLI trains (grpo_push.py)
    out = Path(argv[0]).resolve()
    plain_ov, cot_ov = overrides(out, argv[1:])
    plain_cfg = load(out, out / "run", plain_ov)  # both checked before anything runs (the export comes later)
    cot_cfg = load(out, out / "run_cotrain", cot_ov)
    generate(out)
    plain, plain_report, plain_wall = _run(plain_cfg, out / "run")
    cot, cot_report, cot_wall = _run(cot_cfg, out / "run_cotrain")
    results = combine(plain, cot)
    print(f"sim = {SIM}, real = {REAL}; BC on both worlds' demonstrations, then GRPO in sim from the same export")
    print("\n".join(table(results)))
    for name, report, wall in (("run", plain_report, plain_wall), ("run_cotrain", cot_report, cot_wall)):
        print(f"seconds {name}: " + ", ".join(_stage(s) for s in report.stages) + f"; wall {wall:.0f}")
    print(delta_line(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
