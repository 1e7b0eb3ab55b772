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
"""

from __future__ import annotations

from typing import Callable

import torch

import comfy.model_management as mm
import comfy.model_patcher
from comfy.patcher_extension import CallbacksMP

from ..vae.api import TurboVAE


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
