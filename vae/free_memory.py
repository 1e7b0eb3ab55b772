"""Free-memory queries and the choices derived from them (temporal slice, tile size)."""

from __future__ import annotations

import os
from typing import Optional

import torch

from .base import WorkingSetModel

# Never plan to use more than this share of what is free: allocator fragmentation and the rest
# of the graph (ComfyUI keeps other models resident) need headroom.
USABLE_FRACTION = 0.6


def free_memory_bytes(device: torch.device) -> int:
    """Bytes that can still be allocated on `device` (CUDA: driver-reported free + torch's cached pool)."""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        free, _total = torch.cuda.mem_get_info(device)
        reserved = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(free + max(reserved, 0))
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:  # pragma: no cover - psutil is optional
        pages = os.sysconf("SC_AVPHYS_PAGES")
        return int(pages * os.sysconf("SC_PAGE_SIZE"))


def total_memory_bytes(device: torch.device) -> int:
    """All memory `device` has (CUDA: the GPU's; else physical RAM): a tensor larger than this can never
    be allocated, whatever is freed."""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(device).total_memory)
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except ImportError:  # pragma: no cover - psutil is optional
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


class InputTooLarge(ValueError):
    """An input whose output (or own dense copy) could never fit in the device's memory."""


def check_fits(what: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> None:
    """InputTooLarge, before anything is allocated, when a tensor of `shape` and `dtype` is larger than all
    the memory `device` has. Why: torch reports such a request as a raw allocator error (or, on CPU, may
    start paging) only after the work began; tiling cannot help either, since the result itself is that big."""
    numel = 1
    for d in shape:
        numel *= int(d)
    need = numel * torch.empty((), dtype=dtype).element_size()
    have = total_memory_bytes(device)
    if need > have:
        raise InputTooLarge(f"{what} of shape {tuple(shape)} would need {need / 2**30:.1f} GiB of {dtype}, more than "
                            f"the {have / 2**30:.1f} GiB {torch.device(device)} has; use a smaller input (crop, or "
                            "fewer frames per call)")


# Latent frames per decode slice that ran fastest, per device type, where memory would allow more (slicing is exact,
# so this changes time and memory only): smaller working sets stay in cache. Measured by `python -m turbovae bench
# --sections slices` (docs/BENCHMARKS.md, "Temporal slices"); device types not listed (CUDA) and encode are not
# measured yet, so the memory rule alone decides there (the largest slice that fits).
FASTEST_SLICE = {"cpu": 2}


def auto_temporal_slice(memory_model: WorkingSetModel, pixels_per_frame: int, latent_frames: int,
                        dtype: torch.dtype, device: torch.device, *, decode: bool,
                        temporal_factor: int = 4, budget: Optional[int] = None) -> Optional[int]:
    """Latent frames per slice: the largest whose working set fits the budget, for decode capped at the
    device type's measured fastest slice (FASTEST_SLICE); None = whole clip.

    The hand-estimate rule (`WorkingSetModel`) the passes used before slices were chosen by predicted peak under a
    budget (vae/memory_budget.py); kept for the comparison with the first GPU run, which used it
    (bench/peak_prediction.py), and for its own tests.

    The first slice carries one extra latent (1+k); the estimate covers it.
    """
    if latent_frames <= 1:
        return None
    budget = int(free_memory_bytes(device) * USABLE_FRACTION) if budget is None else budget

    def fits(k: int) -> bool:
        frames = 1 + k * temporal_factor
        return memory_model.bytes_needed(pixels_per_frame, frames, dtype, decode=decode) <= budget

    fastest = FASTEST_SLICE.get(torch.device(device).type) if decode else None
    k = latent_frames - 1 if fastest is None else min(fastest, latent_frames - 1)
    if k == latent_frames - 1 and fits(k):
        return None
    while k > 1 and not fits(k):
        k //= 2
    return max(k, 1)
