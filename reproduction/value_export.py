"""The value export's format, torch-free: the return range, and the one reader of `value_head.json`.

    <value stage>/model_<k>/export/value_head.json
        {"format_version": 2, "return_range": {"return_min", "return_max"}, "num_bins", "v_min", "v_max",
         "folds", "fold", "cameras", "state_keys", "state_dims", "model_config", "tokenizer", ...}

Format 2 added the state input (`state_keys`/`state_dims` here, `state_dim`/`state_mean`/`state_std`
in model_config); format 1 exports (no state input) still read, as a state-free model.

A leaf module (stdlib and reproduction.errors only), so both planes read it: stage 3 takes the
return range and bins from here (never from a retyped config), the model loader
(recap/value/infer.py) checks the export with it before it builds the model, and `portable check`
(control plane, checks/value_export.py) validates a bundle's value export with it before any runtime is
restored. The return-normalisation contract ReturnRange lives here for the same reason; its rules are
in reproduction/recap/normalize.py's docstring.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reproduction.errors import CheckpointError, ConfigError, InputNotFoundError, UnsupportedFormatError


@dataclass(kw_only=True, slots=True, frozen=True)
class ReturnRange:
    """The raw-return interval mapped onto the value head's [-1, 0]."""

    return_min: float
    """Smallest raw return over the training datasets (most negative)."""
    return_max: float
    """Largest raw return over the training datasets (0 whenever a success exists)."""

    def __post_init__(self) -> None:
        # an infinite bound (a float32 return that overflowed) would map every target to NaN (audit56 G1)
        for name in ("return_min", "return_max"):
            value = getattr(self, name)
            if not math.isfinite(value):
                raise ConfigError(
                    f"return range: {name}={value} is not a finite number",
                    field=name,
                    hint="recompute the returns with a finite returns.failure_reward, or set both bounds explicitly",
                )
        if not (self.return_max > self.return_min):
            # All-equal returns (only 1-frame episodes of one outcome): RLinf trains on targets G/1 and labels with
            # a constant advantage; refusing says why instead (docs/upstream.md, audit56 G4).
            same = self.return_max == self.return_min
            raise ConfigError(
                f"return range [{self.return_min}, {self.return_max}] is empty: return_max must exceed return_min"
                + (f" (every training return is {self.return_min})" if same else ""),
                field="return_min/return_max",
                hint="train on episodes of several lengths or outcomes (equal returns leave the value model nothing to "
                "tell apart), or set value.model.return_min < value.model.return_max explicitly",
            )

    @property
    def width(self) -> float:
        return self.return_max - self.return_min

    def to_value(self, returns: Any) -> Any:
        """Raw returns (scalar or array) -> value-space targets in [-1, 0] (not clamped)."""
        return (returns - self.return_max) / self.width

    def from_value(self, values: Any) -> Any:
        """Value-space numbers -> raw returns (inverse of `to_value`)."""
        return values * self.width + self.return_max

    def scale_rewards(self, reward_sums: Any) -> Any:
        """Raw reward sums over a window -> value-space units (scale only, no offset)."""
        return reward_sums / self.width

    def to_dict(self) -> dict[str, float]:
        return {"return_min": float(self.return_min), "return_max": float(self.return_max)}

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: Path | str | None = None) -> ReturnRange:
        """The range stored in `data`; ConfigError on a missing, non-numeric, non-finite or empty range,
        its message led by `source` (the file `data` was read from) when given."""
        where = f"{source}: " if source is not None else ""
        try:
            return cls(return_min=float(data["return_min"]), return_max=float(data["return_max"]))
        except KeyError as exc:
            raise ConfigError(f"{where}return range: missing field {exc.args[0]!r}", field=str(exc.args[0])) from None
        except ConfigError as exc:  # before ValueError: ConfigError is one
            if source is None:
                raise
            raise ConfigError(f"{where}{exc.message}", hint=exc.hint, **exc.fields) from None
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}return range: {exc}", field="return_min/return_max") from None


HEAD_NAME = "value_head.json"
EXPORT_FORMAT = 2
READABLE_FORMATS = (1, 2)
"""Export formats this version reads (1: before the state input; read as state_keys = [])."""


@dataclass(kw_only=True, frozen=True)
class ValueHead:
    """A value export's metadata, checked."""

    path: Path
    """The value_head.json it was read from."""
    return_range: ReturnRange
    num_bins: int
    v_min: float
    v_max: float
    fingerprint: str
    """sha256 of value_head.json's bytes."""
    doc: dict[str, Any] = field(default_factory=dict)
    """The whole document (model_config, cameras, folds, ...)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "return_range": self.return_range.to_dict(),
            "num_bins": self.num_bins,
            "v_min": self.v_min,
            "v_max": self.v_max,
            "fingerprint": self.fingerprint,
        }


def read_value_head(folder: Path) -> ValueHead:
    """Read and check `<folder>/value_head.json`.

    Raises InputNotFoundError (no folder / no value_head.json), UnsupportedFormatError (another
    format_version) or CheckpointError (unreadable file, a missing or invalid field), each naming the path.
    """
    folder = Path(folder)
    path = folder / HEAD_NAME
    if not path.is_file():
        what = "does not exist" if not folder.exists() else f"holds no {HEAD_NAME}"
        raise InputNotFoundError(
            f"value checkpoint {folder} {what}: it is not a value-model export",
            path=path,
            hint=f"pass <value stage out>/model_<k>/export (it holds model.safetensors and {HEAD_NAME})",
        )
    raw = path.read_bytes()
    try:
        head = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: not JSON ({exc})", path=path) from None
    if not isinstance(head, dict) or head.get("format_version") not in READABLE_FORMATS:
        version = head.get("format_version") if isinstance(head, dict) else None
        raise UnsupportedFormatError(
            f"{path}: format_version {version!r} is not one of {list(READABLE_FORMATS)}",
            path=path,
            field="format_version",
            hint="export the value model with this version of the tool",
        )
    rr_doc = head.get("return_range")
    for name in ("return_min", "return_max"):
        value = rr_doc.get(name) if isinstance(rr_doc, dict) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise CheckpointError(
                f"{path}: field return_range.{name} is {value!r}, not a finite number",
                path=path,
                field=f"return_range.{name}",
                hint="re-export the value model; stage 3 reads the return range it was trained with from here",
            )
    missing = [k for k in ("num_bins", "v_min", "v_max") if k not in head]
    if missing:
        raise CheckpointError(
            f"{path}: field {missing[0]} is missing",
            path=path,
            field=missing[0],
            hint="re-export the value model with this version of the tool",
        )
    try:
        rr = ReturnRange.from_dict(rr_doc)
    except ConfigError as exc:
        raise CheckpointError(f"{path}: {exc.message}", path=path, field="return_range") from None
    return ValueHead(
        path=path,
        return_range=rr,
        num_bins=int(head["num_bins"]),
        v_min=float(head["v_min"]),
        v_max=float(head["v_max"]),
        fingerprint=hashlib.sha256(raw).hexdigest(),
        doc=head,
    )


def read_value_stage_head(stage_dir: Path) -> ValueHead:
    """The head every fold model of a value stage shares (fold 0's), after checking that all folds
    agree on the return range, bins and fold count (CheckpointError naming the first difference)."""
    stage_dir = Path(stage_dir)
    plan_path = stage_dir / "crossfit.json"
    if not plan_path.is_file():
        raise InputNotFoundError(f"{plan_path} does not exist: not a value stage folder", path=plan_path)
    folds = int(json.loads(plan_path.read_text(encoding="utf-8")).get("folds", 1))
    heads = [read_value_head(stage_dir / f"model_{k}" / "export") for k in range(folds)]
    for h in heads[1:]:
        for key in ("return_range", "num_bins", "v_min", "v_max", "folds"):
            if h.doc.get(key) != heads[0].doc.get(key):
                raise CheckpointError(
                    f"{h.path}: {key} {h.doc.get(key)!r} differs from {heads[0].path}'s {heads[0].doc.get(key)!r}",
                    path=h.path,
                    hint="all folds must come from one value-stage run; retrain stage 2",
                )
    return heads[0]
