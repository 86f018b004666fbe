"""Run `portable ARGS` in this process with a kill -9 planted at one named point of one stage.

    python tests/kill_points.py POINT -- run --config ... --output ...

The seam is the test's, not production's: library functions (the checkpoint save, the export, the
sidecar and evidence writers, the simulator's batches) are wrapped here before `portable`'s main runs,
and at the chosen call the whole process group gets SIGKILL (the run and any worker it started), the
same as `kill -9` from outside. POINTS names each point: (stage, module, function, which call, when).
`when` is "before" (die instead of calling: e.g. DCP shards written, no manifest yet), "after" (die
right after it returned) or "half" (write the first half of the file's text to a temp file beside it,
as an interrupted atomic write leaves it, then die).
"""

from __future__ import annotations

import functools
import importlib
import os
import signal
import sys
from pathlib import Path

# name -> (stage, module, attribute, nth call within that stage, when)
POINTS: dict[str, tuple[str, str, str, int, str]] = {
    "returns_sidecar": ("returns", "reproduction.recap.sidecars", "write_sidecar", 1, "after"),
    "value_dcp_save": ("value", "reproduction.train.checkpoint", "_manifest", 2, "before"),
    "value_export": ("value", "safetensors.torch", "save_file", 1, "after"),
    "value_second_fold": ("value", "reproduction.train.checkpoint", "export", 1, "after"),
    "advantages_values": ("advantages", "reproduction.recap.value.stage", "infer_values", 1, "after"),
    "advantages_sidecar": ("advantages", "reproduction.recap.sidecars", "write_mixture_config", 1, "before"),
    "policy_setup": ("policy", "reproduction.recap.policy.setup", "atomic_write_text", 1, "half"),
    "policy_dcp_save": ("policy", "reproduction.train.checkpoint", "_manifest", 1, "before"),
    "policy_export": ("policy", "safetensors.torch", "save_file", 1, "after"),
    "policy_second_mode": ("policy", "reproduction.train.checkpoint", "_manifest", 3, "before"),
    "eval_episodes": ("eval", "reproduction.sim.evaluate", "run_batch", 1, "after"),
    "eval_second_policy": ("eval", "reproduction.sim.evaluate", "run_batch", 2, "after"),
    "eval_evidence_write": ("eval", "reproduction.run.evidence", "atomic_write_text", 1, "half"),
}
GRPO_POINTS: dict[str, tuple[str, str, str, int, str]] = {
    "rl_dcp_save": ("rl", "reproduction.train.checkpoint", "_manifest", 2, "before"),
    "rl_first_dcp_save": ("rl", "reproduction.train.checkpoint", "_manifest", 1, "before"),
}
"""The GRPO recipe's points (tests/test_grpo_kill.py), apart from POINTS, which tests/test_run_kill.py runs on RECAP."""


def die() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.killpg(os.getpgrp(), signal.SIGKILL)


def _half_written(path: Path, text: str) -> None:
    """What a kill in the middle of fsio.atomic_write_* leaves: a partial temp file, the target untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.parent / f".{path.name}.{os.getpid()}.killedxx.portable-tmp").write_text(
        text[: len(text) // 2]
    )  # fsio's name


def plant(point: str) -> None:
    """Wrap the point's function so that its nth call inside its stage kills the process group."""
    import reproduction.run.runner as runner
    from reproduction.recipe import StageSpec

    stage, module, attr, nth, when = {**POINTS, **GRPO_POINTS}[point]
    current = {"stage": None, "calls": 0}
    run_stage = runner._run_stage

    @functools.wraps(run_stage)
    def tracking(*args, **kwargs):
        current["stage"] = next(a for a in (*args, *kwargs.values()) if isinstance(a, StageSpec)).name
        try:
            return run_stage(*args, **kwargs)
        finally:
            current["stage"] = None

    runner._run_stage = tracking
    mod = importlib.import_module(module)
    original = getattr(mod, attr)

    @functools.wraps(original)
    def wrapped(*args, **kwargs):
        if current["stage"] != stage:
            return original(*args, **kwargs)
        current["calls"] += 1
        if current["calls"] != nth:
            return original(*args, **kwargs)
        if when == "before":
            die()
        if when == "half":
            _half_written(args[0], args[1])
            die()
        result = original(*args, **kwargs)
        die()
        return result

    setattr(mod, attr, wrapped)


def main(argv: list[str]) -> int:
    point, sep, rest = argv[0], argv[1], argv[2:]
    assert sep == "--", "usage: kill_points.py POINT -- portable args"
    plant(point)
    from reproduction.portable import main as portable

    return portable(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
