"""Layer-wise exact tiling for SeedVR2 (the `exact` tiling mode).

Every GroupNorm in SeedVR2 takes statistics over a whole frame, so no spatial tile of the network is
independent. Instead the forward pass runs layer by layer on whole-frame tensors, and each layer's
*working memory* is bounded by a tile:
- GroupNorm statistics are reduced over the frame in row chunks (sums in fp64: the "all-reduce"),
  and the normalisation + SiLU is applied to each conv's halo'd input crop, so the normalised
  activation is never materialised;
- each causal conv computes its output tile by tile from a crop with a one-pixel halo (zero padding
  only at true frame borders), so the padded-input buffer is tile-sized;
- each upsampler's 1×1 conv and sub-pixel shuffle run per tile;
- mid-block attention runs on the whole frame at latent resolution.
The causal cache handed between temporal slices has exactly the layout of the normal path.

The same decomposition splits a frame across devices (vae/parallel, `SplitPolicy.shard`): statistics
become an all-reduce of the fp64 (sum, sum of squares), the conv crops read halo rows exchanged with the
neighbouring bands, and mid-block attention gathers the latent-resolution frame.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Protocol, Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn
from ..accel.kernels.conv_guard import conv3d as guarded_conv3d
from ..exact_tiling import partition

# `pre(crop, t0)` normalises a crop whose first frame is frame `t0` of the tensor the statistics came from.
Pre = Optional[Callable[[torch.Tensor, int], torch.Tensor]]


class RowShard(Protocol):
    """This device's band of rows of every activation when a frame is split across devices
    (vae/parallel/bands.py implements it): tensors hold only the band's rows (full width)."""

    def rows(self, x: torch.Tensor) -> tuple[int, int, int]:
        """(first row, end row, frame height) of `x`'s band at `x`'s resolution (read off its width)."""

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor: ...

    def halo(self, x: torch.Tensor, top: int, bottom: int) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
        """The `top` rows above the band (upper neighbour's last rows) and `bottom` rows below; None at frame borders."""

    def gather_rows(self, x: torch.Tensor) -> torch.Tensor:
        """The whole frame assembled from every band (for whole-frame attention at latent resolution)."""


@dataclass(frozen=True)
class SplitPolicy:
    """Bound on one tile's working tensors, in elements (channels × frames × pixels).

    `shard`: set when the frame is split across devices: statistics are all-reduced, conv inputs get
    their halo rows from the neighbouring bands, and attention gathers the latent-resolution frame.
    """

    budget_elems: int
    shard: Optional[RowShard] = None

    def tile_side(self, channels: int, frames: int) -> int:
        return max(8, math.isqrt(max(1, self.budget_elems // max(1, channels * frames))))


# ------------------------------------------------------------------------------------------------
# GroupNorm with whole-frame statistics
# ------------------------------------------------------------------------------------------------
def frame_group_stats(x: torch.Tensor, groups: int, eps: float, policy: SplitPolicy) -> tuple[torch.Tensor, torch.Tensor]:
    """Per (batch, group, frame) mean and 1/std of x [B, C, T, H, W], reduced in row chunks (fp64 sums)."""
    b, c, t, h, w = x.shape
    rows = max(1, policy.budget_elems // max(1, c * t * w))
    s1 = torch.zeros(b, groups, t, dtype=torch.float64, device=x.device)
    s2 = torch.zeros_like(s1)
    for r0 in representative(range(0, h, rows), x):
        chunk = x[:, :, :, r0:r0 + rows].to(torch.float64).view(b, groups, c // groups, t, -1, w)
        s1 += chunk.sum(dim=(2, 4, 5))
        s2 += chunk.square().sum(dim=(2, 4, 5))
        del chunk
    if policy.shard is not None:  # sums over every band's rows: one all-reduce of (sum, sum of squares)
        s1, s2 = policy.shard.all_reduce_sum(torch.stack([s1, s2])).unbind(0)
        h = policy.shard.rows(x)[2]
    n = (c // groups) * h * w
    mean = s1 / n
    var = (s2 / n - mean.square()).clamp_min_(0)
    return mean.float(), torch.rsqrt(var.float() + eps)


def norm_silu_pre(norm: nn.GroupNorm, x: torch.Tensor, policy: SplitPolicy) -> Callable[[torch.Tensor, int], torch.Tensor]:
    """A function normalising (+ SiLU) any crop of `x` (frames `t0`… of it) with `x`'s whole-frame statistics."""
    mean, rstd = frame_group_stats(x, norm.num_groups, norm.eps, policy)
    g = norm.num_groups
    weight = norm.weight.float() if norm.weight is not None else None
    bias = norm.bias.float() if norm.bias is not None else None

    def apply(crop: torch.Tensor, t0: int = 0) -> torch.Tensor:
        b, c, t, h, w = crop.shape
        m = mean[:, :, None, t0:t0 + t, None, None]
        r = rstd[:, :, None, t0:t0 + t, None, None]
        y = (crop.float().view(b, g, c // g, t, h, w) - m).mul_(r).view(b, c, t, h, w)
        if weight is not None:
            y.mul_(weight.view(1, c, 1, 1, 1))
        if bias is not None:
            y.add_(bias.view(1, c, 1, 1, 1))
        return F.silu(y, inplace=True).to(crop.dtype)

    return apply


# ------------------------------------------------------------------------------------------------
# Causal conv, tile by tile
# ------------------------------------------------------------------------------------------------
def _row_pieces(parts: Sequence[torch.Tensor], a: int, b: int, cols: slice) -> list[torch.Tensor]:
    """Views of rows [a, b) (counted from the first piece's first row) × `cols` of the pieces stacked by rows
    (a band and its halo rows are kept apart: joining them would copy the band)."""
    pieces, off = [], 0
    for p in parts:
        n = p.shape[-2]
        lo, hi = max(a, off), min(b, off + n)
        if lo < hi:
            pieces.append(p[..., lo - off:hi - off, cols])
        off += n
    return pieces


def _crop_padded(x: Union[torch.Tensor, Sequence[torch.Tensor]], rows: tuple[int, int], cols: tuple[int, int],
                 pre: Pre, row0: int = 0, frame_rows: Optional[int] = None) -> torch.Tensor:
    """Frame rows `rows` × cols `cols` with out-of-frame rows/cols as zeros (after `pre`, like conv zero
    padding). `x` holds the frame's rows from `row0` on: one tensor, or pieces stacked by rows (a band
    between its halo rows); the frame has `frame_rows` rows (default: x's).

    Memory: one crop-sized result plus, with `pre`, one piece-sized temporary (what normalising and then
    padding a single crop needs), however many pieces the crop spans."""
    parts = (x,) if isinstance(x, torch.Tensor) else tuple(x)
    h, w = sum(p.shape[-2] for p in parts), parts[0].shape[-1]
    frame_rows = row0 + h if frame_rows is None else frame_rows
    (a, b), (c, d) = rows, cols
    a0, b0 = max(0, a), min(frame_rows, b)
    if a0 < row0 or b0 > row0 + h:
        raise RuntimeError(f"rows {a0}..{b0} are outside the band's rows {row0}..{row0 + h} (halo too small)")
    pieces = _row_pieces(parts, a0 - row0, b0 - row0, slice(max(0, c), min(w, d)))
    left, top = max(0, -c), a0 - a
    pads = (left, max(0, d - w), top, b - b0)
    if len(pieces) == 1:
        crop = pre(pieces[0], 0) if pre is not None else pieces[0]
        return F.pad(crop, pads) if any(pads) else crop
    first = pieces[0]
    buf = first.new_zeros(*first.shape[:-2], b - a, d - c)
    width = first.shape[-1]
    for p in pieces:
        n = p.shape[-2]
        buf[..., top:top + n, left:left + width] = pre(p, 0) if pre is not None else p
        top += n
    return buf


def representative(starts: Sequence[int], x: torch.Tensor) -> Sequence[int]:
    """A loop's chunk starts, or on meta tensors (a predicted pass) only its first and last chunk: the chunks before
    the last are of one size, each frees its temporaries before the next, and what they write goes into buffers
    made before the loop, so the peak is the same (a meta op costs Python time; a 1080p frame has thousands)."""
    starts = list(starts)
    if x.device.type != "meta" or len(starts) <= 2:
        return starts
    return [starts[0], starts[-1]]


class RepresentativeTiles:
    """On meta tensors (a predicted pass, vae/memory/peak.py), tiles of a shape already run are skipped: a tile's
    temporaries are freed before the next tile and its output goes into a buffer made before the loop, so tiles of
    one shape and border position allocate alike, and the peak is the same with one of each (a 1080p frame has
    hundreds of tiles per layer; a meta op costs Python time). Real tensors run every tile."""

    def __init__(self, x: torch.Tensor, rows: int, cols: int):
        self._seen: Optional[set] = set() if x.device.type == "meta" else None
        self._rows, self._cols = rows, cols

    def skip(self, r0: int, r1: int, c0: int, c1: int) -> bool:
        if self._seen is None:
            return False
        key = (r1 - r0, c1 - c0, r0 == 0, r1 == self._rows, c0 == 0, c1 == self._cols)
        if key in self._seen:
            return True
        self._seen.add(key)
        return False


Residual = Optional[Callable[[slice, slice], torch.Tensor]]


def causal_conv(conv, x: torch.Tensor, ctx, policy: SplitPolicy, pre: Pre = None, residual: Residual = None,
                out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """`conv(pre(x), ctx) (+ residual)` for a SeedVR2 `CausalConv3d`, computed in output tiles; same memory in/out.

    `residual(rows, cols)` gives the tile of a tensor to add; `out` receives the result (it may be the
    storage the residual reads from: each tile reads its own region once, before writing it).
    """
    kt, kh, kw = conv.kernel_size
    st, sh, sw = conv.stride
    ph, pw = conv.padding[1:]
    e = 1 if conv.pad_right_bottom else 0
    b, _, t, h, w = x.shape
    h_out = (h + e + 2 * ph - kh) // sh + 1
    src: tuple[torch.Tensor, ...] = (x,)
    row0, frame_rows, out_row0 = 0, h, 0
    if policy.shard is not None:  # x is a band: the neighbours' halo rows around it, the band's output rows
        src, row0, frame_rows, out_row0, h_out = _with_halo(policy.shard, x, kh, sh, ph, e)
    image = ctx.image(x) and conv.head_frames == kt - 1
    # the history as it is held (host memory under a host placement), and on the device for this conv's tiles: one
    # copy of the whole held tensor (dense, so it moves at the link's speed; crops of it would be staged on the host)
    prev = None if image or not conv.cache_frames else ctx.take(fetch=False)
    prev_here = ctx.fetch_held(prev) if prev is not None else None
    head = 0 if image else (prev.shape[2] if prev is not None else conv.head_frames)
    t_out = 1 if image else (head + t - kt) // st + 1
    w_out = (w + e + 2 * pw - kw) // sw + 1
    shape = (b, conv.out_channels, t_out, h_out, w_out)
    if out is None:
        out = torch.empty(shape, dtype=x.dtype, device=x.device)
    elif tuple(out.shape) != shape:
        raise ValueError(f"output buffer {tuple(out.shape)} does not match the conv output {shape}")
    side = policy.tile_side(max(conv.in_channels, conv.out_channels), head + t)
    # Tiles and bands run in the contiguous layout, whatever the parameters' layout: its kernels sum in the same
    # order at every crop size, so a frame split across tiles or devices matches the whole frame (≤ 1e-5).
    # The contiguous weight is made for this layer's call and freed after it.
    weight2d = conv.folded_weight().contiguous() if image else None
    weight = None if image else conv.weight.contiguous()
    shapes = RepresentativeTiles(x, h_out, w_out)
    for oy0, oy1 in partition(h_out, side):
        for ox0, ox1 in partition(w_out, side):
            if shapes.skip(oy0, oy1, ox0, ox1):
                continue
            rows = ((out_row0 + oy0) * sh - ph, (out_row0 + oy1 - 1) * sh - ph + kh)
            cols = (ox0 * sw - pw, (ox1 - 1) * sw - pw + kw)
            xin = _crop_padded(src, rows, cols, pre, row0, frame_rows)
            if image:
                y = F.conv2d(xin[:, :, 0], weight2d, conv.bias, (sh, sw)).unsqueeze(2)
                if residual is not None:
                    y += residual(slice(oy0, oy1), slice(ox0, ox1))
                out[:, :, :, oy0:oy1, ox0:ox1] = y
                continue
            if prev is not None:
                hist = _crop_padded(prev_here, rows, cols, None, row0, frame_rows)
            elif head:
                hist = xin[:, :, :1].expand(-1, -1, head, -1, -1)
            else:
                hist = None
            buf = torch.cat([hist, xin], dim=2) if hist is not None else xin
            y = guarded_conv3d(buf, weight, conv.bias, conv.stride)
            if residual is not None:
                y += residual(slice(oy0, oy1), slice(ox0, ox1))
            out[:, :, :, oy0:oy1, ox0:ox1] = y
            del xin, buf, y
    if conv.cache_frames and ctx.collect:
        history = [prev_here]  # handed over, so _memory can free the device copy before it makes the new frames
        del prev_here
        ctx.put(_memory(conv, src, history, pre, image, e, ctx, policy), conv, held=True)
    return out


def _with_halo(shard: RowShard, x: torch.Tensor, kh: int, sh: int, ph: int,
               e: int) -> tuple[tuple[torch.Tensor, ...], int, int, int, int]:
    """A band with the halo rows its conv outputs read: (the pieces halo above, band, halo below — kept
    apart, so no band-sized copy is made —, the first piece's frame row, frame rows, first output row,
    output rows). Band borders sit on multiples of every stride, so an output band [lo/sh, hi/sh) reads
    input rows lo - ph … hi - sh - ph + kh: the same halo for every band (zero padding only at the true
    frame border, which `_crop_padded` adds)."""
    lo, hi, frame = shard.rows(x)
    frame_out = (frame + e + 2 * ph - kh) // sh + 1
    out_lo = lo // sh
    out_hi = frame_out if hi == frame else hi // sh
    above, below = shard.halo(x, ph, max(0, kh - ph - sh))
    parts = tuple(p for p in (above, x, below) if p is not None)
    return parts, lo - (above.shape[-2] if above is not None else 0), frame, out_lo, out_hi - out_lo


def _memory(conv, src: Sequence[torch.Tensor], history: list, pre: Pre, image: bool,
            e: int, ctx, policy: SplitPolicy) -> torch.Tensor:
    """The conv's next causal cache: the last `cache_frames` frames of its (normalised, right/bottom padded)
    input, whose rows are the pieces `src` (a band between its halo rows, or one tensor). Made where the pass keeps
    its memory (`ctx.new_held`: on the device, or in host memory) a band of rows at a time, so only a band is
    normalised at once (a whole 1080p frame normalised in fp32 is 2 GB per 256 channels). `history` holds the
    history on the device (or None), which a slice shorter than the memory reaches back into; its frames are
    written first and the device copy freed before the new frames are made (a 1080p SeedVR2 history is a GB).

    Host memory is only ever written, from the device (`ctx.placement.write`), never read here: on CUDA those
    writes are asynchronous, so a read of held memory by the CPU could see it before they land (the first GPU run
    caught a host-to-host copy of the older frames doing so: 16.8 dB)."""
    mf = conv.cache_frames
    first = src[0]
    b, c, t = first.shape[:3]
    t0 = max(0, t - mf)
    new = 1 if image else t - t0  # frames of this input the memory keeps (an image: its one frame, repeated)
    older = mf - new
    h, w = sum(p.shape[-2] for p in src), first.shape[-1]
    shape = (b, c, mf, h + e, w + e)
    held = ctx.new_held(shape, first.dtype, first.device, frame_major=True)
    on_host = ctx.placement is not None and ctx.placement.on_host
    prev_here = history.pop()
    if older and prev_here is not None:  # the frames before: the history's last ones
        if on_host:
            ctx.placement.write(held[:, :, :older], prev_here[:, :, -older:])
        else:
            held[:, :, :older].copy_(prev_here[:, :, -older:])
    first_slice = prev_here is None
    del prev_here  # (a pending asynchronous write keeps its source: the allocator orders reuse on the stream)
    # the new frames are made on the device (a band at a time) and go to host memory in one dense copy
    fresh = frame_major_empty((b, c, new, h + e, w + e), first.dtype, first.device) if on_host else \
        held[:, :, older:]
    if e:
        fresh[..., h:, :].zero_()
        fresh[..., :h, w:].zero_()
    rows = max(1, policy.budget_elems // max(1, c * new * w))
    for r0 in representative(range(0, h, rows), first):
        pieces = _row_pieces(src, r0, min(h, r0 + rows), slice(None))
        band = torch.cat([p[:, :, t0:] for p in pieces], dim=-2) if len(pieces) > 1 else pieces[0][:, :, t0:]
        band = pre(band, t0) if pre is not None else band
        fresh[:, :, :, r0:r0 + band.shape[-2], :w].copy_(band[:, :, -1:] if image else band)
        del band
    if older and first_slice:  # first slice: the history is the first kept frame repeated
        before = fresh[:, :, :1].expand(-1, -1, older, -1, -1)
        if on_host:
            ctx.placement.write(held[:, :, :older], before)
        else:
            held[:, :, :older].copy_(before)
    if on_host:
        ctx.placement.write(held[:, :, older:], fresh)  # frame-major on both sides: one dense copy
    return held


def frame_major_empty(shape: Sequence[int], dtype: torch.dtype, device) -> torch.Tensor:
    """An empty [B, C, T, H, W] tensor stored frame by frame (each frame's [C, H, W] one dense block): a run of
    frames is then one dense range, copied between host and device in one piece."""
    b, c, t, h, w = shape
    return torch.empty((b, t, c, h, w), dtype=dtype, device=device).permute(0, 2, 1, 3, 4)


# ------------------------------------------------------------------------------------------------
# Blocks
# ------------------------------------------------------------------------------------------------
def norm_silu_conv(norm: nn.GroupNorm, conv, x: torch.Tensor, ctx, policy: SplitPolicy,
                   residual: Residual = None, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    out = causal_conv(conv, x, ctx, policy, pre=norm_silu_pre(norm, x, policy), residual=residual, out=out)
    if ctx.tick is not None:
        ctx.tick()
    return out


def resnet(block, x: torch.Tensor, ctx, policy: SplitPolicy) -> torch.Tensor:
    """ResnetBlock3D with the second conv's output and the skip added tile by tile.

    The skip (identity, or the 1×1×1 shortcut of the same tile) never exists as a whole tensor, and with
    matching channels under inference mode the result is written into `x`'s own storage (each tile reads
    its skip before writing it; nothing else reads `x` after the first conv): two whole-frame
    activations alive instead of three.
    """
    h = norm_silu_conv(block.norm1, block.conv1, x, ctx, policy)
    sc = block.conv_shortcut
    if sc is None:
        def skip(rows, cols):
            return x[:, :, :, rows, cols]
    else:
        def skip(rows, cols):
            return guarded_conv3d(x[:, :, :, rows, cols], sc.weight, sc.bias)
    out = x if sc is None and ctx.inplace else None
    return norm_silu_conv(block.norm2, block.conv2, h, ctx, policy, residual=skip, out=out)


def normalised_convs(part: nn.Module) -> int:
    """How many GroupNorm→conv pairs one step of `part` (encoder or decoder) runs: the progress total."""
    return sum(2 for m in part.modules() if type(m).__name__ == "ResnetBlock3D") + 1


def upscale(up, x: torch.Tensor, ctx, policy: SplitPolicy) -> torch.Tensor:
    """Upsample3D's 1×1 conv + sub-pixel shuffle, tile by tile (both are pixel-local)."""
    b, c, f, h, w = x.shape
    first = up.upscale(x[..., :1, :1], ctx)  # shape probe on one pixel: frames and channels of the result
    out = torch.empty(b, first.shape[1], first.shape[2], 2 * h, 2 * w, dtype=x.dtype, device=x.device)
    side = policy.tile_side(c * 4 * up.zr, f)
    shapes = RepresentativeTiles(x, h, w)
    for r0, r1 in partition(h, side):
        for c0, c1 in partition(w, side):
            if not shapes.skip(r0, r1, c0, c1):
                out[..., 2 * r0:2 * r1, 2 * c0:2 * c1] = up.upscale(x[..., r0:r1, c0:c1], ctx)
    return out
