"""The GRPO result experiment: BC on 30 scripted push demonstrations, then GRPO, both evaluated on held-out seeds.

    python bench/grpo_push.py OUT [overrides ...]     e.g. rl.steps=100 rl.seed=1
    python bench/grpo_push.py OUT --target-step 140   continue OUT's finished run to step 140

Generates OUT/data/sft (30 FetchPush-v4 expert episodes, state only) unless present, runs the GRPO recipe
(bundle/grpo/config.yaml, ${BUNDLE} = OUT) through the runner into OUT/run, and prints the success of the
SFT and the GRPO policy on the same held-out episodes, each stage's seconds, and last
`delta: +X.XX (goal >= +0.20 within 20 minutes on 2 cores)`.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CONFIG = Path(__file__).resolve().parent.parent / "bundle" / "grpo" / "config.yaml"


def main(argv: list[str]) -> int:
    from reproduction.numerics import pin_cpu_kernels

    # The kernels `portable run` and `portable demo` pin (AVX2 unless PORTABLE_CPU_KERNELS=native), before torch
    # loads: the same config trains the same bits here as through the CLI (before 2026-12-04 this ran native ones).
    pin_cpu_kernels()
    from reproduction.recipes.grpo import GRPO
    from reproduction.recipes.grpo.config import GrpoRunConfig
    from reproduction.run.config import load_config
    from reproduction.run.runner import RunOptions, run_recipe
    from reproduction.sim.generate import GenConfig, generate_dataset

    target_step = None
    if "--target-step" in argv:
        at = argv.index("--target-step")
        value = argv[at + 1] if at + 1 < len(argv) else ""
        if not value.isdigit() or int(value) < 1:
            print(f"error: --target-step needs a step number >= 1, got {value!r}", file=sys.stderr)
            return 2
        target_step = int(value)
        argv = argv[:at] + argv[at + 2 :]
    if not argv:
        print("error: no OUT folder given (python bench/grpo_push.py OUT [overrides ...])", file=sys.stderr)
        return 2
    out = Path(argv[0]).resolve()
    sft = out / "data" / "sft"
    if not sft.exists():
        generate_dataset(GenConfig(kind="sft", tasks=("FetchPush-v4",), episodes_per_task=30, cameras=()), sft)
    run = out / "run"
    config = load_config([CONFIG], argv[1:], bundle=out, run_dir=run, schema=GrpoRunConfig)
    t0 = time.perf_counter()
    report = run_recipe(GRPO, config, run, RunOptions(resume=run.exists(), target_step=target_step))
    wall = time.perf_counter() - t0
    evidence = json.loads((run / report.stages[2].output.summary["evidence"]).read_text(encoding="utf-8"))
    rates = {e["policy"]["label"]: e["metrics"]["success_at_end"] for e in [evidence, *evidence["baselines"]]}
    for label, m in rates.items():
        print(f"{label}: success_at_end {m['display']}, Wilson 95% {m['wilson95']}")
    print("seconds: " + ", ".join(f"{s.name} {s.seconds:.0f}" for s in report.stages) + f"; wall {wall:.0f}")
    print(f"delta: {rates['grpo']['rate'] - rates['sft']['rate']:+.2f} (goal >= +0.20 within 20 minutes on 2 cores)")
    return 0


if __name__ == "__main__":
    from reproduction.errors import PortableError, render_error

    try:
        sys.exit(main(sys.argv[1:]))
    except PortableError as exc:  # the CLI's one-line form (a changed config on resume, a bad override, ...)
        sys.exit(render_error(exc))
