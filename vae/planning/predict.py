"""The peak a plan will need: the executor (vae/planning/execute.py) run on meta tensors, its storages counted.

A meta pass allocates nothing and computes nothing, but every op makes its outputs with their real sizes and
layouts and frees them when the last reference goes, as the real pass would (vae/memory/peak.py `LiveBytes`); what
the real kernels allocate inside ops is added per device type (vae/memory/op_rules.py), attention runs as its fused
kernel (vae/attention.py), the fused norms as the one output they make and the CPU's device-specific paths as the
CPU takes them (vae/memory/peak.py `meta_pass_for`). Host-held tensors are counted apart.
The run is sampled where its steps repeat (`run_plan(..., sample=True)`): the first two temporal steps and the
last, one tile of each shape, one core of the largest size — into canvases of the full size, so the peak is that
of the whole pass.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Optional

import torch

from ..base import VAEModel
from ..memory.meta_device import predicting_for
from ..memory.op_rules import op_memory_for
from ..memory.peak import LiveBytes, MetaPasses, PassPaths, PeakPrediction, meta_pass_for, weight_bytes
from .execute import run_plan
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


def conv_flops(model: VAEModel, shape: tuple[int, ...], *, decode: bool, dtype: torch.dtype,
               copies: Optional[MetaPasses] = None) -> float:
    """Multiply-adds × 2 of every convolution and matrix product of the untiled pass over `shape` (one latent per
    step after the first), counted on meta tensors: what the cost model scales."""
    copies = copies or MetaPasses(model)
    clone = copies.copy(dtype, model.fast)
    counter = _FlopCounter()
    x = torch.empty(shape, device="meta", dtype=dtype)
    with torch.inference_mode(), predicting_for("cpu"), counter:
        if decode:
            clone.decode_latents(x, temporal_slice=1)
        else:
            clone.encode_moments(x, temporal_slice=1)
    return counter.flops


class _FlopCounter(torch.utils._python_dispatch.TorchDispatchMode):
    """2 × multiply-adds of convolutions and matrix products (the pass's arithmetic; the rest moves bytes)."""

    def __init__(self):
        super().__init__()
        self.flops = 0.0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        aten = torch.ops.aten
        if func is aten.convolution.default:
            w = args[1]  # [out, in / groups, *kernel]: each output element reads in/groups × kernel inputs
            self.flops += 2.0 * out.numel() * math.prod(w.shape[1:])
        elif func in (aten.mm.default, aten.bmm.default, aten.addmm.default):
            a, b = (args[1], args[2]) if func is aten.addmm.default else (args[0], args[1])
            self.flops += 2.0 * out.numel() * a.shape[-1]
        elif func in (aten._scaled_dot_product_flash_attention_for_cpu.default,):
            q, k = args[0], args[1]
            self.flops += 4.0 * q.shape[:-2].numel() * q.shape[-2] * k.shape[-2] * q.shape[-1]
        return out
