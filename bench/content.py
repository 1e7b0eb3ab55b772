"""Procedural "real content" test images: no downloads, deterministic, with the structure tiles break on.

Smooth sky-like gradients, hard-edged shapes, fine periodic texture and sensor-like noise: seams and
per-tile brightness shifts show up on gradients, halo errors on edges and texture.
"""

from __future__ import annotations

import math

import torch


def synthetic_image(height: int, width: int, seed: int = 0) -> torch.Tensor:
    """[3, H, W] in [-1, 1]."""
    g = torch.Generator().manual_seed(seed)
    yy, xx = torch.meshgrid(torch.linspace(0, 1, height), torch.linspace(0, 1, width), indexing="ij")
    base = torch.stack([0.2 + 0.6 * yy, 0.3 + 0.4 * xx, 0.8 - 0.5 * yy])  # gradient "sky"
    img = base.clone()
    for _ in range(6):  # discs and rectangles with hard edges
        cy, cx = torch.rand(2, generator=g).tolist()
        r = 0.05 + 0.2 * torch.rand(1, generator=g).item()
        color = torch.rand(3, 1, 1, generator=g)
        if torch.rand(1, generator=g).item() < 0.5:
            mask = ((yy - cy) ** 2 + (xx - cx) ** 2) < r * r
        else:
            mask = ((yy - cy).abs() < r) & ((xx - cx).abs() < r * 0.6)
        img = torch.where(mask, color.expand_as(img), img)
    freq = 2 * math.pi * (8 + 24 * torch.rand(2, generator=g))
    texture = 0.08 * torch.sin(freq[0] * yy + freq[1] * xx * 1.3)
    img = img + texture + 0.02 * torch.randn(img.shape, generator=g)
    return (img.clamp(0, 1) * 2 - 1).contiguous()


def synthetic_clip(frames: int, height: int, width: int, seed: int = 0) -> torch.Tensor:
    """[3, T, H, W]: the image panning slowly to the right (a camera move)."""
    wide = synthetic_image(height, width + 2 * frames, seed)
    return torch.stack([wide[:, :, 2 * t:2 * t + width] for t in range(frames)], dim=1)
