"""How a frame is split into row bands, one per device, and what a band sees of the split.

Bands are cut on whole latent rows, so at every resolution of the network (×2 per upsampler, ÷2 per
stride-2 conv, patchify for Wan 2.2) a band is a whole number of rows and band borders sit on multiples
of every stride: each device's rows map to whole rows at every layer. The last band may be one row
shorter or longer than the others (even split by rounding).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Optional

import torch

from .collectives import Collective


@dataclass(frozen=True)
class BandPlan:
    """Latent-row borders of the N bands of an h_lat × w_lat frame."""

    h_lat: int
    w_lat: int
    bounds: tuple[int, ...]  # N + 1 borders: band r is rows [bounds[r], bounds[r+1])

    @classmethod
    def split(cls, h_lat: int, w_lat: int, n: int) -> "BandPlan":
        if n < 1:
            raise ValueError(f"need at least one device, got {n}")
        if n > h_lat:
            raise ValueError(f"cannot split {h_lat} latent rows into {n} bands (each device needs at least one "
                             f"latent row); use at most {h_lat} devices or a taller frame")
        return cls(h_lat, w_lat, tuple(round(i * h_lat / n) for i in range(n + 1)))

    @property
    def size(self) -> int:
        return len(self.bounds) - 1

    def rows(self, rank: int) -> tuple[int, int]:
        return self.bounds[rank], self.bounds[rank + 1]

    def counts(self, scale: Fraction = Fraction(1)) -> list[int]:
        """Rows of every band at `scale` output rows per latent row."""
        return [int((b - a) * scale) for a, b in zip(self.bounds, self.bounds[1:])]

    def cores(self, rank: int, tile: int) -> list[tuple[int, int]]:
        """This band's rows cut into as many tile rows as the tallest band needs, so every rank runs the
        same number of tiles and their progress ticks (which are also the cancel points) line up."""
        a, b = self.rows(rank)
        # bands differ by at most one row and tiles are ≥ 2 rows, so n never exceeds a band's rows
        n = -(-max(self.counts()) // max(2, tile))
        edges = [a + round(i * (b - a) / n) for i in range(n + 1)]
        return list(zip(edges, edges[1:]))

    def tiles(self, rank: int, tile: int, share: int = 1) -> list[tuple[tuple[int, int], tuple[int, int]]]:
        """This band's tile cores as (rows, cols) in latent pixels: sides of at most `tile` and, with
        `share` = N, areas of at most tile²/N, so the N bands' working memory together is one single-device
        tile's (the single-device pass with the same `tile` needs N times what one band does). Every rank
        gets the same count, in the same order."""
        rows = self.cores(rank, tile)
        tallest = -(-max(self.counts()) // len(rows))
        area = max(1, tile * tile // max(1, share))
        n = min(max(1, self.w_lat // 2), max(-(-self.w_lat // tile), -(-tallest * self.w_lat // area)))
        edges = [round(i * self.w_lat / n) for i in range(n + 1)]
        return [(r, c) for r in rows for c in zip(edges, edges[1:])]


class Band:
    """One device's band of a split frame as the layer-wise SeedVR2 pass sees it (`layerwise.RowShard`)."""

    def __init__(self, plan: BandPlan, comm: Collective):
        self.plan, self.comm = plan, comm
        self.lo, self.hi = plan.rows(comm.rank)

    def _scale(self, x: torch.Tensor) -> Fraction:
        s = Fraction(x.shape[-1], self.plan.w_lat)
        if (self.plan.h_lat * s).denominator != 1:
            raise RuntimeError(f"a tensor {tuple(x.shape)} does not map to whole rows of the split frame")
        return s

    def rows(self, x: torch.Tensor) -> tuple[int, int, int]:
        s = self._scale(x)
        return int(self.lo * s), int(self.hi * s), int(self.plan.h_lat * s)

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        return self.comm.all_reduce_sum(t)

    def halo(self, x: torch.Tensor, top: int, bottom: int) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
        return self.comm.halo(x, top, bottom)

    def gather_rows(self, x: torch.Tensor) -> torch.Tensor:
        return self.comm.all_gather_rows(x, self.plan.counts(self._scale(x)))
