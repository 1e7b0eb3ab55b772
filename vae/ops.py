"""Normalisation(+SiLU) ops shared by both architectures.

These are the single dispatch point for fused GPU kernels (vae/kernels): architecture code calls
`group_norm_silu` / `rms_norm_silu` and never picks an implementation itself. The PyTorch versions
here are the exact reference the kernels are tested against: statistics in fp32 whatever the input
dtype, result cast back to the input dtype.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Iterator, Optional, Union

import torch
import torch.nn.functional as F

from . import fast_paths
from .memory_format import memory_format_of
from .tracing import tracing

_AUTO = object()  # not resolved yet: vae.kernels.default_dispatch() is asked on the first CUDA call
_FUSED_DISPATCH = _AUTO


def set_fused_dispatch(dispatch) -> None:
    """Install a fused-kernel dispatcher, or None to force the PyTorch reference; see vae/kernels."""
    global _FUSED_DISPATCH
    _FUSED_DISPATCH = dispatch


def reset_fused_dispatch() -> None:
    """Back to automatic selection (resolved again on the next CUDA call)."""
    global _FUSED_DISPATCH
    _FUSED_DISPATCH = _AUTO


def fused_dispatch():
    """The active dispatcher (resolving the automatic choice now), or None."""
    global _FUSED_DISPATCH
    if _FUSED_DISPATCH is _AUTO:
        from .kernels import default_dispatch

        _FUSED_DISPATCH = default_dispatch()
    return _FUSED_DISPATCH


@contextmanager
def fused_norms(enabled: bool) -> Iterator[None]:
    """Force the fused kernels on (if usable) or off inside a block, restoring the previous choice.

    Used by benchmarks to ablate the kernels; normal code relies on the automatic selection.
    """
    from .kernels import default_dispatch

    global _FUSED_DISPATCH
    previous = _FUSED_DISPATCH
    _FUSED_DISPATCH = default_dispatch() if enabled else None
    try:
        yield
    finally:
        _FUSED_DISPATCH = previous


def fused_norms_run(device: Union[str, torch.device]) -> bool:
    """Whether the fused Triton norms serve passes on `device`: a GPU path there, selected (installed and not
    forced off) and not switched off by its self-check."""
    return (fast_paths.applies_to(device) and fast_paths.enabled("triton_norms", device)
            and fused_dispatch() is not None)


def _fused_for(x: torch.Tensor):
    # Under torch.compile the reference ops are traced instead: inductor fuses them itself and
    # does not need to see through our kernel launches.
    if not fast_paths.applies_to(x.device) or torch.compiler.is_compiling() \
            or not fast_paths.enabled("triton_norms", x.device):
        return None
    return fused_dispatch()


def _probe_of(x: torch.Tensor) -> torch.Tensor:
    """A small dense copy of `x` in its memory format (one sample, ≤ 2 frames, ≤ 8×8 px): the self-check input."""
    small = x[(slice(0, 1), slice(None)) + ((slice(0, 2),) if x.ndim == 5 else ()) + (slice(0, 8), slice(0, 8))]
    return small.contiguous(memory_format=memory_format_of(x))


def _run_fused(x: torch.Tensor, key: str, fused, reference):
    """`fused(x)` once the kernels passed their self-check for this call's class `key` (else, or when they
    raise, None: the caller runs the reference); `fused(t)` returns None where the kernel declines `t`."""
    def fused_probe():
        probe = _probe_of(x)
        out = fused(probe)
        return reference(probe) if out is None else out  # declined: nothing to check

    fmt = memory_format_of(x)
    layout = (f"{str(x.dtype).removeprefix('torch.')} {x.ndim}-D"
              + (" channels-last" if fmt != torch.contiguous_format else ""))
    if not fast_paths.check("triton_norms", x.device, f"{key}, {layout}", fused_probe, lambda: reference(_probe_of(x))):
        return None
    try:
        out = fused(x)
    except Exception as exc:  # noqa: BLE001 - a kernel that fails here is switched off; the reference runs
        fast_paths.fail("triton_norms", x.device, exc)
        return None
    if out is not None:
        fast_paths.used("triton_norms")
    return out


def group_norm_silu(x: torch.Tensor, num_groups: int, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                    eps: float, *, silu: bool = True) -> torch.Tensor:
    """GroupNorm with statistics per frame (over C/G × H × W, never across time), then optional SiLU.

    Accepts [N, C, H, W] or [B, C, T, H, W]. SeedVR2's `causal_norm_wrapper` semantics.
    """
    dispatch = _fused_for(x)
    if dispatch is not None:
        out = _run_fused(x, f"group_norm_silu C={x.shape[1]} G={num_groups} affine={weight is not None} silu={silu}",
                         lambda t: dispatch.group_norm_silu(t, num_groups, weight, bias, eps, silu),
                         lambda t: group_norm_silu_reference(t, num_groups, weight, bias, eps, silu=silu))
        if out is not None:
            return out
    return group_norm_silu_reference(x, num_groups, weight, bias, eps, silu=silu)


def group_norm_silu_reference(x: torch.Tensor, num_groups: int, weight: Optional[torch.Tensor],
                              bias: Optional[torch.Tensor], eps: float, *, silu: bool = True) -> torch.Tensor:
    dtype = x.dtype
    if x.ndim == 5:
        b, c, t, h, w = x.shape
        if t == 1:
            y = _gn2d(x[:, :, 0], num_groups, weight, bias, eps).unsqueeze(2)
        else:
            x4 = x.transpose(1, 2).reshape(b * t, c, h, w)
            y = _gn2d(x4, num_groups, weight, bias, eps).view(b, t, c, h, w).transpose(1, 2)
    else:
        y = _gn2d(x, num_groups, weight, bias, eps)
    if silu:
        y = F.silu(y, inplace=True)
    return y.to(dtype)


def _gn2d(x: torch.Tensor, num_groups: int, weight, bias, eps: float) -> torch.Tensor:
    if x.dtype in (torch.float16, torch.bfloat16):
        w = weight.float() if weight is not None else None
        b = bias.float() if bias is not None else None
        return F.group_norm(x.float(), num_groups, w, b, eps).to(x.dtype)
    return F.group_norm(x, num_groups, weight, bias, eps)


def rms_norm_silu(x: torch.Tensor, gamma: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
                  silu: bool = True, eps: float = 1e-12) -> torch.Tensor:
    """Wan RMS_norm (`F.normalize(x, dim=1) * sqrt(C) * gamma + bias`), then optional SiLU.

    The L2 reduction over channels accumulates in fp32 without materialising an fp32 copy of `x`.
    """
    dispatch = _fused_for(x)
    if dispatch is not None:
        out = _run_fused(x, f"rms_norm_silu C={x.shape[1]} bias={bias is not None} silu={silu}",
                         lambda t: dispatch.rms_norm_silu(t, gamma, bias, silu, eps),
                         lambda t: rms_norm_silu_reference(t, gamma, bias, silu=silu, eps=eps))
        if out is not None:
            return out
    return rms_norm_silu_reference(x, gamma, bias, silu=silu, eps=eps)


def rms_norm_silu_reference(x: torch.Tensor, gamma: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
                            silu: bool = True, eps: float = 1e-12) -> torch.Tensor:
    c = x.shape[1]
    norm = torch.linalg.vector_norm(x, ord=2, dim=1, keepdim=True, dtype=torch.float32).clamp_min_(eps)
    if x.dtype == torch.float32:
        y = x / norm
        y.mul_(gamma * math.sqrt(c))
    else:
        y = (x.float() / norm).mul_(gamma.float() * math.sqrt(c)).to(x.dtype)
    if bias is not None:
        y.add_(bias)
    if silu:
        y = F.silu(y, inplace=True)
    return y


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`a @ b` for 2-D fp32 tensors; on CPU computed as a 1×1 conv2d over `a`'s rows (channels-last, no copy of
    `a`): oneDNN's convolution runs these products at about twice the rate of `torch.mm` on the CPUs measured
    (docs/BENCHMARKS.md, SeedVR2 composed upsamplers). Other devices, dtypes, and tracing keep `torch.mm`."""
    if a.device.type != "cpu" or a.dtype != torch.float32 or b.dtype != torch.float32 or tracing():
        return a @ b
    m, k = a.shape
    n = b.shape[1]
    rows = a.contiguous().view(1, m, 1, k).permute(0, 3, 1, 2)  # [1, k, m, 1] over a's row-major storage
    y = F.conv2d(rows, b.t().contiguous().view(n, k, 1, 1))  # [1, n, m, 1], channels-last: row-major [m, n]
    return y.permute(0, 2, 3, 1).reshape(m, n)
