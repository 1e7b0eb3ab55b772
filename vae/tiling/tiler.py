"""`decode_tiled` / `encode_tiled`: tile sizes in pixels, three modes, OOM-safe, with progress and cancel.

Modes:
- "fast": independent tiles blended with raised-cosine ramps (not exact; PSNR reported in the docs).
- "exact": equal to the untiled pass (fp32 ≤ 1e-4) with working memory bounded by the tile; global
  operations (norm statistics, mid-block attention) run over the whole frame (see exact.py).
- "auto": untiled when the predicted peak fits the memory budget, else exact tiles (fast tiles for
  a model without an exact plan) sized by the same prediction (vae/peak_memory.py).
On out-of-memory (any allocation failure `vae.oom` recognises) the tile that failed is redone at half the
size and the finished tiles are kept (retry.py); at the floor the temporal slice is halved; then a clear
MemoryError states the numbers.
"""

from __future__ import annotations

import logging
from typing import Callable, Optional

import torch

from ..api import TurboVAE, moments_to_latents
from ..base import Progress
from ..oom import OutOfMemory, attempt
from .exact import run_exact
from .fast import PassGeometry, run_tiled
from .plan import (
    DEFAULT_OVERLAP_PX,
    DEFAULT_TILE_PX,
    MODES,
    TilingPlan,
    auto_tile_latent,
    check_tiling,
    pass_kind,
    plan_tiling,
    resolve_tile_latent,
)
from .retry import MIN_TILE_LATENT, TileRetry  # noqa: F401 (MIN_TILE_LATENT: imported from here by the nodes)

log = logging.getLogger(__name__)

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


def _tiled_pass(vae: TurboVAE, x: torch.Tensor, plan: TilingPlan, *, progress: Progress,
                output_device: Optional[torch.device]) -> torch.Tensor:
    """Run `plan` (both directions): x is validated, on the model's device and dtype; returns the blended or exact
    output (pixels, or moments for encode) in the model dtype. After an out-of-memory the plan's tile (or slice)
    is shrunk and the rest runs the shrunk plan."""
    decode = plan.decode
    what = "decode" if decode else "encode"
    f = vae.spatial_factor
    model = vae.model
    if plan.requested == "exact" and not plan.has_exact:
        raise ValueError(f"exact tiled {what} is not available for a {vae.kind} VAE; use mode='fast'")
    in_scale, out_scale = (1, f) if decode else (f, 1)
    if (x.shape[-2] // in_scale, x.shape[-1] // in_scale) != plan.latent_hw:
        raise ValueError(f"the tiling plan was made for a {plan.latent_hw[0]}×{plan.latent_hw[1]} latent frame, "
                         f"this input has {x.shape[-2] // in_scale}×{x.shape[-1] // in_scale}; make the plan "
                         "(plan_tiling) from this input's shape")
    out_channels = vae.image_channels if decode else 2 * vae.latent_channels
    geom = PassGeometry(in_scale, out_scale, out_channels, decode, vae.temporal_factor)
    t_in = x.shape[2]
    latent_frames = t_in if decode else geom.out_frames(t_in)
    stream = model.decode_stream if decode else model.encode_stream
    whole = vae.tile_pass(decode=decode)

    def run(retry: TileRetry) -> torch.Tensor:
        now = plan.with_tile(retry.tile_latent, retry.temporal_slice)  # the plan itself until a retry shrank it
        grid, ts = now.grid(), now.temporal_slice
        with torch.inference_mode():
            if now.mode == "untiled":
                return _untiled(vae, x, decode=decode, temporal_slice=ts, progress=progress,
                                output_device=output_device)
            if now.mode == "exact":
                return run_exact(model, x, grid, decode=decode, temporal_slice=ts, progress=progress,
                                 output_device=output_device, retry=retry)
            # ramps are in output units: pixels for decode, latent pixels for encode
            return run_tiled(x, grid, geom, stream, whole, blend=now.overlap_px // in_scale, temporal_slice=ts,
                             progress=progress, accum_device=output_device, retry=retry)

    retry = TileRetry(what, f, vae.device, plan.tile_latent, plan.temporal_slice, latent_frames)
    return _run_with_oom_retry(run, retry).to(vae.dtype)


def _checked_plan(plan: TilingPlan, decode: bool, tile_px: Optional[int], overlap_px: Optional[int], mode: str,
                  temporal_slice: Optional[int]) -> TilingPlan:
    """A plan handed in replaces the tiling arguments, so none may be given beside it (it would be ignored)."""
    if plan.decode != decode:
        raise ValueError(f"this is a{'n encode' if plan.decode else ' decode'} plan; make the plan with "
                         f"decode={decode}")
    given = [n for n, v, default in (("tile_px", tile_px, None), ("overlap_px", overlap_px, None),
                                     ("mode", mode, "auto"), ("temporal_slice", temporal_slice, None)) if v != default]
    if given:
        raise ValueError(f"{', '.join(given)} given beside a plan, which already holds them; pass either the plan "
                         "or the tiling arguments")
    return plan


def decode_tiled(vae: TurboVAE, latents: torch.Tensor, *, tile_px: Optional[int] = None,
                 overlap_px: Optional[int] = None, mode: str = "auto", temporal_slice: Optional[int] = None,
                 progress: Progress = None, output_device: Optional[torch.device] = None,
                 plan: Optional[TilingPlan] = None) -> torch.Tensor:
    """Decode raw latents in spatial tiles (output pixels) and temporal slices (latent frames).

    `mode` defaults to "auto" like the nodes: untiled when it fits, else exact tiles (never seams by default).
    `tile_px=None`: 512 px in fast/exact mode, sized from the memory budget in auto mode (untiled if it fits);
    `tile_px=0`: sized from the memory budget in any mode. `overlap_px` must be below half the tile;
    None: 64 px, or a quarter of a smaller tile. Both are in pixels (output pixels for decode, input pixels
    for encode), whatever the VAE's spatial factor.

    `progress(done, total)` is called after every tile×slice step; an exception it raises (e.g. a
    UI interrupt) propagates and leaves the model usable. `output_device` holds the fp32 accumulator
    (e.g. CPU to keep a long clip off the GPU). Returns pixels in [-1, 1], model dtype.

    `plan`: a `plan_tiling(..., decode=True)` made for these latents (what the nodes log), run as it is, in
    place of the tiling arguments; without it the same plan is made here.
    """
    if plan is not None:
        plan = _checked_plan(plan, True, tile_px, overlap_px, mode, temporal_slice)
    else:
        overlap_px = check_tiling(tile_px, overlap_px, mode, vae.spatial_factor, temporal_slice)
    squeeze = latents.ndim == 4
    z = vae.check_latents(latents)
    vae.check_decoded_size(z, output_device)
    z = z.to(device=vae.device, dtype=vae.dtype)
    if plan is None:
        plan = plan_tiling(vae, tuple(z.shape), tile_px=tile_px, overlap_px=overlap_px, mode=mode, decode=True,
                           temporal_slice=temporal_slice)
    out = _tiled_pass(vae, z, plan, progress=progress, output_device=output_device)
    return out.squeeze(2) if squeeze and out.shape[2] == 1 else out


def encode_tiled(vae: TurboVAE, pixels: torch.Tensor, *, tile_px: Optional[int] = None,
                 overlap_px: Optional[int] = None, mode: str = "auto", temporal_slice: Optional[int] = None,
                 progress: Progress = None, sample: bool = False, generator: Optional[torch.Generator] = None,
                 output_device: Optional[torch.device] = None, plan: Optional[TilingPlan] = None) -> torch.Tensor:
    """Encode pixels in spatial tiles (input pixels) and temporal slices; returns raw latents.

    Moments (mean ‖ log-variance) are blended, then the mean (or a posterior sample) is taken.
    Clips that are not 4n+1 frames are padded as `TurboVAE.encode` does. Other arguments as `decode_tiled`
    (`plan`: one made with decode=False).
    """
    if plan is not None:
        plan = _checked_plan(plan, False, tile_px, overlap_px, mode, temporal_slice)
    else:
        overlap_px = check_tiling(tile_px, overlap_px, mode, vae.spatial_factor, temporal_slice)
    squeeze = pixels.ndim == 4
    x = vae.pad_frames(vae.check_pixels(pixels)).to(device=vae.device, dtype=vae.dtype)
    if plan is None:
        plan = plan_tiling(vae, tuple(x.shape), tile_px=tile_px, overlap_px=overlap_px, mode=mode, decode=False,
                           temporal_slice=temporal_slice)
    moments = _tiled_pass(vae, x, plan, progress=progress, output_device=output_device)
    out = moments_to_latents(moments, sample=sample, generator=generator)
    return out.squeeze(2) if squeeze and out.shape[2] == 1 else out
