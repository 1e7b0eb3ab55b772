"""The SeedVR2 family's pieces (the vocabulary and the shared ones are vae/pieces.py), chosen once per pass from
the model's active `FastPaths` (`SeedVR2Pieces.of`, read by `SeedVR2PassContext`): the causal padding written once
or concatenated, the fused attention kernel or the explicit fp32 softmax, the sub-pixel shuffle written straight into
the output or through the reference's rearrange, the composed upsampler convs. Each is exact in fp32 against the one
it replaces; tests/test_seedvr2.py and tests/test_fast_paths.py compare every choice.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Optional

import torch
from torch import nn

from ..accel.switches import FastPaths
from ..attention import attention
from ..pieces import Pieces, add_in_place


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
class SeedVR2Pieces(Pieces):
    """What a SeedVR2 pass runs, chosen once from its `FastPaths` and whether it runs under inference mode (`of`):
    the shared pieces and SeedVR2's own. `writes_in_place` (the switch); `in_place`: residual adds, norms and the
    clamp write into their input, under inference mode only."""

    writes_in_place: bool
    in_place: bool
    padding: CausalPadding
    shuffle: Callable[[nn.Module, Tensor, bool], Tensor]
    composed_upsampler: bool  # vae/seedvr2/subpixel.py, where `Upsample3D.composed_applies`

    @staticmethod
    @lru_cache(maxsize=None)
    def of(fast: FastPaths, inference: bool = False) -> "SeedVR2Pieces":
        in_place = fast.inplace_residual and inference
        return SeedVR2Pieces(
            **Pieces.shared(fast),
            add_residual=add_in_place if in_place else operator.add,
            attend=fused_attention if fast.sdpa else explicit_attention,
            writes_in_place=fast.inplace_residual,
            in_place=in_place,
            padding=WRITE_ONCE if fast.single_buffer else CONCATENATE,
            shuffle=shuffle_into_output if fast.native_shuffle else shuffle_then_drop,
            composed_upsampler=fast.subpixel_conv,
        )
