"""The SeedVR2 blocks' fast paths as named pieces, chosen once per pass from `FastPaths` (vae/accel/switches.py).

Why pieces: a block's `forward` reads as the architecture — GroupNorm, causal conv, attention, upsampler — while
*how* each step runs (the causal padding written once or concatenated, the first slice's conv shortcuts, the fused
attention kernel or the explicit fp32 softmax, the sub-pixel shuffle written straight into the output or through
the reference's rearrange, the composed upsampler convs) is chosen once, when the pass context is made
(`SeedVR2Pieces.of`, read by `SeedVR2PassContext`), not by an `if fast.…` inside every layer. Each piece is exact
in fp32 against the one it replaces; tests/test_seedvr2.py and tests/test_fast_paths.py compare every choice.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Optional, Sequence

import torch
from torch import nn

from ..accel.switches import FastPaths
from ..attention import attention
from ..base import PassContext


Tensor = torch.Tensor


# -- the causal padding ----------------------------------------------------------------------------
@dataclass(frozen=True)
class CausalPadding:
    """How a causal conv builds its padded input from `x` and the previous slice's frames (`pad`), and how it
    keeps the tail of that input for the next slice (`keep`)."""

    name: str
    pad: Callable[[nn.Module, Tensor, Optional[Tensor], torch.memory_format], Tensor]
    keep: Callable[[Tensor], Tensor]


WRITE_ONCE = CausalPadding(  # one buffer written once; the kept tail a compact copy, so the buffer can go
    "single_buffer", pad=lambda conv, x, prev, fmt: conv.write_padded(x, prev, fmt), keep=lambda tail: tail.clone())
CONCATENATE = CausalPadding(  # the reference's order of copies: pad, then concatenate the head
    "concatenate", pad=lambda conv, x, prev, fmt: conv.cat_padded(x, prev), keep=lambda tail: tail)


# -- the first slice's conv shortcuts --------------------------------------------------------------------
@dataclass(frozen=True)
class FirstSliceConv:
    """A way to run a causal conv on a clip's first slice that skips the replicate padding's taps: `applies` to a
    conv and input, `run` returns the conv's output (keeping what the next slice reads)."""

    name: str
    applies: Callable[[nn.Module, Tensor], bool]
    run: Callable[[nn.Module, Tensor, PassContext], Tensor]


FOLD_ONE_FRAME = FirstSliceConv(  # T = 1: every window is [f0] * k_t, a conv2d with the summed taps
    "image_path", applies=lambda conv, x: x.shape[2] == 1 and conv.head_frames == conv.kernel_size[0] - 1,
    run=lambda conv, x, ctx: conv.image_forward(x, ctx))
HEAD_TAPS = FirstSliceConv(
    "head_taps", applies=lambda conv, x: conv.head_taps_apply(x),
    run=lambda conv, x, ctx: conv.head_taps_forward(x, ctx))


# -- attention --------------------------------------------------------------------------------------
def fused_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """softmax(q·kᵀ/√C)·v over [N, tokens, C] through the fused kernel (vae/attention.py)."""
    return attention(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)).squeeze(1)


def explicit_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The reference's attention: explicit scores, softmax in fp32 (its `upcast_softmax`)."""
    scores = torch.bmm(q, k.transpose(1, 2)).mul_(q.shape[-1] ** -0.5)
    return torch.bmm(scores.float().softmax(dim=-1).to(v.dtype), v)


# -- the upsampler ---------------------------------------------------------------------------------
def shuffle_into_output(up: nn.Module, u: Tensor, drop_head: bool) -> Tensor:
    """The sub-pixel shuffle as views written straight into the output, the dropped head never written."""
    return up.shuffle_into_output(u, drop_head)


def shuffle_then_drop(up: nn.Module, u: Tensor, drop_head: bool) -> Tensor:
    """The reference's rearrange, then the head frame cut out of a copy."""
    return up.shuffle_reference(u, drop_head)


@dataclass(frozen=True)
class SeedVR2Pieces:
    """What a SeedVR2 pass runs, chosen once from its `FastPaths` (`of`). `writes_in_place`: residual adds, norms
    and the clamp may write into their input — under inference mode only (`SeedVR2PassContext.inplace`)."""

    writes_in_place: bool
    memory_format: torch.memory_format  # the 5-D activations' layout
    frame_format: torch.memory_format  # the same for 4-D frames
    fold_images: bool  # a lone first frame runs 2-D convs (`SeedVR2PassContext.image`)
    padding: CausalPadding
    first_slice_convs: Sequence[FirstSliceConv]
    attend: Callable[[Tensor, Tensor, Tensor], Tensor]
    shuffle: Callable[[nn.Module, Tensor, bool], Tensor]
    composed_upsampler: bool  # vae/seedvr2/subpixel.py, where `Upsample3D.composed_applies`

    @staticmethod
    @lru_cache(maxsize=None)
    def of(fast: FastPaths) -> "SeedVR2Pieces":
        return SeedVR2Pieces(
            writes_in_place=fast.inplace_residual,
            memory_format=torch.channels_last_3d if fast.channels_last else torch.contiguous_format,
            frame_format=torch.channels_last if fast.channels_last else torch.contiguous_format,
            fold_images=fast.image_path,
            padding=WRITE_ONCE if fast.single_buffer else CONCATENATE,
            first_slice_convs=tuple(s for s in (FOLD_ONE_FRAME, HEAD_TAPS) if getattr(fast, s.name)),
            attend=fused_attention if fast.sdpa else explicit_attention,
            shuffle=shuffle_into_output if fast.native_shuffle else shuffle_then_drop,
            composed_upsampler=fast.subpixel_conv,
        )
