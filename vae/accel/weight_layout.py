"""Where a conv weight's bytes live: one copy, in the layout the clip path's kernel reads.

Why: a second copy per fast path (the last temporal tap for the single-frame image path, a channels-last
copy for the clip path) is memory that the host does not know about: ComfyUI's model management counts
the parameters, so it can neither budget nor offload such copies, and on a large VAE they added up to more
than the size of the model. Instead each parameter is stored once, laid out in place in the layout the
model's convs read (`VAEModel.hold_weights`: at construction, after each load and when `model.fast` changes):
channels-last with the channels-last fast path on (NDHWC for 3-D weights, NHWC for 2-D ones), else the
checkpoint's contiguous layout (a conv handed weights in the other layout reorders them, or its input, on every
call). The checkpoint's shape [O, I, kt, kh, kw] is kept, so keys, shapes, values and
`state_dict()` are unchanged, and `Tensor.to` keeps the layout (dense tensors preserve their strides).

Every other reader takes a view: a temporal tap `w[:, :, t]` (the image path's folded last tap, or a
per-tap 2-D formulation) is a strided view whose O stride spans the other taps. A conv kernel wants it
packed, so the image path packs the tap into a `PassScratch`: one buffer per pass, reused by every conv
of the pass and freed with it, so it is bounded by the largest single tap and never held between calls.
(A fresh tensor per conv would cost as much time as the conv itself for taps above glibc's 32 MiB mmap
threshold, Wan 2.2's 1024-channel convs: each is a new mapping whose pages fault in.) Storing the taps
tap-major instead would make each tap packed but the whole 3-D weight strided, so every clip-path conv
would copy the layer's whole weight per call.
"""

from __future__ import annotations

from typing import Iterable, Iterator, Optional

import torch
from torch import nn

from ..memory.meta_device import path_device_type
from ..tracing import tracing
from .tensor_layout import channels_last_format


def channels_last_copy(weight: torch.Tensor) -> torch.Tensor:
    """`weight` with the same shape and values, stored channels-last (3-D for 5-D weights, 2-D for 4-D)."""
    if weight.ndim not in (4, 5):
        return weight
    return weight.contiguous(memory_format=channels_last_format(weight.ndim))


def is_channels_last(weight: torch.Tensor) -> bool:
    if weight.ndim not in (4, 5):
        return True
    return weight.is_contiguous(memory_format=channels_last_format(weight.ndim))


def hold_layout(modules: Iterable[nn.Module], channels_last: bool) -> None:
    """Re-lay the `weight` parameter of each module in place, channels-last or contiguous (the Parameter object is
    kept, so hooks and ComfyUI's patcher still see it); a transient copy of one layer's weight at a time, none for
    weights already laid out so."""
    with torch.no_grad():
        for m in modules:
            w = getattr(m, "weight", None)
            if not isinstance(w, nn.Parameter):
                continue
            if channels_last and not is_channels_last(w):
                w.data = channels_last_copy(w.data)
            elif not channels_last and not w.is_contiguous():
                w.data = w.data.contiguous()


def conv_modules(model: nn.Module) -> Iterator[nn.Module]:
    return (m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Conv3d)))


class PassScratch:
    """One reusable buffer for the weights that one pass's convs must pack (the image path's last temporal
    tap of a channels-last 3-D weight): each conv copies its tap in and the next conv overwrites it. It
    grows to the largest such tap of the pass and is freed with the pass (the `PassContext` owns it), so
    nothing beside the parameters outlives a call. Fresh tensors instead where reusing storage is unsafe or
    buys nothing: under tracing, in grad mode (a conv whose input or weight requires grad saves the packed
    weight for its backward, and the next conv's copy would overwrite it; the input is not seen here), and on
    CUDA (its caching allocator makes a fresh tensor free, and kernels may still read the previous one). A meta
    pass predicting a CPU pass takes the CPU's path (`vae.memory.meta_device`): the buffer is held from the first
    packed tap to the end of the pass."""

    def __init__(self) -> None:
        self._buf: Optional[torch.Tensor] = None

    def packed(self, weight: torch.Tensor, memory_format: torch.memory_format) -> torch.Tensor:
        """`weight` contiguous in `memory_format`: itself when it already is, else a copy in the scratch."""
        if weight.is_contiguous(memory_format=memory_format):
            return weight
        if path_device_type(weight) != "cpu" or tracing() or torch.is_grad_enabled() or weight.ndim not in (4, 5):
            return weight.contiguous(memory_format=memory_format)
        n = weight.numel()
        buf = self._buf
        if buf is None or buf.numel() < n or buf.dtype != weight.dtype or buf.device != weight.device:
            buf = self._buf = torch.empty(n, dtype=weight.dtype, device=weight.device)
        return _shaped(buf[:n], weight.shape, memory_format).copy_(weight)

    def clear(self) -> None:
        self._buf = None


def _shaped(flat: torch.Tensor, shape: torch.Size, memory_format: torch.memory_format) -> torch.Tensor:
    """`flat` viewed as a tensor of `shape` laid out contiguously in `memory_format`."""
    if memory_format == torch.channels_last:
        o, i, h, w = shape
        return flat.view(o, h, w, i).permute(0, 3, 1, 2)
    if memory_format == torch.channels_last_3d:
        o, i, t, h, w = shape
        return flat.view(o, t, h, w, i).permute(0, 4, 1, 2, 3)
    return flat.view(shape)


def checkpoint_layout(state: dict) -> dict:
    """A state dict with every tensor contiguous (the checkpoint's layout), for saving: safetensors
    refuses strided tensors. Tensors that already are contiguous are returned as they are (no copy)."""
    return {k: (v.contiguous() if isinstance(v, torch.Tensor) else v) for k, v in state.items()}
