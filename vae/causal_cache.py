"""The causal cache a pass carries between layers and slices: the interface (`CausalState`), what the compiled
regions of vae/accel/compile.py snapshot and restore; its one implementation, the explicit list of tensors every
step reads and writes (`CausalCache`, which each architecture's pass context is); a cache handed over with
ownership (`CacheHandoff`); and the record of which module owns each tensor (`recorded_cache_owners`, what
`VAEModel.cache_layout` names). The model contract (vae/base.py) builds on it; it stands below both that contract
and vae/accel/, so the acceleration code needs nothing of the contract."""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator, Optional, Sequence

import torch
from torch import nn

from .memory.placement import Placement, cache_placement


class CausalState(ABC):
    """What a pass carries from layer to layer and slice to slice (causal caches read and written)
    and may advance in any layer call.

    Why: a layer run that fails part-way (a compiled region whose later sub-graph fails after an earlier
    one advanced the cache) must be re-run from the state it started from, or that slice reads the wrong
    history and comes out silently wrong. `snapshot` is cheap (references, not copies: the architectures
    replace cache entries, they never write into them).
    """

    @abstractmethod
    def snapshot(self) -> object:
        """An opaque record of the current state."""

    @abstractmethod
    def restore(self, saved: object) -> None:
        """Back to the state `snapshot` recorded."""


State = tuple[torch.Tensor, ...]
"""The causal cache a step hands to the next: one tensor per cached thing, in execution order."""


class CacheHandoff(list):
    """A step's input cache passed with ownership: the step drops each tensor as soon as it has read it, so a
    later slice does not hold the old cache beside the new one (up to twice the cache at its end). The
    caller must keep no other reference (`run_slices` hands its state over and drops its own)."""


class CausalCache(CausalState):
    """The causal cache of one encode/decode step as an explicit list of tensors, read (`take`) and written
    (`put`) in execution order; every architecture's pass context is one.

    Why explicit: a step is then a pure function (input slice, cache) -> (output, cache') that can be
    traced for export and chained by engines, streams and tiles alike. `cache_in` None means "first slice"
    (`take` gives None: no history); otherwise it must be exactly the tuple a previous step of the same model
    returned. `collect=False` (the last slice of a clip) builds no memory. A stream calls `advance` after
    each step, so the cache written becomes the cache read.
    """

    def __init__(self, cache_in: Optional[Sequence[torch.Tensor]] = None, collect: bool = True):
        # where the memory written is kept (vae/memory/placement.py: device, or host memory); None: where it is made
        self.placement: Optional[Placement] = cache_placement()
        self.start(cache_in, collect)

    def start(self, cache_in: Optional[Sequence[torch.Tensor]], collect: bool) -> None:
        """Begin a step reading `cache_in` (None: the first slice)."""
        self.first = cache_in is None
        # A handoff is read in place and emptied as read; any other sequence is the caller's and is only read.
        self._release = isinstance(cache_in, CacheHandoff)
        self._cache_in = cache_in if self._release else (list(cache_in) if cache_in is not None else [])
        self._pos = 0
        self.collect = collect
        self.cache_out: list[torch.Tensor] = []

    def take(self, fetch: bool = True) -> Optional[torch.Tensor]:
        """The next cache tensor (None on the first slice), where the pass computes; `fetch=False`: as it is
        held (in host memory under a host placement), for a caller that copies in only the parts it reads
        (`fetch_held` then copies those)."""
        if self.first:
            return None
        if self._pos >= len(self._cache_in):
            raise ValueError(f"causal cache has {len(self._cache_in)} tensors but the model needs more; "
                             "pass the state returned by the previous step of the same model")
        t = self._cache_in[self._pos]
        if self._release:
            self._cache_in[self._pos] = None  # the caller's conv holds it while it needs it
        self._pos += 1
        return self.fetch_held(t) if fetch else t

    def new_held(self, shape: Sequence[int], dtype: torch.dtype, device: Optional[torch.device] = None, *,
                 frame_major: bool = False) -> torch.Tensor:
        """An empty memory tensor where this pass keeps its memory (host memory under a host placement, else on
        `device`, default the placement's), for a caller that fills it piece by piece (`put(..., held=True)`);
        `frame_major`: stored frame by frame ([B, C, T, H, W] viewed from [B, T, C, H, W]), so a run of frames is
        one dense range."""
        if self.placement is not None and self.placement.on_host:
            return self.placement.held_empty(shape, dtype, frame_major=frame_major)
        where = device if device is not None else (self.placement.device if self.placement is not None else None)
        if frame_major:
            b, c, t, h, w = shape
            return torch.empty((b, t, c, h, w), dtype=dtype, device=where).permute(0, 2, 1, 3, 4)
        return torch.empty(tuple(shape), dtype=dtype, device=where)

    def fetch_held(self, t: torch.Tensor) -> torch.Tensor:
        """A held cache tensor (or a part of one) where the pass computes."""
        return t if self.placement is None else self.placement.fetch(t)

    def put(self, t: torch.Tensor, owner: Optional[nn.Module] = None, *, held: bool = False) -> None:
        """Record the next cache tensor (dropped when not collecting); `owner`: the module it belongs to
        (named by `VAEModel.cache_layout`); `held`: `t` was made by `new_held`, where the cache is kept."""
        if self.collect:
            self.cache_out.append(t if held or self.placement is None else self.placement.hold(t))
            owners = _cache_owners.get()
            if owners is not None:
                owners.append(owner)

    def snapshot(self) -> object:
        self._release = False  # a region that may be re-run from here reads these tensors again
        return self._pos, len(self.cache_out)

    def restore(self, saved: object) -> None:
        self._pos, produced = saved
        del self.cache_out[produced:]

    def finish(self) -> State:
        """The cache this step wrote; ValueError when the cache read was not all used (another model's)."""
        if not self.first and self._pos != len(self._cache_in):
            raise ValueError(f"causal cache has {len(self._cache_in)} tensors, the model used {self._pos}; "
                             "pass the state returned by the previous step of the same model")
        return tuple(self.cache_out)

    def advance(self) -> None:
        """End a stream's step: the cache written becomes the cache the next step reads, handed over (each
        tensor dropped as the next step reads it, so old and new caches are not all held at once)."""
        self.start(CacheHandoff(self.finish()), self.collect)


_cache_owners: ContextVar[Optional[list]] = ContextVar("turbovae_cache_owners", default=None)


@contextmanager
def recorded_cache_owners() -> Iterator[list]:
    """Within the block, every `CausalCache.put` also records the module that owns the tensor (what
    `cache_layout` names); outside it nothing is recorded."""
    owners: list = []
    token = _cache_owners.set(owners)
    try:
        yield owners
    finally:
        _cache_owners.reset(token)
