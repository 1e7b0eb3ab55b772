"""The Wan blocks' fast paths as named pieces, chosen once per pass from `FastPaths` (vae/accel/switches.py).

Why pieces: a block's `forward` reads as the architecture — norm, conv, attention, residual — while *how* each
step runs (in place or into a copy, the fused attention kernel or the explicit softmax, channels-last or
contiguous, the first slice's conv shortcuts, the norm writing into the conv's padded input) is chosen once, when
the pass context is made (`WanPieces.of`), not by an `if fast.…` inside every layer. Each piece is exact in fp32
against the one it replaces; tests/test_fast_paths.py and the architecture tests compare every choice.
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


Tensor = torch.Tensor


# -- residual adds --------------------------------------------------------------------------------
def add_in_place(x: Tensor, h: Tensor) -> Tensor:
    """x + h written into x, unless autograd is recording (an in-place add would break its graph)."""
    return x.add_(h) if not torch.is_grad_enabled() else x + h


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


# -- the first slice's conv shortcuts ------------------------------------------------------------------
@dataclass(frozen=True)
class FirstSliceConv:
    """A way to run a causal conv on a clip's first slice (no history) that skips the causal padding's taps:
    `applies` to a conv and input, `run` returns the conv's output, `history` what the conv keeps for the next
    slice (its padded input's last `time_history` frames)."""

    name: str
    applies: Callable[[nn.Module, Tensor], bool]
    run: Callable[[nn.Module, Tensor, Optional[PassContext], torch.memory_format], Tensor]
    history: Callable[[nn.Module, Tensor, torch.memory_format], Tensor]


FOLD_ONE_FRAME = FirstSliceConv(
    "image_path",
    applies=lambda conv, x: x.shape[2] == 1,
    run=lambda conv, x, ctx, fmt: conv.image(x[:, :, 0], ctx).unsqueeze(2),
    # the folded frame is the last of a zero-padded history (`CausalConv3d.skip` says why it is padded)
    history=lambda conv, x, fmt: torch.cat([conv.zeros_like_frames(x, conv.time_history - 1, fmt), x], dim=2),
)
HEAD_TAPS = FirstSliceConv(
    "head_taps",
    applies=lambda conv, x: conv.head_taps_apply(x),
    run=lambda conv, x, ctx, fmt: conv.head_taps(x.contiguous(memory_format=fmt), ctx, fmt),
    history=lambda conv, x, fmt: x[:, :, -conv.time_history:],
)


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
class WanPieces:
    """What a Wan pass runs, chosen once from its `FastPaths` (`of`)."""

    memory_format: torch.memory_format  # the 5-D activations' layout (the conv weights are stored in it)
    frame_format: torch.memory_format  # the same for 4-D frames (attention's output)
    add_residual: Callable[[Tensor, Tensor], Tensor]
    attend: Callable[[Tensor, Tensor, Tensor], Tensor]
    tokens_to_frames: Callable[[Tensor, int, int, int], Tensor]
    norm_conv: Callable[[nn.Module, nn.Module, Tensor, Optional[PassContext]], Tensor]
    first_slice_convs: Sequence[FirstSliceConv]  # tried in order on a slice without history

    @staticmethod
    @lru_cache(maxsize=None)
    def of(fast: FastPaths) -> "WanPieces":
        shortcuts = tuple(s for s in (FOLD_ONE_FRAME, HEAD_TAPS) if getattr(fast, s.name))
        return WanPieces(
            memory_format=torch.channels_last_3d if fast.channels_last else torch.contiguous_format,
            frame_format=torch.channels_last if fast.channels_last else torch.contiguous_format,
            add_residual=add_in_place if fast.inplace_residual else operator.add,
            attend=attention if fast.sdpa else explicit_attention,  # the fused kernel (vae/attention.py)
            tokens_to_frames=tokens_as_nhwc if fast.channels_last else tokens_as_nchw,
            norm_conv=norm_into_padded_input if fast.single_buffer else norm_then_conv,
            first_slice_convs=shortcuts,
        )


CONTEXT_FREE = (FOLD_ONE_FRAME,)  # a call without a pass context (a time downsample's conv) folds a lone frame


class WanPassContext(PassContext):
    """The base pass context (vae/base.py) with the Wan pieces its `fast` chooses (`pieces`)."""

    def __init__(self, fast: FastPaths, cache_in: Optional[Sequence[torch.Tensor]] = None, collect: bool = True,
                 shard: Optional[object] = None):
        super().__init__(fast, cache_in, collect, shard)
        self.pieces = WanPieces.of(fast)
