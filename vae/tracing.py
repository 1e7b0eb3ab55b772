"""Whether the code runs under a tracer, where tensors are fake and have no storage to reuse or release."""

from __future__ import annotations

import torch


def tracing() -> bool:
    """True under torch.compile / torch.export / jit tracing, where tensors are fake (no storage to reuse)."""
    compiler = getattr(torch, "compiler", None)
    if compiler is not None:
        if compiler.is_compiling():
            return True
        is_exporting = getattr(compiler, "is_exporting", None)
        if is_exporting is not None and is_exporting():
            return True
    return torch.jit.is_tracing()
