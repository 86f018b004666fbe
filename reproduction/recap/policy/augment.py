"""Stage 4's train-time image augmentation: openpi's `preprocess_observation_pytorch(train=True)` (rlinf-openpi
0.1.1, models_pytorch/preprocessing_pytorch.py), which upstream's CFG trainer runs inside every training forward.

Per micro batch and per camera (one draw shared by the batch's rows, as openpi draws it), from torch's RNG (which
checkpoints save, so a resumed run draws the same):
    non-wrist cameras   a random 95% crop resized back (bilinear), then a rotation in U(-5, 5) degrees
                        (grid_sample, zero padding; skipped below 0.1 degrees)
    every camera        brightness x U(0.7, 1.3), contrast x U(0.6, 1.4) about the image mean, saturation
                        x U(0.5, 1.5) about the channel mean; clamped to [0, 1]
on images mapped from [-1, 1] to [0, 1] and back. A camera is a wrist camera when "wrist" is in its slot name
(base_0_rgb, left_wrist_0_rgb, as openpi's IMAGE_KEYS).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


def default_image_augment(preset: str) -> bool:
    """The preset's default when `image_augment` is unset: on for pi05 (upstream trains with it), off for tiny."""
    return preset == "pi05"


def augment_images(images: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """{slot: (B, 3, H, W) in [-1, 1]} -> a new dict of augmented images (module docstring); the input is not
    modified. Slots are visited in sorted order so the RNG draws do not depend on the dict's order."""
    return {slot: _augment(images[slot], wrist="wrist" in slot) for slot in sorted(images)}


def _augment(image: torch.Tensor, *, wrist: bool) -> torch.Tensor:
    image = image.permute(0, 2, 3, 1) / 2.0 + 0.5  # openpi works channels-last in [0, 1]
    if not wrist:
        height, width = image.shape[1:3]
        crop_h, crop_w = int(height * 0.95), int(width * 0.95)
        max_h, max_w = height - crop_h, width - crop_w
        if max_h > 0 and max_w > 0:
            start_h = int(torch.randint(0, max_h + 1, (1,), device=image.device))
            start_w = int(torch.randint(0, max_w + 1, (1,), device=image.device))
            image = image[:, start_h : start_h + crop_h, start_w : start_w + crop_w, :]
        image = F.interpolate(image.permute(0, 3, 1, 2), size=(height, width), mode="bilinear", align_corners=False)
        image = image.permute(0, 2, 3, 1)
        angle = torch.rand(1, device=image.device) * 10 - 5
        if torch.abs(angle) > 0.1:
            image = _rotate(image, angle * torch.pi / 180.0)
    brightness = 0.7 + torch.rand(1, device=image.device) * 0.6
    image = image * brightness
    contrast = 0.6 + torch.rand(1, device=image.device) * 0.8
    mean = image.mean(dim=[1, 2, 3], keepdim=True)
    image = (image - mean) * contrast + mean
    saturation = 0.5 + torch.rand(1, device=image.device) * 1.0
    gray = image.mean(dim=-1, keepdim=True)
    image = gray + (image - gray) * saturation
    image = torch.clamp(image, 0, 1) * 2.0 - 1.0
    return image.permute(0, 3, 1, 2)


def _rotate(image: torch.Tensor, angle: torch.Tensor) -> torch.Tensor:
    """openpi's rotation: a rotated sampling grid over [-1, 1]^2, bilinear, zeros outside (channels-last in/out)."""
    height, width = image.shape[1:3]
    cos_a, sin_a = torch.cos(angle), torch.sin(angle)
    grid_y, grid_x = torch.meshgrid(
        torch.linspace(-1, 1, height, device=image.device),
        torch.linspace(-1, 1, width, device=image.device),
        indexing="ij",
    )
    grid_x = grid_x.unsqueeze(0).expand(image.shape[0], -1, -1)
    grid_y = grid_y.unsqueeze(0).expand(image.shape[0], -1, -1)
    grid = torch.stack([grid_x * cos_a - grid_y * sin_a, grid_x * sin_a + grid_y * cos_a], dim=-1)
    out = F.grid_sample(image.permute(0, 3, 1, 2), grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    return out.permute(0, 2, 3, 1)


def with_augmented_images(batch: dict[str, Any]) -> dict[str, Any]:
    """A shallow copy of `batch` whose `images` are augmented (the batch itself is not modified)."""
    return {**batch, "images": augment_images(batch["images"])}
