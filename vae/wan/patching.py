"""Wan 2.2's pixel patching and the spatial footprint of a layer list (shared by the model, which derives
its receptive radii from it, and the exact-tile plan)."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Iterable, Sequence

import torch
from torch import nn

from .layers import CausalConv3d, Resample


def patchify(x: torch.Tensor, p: int) -> torch.Tensor:
    """[.., C, H, W] -> [.., C*p*p, H/p, W/p], channel order (c, dx, dy) as in the Wan 2.2 checkpoints."""
    if p == 1:
        return x
    if x.ndim == 4:
        n, c, h, w = x.shape
        x = x.reshape(n, c, h // p, p, w // p, p).permute(0, 1, 5, 3, 2, 4)
        return x.reshape(n, c * p * p, h // p, w // p)
    b, c, t, h, w = x.shape
    x = x.reshape(b, c, t, h // p, p, w // p, p).permute(0, 1, 6, 4, 2, 3, 5)
    return x.reshape(b, c * p * p, t, h // p, w // p)


def unpatchify(x: torch.Tensor, p: int) -> torch.Tensor:
    if p == 1:
        return x
    if x.ndim == 4:
        n, cp, h, w = x.shape
        x = x.reshape(n, cp // (p * p), p, p, h, w).permute(0, 1, 4, 3, 5, 2)
        return x.reshape(n, cp // (p * p), h * p, w * p)
    b, cp, t, h, w = x.shape
    x = x.reshape(b, cp // (p * p), p, p, t, h, w).permute(0, 1, 4, 5, 3, 6, 2)
    return x.reshape(b, cp // (p * p), t, h * p, w * p)


def spatial_ops(modules: Iterable[nn.Module]) -> list[str]:
    """The spatial footprint of a module sequence in execution order: 'conv' (3x3, pad 1), 'down', 'up'."""
    ops = []
    for m in modules:
        if isinstance(m, CausalConv3d) and m.pad_hw == (1, 1):
            ops.append("conv")
        elif isinstance(m, Resample):
            ops.append("up" if m.mode.startswith("up") else "down")
            if m.mode.startswith("up"):
                ops.append("conv")
    return ops


def footprint(ops: Sequence[str]) -> tuple[Fraction, int]:
    """(scale, receptive radius in input pixels) of a spatial-op sequence in execution order: what an
    output pixel reads on every side, walked back from the output. The one place this rule lives (the
    encoder/decoder radii and the exact-tile stages all use it)."""
    r = 0
    scale = Fraction(1)
    for op in reversed(ops):
        if op == "conv":
            r += 1
        elif op == "up":  # nearest 2x: output pixel p reads input p // 2
            r = math.ceil(r / 2)
            scale *= 2
        elif op == "down":  # (0,1,0,1) zero pad + 3x3 stride-2 conv: output i reads inputs 2i..2i+2
            r = 2 * r + 2
            scale /= 2
    return scale, r
