"""How long a plan is expected to take, to choose among the plans that fit: the fastest by this estimate.

A plan's time is its arithmetic (the untiled pass's convolution FLOPs, `predict.conv_flops`, times what its
tiling adds: halos recomputed by exact staged tiles, overlaps by fast tiles, the layer-wise pass's slower
crops), plus a fixed cost per causal step of each tile (kernel launches, Python), plus the bytes it copies
between host and device memory. The constants are per device type and rough: they order plans, they do not
promise times; `python -m turbovae bench --sections budget` measures what each chosen plan takes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Optional

from ..base import VAEModel
from ..exact_tiling import ExactPlan, partition
from ..tiling.exact import stage_halos
from .plan import PassPlan


@dataclass(frozen=True)
class DeviceSpeed:
    """`flops_per_s`: the pass's sustained convolution throughput; `step_s`: the fixed cost of one causal step of
    one tile (or one frame stage); `host_bytes_per_s`: copies between host and device memory, each direction
    (on the CPU: a memory copy); `layerwise_factor`: the layer-wise exact pass's time over the untiled pass's
    (contiguous crops, a loop per tile)."""

    flops_per_s: float
    step_s: float
    host_bytes_per_s: float
    layerwise_factor: float


# One H100/H200 in bf16 (docs/results: ~100-400 TFLOP/s on the VAE passes; pageable copies ~25 GB/s, pinned 55) and
# this project's 2-core CPU in fp32.
SPEEDS = {
    "cuda": DeviceSpeed(flops_per_s=250e12, step_s=0.004, host_bytes_per_s=25e9, layerwise_factor=1.3),
    "cpu": DeviceSpeed(flops_per_s=0.15e12, step_s=0.02, host_bytes_per_s=8e9, layerwise_factor=1.2),
}


def speed(device_type: str) -> DeviceSpeed:
    return SPEEDS.get(device_type, SPEEDS["cpu"])


def estimate_s(model: VAEModel, plan: PassPlan, flops: float, *, host_bytes: Optional[int] = None) -> float:
    """Seconds `plan` is expected to take, `flops` being the untiled pass's (`predict.conv_flops`);
    `host_bytes` the caches it keeps in host memory when known (after prediction), else an estimate of zero
    beyond the output."""
    sp = speed(plan.device_type)
    compute = flops / sp.flops_per_s * work_factor(model, plan)
    latents = plan.shape[2] if plan.decode else model.latent_format.latent_frames(plan.shape[2])
    steps = temporal_steps(model, plan, latents)
    tiles = plan.tiles if plan.mode != "untiled" else 1
    overhead = steps * tiles * sp.step_s
    moved = 0.0
    if plan.cache_on_host:
        # every held history goes out once and comes back once per step
        moved += 2.0 * (host_bytes or 0) * steps
    if plan.output_on_host:
        esize = plan.dtype.itemsize
        moved += _output_elements(model, plan) * esize
    return compute + overhead + moved / sp.host_bytes_per_s


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
    if not isinstance(exact, ExactPlan):
        return speed(plan.device_type).layerwise_factor
    return halo_factor(exact, h, w, tile, plan.decode, model.latent_format.spatial_factor)


def halo_factor(exact: ExactPlan, h: int, w: int, tile: int, decode: bool, f: int) -> float:
    """Mean over the local stages of (area the tiles' crops cover) / (frame area): what exact staged tiles
    recompute (the global part, at latent resolution, is not repeated)."""
    res_in = Fraction(1) if decode else Fraction(f)
    halos = stage_halos(exact.local, res_in)
    res = res_in
    ratios = []
    rows, cols = partition(h, tile), partition(w, tile)
    for stage, halo in zip(exact.local, halos):
        def covered(spans, length):
            total = 0
            for a, b in spans:
                lo = max(0, int(a * res) - halo)
                hi = min(int(length * res), int(b * res) + halo)
                total += hi - lo
            return total / (length * res)

        ratios.append(covered(rows, h) * covered(cols, w))
        res = res * stage.scale
    return sum(ratios) / len(ratios) if ratios else 1.0


def _output_elements(model: VAEModel, plan: PassPlan) -> int:
    fmt = model.latent_format
    b, _c, t, hh, ww = plan.shape
    if plan.decode:
        return b * fmt.image_channels * fmt.pixel_frames(t) * hh * ww * fmt.spatial_factor ** 2
    return b * 2 * fmt.channels * fmt.latent_frames(t) * (hh // fmt.spatial_factor) * (ww // fmt.spatial_factor)
