"""Peak memory of a pass, known before it runs: the pass itself on meta tensors, its storages counted.

Why: a clip decode that runs out of memory does so after minutes of sampling, and a hand formula per model
(what the passes used before, and ComfyUI core uses) is off by large factors on some shapes. A pass run on the meta
device allocates nothing and runs no arithmetic, but every op still creates its output storages with their
real sizes and frees them when the last reference goes, exactly as the real pass would. `LiveBytes` counts
those storages (a weakref finalizer on each one tells when it is freed) and keeps the peak; running the real
model's own code on a meta copy means every architecture, direction, dtype, temporal slice and fast path is
predicted by the code that will run, not by a model of it.

What it does not see: memory inside one op (convolution workspaces, allocator rounding and fragmentation) and
kernels that only exist on a GPU (fused Triton norms, compiled regions, CUDA graph pools): the meta pass takes
the PyTorch path of those ops. docs/memory.md states the error against measured CPU and GPU peaks.

Weights are not counted in a pass's peak: they are held once, before and after (`weight_bytes`).
"""

from __future__ import annotations

import math
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Iterable, Iterator, Optional, Protocol, Sequence, Union

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from .. import norms
from ..base import VAEModel, run_slices
from ..accel.switches import FastPaths, active
from ..accel import self_checks
from ..accel.channels_last import channels_last_keeps_fp32
from .meta_device import predicting_for
from .op_rules import op_memory_for
from ..norms import fused_norms_possible
from ..gpu_defaults import channels_last_applies


class OpMemory(Protocol):
    """What the real kernels of one device type do that their meta kernels do not show (vae/memory/op_rules.py): memory
    alive only inside an op (workspaces, layout copies, im2col buffers) and outputs laid out otherwise than the
    meta kernel lays them out (which changes the copies the code after them makes)."""

    def real_output(self, func, args: tuple, kwargs: dict, out):
        """`out` (a meta op's result) as the real kernel would lay it out: itself, or a restrided meta tensor."""

    def transient_bytes(self, func, args: tuple, kwargs: dict, out) -> int:
        """Bytes the real kernel holds while it runs beyond its inputs and outputs."""


class LiveBytes(TorchDispatchMode):
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
        self._window = 0
        self._seen: WeakIdKeyDictionary = WeakIdKeyDictionary()
        for t in exclude:
            self._seen[t.untyped_storage()] = True

    def _track(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        if storage in self._seen:
            return
        nbytes = storage.nbytes()
        self._seen[storage] = True
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        self._window = max(self._window, self.live)
        weakref.finalize(storage, self._free, nbytes)

    def _free(self, nbytes: int) -> None:
        self.live -= nbytes

    def hold_on_host(self, t: torch.Tensor) -> None:
        """`t`'s storage lives in host memory: out of the device count (now, if it was counted), into the host's."""
        storage = t.untyped_storage()
        nbytes = storage.nbytes()
        if storage in self._seen:
            raise ValueError("hold_on_host takes a storage the pass has not used yet (a fresh host buffer)")
        self._seen[storage] = True
        self.host_live += nbytes
        self.host_peak = max(self.host_peak, self.host_live)
        weakref.finalize(storage, self._free_host, nbytes)

    def _free_host(self, nbytes: int) -> None:
        self.host_live -= nbytes

    def window_peak(self) -> int:
        """The most alive at once since the last call (or the start); the next window starts from what is
        alive now."""
        peak, self._window = self._window, self.live
        return peak

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        extra = 0
        if self.op_memory is not None:
            out = self.op_memory.real_output(func, args, kwargs, out)
            extra = self.op_memory.transient_bytes(func, args, kwargs, out)
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


def _numel(shape: Sequence[int]) -> int:
    return math.prod(int(d) for d in shape)


class MetaFusedNorms:
    """The fused norm kernels' allocations on meta tensors (`vae.norms.meta_fused_norms`): one output like the input,
    in its memory format, where the PyTorch path makes an fp32 copy, the normalised tensor and its cast."""

    def group_norm_silu(self, x: torch.Tensor, num_groups: int, weight, bias, eps: float, silu: bool) -> torch.Tensor:
        return torch.empty_like(x)

    def rms_norm_silu(self, x: torch.Tensor, gamma, bias, silu: bool, eps: float,
                      out: Optional[torch.Tensor] = None) -> torch.Tensor:
        return torch.empty_like(x) if out is None else out


@contextmanager
def meta_pass_for(device_type: str, fused_norms: bool = False) -> Iterator[None]:
    """What a meta pass predicting a pass on `device_type` runs under: the fused norms' allocations where they run,
    and wherever code picks its path by the device, that device's path (vae/memory/meta_device.py: attention's fused
    kernel; on the CPU the in-place channels-last GroupNorm, the 1×1-conv GEMM, the reused weight-packing
    buffer), so the paths predicted are the paths that will run."""
    with norms.meta_fused_norms(MetaFusedNorms() if fused_norms else None), predicting_for(device_type):
        yield


@dataclass(frozen=True)
class PassPaths:
    """The paths a pass runs that change its memory: the model's `FastPaths` (channels-last among them) and
    whether norms run as fused GPU kernels."""

    fast: FastPaths
    fused_norms: bool = False
    device_type: str = "cpu"  # whose kernels run the pass (what vae/memory/op_rules.py models inside ops)

    @classmethod
    def of(cls, model: VAEModel, device: Union[str, torch.device], dtype: torch.dtype) -> "PassPaths":
        """What a pass of `model` on `device` in `dtype` runs: its fast paths as trusted there (channels-last
        only after its self-check), fused norms where the kernels are installed and not switched off."""
        device = torch.device(device)
        fused = False
        if self_checks.applies_to(device) and self_checks.enabled("triton_norms", device):
            fused = norms.fused_dispatch() is not None
        return cls(active(model.fast, device, dtype), fused, device.type)

    @classmethod
    def for_device_type(cls, model: VAEModel, device_type: str, dtype: Optional[torch.dtype] = None) -> "PassPaths":
        """The default paths on a device type without asking the device (planning for a GPU from a machine
        without one): channels-last as the model has it, except where the architecture's GPU defaults or, for a
        pass in `dtype` (default the model's), the CPU's fp32 rule (vae/accel/channels_last) drop it; fused norms
        only on CUDA and only where they would run there (Triton installed, the kernels not switched off:
        `vae.norms.fused_norms_possible`)."""
        fused = device_type == "cuda" and fused_norms_possible()
        fast = model.fast
        if fast.channels_last and not (
                channels_last_applies(model.gpu_defaults(), device_type == "cuda", fused)
                and channels_last_keeps_fp32(device_type, dtype or model.dtype)):
            fast = replace(fast, channels_last=False)  # what `VAEModel.active_fast` runs there
        return cls(fast, fused_norms=fused, device_type=device_type)


class MetaPasses:
    """Meta copies of one architecture (per dtype and fast paths), made once and reused, and the predictions
    already made: a prediction runs the copy's pass on meta input, with the model's config and options, so it
    runs the model's code."""

    def __init__(self, model: VAEModel):
        self._model = model
        self._copies: dict[tuple, VAEModel] = {}
        self._predicted: dict[tuple, PeakPrediction] = {}
        self._memo: dict = {}

    def memo(self, key, make):
        """`make()` once per `key` for this model (plain numbers and predictions only: nothing that holds memory);
        the planner keeps its per-shape predictions, FLOP counts and cache sizes here."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    def copy(self, dtype: torch.dtype, fast: FastPaths) -> VAEModel:
        key = (dtype, fast)
        clone = self._copies.get(key)
        if clone is None:
            clone = self._model.meta_copy().to(dtype=dtype)
            clone.fast = fast
            self._copies[key] = clone
        return clone

    def predict(self, shape: Sequence[int], *, decode: bool, dtype: torch.dtype, temporal_slice: Optional[int],
                paths: PassPaths) -> PeakPrediction:
        key = (tuple(int(d) for d in shape), decode, dtype, temporal_slice, paths)
        found = self._predicted.get(key)
        if found is None:
            found = self._predicted[key] = _predict(self.copy(dtype, paths.fast), key[0], decode=decode,
                                                    dtype=dtype, temporal_slice=temporal_slice,
                                                    fused_norms=paths.fused_norms, device_type=paths.device_type)
        return found


def meta_pass_peak(clone: VAEModel, shape: tuple[int, ...], *, decode: bool, dtype: torch.dtype,
                   temporal_slice: Optional[int], fused_norms: bool, device_type: str = "cpu",
                   sample: bool = True) -> int:
    """The most the pass's tensors hold at once when `clone` (a meta copy) runs its untiled pass over `shape` in
    `temporal_slice`s, its output written into one canvas (`run_slices`); `sample`: the first two slices and the
    last (the same peak: every middle slice repeats the second on memory of the same shapes)."""
    x = torch.empty(shape, device="meta", dtype=dtype)
    fmt = clone.latent_format
    tracker = LiveBytes(exclude=[x, *clone.parameters(), *clone.buffers()], op_memory=op_memory_for(device_type))
    bounds = clone.slice_bounds(shape[2], temporal_slice, decode=decode)
    step = clone.decode_step if decode else clone.encode_step
    frames = fmt.pixel_frames(shape[2]) if decode else fmt.latent_frames(shape[2])
    with torch.inference_mode(), meta_pass_for(device_type, fused_norms), tracker:
        out = run_slices(step, x, bounds, {"clamp": True} if decode else {}, out_frames=frames, sample=sample)
    del out
    return tracker.peak


def _predict(clone: VAEModel, shape: tuple[int, ...], *, decode: bool, dtype: torch.dtype,
             temporal_slice: Optional[int], fused_norms: bool, device_type: str = "cpu") -> PeakPrediction:
    esize = torch.empty((), dtype=dtype).element_size()
    peak = meta_pass_peak(clone, shape, decode=decode, dtype=dtype, temporal_slice=temporal_slice,
                          fused_norms=fused_norms, device_type=device_type)
    return PeakPrediction(pass_bytes=int(peak), input_bytes=_numel(shape) * esize,
                          weight_bytes=weight_bytes(clone), temporal_slice=temporal_slice)


def predict_pass(model: VAEModel, shape: Sequence[int], *, decode: bool, dtype: Optional[torch.dtype] = None,
                 temporal_slice: Optional[int] = None, paths: Optional[PassPaths] = None,
                 copies: Optional[MetaPasses] = None) -> PeakPrediction:
    """The peak memory of `model.decode_latents` (latents `shape`) or `model.encode_moments` (pixels `shape`, 1+4n
    frames) in `dtype` (default the model's) with `temporal_slice`, from the same pass on meta tensors.

    `paths` None: what the model would run on its own device (`PassPaths.of`). `copies` reuses meta copies and
    earlier predictions. Costs Python over the ops of at most three slices (no arithmetic, no memory).
    """
    dtype = dtype or model.dtype
    paths = paths or PassPaths.of(model, model.device, dtype)
    return (copies or MetaPasses(model)).predict(shape, decode=decode, dtype=dtype, temporal_slice=temporal_slice,
                                                 paths=paths)
