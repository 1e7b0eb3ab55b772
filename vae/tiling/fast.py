"""Fast tiles: each tile runs the whole causal stream on its own crop; results are blended.

Not exact (GroupNorm statistics and mid-block attention see only the tile), but memory is bounded
by the tile and the blend is a partition of unity, so a single tile reproduces the untiled pass.
Temporal slices inside a tile carry that tile's causal cache — never restarted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from ..base import CausalStream, Progress, split_slices
from ..memory.oom import OutOfMemory, attempt
from ..memory.placement import OnDevice, Placement
from .grid import TileGrid
from .retry import StepCounter, TileRetry



@dataclass(frozen=True)
class PassGeometry:
    """How one pass maps latent-grid units and frames between its input and its output.

    `in_scale` / `out_scale`: input / output pixels per latent pixel (decode 1 / f, encode f / 1).
    """

    in_scale: int
    out_scale: int
    out_channels: int
    decode: bool
    temporal_factor: int

    def out_frames(self, in_frames: int) -> int:
        tf = self.temporal_factor
        return (in_frames - 1) * tf + 1 if self.decode else (in_frames - 1) // tf + 1

    def out_frame_range(self, start: int, stop: int) -> tuple[int, int]:
        """Output frames produced by the input frames [start, stop) of a causal stream."""
        tf = self.temporal_factor
        if self.decode:
            return max(0, tf * start - (tf - 1)), tf * stop - (tf - 1)
        return (start + tf - 1) // tf, (stop + tf - 1) // tf

    def slices(self, in_frames: int, temporal_slice: Optional[int]) -> Sequence[tuple[int, int]]:
        """Input frame slices: whole clip, or (1+k, k, k, …) latents ≙ (1+4k, 4k, …) pixel frames."""
        if temporal_slice is None:
            return [(0, in_frames)]
        step = temporal_slice if self.decode else temporal_slice * self.temporal_factor
        return split_slices(in_frames, 1 + step, step)


def run_tiled(x: torch.Tensor, grid: TileGrid, geom: PassGeometry, open_stream: Callable[[], CausalStream],
              whole: Callable[[torch.Tensor], torch.Tensor], *, blend: int, temporal_slice: Optional[int],
              progress: Progress, accum_device: Optional[torch.device] = None,
              retry: Optional[TileRetry] = None, canvas: Optional[Placement] = None,
              sample: bool = False) -> torch.Tensor:
    """Blend per-tile outputs into one pre-allocated fp32 accumulator; returns fp32.

    A tile done in one temporal slice runs `whole` (the model's whole-clip pass, which keeps no
    causal cache: a stream would hold a copy of every conv's input for a next step that never
    comes); longer clips run a stream per tile. `blend` is the ramp width in output units. Weights are
    a partition of unity; the weight plane is still accumulated and divided out so rounding at the
    ramps cannot tint the result.

    With `retry`, a tile that runs out of memory is redone as a fast-tiled pass of its own crop at the
    shrunk size (frames it had already added are kept), and the tiles after it are run that way too;
    finished tiles are kept (vae/tiling/retry.py).

    `canvas` allocates the accumulator (default: on `accum_device`, else `x`'s device). `sample` (meta
    predictions, vae/planning): one tile of the largest size, its first two temporal steps and its last.
    """
    slices = geom.slices(x.shape[2], temporal_slice)
    counter = StepCounter(progress, len(grid) * len(slices))
    canvas = canvas or OnDevice(accum_device or x.device)
    return _blend_tiles(x, grid, geom, open_stream, whole, blend, temporal_slice, counter, canvas, retry, sample)


def _blend_tiles(x: torch.Tensor, grid: TileGrid, geom: PassGeometry, open_stream: Callable[[], CausalStream],
                 whole: Callable[[torch.Tensor], torch.Tensor], blend: int, temporal_slice: Optional[int],
                 counter: StepCounter, canvas: Placement, retry: Optional[TileRetry],
                 sample: bool = False) -> torch.Tensor:
    b, _, t_in = x.shape[:3]
    h_lat, w_lat = grid.rows.length, grid.cols.length
    oh, ow = h_lat * geom.out_scale, w_lat * geom.out_scale
    t_out = geom.out_frames(t_in)
    out = canvas.empty((b, geom.out_channels, t_out, oh, ow), torch.float32).zero_()
    weight = canvas.empty((oh, ow), torch.float32).zero_()
    device = out.device
    s_in, s_out = geom.in_scale, geom.out_scale
    budget = len(geom.slices(t_in, temporal_slice))  # units of work each tile was counted for
    tiles = list(grid)
    if sample:  # the tile with the largest crop stands for all (each tile's temporaries are freed before the next)
        tiles = [max(tiles, key=lambda t: t[2].size * t[3].size)]
    for i, j, r, c in tiles:
        wy = grid.rows.weights(i, s_out, blend, device)
        wx = grid.cols.weights(j, s_out, blend, device)
        w2 = wy[:, None] * wx[None, :]
        ys, xs = slice(r.start * s_out, r.stop * s_out), slice(c.start * s_out, c.stop * s_out)
        crop = x[..., r.start * s_in:r.stop * s_in, c.start * s_in:c.stop * s_in]
        added = [0, 0]  # output frames of this tile already in `out`, units of work done
        slices = geom.slices(t_in, retry.temporal_slice if retry is not None else temporal_slice)
        counter.grow(len(slices) - budget)

        def run_tile() -> None:
            with open_stream() as stream:
                for t0, t1 in (slices if not sample or len(slices) <= 3 else [slices[0], slices[1], slices[-1]]):
                    y = whole(crop) if len(slices) == 1 else stream.step(crop[:, :, t0:t1])
                    o0, o1 = geom.out_frame_range(t0, t1)
                    out[:, :, o0:o1, ys, xs].addcmul_(y.to(device=device, dtype=torch.float32), w2)
                    del y
                    added[0] = o1
                    added[1] += 1
                    counter.tick()

        if retry is None or max(r.size, c.size) <= retry.tile_latent:
            failed = attempt(run_tile) if retry is not None else run_tile()
            if not isinstance(failed, OutOfMemory):
                weight[ys, xs].add_(w2)
                continue
            retry.shrink(failed, f"tile {i * len(grid.cols.tiles) + j + 1} of {len(grid)}")
        # the tile (the frames it had not yet added) as a fast-tiled pass of its own crop, normalised by its
        # own weight plane, at the current size
        sub = TileGrid.build(r.size, c.size, retry.tile_latent, blend // s_out)  # the pass's overlap, in latents
        counter.grow(len(sub) * len(geom.slices(t_in, retry.temporal_slice)) - (len(slices) - added[1]))
        y = _blend_tiles(crop, sub, geom, open_stream, whole, blend, retry.temporal_slice, counter, canvas, retry)
        out[:, :, added[0]:, ys, xs].addcmul_(y[:, :, added[0]:], w2)
        del y
        weight[ys, xs].add_(w2)
    return out.div_(weight)
