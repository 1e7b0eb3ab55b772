"""Peak memory of a pass, known before it runs: the pass itself on meta tensors, its storages counted
(vae/memory/peak.py `LiveBytes`).

Why: a clip decode that runs out of memory does so after minutes of sampling, and a hand formula per model
(what the passes used before, and ComfyUI core uses) is off by large factors on some shapes. Running the real
model's own code on a meta copy means every architecture, direction, dtype, temporal slice and fast path is
predicted by the code that will run, not by a model of it: `PassPaths` (the paths a pass will run), `MetaPasses`
(meta copies of one model, made once, and the predictions already made), `predict_pass`. The planner, the parallel
passes and the public API all predict through here.

What it does not see: memory inside one op (convolution workspaces, allocator rounding and fragmentation) and
kernels that only exist on a GPU (fused Triton norms, compiled regions, CUDA graph pools): the meta pass takes
the PyTorch path of those ops. docs/memory.md states the error against measured CPU and GPU peaks.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Iterator, Optional, Sequence, Union

import torch

from .. import norms
from ..base import VAEModel, run_slices
from ..accel.switches import FastPaths, active
from ..accel import self_checks
from ..accel.channels_last import channels_last_keeps_fp32
from ..memory.cpu_conv import kernel_choice
from ..memory.meta_device import predicting_for
from ..memory.op_rules import op_memory_for
from ..memory.peak import LiveBytes, PeakPrediction, weight_bytes
from ..norms import fused_norms_possible
from ..gpu_defaults import channels_last_applies


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
        the planner keeps its per-shape predictions, FLOP counts and cache sizes here. Kept apart per CPU kernel
        choice (`cpu_conv.kernel_choice`), which changes what a CPU pass allocates."""
        key = (kernel_choice(), key)
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
        key = (tuple(int(d) for d in shape), decode, dtype, temporal_slice, paths, kernel_choice())
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
