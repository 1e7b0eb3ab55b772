"""The device type a meta pass stands for, for the code that takes a device-specific path.

Why: a pass's peak is predicted by running its code on meta tensors (vae/planning/meta_pass.py), but some code picks its
path by the device its tensors are on: the CPU's flash attention or CUDA's (vae/attention.py), the CPU's
channels-last GroupNorm written into its input and its GEMM as a 1×1 conv (vae/norms.py), the CPU's reused
weight-packing buffer or a fresh tensor per conv (vae/accel/weight_layout.py). On meta tensors that question has
no answer of its own, so the prediction says which device it predicts for and such code asks
`path_device_type`, which is the tensor's own device type on every real tensor. Outside a prediction, meta
tensors take the CPU's paths.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator

import torch

_PREDICTED: ContextVar[str] = ContextVar("turbovae_meta_device_type", default="cpu")


@contextmanager
def predicting_for(device_type: str) -> Iterator[None]:
    """Within the block, meta tensors take `device_type`'s paths."""
    token = _PREDICTED.set(device_type)
    try:
        yield
    finally:
        _PREDICTED.reset(token)


def path_device_type(t: torch.Tensor) -> str:
    """The device type whose path code takes for `t`: its own, or for a meta tensor the one predicted for."""
    return _PREDICTED.get() if t.device.type == "meta" else t.device.type
