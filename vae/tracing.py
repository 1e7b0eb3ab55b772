"""Whether the code runs under a tracer, where tensors are fake and have no storage to reuse or release."""

from __future__ import annotations

import torch


def _fake_mode_active() -> bool:
    """True inside a FakeTensorMode (export's and Inductor's shape propagation run the code there)."""
    get_mode = getattr(torch._C, "_get_dispatch_mode", None)
    key = getattr(getattr(torch._C, "_TorchDispatchModeKey", None), "FAKE", None)
    return get_mode is not None and key is not None and get_mode(key) is not None


def tracing() -> bool:
    """True under torch.compile / torch.export / jit tracing / an active FakeTensorMode, where tensors are
    fake (no storage to reuse, no values to check)."""
    compiler = getattr(torch, "compiler", None)
    if compiler is not None:
        if compiler.is_compiling():
            return True
        is_exporting = getattr(compiler, "is_exporting", None)
        if is_exporting is not None and is_exporting():
            return True
    return torch.jit.is_tracing() or _fake_mode_active()
