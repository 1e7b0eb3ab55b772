"""Vendor peak figures of the GPUs the benchmarks name: the one table every floor is computed from.

A floor is the time a pass cannot beat on a device: its FLOPs at the dense bf16 tensor-core peak, or its
bytes at the memory bandwidth, whichever is longer. The figures are the vendors' (SXM parts); docs/gpu.md
cites them. `peak_of(device_name)` matches a CUDA device name such as "NVIDIA H100 80GB HBM3".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class DevicePeak:
    """What one device can do at best: dense bf16 tensor-core TFLOP/s and memory bandwidth in TB/s."""

    name: str
    bf16_tflops: float
    tb_per_s: float

    def flop_floor_ms(self, flops: float) -> float:
        return flops / (self.bf16_tflops * 1e12) * 1e3

    def byte_floor_ms(self, nbytes: float) -> float:
        return nbytes / (self.tb_per_s * 1e12) * 1e3


# Key: a substring of the CUDA device name.
DEVICE_PEAKS: dict[str, DevicePeak] = {
    "H100": DevicePeak("H100 SXM", 989.0, 3.35),
    "H200": DevicePeak("H200 SXM", 989.0, 4.8),
}


def peak_of(device_name: str) -> Optional[DevicePeak]:
    """The peaks of the first table entry whose key is in `device_name`, or None for a device not listed."""
    return next((p for k, p in DEVICE_PEAKS.items() if k in device_name), None)
