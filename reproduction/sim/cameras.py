"""The cameras the Fetch simulator renders and how a policy's camera map names them (no mujoco import: configs read it).

A policy maps model camera slots to observation keys, `observation.images.<camera>` (RECAP's policy.model.cameras,
grpo's sft.model.cameras, an export's policy.json `cameras`); the simulator renders `<camera>` for each.
"""

from __future__ import annotations

from typing import Any

from reproduction.errors import ConfigError

CAMERA_NAMES = ("agentview", "wrist")
"""The cameras the simulator renders, in feature order (env.py CAMERAS; a test pins the two equal)."""
IMAGE_PREFIX = "observation.images."
"""Observation key of a rendered camera: observation.images.<camera>."""


def camera_names(cameras: Any, key: str = "sft.model.cameras") -> tuple[str, ...]:
    """The simulator cameras (CAMERA_NAMES order) a camera map {slot: observation.images.<camera>} reads; a one-line
    ConfigError naming `key`, the bad value and the valid ones for a key the simulator does not render."""
    valid = [IMAGE_PREFIX + c for c in CAMERA_NAMES]
    bad = [v for v in dict(cameras).values() if v not in valid]
    if bad:
        raise ConfigError(
            f"{key}: {', '.join(map(repr, bad))} is not a camera the simulator renders (valid: {', '.join(valid)})",
            field=key,
            hint=f"map each slot to one of {', '.join(valid)}",
        )
    wanted = set(dict(cameras).values())
    return tuple(c for c in CAMERA_NAMES if IMAGE_PREFIX + c in wanted)
