"""`PassPlan`: one encode or decode pass, decided before it runs — what runs, where it keeps what, what it needs.

A plan is data: the planner (vae/planning/search.py) makes it, the executor (vae/planning/execute.py) runs exactly
it, and the nodes log it. Its options are the ways this package can run a pass, each exact unless it says
otherwise:
- `temporal_slice`: latent frames per causal step (None: the whole clip at once);
- `tile_latent`: spatial tiles of that side (None: the whole frame), `mode` "exact" (equal to the untiled pass) or
  "fast" (independent tiles blended: not exact);
- `frame_stages`: the model's stages streamed one frame step at a time (vae/tiling/frame_stages.py);
- `cache_on_host` / `output_on_host`: the causal caches / the output canvas kept in host memory
  (vae/memory/placement.py);
- `frames_on_host`: a layer-wise exact plan's whole-frame activations kept in host memory, the device holding only
  bands of rows (vae/seedvr2/layerwise.py: a *streamed* pass; its caches are in host memory too).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import torch

from ..memory.peak import PeakPrediction
from ..tiling.grid import TileGrid

MB = 2 ** 20


@dataclass(frozen=True)
class PassPlan:
    """One pass, decided. `mode`: what runs ("untiled" | "exact" | "fast"); `requested`: what was asked
    ("auto" | "exact" | "fast"). Sizes: `tile_latent` and `latent_hw` in latent pixels, `overlap_px` in pixels of
    the tiled side, `temporal_slice` in latent frames. `predicted`: the peak the planner predicted for this plan
    (None for a plan made without predicting); `budget_bytes` what it had to fit; `cost_s` the cost model's
    estimate of its time (vae/planning/cost.py); `error_db`: for an inexact plan, its measured PSNR against the
    untiled pass where known."""

    decode: bool
    shape: tuple[int, ...]
    dtype: torch.dtype
    device_type: str
    mode: str
    requested: str = "auto"
    temporal_slice: Optional[int] = None
    tile_latent: Optional[int] = None
    overlap_px: int = 0
    frame_stages: bool = False
    cache_on_host: bool = False
    output_on_host: bool = False
    frames_on_host: bool = False
    latent_hw: tuple[int, int] = (0, 0)
    spatial_factor: int = 8
    tiles: int = 1
    predicted: Optional[PeakPrediction] = None
    budget_bytes: Optional[int] = None
    cost_s: Optional[float] = None
    error_db: Optional[float] = None

    @property
    def exact(self) -> bool:
        """Equal to the untiled pass (within rounding): everything but fast tiles of more than one tile."""
        return self.mode != "fast" or self.tiles == 1

    @property
    def fits(self) -> bool:
        """Whether the predicted device peak is within the budget (True when either is unknown; the planner also
        keeps a device type's headroom, `search.PREDICTED_SHARE`)."""
        if self.predicted is None or self.budget_bytes is None:
            return True
        return self.predicted.pass_bytes <= self.budget_bytes

    @property
    def tile_px(self) -> Optional[int]:
        return None if self.tile_latent is None else self.tile_latent * self.spatial_factor

    @property
    def on_host(self) -> bool:
        return self.cache_on_host or self.output_on_host or self.frames_on_host

    def grid(self) -> TileGrid:
        """The tiles (a single one when untiled); the overlap matters to fast tiles only."""
        h, w = self.latent_hw
        tile = self.tile_latent or max(h, w)
        return TileGrid.build(h, w, tile, self.overlap_px // self.spatial_factor)

    def with_tile(self, tile_latent: int, temporal_slice: Optional[int]) -> "PassPlan":
        """The same pass with another tile (and slice): what an out-of-memory retry runs next."""
        if tile_latent == self.tile_latent and temporal_slice == self.temporal_slice:
            return self
        moved = replace(self, tile_latent=tile_latent, temporal_slice=temporal_slice, predicted=None)
        tiles = len(moved.grid())
        mode = self.mode if self.mode != "untiled" else ("exact" if self.requested != "fast" else "fast")
        return replace(moved, mode=mode, tiles=tiles)

    def layout(self) -> str:
        """What runs, in words: "untiled, temporal slice 1, frame stages, caches in host memory"."""
        what = "untiled" if self.mode == "untiled" else f"{self.mode} tiles {self.tile_px} px ×{self.tiles}"
        parts = [what, "whole clip" if self.temporal_slice is None else f"temporal slice {self.temporal_slice}"]
        if self.frame_stages:
            parts.append("frame stages")
        if self.frames_on_host:
            parts.append("activations in host memory")
        if self.cache_on_host:
            parts.append("caches in host memory")
        if self.output_on_host:
            parts.append("output in host memory")
        if not self.exact:
            parts.append("not exact" + (f" ({self.error_db:.1f} dB vs untiled)" if self.error_db is not None else ""))
        return ", ".join(parts)

    def describe(self) -> str:
        """One line: the pass, what runs, what it is predicted to need against its budget (the nodes log it)."""
        what = "decode" if self.decode else "encode"
        shape = "x".join(str(d) for d in self.shape)
        line = f"{what} {shape} {str(self.dtype).removeprefix('torch.')}: {self.layout()}"
        p = self.predicted
        if p is None:
            return line
        line += (f"; predicted peak {p.pass_bytes / MB:.0f} MB on the device (+{p.weight_bytes / MB:.0f} MB weights, "
                 f"{p.input_bytes / MB:.0f} MB input)")
        if p.host_bytes:
            line += f", {p.host_bytes / MB:.0f} MB in host memory"
        if self.budget_bytes is not None:
            line += f", {'within' if self.fits else 'OVER'} the budget of {self.budget_bytes / MB:.0f} MB"
        return line
