"""Stage 3's config dataclass (numpy-free: the run config imports it without loading the stage)."""

from __future__ import annotations

from dataclasses import dataclass

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
        if self.lookahead < 1:
            raise ConfigError(f"lookahead {self.lookahead} must be >= 1", field="lookahead")
        if not (0.0 < self.gamma <= 1.0):
            raise ConfigError(f"gamma {self.gamma} is outside (0, 1]", field="gamma")
        if not (0.0 < self.positive_quantile < 1.0):
            raise ConfigError(
                f"positive_quantile {self.positive_quantile} is outside (0, 1)", field="positive_quantile"
            )
        if self.threshold_scope not in THRESHOLD_SCOPES:
            raise ConfigError(
                f"threshold_scope {self.threshold_scope!r} is not one of {', '.join(THRESHOLD_SCOPES)}",
                field="threshold_scope",
            )
