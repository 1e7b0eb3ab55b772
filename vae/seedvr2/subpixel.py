"""An upsampler's 1×1 conv, sub-pixel shuffle and 3×3×3 causal conv as composed convs at low resolution.

Why: `Upsample3D` maps each low-resolution pixel to 2×2 (×2 in time for the temporal stages) sub-pixels with
a 1×1 `upscale_conv` and a shuffle, then runs a 3×3×3 causal conv at full resolution. Each output pixel's
3×3 window covers only 2×2 low-resolution pixels, and its three frames only two low-resolution frames when
time doubles: many taps read different sub-pixels of the same source. Composing the conv with the 1×1 conv
(both linear) gives, per output phase (time phase z', rows a, columns b), a conv with 2×2 spatial taps over
the low-resolution input: 12 (space only) or 8 (space and time) input taps per output pixel instead of 27,
one conv for all phases, and no shuffled tensor. The result equals the plain path up to float rounding (the
composed weights sum in another order); tests hold it to 1e-5.

Built from parts: an *atom* is the 2-D composition of one temporal tap k of the conv with the 1×1 conv's
rows of one time phase z. An output frame reads three (tap, low-resolution frame, phase) triples; frames
with the same triples relative to their low-resolution frame form a *class* and run as one strided conv
whose kernel sums the atoms per low-resolution frame. The head of a first slice (frame 0 repeated, and the
temporal stage's dropped copy of frame 0) gives a few irregular classes of one frame each.

What the composition must still honour:
- the full-resolution conv zero-pads its input, but the shuffled input of a zero-padded low-resolution
  pixel would be the 1×1 conv's bias, not zero: the bias is kept out of the composed weights and added
  per class, inside the frame as the conv's bias and on the border rows/columns as a correction computed
  on a 6×6 pattern;
- causal cache: the state holds the frames the plain conv holds (its padded input's last full-resolution
  frames), so slices can switch paths and engines see one layout. A later slice convolves the frames it
  reads from memory at full resolution (three frame-taps) and its own frames through the composition.

The composed weights are made per call and freed after it (the parameters stay the only resident copy,
`vae/accel/weight_layout.py`); `worth_composing` keeps the plain path where composing would cost more than it saves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from ..accel.kernels.conv_guard import conv3d as guarded_conv3d
from ..accel.tensor_layout import memory_format_of
from ..norms import matmul
from .shuffle import pixel_shuffle_3d

# For output phase a of a 3-tap window (offsets -1, 0, +1 at full resolution): which of the two
# low-resolution taps (0: the lower-index pixel) and which input sub-pixel each full-resolution tap reads.
_TAPS = {a: tuple(((a + d - 1) // 2 + 1 - a, (a + d - 1) % 2) for d in range(3)) for a in (0, 1)}
# Output frames of a class are computed in about this many convs (bounds the 4·O-channel intermediate).
CHUNKS = 4
# The composition must save at least this many times its own FLOPs before it is used: its GEMM runs below the
# convs' rate on CPU, and the head of a first slice already saves part of the plain conv's work.
MIN_GAIN = 4.0

Tap = tuple[int, int, int]  # (conv tap k, low-resolution frame offset from the class's anchor frame, time phase z)


def composition_flops(channels: int, kt: int, zr: int) -> int:
    """FLOPs of `composed_atoms`: one GEMM of every (tap, sub-pixel) pair."""
    return 2 * 9 * kt * 4 * zr * channels ** 3


def worth_composing(channels: int, out_voxels: int, zr: int = 1) -> bool:
    """True when the conv work removed (27 input taps per output voxel, plus the 1×1 conv's share, down to 12
    or 8) is at least `MIN_GAIN` times the composition's cost."""
    saved_per_voxel = 2 * channels ** 2 * (27 + 1 - (12 if zr == 1 else 8))
    return out_voxels * saved_per_voxel >= MIN_GAIN * composition_flops(channels, 3, zr)


def composed_atoms(conv_weight: torch.Tensor, upscale_weight: torch.Tensor, zr: int) -> torch.Tensor:
    """[k_t, z_r, 4·O, I, 2, 2]: for temporal tap k and time phase z, the kernels of the four output phases
    (a, b; blocks of O rows in order a·2+b) over the low-resolution input equal to `conv tap k ∘ shuffle ∘
    upscale_conv rows of phase z`, without biases. Spatial tap p of phase a reads input row i + a - 1 + p
    for output row 2i + a.

    `conv_weight` [O, M, k_t, 3, 3] (k_t = 1 for the folded image path), `upscale_weight` [4·z_r·M, I, …] with
    channel index ((x·2 + y)·z_r + z)·M + m. One GEMM (`norms.matmul`) forms every (tap, input sub-pixel) product in fp32;
    each product belongs to exactly one (phase, low-resolution tap), where it is added."""
    o, m, kt = conv_weight.shape[:3]
    i = upscale_weight.shape[1]
    taps = conv_weight.float().permute(3, 4, 0, 2, 1).reshape(9 * o * kt, m)  # rows (dy, dx, o, k)
    up = upscale_weight.float().reshape(2, 2, zr, m, i)
    composed = torch.zeros(2, 2, 2, 2, o, kt, zr, i, dtype=torch.float32, device=conv_weight.device)
    for x in (0, 1):
        for y in (0, 1):  # one input sub-pixel at a time: the products' buffer stays a quarter of the atoms
            prods = matmul(taps, up[x, y].permute(1, 0, 2).reshape(m, zr * i)).view(3, 3, o, kt, zr, i)
            if composed.device.type != "meta":  # a prediction counts the products; adding them allocates nothing
                _add_products(composed, prods, x, y)
            del prods
    # (a, b, p, q, o, k, z, i) -> (k, z, (a, b, o), i, p, q)
    return composed.permute(5, 6, 0, 1, 4, 7, 2, 3).reshape(kt, zr, 4 * o, i, 2, 2)


def _add_products(composed: torch.Tensor, prods: torch.Tensor, x: int, y: int) -> None:
    """Add the products of input sub-pixel (x, y) [3, 3, O, k_t, z_r, I] (by full-resolution tap dy, dx) to the
    atoms [2, 2, 2, 2, O, k_t, z_r, I] (output phase a, b; low-resolution tap p, q) each belongs to."""
    for a in (0, 1):
        for dy, (p, xa) in enumerate(_TAPS[a]):
            if xa != x:
                continue
            for b in (0, 1):
                for dx, (q, yb) in enumerate(_TAPS[b]):
                    if yb == y:
                        composed[a, b, p, q].add_(prods[dy, dx])


def bias_patterns(conv_weight: torch.Tensor, upscale_bias: torch.Tensor, zr: int) -> torch.Tensor:
    """[k_t, z_r, O, 6, 6]: per temporal tap and time phase, the full-resolution conv (zero padded) of the
    shuffled upscale bias on a 6×6 frame.

    On any frame the map depends only on the output pixel's sub-pixel phase, except that the first/last
    row and column miss their outside neighbour; a 6×6 frame has every case (first, even, odd, last rows),
    so `expand_pattern` builds the map of any size from it. One GEMM over its 3×3 patches."""
    o, m, kt = conv_weight.shape[:3]
    bias = upscale_bias.float().view(2, 2, zr, m).permute(2, 3, 0, 1)  # [z, m, x, y]
    patches = F.unfold(bias.repeat(1, 1, 3, 3), 3, padding=1)  # [z, m·9, 36], rows (m, dy, dx)
    weight = conv_weight.float().permute(2, 0, 1, 3, 4).reshape(kt * o, m * 9)
    return (weight @ patches).view(zr, kt, o, 6, 6).transpose(0, 1)


def expand_pattern(small: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """[..., 6, 6] -> [..., 2h, 2w]: the bias map of a 2h×2w frame."""
    rows = _pattern_index(2 * h, small.device)
    cols = _pattern_index(2 * w, small.device)
    return small[..., rows, :][..., cols]


def _pattern_index(n: int, device: torch.device) -> torch.Tensor:
    """Row (column) of the 6-wide pattern that behaves like full-resolution row r of n: 0 first, 5 last,
    else 2 (even) or 3 (odd)."""
    idx = 2 + torch.arange(n, device=device) % 2
    idx[0], idx[-1] = 0, 5
    return idx


@dataclass(frozen=True)
class OutputClass:
    """Output frames `first, first + step, …` whose taps read the same (tap, frame offset, phase) triples
    relative to anchor frames `anchor0, anchor0 + 1, …` of the low-resolution input."""

    taps: tuple[Tap, ...]
    first: int
    step: int
    anchor0: int
    count: int


def output_classes(zr: int, kt: int, frames: int, first_slice: bool) -> list[OutputClass]:
    """The classes covering every output frame of a slice of `frames` low-resolution frames.

    Frame offsets may point before frame 0 of the slice: on a first slice those are copies of frame 0
    (space only) and never occur for the temporal stage (its head classes are listed one frame each); on
    a later slice they are the memory, which `upsample_conv` adds at full resolution."""
    if kt == 1:  # the folded image path: one frame, every tap on frame 0's kept phase
        return [OutputClass(((0, 0, 0),), 0, 1, 0, 1)]
    if zr == 1:
        return [OutputClass(tuple((k, k - 2, 0) for k in range(3)), 0, 1, 0, frames)]
    regular = [tuple((k, (zp + k - 2) // 2, (zp + k - 2) % 2) for k in range(3)) for zp in (0, 1)]
    if not first_slice:
        return [OutputClass(regular[zp], zp, 2, 0, frames) for zp in (0, 1)]
    # First temporal slice: the plain path's frames are [f0, f0 | f0(z=0), f1(z=0), f1(z=1), f2(z=0), …]
    # (two head copies, then frame 0's z=1 copy dropped), so outputs 0..2 read frame 0 irregularly.
    head = [((0, 0, 0), (1, 0, 0), (2, 0, 0)), ((0, 0, 0), (1, 0, 0), (2, 1, 0)), ((0, 0, 0), (1, 1, 0), (2, 1, 1))]
    classes = [OutputClass(taps, j, 1, 0, 1) for j, taps in enumerate(head[:2 * frames - 1])]
    if frames > 2:
        classes += [OutputClass(regular[zp], 3 + zp, 2, 2, frames - 2) for zp in (0, 1)]
    return classes


def output_frames(zr: int, frames: int, first_slice: bool, image: bool = False) -> int:
    """Full-resolution frames an upsampler makes from `frames` low-resolution ones: z_r per frame, less frame 0's
    dropped copy on a first temporal slice; one for the image path."""
    return 1 if image else zr * frames - int(zr == 2 and first_slice)


def upsample_conv(up, x: torch.Tensor, ctx) -> torch.Tensor:
    """`up.conv(up.upscale(x, ctx), ctx)` for an `Upsample3D`, through the composed atoms; takes and puts the
    conv's causal cache exactly as that call would."""
    conv = up.conv
    b, c, t, h, w = x.shape
    o = conv.out_channels
    image = ctx.image(x)
    prev: Optional[torch.Tensor] = None if ctx.first else ctx.take()
    if image:  # T = 1, first slice: every tap reads frame 0's z = 0 sub-frame (the kept half)
        w3, zr = conv.folded_weight().unsqueeze(2), 1
        w1, b1 = up.kept_half()
    else:
        w3, zr = conv.weight, up.zr
        w1, b1 = up.upscale_conv.weight, up.upscale_conv.bias
    kt = w3.shape[2]
    atoms = composed_atoms(w3, w1, zr)
    patterns = bias_patterns(w3, b1, zr)  # [k_t, z_r, O, 6, 6]
    classes = output_classes(zr, kt, t, first_slice=prev is None)
    frames_out = output_frames(up.zr, t, first_slice=prev is None, image=image)
    out = torch.empty(b, o, frames_out, 2 * h, 2 * w, dtype=x.dtype, device=x.device, memory_format=memory_format_of(x))
    xp = F.pad(x, (1, 1, 1, 1))
    for cls in classes:
        _run_class(cls, xp, atoms, patterns, conv.bias, out, first_slice=prev is None)
    del atoms, xp
    if prev is not None:
        _add_memory_taps(out, prev, w3, patterns)
    if ctx.collect and conv.cache_frames:
        ctx.put(_cache_tail(up, x, prev, conv.cache_frames), conv)
    return out


def _run_class(cls: OutputClass, xp: torch.Tensor, atoms: torch.Tensor, patterns: torch.Tensor,
               conv_bias: torch.Tensor, out: torch.Tensor, first_slice: bool) -> None:
    """One class: a conv over its anchors' low-resolution frames (spatially zero-padded `xp`) with the summed
    atoms per frame offset, written into its output frames with its bias."""
    lo = min(off for _, off, _ in cls.taps)
    hi = max(off for _, off, _ in cls.taps)
    span = hi - lo + 1
    o4 = atoms.shape[2]
    kernel = atoms.new_zeros(o4, atoms.shape[3], span, 2, 2)
    for k, off, z in cls.taps:
        kernel[:, :, off - lo] += atoms[k, z]
    start, stop = cls.anchor0 + lo, cls.anchor0 + cls.count - 1 + hi + 1
    src = xp[:, :, max(start, 0):stop]
    if start < 0:  # before the slice: copies of frame 0 on a first slice; memory (added later) otherwise
        head = src[:, :, :1].expand(-1, -1, -start, -1, -1) if first_slice else src.new_zeros(
            *src.shape[:2], -start, *src.shape[3:])
        src = torch.cat([head, src], dim=2)
    total = sum(patterns[k, z] for k, _, z in cls.taps).add_(conv_bias.float().view(-1, 1, 1))  # [O, 6, 6]
    inside = total[:, 2:4, 2:4]  # [O, a, b]
    bias = inside.permute(1, 2, 0).reshape(o4).to(xp.dtype)
    kernel = kernel.to(xp.dtype)
    o = o4 // 4
    h, w = xp.shape[-2] - 2, xp.shape[-1] - 2
    frames = out[:, :, cls.first::cls.step][:, :, :cls.count]
    phases = frames.unflatten(3, (h, 2)).unflatten(5, (w, 2))  # [B, O, n, h, 2, w, 2]
    # A few output frames per conv: its 4·O-channel result is then a fraction of the output, so the composed
    # path's working memory stays below the plain path's (whose shuffled input is the output's size).
    chunk = max(1, cls.count // CHUNKS)
    for c0 in range(0, cls.count, chunk):
        n = min(chunk, cls.count - c0)
        window = src[:, :, c0:c0 + n + span - 1]
        if window.shape[2] == 1:  # one frame in, one out: a 2-D conv (a one-frame conv3d takes a slow CPU kernel)
            y = F.conv2d(window[:, :, 0], kernel[:, :, 0], bias).unsqueeze(2)
        else:
            y = guarded_conv3d(window, kernel, bias, 1, 0)
        for a in (0, 1):
            for bb in (0, 1):
                k = a * 2 + bb
                phases[:, :, c0:c0 + n, :, a, :, bb] = y[:, k * o:(k + 1) * o, :, a:a + h, bb:bb + w]
        del y
    _fix_borders(frames, (expand_pattern(total, h, w) - inside.repeat(1, h, w)).to(out.dtype))


def _fix_borders(out: torch.Tensor, delta: torch.Tensor) -> None:
    """Add `delta` [O, 2h, 2w] (zero except on the first/last rows and columns) to every frame of `out`."""
    out[:, :, :, 0] += delta[:, None, 0]
    out[:, :, :, -1] += delta[:, None, -1]
    out[:, :, :, 1:-1, 0] += delta[:, None, 1:-1, 0]
    out[:, :, :, 1:-1, -1] += delta[:, None, 1:-1, -1]


def _add_memory_taps(out: torch.Tensor, prev: torch.Tensor, w3: torch.Tensor, patterns: torch.Tensor) -> None:
    """On a later slice, output frame j < k_t - 1 reads memory frame j + k through taps k < k_t - 1 - j: add
    those at full resolution, and take back the bias the class credited them with (memory frame i is the
    plain path's padded frame i: time phase i mod z_r of the previous slice's last low-resolution frame)."""
    kt, zr = w3.shape[2], patterns.shape[1]
    h, w = out.shape[-2] // 2, out.shape[-1] // 2
    for j in range(min(out.shape[2], kt - 1)):
        taps = range(kt - 1 - j)
        weight = torch.cat([w3[:, :, k] for k in taps], dim=1)
        src = torch.cat([prev[:, :, j + k] for k in taps], dim=1)
        credited = expand_pattern(sum(patterns[k, (j + k) % zr] for k in taps), h, w).to(out.dtype)
        out[:, :, j] += F.conv2d(src, weight, padding=1) - credited


def _cache_tail(up, x: torch.Tensor, prev: Optional[torch.Tensor], frames: int) -> torch.Tensor:
    """The last `frames` frames of the plain conv's padded input: the shuffled upscale of the slice's last
    low-resolution frames, preceded by the history (memory, or copies of frame 0) when those are fewer."""
    n = min(x.shape[2], math.ceil(frames / up.zr))
    last = x[:, :, -n:]
    b, i, f, h, w = last.shape
    weight = up.upscale_conv.weight.reshape(-1, i)  # a 1×1×1 conv is a matmul over channels
    u = torch.addmm(up.upscale_conv.bias, last.permute(0, 2, 3, 4, 1).reshape(-1, i), weight.t())
    u = pixel_shuffle_3d(u.view(b, f, h, w, -1).permute(0, 4, 1, 2, 3), 2, up.zr)  # token-major rows, channels last
    if prev is None and n == x.shape[2] and up.zr == 2:  # the first slice drops frame 0's second copy
        u = torch.cat([u[:, :, :1], u[:, :, 2:]], dim=2)
    have = u.shape[2]
    if have < frames:
        before = prev[:, :, have - frames:] if prev is not None else u[:, :, :1].expand(-1, -1, frames - have, -1, -1)
        u = torch.cat([before, u], dim=2)
    return u[:, :, -frames:].contiguous(memory_format=memory_format_of(x))


def classes_cover(classes: Sequence[OutputClass], frames_out: int) -> bool:
    """Every output frame belongs to exactly one class (a check the tests use on every slice shape)."""
    seen = sorted(cls.first + cls.step * n for cls in classes for n in range(cls.count))
    return seen == list(range(frames_out))
