"""Temporal slices chosen by predicted peak memory under a budget, not by free memory.

Why: the slice used to be the largest whose hand-estimated working set fit 60 % of free memory, so an empty
80 GB card took slices that need tens of GB, and a 12–24 GB card next to a resident diffusion model guessed. Here
every candidate slice's peak is predicted by running the pass on meta tensors (vae/peak_memory.py), and the
largest slice whose predicted peak fits the budget wins. The budget is the caller's (the ComfyUI nodes take it
from ComfyUI's model management); otherwise `default_budget_bytes`: DEFAULT_PASS_BUDGET_BYTES, or less where the
device has less free. docs/memory.md describes the rule and the prediction's measured error.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch

from .base import LatentFormat, VAEModel
from .free_memory import FASTEST_SLICE, USABLE_FRACTION, free_memory_bytes
from .peak_memory import MetaPasses, PassPaths, PeakPrediction

log = logging.getLogger("turbovae")

# The pass budget outside ComfyUI (weights and input not included): what a 24 GB card can spare for the VAE's
# working memory beside a resident diffusion model. Override per call (`budget_bytes=`) or with MemoryBudget.
DEFAULT_PASS_BUDGET_BYTES = 10 * 2**30


class BudgetTooSmall(ValueError):
    """No temporal slice of a pass fits the memory budget: even one latent frame per step needs more."""


@dataclass(frozen=True)
class MemoryBudget:
    """The memory a pass may use for its own tensors, in bytes (the weights and the input are held anyway and are
    not part of it). `pass_bytes` None: `default_budget_bytes(device)`."""

    pass_bytes: Optional[int] = None

    def __post_init__(self) -> None:
        if self.pass_bytes is not None and (isinstance(self.pass_bytes, bool) or not isinstance(self.pass_bytes, int)
                                            or self.pass_bytes <= 0):
            raise ValueError(f"pass_bytes={self.pass_bytes!r} must be a positive number of bytes (or None for the "
                             "default budget)")

    def resolve(self, device: Union[str, torch.device]) -> int:
        return default_budget_bytes(device) if self.pass_bytes is None else self.pass_bytes


def default_budget_bytes(device: Union[str, torch.device]) -> int:
    """The budget outside ComfyUI: DEFAULT_PASS_BUDGET_BYTES, or USABLE_FRACTION of the device's free memory where
    that is less."""
    return min(DEFAULT_PASS_BUDGET_BYTES, int(free_memory_bytes(torch.device(device)) * USABLE_FRACTION))


@dataclass(frozen=True)
class SlicePlan:
    """The temporal slice chosen for a pass and what it is predicted to need. `temporal_slice` None: the whole
    clip in one step. `fits`: whether `predicted.pass_bytes` is within `budget_bytes` (False only when nothing
    fits and the caller asked for the smallest slice anyway)."""

    shape: tuple[int, ...]
    decode: bool
    dtype: torch.dtype
    temporal_slice: Optional[int]
    predicted: PeakPrediction
    budget_bytes: int
    fits: bool

    def describe(self) -> str:
        """One line: what the pass will need and what was chosen (the nodes log it)."""
        what = "decode" if self.decode else "encode"
        shape = "x".join(str(d) for d in self.shape)
        step = "whole clip" if self.temporal_slice is None else f"temporal slice {self.temporal_slice} latent(s)"
        mb = 2 ** 20
        verdict = "within" if self.fits else "OVER"
        return (f"{what} {shape} {str(self.dtype).removeprefix('torch.')}: {step}, predicted peak "
                f"{self.predicted.pass_bytes / mb:.0f} MB for the pass (+{self.predicted.weight_bytes / mb:.0f} MB "
                f"weights, {self.predicted.input_bytes / mb:.0f} MB input), {verdict} the budget of "
                f"{self.budget_bytes / mb:.0f} MB")


def latent_count(model: VAEModel, shape: Sequence[int], decode: bool) -> int:
    return int(shape[2]) if decode else model.latent_format.latent_frames(int(shape[2]))


def choose_temporal_slice(model: VAEModel, shape: Sequence[int], *, decode: bool, budget_bytes: int,
                          dtype: Optional[torch.dtype] = None, paths: Optional[PassPaths] = None,
                          copies: Optional[MetaPasses] = None, device_type: Optional[str] = None,
                          strict: bool = False) -> SlicePlan:
    """The largest temporal slice whose predicted pass peak fits `budget_bytes` (whole clip when it fits).

    Decode slices are capped at the device type's measured fastest slice (`FASTEST_SLICE`; slicing is exact, so
    that changes only time and memory). Nothing fits: BudgetTooSmall when `strict`, else the one-latent slice
    with `fits=False` (the caller may tile). `device_type` default: the model's device's.
    """
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes <= 0:
        raise ValueError(f"budget_bytes={budget_bytes!r} must be a positive integer number of bytes")
    shape = tuple(int(d) for d in shape)
    dtype = dtype or model.dtype
    copies = copies or MetaPasses(model)
    paths = paths or PassPaths.of(model, model.device, dtype)
    device_type = device_type or model.device.type

    def plan(k: Optional[int]) -> SlicePlan:
        p = copies.predict(shape, decode=decode, dtype=dtype, temporal_slice=k, paths=paths)
        return SlicePlan(shape, decode, dtype, k, p, budget_bytes, p.pass_bytes <= budget_bytes)

    latents = latent_count(model, shape, decode)
    if latents <= 1:
        whole = plan(None)
        if not whole.fits and strict:
            raise _too_small(whole)
        return whole
    fastest = FASTEST_SLICE.get(device_type) if decode else None
    top = latents - 1 if fastest is None else min(fastest, latents - 1)
    if top == latents - 1:
        whole = plan(None)
        if whole.fits:
            return whole
        top -= 1
    best = None
    lo, hi = 1, top  # the peak grows with the slice: the largest k that fits, by bisection
    while lo <= hi:
        mid = (lo + hi) // 2
        candidate = plan(mid)
        if candidate.fits:
            best, lo = candidate, mid + 1
        else:
            hi = mid - 1
    if best is not None:
        return best
    smallest = plan(1)
    if strict:
        raise _too_small(smallest)
    return smallest


def _too_small(p: SlicePlan) -> BudgetTooSmall:
    need = p.predicted.pass_bytes
    return BudgetTooSmall(f"{p.describe()}; nothing smaller runs untiled. Raise the budget to at least "
                          f"{math.ceil(need / 2**20)} MB, or tile the frame (tiled_decode / tiled_encode with a "
                          "smaller tile_px)")


def near_square_shape(model: VAEModel, latent_frames: int, pixels_per_frame: int, *, decode: bool,
                      batch: int = 1) -> tuple[int, ...]:
    """An input shape of `latent_frames` latents and about `pixels_per_frame` pixels per frame (the output's for
    decode, the input's for encode), as near square as the spatial factor allows: for callers that know only the
    pixel count."""
    f = model.latent_format.spatial_factor
    lat_px = max(1, round(pixels_per_frame / (f * f)))
    h = max(1, math.isqrt(lat_px))
    w = max(1, math.ceil(lat_px / h))
    return pass_input_shape(model.latent_format, latent_frames, h, w, decode=decode, batch=batch)


def pass_input_shape(fmt: LatentFormat, latent_frames: int, h_lat: int, w_lat: int, *, decode: bool,
                     batch: int = 1) -> tuple[int, ...]:
    """The input of a pass over `latent_frames` latents of `h_lat`×`w_lat`: the latents for decode, the (1 + 4n
    frame) pixels for encode."""
    if decode:
        return batch, fmt.channels, latent_frames, h_lat, w_lat
    f = fmt.spatial_factor
    return batch, fmt.image_channels, fmt.pixel_frames(latent_frames), h_lat * f, w_lat * f
