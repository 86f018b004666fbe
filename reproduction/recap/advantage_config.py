"""Stage 3's config dataclass (numpy-free: the run config imports it without loading the stage)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reproduction.errors import ConfigError

THRESHOLD_SCOPES = ("global", "per_task")


@dataclass(kw_only=True, slots=True)
class AdvantageConfig:
    """Stage-3 parameters (RLinf's recap_compute_advantages.yaml `advantage.*`)."""

    lookahead: int = 10
    """N, `advantage_lookahead_step`: frames between V_t and V_{t+N}."""
    gamma: float = 1.0
    """Discount of the reward window and of V_{t+N}."""
    discount_next_value: bool = True
    """Multiply V_{t+N} by gamma^k (k = frames actually summed)."""
    positive_quantile: float = 0.3
    """Fraction of frames labelled positive (the threshold is the (1-q) percentile)."""
    threshold_scope: str = "global"
    """"global" (one threshold across datasets, RLinf's rule) or "per_task"."""
    tag: str | None = None
    """Output tag: advantages_{tag}.parquet."""
    returns_tag: str | None = None
    """Tag of the returns sidecar to read."""
    hold_labels: bool = False
    """Label positive every frame from the first success on in successful episodes, and leave those
    frames out of the threshold (recap/labels.py; DEMO_LAB 4). Off = upstream's rule."""

    def __post_init__(self) -> None:
        check_advantage_values(self)


def check_advantage_values(cfg: Any, key: str = "") -> None:
    """AdvantageConfig's rules on `cfg` (an AdvantageConfig, or anything with its fields as attributes); the
    ConfigError names each field as `key.field` (`advantages.lookahead` when a run config's section is checked).
    AdvantageConfig.__post_init__ calls it with no key."""

    def k(name: str) -> str:
        return f"{key}.{name}" if key else name

    if cfg.lookahead < 1:
        raise ConfigError(
            f"{k('lookahead')}={cfg.lookahead} must be >= 1",
            field=k("lookahead"),
            hint=f"set {k('lookahead')} to a whole number of 1 or more",
        )
    if not (0.0 < cfg.gamma <= 1.0):  # also refuses nan
        raise ConfigError(
            f"{k('gamma')}={cfg.gamma} is outside (0, 1]", field=k("gamma"), hint=f"set {k('gamma')} in (0, 1]"
        )
    if not (0.0 < cfg.positive_quantile < 1.0):
        raise ConfigError(
            f"{k('positive_quantile')}={cfg.positive_quantile} is outside (0, 1)",
            field=k("positive_quantile"),
            hint=f"set {k('positive_quantile')} to the fraction of frames labelled positive, e.g. 0.3",
        )
    if cfg.threshold_scope not in THRESHOLD_SCOPES:
        raise ConfigError(
            f"{k('threshold_scope')}={cfg.threshold_scope!r} is not one of {', '.join(THRESHOLD_SCOPES)}",
            field=k("threshold_scope"),
            hint=f"set {k('threshold_scope')} to one of: {', '.join(THRESHOLD_SCOPES)}",
        )
