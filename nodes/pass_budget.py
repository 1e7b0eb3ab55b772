"""The memory budget of a pass inside ComfyUI, from ComfyUI's model management, and the line the nodes log.

Why: a decode right after sampling shares the card with the diffusion model; every byte the VAE's pass takes is a
byte model management must offload that model for. So the pass may use what model management reports free on
the VAE's device now (USABLE_FRACTION of it, less the VAE's weights when they still have to be loaded), and the
pass runs the fastest plan whose predicted peak fits that (vae/planning). When none does, it plans under what
model management could free by unloading other models and asks it for the plan's peak (it then unloads them).
"""

from __future__ import annotations

import logging
from typing import Optional

import torch

import comfy.model_management as mm

from ..vae.api import TurboVAE
from ..vae.memory.device import USABLE_FRACTION
from ..vae.memory.budget import BudgetTooSmall
from ..vae.planning import PassPlan
from ..vae.tiled import check_tiling
from .device_memory import budget_source, freeable_bytes

log = logging.getLogger("turbovae")


def weights_bytes(turbo: TurboVAE) -> int:
    """The bytes of the VAE's parameters: what loading it onto a device takes from a pass's budget."""
    return sum(p.numel() * p.element_size() for p in turbo.model.parameters())


def comfy_budget_bytes(turbo: TurboVAE, device: torch.device) -> int:
    """USABLE_FRACTION of what ComfyUI's model management can free on `device` (`device_memory.freeable_bytes`),
    less the VAE's weights where they are not on `device` yet (at least 1 byte: the plan then takes its smallest
    slice)."""
    free = freeable_bytes(device)  # under dynamic VRAM also what core pages out on demand (device_memory.py)
    weights = 0
    if turbo.device != torch.device(device):
        weights = weights_bytes(turbo)
    return max(1, int(free * USABLE_FRACTION) - weights)


def comfy_capacity_bytes(turbo: TurboVAE, device: torch.device) -> int:
    """What a pass could have on `device` if model management unloaded every other model: USABLE_FRACTION of the
    device's memory less the VAE's weights (at least 1 byte)."""
    total = int(mm.get_total_memory(device))
    return max(1, int(total * USABLE_FRACTION) - weights_bytes(turbo))


def plan_in_comfy(turbo: TurboVAE, shape: tuple[int, ...], device: torch.device, *, decode: bool,
                  log_it: bool = True, **request) -> PassPlan:
    """The plan of one pass over `shape` on `device` (vae/planning; `request`: `TurboVAE.plan`'s mode, tile_px,
    overlap_px, temporal_slice, max_temporal_slice, output_device) under the ComfyUI budget — what model
    management can free now; when no plan fits that, what it could free by unloading other models (the node asks
    `load_models_gpu` for the plan's peak, which makes it unload them). Logs the plan. BudgetTooSmall when even that
    is too little, naming the smallest budget that works."""
    source = budget_source(device)
    try:
        plan = turbo.plan(tuple(int(d) for d in shape), decode=decode, budget_bytes=comfy_budget_bytes(turbo, device),
                          device=device, **request)
    except BudgetTooSmall:
        plan = turbo.plan(tuple(int(d) for d in shape), decode=decode,
                          budget_bytes=comfy_capacity_bytes(turbo, device), device=device, **request)
        source = f"what ComfyUI can free on {device} by unloading other models"
    if log_it:
        log.info("TurboVAE: %s (budget: %s)", plan.describe(), source)
    return plan


def item_shape(turbo: TurboVAE, shape, *, decode: bool) -> tuple[int, ...]:
    """The shape one pass of ours sees for input `shape` ([B, C, T, ...] or [B, C, H, W]): latents decode one batch
    item at a time; pixels encode their B clips together, padded to 1 + 4n frames as the public path pads.
    ValueError for a wrong channel count, said as the pass itself says it (a meta pass over that shape would only
    fail inside a layer)."""
    channels = turbo.latent_channels if decode else turbo.image_channels
    if len(shape) < 4 or shape[1] != channels:
        what = "latents" if decode else "pixels"
        raise ValueError(f"{what} must have {channels} channels for a {turbo.kind} VAE; got shape {tuple(shape)}")
    t = shape[2] if len(shape) == 5 else 1
    if not decode:
        t += (-(t - 1)) % turbo.temporal_factor
    return (1 if decode else int(shape[0]), int(shape[1]), int(t), int(shape[-2]), int(shape[-1]))


def plan_item(turbo: TurboVAE, shape, device: torch.device, *, decode: bool, log_it: bool = True,
              **request) -> PassPlan:
    """`plan_in_comfy` for the pass one node call runs over input `shape` (`item_shape`)."""
    return plan_in_comfy(turbo, item_shape(turbo, shape, decode=decode), device, decode=decode, log_it=log_it,
                         **request)


def tiled_plan(turbo: TurboVAE, shape, device: torch.device, *, decode: bool, tile_px: Optional[int],
               overlap_px: Optional[int], mode: str, temporal_slice: Optional[int],
               output_device: Optional[torch.device] = None) -> PassPlan:
    """The plan of a tiled pass of ours over `shape` (the whole batch at once) under the ComfyUI budget, the arguments
    checked as `decode_tiled` checks them (an encode's clip padded to 1 + 4n frames)."""
    overlap_px = check_tiling(tile_px, overlap_px, mode, turbo.spatial_factor, temporal_slice)
    shape = tuple(int(d) for d in shape)
    if not decode:
        t = shape[2]
        shape = (*shape[:2], t + (-(t - 1)) % turbo.temporal_factor, *shape[3:])
    return plan_in_comfy(turbo, shape, device, decode=decode, mode=mode, tile_px=tile_px, overlap_px=overlap_px,
                         temporal_slice=temporal_slice, output_device=output_device)
