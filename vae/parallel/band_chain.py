"""The local stages of an `ExactPlan` (Wan 2.1/2.2, Qwen-Image) on one band, with halo rows exchanged between
the neighbouring bands at every stage instead of recomputed.

The recompute way (`run_tiles` on the band's tiles) reads each tile's whole halo from the input, which for an
encode is 75 pixel rows per side (Wan 2.1) — most of a thin band's work and memory. Here each stage runs once
on the band's rows plus its own receptive radius, taken from the neighbours' outputs of the stage before
(a few rows), so a band computes and holds about 1/N of the frame. It holds the band whole at every stage, so
it is used when the band fits its share of the tile (one tile per band); otherwise the tiles recompute.
"""

from __future__ import annotations

from contextlib import ExitStack
from fractions import Fraction
from typing import Callable, Optional, Sequence

import torch

from ..tiling.exact import ExactPlan, LocalStage, sampled, stage_resolutions
from ..tiling.fast import PassGeometry
from .bands import BandPlan
from .collectives import Collective


def stage_halo(stage: LocalStage) -> int:
    """Rows of context a stage reads on each side of its input band: its radius, rounded up to its stride so
    the cropped output stays on the output grid."""
    return stage.stride_aligned(stage.radius)


def _join_rows(parts: Sequence[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """The parts stacked by rows, in `like`'s memory layout (channels-last stays channels-last, so the stage
    does not copy the band once more to re-lay it out; received halo rows arrive contiguous)."""
    if len(parts) == 1:
        return parts[0]
    channels_last = like.ndim == 5 and like.shape[1] > 1 and like.stride(1) == 1  # a channels-last view
    fmt = torch.channels_last_3d if channels_last else torch.contiguous_format
    shape = list(like.shape)
    shape[-2] = sum(p.shape[-2] for p in parts)
    out = torch.empty(shape, dtype=like.dtype, device=like.device, memory_format=fmt)
    r = 0
    for p in parts:
        out[..., r:r + p.shape[-2], :] = p
        r += p.shape[-2]
    return out


def can_exchange(plan: ExactPlan, bands: BandPlan, res_in: Fraction) -> bool:
    """Whether every band is at least as tall as each stage's halo at that stage (the rows come from the
    direct neighbour only). Stage 0 reads the input, which every rank holds whole."""
    res = stage_resolutions(plan.local, res_in)
    thinnest = min(bands.counts())
    return all(thinnest * res[k] >= stage_halo(s) for k, s in enumerate(plan.local) if k > 0)


def run_band_chain(plan: ExactPlan, src: torch.Tensor, dst: torch.Tensor, bands: BandPlan, comm: Collective,
                   res_in: Fraction, slices: Sequence[tuple[int, int]], geom: PassGeometry,
                   tick: Callable[[], None], device: Optional[torch.device] = None, sample: bool = False) -> None:
    """This band's output of the local stages into `dst` (the band's rows only), slice by slice.

    `src`: the whole stage-0 input (every rank holds it: the latent features for a decode, the pixels for an
    encode), at `res_in` rows per latent row. One causal session for the band, as for one tile. `sample` (meta
    predictions): the first two slices and the last."""
    a, b = bands.rows(comm.rank)
    res = stage_resolutions(plan.local, res_in)
    halos = [stage_halo(s) for s in plan.local]
    full0 = int(bands.h_lat * res[0])
    lo0, hi0 = int(a * res[0]), int(b * res[0])
    top0, bottom0 = min(halos[0], lo0), min(halos[0], full0 - hi0)
    with ExitStack() as stack:
        streams = [stack.enter_context(s) for s in plan.open_local()]
        for t0, t1 in sampled(slices, sample):
            y = src[:, :, t0:t1, lo0 - top0:hi0 + bottom0]
            if device is not None:
                y = y.to(device)
            top = top0
            for k, stream in enumerate(streams):
                if k > 0:  # the rows this stage reads beyond the band, from the neighbours' stage-k inputs
                    above, below = comm.halo(y, halos[k], halos[k])
                    top = above.shape[-2] if above is not None else 0
                    y = _join_rows([p for p in (above, y, below) if p is not None], like=y)
                rows_in = y.shape[-2]
                out = stream.step(y)
                del y
                scale = plan.local[k].scale
                if out.shape[-2] != rows_in * scale:
                    raise RuntimeError(f"stage {k} gave {out.shape[-2]} rows for {rows_in} (scale {scale})")
                first = int(top * scale)
                y = out[..., first:first + int((b - a) * res[k + 1]), :]
                del out
            o0, o1 = geom.out_frame_range(t0, t1)
            dst[:, :, o0:o1] = y
            del y
            tick()
