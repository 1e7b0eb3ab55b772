"""The peak a plan will need: the executor (vae/planning/execute.py) run on meta tensors, its storages counted.

A meta pass allocates nothing and computes nothing, but every op makes its outputs with their real sizes and
layouts and frees them when the last reference goes, as the real pass would (vae/memory/peak.py `LiveBytes`); what
the real kernels allocate inside ops is added per device type (vae/memory/op_rules.py), attention runs as its fused
kernel (vae/attention.py), the fused norms as the one output they make and the CPU's device-specific paths as the
CPU takes them (vae/planning/meta_pass.py `meta_pass_for`). Host-held tensors are counted apart.
The run is sampled where its steps repeat (`run_plan(..., sample=True)`): the first two temporal steps and the
last, one tile of each shape, one core of the largest size — into canvases of the full size, so the peak is that
of the whole pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional

import torch

from ..base import VAEModel
from ..memory.meta_ops import UncompiledMode, run_op
from ..memory.op_rules import op_memory_for
from ..memory.peak import LiveBytes, PeakPrediction, weight_bytes
from .execute import run_plan
from .meta_pass import MetaPasses, PassPaths, meta_pass_for
from .plan import PassPlan


def predict_plan(copies: MetaPasses, plan: PassPlan, paths: PassPaths) -> PeakPrediction:
    """The device peak (and host-held bytes) of `plan` run with `paths`, from a sampled meta run of its executor;
    remembered per plan (its budget and estimates aside) in `copies`."""
    key = ("plan", replace(plan, predicted=None, budget_bytes=None, cost_s=None, requested="auto"), paths)
    return copies.memo(key, lambda: _predict_plan(copies, plan, paths))


def _predict_plan(copies: MetaPasses, plan: PassPlan, paths: PassPaths) -> PeakPrediction:
    clone = copies.copy(plan.dtype, paths.fast)
    x = torch.empty(plan.shape, device="meta", dtype=plan.dtype)
    tracker = LiveBytes(exclude=[x, *clone.parameters(), *clone.buffers()], op_memory=op_memory_for(plan.device_type))
    with torch.inference_mode(), meta_pass_for(plan.device_type, paths.fused_norms), tracker:
        out = run_plan(clone, x, plan, sample=True, meta_tracker=tracker)
    del out
    esize = torch.empty((), dtype=plan.dtype).element_size()
    return PeakPrediction(pass_bytes=int(tracker.peak), input_bytes=math.prod(plan.shape) * esize,
                          weight_bytes=weight_bytes(clone), temporal_slice=plan.temporal_slice,
                          host_bytes=int(tracker.host_peak))


@dataclass(frozen=True)
class PassWork:
    """What an untiled pass computes and moves, counted on meta tensors; the cost model (vae/planning/cost.py) scales
    it per plan. `flops`: 2 × multiply-adds of every convolution, matrix product and attention; `io_bytes`: the bytes
    of every convolution's input and output (what a pass whose activations live in host memory moves between host
    and device, about once each way)."""

    flops: float
    io_bytes: float = 0.0

    def __add__(self, other: "PassWork") -> "PassWork":
        return PassWork(self.flops + other.flops, self.io_bytes + other.io_bytes)

    def __sub__(self, other: "PassWork") -> "PassWork":
        return PassWork(self.flops - other.flops, self.io_bytes - other.io_bytes)

    def __mul__(self, k: float) -> "PassWork":
        return PassWork(self.flops * k, self.io_bytes * k)


def pass_work(model: VAEModel, shape: tuple[int, ...], *, decode: bool, dtype: torch.dtype,
              copies: Optional[MetaPasses] = None) -> PassWork:
    """The work of the untiled pass over `shape` (one latent per step after the first), counted on meta tensors."""
    return step_work(model, shape, decode=decode, dtype=dtype, copies=copies)[-1]


def step_work(model: VAEModel, shape: tuple[int, ...], *, decode: bool, dtype: torch.dtype,
              copies: Optional[MetaPasses] = None) -> list[PassWork]:
    """The work done by the end of each step of the untiled pass over `shape` (one latent per step after the
    first): cumulative, one entry per step, counted in one meta pass."""
    copies = copies or MetaPasses(model)
    clone = copies.copy(dtype, model.fast)
    counter = WorkCounter()
    x = torch.empty(shape, device="meta", dtype=dtype)
    done: list[PassWork] = []

    def snapshot(_i: int, _n: int) -> None:
        done.append(PassWork(counter.flops, counter.io_bytes))

    # the CPU's paths, and the norms (not counted) as the fused kernels' one-output stand-in: their reference
    # arithmetic on meta tensors is most of this pass's time
    with torch.inference_mode(), meta_pass_for("cpu", fused_norms=True), counter:
        if decode:
            clone.decode_slices(x, temporal_slice=1, progress=snapshot)
        else:
            clone.encode_slices(x, temporal_slice=1, progress=snapshot)
    return done or [PassWork(counter.flops, counter.io_bytes)]


def conv_flops(model: VAEModel, shape: tuple[int, ...], *, decode: bool, dtype: torch.dtype,
               copies: Optional[MetaPasses] = None) -> float:
    """Multiply-adds × 2 of every convolution, matrix product and attention of the untiled pass over `shape` (one
    latent per step after the first), counted on meta tensors: what the cost model scales."""
    return pass_work(model, shape, decode=decode, dtype=dtype, copies=copies).flops


_aten = torch.ops.aten
_CONVS = {_aten.convolution.default, _aten.conv1d.default, _aten.conv2d.default, _aten.conv3d.default,
          _aten.conv1d.padding, _aten.conv2d.padding, _aten.conv3d.padding}
_MATMULS = {_aten.mm.default: (0, 1), _aten.bmm.default: (0, 1), _aten.addmm.default: (1, 2),
            _aten.baddbmm.default: (1, 2)}
_ATTENTIONS = {getattr(_aten, name).default for name in (
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_attention_math", "scaled_dot_product_attention") if hasattr(_aten, name)}


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class WorkCounter(UncompiledMode):
    """2 × multiply-adds of convolutions, linear layers, matrix products and attention (the pass's arithmetic; the
    rest moves bytes), and the bytes convolutions read and write. Under inference mode the dispatcher hands a mode
    `conv2d`, `conv3d` and `linear` themselves rather than their decompositions, so each is counted by name."""

    def __init__(self):
        super().__init__()
        self.flops = 0.0
        self.io_bytes = 0.0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = run_op(func, args, kwargs or {})
        if func in _CONVS:
            w = args[1]  # [out, in / groups, *kernel]: each output element reads in/groups × kernel inputs
            self.flops += 2.0 * out.numel() * math.prod(w.shape[1:])
            self.io_bytes += _nbytes(args[0]) + _nbytes(out)
        elif func is _aten.linear.default:
            self.flops += 2.0 * out.numel() * args[1].shape[-1]
        elif func in _MATMULS:
            a = args[_MATMULS[func][0]]
            self.flops += 2.0 * out.numel() * a.shape[-1]
        elif func in _ATTENTIONS:
            q, k = args[0], args[1]
            self.flops += 4.0 * q.shape[:-2].numel() * q.shape[-2] * k.shape[-2] * q.shape[-1]
        return out
