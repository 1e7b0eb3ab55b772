"""What a tiled pass will do, decided once, before it runs: untiled, exact or fast tiles, the tile size and the
temporal slice.

`plan_tiling` makes the decision; `decode_tiled` / `encode_tiled` run the plan they are handed (or make one the
same way), so what the ComfyUI nodes log is what runs. Only an out-of-memory retry inside the pass changes it
afterwards (a smaller tile or slice: `TilingPlan.with_tile`, and the tiler logs the change).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from ..api import TurboVAE
from ..base import check_temporal_slice
from ..memory_budget import pass_input_shape
from .exact import supports_exact
from .grid import TileGrid
from .retry import MIN_TILE_LATENT

MODES = ("auto", "fast", "exact")  # the default first: what the nodes offer, in this order
DEFAULT_TILE_PX = 512  # fast/exact with tile=None (ComfyUI's default too); "auto" sizes from the memory budget
DEFAULT_OVERLAP_PX = 64


@dataclass(frozen=True)
class TilingPlan:
    """One tiled pass, decided: `mode` is what runs ("untiled" | "exact" | "fast"), `requested` the mode asked
    for ("auto" | "fast" | "exact"); sizes in latent pixels (`tile_latent`, `latent_hw`: the input frame's) and
    pixels (`tile_px`, `overlap_px`); `temporal_slice` in latent frames (None: the whole clip per step)."""

    mode: str
    tile_px: Optional[int]  # None when untiled
    tiles: int
    requested: str = "auto"
    decode: bool = True
    tile_latent: int = 0
    overlap_px: int = 0
    latent_hw: tuple[int, int] = (0, 0)
    temporal_slice: Optional[int] = None
    has_exact: bool = False
    spatial_factor: int = 8

    def describe(self) -> str:
        if self.mode == "untiled":
            return "untiled"
        return f"{self.mode} tiles {self.tile_px} px ×{self.tiles}"

    def grid(self) -> TileGrid:
        return TileGrid.build(*self.latent_hw, self.tile_latent, self.overlap_px // self.spatial_factor)

    def with_tile(self, tile_latent: int, temporal_slice: Optional[int]) -> "TilingPlan":
        """The same pass with another tile (and slice): what an out-of-memory retry runs next."""
        if tile_latent == self.tile_latent and temporal_slice == self.temporal_slice:
            return self
        moved = replace(self, tile_latent=tile_latent, temporal_slice=temporal_slice)
        tiles = len(moved.grid())
        mode = pass_kind(self.requested, tiles, self.has_exact)
        return replace(moved, mode=mode, tiles=tiles,
                       tile_px=None if mode == "untiled" else tile_latent * self.spatial_factor)


def pass_kind(mode: str, tiles: int, has_exact: bool) -> str:
    """What a tiled pass runs: "untiled" when `auto` needs a single tile, "exact" tiles in exact/auto mode where
    the model has an exact plan, else "fast" tiles. One rule for the pass and for what the nodes report."""
    if mode == "auto" and tiles == 1:
        return "untiled"
    return "exact" if has_exact and mode in ("exact", "auto") else "fast"


def tile_peak_bytes(vae: TurboVAE, h_lat: int, w_lat: int, latent_frames: int, *, decode: bool,
                    temporal_slice: Optional[int] = None, device=None) -> int:
    """Predicted peak bytes (`TurboVAE.predict_peak`) of one pass over an `h_lat`×`w_lat` tile of a clip of
    `latent_frames` latents, `temporal_slice` latents per step (None: one, the least an automatic slice takes), on
    `device` (default the model's)."""
    per_step = temporal_slice or (1 if latent_frames > 1 else None)
    shape = pass_input_shape(vae.latent_format, latent_frames, h_lat, w_lat, decode=decode)
    return vae.predict_peak(shape, decode=decode, temporal_slice=per_step, device=device).pass_bytes


def auto_tile_latent(vae: TurboVAE, h_lat: int, w_lat: int, frames: int, *, decode: bool,
                     budget: Optional[int] = None) -> int:
    """Largest square latent tile whose pass, one latent per step (what automatic slicing goes down to), has a
    predicted peak (`TurboVAE.predict_peak`: the model's pass on meta tensors) within `budget` (default
    `vae.budget`, the budget automatic temporal slices use). `frames`: the clip's pixel frames."""
    budget = vae.budget.resolve(vae.device) if budget is None else budget
    latent_frames = vae.latent_format.latent_frames(frames)

    def fits(tile: int) -> bool:
        return tile_peak_bytes(vae, min(tile, h_lat), min(tile, w_lat), latent_frames, decode=decode) <= budget

    candidates = [max(h_lat, w_lat)]  # each a quarter smaller than the last, down to the floor
    while candidates[-1] > MIN_TILE_LATENT:
        candidates.append(max(MIN_TILE_LATENT, (candidates[-1] * 3) // 4))
    if candidates[-1] != MIN_TILE_LATENT:
        return MIN_TILE_LATENT  # a frame below the floor: one tile of the floor's size
    # the peak grows with the tile: the first (largest) candidate that fits, by bisection (a meta pass each)
    lo, hi = 0, len(candidates) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(candidates[mid]):
            hi = mid
        else:
            lo = mid + 1
    return candidates[lo]


def resolve_tile_latent(vae: TurboVAE, tile_px: Optional[int], mode: str, h_lat: int, w_lat: int, frames: int, *,
                        decode: bool, budget_bytes: Optional[int] = None) -> int:
    """Tile side in latent pixels for a tile side `tile_px` in pixels: as asked; 512 px for fast/exact when
    None; from the memory budget (`budget_bytes`, default `vae.budget`) for auto or 0. The tiled passes, their
    plan and the parallel passes share it."""
    f = vae.spatial_factor
    if tile_px:
        return max(MIN_TILE_LATENT, tile_px // f)
    if tile_px is None and mode != "auto":
        return max(MIN_TILE_LATENT, DEFAULT_TILE_PX // f)
    return auto_tile_latent(vae, h_lat, w_lat, frames, decode=decode, budget=budget_bytes)


def _check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
    return mode


def _default_overlap(tile_px: Optional[int], overlap_px: Optional[int]) -> int:
    """`overlap_px=None`: 64 px, or a quarter of a smaller explicit tile (an overlap must stay below half the
    tile)."""
    if overlap_px is not None:
        return overlap_px
    return min(DEFAULT_OVERLAP_PX, tile_px // 4) if isinstance(tile_px, int) and tile_px > 0 else DEFAULT_OVERLAP_PX


def _check_sizes(tile_px: Optional[int], overlap_px: int, f: int, temporal_slice: Optional[int] = None) -> None:
    """ValueError naming the fix for a tile, overlap or temporal_slice the tiler cannot honour."""
    check_temporal_slice(temporal_slice)
    for name, value in (("tile_px", tile_px), ("overlap_px", overlap_px)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{name} must be an integer, got {value!r}")
    if tile_px is not None and tile_px < 0:
        raise ValueError(f"tile_px={tile_px} is negative; use a size ≥ {MIN_TILE_LATENT * f} px, or 0 to size tiles "
                         "from the memory budget")
    if tile_px and tile_px < MIN_TILE_LATENT * f:
        raise ValueError(f"tile_px={tile_px} is too small; use at least {MIN_TILE_LATENT * f} px "
                         "(or 0 to size tiles from the memory budget)")
    if overlap_px < 0:
        raise ValueError(f"overlap_px must be ≥ 0 px, got {overlap_px}")
    if tile_px and 2 * overlap_px >= tile_px:
        raise ValueError(f"overlap_px={overlap_px} must be less than half the tile ({tile_px} px): tiles would "
                         f"overlap their neighbours' neighbours; use overlap_px ≤ {tile_px // 2 - f}")


def check_tiling(tile_px: Optional[int], overlap_px: Optional[int], mode: str, spatial_factor: int,
                 temporal_slice: Optional[int] = None) -> int:
    """ValueError naming the fix for a mode, tile, overlap or temporal_slice the tiler cannot honour; returns the
    overlap in pixels (`overlap_px=None`: the default)."""
    _check_mode(mode)
    overlap_px = _default_overlap(tile_px, overlap_px)
    _check_sizes(tile_px, overlap_px, spatial_factor, temporal_slice)
    return overlap_px


def plan_tiling(vae: TurboVAE, shape: tuple[int, ...], *, tile_px: Optional[int], overlap_px: Optional[int],
                mode: str, decode: bool, temporal_slice: Optional[int] = None,
                budget_bytes: Optional[int] = None) -> TilingPlan:
    """The plan for input `shape` ([B, C, T, H, W] latents for decode, pixels for encode, whose clip the encode
    pads to 1 + 4n frames; 4-D images too). Arguments as `decode_tiled` takes them (checked the same way);
    `temporal_slice` None: the largest whose predicted peak for one tile fits the memory budget (`budget_bytes`,
    default `vae.budget`; the nodes pass ComfyUI's), which also sizes auto tiles."""
    overlap_px = check_tiling(tile_px, overlap_px, mode, vae.spatial_factor, temporal_slice)
    f, lf = vae.spatial_factor, vae.latent_format
    in_scale = 1 if decode else f
    h_lat, w_lat = shape[-2] // in_scale, shape[-1] // in_scale
    t_in = shape[2] if len(shape) == 5 else 1
    if decode:
        latent_frames, pixel_frames = t_in, lf.pixel_frames(t_in)
    else:  # the clip the pass encodes: padded up to 1 + tf·n frames
        latent_frames = -(-(t_in - 1) // lf.temporal_factor) + 1
        pixel_frames = lf.pixel_frames(latent_frames)
    tile_lat = resolve_tile_latent(vae, tile_px, mode, h_lat, w_lat, pixel_frames, decode=decode,
                                   budget_bytes=budget_bytes)
    if temporal_slice is None:
        px = min(tile_lat, h_lat) * f * min(tile_lat, w_lat) * f
        temporal_slice = vae.temporal_slice_for(latent_frames, px, decode=decode, budget_bytes=budget_bytes)
    has_exact = supports_exact(vae.model, decode=decode)
    grid = TileGrid.build(h_lat, w_lat, tile_lat, overlap_px // f)
    kind = pass_kind(mode, len(grid), has_exact)
    return TilingPlan(kind, None if kind == "untiled" else tile_lat * f, len(grid), requested=mode, decode=decode,
                      tile_latent=tile_lat, overlap_px=overlap_px, latent_hw=(h_lat, w_lat),
                      temporal_slice=temporal_slice, has_exact=has_exact, spatial_factor=f)
