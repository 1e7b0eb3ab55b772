"""The memory budget of a pass inside ComfyUI, from ComfyUI's model management, the choice between fitting beside the
models core holds and unloading them, and the line the nodes log.

Why: a decode right after sampling shares the card with the diffusion model; every byte the VAE's pass takes is a
byte model management must offload that model for. So the pass may use what model management can free on the VAE's
device now, less the reserve core keeps free on every load (`extra_reserved_memory`: 400 MB on Linux, more on
Windows, `--reserve-vram`) and the VAE's weights when they still have to be loaded; the pass runs the fastest plan
whose predicted peak fits that (vae/planning). A plan that needs other models unloaded (planned under what the card
would have with them gone) is taken instead when the time it saves is more than unloading and reloading them costs
(their bytes at the host-to-device copy speed measured on this device), or when nothing fits without it; the log
line says which and why. Host memory is budgeted too: what core reports free on the CPU device, less a margin.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch

import comfy.model_management as mm

from ..vae.api import TurboVAE
from ..vae.memory.budget import BudgetTooSmall, default_host_budget_bytes
from ..vae.memory.device import host_to_device_bytes_per_s
from ..vae.planning import PassPlan
from ..vae.input_rules import PassShape, TilingArgs, pass_shape
from ..vae.tiled import check_exact_available
from .device_memory import budget_source, freeable_bytes

log = logging.getLogger("turbovae")

DEFAULT_RESERVE_BYTES = 400 * 2**20  # core's reserve on Linux, for cores without `extra_reserved_memory`


def weights_bytes(turbo: TurboVAE) -> int:
    """The bytes of the VAE's parameters: what loading it onto a device takes from a pass's budget."""
    return sum(p.numel() * p.element_size() for p in turbo.model.parameters())


def core_reserve_bytes() -> int:
    """What core keeps free beyond what a load asks for (`extra_reserved_memory`: its measured per-platform reserve
    for the driver, other programs and fragmentation, or `--reserve-vram`)."""
    reserve = getattr(mm, "extra_reserved_memory", None)
    return int(reserve()) if reserve is not None else DEFAULT_RESERVE_BYTES


def _weights_to_load(turbo: TurboVAE, device: torch.device) -> int:
    return weights_bytes(turbo) if turbo.device != torch.device(device) else 0


def comfy_budget_bytes(turbo: TurboVAE, device: torch.device) -> int:
    """What a pass may use on `device` without unloading other models: what model management can free now
    (`device_memory.freeable_bytes`) less core's reserve and the VAE's weights where they are not on `device` yet
    (at least 1 byte: the plan then takes its smallest slice)."""
    free = freeable_bytes(device)  # under dynamic VRAM also what core pages out on demand (device_memory.py)
    return max(1, free - core_reserve_bytes() - _weights_to_load(turbo, device))


def comfy_capacity_bytes(turbo: TurboVAE, device: torch.device) -> int:
    """What a pass could have on `device` if model management unloaded every other model: the device's memory less
    core's reserve and the VAE's weights (at least 1 byte)."""
    total = int(mm.get_total_memory(device))
    return max(1, total - core_reserve_bytes() - weights_bytes(turbo))


def comfy_host_budget_bytes() -> int:
    """What a pass may keep in host memory inside ComfyUI: what core reports free on the CPU device (the RAM its
    offloaded models and everything else leave) less the host margin (`vae.memory.budget.host_margin_bytes`)."""
    return default_host_budget_bytes(int(mm.get_free_memory(torch.device("cpu"))))


def unload_decision(kept: Optional[PassPlan], unloading: Optional[PassPlan], free_bytes: int,
                    bytes_per_s: Optional[float]) -> tuple[Optional[PassPlan], str]:
    """(the plan to run, why) between `kept` (fits beside the models core holds; None: none does) and `unloading`
    (needs other models unloaded; None: none fits even then): the one that unloads is taken when nothing else fits,
    or when the time it saves exceeds moving the models out and back in (`free_bytes`: what is free without
    unloading; the bytes over it leave the device and come back at `bytes_per_s`)."""
    if kept is None:
        return unloading, "nothing fits beside the models ComfyUI holds, so it unloads what the plan needs"
    if unloading is None or unloading.layout() == kept.layout() or unloading.cost_s is None or kept.cost_s is None:
        return kept, ""
    saved = kept.cost_s - unloading.cost_s
    need = unloading.predicted.pass_bytes if unloading.predicted is not None else 0
    moved = max(0, need - free_bytes)
    reload_s = 2 * moved / bytes_per_s if bytes_per_s else float("inf")  # out to host memory, and back
    mb = moved / 2**20
    if saved > reload_s:
        return unloading, (f"other models unloaded ({mb:.0f} MB): the plan saves {saved:.2f} s, moving them out and "
                           f"back in costs {reload_s:.2f} s")
    return kept, (f"other models kept loaded: unloading {mb:.0f} MB would save {max(saved, 0):.2f} s and cost "
                  f"{reload_s:.2f} s to move them out and back in")


def plan_in_comfy(turbo: TurboVAE, shape: PassShape, device: torch.device, *, log_it: bool = True,
                  tiling: TilingArgs = TilingArgs(), **request) -> PassPlan:
    """The plan of one pass over validated input `shape` on `device` (vae/planning; `tiling`: the checked mode, tile,
    overlap and temporal slice; `request`: `TurboVAE.plan`'s max_temporal_slice, output_device) under the ComfyUI
    budget: the fastest plan that fits beside the models core holds, or one that needs some of them unloaded when
    that saves more time than reloading them costs (`unload_decision`); the node asks `load_models_gpu` for the
    plan's peak, which makes core unload them. Logs the plan and the choice. BudgetTooSmall when even an empty card is
    too little, naming the smallest budget that works."""
    device = torch.device(device)
    source = budget_source(device)
    host = comfy_host_budget_bytes()
    now = comfy_budget_bytes(turbo, device)
    capacity = comfy_capacity_bytes(turbo, device)

    def planned(budget: int) -> Optional[PassPlan]:
        try:
            return turbo.plan_checked(shape, tiling, budget_bytes=budget, device=device, host_budget_bytes=host,
                                      **request)
        except BudgetTooSmall:
            if budget >= capacity:
                raise
            return None

    kept = planned(now)
    unloading = planned(capacity) if capacity > now and (kept is None or kept.mode != "untiled"
                                                          or kept.temporal_slice is not None) else None
    plan, why = unload_decision(kept, unloading, now, host_to_device_bytes_per_s(device))
    if plan is unloading and unloading is not None:
        source = f"what ComfyUI can free on {device} by unloading other models"
    if log_it:
        log.info("TurboVAE: %s (budget: %s)%s", plan.describe(), source, f"; {why}" if why else "")
    return plan


def item_shape(turbo: TurboVAE, shape, *, decode: bool) -> PassShape:
    """The input one pass of ours sees for input `shape` ([B, C, T, ...] or [B, C, H, W]), checked by the input rules
    (vae/input_rules.py) as the pass itself checks it: latents decode one batch item at a time; pixels encode their B
    clips together, padded to 1 + 4n frames as the public path pads."""
    checked = pass_shape(shape, turbo.latent_format, turbo.kind, decode=decode, pad=True)
    return checked.one_item() if decode else checked


def plan_item(turbo: TurboVAE, shape: PassShape, device: torch.device, *, log_it: bool = True, **request) -> PassPlan:
    """`plan_in_comfy` for the pass one node call runs over validated input `shape` (`item_shape`, or a checked
    tensor's `PassShape.of`): a decode runs its batch items one at a time."""
    return plan_in_comfy(turbo, shape.one_item() if shape.decode else shape, device, log_it=log_it, **request)


def tiled_plan(turbo: TurboVAE, shape: PassShape, device: torch.device, *, tiling: TilingArgs,
               output_device: Optional[torch.device] = None) -> PassPlan:
    """The plan of a tiled pass of ours over validated input `shape` (the whole batch at once; an encode's clip
    padded) and checked `tiling` under the ComfyUI budget."""
    check_exact_available(turbo, tiling, decode=shape.decode)
    return plan_in_comfy(turbo, shape, device, tiling=tiling, output_device=output_device)
