"""The Wan/Qwen-Image pass split for exact tiling (vae/tiling/exact.py).

Everything except the mid block is spatially local (convolutions, per-pixel RMS norm, nearest
resampling, the Wan 2.2 space-to-channel shortcuts), so each up/down block is one local stage whose
receptive radius is read off its layer list; the mid block (whole-frame attention) plus the 1×1 quant
convs and the encoder head form the global part at latent resolution.
"""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING, Callable

import torch

from ..base import CausalStream
from ..plans import ExactPlan, LocalStage
from .layers import StreamContext
from .patching import footprint, patchify, spatial_ops, unpatchify

if TYPE_CHECKING:  # annotations only: the model imports this module
    from .model import WanVAE


class _Session:
    """Per-tile state shared by the stages of one tile: one causal context, one "first step" flag."""

    def __init__(self, vae: WanVAE):
        self.vae = vae
        self.ctx = vae.context()


class _StageStream(CausalStream):
    def __init__(self, session: _Session, fn: Callable[[torch.Tensor, StreamContext], torch.Tensor], last: bool):
        self.session, self.fn, self.last = session, fn, last

    def step(self, x: torch.Tensor) -> torch.Tensor:
        ctx = self.session.ctx
        vae = self.session.vae
        if ctx.first and x.shape[2] == 1 and vae.flags.fold_image:
            y = self.fn(vae.to_memory_format(x[:, :, 0]), ctx).unsqueeze(2)
        else:
            y = self.fn(vae.to_memory_format(x), ctx)
        if self.last:
            ctx.first = False
        return y

    def close(self) -> None:
        if self.last:
            self.session.ctx.clear()


def wan_exact_plan(vae: WanVAE, *, decode: bool) -> ExactPlan:
    p = vae.config.patch_size
    if decode:
        dec = vae.decoder
        fns: list[Callable] = list(dec.up_blocks)  # blocks are called as block(x, ctx)
        geoms = [footprint(spatial_ops(b.modules())) for b in dec.up_blocks]

        def head(x, ctx):
            return unpatchify(dec.conv_out(dec.norm_out(x), ctx), p).clamp_(-1.0, 1.0)

        fns.append(head)
        geoms.append((Fraction(p), 1))
        global_fn = dec.forward_mid
    else:
        enc = vae.encoder

        def stem(x, ctx):
            return enc.conv_in(patchify(x, p), ctx)

        fns = [stem, *enc.down_blocks]
        # patchify by p, then a 3x3 conv: one patch pixel of context is p input pixels, plus the patch itself
        geoms = [(Fraction(1, p), 2 * p - 1)] + [footprint(spatial_ops(b.modules())) for b in enc.down_blocks]
        global_fn = enc.forward_mid

    stages = [LocalStage(scale, radius, name=f"stage{i}") for i, (scale, radius) in enumerate(geoms)]

    def open_local() -> list[CausalStream]:
        session = _Session(vae)
        return [_StageStream(session, fn, last=i == len(fns) - 1) for i, fn in enumerate(fns)]

    def open_global(shard=None) -> CausalStream:
        """`shard`: the frame is split across devices (vae/parallel); the mid-block attention divides its queries."""
        session = _Session(vae)
        session.ctx.shard = shard
        return _StageStream(session, global_fn, last=True)

    # the tensor between the local and global parts has the mid block's width
    channels = (vae.decoder if decode else vae.encoder).mid_block.resnets[0].norm1.gamma.shape[0]
    return ExactPlan(stages, open_local, open_global, channels)
