"""What a pass is measured with: a device sync before reading the clock, and the error of an output against a
reference (max abs error, PSNR).

Why here: the doctor's micro-bench (vae/doctor.py) and every benchmark section (bench/) time and compare passes
the same way, and the doctor must not import the benchmark.
"""

from __future__ import annotations

import torch


def sync(device: torch.device) -> None:
    """Wait for the device's queued work, so a wall-clock reading covers it (CUDA runs asynchronously)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def psnr(a: torch.Tensor, b: torch.Tensor, data_range: float = 2.0) -> float:
    """Peak signal-to-noise ratio in dB over `data_range` (2: pixels in [-1, 1]); inf for identical tensors."""
    mse = (a.float() - b.float()).pow(2).mean().item()
    return float("inf") if mse == 0 else 10 * torch.log10(torch.tensor(data_range**2 / mse)).item()
