"""What real kernels allocate that their meta kernels do not show, per device type (`LiveBytes.op_memory`).

Why: a pass's peak is predicted by running its code on meta tensors (vae/planning/meta_pass.py), which sees every
tensor an op returns but nothing an op allocates inside itself, and lays outputs out as the meta kernel says,
which is not always what the real kernel returns. Both change the allocator's peak. Each rule here is read off a
measurement, named where it is used:

- CUDA (docs/results/2026-11-27-h200-memory-probe.json, one H200, torch 2.11, cuDNN 9.19): a half-precision
  conv3d on contiguous tensors holds a transposed copy of its input and of its output while it runs
  (extra = input + output); channels-last convs hold nothing measurable; scaled-dot-product attention holds twice
  its output.
- CPU (one AMD EPYC with AVX-512, torch 2.13, fp32; vae/memory/allocator.py's profiler allocation events of single
  ops and whole passes, tests/test_prediction_accuracy.py): convolutions by the kernel PyTorch picks for the
  call's shapes (vae/memory/cpu_conv.py: im2col columns and plain copies for its own kernels; oneDNN's blocked
  reorders, and channels-last outputs where the meta kernel says contiguous); `aten.group_norm` on an input not
  dense in its suggested layout holds a copy of it (a frame-major view of a contiguous clip, [5, 16, 256, 256]:
  20.0 MiB, the input's size). Paths the CPU takes by device rather than by op (the in-place channels-last
  GroupNorm, the 1×1-conv GEMM, the reused weight-packing buffer) are taken by the meta pass itself
  (vae/memory/meta_device.py), not modelled here.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch._prims_common import suggest_memory_format

from . import cpu_conv as cpu_conv_memory

aten = torch.ops.aten

# under inference mode a dispatch mode sees `conv3d` / `conv2d` themselves, outside it their `convolution`
_CONVS = {aten.convolution.default, aten.conv3d.default, aten.conv2d.default, aten.conv3d.padding,
          aten.conv2d.padding}
_ATTENTION = {aten._scaled_dot_product_efficient_attention.default,
              aten._scaled_dot_product_flash_attention.default,
              aten._scaled_dot_product_cudnn_attention.default}


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _first_tensor(out) -> Optional[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    return None


class CudaOpMemory:
    """The CUDA kernels' memory inside ops (module docstring: the measurement)."""

    def applies(self, func) -> bool:
        return func in _CONVS or func in _ATTENTION

    def real_output(self, func, args: tuple, kwargs: dict, out):
        return out

    def transient_bytes(self, func, args: tuple, kwargs: dict, out) -> int:
        if func in _CONVS:
            x, y = args[0], _first_tensor(out)
            if x.dtype in (torch.float16, torch.bfloat16) and x.ndim == 5 and y is not None \
                    and not x.is_contiguous(memory_format=torch.channels_last_3d):
                return _nbytes(x) + _nbytes(y)
            return 0
        if func in _ATTENTION:
            y = _first_tensor(out)
            return 2 * _nbytes(y) if y is not None else 0
        return 0


class CpuOpMemory:
    """The CPU kernels' memory inside ops and their output layouts (module docstring: the rules)."""

    def applies(self, func) -> bool:
        return cpu_conv_memory.is_conv(func) or func == aten.group_norm.default

    def real_output(self, func, args: tuple, kwargs: dict, out):
        conv = cpu_conv_memory.conv_params(func, args, kwargs)
        if conv is not None and isinstance(out, torch.Tensor):
            return cpu_conv_memory.real_output(conv, out)
        return out

    def transient_bytes(self, func, args: tuple, kwargs: dict, out) -> int:
        conv = cpu_conv_memory.conv_params(func, args, kwargs)
        if conv is not None and isinstance(out, torch.Tensor):
            return cpu_conv_memory.transient_bytes(conv, out)
        if func == aten.group_norm.default:
            x = args[0]
            return 0 if x.is_contiguous(memory_format=suggest_memory_format(x)) else _nbytes(x)
        return 0


def op_memory_for(device_type: str):
    """The model of `device_type`'s kernels (None where nothing is known: the count of op outputs alone)."""
    if device_type == "cuda":
        return CudaOpMemory()
    if device_type == "cpu":
        return CpuOpMemory()
    return None
