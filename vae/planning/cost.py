"""How long a plan is expected to take, to choose among the plans that fit: the fastest by this estimate.

A plan's time is its arithmetic (the untiled pass's FLOPs, `predict.pass_work`, at the device's sustained rate),
what its tiling adds to that arithmetic (halos recomputed by exact staged tiles, overlaps by fast tiles, the
layer-wise pass's band kernels), a fixed cost per causal step of each tile and per band of each layer-wise layer
(kernel launches, Python), and the bytes it copies between host and device memory (the caches and output it keeps
there, and a streamed pass's activations). Each part is reported (`CostBreakdown`), so the bench can set the
estimate beside what a pass measured part by part (`python -m turbovae bench --sections plan_costs`). The constants
are per device type: they order plans, they do not promise times.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction

from ..base import VAEModel
from ..tiling.exact import ExactPlan, LocalStage, partition, stage_halos
from .plan import PassPlan
from .predict import PassWork

# Bytes a streamed pass moves per byte of the untiled pass's convolution inputs and outputs: each activation is
# written once and read once by the next layer, plus the residual reads of the blocks and the halo rows of each band.
STREAMED_TRAFFIC = 1.3


@dataclass(frozen=True)
class DeviceSpeed:
    """`flops_per_s`: the untiled pass's sustained throughput; `step_s`: the fixed cost of one causal step of one
    tile (or one frame stage step); `band_s`: the fixed cost of one band of one layer-wise layer; `host_bytes_per_s`:
    copies between host and device memory, each direction (on the CPU: a memory copy); `fetch_copies`: whether
    reading host-held memory copies it (a GPU; on the CPU held memory is used where it lies); `layerwise_factor`:
    the layer-wise pass's arithmetic time over the untiled pass's (band kernels, normalisation into each band)."""

    flops_per_s: float
    step_s: float
    band_s: float
    host_bytes_per_s: float
    fetch_copies: bool
    layerwise_factor: float


# One H100/H200 in bf16 (docs/results: ~100-400 TFLOP/s on the VAE passes; pageable copies ~25 GB/s, pinned 55) and
# this project's 2-core CPU in fp32, idle (docs/BENCHMARKS.md, "Where a plan's time goes": the untiled passes' rate;
# the layer-wise bands' convolutions against the untiled pass's for the same arithmetic, on the oneDNN kernels
# vae/memory/cpu_conv.py picks for them; the layer-wise passes' time outside convolutions beyond the untiled pass's,
# per band).
SPEEDS = {
    "cuda": DeviceSpeed(flops_per_s=250e12, step_s=0.004, band_s=0.0004, host_bytes_per_s=25e9, fetch_copies=True,
                        layerwise_factor=1.3),
    "cpu": DeviceSpeed(flops_per_s=0.35e12, step_s=0.02, band_s=0.0005, host_bytes_per_s=8e9, fetch_copies=False,
                       layerwise_factor=1.25),
}


def speed(device_type: str) -> DeviceSpeed:
    return SPEEDS.get(device_type, SPEEDS["cpu"])


@dataclass(frozen=True)
class CostBreakdown:
    """A plan's expected seconds, part by part: `compute_s` its arithmetic at the untiled rate; `tiling_s` what its
    tiling adds to it (halos, overlaps, band kernels); `launch_s` the fixed costs per step, tile and band; `host_s`
    the copies between host and device memory."""

    compute_s: float
    tiling_s: float
    launch_s: float
    host_s: float

    @property
    def total_s(self) -> float:
        return self.compute_s + self.tiling_s + self.launch_s + self.host_s


def estimate_s(model: VAEModel, plan: PassPlan, work: PassWork, *, cache_bytes: int = 0) -> float:
    """Seconds `plan` is expected to take (`breakdown(...).total_s`)."""
    return breakdown(model, plan, work, cache_bytes=cache_bytes).total_s


def breakdown(model: VAEModel, plan: PassPlan, work: PassWork, *, cache_bytes: int = 0) -> CostBreakdown:
    """`plan`'s expected time part by part; `work` is the untiled pass's (`predict.pass_work`), `cache_bytes` the
    causal caches of one whole-frame step (what a plan with caches in host memory moves each step)."""
    sp = speed(plan.device_type)
    compute = work.flops / sp.flops_per_s
    tiling = compute * (work_factor(model, plan) - 1.0)
    latents = plan.shape[2] if plan.decode else model.latent_format.latent_frames(plan.shape[2])
    steps = temporal_steps(model, plan, latents)
    tiles = plan.tiles if plan.mode not in ("untiled",) and not _layerwise(model, plan) else 1
    launch = steps * tiles * sp.step_s
    if _layerwise(model, plan):
        launch += layerwise_bands(plan, work) * sp.band_s
    written = read = 0.0
    if plan.cache_on_host:  # every held history goes out once and comes back once per step
        written += cache_bytes * steps
        read += cache_bytes * steps
    if plan.output_on_host:
        written += _output_elements(model, plan) * plan.dtype.itemsize
    if plan.frames_on_host:  # each activation written to host memory and read back
        written += STREAMED_TRAFFIC * work.io_bytes / 2
        read += STREAMED_TRAFFIC * work.io_bytes / 2
    moved = written + (read if sp.fetch_copies else 0.0)
    return CostBreakdown(compute, tiling, launch, moved / sp.host_bytes_per_s)


def _layerwise(model: VAEModel, plan: PassPlan) -> bool:
    return plan.mode == "exact" and model.exact_plan(decode=plan.decode).holds_whole_frames


def layerwise_bands(plan: PassPlan, work: PassWork) -> float:
    """Bands a layer-wise plan runs over the whole pass, about: every convolution's input and output elements
    (`work.io_bytes`) cut into bands of the plan's element budget (a tile of `tile_px` pixels at 128 channels)."""
    budget = (plan.tile_px or 1) ** 2 * 128
    return work.io_bytes / plan.dtype.itemsize / 2 / budget


def temporal_steps(model: VAEModel, plan: PassPlan, latents: int) -> int:
    """Causal steps of the pass: temporal slices, or with frame stages one step per frame at each stage (counted
    as the output frames of a decode, the input frames of an encode)."""
    if plan.frame_stages:
        return model.latent_format.pixel_frames(latents)
    if plan.temporal_slice is None or latents <= 1:
        return 1
    k = plan.temporal_slice
    return 1 + max(0, math.ceil((latents - 1 - k) / k))  # 1 + k latents first, then k per step


def work_factor(model: VAEModel, plan: PassPlan) -> float:
    """The plan's arithmetic over the untiled pass's: 1 untiled; halo recompute of exact staged tiles; the
    layer-wise factor of exact layer-wise tiles; overlaps of fast tiles."""
    if plan.mode == "untiled":
        return 1.0
    h, w = plan.latent_hw
    tile = plan.tile_latent or max(h, w)
    if plan.mode == "fast":
        grid = plan.grid()
        covered = sum(r.size * c.size for _i, _j, r, c in grid)
        return covered / (h * w)
    exact = model.exact_plan(decode=plan.decode)
    if exact.holds_whole_frames:
        return speed(plan.device_type).layerwise_factor
    return halo_factor(exact, h, w, tile, plan.decode, model.latent_format.spatial_factor)


def halo_factor(exact: ExactPlan, h: int, w: int, tile: int, decode: bool, f: int) -> float:
    """Mean over the local stages of (area the tiles' crops cover) / (frame area): what exact staged tiles
    recompute (the global part, at latent resolution, is not repeated)."""
    return _halo_factor(tuple(exact.local), h, w, tile, decode, f)


@functools.lru_cache(maxsize=4096)
def _halo_factor(local: tuple[LocalStage, ...], h: int, w: int, tile: int, decode: bool, f: int) -> float:
    # kept per geometry: the search asks for one plan's cost many times (sorting, grouping), in exact fractions
    res_in = Fraction(1) if decode else Fraction(f)
    halos = stage_halos(local, res_in)
    res = res_in
    ratios = []
    rows, cols = partition(h, tile), partition(w, tile)
    for stage, halo in zip(local, halos):
        def covered(spans, length):
            total = 0
            for a, b in spans:
                lo = max(0, int(a * res) - halo)
                hi = min(int(length * res), int(b * res) + halo)
                total += hi - lo
            return total / (length * res)

        ratios.append(covered(rows, h) * covered(cols, w))
        res = res * stage.scale
    return float(sum(ratios) / len(ratios)) if ratios else 1.0


def _output_elements(model: VAEModel, plan: PassPlan) -> int:
    fmt = model.latent_format
    b, _c, t, hh, ww = plan.shape
    if plan.decode:
        return b * fmt.image_channels * fmt.pixel_frames(t) * hh * ww * fmt.spatial_factor ** 2
    return b * 2 * fmt.channels * fmt.latent_frames(t) * (hh // fmt.spatial_factor) * (ww // fmt.spatial_factor)
