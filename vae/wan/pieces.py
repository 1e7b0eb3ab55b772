"""The Wan family's pieces (the vocabulary and the shared ones are vae/pieces.py), chosen once per pass from the
model's active `FastPaths` (`WanPieces.of`, read by `WanPassContext`): the attention kernel, how attention's tokens
become frames, the norm writing into the conv's padded input. Each is exact in fp32 against the one it replaces.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Optional, Sequence

import torch
from torch import nn

from ..accel.switches import FastPaths
from ..attention import attention
from ..base import PassContext
from ..pieces import FOLD_ONE_FRAME, Pieces, add_in_place


Tensor = torch.Tensor


# -- attention --------------------------------------------------------------------------------------
def explicit_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The same product with the score matrix made explicitly (the reference the fused kernel is held to)."""
    scores = torch.matmul(q, k.transpose(-1, -2)).mul_(1.0 / math.sqrt(q.shape[-1]))
    return torch.matmul(scores.softmax(dim=-1), v)


def tokens_as_nhwc(tokens: Tensor, n: int, h: int, w: int) -> Tensor:
    """[N, HW, C] tokens as an [N, C, H, W] map stored channels-last: a view, no copy."""
    return tokens.view(n, h, w, tokens.shape[-1]).permute(0, 3, 1, 2)


def tokens_as_nchw(tokens: Tensor, n: int, h: int, w: int) -> Tensor:
    """[N, HW, C] tokens as a contiguous [N, C, H, W] map: a copy. (A reshape of the transposed tokens is a
    channels-last view; the residual add wrote into it, and every layer after the attention then ran
    channels-last in a contiguous pass: on the CPU, oneDNN's less accurate NHWC fp32 convs.)"""
    return tokens.transpose(1, 2).contiguous().view(n, tokens.shape[-1], h, w)


# -- norm then conv ---------------------------------------------------------------------------------------
def norm_then_conv(norm: nn.Module, conv: nn.Module, x: Tensor, ctx: Optional[PassContext]) -> Tensor:
    """conv(SiLU(norm(x))): the conv concatenates its history in front of a normalised copy."""
    return conv(norm(x), ctx)


def norm_into_padded_input(norm: nn.Module, conv: nn.Module, x: Tensor, ctx: Optional[PassContext]) -> Tensor:
    """After the first slice, the norm writes its result straight into the conv's padded input (the causal
    history in front, `CausalConv3d.padded_input`): one activation-sized write and read fewer per conv."""
    if ctx is not None and x.ndim == 5 and not ctx.first and conv.time_history:
        padded = conv.padded_input(x, ctx)
        norm(x, out=padded[:, :, conv.time_history:])
        return conv.video_padded(padded, ctx)
    return norm_then_conv(norm, conv, x, ctx)


@dataclass(frozen=True)
class WanPieces(Pieces):
    """What a Wan pass runs, chosen once from its `FastPaths` (`of`): the shared pieces and Wan's own."""

    tokens_to_frames: Callable[[Tensor, int, int, int], Tensor]
    norm_conv: Callable[[nn.Module, nn.Module, Tensor, Optional[PassContext]], Tensor]

    @staticmethod
    @lru_cache(maxsize=None)
    def of(fast: FastPaths) -> "WanPieces":
        return WanPieces(
            **Pieces.shared(fast),
            add_residual=add_in_place if fast.inplace_residual else operator.add,
            attend=attention if fast.sdpa else explicit_attention,  # the fused kernel (vae/attention.py)
            tokens_to_frames=tokens_as_nhwc if fast.channels_last else tokens_as_nchw,
            norm_conv=norm_into_padded_input if fast.single_buffer else norm_then_conv,
        )


CONTEXT_FREE = (FOLD_ONE_FRAME,)  # a conv called without a pass context folds a lone frame


class WanPassContext(PassContext):
    """The base pass context (vae/base.py) with the Wan pieces its `fast` chooses (`pieces`): `fast` is the model's
    active paths (`WanVAE.context` makes it)."""

    def __init__(self, fast: FastPaths, cache_in: Optional[Sequence[torch.Tensor]] = None, collect: bool = True,
                 shard: Optional[object] = None):
        super().__init__(fast, cache_in, collect, shard)
        self.pieces = WanPieces.of(fast)
