"""Bench the runner's overhead: `run_recipe` over stage 1 against calling the stage function directly.

The same LeRobot dataset (1,000,000 frames, 5,000 episodes, v3.0) goes through (a) open_dataset +
compute_returns into a fresh folder, and (b) the RECAP recipe's returns stage through run_recipe into
a fresh run folder: preflight, opening the dataset, the stage key (fingerprint, config, code digests),
run.json writes, hashing the outputs. Stage 1 is the cheapest stage, so this is the runner's worst
case; the training stages dwarf it. Prints both times (wall: best of ROUNDS rounds alternating the
sides; CPU: best of REPEAT) and last
`ratio: X.XX (goal <= 1.05)`.

Where the runner's own 8-10 ms goes (timestamps between the statements of run_recipe and _run_stage, 40 runs on 2
quiet cores, 2026-12-03): the run.json writes 1.8 ms (`running`) and 1.9 ms (`complete`), 0.8 ms of each the fsync
(os.fsync timed alone; it keeps a crash from leaving a torn run.json where the old one was); the stage key 1.7 ms
(the dataset's content digest against its on-disk cache, the code modules' digests); preflight beyond opening the
dataset 1.9 ms; hashing and listing the outputs 1.3 ms; to_plain 0.4, output_free_keys 0.3, the lock and leaving the
run 0.5. The Python parts cost several times what they cost timed alone (the stage key 0.3 ms, to_plain 0.25): the
stage before them has streamed 1M frames through the CPU's caches. Redacting and encoding the config once per run
instead of at every write (the same run.json bytes) took the second write to 1.4 ms and left the ratio at 1.07
(noise +-0.01), so it was not kept.

The ratio did not grow with the recipes redesign: on 2026-12-04, quiet, the bench as it stood at c227736 (the last
commit before RECAP left run/, where 1.03 had been measured on 2026-12-01) printed 1.08, 1.06, 1.09 against 1.07,
1.08, 1.08 for bfd2a7a, run after one another in the same ten minutes: the 1.03 was the machine of that day.

What removing a piece would buy, measured on 2026-12-05 (alternated best-of-20 rounds, quiet; the pieces
monkeypatched out, not kept): the `running` write's fsync about 0.5-1 ms (two A/B runs: ratio 1.093 and 1.080 with
it, 1.078 and 1.072 without, 1.074 and 1.060 with it made in a thread while the stage runs), run.json written
compact with the C encoder instead of indented and without redaction nothing measurable (65.15 against 65.16 ms),
preflight's second config conversion 0.2 ms. The fsync keeps a power loss from tearing run.json and losing the run's
completed stages; the goal at this stage size (<= 3 ms of a ~60 ms stage) is not met on this machine without giving
that up.

Where the rest goes (2026-12-06, quiet): the disk. On this machine an atomic write of 5 KB with fsync before the
rename took a median 1.7-1.9 ms in a loop of such writes (rename then fsync 0.45-1.07 ms, no fsync 0.07-0.15 ms),
and inside the runner the `complete` write, fsync first, took 1.65 ms of its ~4 ms (1.02 ms when its fsync came
after the rename; timestamps between run_recipe's statements, 80 runs). The stage
itself fsyncs its stats.json. A branch that cut the runner's Python work per run by ~10% of its instructions
(callgrind: 15.0 -> 13.6 million over direct per run; run.json encoded by the C encoder a part at a time, the
`running` record's fsync in a thread beside the stage, config walks and realpath memoised) moved the median
runner-minus-direct difference from 4.03 / 4.81 ms to 3.78 / 4.09 ms (300 alternated pairs each, twice): within
the noise, since a journal commit in a thread delays the stage's own fsync behind it. It was not kept. The goal
(<= 3 ms at this stage size) is not met on this disk without writing run.json's records less durably.

Re-measured on 2026-12-07 at 340bfc1, quiet (load 0.5): ratio 1.12, CPU ratio 1.11 (52 -> 58 ms wall, 58 -> 65 ms
CPU): the overhead is CPU time, not waiting. Process-time medians of the pieces over 40 alternated runs (each
piece's function wrapped with a timer in a scratch script, not kept): run.json's two writes 1.6 ms (the two fsyncs
0.4 of it), the stage key 0.9, hashing the outputs 0.8, RECAP's preflight beyond opening the dataset 0.45, the rest
(config walks, lock, watch, announce) about 1.7; the stage itself costs inside the runner what it costs called
directly (47.2 against 47.6 ms). Even with every Python piece halved the ratio would stay near 1.07 at this size.

ROUNDS was 15 until 2026-12-06: three runs of the same code then printed 1.02, 1.15 and 1.10; with 40 rounds
1.07, 1.09, 1.07 (one fsync-heavy side's best of few rounds is luck).

The runner side runs without lineage (no recorder) and without the recipe's report (Recipe.report set to None), as
the runner's own cost; a third side, `runner + report`, adds the report `portable run` writes after the stages
(report.html through Jinja, an atomic write with fsync), printed on its own line before the ratio.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
from _timing import REPEAT, alternate, best, machine_note  # noqa: E402

FRAMES, EPISODES = 1_000_000, 5_000
ROUNDS = max(REPEAT, 40)


def make_dataset(root: Path) -> Path:
    from reproduction.data.writer import EpisodeData, write_dataset

    rng = np.random.default_rng(0)
    lengths = rng.multinomial(FRAMES - 10 * EPISODES, np.full(EPISODES, 1 / EPISODES)) + 10
    eps = (
        EpisodeData(
            episode_index=e,
            task=f"task {e % 5}",
            frames={
                "observation.state": np.zeros((n, 2), np.float32),
                "is_success": np.full(n, rng.random() < 0.6),
            },
        )
        for e, n in enumerate(lengths)
    )
    feats = {"observation.state": {"dtype": "float32", "shape": [2]}, "is_success": {"dtype": "bool", "shape": [1]}}
    return write_dataset(root, eps, fps=10, features=feats)


def main() -> None:
    from reproduction.data.reader import open_dataset
    from reproduction.recap.returns import ReturnsConfig, compute_returns
    from reproduction.recipes.recap.config import load_config
    from reproduction.recipes.recap.recipe import RECAP
    from reproduction.run.runner import RunOptions, run_recipe

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        ds_path = make_dataset(tmp / "roll")
        open_dataset(ds_path).fingerprint  # warm the fingerprint cache both paths share
        config = load_config(None, [f"datasets=[{{path: {ds_path}, type: rollout}}]"])
        counter = iter(range(10**6))

        def direct() -> None:
            out = tmp / f"direct{next(counter)}"
            ds = open_dataset(ds_path)
            compute_returns([ds], out, ReturnsConfig(), types=["rollout"])
            shutil.rmtree(out)

        bare = dataclasses.replace(RECAP, report=None)

        def runner(recipe=bare) -> None:
            out = tmp / f"run{next(counter)}"
            run_recipe(recipe, config, out, RunOptions(stages=["returns"]))
            shutil.rmtree(out)

        def reported() -> None:
            runner(RECAP)

        direct()
        reported()  # warm imports (the report's too)
        # Each side takes ~0.1 s, so a burst of other load would decide a side's best if the sides ran
        # one after the other: alternate them, ROUNDS times.
        walls = alternate({"direct": direct, "runner": runner, "report": reported}, ROUNDS)
        d_wall, r_wall, p_wall = walls["direct"], walls["runner"], walls["report"]
        d_cpu, r_cpu, p_cpu = best(direct, REPEAT)[1], best(runner, REPEAT)[1], best(reported, REPEAT)[1]
    print(f"machine: {machine_note()}; best of {ROUNDS} alternated rounds (CPU: best of {REPEAT})")
    print(f"stage 1 direct:  {d_wall * 1000:.0f} ms wall, {d_cpu * 1000:.0f} ms CPU ({FRAMES:,} frames)")
    print(f"stage 1 runner:  {r_wall * 1000:.0f} ms wall, {r_cpu * 1000:.0f} ms CPU")
    print(f"stage 1 runner + report.html:  {p_wall * 1000:.0f} ms wall, {p_cpu * 1000:.0f} ms CPU")
    print(f"with the report: ratio {p_wall / d_wall:.2f}, cpu ratio {p_cpu / d_cpu:.2f}")
    print(f"cpu ratio: {r_cpu / d_cpu:.2f}")
    print(f"ratio: {r_wall / d_wall:.2f} (goal <= 1.05)")


if __name__ == "__main__":
    main()
