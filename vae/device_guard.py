"""Run on a tensor's (or a requested) CUDA device, and leave the current device as it was found.

Why: Triton launches, AOTInductor loads, TensorRT deserialisation and the CUDA runtime calls behind them
use the *current* CUDA device, not the device of the tensors or the one a caller asked for. A model on
`cuda:1` (API `device="cuda:1"`, multi-GPU ComfyUI setups) would launch its kernels on, or load its
engines onto, GPU 0; and a pass that switches the device without restoring it leaves ComfyUI's later nodes
on another GPU. Every such entry point runs under `on_device(...)`.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable, ContextManager, Union

import torch

# The guard that makes CUDA device `index` current for a block and restores the previous one on exit (what
# tests replace with a recording fake; torch's own context does both).
cuda_device: Callable[[int], ContextManager] = torch.cuda.device


def on_device(device: Union[str, torch.device]) -> ContextManager:
    """`cuda_device(index)` for a CUDA device with an index; nothing to do for other devices or a bare
    `cuda` (which already means the current device)."""
    device = torch.device(device)
    if device.type != "cuda" or device.index is None:
        return nullcontext()
    return cuda_device(device.index)
