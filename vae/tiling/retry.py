"""Out-of-memory inside a tiled pass: the tile that failed is run again smaller, finished tiles are kept.

Why resume instead of restarting: a long clip that runs out of memory on its last tiles (the memory
estimate is an estimate; other models may grow meanwhile) would otherwise redo everything. Tiles are
independent units — exact tiles are exact whatever the partition, fast tiles blend into a weight plane
that is divided out — so the failed tile alone is redone as smaller pieces, and every tile after it is
run at the smaller size. When the tile is at its floor the temporal slice is halved instead (slices are
exact too); below one latent frame per slice a clear MemoryError states the numbers.

`TileRetry` is the state of one pass: the current tile and slice, one warning per shrink, and the
progress counter that grows when a tile is split, so the bar still ends at its total.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch

from ..base import Progress
from ..input_rules import MIN_TILE_LATENT
from ..memory.device import free_memory_bytes
from ..memory.oom import OutOfMemory, RetriesExhausted, release_cached

log = logging.getLogger(__name__)



class StepCounter:
    """progress(done, total) after each unit of work; `grow` adds the units a split tile created."""

    def __init__(self, progress: Progress, total: int):
        self.progress, self.total, self.done = progress, total, 0

    def tick(self) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, self.total)

    def grow(self, units: int) -> None:
        self.total += units


class TileRetry:
    """Tile side (latent px) and temporal slice (latent frames; None = whole clip) of one tiled pass,
    shrunk on each out-of-memory."""

    def __init__(self, what: str, spatial_factor: int, device: torch.device, tile_latent: int,
                 temporal_slice: Optional[int], latent_frames: int):
        self.what, self.f, self.device = what, spatial_factor, device
        self.first_tile_latent = self.tile_latent = tile_latent
        self.temporal_slice = temporal_slice
        self.latent_frames = latent_frames
        self.shrinks = 0

    def shrink(self, failure: OutOfMemory, where: str = "") -> None:
        """Free what the failed attempt left, then halve the tile (or, at the floor, the temporal slice);
        RetriesExhausted when neither can shrink."""
        release_cached(self.device)
        f = self.f
        frames = self.temporal_slice or self.latent_frames
        if self.tile_latent > MIN_TILE_LATENT:
            old, self.tile_latent = self.tile_latent, max(MIN_TILE_LATENT, self.tile_latent // 2)
            change = f"{old * f} px tiles; retrying with {self.tile_latent * f} px"
        elif frames > 1:
            self.temporal_slice = max(1, frames // 2)
            change = (f"{self.tile_latent * f} px tiles (the floor) and {frames} latent frames per slice; retrying "
                      f"with {self.temporal_slice}")
        else:
            free = free_memory_bytes(self.device) / 2**30
            raise RetriesExhausted(
                f"out of memory during tiled {self.what} even with {self.tile_latent * f} px tiles (started at "
                f"{self.first_tile_latent * f} px; floor {MIN_TILE_LATENT * f} px) and 1 latent frame per slice "
                f"({failure.reason}); {free:.2f} GiB free on {self.device}. Use bf16/fp16, or free memory (unload "
                "other models).")
        self.shrinks += 1
        log.warning("TurboVAE: out of memory in tiled %s with %s%s", self.what, change,
                    f" ({where}; finished tiles kept)" if where else "")
