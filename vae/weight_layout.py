"""Where a conv weight's bytes live: one copy, in the layout the clip path's kernel reads.

Why: a second copy per fast path (the last temporal tap for the single-frame image path, a channels-last
copy for the clip path) is memory that the host does not know about: ComfyUI's model management counts
the parameters, so it can neither budget nor offload such copies, and on a large VAE they added up to more
than the size of the model. Instead each parameter is stored once, converted in place at load to the
channels-last layout that the channels-last fast paths hand to the conv kernel (NDHWC for 3-D weights,
NHWC for 2-D ones). The checkpoint's shape [O, I, kt, kh, kw] is kept, so keys, shapes, values and
`state_dict()` are unchanged, and `Tensor.to` keeps the layout (dense tensors preserve their strides).

Every other reader takes a view: a temporal tap `w[:, :, t]` (the image path's folded last tap, or a
per-tap 2-D formulation) is a strided view whose O stride spans the other taps. A conv kernel wants it
packed, so that reader copies one layer's tap for the duration of one call (a third of the layer's
weight, freed when the conv returns). Storing the taps tap-major instead would make the taps packed
views but the whole 3-D weight strided, so every clip-path conv would copy the whole layer's weight per
call: measured slower (docs/wan.md, "Weights held once").
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn


def channels_last(weight: torch.Tensor) -> torch.Tensor:
    """`weight` with the same shape and values, stored channels-last (3-D for 5-D weights, 2-D for 4-D)."""
    if weight.ndim not in (4, 5):
        return weight
    return weight.contiguous(memory_format=torch.channels_last_3d if weight.ndim == 5 else torch.channels_last)


def is_channels_last(weight: torch.Tensor) -> bool:
    if weight.ndim not in (4, 5):
        return True
    return weight.is_contiguous(memory_format=torch.channels_last_3d if weight.ndim == 5 else torch.channels_last)


def hold_channels_last(modules: Iterable[nn.Module]) -> None:
    """Re-lay the `weight` parameter of each module in place (the Parameter object is kept, so hooks and
    ComfyUI's patcher still see it); a transient copy of one layer's weight at a time."""
    with torch.no_grad():
        for m in modules:
            w = getattr(m, "weight", None)
            if isinstance(w, nn.Parameter) and not is_channels_last(w):
                w.data = channels_last(w.data)


def checkpoint_layout(state: dict) -> dict:
    """A state dict with every tensor contiguous (the checkpoint's layout), for saving: safetensors
    refuses strided tensors. Tensors that already are contiguous are returned as they are (no copy)."""
    return {k: (v.contiguous() if isinstance(v, torch.Tensor) else v) for k, v in state.items()}
