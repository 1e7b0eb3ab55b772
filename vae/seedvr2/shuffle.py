"""The sub-pixel shuffle of SeedVR2's upsamplers, as one data movement both upsampler paths share."""

from __future__ import annotations

import torch


def pixel_shuffle_3d(u: torch.Tensor, s: int, zr: int) -> torch.Tensor:
    """`b (x y z c) f h w -> b c (f z) (h x) (w y)` as view/permute/reshape (bit-exact; it only moves data).

    `u`'s channel dimension must be viewable as (x, y, z, c): contiguous within itself (stride 1), as in a
    contiguous tensor or a channels-last permute of token-major rows."""
    b, ch, f, h, w = u.shape
    c = ch // (s * s * zr)
    return u.view(b, s, s, zr, c, f, h, w).permute(0, 4, 5, 3, 6, 1, 7, 2).reshape(b, c, f * zr, h * s, w * s)
