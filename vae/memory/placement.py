"""Where a pass keeps what it holds from step to step: in device memory, or in host memory.

Why: a long clip's pass holds two things across its steps: every causal conv's history (a few frames of its
input, whole-frame for SeedVR2, whose norms span the frame) and the finished output. At 1080p × 81 those are tens
of GB, far more than the activations of one step, and more than an 8 GB card has. A plan that keeps them in host
memory (vae/planning) holds on the device only what one step works on; each history is copied in when its conv
runs and out when it is written.

Host memory is allocated outside PyTorch's device allocator: pinned on CUDA (fast copies), and on the CPU as
memory of numpy's own, so that on both the allocator's count (vae/memory/allocator.py) is the device side alone,
which is what a plan's budget is about; on the CPU, host and device memory are one, and a held tensor is used where
it lies (`fetch` copies nothing).

`held_in(placement)` sets the placement of the causal caches of the passes run inside the block (read by
`PassContext`, vae/base.py); output canvases take theirs from the caller.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator, Optional, Protocol, Sequence

import numpy as np
import torch


class Placement(Protocol):
    """How a pass stores a tensor it keeps for a later step, and gets it back for use."""

    on_host: bool
    fetch_copies: bool  # whether `fetch` copies to another device (host memory beside a GPU), or gives the memory itself

    def hold(self, t: torch.Tensor) -> torch.Tensor:
        """What to keep for `t` (itself on the device; a copy in host memory)."""

    def fetch(self, t: torch.Tensor) -> torch.Tensor:
        """A tensor `hold` returned, where the pass computes."""

    def empty(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """A new contiguous buffer where this placement keeps things (output canvases)."""

    def held_empty(self, shape: Sequence[int], dtype: torch.dtype, *, frame_major: bool = False) -> torch.Tensor:
        """A new buffer for state `hold` would keep, filled by its maker through `write` (pinned host memory on
        CUDA: the copies in and out are asynchronous); `frame_major`: a [B, C, T, H, W] buffer stored frame by
        frame."""

    def write(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Copy `src` (on the device) into `dst` (a part of a `held_empty` buffer). Asynchronous on CUDA: nothing
        may read `dst` on the CPU after this, only `fetch` it back (which the stream orders after the write)."""

    def settled(self, t: torch.Tensor) -> torch.Tensor:
        """`t` (held by this placement and written through `write`) readable on the CPU: once the writes into it
        have landed (on CUDA the stream is waited for). For handing a finished output to code that copies it
        on the host."""


class OnDevice:
    """Everything stays where the pass computes."""

    on_host = False
    fetch_copies = False

    def __init__(self, device: torch.device):
        self.device = torch.device(device)

    def hold(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def settled(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def fetch(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def empty(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(tuple(shape), dtype=dtype, device=self.device)

    def held_empty(self, shape: Sequence[int], dtype: torch.dtype, *, frame_major: bool = False) -> torch.Tensor:
        return _frame_major(self.empty, shape, dtype) if frame_major else self.empty(shape, dtype)

    def write(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src)


def host_empty(shape: Sequence[int], dtype: torch.dtype, *, pinned: bool) -> torch.Tensor:
    """A host buffer outside PyTorch's CPU allocator: pinned (CUDA's host allocator) or numpy's memory."""
    shape = tuple(int(d) for d in shape)
    if pinned:
        return torch.empty(shape, dtype=dtype, pin_memory=True)
    nbytes = int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=dtype).element_size()
    raw = torch.from_numpy(np.empty(max(nbytes, 1), dtype=np.uint8))[:nbytes]
    return raw.view(dtype).view(shape)


def host_like(t: torch.Tensor, *, pinned: bool) -> torch.Tensor:
    """A host buffer (`host_empty`) of `t`'s shape, and of its strides where `t` is dense (channels-last stays
    channels-last), so copies between the two are single dense transfers."""
    dense = t.is_contiguous() or t.is_contiguous(memory_format=torch.channels_last_3d) if t.ndim == 5 else \
        t.is_contiguous()
    buf = host_empty((t.numel(),), t.dtype, pinned=pinned)
    if dense:
        return buf.as_strided(t.shape, t.stride())
    return buf.view(t.shape)


class OnHost:
    """Held tensors live in host memory; `fetch` copies one to the compute device (nothing on the CPU)."""

    on_host = True

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self._pinned = self.device.type == "cuda"
        self.fetch_copies = self.device.type != "cpu"

    def settled(self, t: torch.Tensor) -> torch.Tensor:
        if self._pinned:
            torch.cuda.current_stream(self.device).synchronize()
        return t

    def hold(self, t: torch.Tensor) -> torch.Tensor:
        buf = host_like(t, pinned=self._pinned)
        self.write(buf, t)  # the same strides on both sides: one dense copy
        return buf

    def fetch(self, t: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cpu":
            return t
        return t.to(self.device, non_blocking=True)

    def empty(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        return host_empty(shape, dtype, pinned=False)

    def held_empty(self, shape: Sequence[int], dtype: torch.dtype, *, frame_major: bool = False) -> torch.Tensor:
        def make(s, d):
            return host_empty(s, d, pinned=self._pinned)

        return _frame_major(make, shape, dtype) if frame_major else make(shape, dtype)

    def write(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src, non_blocking=self._pinned)


class OnMetaHost:
    """`OnHost` in a pass predicted on meta tensors (vae/memory/peak.py `LiveBytes`): held tensors count as host
    memory, and a fetch is a device copy where the planned device is not the CPU."""

    on_host = True

    def __init__(self, tracker, device_type: str):
        self.tracker, self.device_type = tracker, device_type
        self.device = torch.device("meta")
        self.fetch_copies = device_type != "cpu"

    def settled(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def _host(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        from torch.utils._python_dispatch import _disable_current_modes

        with _disable_current_modes():  # made outside the count, then counted as host memory
            buf = torch.empty(tuple(shape), dtype=dtype, device="meta")
        self.tracker.hold_on_host(buf)
        return buf

    def hold(self, t: torch.Tensor) -> torch.Tensor:
        return self._host(t.shape, t.dtype)

    def fetch(self, t: torch.Tensor) -> torch.Tensor:
        return t if self.device_type == "cpu" else t.clone()

    def empty(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        return self._host(shape, dtype)

    def held_empty(self, shape: Sequence[int], dtype: torch.dtype, *, frame_major: bool = False) -> torch.Tensor:
        return _frame_major(self._host, shape, dtype) if frame_major else self._host(shape, dtype)

    def write(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """A meta run: the copy allocates nothing (a cross-device copy of a non-dense source would stage it on the
        device; the sources here are dense or a one-frame expansion)."""


def _frame_major(make, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """`make`'s buffer of [B, T, C, H, W] viewed as the [B, C, T, H, W] `shape`: each frame one dense block."""
    b, c, t, h, w = shape
    return make((b, t, c, h, w), dtype).permute(0, 2, 1, 3, 4)


def release_host_cache(device: torch.device) -> None:
    """Give the pinned host memory a pass on `device` used back to the system: PyTorch's pinned-memory allocator
    keeps freed blocks for reuse, so without this the RAM a pass held in host memory would stay taken after it.
    Nothing to do off CUDA (host memory there is plain memory, freed with its tensors)."""
    if torch.device(device).type != "cuda":
        return
    empty = getattr(getattr(torch, "accelerator", None), "empty_host_cache", None)
    if empty is not None:
        empty()


_CACHE_PLACEMENT: ContextVar[Optional[Placement]] = ContextVar("turbovae_cache_placement", default=None)


@contextmanager
def held_in(placement: Optional[Placement]) -> Iterator[None]:
    """The causal caches of passes run in the block are kept by `placement` (None: on the device)."""
    token = _CACHE_PLACEMENT.set(placement)
    try:
        yield
    finally:
        _CACHE_PLACEMENT.reset(token)


def cache_placement() -> Optional[Placement]:
    """The placement `held_in` set for this block, or None (caches on the device)."""
    return _CACHE_PLACEMENT.get()
