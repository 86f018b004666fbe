"""The cameras the simulators render and how a policy's camera map names them (no mujoco import: configs read it).

A policy maps model camera slots to observation keys, `observation.images.<camera>` (RECAP's policy.model.cameras,
grpo's sft.model.cameras, an export's policy.json `cameras`); the Fetch simulator renders `<camera>` for each.
A rendering LIBERO env (sim/libero/env.py) always renders both of its cameras, under LIBERO_IMAGE_KEYS.
"""

from __future__ import annotations

from typing import Any

from reproduction.errors import ConfigError

CAMERA_NAMES = ("agentview", "wrist")
"""The cameras the simulator renders, in feature order (env.py CAMERAS; a test pins the two equal)."""
IMAGE_PREFIX = "observation.images."
"""Observation key of a rendered camera: observation.images.<camera>."""
LIBERO_IMAGE_KEYS = ("observation.images.image", "observation.images.wrist_image")
"""The camera features a rendering LIBERO env provides: agentview and robot0_eye_in_hand, in RLinf/openpi's names."""


def camera_names(
    cameras: Any, key: str = "sft.model.cameras", *, libero: bool = False, hint: str | None = None
) -> tuple[str, ...]:
    """The simulator cameras a camera map {slot: observation.images.<camera>} reads, in the simulator's order
    (Fetch: CAMERA_NAMES; `libero`: "image", "wrist_image" of LIBERO_IMAGE_KEYS); a one-line ConfigError naming
    `key`, the bad value and the valid ones for a key the simulator does not render. Its hint is to map each slot
    to a valid key (right for a config's map), or `hint` ({valid}: the valid keys) where the map is a trained
    policy's, which remapping cannot fix."""
    names = tuple(k[len(IMAGE_PREFIX) :] for k in LIBERO_IMAGE_KEYS) if libero else CAMERA_NAMES
    valid = [IMAGE_PREFIX + c for c in names]
    bad = [v for v in dict(cameras).values() if v not in valid]
    if bad:
        raise ConfigError(
            f"{key}: {', '.join(map(repr, bad))} is not a camera the simulator renders (valid: {', '.join(valid)})",
            field=key,
            hint=(hint or "map each slot to one of {valid}").format(valid=", ".join(valid)),
        )
    wanted = set(dict(cameras).values())
    return tuple(c for c in names if IMAGE_PREFIX + c in wanted)
