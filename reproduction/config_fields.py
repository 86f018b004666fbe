"""Config dataclasses built from user dicts: refuse unknown keys by name, in one place."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from reproduction.errors import ConfigError


def reject_unknown_fields(cls: type, data: Mapping[str, Any], *, what: str) -> None:
    """Raise ConfigError naming every key of `data` that is not a field of dataclass `cls`."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(
            f"{what}: unknown fields {unknown}", field=unknown[0], hint=f"known fields: {', '.join(sorted(known))}"
        )
