"""`decode_tiled` / `encode_tiled`: passes run by a plan the caller can steer — tile size in pixels, three modes,
within a memory budget, OOM-safe, with progress and cancel.

Modes:
- "auto" (default): the fastest exact plan whose predicted peak fits the budget (vae/planning): untiled when that
  fits, else exact tiles, the model's frame stages, caches and output in host memory — equal to the untiled pass.
- "exact": exact tiles (equal to the untiled pass, fp32 ≤ 1e-4) of `tile_px` (512 px by default; 0: sized by the
  budget).
- "fast": independent tiles blended with raised-cosine ramps (not exact; PSNR in the docs).
On out-of-memory (any allocation failure `vae.memory.oom` recognises) the tile that failed is redone at half the
size and the finished tiles are kept (vae/tiling/retry.py); at the floor the temporal slice is halved; then a clear
MemoryError states the numbers.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from .api import TurboVAE, moments_to_latents
from .base import Progress
from .input_rules import PassShape, TilingArgs, pass_shape, tiling_args
from .memory.oom import OutOfMemory, attempt
from .planning import PassPlan, run_plan
from .tiling.exact import supports_exact
from .tiling.retry import TileRetry

__all__ = ["decode_tiled", "decode_tiled_checked", "encode_tiled", "encode_tiled_checked", "plan_tiling",
           "planned_tiling"]


def plan_tiling(vae: TurboVAE, shape: tuple[int, ...], *, tile_px: Optional[int], overlap_px: Optional[int],
                mode: str, decode: bool, temporal_slice: Optional[int] = None, budget_bytes: Optional[int] = None,
                output_device: Optional[torch.device] = None, device: Optional[torch.device] = None) -> PassPlan:
    """The plan `decode_tiled` / `encode_tiled` run for input `shape` ([B, C, T, H, W] latents for decode, pixels
    for encode, whose clip the encode pads to 1 + 4n frames; 4-D images too), the arguments checked as they check
    them (vae/input_rules.py); under `budget_bytes` (default `vae.budget`; the nodes pass ComfyUI's), with the output
    on `output_device`, the pass on `device` (default the model's)."""
    tiling = tiling_args(mode, tile_px, overlap_px, temporal_slice, spatial_factor=vae.spatial_factor)
    checked = pass_shape(shape, vae.latent_format, vae.kind, decode=decode, pad=True)
    return planned_tiling(vae, checked, tiling, budget_bytes=budget_bytes, output_device=output_device,
                          device=device)


def check_exact_available(vae: TurboVAE, tiling: TilingArgs, *, decode: bool) -> None:
    """ValueError when exact tiles are asked of a VAE whose pass has none in this direction."""
    if tiling.mode == "exact" and not supports_exact(vae.model, decode=decode):
        raise ValueError(f"exact tiled {'decode' if decode else 'encode'} is not available for a {vae.kind} VAE; "
                         "use mode='fast'")


def planned_tiling(vae: TurboVAE, shape: PassShape, tiling: TilingArgs, *, budget_bytes: Optional[int] = None,
                   output_device: Optional[torch.device] = None, device: Optional[torch.device] = None) -> PassPlan:
    """`plan_tiling` of an input and tiling arguments the input rules have passed (nothing checked again)."""
    check_exact_available(vae, tiling, decode=shape.decode)
    return vae.plan_checked(shape, tiling, budget_bytes=budget_bytes, output_device=output_device, device=device)


def _tiled_pass(vae: TurboVAE, x: torch.Tensor, plan: PassPlan, *, progress: Progress,
                output_device: Optional[torch.device]) -> torch.Tensor:
    """Run `plan` (both directions) over validated `x` on the model's device and dtype, redoing a tile that runs
    out of memory smaller (finished tiles kept); returns the output in the model's dtype."""
    decode = plan.decode
    what = "decode" if decode else "encode"
    f = vae.spatial_factor
    in_scale = 1 if decode else f
    if (x.shape[-2] // in_scale, x.shape[-1] // in_scale) != plan.latent_hw or tuple(x.shape) != plan.shape:
        raise ValueError(f"the plan was made for input {plan.shape}, this input is {tuple(x.shape)}; make the plan "
                         "(plan_tiling) from this input's shape")
    if plan.mode == "untiled":
        with torch.inference_mode():
            out = vae.run_decode(x, plan=plan, progress=progress, output_device=output_device) if decode else \
                vae.run_encode(x, plan=plan, progress=progress, output_device=output_device)
        return out.to(vae.dtype)
    latent_frames = x.shape[2] if decode else vae.latent_format.latent_frames(x.shape[2])
    retry = TileRetry(what, f, vae.device, plan.tile_latent, plan.temporal_slice, latent_frames)
    whole = vae.tile_pass(decode=decode)

    def run(retry: TileRetry) -> torch.Tensor:
        with torch.inference_mode():
            return run_plan(vae.model, x, plan, progress=progress, output_device=output_device, retry=retry,
                            whole=whole)

    return run_with_oom_retry(run, retry).to(vae.dtype)


def run_with_oom_retry(run: Callable[[TileRetry], torch.Tensor], retry: TileRetry) -> torch.Tensor:
    """`run(retry)` until it does not run out of memory: an allocation failure that escaped the tile loop (the
    global part, a layer-wise plan) shrinks the tile (then the slice) and reruns; at the floor `retry.shrink`
    raises MemoryError. Any other error propagates."""
    while True:
        result = attempt(lambda: run(retry))
        if not isinstance(result, OutOfMemory):
            return result
        retry.shrink(result)


def _checked_plan(plan: PassPlan, decode: bool, tile_px: Optional[int], overlap_px: Optional[int], mode: str,
                  temporal_slice: Optional[int]) -> PassPlan:
    """A plan handed in replaces the tiling arguments, so none may be given beside it (it would be ignored)."""
    if not isinstance(plan, PassPlan):
        raise ValueError(f"plan must be a PassPlan (from plan_tiling or TurboVAE.plan), got {type(plan).__name__}")
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
                 plan: Optional[PassPlan] = None, budget_bytes: Optional[int] = None) -> torch.Tensor:
    """Decode raw latents as the plan for these arguments says (module docstring: the modes).

    `tile_px=None`: 512 px in fast/exact mode, chosen by the budget in auto mode; `tile_px=0`: chosen by the budget
    in any mode. `overlap_px` must be below half the tile; None: 64 px, or a quarter of a smaller tile. Both in
    pixels (output pixels for decode, input pixels for encode), whatever the VAE's spatial factor.
    `temporal_slice` None: chosen by the budget (`budget_bytes`, default `vae.budget`).

    `progress(done, total)` is called after every step; an exception it raises (e.g. a UI interrupt) propagates
    and leaves the model usable. `output_device` is where the output goes (e.g. CPU to keep a long clip off the
    GPU: the plan then writes it there as it is made). Returns pixels in [-1, 1], model dtype.

    `plan`: a `plan_tiling(..., decode=True)` made for these latents (what the nodes log), run as it is, in place
    of the tiling arguments."""
    tiling = None
    if plan is not None:
        plan = _checked_plan(plan, True, tile_px, overlap_px, mode, temporal_slice)
    else:
        tiling = tiling_args(mode, tile_px, overlap_px, temporal_slice, spatial_factor=vae.spatial_factor)
    squeeze = latents.ndim == 4
    z = vae.check_latents(latents)
    vae.check_decoded_size(z, output_device)
    if plan is None:
        plan = planned_tiling(vae, PassShape.of(z, decode=True), tiling, budget_bytes=budget_bytes,
                              output_device=output_device)
    out = _tiled_pass(vae, z.to(device=vae.device, dtype=vae.dtype), plan, progress=progress,
                      output_device=output_device)
    return out.squeeze(2) if squeeze and out.shape[2] == 1 else out


def decode_tiled_checked(vae: TurboVAE, z: torch.Tensor, *, plan: PassPlan, progress: Progress = None,
                         output_device: Optional[torch.device] = None) -> torch.Tensor:
    """`decode_tiled` of 5-D latents `check_latents` has passed, run as `plan` (made for them): for a caller that
    checks a pass's input once and plans it itself (the nodes). All decoded frames, 5-D."""
    vae.check_decoded_size(z, output_device)
    return _tiled_pass(vae, z.to(device=vae.device, dtype=vae.dtype), plan, progress=progress,
                       output_device=output_device)


def encode_tiled(vae: TurboVAE, pixels: torch.Tensor, *, tile_px: Optional[int] = None,
                 overlap_px: Optional[int] = None, mode: str = "auto", temporal_slice: Optional[int] = None,
                 progress: Progress = None, sample: bool = False, generator: Optional[torch.Generator] = None,
                 output_device: Optional[torch.device] = None, plan: Optional[PassPlan] = None,
                 budget_bytes: Optional[int] = None) -> torch.Tensor:
    """Encode pixels as the plan for these arguments says; returns raw latents (the posterior mean, or a sample).

    Moments (mean ‖ log-variance) are blended by fast tiles, then the mean (or a posterior sample) is taken.
    Clips that are not 4n+1 frames are padded as `TurboVAE.encode` does. Other arguments as `decode_tiled`
    (`plan`: one made with decode=False)."""
    tiling = None
    if plan is not None:
        plan = _checked_plan(plan, False, tile_px, overlap_px, mode, temporal_slice)
    else:
        tiling = tiling_args(mode, tile_px, overlap_px, temporal_slice, spatial_factor=vae.spatial_factor)
    squeeze = pixels.ndim == 4
    x = vae.pad_frames(vae.check_pixels(pixels))
    if plan is None:
        plan = planned_tiling(vae, PassShape.of(x, decode=False), tiling, budget_bytes=budget_bytes,
                              output_device=output_device)
    out = encode_tiled_checked(vae, x, plan=plan, progress=progress, sample=sample, generator=generator,
                               output_device=output_device)
    return out.squeeze(2) if squeeze and out.shape[2] == 1 else out


def encode_tiled_checked(vae: TurboVAE, x: torch.Tensor, *, plan: PassPlan, progress: Progress = None,
                         sample: bool = False, generator: Optional[torch.Generator] = None,
                         output_device: Optional[torch.device] = None) -> torch.Tensor:
    """`encode_tiled` of a clip `check_pixels` has passed and `pad_frames` padded, run as `plan`, as
    `decode_tiled_checked`: raw latents, 5-D."""
    moments = _tiled_pass(vae, x.to(device=vae.device, dtype=vae.dtype), plan, progress=progress,
                          output_device=output_device)
    return moments_to_latents(moments, sample=sample, generator=generator)
