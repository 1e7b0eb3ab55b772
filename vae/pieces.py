"""The pieces a pass runs: one vocabulary for every family, chosen once per pass from `FastPaths`.

Why pieces: a block's `forward` reads as the architecture — norm, conv, attention, residual — while *how* each
step runs (in place or into a copy, the fused attention kernel or the explicit softmax, channels-last or
contiguous, the first slice's conv shortcuts) is chosen once, when the pass context is made, not by an `if fast.…`
inside every layer. What every family reads is defined here once (`Pieces`, `FirstSliceConv`, `FOLD_ONE_FRAME`,
`HEAD_TAPS`, `add_in_place`); a family's pieces add its own (vae/wan/pieces.py `WanPieces`, vae/seedvr2/pieces.py
`SeedVR2Pieces`), and its layers implement the kernels the shared pieces call (`FirstSliceKernels`). Choosing
pieces has no side effect: the weights are laid out for a pass where it starts (`VAEModel.start_pass`). Each piece
is exact in fp32 against the one it replaces; tests/test_fast_paths.py and the architecture tests compare every
choice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Protocol, Sequence

import torch

from .accel.switches import FastPaths
from .base import PassContext


Tensor = torch.Tensor


# -- residual adds --------------------------------------------------------------------------------
def add_in_place(x: Tensor, h: Tensor) -> Tensor:
    """x + h written into x, unless autograd is recording (an in-place add would break its graph)."""
    return x.add_(h) if not torch.is_grad_enabled() else x + h


# -- the first slice's conv shortcuts ------------------------------------------------------------------
class FirstSliceKernels(Protocol):
    """What a family's causal conv implements for the first-slice shortcuts. `ctx` is the pass context (None: a
    call outside any pass, which keeps no history); a `*_forward` returns the conv's output and, where the pass
    collects a cache, keeps what the conv's next slice reads."""

    def fold_applies(self, x: Tensor) -> bool:
        """A lone frame (T = 1) whose windows the fold computes exactly."""

    def fold_forward(self, x: Tensor, ctx: Optional[PassContext]) -> Tensor:
        """The conv of a lone first frame as a 2-D conv with the folded temporal taps."""

    def head_taps_apply(self, x: Tensor) -> bool:
        """A first slice of T >= 2 frames through a 3-frame causal conv."""

    def head_taps_forward(self, x: Tensor, ctx: PassContext) -> Tensor:
        """The first slice with the head outputs' padding taps skipped, the body a valid conv3d."""


@dataclass(frozen=True)
class FirstSliceConv:
    """A way to run a causal conv on a clip's first slice (no history) that skips the causal padding's taps:
    `applies` to a conv and input, `run(conv, x, ctx)` returns the conv's output and keeps what the next slice
    reads. `name` is the `FastPaths` switch that turns it on."""

    name: str
    applies: Callable[[FirstSliceKernels, Tensor], bool]
    run: Callable[[FirstSliceKernels, Tensor, Optional[PassContext]], Tensor]


FOLD_ONE_FRAME = FirstSliceConv(
    "image_path", applies=lambda conv, x: conv.fold_applies(x), run=lambda conv, x, ctx: conv.fold_forward(x, ctx))
HEAD_TAPS = FirstSliceConv(
    "head_taps", applies=lambda conv, x: conv.head_taps_apply(x),
    run=lambda conv, x, ctx: conv.head_taps_forward(x, ctx))


def first_slice_convs(fast: FastPaths) -> tuple[FirstSliceConv, ...]:
    """The shortcuts `fast` turns on, in the order a first slice tries them."""
    return tuple(s for s in (FOLD_ONE_FRAME, HEAD_TAPS) if getattr(fast, s.name))


# -- what every family's pass reads ---------------------------------------------------------------------
@dataclass(frozen=True)
class Pieces:
    """The pieces every family's pass reads, chosen once per pass context; a family's pieces (a subclass) add
    its own. `fold_images`: a lone first frame runs 2-D convs."""

    memory_format: torch.memory_format  # the 5-D activations' layout (the conv weights are stored in it)
    frame_format: torch.memory_format  # the same for 4-D frames
    fold_images: bool
    first_slice_convs: Sequence[FirstSliceConv]  # tried in order on a slice without history
    add_residual: Callable[[Tensor, Tensor], Tensor]
    attend: Callable[[Tensor, Tensor, Tensor], Tensor]

    @staticmethod
    def shared(fast: FastPaths) -> dict:
        """The shared fields as `fast` chooses them, but for `add_residual` and `attend` (each family's own)."""
        return dict(memory_format=torch.channels_last_3d if fast.channels_last else torch.contiguous_format,
                    frame_format=torch.channels_last if fast.channels_last else torch.contiguous_format,
                    fold_images=fast.image_path, first_slice_convs=first_slice_convs(fast))

    def lay_out(self, x: Tensor) -> Tensor:
        """A step's input (4-D frames or 5-D clips) in this pass's layout: itself where the pass runs
        contiguous, else a channels-last copy (none where it is laid out so already)."""
        fmt = self.memory_format if x.ndim == 5 else self.frame_format
        return x if fmt == torch.contiguous_format else x.contiguous(memory_format=fmt)
