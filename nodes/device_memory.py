"""What a TurboVAE holds on its device, as ComfyUI's model management must see it.

Why: model management decides what to unload from each model's size. Engines and captured CUDA graphs hold
device memory of their own beside the weights (a graph keeps a whole pass of activations in its pool), so
both are counted, and when model management unloads the VAE to make room both are released too (engines
reload, graphs are captured again, on next use).

Both sides of core's accounting must agree: core reads "memory still to load" as the patcher's size minus its
loaded size, and its loaded size counts only the weights it moved itself. A pool or engine counted in the
size but not in the loaded size would read as memory still to load while the VAE already holds it, so
`TurboVAEPatcher.loaded_size` adds what the VAE holds beside its weights (the engines loaded now, the graph
pools): held memory is counted in both, memory not yet held (engines not loaded yet) only in the size.

Dynamic VRAM (core's comfy-aimdo path, docs/memory.md, "Dynamic VRAM") changes two things this module answers for:
- what a pass may count on (`freeable_bytes`): core pages dynamic models' weights out on demand, so what it can
  give a pass is its free memory plus those pages (what core's own VAE sizes its batches by,
  `ModelPatcher.get_free_memory`), less the `--vram-headroom` aimdo keeps free for everything else;
- which patcher the VAE gets: still core's legacy ModelPatcher. Core pages out only its cast-weight layers
  (comfy.ops); ours are plain modules it would load whole, and a dynamic patcher would report them as
  memory it can page out on demand, so model management would not unload the VAE for other dynamic models.
  Core's own VAE takes the same legacy patcher when it must be loaded whole (`disable_offload`).
"""

from __future__ import annotations

import importlib
from typing import Callable

import torch

import comfy.cli_args
import comfy.model_management as mm
import comfy.model_patcher
from comfy.patcher_extension import CallbacksMP

from ..vae.api import TurboVAE

try:  # dynamic VRAM's switch; cores before dynamic VRAM (0.3.x, 0.8.0) have no such module
    import comfy.memory_management as core_memory
except ImportError:
    core_memory = None


class TurboVAEPatcher(comfy.model_patcher.ModelPatcher):
    """Core's ModelPatcher whose loaded size also counts the device memory the VAE holds beside its
    weights (`held_beside_weights()`), so size minus loaded size is what is really still to load."""

    def __init__(self, model: torch.nn.Module, load_device: torch.device, offload_device: torch.device,
                 size: int, held_beside_weights: Callable[[], int]):
        super().__init__(model, load_device=load_device, offload_device=offload_device, size=size)
        self._held_beside_weights = held_beside_weights

    def loaded_size(self) -> int:
        return super().loaded_size() + self._held_beside_weights()


def vae_patcher(turbo: TurboVAE, module: torch.nn.Module, load_device: torch.device,
                offload_device: torch.device) -> tuple[comfy.model_patcher.ModelPatcher, Callable[[], None]]:
    """(the ModelPatcher for `module`, `recount()`): its size is the weights plus the engines, plus the
    CUDA-graph pools captured so far once `recount()` runs (after each pass); its loaded size counts the
    pools and the loaded engines as held; detaching releases both."""
    engine_bytes = _engine_bytes(turbo)
    base = mm.module_size(module) + engine_bytes
    patcher = TurboVAEPatcher(module, load_device, offload_device, base,
                              lambda: _engine_held_bytes(turbo) + turbo.graph_pool_bytes())

    def recount() -> None:
        patcher.size = base + turbo.graph_pool_bytes()

    def on_detach(_patcher, _unpatch_all) -> None:
        if engine_bytes:
            turbo.release_engines()
        turbo.release_graphs()
        recount()

    patcher.add_callback(CallbacksMP.ON_DETACH, on_detach)
    return patcher, recount


def _engine_bytes(turbo: TurboVAE) -> int:
    """Device memory of the engines behind an engine VAE once all are loaded (0 for a plain one)."""
    footprint = getattr(turbo, "engine_footprint_bytes", None)
    return int(footprint()) if footprint is not None else 0


def _engine_held_bytes(turbo: TurboVAE) -> int:
    """Device memory the engines loaded so far hold (0 for a plain VAE, or before the first engine loads)."""
    engines = getattr(turbo, "engines", None)
    return int(engines.memory_bytes()) if engines is not None else 0


def dynamic_vram_enabled() -> bool:
    """Whether this ComfyUI runs dynamic VRAM: core's main.py sets `comfy.memory_management.aimdo_enabled` once
    comfy-aimdo has initialised its devices (off with --disable-dynamic-vram, --cpu, --highvram, ...)."""
    return bool(getattr(core_memory, "aimdo_enabled", False))


def vram_headroom_bytes() -> int:
    """`--vram-headroom` (GB) in bytes: VRAM comfy-aimdo keeps free for everything else (0 on cores without it)."""
    return max(0, int(float(getattr(comfy.cli_args.args, "vram_headroom", 0) or 0) * 2**30))


def _aimdo_pageable_bytes(device: torch.device) -> int:
    """Weights of dynamic models on `device` that comfy-aimdo can page out on demand (core's
    `ModelPatcher.get_free_memory` adds the same `vbars_analyze`); 0 without comfy-aimdo."""
    try:
        model_vbar = importlib.import_module("comfy_aimdo.model_vbar")
    except ImportError:
        return 0
    return max(0, int(model_vbar.vbars_analyze(device.index)))


def freeable_bytes(device) -> int:
    """What model management can give a pass on `device` now: its free memory (`get_free_memory`) and, under
    dynamic VRAM on a CUDA device, the dynamic models' weights it pages out on demand, less `--vram-headroom`.
    The pass asks `load_models_gpu` for its predicted peak, which is what makes core page them out."""
    device = torch.device(device)
    free = int(mm.get_free_memory(device))
    if device.type != "cuda" or not dynamic_vram_enabled():
        return free
    return max(0, free + _aimdo_pageable_bytes(device) - vram_headroom_bytes())


def budget_source(device) -> str:
    """Where `freeable_bytes` came from, for the nodes' plan line."""
    device = torch.device(device)
    if device.type == "cuda" and dynamic_vram_enabled():
        return (f"ComfyUI's free memory plus the weights dynamic VRAM can page out, less the "
                f"{vram_headroom_bytes() / 2**20:.0f} MB VRAM headroom, on {device}")
    return f"ComfyUI's free memory on {device}"
