"""Counting a pass's memory: the bytes of every storage its ops create, for as long as each lives, and the most alive
at once (`LiveBytes`), on meta tensors (a prediction: vae/planning/meta_pass.py runs the pass there) or on real ones (a
measurement of the same quantity on the CPU); what a prediction reports (`PeakPrediction`); a model's weights
(`weight_bytes`).

Why storages: a pass run on the meta device allocates nothing and runs no arithmetic, but every op still creates its
output storages with their real sizes and frees them when the last reference goes, exactly as the real pass would.
`LiveBytes` counts those storages (a weakref finalizer on each one tells when it is freed) and keeps the peak; what the
real kernels hold inside an op comes from the device type's rules (vae/memory/op_rules.py).

Weights are not counted in a pass's peak: they are held once, before and after (`weight_bytes`).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from functools import partial
from typing import Iterable, Optional, Protocol

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from .meta_ops import UncompiledMode, run_op


class OpMemory(Protocol):
    """What the real kernels of one device type do that their meta kernels do not show (vae/memory/op_rules.py): memory
    alive only inside an op (workspaces, layout copies, im2col buffers) and outputs laid out otherwise than the
    meta kernel lays them out (which changes the copies the code after them makes)."""

    def applies(self, func) -> bool:
        """Whether `func` is an op this model has a rule for (the others are passed by without a call: a pass runs
        thousands of ops)."""

    def real_output(self, func, args: tuple, kwargs: dict, out):
        """`out` (a meta op's result) as the real kernel would lay it out: itself, or a restrided meta tensor."""

    def transient_bytes(self, func, args: tuple, kwargs: dict, out) -> int:
        """Bytes the real kernel holds while it runs beyond its inputs and outputs."""


class LiveBytes(UncompiledMode):
    """Counts the bytes of every storage an op creates while the mode is on, until the storage is freed; `peak`
    is the most that were alive at once. Storages that existed before (`exclude`: inputs, weights) are never
    counted, also when an op returns a view of them. Works on meta tensors (prediction) and on real ones
    (measurement of the same quantity on the CPU).

    `op_memory` adds what the real kernels allocate inside an op (vae/memory/op_rules.py) to the peak while that op
    runs. Storages handed to `hold_on_host` are held in host memory by the pass (vae/memory/placement.py): they count in
    `host_live` / `host_peak`, never in the device count."""

    def __init__(self, exclude: Iterable[torch.Tensor] = (), op_memory: Optional[OpMemory] = None):
        super().__init__()
        self.live = 0
        self.peak = 0
        self.host_live = 0
        self.host_peak = 0
        self.op_memory = op_memory
        self._ruled: dict[int, bool] = {}  # id(op) -> whether `op_memory` has a rule for it (ops live for good)
        self._window = 0
        # storages seen, by the address of their StorageImpl (a plain dict: a pass runs thousands of ops, and each
        # looks its outputs up here), each with a weak reference whose callback removes the entry when the storage
        # is freed, so an address reused by a later storage is never taken for it
        self._seen: dict[int, weakref.ref] = {}
        for t in exclude:
            self._see(t.untyped_storage())

    def _see(self, storage, device_bytes: int = 0, host_bytes: int = 0) -> bool:
        """Mark `storage` seen, counted as `device_bytes` and `host_bytes` alive until it is freed (its weak
        reference's callback forgets it and uncounts them; one plain weak reference, lighter than
        `weakref.finalize`: a pass makes thousands of storages); whether it was new."""
        key = storage._cdata
        if key in self._seen:
            return False
        self._seen[key] = weakref.ref(storage, partial(self._forget, key, device_bytes, host_bytes))
        return True

    def _forget(self, key: int, device_bytes: int, host_bytes: int, _ref=None) -> None:
        self._seen.pop(key, None)
        self.live -= device_bytes
        self.host_live -= host_bytes

    def _track(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        if storage._cdata in self._seen:
            return
        nbytes = storage.nbytes()
        self._see(storage, device_bytes=nbytes)
        self.live += nbytes
        if self.live > self.peak:
            self.peak = self.live
        if self.live > self._window:
            self._window = self.live

    def hold_on_host(self, t: torch.Tensor) -> None:
        """`t`'s storage lives in host memory: out of the device count (now, if it was counted), into the host's."""
        storage = t.untyped_storage()
        nbytes = storage.nbytes()
        if not self._see(storage, host_bytes=nbytes):
            raise ValueError("hold_on_host takes a storage the pass has not used yet (a fresh host buffer)")
        self.host_live += nbytes
        self.host_peak = max(self.host_peak, self.host_live)

    def elsewhere(self, t: torch.Tensor) -> None:
        """`t`'s storage is memory of another device's (a stand-in collective's copy of another rank's band,
        vae/parallel/predict.py): never counted, nor any view of it."""
        if not self._see(t.untyped_storage()):
            raise ValueError("elsewhere takes a storage the pass has not used yet (made outside the count)")

    def window_peak(self) -> int:
        """The most alive at once since the last call (or the start); the next window starts from what is
        alive now."""
        peak, self._window = self._window, self.live
        return peak

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = run_op(func, args, kwargs)
        extra = 0
        if self.op_memory is not None:
            ruled = self._ruled.get(id(func))
            if ruled is None:
                ruled = self._ruled[id(func)] = bool(self.op_memory.applies(func))
            if ruled:
                out = self.op_memory.real_output(func, args, kwargs, out)
                extra = self.op_memory.transient_bytes(func, args, kwargs, out)
        if isinstance(out, torch.Tensor):
            self._track(out)
        elif isinstance(out, (tuple, list)):
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self._track(t)
        if extra:
            self.peak = max(self.peak, self.live + extra)
            self._window = max(self._window, self.live + extra)
        return out


@dataclass(frozen=True)
class PeakPrediction:
    """A pass's predicted memory (bytes). `pass_bytes`: the most the pass's own tensors hold at once, its output
    included (what `torch.cuda.max_memory_allocated` rises by above the memory held before the pass);
    `input_bytes` and `weight_bytes` are held throughout. `total_bytes` is all three (device memory)."""

    pass_bytes: int
    input_bytes: int
    weight_bytes: int
    temporal_slice: Optional[int]
    host_bytes: int = 0  # the most a plan holds in host memory at once (vae/memory/placement.py); not in `pass_bytes`

    @property
    def total_bytes(self) -> int:
        return self.pass_bytes + self.input_bytes + self.weight_bytes


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the parameters and buffers (each storage once)."""
    seen: dict[int, int] = {}
    for t in [*model.parameters(), *model.buffers()]:
        s = t.untyped_storage()
        seen[id(s) if t.device.type == "meta" else s.data_ptr()] = s.nbytes()
    return sum(seen.values())
