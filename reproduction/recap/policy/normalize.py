"""Stage 4's state/action normalisation: z-score (the `tiny` preset's, as it always was) or openpi's quantile form
(pi0.5's: `Normalize(use_quantiles=True)`), its statistics from the training frames or an openpi norm_stats.json.

The statistics travel as one JSON dict (policy_setup.json's and policy.json's `stats`):

    state_mean, state_std, action_mean, action_std    always (std floored at 1e-2; z-score reads only these)
    norm                                               "quantile" when quantile; absent = z-score (every export
                                                       written before the field existed)
    state_q01, state_q99, action_q01, action_q99       with norm "quantile"

openpi (transforms.py Normalize/Unnormalize, use_quantiles=True):
    x_n = (x - q01) / (q99 - q01 + 1e-6) * 2 - 1          x = (x_n + 1) / 2 * (q99 - q01 + 1e-6) + q01
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from reproduction.errors import ConfigError, InputNotFoundError

NORMS = ("zscore", "quantile")
EPS = 1e-6
"""openpi's epsilon in the quantile range."""


def default_norm(preset: str) -> str:
    """The norm a preset uses when `norm` is not set: quantile for pi05 (openpi's use_quantile_norm for pi0.5),
    z-score for tiny (what it always did)."""
    return "quantile" if preset == "pi05" else "zscore"


def norm_of(stats: Mapping[str, Any]) -> str:
    """The norm a stats dict records (absent: z-score, every export written before quantiles existed)."""
    return str(stats.get("norm", "zscore"))


def quantile_stats(state: np.ndarray, action: np.ndarray) -> dict[str, list[float]]:
    """q01/q99 per component of the training frames' state and of the actions their chunks read (exact
    np.quantile; openpi's compute_norm_stats approximates them from 5000-bin histograms)."""
    out = {}
    for name, x in (("state", state), ("action", action)):
        x = np.asarray(x, np.float64)
        out[f"{name}_q01"] = np.quantile(x, 0.01, axis=0).tolist()
        out[f"{name}_q99"] = np.quantile(x, 0.99, axis=0).tolist()
    return out


def read_norm_stats(path: Path | str, *, state_dim: int, action_dim: int) -> dict[str, list[float]]:
    """q01/q99 of `state` and `actions` from openpi's norm_stats.json (`path` is the file or the folder holding it,
    e.g. a checkpoint's `assets/<asset_id>/`), cut to the policy's dims as openpi's Normalize cuts them
    (`stats.q01[..., :x.shape[-1]]`). InputNotFoundError when absent; ConfigError when a key is missing or shorter
    than the policy's state/action."""
    path = Path(path)
    if path.is_dir():
        path = path / "norm_stats.json"
    if not path.is_file():
        raise InputNotFoundError(
            f"policy norm_stats: {path} does not exist",
            path=path,
            hint="point policy.model.norm_stats at openpi's norm_stats.json (or its folder), or leave it unset to "
            "take the quantiles from the training frames",
        )
    doc = json.loads(path.read_text(encoding="utf-8"))
    stats = doc.get("norm_stats", doc)
    out: dict[str, list[float]] = {}
    for ours, theirs, dim in (("state", "state", state_dim), ("action", "actions", action_dim)):
        entry = stats.get(theirs) if isinstance(stats, Mapping) else None
        for q in ("q01", "q99"):
            values = None if not isinstance(entry, Mapping) else entry.get(q)
            if values is None or len(values) < dim:
                raise ConfigError(
                    f"policy norm_stats: {path} has no {theirs}.{q} of at least {dim} values "
                    f"(got {None if values is None else len(values)})",
                    field="norm_stats",
                    hint="use the norm_stats.json of a checkpoint trained on this robot's state and actions",
                )
            out[f"{ours}_{q}"] = [float(v) for v in values[:dim]]
    return out


def check_norm(value: Any, field: str) -> None:
    """ConfigError unless `value` is None or one of NORMS."""
    if value is not None and value not in NORMS:
        raise ConfigError(
            f"{field}={value!r} is not one of {', '.join(NORMS)}",
            field=field,
            hint=f"set {field} to quantile (openpi's pi0.5) or zscore, or leave it unset for the preset's default",
        )


class Normalizer:
    """The normalisation of a stats dict (module docstring): state and action to the model's space and back. Z-score
    runs the arithmetic the policy code always ran (float32 arrays, (x - mean) / std, x * std + mean)."""

    def __init__(self, stats: Mapping[str, Any]) -> None:
        self.norm = norm_of(stats)
        if self.norm not in NORMS:
            raise ConfigError(f"policy stats: norm {self.norm!r} is not one of {', '.join(NORMS)}", field="norm")
        f32 = lambda k: np.asarray(stats[k], np.float32)  # noqa: E731
        self.s_mean, self.s_std = f32("state_mean"), f32("state_std")
        self.a_mean, self.a_std = f32("action_mean"), f32("action_std")
        if self.norm == "quantile":
            f64 = lambda k: np.asarray(stats[k], np.float64)  # noqa: E731
            self.s_q01, self.s_q99 = f64("state_q01"), f64("state_q99")
            self.a_q01, self.a_q99 = f64("action_q01"), f64("action_q99")

    @property
    def state_dim(self) -> int:
        return int(self.s_mean.size)

    @property
    def action_dim(self) -> int:
        return int(self.a_mean.size)

    def state(self, raw: np.ndarray) -> np.ndarray:
        """(..., S) raw state -> normalised float32."""
        if self.norm == "quantile":
            return _to_unit(raw, self.s_q01, self.s_q99)
        return ((np.asarray(raw, np.float32) - self.s_mean) / self.s_std).astype(np.float32)

    def action(self, raw: np.ndarray) -> np.ndarray:
        """(..., A) raw actions -> normalised float32."""
        if self.norm == "quantile":
            return _to_unit(raw, self.a_q01, self.a_q99)
        return ((np.asarray(raw, np.float32) - self.a_mean) / self.a_std).astype(np.float32)

    def unaction(self, x: np.ndarray) -> np.ndarray:
        """(..., A) normalised actions (the env's dims) -> raw float32 (openpi's Unnormalize)."""
        if self.norm == "quantile":
            x = np.asarray(x, np.float64)
            return ((x + 1.0) / 2.0 * (self.a_q99 - self.a_q01 + EPS) + self.a_q01).astype(np.float32)
        return (x * self.a_std + self.a_mean).astype(np.float32)


def _to_unit(x: np.ndarray, q01: np.ndarray, q99: np.ndarray) -> np.ndarray:
    return ((np.asarray(x, np.float64) - q01) / (q99 - q01 + EPS) * 2.0 - 1.0).astype(np.float32)
