"""What a TurboVAE holds on its device, as ComfyUI's model management must see it.

Why: model management decides what to unload from each model's size. Engines and captured CUDA graphs hold
device memory of their own beside the weights (a graph keeps a whole pass of activations in its pool), so
both are counted, and when model management unloads the VAE to make room both are released too (engines
reload, graphs are captured again, on next use).
"""

from __future__ import annotations

from typing import Callable

import torch

import comfy.model_management as mm
import comfy.model_patcher
from comfy.patcher_extension import CallbacksMP

from ..vae.api import TurboVAE


def vae_patcher(turbo: TurboVAE, module: torch.nn.Module, load_device: torch.device,
                offload_device: torch.device) -> tuple[comfy.model_patcher.ModelPatcher, Callable[[], None]]:
    """(the ModelPatcher for `module`, `recount()`): its size is the weights plus the engines, plus the
    CUDA-graph pools captured so far once `recount()` runs (after each pass); detaching releases both."""
    engine_bytes = _engine_bytes(turbo)
    base = mm.module_size(module) + engine_bytes
    patcher = comfy.model_patcher.ModelPatcher(module, load_device=load_device, offload_device=offload_device,
                                               size=base)

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
    """Device memory of the engines behind an engine VAE (0 for a plain one)."""
    footprint = getattr(turbo, "engine_footprint_bytes", None)
    return int(footprint()) if footprint is not None else 0
