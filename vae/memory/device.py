"""Free-memory queries, the usable share of them, the fit check of a tensor and the measured fastest decode slice
(the planner, vae/planning/, chooses slices and tiles from predicted peaks)."""

from __future__ import annotations

import os
from typing import Optional

import torch

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


_COPY_SPEED: dict[str, float] = {}
COPY_PROBE_BYTES = 64 * 2**20  # big enough to reach the link's speed, small enough to take milliseconds


def host_to_device_bytes_per_s(device: torch.device) -> Optional[float]:
    """The measured speed of copying pinned host memory to `device` (bytes/s), once per device and process: what
    reloading a model unloaded to host memory costs (None off CUDA, where nothing is copied)."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    key = str(device)
    if key not in _COPY_SPEED:
        src = torch.empty(COPY_PROBE_BYTES, dtype=torch.uint8, pin_memory=True)
        dst = torch.empty(COPY_PROBE_BYTES, dtype=torch.uint8, device=device)
        dst.copy_(src, non_blocking=True)  # the first copy sets the link up
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(3):
            dst.copy_(src, non_blocking=True)
        end.record()
        end.synchronize()
        _COPY_SPEED[key] = 3 * COPY_PROBE_BYTES / (start.elapsed_time(end) / 1e3)
        del src, dst
    return _COPY_SPEED[key]


def process_rss_bytes() -> Optional[int]:
    """This process's resident memory now (Linux `/proc/self/statm`), or None where it cannot be read: what a CPU
    pass's budget shares with everything else the process holds."""
    try:
        with open("/proc/self/statm") as f:
            resident_pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return resident_pages * os.sysconf("SC_PAGE_SIZE")
