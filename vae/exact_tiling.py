"""The two implementations of `ExactTiling` (vae/base.py), what `VAEModel.exact_plan(decode=...)` returns:
plain types, below both the model packages and vae/tiling/, so neither imports the other for them. The tiler
itself is vae/tiling/exact.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Sequence

import torch

from .base import CausalStream, ExactTiling, ExactTilingRunner, R


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

    def run_with(self, runner: ExactTilingRunner[R]) -> R:
        return runner.layerwise(self)


def supports_exact(model, *, decode: bool) -> bool:
    """Whether the model declares an exact tiling of this pass (`VAEModel.exact_plan`)."""
    return model.exact_plan(decode=decode) is not None


def partition(length: int, tile: int) -> list[tuple[int, int]]:
    """Non-overlapping cores of at most `tile` covering [0, length), evenly sized."""
    n = max(1, math.ceil(length / tile))
    bounds = [round(i * length / n) for i in range(n + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(n)]
