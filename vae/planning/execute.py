"""`run_plan`: the one executor of a `PassPlan` — the real pass, and (with `sample`) its prediction on meta tensors.

Why one function for both: the peak a plan is predicted to need is the peak of this code run on meta tensors
(vae/planning/predict.py), so whatever the pass allocates — tiles with their halos, staged whole-frame tensors,
causal caches, output canvases, the copies to and from host memory — is counted because it is run, not because
a formula remembered it.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ..base import Progress, VAEModel, run_slices
from ..tiling.frame_stages import run_frame_stages
from ..memory.placement import OnDevice, OnHost, OnMetaHost, Placement, held_in, release_host_cache
from ..tiling.exact import run_exact
from ..tiling.fast import PassGeometry, run_tiled
from ..tiling.retry import TileRetry
from .plan import PassPlan


def placements(plan: PassPlan, device: torch.device, output_device: Optional[torch.device],
               meta_tracker=None) -> tuple[Optional[Placement], Placement, Optional[Placement]]:
    """(where the causal caches are kept — None: on the device —, where the output canvas is, where a layer-wise
    pass keeps its whole-frame activations — None: on the device) for `plan` run on `device`; `meta_tracker`: the
    `LiveBytes` of a meta run (host memory is counted apart there)."""
    def host() -> Placement:
        return OnMetaHost(meta_tracker, plan.device_type) if meta_tracker is not None else OnHost(device)

    caches = host() if plan.cache_on_host or plan.frames_on_host else None
    frames = host() if plan.frames_on_host else None
    if not plan.output_on_host:
        return caches, OnDevice(device), frames
    if meta_tracker is None and output_device is not None and torch.device(output_device).type != device.type:
        return caches, OnDevice(output_device), frames  # the caller's host device (a CUDA pass's CPU output)
    return caches, host(), frames


def run_plan(model: VAEModel, x: torch.Tensor, plan: PassPlan, *, progress: Progress = None,
             output_device: Optional[torch.device] = None, retry: Optional[TileRetry] = None,
             whole: Optional[Callable[[torch.Tensor], torch.Tensor]] = None, sample: bool = False,
             meta_tracker=None) -> torch.Tensor:
    """Run `plan` over `x` (validated, 5-D, on the model's device and dtype; pixel clips of 1 + 4n frames):
    pixels for a decode, moments for an encode, in the model's dtype (fast tiles: fp32, their blend), in the
    output canvas the plan places (on `output_device` when given and the plan keeps the output off the device).

    `retry`: the tiled passes' out-of-memory state (vae/tiling/retry.py); `whole`: the whole-clip pass a fast tile
    of one temporal step runs (default the model's). `sample` and `meta_tracker`: a prediction's meta run
    (vae/planning/predict.py)."""
    if not plan.on_host or meta_tracker is not None:
        return _run(model, x, plan, progress, output_device, retry, whole, sample, meta_tracker)
    try:
        return _run(model, x, plan, progress, output_device, retry, whole, sample, meta_tracker)
    finally:  # the pinned memory the pass held goes back to the system with the pass (bounded by its plan)
        release_host_cache(x.device)


def _run(model: VAEModel, x: torch.Tensor, plan: PassPlan, progress: Progress, output_device, retry, whole,
         sample: bool, meta_tracker) -> torch.Tensor:
    decode = plan.decode
    fmt = model.latent_format
    out_frames = fmt.pixel_frames(x.shape[2]) if decode else fmt.latent_frames(x.shape[2])
    caches, canvas, frames = placements(plan, x.device, output_device, meta_tracker)
    with held_in(caches):
        if plan.mode == "untiled":
            if plan.frame_stages:
                return run_frame_stages(model.frame_stages(decode=decode), x, out_frames=out_frames, canvas=canvas,
                                        progress=progress, sample=sample)
            step = model.decode_step if decode else model.encode_step
            bounds = model.slice_bounds(x.shape[2], plan.temporal_slice, decode=decode)
            return run_slices(step, x, bounds, {"clamp": True} if decode else {}, progress, out_frames=out_frames,
                              canvas=canvas, sample=sample)
        grid = plan.with_tile(retry.tile_latent, retry.temporal_slice).grid() if retry is not None else plan.grid()
        ts = retry.temporal_slice if retry is not None else plan.temporal_slice
        if plan.mode == "exact":
            return run_exact(model, x, grid, decode=decode, temporal_slice=ts, progress=progress, retry=retry,
                             canvas=canvas, frame_stages=plan.frame_stages, sample=sample, frames=frames)
        f = fmt.spatial_factor
        in_scale, out_scale = (1, f) if decode else (f, 1)
        out_channels = fmt.image_channels if decode else 2 * fmt.channels
        geom = PassGeometry(in_scale, out_scale, out_channels, decode, fmt.temporal_factor)
        stream = model.decode_stream if decode else model.encode_stream
        whole = whole or (model.decode_slices if decode else model.encode_slices)
        return run_tiled(x, grid, geom, stream, whole, blend=plan.overlap_px // in_scale, temporal_slice=ts,
                         progress=progress, retry=retry, canvas=canvas, sample=sample)
