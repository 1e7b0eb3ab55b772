"""One rank's share of an exact pass whose frame is split into row bands (run on every rank, SPMD).

Two ways of getting the rows a band's convolutions read beyond its border, one per kind of `ExactTiling` (the
plan picks its own through `run_with`):
- `LayerwisePlan` (SeedVR2: every GroupNorm spans the frame): the model's own layer-by-layer forward on
  the band's rows, with halo rows *exchanged* with the neighbouring bands before every conv, GroupNorm
  sums all-reduced, and the latent-resolution frame gathered for mid-block attention (queries stay local).
- `ExactPlan` (Wan 2.1/2.2, Qwen-Image: only the mid block is global): a band that fits its share of the
  tile runs each local stage once, with that stage's radius in rows *exchanged* with the neighbours
  (`band_chain`); larger or very thin bands are cut into tiles that *recompute the overlap*, exactly as exact
  tiles do (reading their halo from the input, which every rank holds). The global part runs at latent
  resolution on every rank — decode: on the whole latent clip; encode: on the latent-resolution frame
  all-gathered from the bands — except the mid-block attention, whose query rows are divided between the
  bands and whose output is gathered back.
Causal temporal memory stays with the band, so a clip streams slice by slice on every rank.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Optional

import torch

from ..base import Progress
from ..memory.placement import OnDevice, Placement
from ..tiling.exact import ExactPlan, LayerwisePlan, crop_sizes, run_global, run_tiles
from ..tiling.fast import PassGeometry
from .band_chain import can_exchange, run_band_chain
from .bands import Band, BandPlan
from .collectives import Collective, Lockstep


def sharded_pass(model, x: torch.Tensor, comm: Collective, *, decode: bool, tile_latent: int,
                 temporal_slice: Optional[int], progress: Progress, output_device: torch.device,
                 share_tile: bool = True, sample: bool = False,
                 canvas: Optional[Placement] = None) -> Optional[torch.Tensor]:
    """`x`: the whole validated input (any device). Returns the whole fp32 output (pixels or moments) on the
    ranks that return a result (`comm.returns_result`), else None.

    `share_tile`: the bands share the working memory of one `tile_latent` tile (each band's tiles hold 1/N of
    its area), so a rank needs about 1/N of the single-device exact pass with the same tile; False when
    the tile was sized from the budget (vae/parallel/plan.py).
    `sample` and `canvas`: a prediction's meta run (vae/parallel/predict.py): the first two temporal steps and the
    last, one tile of each crop size; the output canvas where `canvas` allocates it (default on `output_device`)."""
    lf = model.latent_format
    f = lf.spatial_factor
    in_scale, out_scale = (1, f) if decode else (f, 1)
    h_lat, w_lat = x.shape[-2] // in_scale, x.shape[-1] // in_scale
    bands = BandPlan.split(h_lat, w_lat, comm.size)
    geom = PassGeometry(in_scale, out_scale, lf.image_channels if decode else 2 * lf.channels, decode,
                        lf.temporal_factor)
    tick = Lockstep(comm, progress)
    plan = model.exact_plan(decode=decode)
    if plan is None:
        raise ValueError(f"{type(model).__name__} declares no exact tiling (VAEModel.exact_plan): a frame cannot be "
                         "split across devices")
    a, b = bands.rows(comm.rank)
    share = comm.size if share_tile else 1

    class _Band:  # an `ExactTilingRunner`: this rank's band for each kind of plan
        @staticmethod
        def layerwise(plan: LayerwisePlan) -> torch.Tensor:  # working memory bounded by a tile area (a budget)
            x_band = x[..., a * in_scale:b * in_scale, :].to(comm.device)
            return plan.run(x_band, max(1, math.isqrt(tile_latent * tile_latent // share)), temporal_slice, tick,
                            shard=Band(bands, comm), sample=sample)

        @staticmethod
        def staged(plan: ExactPlan) -> torch.Tensor:
            return _exact_plan_band(plan, x, bands, comm, geom, tile_latent, share, temporal_slice, tick, sample)

    band_out = plan.run_with(_Band())
    out = None
    if comm.returns_result:
        out = (canvas or OnDevice(output_device)).empty(
            (x.shape[0], geom.out_channels, geom.out_frames(x.shape[2]), h_lat * out_scale, w_lat * out_scale),
            torch.float32)
    comm.collect_rows(band_out.float(), bands.counts(Fraction(out_scale)), out)
    return out


def _exact_plan_band(plan: ExactPlan, x: torch.Tensor, bands: BandPlan, comm: Collective, geom: PassGeometry,
                     tile: int, share: int, temporal_slice: Optional[int], progress: Lockstep,
                     sample: bool = False) -> torch.Tensor:
    """This band's rows of the output. When the band fits its share of the tile (one tile per band) its local
    stages run once on the band with halo rows exchanged per stage (`band_chain`); otherwise from tiles
    covering the band that recompute their halo from the input. Every rank makes the same choice and the same
    number of progress ticks. `sample`: a meta run (see `sharded_pass`)."""
    h_lat, w_lat = bands.h_lat, bands.w_lat
    a, b = bands.rows(comm.rank)
    cores = bands.tiles(comm.rank, tile, share)
    res_in = Fraction(1 if geom.decode else geom.in_scale)
    exchange = len(cores) == 1 and can_exchange(plan, bands, res_in)
    if sample:  # one core of each crop size: cores of one size allocate alike, one after another
        cores = list({crop_sizes(plan.local, res_in, c, (h_lat, w_lat)): c for c in cores}.values())
    slices = geom.slices(x.shape[2], temporal_slice)
    total = len(slices) * (len(cores) + 1)
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        progress(done, total)

    def local(src: torch.Tensor, dst: torch.Tensor, out_scale: int) -> None:
        if exchange:
            run_band_chain(plan, src, dst, bands, comm, res_in, slices, geom, tick, device=comm.device,
                           sample=sample)
        else:
            run_tiles(plan, src, dst, cores, res_in, (h_lat, w_lat), slices, geom, out_scale, tick, dst_row0=a,
                      device=comm.device, sample=sample)

    batch, device = x.shape[0], comm.device
    if geom.decode:
        f = geom.out_scale
        glob = run_global(plan, x.to(device), slices, tick, shard=Band(bands, comm), sample=sample)
        out = torch.empty(batch, geom.out_channels, geom.out_frames(x.shape[2]), (b - a) * f, w_lat * f,
                          dtype=torch.float32, device=device)
        local(glob, out, f)
        return out
    mid = torch.empty(batch, plan.global_channels, geom.out_frames(x.shape[2]), b - a, w_lat, dtype=x.dtype,
                      device=device)
    local(x, mid, 1)
    whole = comm.all_gather_rows(mid, bands.counts())
    del mid
    moments = run_global(plan, whole, [geom.out_frame_range(t0, t1) for t0, t1 in slices], tick,
                         shard=Band(bands, comm), sample=sample)
    return moments[..., a:b, :]
