"""`train()`: the one entry point stages call (see reproduction/train/task.py for the contract)."""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Callable
from pathlib import Path

from reproduction import ui as ui_mod
from reproduction.train import device as device_mod
from reproduction.train import launcher
from reproduction.train.config import TrainConfig
from reproduction.train.metrics import LOG_NAME
from reproduction.train.task import TrainResult, TrainTask


def train(
    make_task: Callable[[int, int], TrainTask],
    config: TrainConfig,
    *,
    out_dir: Path,
    resume: bool,
    ray_address: str | None = None,
    ui: ui_mod.UiOptions | None = None,
    writers_lock: Path | None = None,
) -> TrainResult:
    """Train `make_task`'s model under `config`, writing checkpoints, logs and an export to `out_dir`.

    `resume=True` continues from the newest complete checkpoint in `out_dir/checkpoints/` (stale
    `.partial` folders are removed; none found = a fresh start); `resume=False` refuses an out_dir
    that already holds checkpoints. Raises ConfigError (bad config, exit 4), CheckpointError (corrupt
    checkpoint, changed config, canary mismatch: exit 50) and WorkerFailedError (a worker raised or
    died: exit 51, with its traceback). Progress goes to stderr via reproduction.ui. Ray workers hold `writers_lock`
    shared for their whole life (a stage passes StageContext.writers_lock, the run's `<run>/.writers`; None: they
    hold nothing; reproduction/writers_lock.py).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    spec = device_mod.resolve(config.device)
    payload = launcher.Payload(
        make_task=make_task,
        config=config,
        out_dir=out_dir.resolve(),
        resume=resume,
        spec=spec,
        # Ray workers outlive a killed driver for a while (own process groups): they hold the run's writers lock so
        # the next invocation waits for them (audit51 K2); in-process, this process is the writer under the run lock.
        writers_lock=Path(os.path.abspath(writers_lock)) if writers_lock is not None else None,
    )
    with ui_mod.progress(ui) as prog:
        view = _ProgressView(prog.task("train", total=config.max_steps), out_dir / LOG_NAME, config, ui)
        if config.launcher == "inprocess":
            result = launcher.run_inprocess(payload, on_record=view.record)
        else:
            result = launcher.run_ray(payload, ray_address=ray_address, on_poll=view.poll)
            view.poll()  # the records written since the last poll
    if result.resumed_from is not None:
        ui_mod.say(f"resumed from step {result.resumed_from}", options=ui)
    return result


class _ProgressView:
    """Drives a progress bar from metrics records (in-process callback, or by tailing the JSONL).

    The bar shows samples/s (the latest train record's `samples_per_s`, else derived from record
    times) and an ETA from the wall time between train records (which includes eval and saves);
    the same figures go into the line said at each eval."""

    def __init__(self, task: ui_mod.Task, log_path: Path, config: TrainConfig, ui: ui_mod.UiOptions | None) -> None:
        self.task, self.log_path, self.config, self.ui = task, log_path, config, ui
        self.shown = 0
        self.offset = 0
        self.started = time.time()
        self.first: tuple[int, float] | None = None  # (step, time) of the first train record seen
        self.last_train: dict = {}
        self.task.show(rate="? samples/s", eta="-:--:--")

    def record(self, record: dict) -> None:
        """Advance the bar on train records; say a line (loss, samples/s, ETA) at each eval."""
        step, split = int(record["step"]), record.get("split")
        if split == "train":
            if self.first is None:  # a resumed run's bar jumps to the step it continues from
                self.first = (step, float(record["time"]))
            self.task.advance(max(0, step - self.shown))
            self.shown = max(self.shown, step)
            self.last_train = record["metrics"]
            self.task.show(**self.figures(step, float(record["time"])))
        elif split == "checkpoint":
            ui_mod.say(f"step {step}: checkpoint saved in {record['metrics']['save_s']:.2f} s", options=self.ui)
        elif split == "eval" and self.first is not None:
            shown = self.figures(step, float(record["time"]))
            evals = ", ".join(f"{k} {v:.4g}" for k, v in list(record["metrics"].items())[:4])
            ui_mod.say(
                f"step {step}/{self.config.max_steps}: loss {self.last_train.get('loss', float('nan')):.4g}, "
                f"{shown['rate']}, eta {shown['eta']}; eval {evals}",
                options=self.ui,
            )

    def figures(self, step: int, now: float) -> dict[str, str]:
        """{'rate': '<n> samples/s', 'eta': 'H:MM:SS'} at `step` reached at time `now`."""
        assert self.first is not None
        first_step, first_time = self.first
        steps_per_s = (step - first_step) / (now - first_time) if step > first_step and now > first_time else 0.0
        samples_per_s = float(self.last_train.get("samples_per_s") or 0.0) or steps_per_s * self.config.global_batch
        steps_per_s = steps_per_s or samples_per_s / self.config.global_batch  # one record so far: the step's own speed
        remaining = max(0, self.config.max_steps - step)
        if remaining == 0:
            eta = "0:00:00"
        elif steps_per_s > 0:
            eta = str(datetime.timedelta(seconds=round(remaining / steps_per_s)))
        else:
            eta = "-:--:--"
        rate = f"{samples_per_s:.1f} samples/s" if 0 < samples_per_s < 10 else f"{samples_per_s:.0f} samples/s"
        return {"rate": rate if samples_per_s > 0 else "? samples/s", "eta": eta}

    def poll(self) -> None:
        """Read records appended to the JSONL since the last poll (only records newer than start)."""
        import json

        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read()
        except FileNotFoundError:
            return
        end = chunk.rfind(b"\n") + 1
        self.offset += end
        for line in chunk[:end].splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if record.get("time", 0) >= self.started:
                self.record(record)
