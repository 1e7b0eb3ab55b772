"""The memory budget of a pass inside ComfyUI, from ComfyUI's model management, and the line the nodes log.

Why: a decode right after sampling shares the card with the diffusion model; every byte the VAE's pass takes is a
byte model management must offload that model for. So the pass may use what model management reports free on
the VAE's device now (USABLE_FRACTION of it, less the VAE's weights when they still have to be loaded), and the
temporal slice is the largest whose predicted peak fits that (vae/memory_budget.py). When even one latent per
step does not fit, the pass asks model management for what that step needs (it then offloads other models).
"""

from __future__ import annotations

import logging

import torch

import comfy.model_management as mm

from ..vae.api import TurboVAE
from ..vae.free_memory import USABLE_FRACTION
from ..vae.memory_budget import SlicePlan
from .device_memory import budget_source, freeable_bytes

log = logging.getLogger("turbovae")


def comfy_budget_bytes(turbo: TurboVAE, device: torch.device) -> int:
    """USABLE_FRACTION of what ComfyUI's model management can free on `device` (`device_memory.freeable_bytes`),
    less the VAE's weights where they are not on `device` yet (at least 1 byte: the plan then takes its smallest
    slice)."""
    free = freeable_bytes(device)  # under dynamic VRAM also what core pages out on demand (device_memory.py)
    weights = 0
    if turbo.device != torch.device(device):
        weights = sum(p.numel() * p.element_size() for p in turbo.model.parameters())
    return max(1, int(free * USABLE_FRACTION) - weights)


def plan_in_comfy(turbo: TurboVAE, shape: tuple[int, ...], device: torch.device, *, decode: bool,
                  log_it: bool = True) -> SlicePlan:
    """The temporal slice of one pass over `shape` ([1, ...]: one batch item) on `device` under the ComfyUI budget,
    with its predicted peak; logs what the pass will need and what it chose."""
    plan = turbo.plan_temporal_slice(tuple(int(d) for d in shape), decode=decode,
                                     budget_bytes=comfy_budget_bytes(turbo, device), device=device)
    if log_it:
        log.info("TurboVAE: %s (budget: %s)", plan.describe(), budget_source(device))
    return plan


def plan_item(turbo: TurboVAE, shape, device: torch.device, *, decode: bool, log_it: bool = True) -> SlicePlan:
    """`plan_in_comfy` for one batch item of `shape` ([B, C, T, ...] or [B, C, H, W]) as the pass sees it: latents
    decode one item at a time; pixels encode as one clip, padded to 1+4n frames as the public path pads."""
    # a wrong channel count is the caller's error, said as the pass itself says it: a meta pass over that shape
    # would only fail inside a layer
    channels = turbo.latent_channels if decode else turbo.image_channels
    if len(shape) < 4 or shape[1] != channels:
        what = "latents" if decode else "pixels"
        raise ValueError(f"{what} must have {channels} channels for a {turbo.kind} VAE; got shape {tuple(shape)}")
    t = shape[2] if len(shape) == 5 else 1
    if not decode:
        t += (-(t - 1)) % turbo.temporal_factor
    return plan_in_comfy(turbo, (1, shape[1], t, shape[-2], shape[-1]), device, decode=decode, log_it=log_it)
