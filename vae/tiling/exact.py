"""Exact tiles: equal to the untiled pass, with working memory bounded by the tile.

A model opts in by overriding `VAEModel.exact_plan(decode=...)` (vae/base.py), returning one of the two
`ExactTiling` implementations defined here, beside the tiler that runs them: a `LayerwisePlan` runs the model's
own forward layer by layer; an `ExactPlan` has its pass split into
- local *stages* (convolutions, per-pixel norms, resampling) that can run on a spatial crop whose
  halo covers their receptive field, and
- one *global* part that needs the whole frame (mid-block attention, statistics over the frame),
  run at latent resolution where a frame is small.
Decode = global part on the whole latent clip, then the local suffix stage by stage per tile; encode
= the local prefix per tile, then the global part. After every stage the crop is trimmed to the halo
the remaining stages still need, so the redundant halo work shrinks as resolution grows. Every stage
is a causal stream, so video tiles carry their own temporal memory through the slices.

Each tile only needs halos from its neighbours and the global part only the assembled
latent-resolution frame: vae/parallel splits a frame across devices along exactly these lines.
"""

from __future__ import annotations

import math
from collections import deque
from contextlib import ExitStack
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Optional, Sequence

import torch

from ..base import CausalStream, ExactTiling, ExactTilingRunner, Progress, R
from ..memory.oom import OutOfMemory, attempt
from ..memory.placement import OnDevice, Placement
from .fast import PassGeometry
from .grid import TileGrid
from .retry import StepCounter, TileRetry

__all__ = ["ExactPlan", "LayerwisePlan", "LocalStage", "partition", "partition_bound", "partition_count",
           "supports_exact", "run_exact", "run_global", "run_tiles", "stage_halos", "stage_resolutions"]


# -- the two exact plans (what `VAEModel.exact_plan(decode=...)` returns) ------------------------

@dataclass(frozen=True)
class LocalStage:
    """Geometry of a spatially local step.

    `scale`: output pixels per input pixel (2 for an upsampler, 1/2 for a stride-2 conv, 1 otherwise).
    `radius`: input pixels of context each output pixel needs on every side (its receptive radius).
    """

    scale: Fraction
    radius: int
    name: str = ""
    # module names of the layers the stage runs (a name prefix, e.g. "decoder.up_blocks.0."): the cost model
    # attributes the traced layers to stages by them
    modules: tuple[str, ...] = ()

    def stride_aligned(self, rows: int) -> int:
        """`rows` rounded up to a multiple of the stage's input stride (1/scale when it downsamples), so a crop
        that starts that many rows before an aligned border stays on the stage's output grid."""
        step = math.ceil(1 / self.scale) if self.scale < 1 else 1
        return math.ceil(rows / step) * step


@dataclass(frozen=True)
class ExactPlan(ExactTiling):
    """`open_local()` gives one causal stream per local stage for one tile (opened together, so the
    stages of a tile may share state); `open_global()` one stream for the whole-frame part."""

    local: Sequence[LocalStage]  # encode: pixels -> latent-resolution features; decode: the reverse
    open_local: Callable[[], Sequence[CausalStream]]
    open_global: Callable[[], CausalStream]
    global_channels: int  # channels of the latent-resolution tensor between the two parts
    holds_whole_frames = False  # each tile carries its own causal state; only the global part sees the frame

    def run_with(self, runner: ExactTilingRunner[R]) -> R:
        return runner.staged(self)


@dataclass(frozen=True)
class LayerwisePlan(ExactTiling):
    """For models whose every block needs whole-frame statistics (SeedVR2's GroupNorm): the model runs
    its own forward layer by layer with tile-bounded working memory. `run(x, tile_latent,
    temporal_slice, progress)` returns the untiled pass's output (pixels or moments); with
    `shard=` (a `layerwise.RowShard`) `x` is one band of rows of a frame split across devices and the
    result is that band's rows of the output."""

    run: Callable[..., torch.Tensor]
    holds_whole_frames = True  # whole-frame activations between layers, whole-frame caches between slices

    def run_with(self, runner: ExactTilingRunner[R]) -> R:
        return runner.layerwise(self)


def supports_exact(model, *, decode: bool) -> bool:
    """Whether the model declares an exact tiling of this pass (`VAEModel.exact_plan`)."""
    return model.exact_plan(decode=decode) is not None


def partition(length: int, tile: int) -> list[tuple[int, int]]:
    """Non-overlapping cores of at most `tile` covering [0, length), evenly sized."""
    n = partition_count(length, tile)
    bounds = [partition_bound(length, n, i) for i in range(n + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(n)]


def partition_count(length: int, tile: int) -> int:
    """How many cores `partition(length, tile)` makes."""
    return max(1, math.ceil(length / tile))


def partition_bound(length: int, n: int, i: int) -> int:
    """The start of core `i` of `n` (i == n: `length`) of `partition`: one core's bounds without listing the rest."""
    return round(i * length / n)


# -- the tiler ----------------------------------------------------------------------------------

def stage_resolutions(stages: Sequence[LocalStage], res_in: Fraction) -> list[Fraction]:
    """Pixels per latent pixel at the input of each stage, and after the last one."""
    res = [res_in]
    for s in stages:
        res.append(res[-1] * s.scale)
    return res


def stage_halos(stages: Sequence[LocalStage], res_in: Fraction) -> list[int]:
    """Halo (input pixels of each stage) such that the last stage's core output is exact.

    Works backwards: the context still needed after stage k, expressed in latent units, plus stage
    k's own radius. Down-sampling stages need crops aligned to their stride, so halos are rounded up
    to a multiple of 1/scale.
    """
    res = stage_resolutions(stages, res_in)
    halos = [0] * len(stages)
    need_latent = Fraction(0)  # context needed at the output of the current stage, in latent units
    for k in range(len(stages) - 1, -1, -1):
        need_latent += Fraction(stages[k].radius) / res[k]
        halos[k] = stages[k].stride_aligned(math.ceil(need_latent * res[k]))
        need_latent = Fraction(halos[k]) / res[k]
    return halos


class _TileChain:
    """The local stages of one tile: crops each stage's input to the halo the rest still needs."""

    def __init__(self, stages: Sequence[LocalStage], open_local, res_in: Fraction,
                 core: tuple[tuple[int, int], tuple[int, int]], full_latent: tuple[int, int], stack: ExitStack):
        self.stages = stages
        self.res = stage_resolutions(stages, res_in)
        self.halos = stage_halos(stages, res_in) + [0]
        self.core = core
        self.full = full_latent
        self.streams = [stack.enter_context(s) for s in open_local()]

    def window(self, k: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """Crop [y0, y1) × [x0, x1) at the input of stage k (k == len(stages): the final core)."""
        res, halo = self.res[k], self.halos[k]
        out = []
        for (c0, c1), full in zip(self.core, self.full):
            lo = max(0, int(c0 * res) - halo)
            hi = min(int(full * res), int(c1 * res) + halo)
            out.append((lo, hi))
        return out[0], out[1]

    def run(self, x_full: torch.Tensor, device: Optional[torch.device] = None) -> torch.Tensor:
        """`device`: where the chain runs, when `x_full` is elsewhere (only the crop moves)."""
        (y0, y1), (x0, x1) = self.window(0)
        x = x_full[..., y0:y1, x0:x1]
        if device is not None:
            x = x.to(device)
        origin = (y0, x0)
        for k, stream in enumerate(self.streams):
            x = stream.step(x)
            scale = self.stages[k].scale
            origin = (int(origin[0] * scale), int(origin[1] * scale))
            (ny0, ny1), (nx0, nx1) = self.window(k + 1)
            x = x[..., ny0 - origin[0]:ny1 - origin[0], nx0 - origin[1]:nx1 - origin[1]]
            origin = (ny0, nx0)
        return x


def run_exact(model, x: torch.Tensor, grid: TileGrid, *, decode: bool, temporal_slice: Optional[int],
              progress: Progress, output_device: Optional[torch.device] = None,
              retry: Optional[TileRetry] = None, canvas: Optional[Placement] = None, frame_stages: bool = False,
              sample: bool = False, frames: Optional[Placement] = None) -> torch.Tensor:
    """Run the model's exact plan over the cores of `grid` (its overlap is irrelevant here); returns the output in
    the model's dtype (exact tiles do not blend: nothing to accumulate), in a canvas `canvas` allocates (default:
    on `output_device`, else `x`'s device).
    `retry`: a core that runs out of memory is redone smaller, finished cores kept (see `run_tiles`).
    `frame_stages`: a layer-wise plan streams the model's frame stages (vae/tiling/frame_stages.py); `frames`:
    where a layer-wise plan keeps its whole-frame activations (None: on the device; host memory: a streamed pass).
    `sample` (meta predictions, vae/planning): one core of each kind (`representative_cores`), the first two temporal
    steps and the last, into canvases of the full size: the same peak as the whole pass, for a fraction of its ops."""
    plan = model.exact_plan(decode=decode)
    if plan is None:
        raise ValueError(f"{type(model).__name__} declares no exact tiling (VAEModel.exact_plan); use mode='fast'")
    canvas = canvas or OnDevice(output_device or x.device)
    return plan.run_with(_SingleDevice(model, x, grid, decode, temporal_slice, progress, canvas, retry,
                                       frame_stages, sample, frames))


class _SingleDevice:
    """`run_exact` for each kind of exact plan (an `ExactTilingRunner`)."""

    def __init__(self, model, x: torch.Tensor, grid: TileGrid, decode: bool, temporal_slice: Optional[int],
                 progress: Progress, canvas: Placement, retry: Optional[TileRetry], frame_stages: bool,
                 sample: bool, frames: Optional[Placement] = None):
        self.model, self.x, self.grid, self.decode = model, x, grid, decode
        self.temporal_slice, self.progress, self.canvas, self.retry = temporal_slice, progress, canvas, retry
        self.frame_stages, self.sample, self.frames = frame_stages, sample, frames

    def layerwise(self, plan: LayerwisePlan) -> torch.Tensor:
        tile = max(self.grid.rows.tile, self.grid.cols.tile)
        return plan.run(self.x, tile, self.temporal_slice, self.progress, stages=self.frame_stages,
                        canvas=self.canvas, sample=self.sample, frames=self.frames)

    def staged(self, plan: ExactPlan) -> torch.Tensor:
        x, grid, decode, retry, sample = self.x, self.grid, self.decode, self.retry, self.sample
        lf = self.model.latent_format
        f = lf.spatial_factor
        h_lat, w_lat = grid.rows.length, grid.cols.length
        tile = max(grid.rows.tile, grid.cols.tile)
        cores = [(r, c) for r in partition(h_lat, tile) for c in partition(w_lat, tile)]
        if sample:  # one core of each kind whose halo'd crops differ in size (the same sizes allocate alike)
            res_in = Fraction(1) if decode else Fraction(f)
            cores = list({crop_sizes(plan.local, res_in, c, (h_lat, w_lat)): c
                          for c in representative_cores(h_lat, w_lat, tile)}.values())
        out_channels = lf.image_channels if decode else 2 * lf.channels
        in_geom = PassGeometry(1 if decode else f, f if decode else 1, out_channels, decode, lf.temporal_factor)
        slices = in_geom.slices(x.shape[2], self.temporal_slice)
        counter = StepCounter(self.progress, len(slices) * (len(cores) + 1))
        tick = counter.tick

        b, t_in = x.shape[0], x.shape[2]
        if decode:
            glob = run_global(plan, x, slices, tick, sample=sample)
            out = self.canvas.empty((b, lf.image_channels, in_geom.out_frames(t_in), h_lat * f, w_lat * f), x.dtype)
            run_tiles(plan, glob, out, cores, Fraction(1), (h_lat, w_lat), slices, in_geom, f, tick, retry=retry,
                      grow=counter.grow, sample=sample)
            return out
        # encode: local prefix per tile into a latent-resolution buffer, then the global part
        t_lat = in_geom.out_frames(t_in)
        mid = torch.empty(b, plan.global_channels, t_lat, h_lat, w_lat, dtype=x.dtype, device=x.device)
        run_tiles(plan, x, mid, cores, Fraction(f), (h_lat, w_lat), slices, in_geom, 1, tick, retry=retry,
                  grow=counter.grow, sample=sample)
        lat_slices = [in_geom.out_frame_range(t0, t1) for t0, t1 in slices]
        return run_global(plan, mid, lat_slices, tick, sample=sample, canvas=self.canvas)


def representative_cores(h_lat: int, w_lat: int, tile: int) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """One core of each kind the partition has, each the largest of its kind: per axis the first core (a halo on
    its far side only), the largest interior core (halos on both sides) and the last (near side only). Cores run one
    after another and free their temporaries, so a pass's peak is that of its most demanding core; which one that is
    depends on where its halos are read, so every kind is run (an interior core, with halos both sides, can need
    more than a larger corner core)."""
    def kinds(length: int) -> list[tuple[int, int]]:
        spans = partition(length, tile)
        if len(spans) <= 2:
            return spans
        inner = max(spans[1:-1], key=lambda s: s[1] - s[0])
        return [spans[0], inner, spans[-1]]

    return [(r, c) for r in kinds(h_lat) for c in kinds(w_lat)]


def crop_sizes(stages: Sequence[LocalStage], res_in: Fraction, core, full_latent) -> tuple:
    """The sizes of a core's crops at the input of every local stage and of its output (what its allocations
    depend on; its position only decides which rows and columns they hold)."""
    res, halos = stage_resolutions(stages, res_in), stage_halos(stages, res_in) + [0]
    sizes = []
    for k in range(len(stages) + 1):
        for (c0, c1), full in zip(core, full_latent):
            lo = max(0, int(c0 * res[k]) - halos[k])
            hi = min(int(full * res[k]), int(c1 * res[k]) + halos[k])
            sizes.append(hi - lo)
    return tuple(sizes)


def sampled(steps: Sequence, sample: bool) -> list:
    """All steps, or (sampling a meta run) the first two and the last."""
    steps = list(steps)
    return [steps[0], steps[1], steps[-1]] if sample and len(steps) > 3 else steps


def run_global(plan: ExactPlan, x: torch.Tensor, slices, tick, shard=None, *, sample: bool = False,
               canvas: Optional[Placement] = None) -> torch.Tensor:
    """The global part over the whole latent clip, each step's output written into one buffer as it finishes
    (`canvas` allocates it; default: where the outputs are made); `shard` (multi-device passes) is handed to the
    plan. `sample`: the first two steps and the last (meta predictions)."""
    slices = list(slices)
    out = None
    with (plan.open_global() if shard is None else plan.open_global(shard)) as stream:
        for t0, t1 in sampled(slices, sample):
            y = stream.step(x[:, :, t0:t1])
            if len(slices) == 1 and (canvas is None or not canvas.on_host):
                tick()
                return y
            if out is None:
                frames = _out_frames(slices, y, t1 - t0)
                shape = (*y.shape[:2], frames, *y.shape[3:])
                out = canvas.empty(shape, y.dtype) if canvas is not None else \
                    torch.empty(shape, dtype=y.dtype, device=y.device)
            o0 = _out_start(slices, (t0, t1), y.shape[2], out.shape[2])
            out[:, :, o0:o0 + y.shape[2]].copy_(y)
            del y
            tick()
    return out


def _out_frames(slices, y: torch.Tensor, first_len: int) -> int:
    """Output frames of the global part over all `slices`: it maps frames one to one (latent resolution)."""
    if y.shape[2] != first_len:
        raise RuntimeError("the global part of an exact plan must keep the frame count (latent resolution)")
    return slices[-1][1] - slices[0][0]


def _out_start(slices, span: tuple[int, int], frames: int, total: int) -> int:
    return min(span[0] - slices[0][0], total - frames)


def run_tiles(plan: ExactPlan, src, dst, cores, res_in: Fraction, full_latent, slices, geom: PassGeometry,
               out_scale: int, tick, dst_row0: int = 0, device: Optional[torch.device] = None,
               retry: Optional[TileRetry] = None, grow: Optional[Callable[[int], None]] = None,
               sample: bool = False) -> None:
    """Every core's local chain into `dst`, which holds the output rows from latent row `dst_row0` on;
    `device`: where the chains run (default: `src`'s). With `retry` (and `grow`, which adds units of work
    to the progress total), a core that runs out of memory is redone as smaller cores — exact whatever the
    partition — and the cores after it are split the same way; finished cores are kept. `sample` (meta
    predictions): each core's first two temporal steps and its last."""
    pending = deque(cores)
    budget = len(slices)  # units of work each core was counted for in the progress total
    done = 0
    while pending:
        ry, rx = pending.popleft()
        if retry is not None and max(ry[1] - ry[0], rx[1] - rx[0]) > retry.tile_latent:
            pieces = [(py, px) for py in _split(ry, retry.tile_latent) for px in _split(rx, retry.tile_latent)]
            grow((len(pieces) - 1) * budget)
            pending.extendleft(reversed(pieces))
            continue
        core_slices = slices if retry is None else geom.slices(src.shape[2], retry.temporal_slice)
        if retry is not None:
            grow(len(core_slices) - budget)
        steps = [0]

        def run_core() -> None:
            with ExitStack() as stack:
                chain = _TileChain(plan.local, plan.open_local, res_in, (ry, rx), full_latent, stack)
                for t0, t1 in sampled(core_slices, sample):
                    y = chain.run(src[:, :, t0:t1], device)
                    o0, o1 = geom.out_frame_range(t0, t1)
                    r0, r1 = (ry[0] - dst_row0) * out_scale, (ry[1] - dst_row0) * out_scale
                    dst[:, :, o0:o1, r0:r1, rx[0] * out_scale:rx[1] * out_scale] = y
                    del y
                    steps[0] += 1
                    tick()

        failed = run_core() if retry is None else attempt(run_core)
        if isinstance(failed, OutOfMemory):
            retry.shrink(failed, f"tile {done + 1} of {done + 1 + len(pending)}")
            grow(steps[0] - len(core_slices) + budget)  # the units it ticked stay counted; it is counted anew
            pending.appendleft((ry, rx))
            continue
        done += 1


def _split(span: tuple[int, int], tile: int) -> list[tuple[int, int]]:
    return [(span[0] + a, span[0] + b) for a, b in partition(span[1] - span[0], tile)]
