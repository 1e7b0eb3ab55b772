"""Which memory format a tensor is laid out in: the one rule the convs, the norms and the weight layout
share (channels-last is NHWC for 4-D tensors and NDHWC for 5-D ones)."""

from __future__ import annotations

import torch


def channels_last_format(ndim: int) -> torch.memory_format:
    """The channels-last memory format for a tensor of `ndim` dimensions (4 or 5)."""
    return torch.channels_last if ndim == 4 else torch.channels_last_3d


def memory_format_of(x: torch.Tensor) -> torch.memory_format:
    """Channels-last when `x` is laid out so (and not also plain contiguous, as size-1 dims can make it),
    else the contiguous format."""
    if x.is_contiguous() or x.ndim not in (4, 5):
        return torch.contiguous_format
    fmt = channels_last_format(x.ndim)
    return fmt if x.is_contiguous(memory_format=fmt) else torch.contiguous_format
