"""One dataset entry of a training stage (path, type, weight, name, sidecar tag): the fields and rules the
value and policy stages share; each stage's entry adds the folder its sidecar is read from."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

from reproduction.config_fields import check_name, reject_unknown_fields, same_outputs
from reproduction.errors import ConfigError

DATASET_TYPES = ("sft", "rollout")


@dataclass(kw_only=True, slots=True)
class DatasetSource:
    """A dataset a stage reads; subclasses name their sidecar folder and may change `type`'s default."""

    WHAT: ClassVar[str] = "dataset entry"
    """How errors name an entry."""

    path: str = field(metadata=same_outputs(on_resume=True))
    """LeRobot dataset root (a resume may find it elsewhere: the setup guards compare its content's fingerprint)."""
    type: str = "sft"
    """sft or rollout."""
    weight: float = 1.0
    """Mixture weight (shares proportional to weight x size)."""
    name: str | None = None
    """Name in logs, metrics and sidecar folders; default: the folder name."""
    tag: str | None = None
    """Sidecar tag (<kind>_{tag}.parquet)."""

    def __post_init__(self) -> None:
        if self.type not in DATASET_TYPES:
            raise ConfigError(f"dataset {self.path}: type {self.type!r} is not sft or rollout", field="type")
        if not 0 < self.weight < math.inf:  # also refuses nan; inf made every other share 0 (audit52 W7)
            raise ConfigError(f"dataset {self.path}: weight {self.weight} must be > 0", field="weight")
        if self.name is None:
            self.name = Path(self.path).name
        # the name becomes a sidecar folder and the tag a file name: a path ending in `..` named the entry `..`, and
        # a tag `x/../..` wrote outside the run (audit52 W3); a folder's own name may hold any other character
        if self.name in ("", ".", "..") or any(c in self.name for c in "/\\\0"):
            raise ConfigError(
                f"dataset {self.path}: its name {self.name!r} is not a folder name (no /, \\ or NUL; not . or ..)",
                field="name",
                hint="give the dataset folder's own path (not one ending in ..), or set its name to a plain name",
            )
        check_name(self.tag, "tag")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Any:
        """An entry from a mapping; unknown keys are refused with the nearest valid name."""
        reject_unknown_fields(cls, data, what=cls.WHAT)
        return cls(**dict(data))

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
