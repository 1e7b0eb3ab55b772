"""`FastPaths`: the switchable optimisations of every architecture, one type on `model.fast`.

Each switch is exact in fp32 (the tests compare every one against the plain path), so the benchmark can run
the plain path and every optimisation in one process. A field means the same in every architecture that
reads it; each architecture lists the fields it reads (`VAEModel.fast_fields`) and ignores the rest, so an
ablation toggles only those (`ablations`).

- native_shuffle: view/permute pixel shuffle written straight into the output (no einops, no remove-head copy).
- single_buffer: a causal conv writes its temporally padded input once; its memory is a compact copy. On Wan
  clips after the first slice the norm before a conv writes its result into that padded input.
- sdpa: mid-block attention through `scaled_dot_product_attention` instead of an explicit softmax.
- inplace_residual: residual adds (and SiLU) in place when no autograd graph is being recorded; a norm whose
  input is dropped after it may write its result into that input (the CPU channels-last GroupNorm does).
- image_path: a lone first frame (T = 1) runs 2-D convs with the folded temporal taps (summed for replicate
  padding, the last tap for zero padding), and only the kept half of a temporal upsampler.
- head_taps: on the first slice of a clip (T >= 2), the two head outputs of each 3-frame causal conv skip the
  padding's taps: summed taps for SeedVR2's replicate padding (3 frame-taps instead of 6), the live taps only
  for Wan's zero padding (3 instead of 6); the body is a valid conv3d without a padded copy.
- subpixel_conv: an upsampler's 1×1 conv, sub-pixel shuffle and 3×3×3 causal conv run as composed convs with 2×2
  spatial taps at low resolution (vae/seedvr2/subpixel.py), where the layer is large enough to pay for composing.
- channels_last: NHWC / NDHWC activations, the layout the conv weights are stored in (oneDNN and cuDNN convs
  run it without reordering either side, and per-frame norms see each frame as a view); where it runs on a
  GPU it must first pass its self-check, and fp32 passes on the CPU run contiguous (`active`;
  vae/accel/channels_last.py says why).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Iterable, Union

import torch

from .channels_last import channels_last_keeps_fp32, channels_last_trusted


@dataclass(frozen=True)
class FastPaths:
    """Optimisations, each exact in fp32; `FastPaths.plain()` turns all of them off."""

    native_shuffle: bool = True
    single_buffer: bool = True
    sdpa: bool = True
    inplace_residual: bool = True
    image_path: bool = True
    head_taps: bool = True
    subpixel_conv: bool = True
    channels_last: bool = True

    @classmethod
    def plain(cls) -> "FastPaths":
        return cls(**{f.name: False for f in fields(cls)})

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def without(self, name: str) -> "FastPaths":
        """These paths with `name` off; ValueError naming the fields when there is no such path."""
        if name not in self.names():
            raise ValueError(f"no fast path named {name!r}; the fast paths are {', '.join(self.names())}")
        return replace(self, **{name: False})


def ablations(fast: FastPaths, used: Iterable[str]) -> list[tuple[str, FastPaths]]:
    """(name, `fast` without it) for every path in `used` (an architecture's `fast_fields`) that `fast` has on:
    the one-switch-off-at-a-time runs of a benchmark."""
    return [(name, fast.without(name)) for name in used if getattr(fast, name)]


def active(fast: FastPaths, device: Union[str, torch.device], dtype: torch.dtype) -> FastPaths:
    """The paths a pass runs with: channels-last only where it passed its self-check and keeps fp32's accuracy
    (not fp32 on the CPU; vae/accel/channels_last)."""
    if fast.channels_last and not (channels_last_keeps_fp32(device, dtype) and channels_last_trusted(device, dtype)):
        return replace(fast, channels_last=False)
    return fast
