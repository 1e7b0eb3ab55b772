"""The Wan/Qwen-Image pass split for exact tiling (vae/tiling/exact.py).

Everything except the mid block is spatially local (convolutions, per-pixel RMS norm, nearest
resampling, the Wan 2.2 space-to-channel shortcuts), so each up/down block is one local stage whose
receptive radius is read off its layer list; the mid block (whole-frame attention) plus the 1×1 quant
convs and the encoder head form the global part at latent resolution.
"""

from __future__ import annotations

import weakref
from fractions import Fraction
from typing import Callable

import torch
from torch import nn

from ..base import CausalStream
from ..tiling.exact import ExactPlan, LocalStage
from .pieces import WanPassContext
from .patching import footprint, patchify, spatial_ops, unpatchify


class _StageStream(CausalStream):
    """One stage of one tile. The stages of a tile share one causal context (`ctx`): their memory is one
    state in execution order, and the last stage ends the step (`advance`)."""

    def __init__(self, ctx: WanPassContext, fn: Callable[[torch.Tensor, WanPassContext], torch.Tensor], last: bool):
        self.ctx, self.fn, self.last = ctx, fn, last

    def step(self, x: torch.Tensor) -> torch.Tensor:
        ctx = self.ctx
        if ctx.first and x.shape[2] == 1 and ctx.pieces.fold_images:
            y = self.fn(ctx.pieces.lay_out(x[:, :, 0]), ctx).unsqueeze(2)
        else:
            y = self.fn(ctx.pieces.lay_out(x), ctx)
        if self.last:
            ctx.advance()
        return y

    def close(self) -> None:
        if self.last:
            self.ctx.clear()


# (scale, radius) of each block of a block list, read off its layers once: the planner asks for a model's exact plan
# for every candidate it prices, and the architecture does not change after it is built
_FOOTPRINTS: "weakref.WeakKeyDictionary[nn.ModuleList, tuple]" = weakref.WeakKeyDictionary()


def _block_footprints(blocks: nn.ModuleList) -> tuple[tuple[Fraction, int], ...]:
    found = _FOOTPRINTS.get(blocks)
    if found is None:
        found = _FOOTPRINTS[blocks] = tuple(footprint(spatial_ops(b.modules())) for b in blocks)
    return found


def wan_exact_plan(part: nn.Module, *, decode: bool, patch_size: int,
                   open_context: Callable[[], WanPassContext]) -> ExactPlan:
    """The plan of `part` (the model's decoder when `decode`, else its encoder). `open_context()`: a fresh
    causal context of the model's fast paths (its pieces lay a stage's input out and fold a lone first frame)."""
    p = patch_size
    if decode:
        dec = part
        fns: list[Callable] = list(dec.up_blocks)  # blocks are called as block(x, ctx)
        geoms = list(_block_footprints(dec.up_blocks))

        def head(x, ctx):
            return unpatchify(dec.conv_out(dec.norm_out(x), ctx), p).clamp_(-1.0, 1.0)

        fns.append(head)
        geoms.append((Fraction(p), 1))
        global_fn = dec.forward_mid
    else:
        enc = part

        def stem(x, ctx):
            return enc.conv_in(patchify(x, p), ctx)

        fns = [stem, *enc.down_blocks]
        # patchify by p, then a 3x3 conv: one patch pixel of context is p input pixels, plus the patch itself
        geoms = [(Fraction(1, p), 2 * p - 1), *_block_footprints(enc.down_blocks)]
        global_fn = enc.forward_mid

    if decode:
        owned = [(f"decoder.up_blocks.{i}.",) for i in range(len(dec.up_blocks))] + [("decoder.norm_out",
                                                                                      "decoder.conv_out")]
    else:
        owned = [("encoder.conv_in",)] + [(f"encoder.down_blocks.{i}.",) for i in range(len(enc.down_blocks))]
    stages = [LocalStage(scale, radius, name=f"stage{i}", modules=m) for i, ((scale, radius), m)
              in enumerate(zip(geoms, owned))]

    def open_local() -> list[CausalStream]:
        ctx = open_context()
        return [_StageStream(ctx, fn, i == len(fns) - 1) for i, fn in enumerate(fns)]

    def open_global(shard=None) -> CausalStream:
        """`shard`: the frame is split across devices (vae/parallel); the mid-block attention divides its queries."""
        ctx = open_context()
        ctx.shard = shard
        return _StageStream(ctx, global_fn, True)

    # the tensor between the local and global parts has the mid block's width
    channels = part.mid_block.resnets[0].norm1.gamma.shape[0]
    return ExactPlan(stages, open_local, open_global, channels)
