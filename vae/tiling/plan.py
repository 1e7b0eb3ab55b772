"""What a tiled pass will do, said before it runs: untiled, exact or fast tiles, at which tile size.

The ComfyUI nodes log this so a user sees what `auto` chose. It calls what `api._tiled_pass` calls (the
same tile-size function, grid and `pass_kind` rule). An out-of-memory retry inside the pass may still
halve the tile afterwards (the tiler logs that itself).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..api import TurboVAE
from .api import resolve_tile_latent, pass_kind
from .exact import supports_exact
from .grid import TileGrid


@dataclass(frozen=True)
class TilingPlan:
    mode: str  # "untiled" | "exact" | "fast"
    tile_px: Optional[int]  # None when untiled
    tiles: int

    def describe(self) -> str:
        if self.mode == "untiled":
            return "untiled"
        return f"{self.mode} tiles {self.tile_px} px ×{self.tiles}"


def plan_tiling(vae: TurboVAE, shape: tuple[int, ...], *, tile_px: Optional[int], overlap_px: int, mode: str,
                decode: bool) -> TilingPlan:
    """The plan for input `shape` ([B, C, T, H, W] latents for decode, pixels for encode; 4-D images too)."""
    f = vae.spatial_factor
    in_scale = 1 if decode else f
    h_lat, w_lat = shape[-2] // in_scale, shape[-1] // in_scale
    t_in = shape[2] if len(shape) == 5 else 1
    pixel_frames = vae.latent_format.pixel_frames(t_in) if decode else t_in
    tile_lat = resolve_tile_latent(vae, tile_px, mode, h_lat, w_lat, pixel_frames, decode=decode)
    grid = TileGrid.build(h_lat, w_lat, tile_lat, overlap_px // f)
    kind = pass_kind(mode, len(grid), supports_exact(vae.model, decode=decode))
    return TilingPlan(kind, None if kind == "untiled" else tile_lat * f, len(grid))
