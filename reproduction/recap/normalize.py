"""The one return-normalisation contract shared by value training (stage 2) and advantages (stage 3).

Upstream used two formulas (value SFT: G/|min|; advantages: (x-min)/(max-min)-1) that agree only
when max == 0 and both runs saw the same datasets (RECAP.md section 7, item 1). Here the range is
fixed once, from the training datasets' returns, stored in the value checkpoint, and read back
from there by stage 3; nothing recomputes it.

    value space   y = (G - max) / (max - min)     maps [min, max] onto [-1, 0] (the head's bins)
    reward sums   r = R / (max - min)             a pure scale: a sum of rewards is a difference
                                                  of returns, so the offset must not be applied

With max == 0 (any success present) both equal upstream's formulas exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reproduction.errors import ConfigError


@dataclass(kw_only=True, slots=True, frozen=True)
class ReturnRange:
    """The raw-return interval mapped onto the value head's [-1, 0]."""

    return_min: float
    """Smallest raw return over the training datasets (most negative)."""
    return_max: float
    """Largest raw return over the training datasets (0 whenever a success exists)."""

    def __post_init__(self) -> None:
        if not (self.return_max > self.return_min):
            raise ConfigError(
                f"return range [{self.return_min}, {self.return_max}] is empty: return_max must exceed return_min",
                field="return_min/return_max",
                hint="compute returns first, or set both explicitly in the config",
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
    def from_dict(cls, data: dict[str, Any]) -> ReturnRange:
        try:
            return cls(return_min=float(data["return_min"]), return_max=float(data["return_max"]))
        except KeyError as exc:
            raise ConfigError(f"return range: missing field {exc.args[0]!r}", field=str(exc.args[0])) from None
