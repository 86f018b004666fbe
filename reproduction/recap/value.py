"""Stage 2 entry: train the value model(s), one per cross-fitting fold, through the project's trainer.

    python -m reproduction.recap.value train --config value.yaml --out runs/x/value [--resume] [--ray-address A]

The config file (YAML or JSON) has two sections: `value` (ValueStageConfig: datasets, preset,
cameras, folds, ...) and `train` (TrainConfig: steps, batches, lr, world size, ...). stdout gets one
JSON summary (per-fold eval metrics and export folders); talk and errors go to stderr.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from reproduction.errors import ConfigError, InputNotFoundError, PortableError
from reproduction.recap.value_task import SETUP_NAME, ValueSetup, ValueStageConfig, make_value_task, prepare_value_setup


@dataclass(kw_only=True)
class ValueStageResult:
    """What stage 2 produced: the setup and one trainer result per fold."""

    setup: ValueSetup
    results: list[Any]
    """reproduction.train.task.TrainResult per fold, in fold order."""

    @property
    def export_dirs(self) -> list[Path]:
        return [r.export_dir for r in self.results]

    def summary(self) -> dict[str, Any]:
        return {"folds": self.setup.plan.folds, "return_range": self.setup.return_range.to_dict(),
                "models": [{"fold": k, "step": r.step, "export": str(r.export_dir), "eval": r.eval_metrics,
                            "samples_per_s": r.samples_per_s} for k, r in enumerate(self.results)]}


def train_value(stage: ValueStageConfig, train_config: Any, out_dir: Path, *, resume: bool = False,
                ray_address: str | None = None, ui: Any = None) -> ValueStageResult:
    """Prepare the setup (tokenizer, return range, folds) and train one model per fold into
    `out_dir/model_<k>/`. Fold k trains without fold k's episodes and evaluates on them.

    Raises what the data plane and the trainer raise (ConfigError, DatasetError,
    FingerprintMismatchError, CheckpointError, WorkerFailedError), all PortableErrors.
    """
    from reproduction.train.api import train

    out_dir = Path(out_dir)
    setup = prepare_value_setup(stage, out_dir)
    results = []
    for fold in range(setup.plan.folds):
        make = functools.partial(make_value_task, setup_path=str((out_dir / SETUP_NAME).resolve()), fold=fold)
        results.append(train(make, train_config, out_dir=out_dir / f"model_{fold}", resume=resume,
                             ray_address=ray_address, ui=ui))
    return ValueStageResult(setup=setup, results=results)


def load_config(path: Path) -> tuple[ValueStageConfig, Any]:
    """(ValueStageConfig, TrainConfig) from a YAML/JSON file with `value` and `train` sections."""
    from reproduction.train.config import TrainConfig

    path = Path(path)
    if not path.is_file():
        raise InputNotFoundError(f"value config {path} does not exist", path=path)
    text = path.read_text(encoding="utf-8")
    if path.suffix in (".yaml", ".yml"):
        import yaml

        data = yaml.safe_load(text)
    else:
        data = json.loads(text)
    if not isinstance(data, dict) or "value" not in data or "train" not in data:
        raise ConfigError(f"{path}: needs top-level `value` and `train` sections", path=path, field="value")
    return ValueStageConfig.from_dict(data["value"]), TrainConfig.from_dict(data["train"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reproduction.recap.value", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", help="train the value model(s) of stage 2")
    p.add_argument("--config", required=True, type=Path, help="YAML/JSON with `value` and `train` sections")
    p.add_argument("--out", required=True, type=Path, help="stage output folder")
    p.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoints")
    p.add_argument("--ray-address", default=None, help="join this Ray cluster instead of starting a local one")
    args = parser.parse_args(argv)
    try:
        stage, tcfg = load_config(args.config)
        result = train_value(stage, tcfg, args.out, resume=args.resume, ray_address=args.ray_address)
    except PortableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        return exc.exit_code
    print(json.dumps(result.summary(), indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
