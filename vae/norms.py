"""Normalisation(+SiLU) ops shared by both architectures.

These are the single dispatch point for fused GPU kernels (vae/accel/kernels): architecture code calls
`group_norm_silu` / `rms_norm_silu` and never picks an implementation itself. The PyTorch versions
here are the exact reference the kernels are tested against: statistics in fp32 whatever the input
dtype, result cast back to the input dtype.
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from typing import Callable, Iterator, Optional, Union

import torch
import torch.nn.functional as F

from .accel import self_checks
from .accel.tensor_layout import memory_format_of
from .autograd import records_grad
from .memory.meta_device import path_device_type
from .memory.oom import is_out_of_memory
from .tracing import tracing

_AUTO = object()  # not resolved yet: vae.accel.kernels.default_dispatch() is asked on the first CUDA call
_FUSED_DISPATCH = _AUTO


def set_fused_dispatch(dispatch) -> None:
    """Install a fused-kernel dispatcher, or None to force the PyTorch reference; see vae/accel/kernels."""
    global _FUSED_DISPATCH
    _FUSED_DISPATCH = dispatch


def reset_fused_dispatch() -> None:
    """Back to automatic selection (resolved again on the next CUDA call)."""
    global _FUSED_DISPATCH
    _FUSED_DISPATCH = _AUTO


def fused_dispatch_forced_off() -> bool:
    """True when `set_fused_dispatch(None)` forced the PyTorch reference (not the automatic choice)."""
    return _FUSED_DISPATCH is None


def fused_dispatch():
    """The active dispatcher (resolving the automatic choice now), or None."""
    global _FUSED_DISPATCH
    if _FUSED_DISPATCH is _AUTO:
        from .accel.kernels import default_dispatch

        _FUSED_DISPATCH = default_dispatch()
    return _FUSED_DISPATCH


@contextmanager
def _module_setting(name: str, value) -> Iterator[None]:
    """This module's global `name` set to `value` inside a block and restored after it: the one mechanism of the
    switches below (each a process-wide choice that the norm functions read)."""
    previous = globals()[name]
    globals()[name] = value
    try:
        yield
    finally:
        globals()[name] = previous


@contextmanager
def fused_norms(enabled: bool) -> Iterator[None]:
    """Force the fused kernels on (if usable) or off inside a block, restoring the previous choice.

    Used by benchmarks to ablate the kernels; normal code relies on the automatic selection.
    """
    from .accel.kernels import default_dispatch

    with _module_setting("_FUSED_DISPATCH", default_dispatch() if enabled else None):
        yield


_META_FUSED = None  # the fused kernels' allocations on meta tensors, inside `meta_fused_norms` only


@contextmanager
def meta_fused_norms(dispatch) -> Iterator[None]:
    """Inside the block, norms of meta tensors go to `dispatch` (same methods as a fused dispatcher): a meta
    pass then allocates what the fused kernels allocate, so vae/planning/meta_pass.py predicts the GPU path's memory."""
    with _module_setting("_META_FUSED", dispatch):
        yield


def fused_norms_possible() -> bool:
    """Whether a CUDA pass planned from here would run the fused norms: Triton importable and the kernels not
    switched off (by the environment, or by `set_fused_dispatch(None)`). Asks no GPU: a plan for a GPU may be made
    on a machine without one."""
    from .accel.kernels import disabled_by_env, triton_available

    return not (disabled_by_env() or not triton_available() or fused_dispatch_forced_off())


def fused_norms_run(device: Union[str, torch.device]) -> bool:
    """Whether the fused Triton norms serve passes on `device`: a GPU path there, selected (installed and not
    forced off) and not switched off by its self-check."""
    return (self_checks.applies_to(device) and self_checks.enabled("triton_norms", device)
            and fused_dispatch() is not None)


def _fused_for(x: torch.Tensor):
    # Under a tracer (torch.compile, torch.export) the reference ops are traced instead: inductor fuses them
    # itself and does not need to see through our kernel launches, and no self-check may run there.
    if not self_checks.applies_to(x.device) or tracing() \
            or not self_checks.enabled("triton_norms", x.device):
        return None
    return fused_dispatch()


def _probe_of(x: torch.Tensor) -> torch.Tensor:
    """A small dense copy of `x` in its memory format (one sample, ≤ 2 frames, ≤ 8×8 px): the self-check input."""
    small = x[(slice(0, 1), slice(None)) + ((slice(0, 2),) if x.ndim == 5 else ()) + (slice(0, 8), slice(0, 8))]
    return small.contiguous(memory_format=memory_format_of(x))


def _run_fused(x: torch.Tensor, key: str, fused, reference):
    """`fused(x)` once the kernels passed their self-check for this call's class `key` (else, or when they
    raise, None: the caller runs the reference); `fused(t)` returns None where the kernel declines `t`.
    An out-of-memory (in the check or the launch) is re-raised with the kernels kept (vae/accel/self_checks)."""
    def fused_probe():
        probe = _probe_of(x)
        out = fused(probe)
        return reference(probe) if out is None else out  # declined: nothing to check

    fmt = memory_format_of(x)
    layout = (f"{str(x.dtype).removeprefix('torch.')} {x.ndim}-D"
              + (" channels-last" if fmt != torch.contiguous_format else ""))
    if not self_checks.check("triton_norms", x.device, f"{key}, {layout}", fused_probe, lambda: reference(_probe_of(x))):
        return None
    try:
        out = fused(x)
    except Exception as exc:  # noqa: BLE001 - a kernel that fails here is switched off; the reference runs
        if is_out_of_memory(exc):  # transient: the kernels are kept, the pass retries by the tiler's rule
            self_checks.out_of_memory("triton_norms", x.device, exc)
            raise
        self_checks.fail("triton_norms", x.device, exc)
        return None
    if out is not None:
        self_checks.used("triton_norms", x.device)
    return out


_NORM_INPUT_OBSERVER: Optional[Callable[[torch.Tensor, int], None]] = None
_GROUP_NORM_TIMER: Optional[Callable[[float], None]] = None


@contextmanager
def observing_norm_inputs(observer: Callable[[torch.Tensor, int], None]) -> Iterator[None]:
    """Inside the block, `observer(x, groups)` sees every input of `group_norm_silu` (its group count) and
    `rms_norm_silu` (1 group: the norm is over all channels) before it is normalised. For measurements of the
    activation statistics a pass really has (bench/fidelity.py); it must not modify `x`."""
    with _module_setting("_NORM_INPUT_OBSERVER", observer):
        yield


@contextmanager
def timing_group_norms(sink: Callable[[float], None]) -> Iterator[None]:
    """Inside the block, `sink(seconds)` gets the wall time of every `group_norm_silu` call (CPU passes: the
    call returns when the work is done). For benchmarks that time the norms inside a real pass, where their
    inputs and caches are what the pass makes them (bench/fidelity.py)."""
    with _module_setting("_GROUP_NORM_TIMER", sink):
        yield


def group_norm_silu(x: torch.Tensor, num_groups: int, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                    eps: float, *, silu: bool = True, inplace: bool = False) -> torch.Tensor:
    """GroupNorm with statistics per frame (over C/G × H × W, never across time), then optional SiLU.

    Accepts [N, C, H, W] or [B, C, T, H, W]. SeedVR2's `causal_norm_wrapper` semantics.
    `inplace`: the caller never reads `x` again, so the result may be written into its storage. Only the CPU
    channels-last path does (its scale-and-shift is ours; writing into memory the process already holds
    spares the page faults of a fresh activation-sized output); every other path returns a new tensor.
    """
    if _GROUP_NORM_TIMER is None or tracing():
        return _group_norm_silu(x, num_groups, weight, bias, eps, silu, inplace)
    start = time.perf_counter()
    out = _group_norm_silu(x, num_groups, weight, bias, eps, silu, inplace)
    _GROUP_NORM_TIMER(time.perf_counter() - start)
    return out


def _group_norm_silu(x: torch.Tensor, num_groups: int, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                     eps: float, silu: bool, inplace: bool) -> torch.Tensor:
    if _NORM_INPUT_OBSERVER is not None:
        _NORM_INPUT_OBSERVER(x, num_groups)
    if _META_FUSED is not None and x.device.type == "meta":
        return _META_FUSED.group_norm_silu(x, num_groups, weight, bias, eps, silu)
    dispatch = None if records_grad(x, weight, bias) else _fused_for(x)  # the kernels have no backward
    if dispatch is not None:
        out = _run_fused(x, f"group_norm_silu C={x.shape[1]} G={num_groups} affine={weight is not None} silu={silu}",
                         lambda t: dispatch.group_norm_silu(t, num_groups, weight, bias, eps, silu),
                         lambda t: group_norm_silu_reference(t, num_groups, weight, bias, eps, silu=silu))
        if out is not None:
            return out
    return group_norm_silu_reference(x, num_groups, weight, bias, eps, silu=silu, inplace=inplace)


def group_norm_silu_reference(x: torch.Tensor, num_groups: int, weight: Optional[torch.Tensor],
                              bias: Optional[torch.Tensor], eps: float, *, silu: bool = True,
                              inplace: bool = False) -> torch.Tensor:
    dtype = x.dtype
    if x.ndim == 5:
        b, c, t, h, w = x.shape
        if t == 1:
            y = _gn2d(x[:, :, 0], num_groups, weight, bias, eps, inplace).unsqueeze(2)
        else:
            x4 = x.transpose(1, 2).reshape(b * t, c, h, w)
            y = _gn2d(x4, num_groups, weight, bias, eps, inplace).view(b, t, c, h, w).transpose(1, 2)
    else:
        y = _gn2d(x, num_groups, weight, bias, eps, inplace)
    if silu:
        y = F.silu(y, inplace=True)
    return y.to(dtype)


def _gn2d(x: torch.Tensor, num_groups: int, weight, bias, eps: float, inplace: bool = False) -> torch.Tensor:
    if x.dtype in (torch.float16, torch.bfloat16):
        w = weight.float() if weight is not None else None
        b = bias.float() if bias is not None else None
        return _gn2d(x.float(), num_groups, w, b, eps, inplace=True).to(x.dtype)  # the fp32 copy is ours
    # path_device_type: a meta pass predicting a CPU pass takes the CPU's path (in place, vae/memory/meta_device.py)
    if _STABLE_CHANNELS_LAST_STATS and path_device_type(x) == "cpu" and _channels_innermost(x) and not tracing():
        if records_grad(x, weight, bias):  # autograd: the contiguous kernel (stable statistics, differentiable)
            return F.group_norm(x.contiguous(), num_groups, weight, bias, eps)
        return group_norm_channels_last(x, num_groups, weight, bias, eps, out=x if inplace else None)
    return F.group_norm(x, num_groups, weight, bias, eps)


_STABLE_CHANNELS_LAST_STATS = True


@contextmanager
def native_channels_last_group_norm() -> Iterator[None]:
    """Inside the block, channels-last CPU GroupNorm runs PyTorch's own kernel (one-pass statistics) instead
    of `group_norm_channels_last`. For benchmarks that time what the stable statistics cost; never for results
    anyone keeps."""
    with _module_setting("_STABLE_CHANNELS_LAST_STATS", False):
        yield


def _channels_innermost(x: torch.Tensor) -> bool:
    """Whether CPU `F.group_norm` would take its channels-last kernel for `x`: any non-contiguous 4-D layout
    with channels innermost (channels-last tensors, and crops or per-frame views of them)."""
    return x.ndim == 4 and x.shape[1] > 1 and x.stride(1) == 1 and not x.is_contiguous()


# Elements of one chunk of squared deviations: the chunk's centred copy is written, squared and summed while it
# is in the core's L2 cache, so the second look at each element costs no memory traffic; large enough that a
# frame takes few chunks (each chunk is three parallel ops, and many small parallel ops stall when other
# processes hold the cores). Chosen by timing 2^17..2^20 at the SeedVR2 decoder's norm shapes.
_STATS_CHUNK_ELEMS = 1 << 19


def group_norm_channels_last(x: torch.Tensor, num_groups: int, weight: Optional[torch.Tensor],
                             bias: Optional[torch.Tensor], eps: float, *,
                             out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """`F.group_norm` of a channels-last [N, C, H, W] CPU tensor with numerically stable statistics; the
    result stays channels-last. `out` (x itself, or a tensor of x's shape and strides) receives the result.

    Why not `F.group_norm`: PyTorch's CPU kernel for channels-last input (aten/src/ATen/native/cpu/
    group_norm_kernel.cpp) sums x and x² per channel in one pass and takes E[x²] - E[x]², which cancels
    catastrophically when a group's mean is large against its spread (a mean of 10 std loses ~3 digits;
    docs/seedvr2.md, "Norm statistics"). The contiguous CPU kernel and CUDA's (which makes the input
    contiguous and uses Welford) do not.

    Here: per-channel means from one `sum` (PyTorch's reduction sums in a cascade, so a mean is good to a few
    ulps of itself), then per-channel sums of squared deviations from those means, chunk by chunk while the
    centred chunk is in cache (nothing cancels: every term is ≥ 0 and the means are accurate), then each group's
    sum of squared deviations is its channels' sums plus the spread of the channel means around the group mean
    (the exact decomposition of a group's variance). x is read from memory about twice, as the native kernel
    reads it, and the result is one per-channel scale-and-shift.
    """
    n, c, h, w = x.shape
    if c % num_groups:
        raise ValueError(f"group_norm: {c} channels are not divisible into {num_groups} groups")
    per_group = c // num_groups
    per_channel = h * w
    channel_means = x.sum(dim=(2, 3)).div_(per_channel)  # [N, C]
    centre = channel_means.view(n, c, 1, 1)
    rows = max(1, min(h, _STATS_CHUNK_ELEMS // max(1, n * c * w)))
    starts = range(0, h, rows)
    sq_devs = x.new_empty((len(starts), n, c))
    centred = None
    arithmetic = x.device.type != "meta"  # a meta pass (vae/planning/meta_pass.py) needs the loop's buffers, not its sums
    for i, r0 in enumerate(starts):
        chunk = x[:, :, r0:r0 + rows] if arithmetic or centred is None or h - r0 < rows else None
        if centred is None or (chunk is not None and centred.shape != chunk.shape):
            centred = torch.empty_like(chunk)
        if not arithmetic:
            continue  # nothing below allocates (results go to `out=` and in place)
        torch.sub(chunk, centre, out=centred)
        centred.mul_(centred)
        torch.sum(centred, dim=(2, 3), out=sq_devs[i])
    del centred
    grouped_means = channel_means.view(n, num_groups, per_group)
    mean = grouped_means.mean(2, keepdim=True)  # [N, G, 1]
    sq_dev = sq_devs.sum(0).view(n, num_groups, per_group).sum(2)
    sq_dev += (grouped_means - mean).square_().sum(2).mul_(per_channel)
    rstd = sq_dev.div_(per_channel * per_group).add_(eps).rsqrt_()  # [N, G]
    scale = rstd.repeat_interleave(per_group, 1)  # [N, C]
    if weight is not None:
        scale = scale * weight
    shift = -mean.view(n, num_groups).repeat_interleave(per_group, 1) * scale
    if bias is not None:
        shift = shift + bias
    return torch.addcmul(shift.view(n, c, 1, 1), x, scale.view(n, c, 1, 1), out=out)


def rms_norm_silu(x: torch.Tensor, gamma: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
                  silu: bool = True, eps: float = 1e-12, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Wan RMS_norm (`F.normalize(x, dim=1) * sqrt(C) * gamma + bias`), then optional SiLU.

    The L2 reduction over channels accumulates in fp32 without materialising an fp32 copy of `x`.
    `out`: a tensor of x's shape and dtype (any strides, e.g. the frames slot of a causal conv's padded input)
    that receives the result, so the caller needs no copy of it; returned.
    """
    if _NORM_INPUT_OBSERVER is not None:
        _NORM_INPUT_OBSERVER(x, 1)
    if out is not None and (out.shape != x.shape or out.dtype != x.dtype or out.device != x.device):
        raise ValueError(f"rms_norm_silu: out is {tuple(out.shape)} {out.dtype} on {out.device}, "
                         f"x is {tuple(x.shape)} {x.dtype} on {x.device}")
    if _META_FUSED is not None and x.device.type == "meta":
        return _META_FUSED.rms_norm_silu(x, gamma, bias, silu, eps, out=out)
    if records_grad(x, gamma, bias, out):  # autograd: an allocating result (out= is not differentiable), then copied
        y = rms_norm_silu_reference(x, gamma, bias, silu=silu, eps=eps)
        return y if out is None else out.copy_(y)
    dispatch = _fused_for(x)
    if dispatch is not None:
        # the self-check's probe (another tensor than x) gets a new output; only x's launch writes into `out`
        y = _run_fused(x, f"rms_norm_silu C={x.shape[1]} bias={bias is not None} silu={silu}",
                       lambda t: dispatch.rms_norm_silu(t, gamma, bias, silu, eps, out=out if t is x else None),
                       lambda t: rms_norm_silu_reference(t, gamma, bias, silu=silu, eps=eps))
        if y is not None:
            return y if out is None or y is out else out.copy_(y)  # a kernel that declined `out` made its own
    return rms_norm_silu_reference(x, gamma, bias, silu=silu, eps=eps, out=out)


def rms_norm_silu_reference(x: torch.Tensor, gamma: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
                            silu: bool = True, eps: float = 1e-12,
                            out: Optional[torch.Tensor] = None) -> torch.Tensor:
    c = x.shape[1]
    acc = torch.promote_types(x.dtype, torch.float32)  # fp32 sums for 16-bit inputs; fp64 stays fp64
    # clamp_min, not clamp_min_: the norm's backward reads its output (a 1/C-sized copy; same values)
    norm = torch.linalg.vector_norm(x, ord=2, dim=1, keepdim=True, dtype=acc).clamp_min(eps)
    if x.dtype == acc:
        y = torch.div(x, norm, out=out) if out is not None else x / norm
        y.mul_(gamma * math.sqrt(c))
    else:
        y32 = (x.float() / norm).mul_(gamma.float() * math.sqrt(c))
        y = out.copy_(y32) if out is not None else y32.to(x.dtype)
        del y32
    if bias is not None:
        y.add_(bias)
    if silu:
        y = F.silu(y, inplace=True)
    return y


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`a @ b` for 2-D fp32 tensors; on CPU computed as a 1×1 conv2d over `a`'s rows (channels-last, no copy of
    `a`): oneDNN's convolution runs these products at about twice the rate of `torch.mm` on the CPUs measured
    (docs/BENCHMARKS.md, SeedVR2 composed upsamplers). Other devices, dtypes, and tracing keep `torch.mm`; meta
    tensors take the path of the device a meta pass predicts (vae/memory/meta_device.py)."""
    if path_device_type(a) != "cpu" or a.dtype != torch.float32 or b.dtype != torch.float32 or tracing():
        return a @ b
    m, k = a.shape
    n = b.shape[1]
    rows = a.contiguous().view(1, m, 1, k).permute(0, 3, 1, 2)  # [1, k, m, 1] over a's row-major storage
    y = F.conv2d(rows, b.t().contiguous().view(n, k, 1, 1))  # [1, n, m, 1], channels-last: row-major [m, n]
    return y.permute(0, 2, 3, 1).reshape(m, n)
