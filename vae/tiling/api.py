"""`decode_tiled` / `encode_tiled`: tile sizes in pixels, three modes, OOM-safe, with progress and cancel.

Modes:
- "fast": independent tiles blended with raised-cosine ramps (not exact; PSNR reported in the docs).
- "exact": equal to the untiled pass (fp32 ≤ 1e-4) with working memory bounded by the tile; global
  operations (norm statistics, mid-block attention) run over the whole frame (see exact.py).
- "auto": untiled when the estimated working set fits free memory, else exact tiles (fast tiles for
  a model without an exact plan) sized from the model's memory model.
On out-of-memory (any allocation failure `vae.oom` recognises) the tile that failed is redone at half the
size and the finished tiles are kept (retry.py); at the floor the temporal slice is halved; then a clear
MemoryError states the numbers.
"""

from __future__ import annotations

import logging
from typing import Callable, Optional

import torch

from ..api import TurboVAE, moments_to_latents
from ..base import Progress, check_temporal_slice
from ..memory import USABLE_FRACTION, free_memory_bytes
from ..oom import OutOfMemory, attempt
from .exact import supports_exact, run_exact
from .fast import PassGeometry, run_tiled
from .grid import TileGrid
from .retry import MIN_TILE_LATENT, TileRetry

log = logging.getLogger(__name__)

MODES = ("auto", "fast", "exact")  # the default first: what the nodes offer, in this order
DEFAULT_TILE_PX = 512  # fast/exact with tile=None (ComfyUI's default too); "auto" sizes from free memory



def _check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
    return mode


DEFAULT_OVERLAP_PX = 64


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
                         "from free memory")
    if tile_px and tile_px < MIN_TILE_LATENT * f:
        raise ValueError(f"tile_px={tile_px} is too small; use at least {MIN_TILE_LATENT * f} px "
                         "(or 0 to size tiles from free memory)")
    if overlap_px < 0:
        raise ValueError(f"overlap_px must be ≥ 0 px, got {overlap_px}")
    if tile_px and 2 * overlap_px >= tile_px:
        raise ValueError(f"overlap_px={overlap_px} must be less than half the tile ({tile_px} px): tiles would "
                         f"overlap their neighbours' neighbours; use overlap_px ≤ {tile_px // 2 - f}")


def auto_tile_latent(vae: TurboVAE, h_lat: int, w_lat: int, frames: int, *, decode: bool,
                     budget: Optional[int] = None) -> int:
    """Largest square latent tile whose working set (one frame slice) fits the memory budget."""
    f = vae.spatial_factor
    budget = int(free_memory_bytes(vae.device) * USABLE_FRACTION) if budget is None else budget
    mm = vae.model.memory_model
    slice_frames = min(frames, 1 + vae.temporal_factor)  # auto slicing goes down to 1 latent per step
    tile = max(h_lat, w_lat)
    while tile > MIN_TILE_LATENT:
        px = min(tile, h_lat) * f * min(tile, w_lat) * f
        if mm.bytes_needed(px, slice_frames, vae.dtype, decode=decode) <= budget:
            return tile
        tile = max(MIN_TILE_LATENT, (tile * 3) // 4)
    return MIN_TILE_LATENT


def resolve_tile_latent(vae: TurboVAE, tile_px: Optional[int], mode: str, h_lat: int, w_lat: int, frames: int, *,
                        decode: bool) -> int:
    """Tile side in latent pixels for a tile side `tile_px` in pixels: as asked; 512 px for fast/exact when
    None; from free memory for auto or 0. The tiled passes, their plan and the parallel passes share it."""
    f = vae.spatial_factor
    if tile_px:
        return max(MIN_TILE_LATENT, tile_px // f)
    if tile_px is None and mode != "auto":
        return max(MIN_TILE_LATENT, DEFAULT_TILE_PX // f)
    return auto_tile_latent(vae, h_lat, w_lat, frames, decode=decode)


def _run_with_oom_retry(run: Callable[[TileRetry], torch.Tensor], retry: TileRetry) -> torch.Tensor:
    """`run(retry)` again after each out-of-memory that escaped the tile loop (the untiled pass, the global
    part, a layer-wise plan), with the tile or slice shrunk first; the retry starts after the `except`
    block, so the failed attempt's tensors are already released."""
    while True:
        result = attempt(lambda: run(retry))
        if not isinstance(result, OutOfMemory):
            return result
        retry.shrink(result)


def _untiled(vae: TurboVAE, x: torch.Tensor, *, decode: bool, temporal_slice: Optional[int], progress: Progress,
             output_device: Optional[torch.device]) -> torch.Tensor:
    """`auto` when one tile covers the frame: the plain pass, which is what the memory estimate was made
    for and what exact tiles equal; run through the VAE so an engine VAE serves it from its engines."""
    if decode:
        out = vae.run_decode(x, temporal_slice=temporal_slice)
    else:
        out = vae.encode_moments(x, temporal_slice=temporal_slice)
    if progress is not None:
        progress(1, 1)
    return out.to(device=output_device or x.device, dtype=torch.float32)


def pass_kind(mode: str, tiles: int, has_exact: bool) -> str:
    """What a tiled pass runs: "untiled" when `auto` needs a single tile, "exact" tiles in exact/auto mode where
    the model has an exact plan, else "fast" tiles. One rule for the pass and for what the nodes report."""
    if mode == "auto" and tiles == 1:
        return "untiled"
    return "exact" if has_exact and mode in ("exact", "auto") else "fast"


def _tiled_pass(vae: TurboVAE, x: torch.Tensor, *, decode: bool, tile_px: Optional[int], overlap_px: int, mode: str,
                temporal_slice: Optional[int], progress: Progress,
                output_device: Optional[torch.device]) -> torch.Tensor:
    """The pass both directions share: x is validated, on the model's device and dtype; returns the
    blended or exact output (pixels, or moments for encode) in the model dtype."""
    what = "decode" if decode else "encode"
    f = vae.spatial_factor
    model = vae.model
    has_exact = supports_exact(model, decode=decode)
    if mode == "exact" and not has_exact:
        raise ValueError(f"exact tiled {what} is not available for a {vae.kind} VAE; use mode='fast'")
    in_scale, out_scale = (1, f) if decode else (f, 1)
    out_channels = vae.image_channels if decode else 2 * vae.latent_channels
    geom = PassGeometry(in_scale, out_scale, out_channels, decode, vae.temporal_factor)
    h_lat, w_lat, t_in = x.shape[-2] // in_scale, x.shape[-1] // in_scale, x.shape[2]
    latent_frames = t_in if decode else geom.out_frames(t_in)
    pixel_frames = geom.out_frames(t_in) if decode else t_in
    stream = model.decode_stream if decode else model.encode_stream
    whole = vae.tile_pass(decode=decode)

    def run(retry: TileRetry) -> torch.Tensor:
        tile_lat = retry.tile_latent
        if retry.temporal_slice is None:
            px = min(tile_lat, h_lat) * f * min(tile_lat, w_lat) * f
            retry.temporal_slice = vae.temporal_slice_for(latent_frames, px, decode=decode)
        ts = retry.temporal_slice
        grid = TileGrid.build(h_lat, w_lat, tile_lat, overlap_px // f)
        kind = pass_kind(mode, len(grid), has_exact)
        with torch.inference_mode():
            if kind == "untiled":
                return _untiled(vae, x, decode=decode, temporal_slice=ts, progress=progress,
                                output_device=output_device)
            if kind == "exact":
                return run_exact(model, x, grid, decode=decode, temporal_slice=ts, progress=progress,
                                 output_device=output_device, retry=retry)
            # ramps are in output units: pixels for decode, latent pixels for encode
            return run_tiled(x, grid, geom, stream, whole, blend=overlap_px // in_scale, temporal_slice=ts,
                             progress=progress, accum_device=output_device, retry=retry)

    first_tile = resolve_tile_latent(vae, tile_px, mode, h_lat, w_lat, pixel_frames, decode=decode)
    retry = TileRetry(what, f, vae.device, first_tile, temporal_slice, latent_frames)
    return _run_with_oom_retry(run, retry).to(vae.dtype)


def decode_tiled(vae: TurboVAE, latents: torch.Tensor, *, tile_px: Optional[int] = None,
                 overlap_px: Optional[int] = None, mode: str = "auto", temporal_slice: Optional[int] = None,
                 progress: Progress = None, output_device: Optional[torch.device] = None) -> torch.Tensor:
    """Decode raw latents in spatial tiles (output pixels) and temporal slices (latent frames).

    `mode` defaults to "auto" like the nodes: untiled when it fits, else exact tiles (never seams by default).
    `tile_px=None`: 512 px in fast/exact mode, sized from free memory in auto mode (untiled if it fits);
    `tile_px=0`: sized from free memory in any mode. `overlap_px` must be below half the tile;
    None: 64 px, or a quarter of a smaller tile. Both are in pixels (output pixels for decode, input pixels
    for encode), whatever the VAE's spatial factor.

    `progress(done, total)` is called after every tile×slice step; an exception it raises (e.g. a
    UI interrupt) propagates and leaves the model usable. `output_device` holds the fp32 accumulator
    (e.g. CPU to keep a long clip off the GPU). Returns pixels in [-1, 1], model dtype.
    """
    _check_mode(mode)
    overlap_px = _default_overlap(tile_px, overlap_px)
    _check_sizes(tile_px, overlap_px, vae.spatial_factor, temporal_slice)
    squeeze = latents.ndim == 4
    z = vae.check_latents(latents)
    vae.check_decoded_size(z, output_device)
    z = z.to(device=vae.device, dtype=vae.dtype)
    out = _tiled_pass(vae, z, decode=True, tile_px=tile_px, overlap_px=overlap_px, mode=mode,
                      temporal_slice=temporal_slice, progress=progress, output_device=output_device)
    return out.squeeze(2) if squeeze and out.shape[2] == 1 else out


def encode_tiled(vae: TurboVAE, pixels: torch.Tensor, *, tile_px: Optional[int] = None,
                 overlap_px: Optional[int] = None, mode: str = "auto", temporal_slice: Optional[int] = None,
                 progress: Progress = None, sample: bool = False, generator: Optional[torch.Generator] = None,
                 output_device: Optional[torch.device] = None) -> torch.Tensor:
    """Encode pixels in spatial tiles (input pixels) and temporal slices; returns raw latents.

    Moments (mean ‖ log-variance) are blended, then the mean (or a posterior sample) is taken.
    Clips that are not 4n+1 frames are padded as `TurboVAE.encode` does. Other arguments as `decode_tiled`.
    """
    _check_mode(mode)
    overlap_px = _default_overlap(tile_px, overlap_px)
    _check_sizes(tile_px, overlap_px, vae.spatial_factor, temporal_slice)
    squeeze = pixels.ndim == 4
    x = vae.pad_frames(vae.check_pixels(pixels)).to(device=vae.device, dtype=vae.dtype)
    moments = _tiled_pass(vae, x, decode=False, tile_px=tile_px, overlap_px=overlap_px, mode=mode,
                          temporal_slice=temporal_slice, progress=progress, output_device=output_device)
    out = moments_to_latents(moments, sample=sample, generator=generator)
    return out.squeeze(2) if squeeze and out.shape[2] == 1 else out
