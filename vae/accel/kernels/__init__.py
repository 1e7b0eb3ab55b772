"""Fused GPU kernels for the norm(+SiLU) ops, and the conv3d regression guard.

`vae.norms` resolves its fused dispatcher lazily, on the first CUDA tensor it sees, by calling
`default_dispatch()` here; nothing is installed at `import turbovae` time and no torch function is
patched. On CPU, without Triton, or with `TURBOVAE_FUSED_KERNELS=0`, the ops keep their exact
PyTorch reference path.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from typing import Optional

import torch

log = logging.getLogger("turbovae")

ENV_DISABLE = "TURBOVAE_FUSED_KERNELS"


def triton_available() -> bool:
    """True when the `triton` package can be imported (it is not imported here)."""
    return importlib.util.find_spec("triton") is not None


class TritonNormDispatch:
    """What `vae.norms.set_fused_dispatch` expects: returns a tensor, or None to use the reference."""

    name = "triton"

    def __init__(self) -> None:
        from . import triton_norms  # imports Triton

        self._k = triton_norms

    def group_norm_silu(self, x: torch.Tensor, num_groups: int, weight, bias, eps: float, silu: bool):
        if not _kernel_dtype(x) or torch.is_grad_enabled() and _needs_grad(x, weight, bias):
            return None
        return self._k.group_norm_silu(x, num_groups, weight, bias, eps, silu)

    def rms_norm_silu(self, x: torch.Tensor, gamma, bias, silu: bool, eps: float,
                      out: Optional[torch.Tensor] = None):
        if not _kernel_dtype(x) or torch.is_grad_enabled() and _needs_grad(x, gamma, bias):
            return None
        return self._k.rms_norm_silu(x, gamma, bias, silu, eps, out=out)


def _kernel_dtype(x: torch.Tensor) -> bool:
    return x.dtype in (torch.float32, torch.float16, torch.bfloat16)


def _needs_grad(*tensors) -> bool:
    # The kernels have no backward; training (or anything needing grads) keeps the autograd path.
    return any(t is not None and t.requires_grad for t in tensors)


def disabled_by_env() -> bool:
    """True when `TURBOVAE_FUSED_KERNELS` switches the fused kernels off."""
    return os.environ.get(ENV_DISABLE, "1").strip().lower() in ("0", "false", "no", "off")


def default_dispatch() -> Optional[TritonNormDispatch]:
    """The dispatcher `vae.norms` installs on first CUDA use: Triton kernels if usable, else None."""
    if disabled_by_env():
        log.info("turbovae: fused norm kernels disabled by %s", ENV_DISABLE)
        return None
    if not torch.cuda.is_available() or not triton_available():
        return None
    try:
        dispatch = TritonNormDispatch()
    except Exception as exc:  # a broken Triton install must not break decoding
        log.warning("turbovae: Triton present but unusable (%s); using PyTorch norms", exc)
        return None
    log.info("turbovae: fused Triton GroupNorm/RMS-norm+SiLU kernels enabled")
    return dispatch
