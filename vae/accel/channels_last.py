"""Whether channels-last activations may be used on a device: their self-check (vae/accel/self_checks).

Both architectures can run their convolutions on channels-last (NHWC / NDHWC) activations, a different set
of convolution kernels from the contiguous layout. On a GPU that set has never run for us, so before a pass
first uses it on a (device, dtype), a conv3d and a conv2d of a VAE's shape class run on a small probe in both
layouts and must agree; if they do not (or raise), channels-last is switched off for the device and passes run
contiguous. On the CPU channels-last is plain PyTorch and is not checked. Under a tracer (an engine export,
torch.compile) the probe does not run: the trace uses the decision already made on the device, contiguous
while there is none (vae/accel/self_checks); engine builds decide first, eagerly (`settle_for_trace`).

fp32 on the CPU runs contiguous (`channels_last_keeps_fp32`): oneDNN takes NHWC/NDHWC fp32 convolutions with its
brgemm kernels, which round several times worse per conv than the blocked direct kernels that contiguous input
gets, and over a whole SeedVR2 or Wan decode on real statistics that put the default well past the plain path's
error, where every fast path is held to twice it (docs/seedvr2.md, "Channels-last on the CPU", has the
measurements). The kernels are oneDNN's choice for the layout, so the layout is what changes.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Iterator, Union

import torch
import torch.nn.functional as F

from . import self_checks
from .kernels import conv_guard
from ..precision import exact_fp32

PROBE_CHANNELS = 32  # a VAE conv's class: 3x3(x3), stride 1, padding 1, a few dozen channels


def layout_probe(device: Union[str, torch.device], dtype: torch.dtype, channels_last: bool) -> tuple:
    """(conv3d, conv2d) outputs on seeded probe tensors in one layout; the conv3d goes through the same
    guarded call the architectures use."""
    g = torch.Generator().manual_seed(0)
    c = PROBE_CHANNELS
    x3, w3 = torch.randn(1, c, 3, 12, 12, generator=g), torch.randn(c, c, 3, 3, 3, generator=g) / math.sqrt(27 * c)
    x2, w2 = torch.randn(1, c, 12, 12, generator=g), torch.randn(c, c, 3, 3, generator=g) / math.sqrt(9 * c)
    bias = torch.randn(c, generator=g)
    x3, w3, x2, w2, bias = (t.to(device=device, dtype=dtype) for t in (x3, w3, x2, w2, bias))
    if channels_last:
        x3, w3 = (t.contiguous(memory_format=torch.channels_last_3d) for t in (x3, w3))
        x2, w2 = (t.contiguous(memory_format=torch.channels_last) for t in (x2, w2))
    # In IEEE fp32 (vae/precision.py): with torch's default TF32 cuDNN convs the two layouts' kernels round
    # differently, which says nothing about whether the layout computes the right conv (the fp32 bar is IEEE's).
    with exact_fp32():
        return conv_guard.conv3d(x3, w3, bias, 1, 1), F.conv2d(x2, w2, bias, 1, 1)


def channels_last_trusted(device: Union[str, torch.device], dtype: torch.dtype) -> bool:
    """True where channels-last may run: off the GPU, or on a device where it passed (or skipped) its check."""
    if not self_checks.applies_to(device):
        return True
    if not self_checks.check("channels_last", device, f"{str(dtype).removeprefix('torch.')} conv2d/conv3d 3x3",
                            lambda: layout_probe(device, dtype, True), lambda: layout_probe(device, dtype, False)):
        return False
    self_checks.used("channels_last", device)
    return True


def settle_for_trace(device: Union[str, torch.device], dtype: torch.dtype) -> bool:
    """Run the channels-last self-check for (device, dtype) now, eagerly, so that a trace that follows
    (torch.export of an engine) sees a decision instead of an undecided check; returns whether it may run."""
    return channels_last_trusted(device, dtype)


_CPU_FP32 = False  # `channels_last_in_cpu_fp32` sets it


def channels_last_keeps_fp32(device: Union[str, torch.device], dtype: torch.dtype) -> bool:
    """False for fp32 passes on the CPU (module docstring: its channels-last convolutions lose accuracy), except
    inside `channels_last_in_cpu_fp32` or where the CPU stands in for a GPU (`self_checks.gpu_paths_on_cpu`,
    whose tests drive the GPU's channels-last checks on CPU tensors). Half precision on the CPU keeps
    channels-last: its bar is not fp32's, and oneDNN accumulates its products in fp32 either way."""
    if torch.device(device).type != "cpu" or dtype != torch.float32:
        return True
    return _CPU_FP32 or self_checks.applies_to(device)


@contextmanager
def channels_last_in_cpu_fp32() -> Iterator[None]:
    """Inside the block, fp32 passes on the CPU run channels-last anyway: for the tests of the channels-last
    machinery (the CPU is where they run) and the fidelity bench, which measures what running contiguous saves.
    Never for passes whose results are used."""
    global _CPU_FP32
    previous, _CPU_FP32 = _CPU_FP32, True
    try:
        yield
    finally:
        _CPU_FP32 = previous
