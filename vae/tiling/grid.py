"""Tile placement along one axis and the blending weights that make tiles a partition of unity.

Design (differs from the numz/ComfyUI grids on purpose, see seedvr2 spec §15):
- Tiles are evenly spread so the last one is shifted inward to end at the border: no thin last tile
  decoded with almost no context.
- Neighbouring tiles are blended around a *cut point* (the middle of their overlap) over a width
  `blend` ≤ the overlap, with a raised-cosine ramp and its exact complement. Blend bands of different
  cuts never touch, so at most two tiles weigh on any pixel and their weights sum to 1 — also when
  tiles are shifted and three of them overlap somewhere.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AxisTile:
    """One tile on one axis, in latent units: the input span and its weight support."""

    start: int
    stop: int
    # Blend band where this tile fades in (left) / out (right); empty on the borders. Latent units, but
    # the band itself is expressed in the *blended* space's units by `AxisGrid.weights`.
    cut_left: float | None
    cut_right: float | None

    @property
    def size(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class AxisGrid:
    """Tiles covering [0, length) with `tile`-sized spans overlapping by at least `overlap` (latent units)."""

    length: int
    tile: int
    overlap: int
    tiles: tuple[AxisTile, ...]

    @staticmethod
    def build(length: int, tile: int, overlap: int) -> "AxisGrid":
        if length <= 0:
            raise ValueError(f"cannot tile an empty axis (length {length})")
        if tile <= 0:
            raise ValueError(f"tile must be positive, got {tile}")
        if tile >= length:
            return AxisGrid(length, length, 0, (AxisTile(0, length, None, None),))
        overlap = max(0, min(overlap, tile // 2))
        stride = tile - overlap
        n = math.ceil((length - tile) / stride) + 1
        # Even spread: the real stride is ≤ `stride`, so every overlap is ≥ the requested one.
        starts = [round(i * (length - tile) / (n - 1)) for i in range(n)]
        cuts = [(starts[i + 1] + starts[i] + tile) / 2 for i in range(n - 1)]
        tiles = tuple(
            AxisTile(s, s + tile, cuts[i - 1] if i > 0 else None, cuts[i] if i < n - 1 else None)
            for i, s in enumerate(starts)
        )
        return AxisGrid(length, tile, overlap, tiles)

    def min_overlap(self) -> int:
        return min((a.stop - b.start for a, b in zip(self.tiles, self.tiles[1:])), default=0)

    def weights(self, index: int, scale: int, blend: int, device, dtype=torch.float32) -> torch.Tensor:
        """Weight of tile `index` over its own span, in a space `scale`× finer than latents.

        `blend` is the ramp width in that space; it is capped so bands of neighbouring cuts never meet
        and each band lies inside both tiles it blends.
        """
        t = self.tiles[index]
        n = t.size * scale
        w = torch.ones(n, dtype=dtype, device=device)
        blend = self.blend_width(scale, blend)
        if blend == 0:
            # Hard seams at the cut points (overlap 0 requested): each pixel belongs to exactly one tile.
            if t.cut_left is not None:
                w[: int(math.floor(t.cut_left * scale)) - t.start * scale] = 0
            if t.cut_right is not None:
                w[int(math.floor(t.cut_right * scale)) - t.start * scale:] = 0
            return w
        ramp = raised_cosine(blend, device, dtype)
        if t.cut_left is not None:
            lo = int(round(t.cut_left * scale - blend / 2)) - t.start * scale
            w[:lo] = 0
            w[lo:lo + blend] = ramp
        if t.cut_right is not None:
            lo = int(round(t.cut_right * scale - blend / 2)) - t.start * scale
            w[lo:lo + blend] = ramp.flip(0)
            w[lo + blend:] = 0
        return w

    def blend_width(self, scale: int, blend: int) -> int:
        if len(self.tiles) == 1:
            return 0
        limit = self.min_overlap() * scale
        # bands of consecutive cuts must not meet: they are ≥ the smallest stride apart
        strides = [b.start - a.start for a, b in zip(self.tiles, self.tiles[1:])]
        limit = min(limit, min(strides) * scale)
        return max(0, min(blend, limit))


@functools.lru_cache(maxsize=64)
def _raised_cosine_cached(length: int, device: str, dtype: torch.dtype) -> torch.Tensor:
    k = torch.arange(length, dtype=torch.float64)
    ramp = 0.5 - 0.5 * torch.cos(math.pi * (k + 0.5) / length)
    return ramp.to(device=device, dtype=dtype)


def raised_cosine(length: int, device, dtype=torch.float32) -> torch.Tensor:
    """Rising ramp r(k) = ½ − ½·cos(π(k+½)/L), k < L; r(k) + r(L−1−k) = 1, so `ramp.flip(0)` is its complement.

    Cached per (length, device, dtype): built once, reused by every tile of every call.
    """
    return _raised_cosine_cached(int(length), str(torch.device(device)), dtype)


@dataclass(frozen=True)
class TileGrid:
    """The 2-D product of two axis grids (latent units)."""

    rows: AxisGrid
    cols: AxisGrid

    @staticmethod
    def build(height: int, width: int, tile: int, overlap: int) -> "TileGrid":
        return TileGrid(AxisGrid.build(height, tile, overlap), AxisGrid.build(width, tile, overlap))

    def __len__(self) -> int:
        return len(self.rows.tiles) * len(self.cols.tiles)

    def __iter__(self):
        for i, r in enumerate(self.rows.tiles):
            for j, c in enumerate(self.cols.tiles):
                yield i, j, r, c

    @property
    def single(self) -> bool:
        return len(self) == 1
