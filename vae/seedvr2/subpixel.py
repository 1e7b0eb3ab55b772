"""A spatial upsampler's 1×1 conv, sub-pixel shuffle and 3×3×3 causal conv as four 2×2 convs at low resolution.

Why: in `Upsample3D` (space only, z_r = 1) each output pixel of the full-resolution 3×3 conv reads a 3×3
window of the shuffled input, and that window covers only 2×2 low-resolution pixels: its nine taps land
on four source pixels, several taps on different sub-pixels of the same one. Composing the conv with the
1×1 `upscale_conv` (both linear) turns them into one conv per output sub-pixel phase (a, b) with a 2×2
spatial kernel over the low-resolution input: 4 spatial taps of C channels per output pixel instead of
9, and no shuffled tensor is materialised. The result equals the plain path up to float rounding (the
composed weights sum in a different order), so this is a fast path of the exactly-rounded-once kind
that tests hold to 1e-5.

What the composition must still honour:
- the full-resolution conv zero-pads its input, but the shuffled input of a zero-padded low-resolution
  pixel would be the 1×1 conv's bias, not zero: the bias part is therefore kept out of the composed
  weights and added as a per-tap map (the conv of the shuffled bias pattern, border rows/columns
  included), computed on a 6×6 pattern and expanded;
- causal memory: the state keeps the full-resolution frames the plain conv keeps (its padded input's
  last frames), so slices can switch paths and engines see one layout. Frames read from that memory are
  convolved at full resolution (at most three frame-taps per slice); the slice's own frames take the
  composed path.

The composed weights are made per call and freed after it (the parameters stay the only resident copy,
`vae/weight_layout.py`); `worth_composing` skips layers too small to pay for the composition.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ..kernels.conv_guard import conv3d as guarded_conv3d

# For output phase a of a 3-tap window (offsets -1, 0, +1 at full resolution): which of the two
# low-resolution taps (0: the lower-index pixel) and which input sub-pixel each full-resolution tap reads.
_TAPS = {a: tuple(((a + d - 1) // 2 + 1 - a, (a + d - 1) % 2) for d in range(3)) for a in (0, 1)}
# Extra work of the composition relative to the conv work it saves, as output pixels per channel: below
# this many full-resolution outputs per input channel the composition costs more than it saves.
MIN_OUTPUTS_PER_CHANNEL = 8


def worth_composing(channels: int, out_pixels: int) -> bool:
    """True when the per-call composition (≈ 72·k_t·C³ FLOPs) is small next to the conv work it removes
    (≈ 32·C² FLOPs per full-resolution output pixel-frame)."""
    return out_pixels >= MIN_OUTPUTS_PER_CHANNEL * channels


def composed_kernels(conv_weight: torch.Tensor, upscale_weight: torch.Tensor) -> torch.Tensor:
    """[4·O, I, k_t, 2, 2]: the output phases' (a, b; rows a·2+b blocks of O) kernels over the low-resolution
    input equal to `conv ∘ shuffle ∘ upscale_conv` without biases; spatial tap p of phase a reads input row
    i + a - 1 + p for output row 2i + a.

    `conv_weight` [O, M, k_t, 3, 3] (k_t may be 1 for the folded image path), `upscale_weight` [4·M, I, …]
    with channel index (x·2 + y)·M + m. One GEMM forms every (tap, input sub-pixel) product in fp32; each
    product belongs to exactly one (phase, low-resolution tap), where it is added."""
    o, m, kt = conv_weight.shape[:3]
    i = upscale_weight.shape[1]
    taps = conv_weight.float().permute(3, 4, 0, 2, 1).reshape(9 * o * kt, m)  # rows (dy, dx, o, t)
    up = upscale_weight.float().reshape(4, m, i).permute(1, 0, 2).reshape(m, 4 * i)  # columns (x, y, i)
    prods = (taps @ up).view(3, 3, o * kt, 2, 2, i)
    del taps
    composed = torch.zeros(2, 2, 2, 2, o * kt, i, dtype=torch.float32, device=conv_weight.device)
    for a in (0, 1):
        for b in (0, 1):
            for dy, (p, x) in enumerate(_TAPS[a]):
                for dx, (q, y) in enumerate(_TAPS[b]):
                    composed[a, b, p, q].add_(prods[dy, dx, :, x, y])
    del prods
    # (a, b, p, q, o, t, i) -> [(a, b), o, i, t, p, q]
    out = composed.view(2, 2, 2, 2, o, kt, i).permute(0, 1, 4, 6, 5, 2, 3).reshape(4 * o, i, kt, 2, 2)
    return out.to(conv_weight.dtype).contiguous()


def bias_pattern(conv_weight: torch.Tensor, upscale_bias: torch.Tensor) -> torch.Tensor:
    """[k_t, O, 6, 6]: per temporal tap, the full-resolution conv (zero padded) of the shuffled upscale bias
    on a 6×6 frame.

    On any frame the map depends only on the output pixel's sub-pixel phase, except that the first/last
    row and column miss their outside neighbour; a 6×6 frame has every case (first, even, odd, last rows),
    so `expand_pattern` builds the map of any size from it. One GEMM over its 3×3 patches."""
    o, m, kt = conv_weight.shape[:3]
    pattern = upscale_bias.float().view(2, 2, m).permute(2, 0, 1).repeat(1, 3, 3).unsqueeze(0)  # [1, m, 6, 6]
    patches = F.unfold(pattern, 3, padding=1)[0]  # [m·9, 36], rows (m, dy, dx)
    weight = conv_weight.float().permute(2, 0, 1, 3, 4).reshape(kt * o, m * 9)
    return (weight @ patches).view(kt, o, 6, 6)


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


def upsample_conv(up, x: torch.Tensor, ctx) -> torch.Tensor:
    """`up.conv(shuffle(up.upscale_conv(x)), ctx)` for a space-only `Upsample3D`, through the composed
    kernels; takes and puts the conv's causal memory exactly as that call would.

    One conv computes all four phases (4·O output channels) on the zero-padded low-resolution input, each
    phase's output shifted by its offset (a, b): (h+1)×(w+1) positions, of which each phase keeps h×w. Its
    bias is each phase's bias inside the frame; the border rows and columns are corrected after."""
    conv = up.conv
    b, c, t, h, w = x.shape
    o = conv.out_channels
    w3, w1, b1 = conv.weight, up.upscale_conv.weight, up.upscale_conv.bias
    image = ctx.image(x)
    prev: Optional[torch.Tensor] = None if ctx.first else ctx.take()
    if image:
        w3 = conv.folded_weight().unsqueeze(2)  # T = 1, first slice: every temporal tap reads frame 0
    kt = w3.shape[2]
    head = kt - 1
    kernels = composed_kernels(w3, w1)
    pattern = bias_pattern(w3, b1)  # [k_t, O, 6, 6]
    total = pattern.sum(0).add_(conv.bias.float().view(-1, 1, 1))  # every tap reads a frame carrying the bias
    inside = total[:, 2:4, 2:4]  # [O, a, b]
    # Time head: copies of frame 0 on a first slice (the shuffle is per frame, so repeating the input
    # repeats its shuffled frames); zeros on a later slice, whose history is added from memory below
    # (zeros add nothing through the bias-free kernels).
    padded = x.new_zeros(b, c, head + t, h + 2, w + 2)
    padded[:, :, head:, 1:h + 1, 1:w + 1] = x
    if prev is None and head:
        padded[:, :, :head, 1:h + 1, 1:w + 1] = x[:, :, :1]
    phase_bias = inside.permute(1, 2, 0).reshape(4 * o).to(x.dtype)
    if image:
        y = F.conv2d(padded[:, :, 0], kernels[:, :, 0], phase_bias).unsqueeze(2)
    else:
        y = guarded_conv3d(padded, kernels, phase_bias, 1, 0)
    del kernels, padded
    out = torch.empty(b, o, t, 2 * h, 2 * w, dtype=x.dtype, device=x.device)
    phases = out.unflatten(3, (h, 2)).unflatten(5, (w, 2))  # [B, O, T, h, 2, w, 2]
    for a in (0, 1):
        for bb in (0, 1):
            k = a * 2 + bb
            phases[:, :, :, :, a, :, bb] = y[:, k * o:(k + 1) * o, :, a:a + h, bb:bb + w]
    del y
    _fix_borders(out, (expand_pattern(total, h, w) - inside.repeat(1, h, w)).to(x.dtype))
    if prev is not None:
        _add_memory_taps(out, prev, w3, pattern)
    if ctx.collect and conv.memory_frames:
        ctx.put(_memory_tail(up, x, prev, conv.memory_frames))
    return out


def _fix_borders(out: torch.Tensor, delta: torch.Tensor) -> None:
    """Add `delta` [O, 2h, 2w] (zero except on the first/last rows and columns) to every frame of `out`."""
    out[:, :, :, 0] += delta[:, None, 0]
    out[:, :, :, -1] += delta[:, None, -1]
    out[:, :, :, 1:-1, 0] += delta[:, None, 1:-1, 0]
    out[:, :, :, 1:-1, -1] += delta[:, None, 1:-1, -1]


def _add_memory_taps(out: torch.Tensor, prev: torch.Tensor, w3: torch.Tensor, pattern: torch.Tensor) -> None:
    """Output frame j < k_t - 1 of a later slice reads memory frames j.. through taps 0..k_t-2-j: add them at
    full resolution, and take back the bias those taps were credited with above."""
    kt = w3.shape[2]
    m = prev.shape[2]  # = k_t - 1
    for j in range(min(out.shape[2], kt - 1)):
        taps = range(kt - 1 - j)
        frames = prev[:, :, j + m - (kt - 1):]  # memory frames read by output j: the last k_t-1-j of them
        weight = torch.cat([w3[:, :, k] for k in taps], dim=1)
        src = torch.cat([frames[:, :, k] for k in taps], dim=1)
        credited = expand_pattern(pattern[list(taps)].sum(0), *(n // 2 for n in out.shape[-2:])).to(out.dtype)
        out[:, :, j] += F.conv2d(src, weight, padding=1) - credited


def _memory_tail(up, x: torch.Tensor, prev: Optional[torch.Tensor], frames: int) -> torch.Tensor:
    """The last `frames` frames of the plain conv's padded input: shuffled upscale of the slice's last
    frames, preceded by the history (memory, or copies of frame 0) when the slice is shorter."""
    last = x[:, :, -frames:]
    b, i, f, h, w = last.shape
    weight = up.upscale_conv.weight.reshape(-1, i)  # a 1×1×1 conv is a matmul over channels
    u = torch.addmm(up.upscale_conv.bias, last.permute(0, 2, 3, 4, 1).reshape(-1, i), weight.t())
    c = weight.shape[0] // 4
    u = u.view(b, f, h, w, 2, 2, c).permute(0, 6, 1, 2, 4, 3, 5).reshape(b, c, f, 2 * h, 2 * w)
    if f < frames:
        before = prev[:, :, f - frames:] if prev is not None else u[:, :, :1].expand(-1, -1, frames - f, -1, -1)
        u = torch.cat([before, u], dim=2)
    return u.contiguous()
