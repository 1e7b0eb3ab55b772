"""Triton kernels: fused GroupNorm+SiLU (SeedVR2) and RMS-norm+SiLU (Wan / Qwen-Image).

Eager norm(+SiLU) in bf16 reads the activation, writes an fp32 copy, reduces, normalises, casts
back and runs SiLU as separate passes. These kernels read the input twice (statistics, then apply)
and write the output once, accumulating in fp32 whatever the storage dtype.

Layouts: a tensor is handled as (frames, C, P) with one channel stride and one pixel stride, which
covers contiguous NC(T)HW and channels_last / channels_last_3d storage without copies. The output
keeps the input's memory format. Tensors whose spatial dims cannot be flattened into one stride
are not handled here (the caller falls back to the PyTorch reference).

This module imports Triton; import it only through `vae.accel.kernels` (which checks availability). The
kernels are decorated at import time, so `TRITON_INTERPRET=1` must be set before the first import
to run them on CPU tensors (the tests do this).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import triton
import triton.language as tl

from ... import device_guard

# GroupNorm partial statistics: each (frame, group) is split into at most this many chunks of pixels,
# so a single 1080p image (32 groups) still fills the GPU. A power of two (the apply kernel combines
# the partials as one vector).
_GN_MAX_CHUNKS = 64
_GN_BLOCK_ELEMS = 4096  # elements of one group held in registers per loop step
_RMS_BLOCK_ELEMS = 8192  # channels x pixels held in registers per program
RMS_MAX_CHANNELS = 4096


@triton.jit
def _gn_program(T):
    """This GroupNorm program's (group, pixel chunk, frame, groups, batch index, time index)."""
    g = tl.program_id(0)
    chunk = tl.program_id(1)
    frame = tl.program_id(2)
    return g, chunk, frame, tl.num_programs(0), frame // T, frame % T


@triton.jit
def _group_offset(b, t, g, CG, s_b, s_c, s_t):
    """int64 element offset of group g's first channel at (batch b, time t)."""
    return b.to(tl.int64) * s_b + t.to(tl.int64) * s_t + (g * CG).to(tl.int64) * s_c


@triton.jit
def _gn_partial_stats_kernel(
    x_ptr, res_ptr, n_ptr, mean_ptr, m2_ptr,
    T, P, CG, chunk_pixels,
    s_xb, s_xc, s_xt, s_xp,
    HAS_RES: tl.constexpr, NUM_CHUNKS: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_P: tl.constexpr,
):
    """(count, mean, M2) of one pixel chunk of one (frame, group), merged block by block (Chan)."""
    g, chunk, frame, G, b, t = _gn_program(T)
    base = _group_offset(b, t, g, CG, s_xb, s_xc, s_xt)
    offs_c = tl.arange(0, BLOCK_C)
    offs_p = tl.arange(0, BLOCK_P)
    mask_c = offs_c < CG
    p_start = chunk * chunk_pixels
    p_end = tl.minimum(p_start + chunk_pixels, P)

    # Statistics of (x - pivot), pivot = the chunk's first value: sums stay small when the group's
    # mean is large compared with its spread, which is where fp32 sums lose digits.
    pivot_off = base + p_start.to(tl.int64) * s_xp
    pivot = tl.load(x_ptr + pivot_off).to(tl.float32)
    if HAS_RES:
        pivot += tl.load(res_ptr + pivot_off).to(tl.float32)
    cnt = tl.zeros((), dtype=tl.float32)
    mean = tl.zeros((), dtype=tl.float32)
    m2 = tl.zeros((), dtype=tl.float32)
    for p0 in range(p_start, p_end, BLOCK_P):
        p = p0 + offs_p
        mask = mask_c[:, None] & (p < p_end)[None, :]
        off = base + offs_c.to(tl.int64)[:, None] * s_xc + p.to(tl.int64)[None, :] * s_xp
        v = tl.load(x_ptr + off, mask=mask, other=0.0).to(tl.float32)
        if HAS_RES:
            v += tl.load(res_ptr + off, mask=mask, other=0.0).to(tl.float32)
        v = tl.where(mask, v - pivot, 0.0)
        n_blk = tl.sum(mask.to(tl.float32), axis=None)
        mean_blk = tl.sum(v, axis=None) / n_blk
        d = tl.where(mask, v - mean_blk, 0.0)
        m2_blk = tl.sum(d * d, axis=None)
        n_new = cnt + n_blk
        delta = mean_blk - mean
        mean = mean + delta * (n_blk / n_new)
        m2 = m2 + m2_blk + delta * delta * (cnt * n_blk / n_new)
        cnt = n_new

    slot = (frame * G + g) * NUM_CHUNKS + chunk
    tl.store(n_ptr + slot, cnt)
    tl.store(mean_ptr + slot, mean + pivot)
    tl.store(m2_ptr + slot, m2)


@triton.jit
def _gn_apply_kernel(
    x_ptr, res_ptr, w_ptr, b_ptr, out_ptr, sum_ptr, n_ptr, mean_ptr, m2_ptr,
    T, P, CG, chunk_pixels, eps,
    s_xb, s_xc, s_xt, s_xp,
    s_ob, s_oc, s_ot, s_op,
    HAS_RES: tl.constexpr, STORE_SUM: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
    SILU: tl.constexpr, NUM_CHUNKS: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_P: tl.constexpr,
):
    """Merge the group's partial statistics, then normalise, scale/shift and SiLU one pixel chunk."""
    g, chunk, frame, G, b, t = _gn_program(T)

    slots = (frame * G + g) * NUM_CHUNKS + tl.arange(0, NUM_CHUNKS)
    n_i = tl.load(n_ptr + slots)
    mean_i = tl.load(mean_ptr + slots)
    m2_i = tl.load(m2_ptr + slots)
    n = tl.sum(n_i, axis=0)
    mean = tl.sum(n_i * mean_i, axis=0) / n
    d = mean_i - mean
    m2 = tl.sum(m2_i + n_i * d * d, axis=0)
    rstd = 1.0 / tl.sqrt(m2 / n + eps)

    offs_c = tl.arange(0, BLOCK_C)
    offs_p = tl.arange(0, BLOCK_P)
    mask_c = offs_c < CG
    ch = g * CG + offs_c
    if HAS_W:
        scale = tl.load(w_ptr + ch, mask=mask_c, other=0.0).to(tl.float32) * rstd
    else:
        scale = tl.zeros((BLOCK_C,), dtype=tl.float32) + rstd
    if HAS_B:
        shift = tl.load(b_ptr + ch, mask=mask_c, other=0.0).to(tl.float32)
    else:
        shift = tl.zeros((BLOCK_C,), dtype=tl.float32)

    x_base = _group_offset(b, t, g, CG, s_xb, s_xc, s_xt)
    o_base = _group_offset(b, t, g, CG, s_ob, s_oc, s_ot)
    p_start = chunk * chunk_pixels
    p_end = tl.minimum(p_start + chunk_pixels, P)
    for p0 in range(p_start, p_end, BLOCK_P):
        p = p0 + offs_p
        mask = mask_c[:, None] & (p < p_end)[None, :]
        x_off = x_base + offs_c.to(tl.int64)[:, None] * s_xc + p.to(tl.int64)[None, :] * s_xp
        o_off = o_base + offs_c.to(tl.int64)[:, None] * s_oc + p.to(tl.int64)[None, :] * s_op
        v = tl.load(x_ptr + x_off, mask=mask, other=0.0).to(tl.float32)
        if HAS_RES:
            v += tl.load(res_ptr + x_off, mask=mask, other=0.0).to(tl.float32)
            if STORE_SUM:
                tl.store(sum_ptr + o_off, v.to(sum_ptr.dtype.element_ty), mask=mask)
        y = (v - mean) * scale[:, None] + shift[:, None]  # subtract first: x·s − mean·s cancels badly
        if SILU:
            y = y * tl.sigmoid(y)
        tl.store(out_ptr + o_off, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rms_norm_kernel(
    x_ptr, res_ptr, g_ptr, b_ptr, out_ptr, sum_ptr,
    P, C, scale, eps,
    s_xb, s_xc, s_xp,
    s_ob, s_oc, s_op,
    HAS_RES: tl.constexpr, STORE_SUM: tl.constexpr, HAS_B: tl.constexpr, SILU: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_P: tl.constexpr,
):
    """Per-pixel L2 normalisation over all channels of a block of pixels, times sqrt(C)*gamma (+bias)."""
    pid_p = tl.program_id(0)
    bi = tl.program_id(1)
    offs_c = tl.arange(0, BLOCK_C)
    p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    mask_c = offs_c < C
    mask = mask_c[:, None] & (p < P)[None, :]
    x_off = bi.to(tl.int64) * s_xb + offs_c.to(tl.int64)[:, None] * s_xc + p.to(tl.int64)[None, :] * s_xp
    o_off = bi.to(tl.int64) * s_ob + offs_c.to(tl.int64)[:, None] * s_oc + p.to(tl.int64)[None, :] * s_op
    v = tl.load(x_ptr + x_off, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        v += tl.load(res_ptr + x_off, mask=mask, other=0.0).to(tl.float32)
        if STORE_SUM:
            tl.store(sum_ptr + o_off, v.to(sum_ptr.dtype.element_ty), mask=mask)
    norm = tl.sqrt(tl.sum(v * v, axis=0))
    inv = 1.0 / tl.maximum(norm, eps)
    gamma = tl.load(g_ptr + offs_c, mask=mask_c, other=0.0).to(tl.float32) * scale
    y = v * inv[None, :] * gamma[:, None]
    if HAS_B:
        y += tl.load(b_ptr + offs_c, mask=mask_c, other=0.0).to(tl.float32)[:, None]
    if SILU:
        y = y * tl.sigmoid(y)
    tl.store(out_ptr + o_off, y.to(out_ptr.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------------------------------------
# Host side


def _frames_view(x: torch.Tensor) -> Optional[tuple[int, int, int, int, tuple[int, int, int, int]]]:
    """(B, T, C, P, strides (b, c, t, p)) when H and W flatten into one pixel stride, else None."""
    if x.ndim == 4:
        b, c, h, w = x.shape
        t, (sb, sc, sh, sw), st = 1, x.stride(), 0
    elif x.ndim == 5:
        b, c, t, h, w = x.shape
        sb, sc, st, sh, sw = x.stride()
    else:
        return None
    if h > 1 and w > 1 and sh != w * sw:
        return None
    sp = sw if w > 1 else sh
    return b, t, c, h * w, (sb, sc, st, sp)


def _pixels_view(x: torch.Tensor) -> Optional[tuple[int, int, int, tuple[int, int, int]]]:
    """(B, C, P, strides (b, c, p)) when every dim after C flattens into one pixel stride, else None."""
    if x.ndim < 2:
        return None
    b, c = x.shape[:2]
    dims = [(s, st) for s, st in zip(x.shape[2:], x.stride()[2:]) if s != 1]
    p = math.prod(s for s, _ in dims)
    for (_, outer), (size, inner) in zip(dims, dims[1:]):
        if outer != size * inner:
            return None
    sp = dims[-1][1] if dims else 1
    return b, c, p, (x.stride(0), x.stride(1), sp)


def _check_residual(x: torch.Tensor, residual: Optional[torch.Tensor]) -> None:
    if residual is not None and (residual.shape != x.shape or residual.stride() != x.stride()
                                 or residual.dtype != x.dtype or residual.device != x.device):
        raise ValueError("residual must match x in shape, strides, dtype and device "
                         f"(got {tuple(residual.shape)}/{residual.stride()}/{residual.dtype} for "
                         f"{tuple(x.shape)}/{x.stride()}/{x.dtype}); call .contiguous() or match memory formats")


def group_norm_silu(x: torch.Tensor, num_groups: int, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                    eps: float, silu: bool = True, *, residual: Optional[torch.Tensor] = None,
                    return_sum: bool = False):
    """Fused per-frame GroupNorm(+SiLU) of `x` (+ `residual`, added before the norm).

    Returns None for layouts this kernel does not handle. With `return_sum`, returns (norm output,
    x + residual) so a residual stream can be carried without a separate add kernel.
    """
    view = _frames_view(x)
    if view is None or x.shape[1] % num_groups or x.numel() == 0:
        return None
    _check_residual(x, residual)
    bsz, t, c, p, (sb, sc, st, sp) = view
    cg = c // num_groups
    weight = weight.reshape(-1) if weight is not None else None
    bias = bias.reshape(-1) if bias is not None else None
    out = torch.empty_like(x)
    summed = torch.empty_like(x) if (residual is not None and return_sum) else out
    oview = _frames_view(out)
    if oview is None:
        return None
    osb, osc, ost, osp = oview[4]
    block_c = triton.next_power_of_2(cg)
    block_p = max(16, min(1024, triton.next_power_of_2(max(1, _GN_BLOCK_ELEMS // block_c))))
    blocks = triton.cdiv(p, block_p)
    num_chunks = min(_GN_MAX_CHUNKS, triton.next_power_of_2(blocks))
    chunk_pixels = triton.cdiv(blocks, num_chunks) * block_p
    launched = triton.cdiv(p, chunk_pixels)  # chunks that hold pixels; the rest stay zero-count
    frames = bsz * t
    stats = torch.zeros(3, frames * num_groups * num_chunks, device=x.device, dtype=torch.float32)
    grid = (num_groups, launched, frames)
    res = residual if residual is not None else x
    w = weight if weight is not None else x
    bb = bias if bias is not None else x
    with device_guard.on_device(x.device):  # Triton launches on the current device, not x's
        _gn_partial_stats_kernel[grid](
            x, res, stats[0], stats[1], stats[2], t, p, cg, chunk_pixels, sb, sc, st, sp,
            HAS_RES=residual is not None, NUM_CHUNKS=num_chunks, BLOCK_C=block_c, BLOCK_P=block_p)
        _gn_apply_kernel[grid](
            x, res, w, bb, out, summed, stats[0], stats[1], stats[2], t, p, cg, chunk_pixels, float(eps),
            sb, sc, st, sp, osb, osc, ost, osp,
            HAS_RES=residual is not None, STORE_SUM=residual is not None and return_sum,
            HAS_W=weight is not None, HAS_B=bias is not None, SILU=bool(silu), NUM_CHUNKS=num_chunks,
            BLOCK_C=block_c, BLOCK_P=block_p)
    if return_sum:
        return out, (summed if residual is not None else x)
    return out


def rms_norm_silu(x: torch.Tensor, gamma: torch.Tensor, bias: Optional[torch.Tensor] = None, silu: bool = True,
                  eps: float = 1e-12, *, residual: Optional[torch.Tensor] = None, return_sum: bool = False,
                  out: Optional[torch.Tensor] = None):
    """Fused Wan RMS_norm(+SiLU) of `x` (+ `residual`, added before the norm); None if not handled.
    `out`: written instead of a new tensor (x's shape and dtype; any strides the pixel view can address)."""
    view = _pixels_view(x)
    if view is None or x.numel() == 0 or x.shape[1] > RMS_MAX_CHANNELS:
        return None
    _check_residual(x, residual)
    c = x.shape[1]
    if gamma.numel() != c or (bias is not None and bias.numel() != c):
        return None
    bsz, _, p, (sb, sc, sp) = view
    gamma = gamma.reshape(-1)
    bias = bias.reshape(-1) if bias is not None else None
    if out is None:
        out = torch.empty_like(x)
    elif out.shape != x.shape or out.dtype != x.dtype:
        return None
    oview = _pixels_view(out)
    if oview is None:
        return None
    _, _, _, (osb, osc, osp) = oview
    summed = torch.empty_like(x) if (residual is not None and return_sum) else out
    block_c = triton.next_power_of_2(c)
    block_p = max(1, min(64, _RMS_BLOCK_ELEMS // block_c))
    grid = (triton.cdiv(p, block_p), bsz)
    res = residual if residual is not None else x
    with device_guard.on_device(x.device):  # Triton launches on the current device, not x's
        _rms_norm_kernel[grid](
            x, res, gamma, bias if bias is not None else gamma, out, summed, p, c, math.sqrt(c), float(eps),
            sb, sc, sp, osb, osc, osp,
            HAS_RES=residual is not None, STORE_SUM=residual is not None and return_sum,
            HAS_B=bias is not None, SILU=bool(silu), BLOCK_C=block_c, BLOCK_P=block_p)
    if return_sum:
        return out, (summed if residual is not None else x)
    return out
