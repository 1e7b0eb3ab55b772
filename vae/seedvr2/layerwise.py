"""Layer-wise exact tiling for SeedVR2 (the `exact` tiling mode): the untiled pass's result, with the device memory of
every layer bounded by a band of rows.

Every GroupNorm in SeedVR2 takes statistics over a whole frame, so no spatial tile of the network is independent:
between two norms the whole frame must exist somewhere. This pass runs the model's own forward layer by layer, each
layer over **bands of rows** (full width, as many rows as the policy's element budget allows), and keeps the
whole-frame activations between layers where the policy says (`SplitPolicy.frames`):
- on the device (the default): a layer's working memory is band-sized, the activations frame-sized;
- in host memory (a *streamed* pass): the device holds only bands. Every activation lives in host memory stored
  frame by frame with channels innermost, so a band of rows of a frame is one dense block; a layer fetches the rows
  of each band it reads (with the halo its conv needs), computes on the device and writes its output band back.
  Device memory is then bounded by the band (the tile) whatever the frame, which is what lets a 4K or 16 MP
  frame run on a small card. docs/seedvr2.md says what it costs.

Per layer:
- GroupNorm statistics: each conv records, band by band, per-channel sums of its output (fp32 moments of the band
  merged in fp64; `FrameStats`), so the norm after it never reads the frame again; a tensor without recorded
  statistics is read once in row chunks. Normalisation + SiLU is applied to each conv's halo'd input band, so the
  normalised activation is never materialised;
- each causal conv computes its output band from one buffer holding the band's history frames (the causal cache's
  rows, or frame 0 repeated), the normalised rows with one halo row each side (zeros only at true frame borders)
  and zero columns; its next causal cache is written from that buffer, band by band;
- each upsampler's 1×1 conv and sub-pixel shuffle run on the low-resolution rows its conv's band reads
  (`UpscaledRows`): the upsampled tensor never exists whole;
- mid-block attention: keys and values of the whole frame (latent resolution) are made band by band, then each
  band of queries attends to them (all at once where they fit the band budget, else in chunks merged with an
  online softmax).
The causal cache handed between temporal slices has the normal path's shapes.

The same decomposition splits a frame across devices (vae/parallel, `SplitPolicy.shard`): statistics become an
all-reduce of the fp64 sums, the conv bands read halo rows exchanged with the neighbouring bands, and mid-block
attention gathers the latent-resolution frame.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional, Protocol, Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from ..accel.kernels.conv_guard import conv3d as guarded_conv3d
from ..tiling.exact import partition, partition_bound, partition_count
from ..memory.placement import Placement

Tensor = torch.Tensor
# `pre(rows, t0, out)` normalises rows whose first frame is frame `t0` of the tensor the statistics came from, into
# `out` when given (else a new tensor)
Pre = Optional[Callable[..., Tensor]]
# `residual(r0, r1)`: rows [r0, r1) (of the conv's output rows) of a tensor to add to the conv's output
Residual = Optional[Callable[[int, int], Tensor]]
Finish = Optional[Callable[[Tensor], Tensor]]


class RowShard(Protocol):
    """This device's band of rows of every activation when a frame is split across devices
    (vae/parallel/bands.py implements it): tensors hold only the band's rows (full width)."""

    def rows(self, x: Tensor) -> tuple[int, int, int]:
        """(first row, end row, frame height) of `x`'s band at `x`'s resolution (read off its width)."""

    def all_reduce_sum(self, t: Tensor) -> Tensor: ...

    def halo(self, x: Tensor, top: int, bottom: int) -> tuple[Optional[Tensor], Optional[Tensor]]:
        """The `top` rows above the band (upper neighbour's last rows) and `bottom` rows below; None at frame borders."""

    def gather_rows(self, x: Tensor) -> Tensor:
        """The whole frame assembled from every band (for whole-frame attention at latent resolution)."""


# ------------------------------------------------------------------------------------------------
# Statistics recorded as the activations are written
# ------------------------------------------------------------------------------------------------
class FrameStats:
    """Per-channel, per-frame sums (Σx, Σx², in fp64) of the whole-frame activations a layer-wise pass writes, so the
    GroupNorm after a conv has its statistics without reading the frame again (a streamed pass would read it back
    from host memory). Keyed by storage: a view of some frames of a recorded tensor (a frame stage's chunk) finds
    them; a tensor written in place (a residual block's output over its input) is recorded anew."""

    def __init__(self):
        self._by_storage = WeakIdKeyDictionary()

    def record(self, x: Tensor, sums: Tensor) -> None:
        """`sums` [2, B, C, T] (fp64) of `x` [B, C, T, H, W] over its rows and columns."""
        self._by_storage[x.untyped_storage()] = (x.storage_offset(), tuple(x.shape), x.stride(), sums)

    def lookup(self, x: Tensor) -> Optional[Tensor]:
        """The recorded sums [2, B, C, T] of `x`, or of the frames of a recorded tensor `x` views; else None."""
        entry = self._by_storage.get(x.untyped_storage())
        if entry is None:
            return None
        offset, shape, stride, sums = entry
        if x.stride() != stride or tuple(x.shape[:2]) != shape[:2] or tuple(x.shape[3:]) != shape[3:]:
            return None
        step = stride[2]
        shift = x.storage_offset() - offset
        if step == 0 or shift % step:
            return None
        t0 = shift // step
        if t0 < 0 or t0 + x.shape[2] > shape[2]:
            return None
        return sums[:, :, :, t0:t0 + x.shape[2]]


def _meta(t: Tensor) -> bool:
    """Whether `t` is a meta tensor: a predicted pass (vae/planning/predict.py), which counts what ops allocate and
    so may skip what allocates nothing (fills, copies, in-place arithmetic) and stand in for what allocates only
    small tensors — each meta op costs Python time, and a pass has hundreds of bands."""
    return t.device.type == "meta"


def band_sums(y: Tensor) -> Tensor:
    """[2, B, C, T] fp64 (Σy, Σy²) of a band over its rows and columns, reduced in fp64 without a widened copy of the
    band (the reductions upcast element by element): exact enough that the variance taken from them keeps fp32's
    precision where a channel's mean is many times its spread."""
    if _meta(y):  # a prediction: the sums' own (small) memory, without the reductions' meta ops
        return torch.empty((2, *y.shape[:3]), dtype=torch.float64, device=y.device)
    dims = (-2, -1)
    s1 = y.sum(dim=dims, dtype=torch.float64)
    s2 = torch.linalg.vector_norm(y, 2, dim=dims, dtype=torch.float64).square_()
    return torch.stack([s1, s2])


@dataclass(frozen=True)
class SplitPolicy:
    """How a layer-wise pass splits its layers: `budget_elems` bounds one band's working tensors, in elements
    (channels × frames × rows × width); `frames` is where the whole-frame activations between layers live (None:
    on the device; a host `Placement`: a streamed pass, the device holding only bands); `shard` is set when the
    frame is split across devices (statistics all-reduced, conv inputs getting their halo rows from the
    neighbouring bands, attention gathering the latent-resolution frame). `stats` holds the statistics recorded in
    the pass (one policy per pass)."""

    budget_elems: int
    shard: Optional[RowShard] = None
    frames: Optional[Placement] = None
    stats: FrameStats = field(default_factory=FrameStats, compare=False, repr=False)
    _held: WeakIdKeyDictionary = field(default_factory=WeakIdKeyDictionary, compare=False, repr=False)

    @property
    def streamed(self) -> bool:
        """Whole-frame activations in host memory: every layer fetches and writes bands."""
        return self.frames is not None and self.frames.on_host

    @property
    def memory_format(self) -> torch.memory_format:
        """The bands' layout: a streamed pass's is its host frames' (channels innermost, so a band of rows is one
        dense copy); on the device the contiguous layout, whose kernels sum in the same order at every band size
        (a frame split across bands or devices stays within 1e-5 of the whole frame)."""
        return torch.channels_last_3d if self.streamed else torch.contiguous_format

    def band_rows(self, channels: int, frames: int, width: int) -> int:
        """Rows of one band of a tensor with these channels, frames and columns."""
        return max(1, self.budget_elems // max(1, channels * frames * width))

    def new_frame(self, shape: Sequence[int], dtype: torch.dtype, device: torch.device, *,
                  channels_last: bool = False) -> Tensor:
        """An empty whole-frame activation [B, C, T, H, W] where this pass keeps them: on `device` (channels innermost
        with `channels_last`), or in host memory stored frame by frame with channels innermost."""
        b, c, t, h, w = shape
        if not self.streamed:
            if channels_last:
                return torch.empty((b, t, h, w, c), dtype=dtype, device=device).permute(0, 4, 1, 2, 3)
            return torch.empty(tuple(shape), dtype=dtype, device=device)
        x = self.frames.held_empty((b, t, h, w, c), dtype).permute(0, 4, 1, 2, 3)
        self._held[x.untyped_storage()] = True
        return x

    def holds(self, x: Tensor) -> bool:
        """Whether `x` is (a view of) a frame this streamed pass keeps in host memory."""
        return self.streamed and x.untyped_storage() in self._held


# ------------------------------------------------------------------------------------------------
# Rows of a whole-frame activation, where the pass computes
# ------------------------------------------------------------------------------------------------
def fetch_rows(placement: Optional[Placement], view: Tensor, device: torch.device) -> Tensor:
    """A held `view` [B, C, T, r, W] where the pass computes: itself on the device or where host memory is the
    device's (the CPU); else one copy made frame by frame (each frame's rows are one dense block of a frame-major
    channels-last host tensor, so each is a single transfer)."""
    if placement is None or not placement.on_host or not placement.fetch_copies:
        return view if placement is None else placement.fetch(view)
    b, _c, t = view.shape[:3]
    if b == 1 and t == 1:
        return placement.fetch(view)
    out = torch.empty(view.shape, dtype=view.dtype, device=device, memory_format=torch.channels_last_3d)
    if _meta(out):  # a prediction: each transfer stages a copy of one frame's rows, freed before the next
        torch.empty((view.shape[1], *view.shape[3:]), dtype=view.dtype, device=device)
        return out
    for i in range(b):
        for j in range(t):
            out[i, :, j].copy_(placement.fetch(view[i, :, j]))
    return out


def store_rows(placement: Optional[Placement], dst: Tensor, src: Tensor) -> None:
    """Write the device band `src` into `dst` (a view of a held tensor, or a device tensor): one copy where host memory
    is the device's; to host memory beside a GPU frame by frame in matching layouts (one transfer per frame)."""
    if placement is None or not placement.on_host:
        if not _meta(dst):  # a copy allocates nothing: a prediction skips it
            dst.copy_(src)
        return
    if not placement.fetch_copies:
        placement.write(dst, src)
        return
    if src.dim() == 5 and not src.is_contiguous(memory_format=torch.channels_last_3d):
        src = src.contiguous(memory_format=torch.channels_last_3d)
    if _meta(src):  # writes to host memory allocate nothing on the device
        return
    for i in range(dst.shape[0]):
        for j in representative(range(dst.shape[2]), src):
            placement.write(dst[i, :, j], src[i, :, j])


class Rows:
    """A whole-frame activation [B, C, T, H, W] as a conv reads it: runs of frame rows brought where the pass
    computes. `row0`, `rows`: the frame rows it holds (a band of a split frame holds its halo rows too);
    `own`: (first, end) rows this device computes from it; `frame_rows`: the frame's height."""

    shape: tuple[int, ...]
    row0: int
    frame_rows: int
    own: tuple[int, int]
    device: torch.device
    dtype: torch.dtype

    @property
    def rows(self) -> int:
        return self.shape[3]

    def read(self, a: int, b: int) -> Tensor:
        """Frame rows [a, b) (inside the rows held) where the pass computes."""
        raise NotImplementedError


class TensorRows(Rows):
    """Rows of a tensor — on the device, or held by `placement` (fetched per read) — or of a band between its halo
    pieces (kept apart: joining them would copy the band)."""

    def __init__(self, parts: Sequence[Tensor], row0: int, frame_rows: int, own: tuple[int, int],
                 placement: Optional[Placement] = None, device: Optional[torch.device] = None):
        self.parts = tuple(parts)
        first = self.parts[0]
        self.shape = (*first.shape[:3], sum(p.shape[-2] for p in self.parts), first.shape[-1])
        self.row0, self.frame_rows, self.own = row0, frame_rows, own
        self.placement = placement if placement is not None and placement.on_host else None
        self.device = device if device is not None else first.device
        self.dtype = first.dtype

    def read(self, a: int, b: int) -> Tensor:
        if a < self.row0 or b > self.row0 + self.rows:
            raise RuntimeError(f"rows {a}..{b} are outside the rows {self.row0}..{self.row0 + self.rows} held "
                               "(halo too small)")
        pieces = _row_pieces(self.parts, a - self.row0, b - self.row0)
        if self.placement is not None:
            pieces = [fetch_rows(self.placement, p, self.device) for p in pieces]
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=-2)


def _row_pieces(parts: Sequence[Tensor], a: int, b: int) -> list[Tensor]:
    """Views of rows [a, b) (counted from the first piece's first row) of the pieces stacked by rows."""
    pieces, off = [], 0
    for p in parts:
        n = p.shape[-2]
        lo, hi = max(a, off), min(b, off + n)
        if lo < hi:
            pieces.append(p[..., lo - off:hi - off, :])
        off += n
    return pieces


def rows_of(x: Union[Tensor, Rows], policy: "SplitPolicy", top: int = 0, bottom: int = 0,
            device: Optional[torch.device] = None) -> Rows:
    """`x` as rows: itself when already `Rows`; a band of a split frame with `top` / `bottom` halo rows exchanged
    with its neighbours; else the whole frame, held where the policy keeps frames when `x` is there."""
    if isinstance(x, Rows):
        return x
    held = policy.frames if policy.holds(x) else None
    device = device or (policy.frames.device if held is not None else x.device)
    if policy.shard is None:
        h = x.shape[-2]
        return TensorRows((x,), 0, h, (0, h), held, device)
    lo, hi, frame = policy.shard.rows(x)
    if not top and not bottom:  # the band's own rows: no exchange
        return TensorRows((x,), lo, frame, (lo, hi), held, device)
    above, below = policy.shard.halo(x, top, bottom)
    parts = tuple(p for p in (above, x, below) if p is not None)
    return TensorRows(parts, lo - (above.shape[-2] if above is not None else 0), frame, (lo, hi), held, device)


class UpscaledRows(Rows):
    """An `Upsample3D`'s 1×1 conv and sub-pixel shuffle of low-resolution rows, made band by band as its conv reads
    them (both are pixel-local), so the upsampled frame never exists whole."""

    def __init__(self, up, low: Rows, ctx):
        self.up, self.low, self.ctx = up, low, ctx
        b, c, t, _h, w = low.shape
        image = ctx.image_frames(t)
        frames = 1 if image else t * up.zr - int(up.zr == 2 and ctx.first)
        self.shape = (b, c, frames, 2 * low.rows, 2 * w)
        self.row0, self.frame_rows = 2 * low.row0, 2 * low.frame_rows
        self.own = (2 * low.own[0], 2 * low.own[1])
        self.device, self.dtype = low.device, low.dtype

    def read(self, a: int, b: int) -> Tensor:
        la, lb = a // 2, -(-b // 2)
        y = self.up.upscale(self.low.read(la, lb), self.ctx)
        return y[..., a - 2 * la:b - 2 * la, :]


# ------------------------------------------------------------------------------------------------
# GroupNorm with whole-frame statistics
# ------------------------------------------------------------------------------------------------
def representative(starts: Sequence[int], x: Tensor) -> Sequence[int]:
    """A loop's chunk starts, or on meta tensors (a predicted pass) only its first and last chunk: the chunks before
    the last are of one size, each frees its temporaries before the next, and what they write goes into buffers
    made before the loop, so the peak is the same (a meta op costs Python time; a 1080p frame has thousands)."""
    starts = list(starts)
    if x.device.type != "meta" or len(starts) <= 2:
        return starts
    return [starts[0], starts[-1]]


def channel_sums(x: Tensor, policy: SplitPolicy) -> Tensor:
    """[2, B, C, T] fp64 (Σx, Σx²) of x over the rows this device owns, read in row chunks."""
    src = rows_of(x, policy)
    b, c, t, _h, w = src.shape
    lo, hi = src.own
    rows = policy.band_rows(c, t, w)
    sums = torch.zeros(2, b, c, t, dtype=torch.float64, device=src.device)
    for r0 in representative(range(lo, hi, rows), sums):
        part = band_sums(src.read(r0, min(hi, r0 + rows)))
        if not _meta(part):
            sums += part
    return sums


def frame_group_stats(x: Tensor, groups: int, eps: float, policy: SplitPolicy) -> tuple[Tensor, Tensor]:
    """Per (batch, group, frame) mean and 1/std of x [B, C, T, H, W] over the whole frame: from the sums recorded
    when x was written, else read in row chunks; all-reduced over the bands of a split frame."""
    sums = policy.stats.lookup(x)
    if sums is None:
        sums = channel_sums(x, policy)
    two, b, c, t = sums.shape
    if _meta(sums) and policy.shard is None:  # a prediction: the statistics' (small) memory alone
        return (torch.empty((b, groups, t), dtype=torch.float32, device=sums.device),
                torch.empty((b, groups, t), dtype=torch.float32, device=sums.device))
    g = sums.view(two, b, groups, c // groups, t).sum(dim=3)
    src_w, frame_h = x.shape[-1], x.shape[-2]
    if policy.shard is not None:  # sums over every band's rows: one all-reduce of (sum, sum of squares)
        g = policy.shard.all_reduce_sum(g)
        frame_h = policy.shard.rows(x)[2]
    n = (c // groups) * frame_h * src_w
    mean = g[0] / n
    var = (g[1] / n - mean.square()).clamp_min_(0)
    return mean.float(), torch.rsqrt(var.float() + eps)


def norm_silu_pre(norm: nn.GroupNorm, x: Tensor, policy: SplitPolicy,
                  silu: bool = True) -> Callable[..., Tensor]:
    """A function normalising (+ SiLU) any rows of `x` (frames `t0`… of it) with `x`'s whole-frame statistics,
    into `out` when given (an fp32 temporary of the rows: a band, which the policy's budget bounds)."""
    mean, rstd = frame_group_stats(x, norm.num_groups, norm.eps, policy)
    g = norm.num_groups
    weight = norm.weight.float() if norm.weight is not None else None
    bias = norm.bias.float() if norm.bias is not None else None

    def apply(rows: Tensor, t0: int = 0, out: Optional[Tensor] = None) -> Tensor:
        if _meta(rows):  # a prediction: the fp32 temporary (and the cast) alone; in-place ops allocate nothing
            if out is not None:  # the temporary's bytes, freed at once (`torch.empty`: empty_like's meta is slow)
                torch.empty(rows.shape, dtype=torch.float32, device=rows.device)
                return out
            y = torch.empty_like(rows, dtype=torch.float32)
            return y if rows.dtype == torch.float32 else torch.empty_like(rows)
        b, c, t = rows.shape[:3]
        m = mean[:, :, t0:t0 + t].view(b, g, 1, t, 1, 1)
        r = rstd[:, :, t0:t0 + t].view(b, g, 1, t, 1, 1)
        y = (rows.unflatten(1, (g, c // g)) - m).mul_(r).flatten(1, 2)  # fp32 (m is): one band-sized temporary
        shape = (1, c, 1, 1, 1)
        if weight is not None:
            y.mul_(weight.view(shape))
        if bias is not None:
            y.add_(bias.view(shape))
        if silu:
            F.silu(y, inplace=True)
        if out is None:
            return y.to(rows.dtype) if y.dtype != rows.dtype else y
        out.copy_(y)
        return out

    return apply


# ------------------------------------------------------------------------------------------------
# Causal conv, band by band
# ------------------------------------------------------------------------------------------------
def bands_to_run(length: int, band: int, meta: bool) -> tuple[int, list[tuple[int, int, int]]]:
    """The bands of `length` rows of at most `band` rows each (`partition`'s), as (index, first row, end row), and
    how many there are. Real tensors run every band. On meta tensors (a predicted pass, vae/planning/meta_pass.py)
    only one band of each size and border position runs: a band's temporaries are freed before the next band and
    its output goes into a buffer made before the loop, so bands of one shape allocate alike, and the peak is the
    same with one of each. They are found without listing the rest: a 4K frame in one-row bands has thousands of
    bands per layer, and each meta op, and each band looked at, costs Python time."""
    n = partition_count(length, band)
    if not meta or n <= 3:
        return n, [(k, r0, r1) for k, (r0, r1) in enumerate(partition(length, band))]

    def edge(i: int) -> int:
        return partition_bound(length, n, i)

    # band sizes are q or q + 1 (r bands of q + 1): the interior holds a size unless the border bands take them all
    q, r = divmod(length, n)
    first, last = edge(1), length - edge(n - 1)
    wanted = {size for size, count in ((q, n - r), (q + 1, r))
              if count - (first == size) - (last == size) > 0}
    picked = [(0, 0, edge(1))]
    for i in range(1, n - 1):  # the first interior band of each size
        if not wanted:
            break
        r0, r1 = edge(i), edge(i + 1)
        if r1 - r0 in wanted:
            wanted.discard(r1 - r0)
            picked.append((i, r0, r1))
    picked.append((n - 1, edge(n - 1), length))
    return n, picked


def causal_conv(conv, x: Union[Tensor, Rows], ctx, policy: SplitPolicy, pre: Pre = None,
                residual: Residual = None, out: Optional[Tensor] = None, finish: Finish = None) -> Tensor:
    """`finish(conv(pre(x), ctx) + residual)` for a SeedVR2 `CausalConv3d`, computed in bands of output rows; the
    output (where the policy keeps frames, or `out`) with its statistics recorded.

    `residual(r0, r1)` gives output rows [r0, r1) of a tensor to add; `out` may be the storage the residual reads
    from (each band reads its rows before writing them)."""
    kt, kh, _kw = conv.kernel_size
    st, sh, sw = conv.stride
    ph, pw = conv.padding[1:]
    e = 1 if conv.pad_right_bottom else 0
    src = rows_of(x, policy, top=ph, bottom=max(0, kh - ph - sh))
    b, cin, t, _h, w = src.shape
    lo, hi = src.own
    frame_out = (src.frame_rows + e + 2 * ph - kh) // sh + 1
    out_lo = lo // sh
    out_hi = frame_out if hi == src.frame_rows else hi // sh
    image = ctx.image_frames(t) and conv.head_frames == kt - 1
    prev = None if image or not conv.cache_frames else ctx.take(fetch=False)
    head = 0 if image else (prev.shape[2] if prev is not None else conv.head_frames)
    t_out = 1 if image else (head + t - kt) // st + 1
    w_out = (w + e + 2 * pw - _kw) // sw + 1
    shape = (b, conv.out_channels, t_out, out_hi - out_lo, w_out)
    if out is None:
        out = policy.new_frame(shape, src.dtype, src.device)
    elif tuple(out.shape) != shape:
        raise ValueError(f"output buffer {tuple(out.shape)} does not match the conv output {shape}")
    out_held = policy.frames if policy.holds(out) else None
    fmt = policy.memory_format
    # The weight in the bands' layout, made once for this layer's call (every band reads it), freed after it.
    if image:
        weight = conv.folded_weight().contiguous(memory_format=_frame_format(fmt))
    else:
        weight = conv.weight.contiguous(memory_format=fmt)
    cache_rows = src.rows + (e if hi == src.frame_rows else 0)
    mf = conv.cache_frames if ctx.collect else 0
    held = None
    if mf:
        held = ctx.new_held((b, mf, cache_rows, w + e, cin), src.dtype, src.device).permute(0, 4, 1, 2, 3)
    hist = None if prev is None else TensorRows((prev,), src.row0, src.frame_rows, src.own, ctx.placement, src.device)
    del prev
    sums = torch.zeros(2, b, conv.out_channels, t_out, dtype=torch.float64, device=src.device)
    band = policy.band_rows(max(cin, conv.out_channels), head + t, w)
    n_out = out_hi - out_lo
    meta = _meta(sums)
    n_bands, bands = bands_to_run(n_out, band, meta)
    for k, o0, o1 in bands:
        a = (out_lo + o0) * sh - ph  # first input row the band reads (frame rows)
        a_end = (out_lo + o1 - 1) * sh - ph + kh
        buf = _padded_band(src, hist, pre, head, a, a_end, pw, e, fmt, image)
        if image:
            y = F.conv2d(buf[:, :, 0], weight, conv.bias, (sh, sw)).unsqueeze(2)
        else:
            y = guarded_conv3d(buf, weight, conv.bias, conv.stride)
        if residual is not None:
            skip = residual(o0, o1)
            if not meta:
                y += skip
            del skip
        if finish is not None:
            y = finish(y)
        part = band_sums(y)
        if not meta:
            sums += part
        del part
        store_rows(out_held, out[:, :, :, o0:o1], y)
        del y
        if held is not None:  # this band's rows of the next cache: the buffer's last frames
            # the first and last bands keep the rows their buffer holds: a band of a split frame may hold more
            # halo rows than its conv reads (an upsampler's doubled low-resolution halo), never read from the cache
            c0 = max(src.row0, a) if k == 0 else (out_lo + o0) * sh - ph
            c1 = min(src.row0 + cache_rows, a_end) if k == n_bands - 1 else (out_lo + o1) * sh - ph
            _keep_rows(held, buf, ctx.placement, c0 - src.row0, c1 - src.row0, c0 - a, pw, w + e, image, mf)
        del buf
    if held is not None:
        ctx.put(held, conv, held=True)
    policy.stats.record(out, sums)
    return out


def _frame_format(fmt: torch.memory_format) -> torch.memory_format:
    return torch.channels_last if fmt == torch.channels_last_3d else torch.contiguous_format


def _padded_band(src: Rows, hist: Optional[Rows], pre: Pre, head: int, a: int, a_end: int, pw: int, e: int,
                 fmt: torch.memory_format, image: bool) -> Tensor:
    """The conv's input for one band, written once into one buffer: `head` history frames (the cache's rows, or the
    band's first frame repeated), the band's frames normalised by `pre`, rows [a, a_end) of the frame (zeros
    outside it) and `pw` zero columns each side (+ `e` on the right)."""
    b, c, t, _h, w = src.shape
    frames = 1 if image else head + t
    buf = torch.empty((b, c, frames, a_end - a, w + 2 * pw + e), dtype=src.dtype, device=src.device,
                      memory_format=fmt)
    a0, b0 = max(a, 0), min(a_end, src.frame_rows)
    meta = _meta(buf)  # a prediction: fills and copies allocate nothing and are skipped, reads are not
    if not meta:
        if a0 > a:
            buf[..., :a0 - a, :].zero_()
        if b0 < a_end:
            buf[..., b0 - a:, :].zero_()
        if pw:
            buf[..., a0 - a:b0 - a, :pw].zero_()
        if pw + e:
            buf[..., a0 - a:b0 - a, pw + w:].zero_()
    body = buf if meta else buf[:, :, frames - (1 if image else t):, a0 - a:b0 - a, pw:pw + w]
    rows = src.read(a0, b0)
    if pre is not None:
        pre(rows, 0, out=body)
    elif not meta:
        body.copy_(rows)
    del rows
    if image or not head:
        return buf
    if hist is not None:
        held = hist.read(a0, b0)
        if not meta:
            buf[:, :, :head, a0 - a:b0 - a, pw:pw + w + e].copy_(held[..., :w + e])
        del held
    elif not meta:  # first slice: frame 0 (normalised, padded) repeated
        buf[:, :, :head].copy_(buf[:, :, head:head + 1].expand(-1, -1, head, -1, -1))
    return buf


def _keep_rows(held: Tensor, buf: Tensor, placement: Optional[Placement], r0: int, r1: int, br0: int, pw: int,
               width: int, image: bool, mf: int) -> None:
    """Rows [r0, r1) of the next causal cache `held` (its frame rows from the band's first row on): the last `mf`
    frames of the band's padded input (rows from `br0` of the buffer, the frame's columns and the right pad), or,
    for an image, its one frame repeated."""
    if r1 <= r0:
        return
    kept = buf[:, :, -1:] if image else buf[:, :, -mf:]
    kept = kept[..., br0:br0 + (r1 - r0), pw:pw + width]
    if image and mf > 1:
        kept = kept.expand(-1, -1, mf, -1, -1)
    store_rows(placement, held[:, :, :, r0:r1], kept)


# ------------------------------------------------------------------------------------------------
# Blocks
# ------------------------------------------------------------------------------------------------
def norm_silu_conv(norm: nn.GroupNorm, conv, x: Union[Tensor, Rows], ctx, policy: SplitPolicy,
                   residual: Residual = None, out: Optional[Tensor] = None, finish: Finish = None) -> Tensor:
    out = causal_conv(conv, x, ctx, policy, pre=norm_silu_pre(norm, x, policy), residual=residual, out=out,
                      finish=finish)
    if ctx.tick is not None:
        ctx.tick()
    return out


def resnet(block, x: Tensor, ctx, policy: SplitPolicy) -> Tensor:
    """ResnetBlock3D with the second conv's output and the skip added band by band.

    The skip (identity, or the 1×1×1 shortcut of the same rows) never exists as a whole tensor, and with matching
    channels under inference mode the result is written into `x`'s own storage (each band reads its skip rows
    before writing them; nothing else reads `x` after the first conv): two whole-frame activations alive instead
    of three."""
    h = norm_silu_conv(block.norm1, block.conv1, x, ctx, policy)
    src = rows_of(x, policy)
    lo = src.own[0]
    sc = block.conv_shortcut
    fmt = policy.memory_format
    sc_weight = sc.weight.contiguous(memory_format=fmt) if sc is not None else None

    def skip(r0: int, r1: int) -> Tensor:
        rows = src.read(lo + r0, lo + r1)
        return rows if sc is None else guarded_conv3d(rows, sc_weight, sc.bias)

    inplace = sc is None and ctx.pieces.in_place
    return norm_silu_conv(block.norm2, block.conv2, h, ctx, policy, residual=skip, out=x if inplace else None)


def join_frames(parts: Sequence[Tensor], policy: Optional[SplitPolicy]) -> Tensor:
    """Frames emitted by successive steps of one frame stage, joined along time for the next stage (a frame stage
    whose step takes two of them): concatenated on the device; in a streamed pass, copied into a new host frame a
    band of rows at a time through the device (host memory is never read on the CPU), their statistics carried."""
    if policy is None or not policy.streamed or not all(policy.holds(p) for p in parts):
        return torch.cat(list(parts), dim=2)
    b, c, _t, h, w = parts[0].shape
    out = policy.new_frame((b, c, sum(p.shape[2] for p in parts), h, w), parts[0].dtype, policy.frames.device)
    rows = policy.band_rows(c, max(p.shape[2] for p in parts), w)
    t0 = 0
    for part in parts:
        src = rows_of(part, policy)
        t1 = t0 + part.shape[2]
        for r0 in range(0, h, rows):
            store_rows(policy.frames, out[:, :, t0:t1, r0:r0 + rows], src.read(r0, min(h, r0 + rows)))
        t0 = t1
    sums = [policy.stats.lookup(p) for p in parts]
    if all(s is not None for s in sums):
        policy.stats.record(out, torch.cat(sums, dim=-1))
    return out


def normalised_convs(part: nn.Module) -> int:
    """How many GroupNorm→conv pairs one step of `part` (encoder or decoder) runs: the progress total."""
    return sum(2 for m in part.modules() if type(m).__name__ == "ResnetBlock3D") + 1


def upsample(up, x: Tensor, ctx, policy: SplitPolicy) -> Tensor:
    """Upsample3D: its conv over the 1×1 conv + sub-pixel shuffle of `x`, made band by band (`UpscaledRows`); the
    low-resolution rows carry one halo row each side, which the shuffle doubles."""
    return causal_conv(up.conv, UpscaledRows(up, rows_of(x, policy, top=1, bottom=1), ctx), ctx, policy)


def attention(att, x: Tensor, ctx, policy: SplitPolicy) -> Tensor:
    """The mid block's single-head attention over the H×W tokens of each frame, band by band: keys and values of
    the whole frame made a band of rows at a time, then each band of query rows attends to them — all at once
    where a frame's keys and values fit the band budget, else in chunks merged with an online softmax — and adds
    its rows of `x`. Keys and values are kept where the policy keeps frames."""
    src = rows_of(x, policy)
    b, c, t, h, w = src.shape
    pre = norm_silu_pre(att.group_norm, x, policy, silu=False)
    rows = policy.band_rows(c, t, w)
    keys = policy.new_frame((b, c, t, h, w), src.dtype, src.device, channels_last=True)
    values = policy.new_frame((b, c, t, h, w), src.dtype, src.device, channels_last=True)
    held = policy.frames if policy.streamed else None
    for r0 in representative(range(0, h, rows), torch.empty(0, device=src.device)):
        r1 = min(h, r0 + rows)
        tokens = _tokens(pre(src.read(r0, r1)))
        store_rows(held, keys[:, :, :, r0:r1], _frames(att.to_k(tokens), b, t, r1 - r0, w))
        store_rows(held, values[:, :, :, r0:r1], _frames(att.to_v(tokens), b, t, r1 - r0, w))
        del tokens
    k_rows = TensorRows((keys,), 0, h, (0, h), held, src.device)
    v_rows = TensorRows((values,), 0, h, (0, h), held, src.device)
    whole = 2 * b * t * c * h * w <= policy.budget_elems  # the keys and values fit the band budget
    out = policy.new_frame(src.shape, src.dtype, src.device)
    out_held = held
    sums = torch.zeros(2, b, c, t, dtype=torch.float64, device=src.device)
    q_rows = max(1, min(h, rows // 2))
    chunk_rows = max(1, policy.budget_elems // (2 * b * t * q_rows * w * w))  # scores: about half the budget
    _n, bands = bands_to_run(h, q_rows, _meta(sums))
    k_all = _tokens(k_rows.read(0, h)) if whole else None
    v_all = _tokens(v_rows.read(0, h)) if whole else None
    for _k, r0, r1 in bands:
        raw = src.read(r0, r1)
        q = att.to_q(_tokens(pre(raw)))
        if whole:
            o = ctx.pieces.attend(q, k_all, v_all)
        else:
            o = _chunked_attention(q, k_rows, v_rows, chunk_rows, h)
        del q
        y = _frames(att.to_out[0](o), b, t, r1 - r0, w)
        del o
        y = y.contiguous(memory_format=policy.memory_format)
        y += raw
        sums += band_sums(y)
        store_rows(out_held, out[:, :, :, r0:r1], y)
        del raw, y
    policy.stats.record(out, sums)
    return out


def _tokens(x: Tensor) -> Tensor:
    """[B, C, T, r, W] -> [B·T, r·W, C]."""
    b, c, t, r, w = x.shape
    return x.permute(0, 2, 3, 4, 1).reshape(b * t, r * w, c)


def _frames(tokens: Tensor, b: int, t: int, r: int, w: int) -> Tensor:
    """[B·T, r·W, C] -> [B, C, T, r, W] (a view, channels innermost)."""
    return tokens.view(b, t, r, w, -1).permute(0, 4, 1, 2, 3)


def _chunked_attention(q: Tensor, k_rows: Rows, v_rows: Rows, chunk_rows: int, h: int) -> Tensor:
    """softmax(q·kᵀ/√C)·v over keys read `chunk_rows` rows at a time, merged with an online softmax (running
    maximum and sum in fp32): the same result as one softmax over every key, with memory bounded by a chunk."""
    scale = q.shape[-1] ** -0.5
    acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    top = torch.full(q.shape[:-1], float("-inf"), dtype=torch.float32, device=q.device)
    total = torch.zeros(q.shape[:-1], dtype=torch.float32, device=q.device)
    for r0 in representative(range(0, h, chunk_rows), q):
        r1 = min(h, r0 + chunk_rows)
        k, v = _tokens(k_rows.read(r0, r1)), _tokens(v_rows.read(r0, r1))
        s = torch.bmm(q, k.transpose(1, 2)).float().mul_(scale)
        new_top = torch.maximum(top, s.amax(dim=-1))
        fade = torch.exp(top - new_top)
        p = torch.exp(s - new_top.unsqueeze(-1))
        del s
        total.mul_(fade).add_(p.sum(dim=-1))
        acc.mul_(fade.unsqueeze(-1)).add_(torch.bmm(p.to(v.dtype), v).float())
        top = new_top
        del p, k, v
    return acc.div_(total.unsqueeze(-1)).to(q.dtype)
