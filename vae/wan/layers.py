"""Building blocks of the Wan-family causal VAE, each with an image path and a streaming video path.

Every block takes either a 4-D tensor [N, C, H, W] (a single frame: the exact T = 1 fold, no cache)
or a 5-D tensor [B, C, T, H, W] plus a `WanPassContext` carrying the causal cache between steps.
Why two paths: with T = 1 the causal zero padding makes every 3x3x3 conv a 3x3 conv with the last
temporal tap, and the time-only convs never run, so images need a third of the MACs.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..accel.switches import FastPaths
from ..norms import rms_norm_silu
from ..accel.tensor_layout import channels_last_format, memory_format_of
from ..accel.kernels.conv_guard import conv3d as guarded_conv3d
from .pieces import CONTEXT_FREE, WanPassContext

CACHE_FRAMES = 2  # history a k_t = 3 causal conv needs


WAN_FAST = FastPaths()
"""The Wan family's default fast paths (channels-last pays on CPU oneDNN and GPUs alike)."""

WAN_FAST_FIELDS = ("image_path", "head_taps", "sdpa", "channels_last", "inplace_residual", "single_buffer")
"""The `FastPaths` fields the Wan blocks read."""


"""Wan's steps run `WanPassContext` (vae/wan/pieces.py: the base pass context and the pieces its fast paths
choose). Every cache tensor holds the conv's whole history (`time_history` frames; a history shorter than that, such as a folded
one-frame first slice's, is zero-padded in front: causal padding is zeros), so its shape is fixed from the first
slice on. A temporal upsampler's "started" state is "not the first slice": every step runs every block; with a
`shard`, attention computes this band's query rows, then gathers."""


class RMSNorm(nn.Module):
    """Wan's per-pixel L2 norm over channels (x / ||x|| * sqrt(C) * gamma); gamma keeps the checkpoint shape."""

    def __init__(self, dim: int, gamma_dims: int = 3):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(dim, *([1] * gamma_dims)))

    def forward(self, x: torch.Tensor, silu: bool = True, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        gamma = self.gamma.reshape(-1, *([1] * (x.ndim - 2)))
        return rms_norm_silu(x, gamma, silu=silu, out=out)


def norm_conv(norm: RMSNorm, conv: "CausalConv3d", x: torch.Tensor, ctx: WanPassContext) -> torch.Tensor:
    """conv(SiLU(norm(x))), as the pass's `norm_conv` piece runs it (vae/wan/pieces.py)."""
    return ctx.pieces.norm_conv(norm, conv, x, ctx)


def pass_format(x: torch.Tensor, ctx: Optional[WanPassContext]) -> torch.memory_format:
    """A clip-path conv's memory format: channels-last 3-D when the pass runs channels-last (the weights are
    stored so: the kernel reads the parameter itself), else `x`'s own."""
    return ctx.pieces.memory_format if ctx is not None else memory_format_of(x)


def packed(weight: torch.Tensor, fmt: torch.memory_format, ctx: Optional[WanPassContext]) -> torch.Tensor:
    """`weight` (a parameter or a view of one) packed in `fmt`: itself when stored so, else a copy for this
    conv only (in the pass's scratch). Nothing is kept: the parameter is the only resident copy."""
    return ctx.scratch.packed(weight, fmt) if ctx is not None else weight.contiguous(memory_format=fmt)


class CausalConv3d(nn.Conv3d):
    """Conv3d with zero causal padding in time (k_t - 1 frames of history) and symmetric spatial padding.

    The weight keeps the checkpoint's shape [O, I, kt, kh, kw] but is stored channels-last (`WanVAE`
    lays it out at load); `image()` runs the 2-D fold on a view of the last temporal tap.
    """

    def __init__(self, cin: int, cout: int, kernel: int | tuple[int, int, int], stride=1,
                 padding: int | tuple[int, int, int] = 0):
        super().__init__(cin, cout, kernel, stride=stride, padding=0)
        pad = (padding,) * 3 if isinstance(padding, int) else tuple(padding)
        self.time_history = 2 * pad[0]
        self.pad_hw = (pad[1], pad[2])

    # -- image ---------------------------------------------------------------------------------
    def image(self, x: torch.Tensor, ctx: Optional[WanPassContext] = None) -> torch.Tensor:
        weight = packed(self.weight[:, :, -1], memory_format_of(x), ctx)
        return F.conv2d(x, weight, self.bias, self.stride[1:], self.pad_hw)

    # -- video ---------------------------------------------------------------------------------
    def video(self, x: torch.Tensor, ctx: Optional[WanPassContext],
              fmt_ctx: Optional[WanPassContext] = None) -> torch.Tensor:
        """Causal conv over a chunk; with a context, the last input frames are kept as next step's history.
        `fmt_ctx`: the pass whose memory format and scratch a context-free call (no history) uses."""
        fmt_ctx = ctx if ctx is not None else fmt_ctx
        fmt = pass_format(x, fmt_ctx)
        weight = packed(self.weight, fmt, fmt_ctx)
        if self.time_history == 0:
            return guarded_conv3d(x.contiguous(memory_format=fmt), weight, self.bias, self.stride, (0, *self.pad_hw))
        hist = ctx.take() if ctx is not None else None
        shortcut = None
        if hist is None:  # a first slice: the pass's shortcuts that skip the causal padding's taps, if one applies
            shortcuts = ctx.pieces.first_slice_convs if ctx is not None else CONTEXT_FREE
            shortcut = next((s for s in shortcuts if s.applies(self, x)), None)
        if shortcut is not None:  # it keeps its own history (only a conv without history is handed `fmt_ctx`)
            return shortcut.run(self, x, ctx)
        n_hist = 0 if hist is None else hist.shape[2]
        parts = [x]
        if n_hist:
            parts.insert(0, hist)
        if n_hist < self.time_history:
            parts.insert(0, self.zeros_like_frames(x, self.time_history - n_hist, fmt))
        xin = (torch.cat(parts, dim=2) if len(parts) > 1 else x).contiguous(memory_format=fmt)
        out = guarded_conv3d(xin, weight, self.bias, self.stride, (0, *self.pad_hw))
        if ctx is not None and ctx.collect:
            ctx.put(xin[:, :, -self.time_history:].clone(), self)
        return out

    # -- the first slice's shortcuts (vae/pieces.py `FirstSliceKernels`) ------------------------------
    def fold_applies(self, x: torch.Tensor) -> bool:
        return x.shape[2] == 1

    def fold_forward(self, x: torch.Tensor, ctx: Optional[WanPassContext]) -> torch.Tensor:
        """A lone first frame: the 2-D conv of the last temporal tap (`image`); the history kept is the folded
        frame behind a zero-padded one (`skip` says why it is padded)."""
        out = self.image(x[:, :, 0], ctx).unsqueeze(2)
        if ctx is not None and ctx.collect:
            fmt = pass_format(x, ctx)
            ctx.put(torch.cat([self.zeros_like_frames(x, self.time_history - 1, fmt), x], dim=2).clone(), self)
        return out

    def head_taps_forward(self, x: torch.Tensor, ctx: WanPassContext) -> torch.Tensor:
        """A first slice of T >= 2 frames through `head_taps`; the history kept is the slice's last frames."""
        fmt = pass_format(x, ctx)
        out = self.head_taps(x.contiguous(memory_format=fmt), ctx, fmt)
        if ctx.collect:
            ctx.put(x[:, :, -self.time_history:].clone(), self)
        return out

    def padded_input(self, x: torch.Tensor, ctx: WanPassContext) -> torch.Tensor:
        """After the first slice, for a conv with history: this conv's padded input for `x`, [B, C, history + T,
        H, W] in the pass's layout, with the causal history (taken from the cache now) written in front and the
        frames slot (`[:, :, time_history:]`) left for the producer to fill; run it with `video_padded`."""
        hist = ctx.take()
        fmt = pass_format(x, ctx)
        b, c, t, h, w = x.shape
        padded = torch.empty((b, c, self.time_history + t, h, w), dtype=x.dtype, device=x.device, memory_format=fmt)
        n_hist = hist.shape[2]
        if n_hist < self.time_history:
            padded[:, :, :self.time_history - n_hist].zero_()
        padded[:, :, self.time_history - n_hist:self.time_history] = hist
        return padded

    def video_padded(self, padded: torch.Tensor, ctx: WanPassContext) -> torch.Tensor:
        """The causal conv of a `padded_input` whose frames slot is filled: `video` without its concatenation."""
        out = guarded_conv3d(padded, packed(self.weight, pass_format(padded, ctx), ctx), self.bias, self.stride,
                             (0, *self.pad_hw))
        if ctx.collect:
            ctx.put(padded[:, :, -self.time_history:].clone(), self)
        return out

    def head_taps_apply(self, x: torch.Tensor) -> bool:
        return (x.shape[2] >= 2 and self.time_history == 2 and self.kernel_size[0] == 3 and self.stride[0] == 1
                and self.dilation[0] == 1)

    def head_taps(self, x: torch.Tensor, ctx: WanPassContext, fmt: torch.memory_format) -> torch.Tensor:
        """First slice, T >= 2: the causal padding is two zero frames, so output 0 reads only tap 2 (frame 0)
        and output 1 taps 1 and 2 (frames 0, 1); the rest is a valid conv3d over the unpadded input. 3 frame-taps
        fewer than the padded conv (a third of a 3-frame slice's work), no padded copy, and the head is 2-D
        convs (which oneDNN takes at sizes where a batch-1 conv3d falls to PyTorch's reference kernel)."""
        b, c, t, h, w = x.shape
        fmt2 = channels_last_format(4) if fmt == torch.channels_last_3d else torch.contiguous_format
        first_two = x[:, :, :2].permute(2, 0, 1, 3, 4).reshape(2 * b, c, h, w).contiguous(memory_format=fmt2)  # frame-major
        # Tap 2 (the image fold's conv) for frames 0 and 1 in one call, then tap 1 of frame 0 into output 1.
        # `packed` reuses one scratch buffer, so each tap's weight is used before the next is packed.
        heads = self.image(first_two, ctx).unflatten(0, (2, b))  # [2, B, O, h', w']
        heads[1] += F.conv2d(first_two[:b], packed(self.weight[:, :, 1], fmt2, ctx), None, self.stride[1:],
                             self.pad_hw)
        out = torch.empty((b, heads.shape[2], t, *heads.shape[-2:]), dtype=heads.dtype, device=heads.device,
                          memory_format=fmt)
        out[:, :, :2] = heads.permute(1, 2, 0, 3, 4)
        del heads
        if t > 2:
            out[:, :, 2:] = guarded_conv3d(x, packed(self.weight, fmt, ctx), self.bias, self.stride,
                                           (0, *self.pad_hw))
        return out

    def skip(self, x: torch.Tensor, ctx: WanPassContext) -> None:
        """This conv does not run on this (first) slice: its memory is an all-zero history, the causal padding
        it would have read, so that every step's memory has the same tensors of the same shapes."""
        if ctx.collect:
            ctx.put(self.zeros_like_frames(x, self.time_history, pass_format(x, ctx)), self)

    @staticmethod
    def zeros_like_frames(x: torch.Tensor, frames: int, fmt: torch.memory_format) -> torch.Tensor:
        """`frames` zero frames shaped like `x`'s in `fmt`: causal padding."""
        shape = (x.shape[0], x.shape[1], frames, *x.shape[3:])
        return torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=fmt).zero_()

    def forward(self, x: torch.Tensor, ctx: Optional[WanPassContext] = None) -> torch.Tensor:
        return self.image(x, ctx) if x.ndim == 4 else self.video(x, ctx)


def _conv2d_any(conv: nn.Conv2d, x: torch.Tensor, ctx: Optional[WanPassContext], padding=None) -> torch.Tensor:
    """A 2-D conv applied per frame; 5-D inputs use a (1, kh, kw) conv3d so frames are not copied into the batch."""
    pad = conv.padding if padding is None else padding
    if x.ndim == 4:
        return F.conv2d(x, packed(conv.weight, memory_format_of(x), ctx), conv.bias, conv.stride, pad)
    fmt = pass_format(x, ctx)
    weight = packed(conv.weight.unsqueeze(2), fmt, ctx)
    return guarded_conv3d(x.contiguous(memory_format=fmt), weight, conv.bias, (1, *conv.stride), (0, *pad))


class ResidualBlock(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.norm1 = RMSNorm(cin)
        self.conv1 = CausalConv3d(cin, cout, 3, padding=1)
        self.norm2 = RMSNorm(cout)
        self.conv2 = CausalConv3d(cout, cout, 3, padding=1)
        self.conv_shortcut = CausalConv3d(cin, cout, 1) if cin != cout else None

    def forward(self, x: torch.Tensor, ctx: WanPassContext) -> torch.Tensor:
        h = self.conv_shortcut(x, ctx) if self.conv_shortcut is not None else x
        y = norm_conv(self.norm1, self.conv1, x, ctx)
        y = norm_conv(self.norm2, self.conv2, y, ctx)
        return ctx.pieces.add_residual(y, h)


class AttentionBlock(nn.Module):
    """Single-head self-attention over the pixels of each frame (head dim = C)."""

    def __init__(self, dim: int):
        super().__init__()
        self.norm = RMSNorm(dim, gamma_dims=2)
        self.to_qkv = nn.Conv2d(dim, dim * 3, 1)
        self.proj = nn.Conv2d(dim, dim, 1)

    def forward(self, x: torch.Tensor, ctx: WanPassContext) -> torch.Tensor:
        if x.ndim == 5:
            b, c, t, h, w = x.shape
            frames = x.transpose(1, 2).reshape(b * t, c, h, w)
            return self._attend(frames, ctx).reshape(b, t, c, h, w).transpose(1, 2)
        return self._attend(x, ctx)

    def _attend(self, x: torch.Tensor, ctx: WanPassContext) -> torch.Tensor:
        n, c, h, w = x.shape
        tokens = self.norm(x, silu=False).flatten(2).transpose(1, 2)  # [N, HW, C]
        if ctx.shard is not None:
            return self._attend_band(x, tokens, ctx)
        qkv = F.linear(tokens, self.to_qkv.weight.view(3 * c, c), self.to_qkv.bias)
        q, k, v = qkv.unsqueeze(1).chunk(3, dim=-1)  # [N, 1, HW, C] each
        a = ctx.pieces.attend(q, k, v)
        out = F.linear(a.squeeze(1), self.proj.weight.view(c, c), self.proj.bias)  # [N, HW, C]
        return ctx.pieces.add_residual(ctx.pieces.tokens_to_frames(out, n, h, w), x)


    def _attend_band(self, x: torch.Tensor, tokens: torch.Tensor, ctx: WanPassContext) -> torch.Tensor:
        """Every rank holds the whole latent frame: keys/values from all of it, queries from this band's rows
        only (the attention work divides), then the bands' outputs are gathered back into the whole frame."""
        n, c, h, w = x.shape
        lo, hi, _ = ctx.shard.rows(x)
        weight, bias = self.to_qkv.weight.view(3 * c, c), self.to_qkv.bias
        q = F.linear(tokens[:, lo * w:hi * w], weight[:c], bias[:c]).unsqueeze(1)
        k, v = F.linear(tokens, weight[c:], bias[c:]).unsqueeze(1).chunk(2, dim=-1)
        a = ctx.pieces.attend(q, k, v)
        out = F.linear(a.squeeze(1), self.proj.weight.view(c, c), self.proj.bias)  # [N, band HW, C]
        out = out.transpose(1, 2).reshape(n, c, hi - lo, w) + x[:, :, lo:hi]
        whole = ctx.shard.gather_rows(out)
        return whole.contiguous(memory_format=ctx.pieces.frame_format)


class MidBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.resnets = nn.ModuleList([ResidualBlock(dim, dim), ResidualBlock(dim, dim)])
        self.attentions = nn.ModuleList([AttentionBlock(dim)])

    def forward(self, x: torch.Tensor, ctx: WanPassContext) -> torch.Tensor:
        x = self.resnets[0](x, ctx)
        x = self.attentions[0](x, ctx)
        return self.resnets[1](x, ctx)


def interleave_time(x: torch.Tensor) -> torch.Tensor:
    """[B, 2C, T, H, W] -> [B, C, 2T, H, W]: channels [0, C) become frame 2t, [C, 2C) frame 2t+1."""
    b, c2, t, h, w = x.shape
    return x.reshape(b, 2, c2 // 2, t, h, w).permute(0, 2, 3, 1, 4, 5).reshape(b, c2 // 2, 2 * t, h, w)


class Resample(nn.Module):
    """Spatial 2x down/up sampling, plus the causal time conv for the *3d modes.

    downsample3d keeps frame 0 and halves the rest with a stride-2 time conv (so 1+2k -> 1+k frames);
    upsample3d keeps frame 0 and doubles the rest (1+k -> 1+2k), its time conv starting with zero history.
    """

    def __init__(self, dim: int, mode: str, up_out: Optional[int] = None):
        super().__init__()
        self.mode = mode
        if mode.startswith("up"):
            conv = nn.Conv2d(dim, up_out if up_out is not None else dim // 2, 3, padding=1)
        else:
            conv = nn.Conv2d(dim, dim, 3, stride=2)
        self.resample = nn.Sequential(nn.Identity(), conv)
        if mode == "upsample3d":
            self.time_conv = CausalConv3d(dim, dim * 2, (3, 1, 1), padding=(1, 0, 0))
        elif mode == "downsample3d":
            self.time_conv = CausalConv3d(dim, dim, (3, 1, 1), stride=(2, 1, 1))
        else:
            self.time_conv = None

    def forward(self, x: torch.Tensor, ctx: WanPassContext) -> torch.Tensor:
        if self.mode.startswith("up"):
            if self.time_conv is not None and x.ndim == 5:
                x = self._time_up(x, ctx)
            scale = (2.0, 2.0) if x.ndim == 4 else (1.0, 2.0, 2.0)
            x = F.interpolate(x, scale_factor=scale, mode="nearest")
            return _conv2d_any(self.resample[1], x, ctx)
        x = F.pad(x, (0, 1, 0, 1))
        x = _conv2d_any(self.resample[1], x, ctx, padding=(0, 0))
        if self.time_conv is not None and x.ndim == 5:
            x = self._time_down(x, ctx)
        return x

    def _time_up(self, x: torch.Tensor, ctx: WanPassContext) -> torch.Tensor:
        if not ctx.first:
            return interleave_time(self.time_conv.video(x, ctx))
        if x.shape[2] == 1:
            self.time_conv.skip(x, ctx)
            return x
        rest = interleave_time(self.time_conv.video(x[:, :, 1:], ctx))
        return torch.cat([x[:, :, :1], rest], dim=2)

    def _time_down(self, x: torch.Tensor, ctx: WanPassContext) -> torch.Tensor:
        prev = ctx.take()
        t = x.shape[2]
        if prev is None:
            if t % 2 != 1:
                raise ValueError(f"a causal encode stream must start with 1+4k frames (got {t} at a time downsample)")
            out = x[:, :, :1] if t == 1 else torch.cat([x[:, :, :1], self.time_conv.video(x, None, ctx)], dim=2)
        else:
            if t % 2:
                raise ValueError(f"after the first step an encode stream takes 4k frames (got {t} at a time downsample)")
            out = self.time_conv.video(torch.cat([prev, x], dim=2), None, ctx)
        if ctx.collect:
            ctx.put(x[:, :, -1:].clone(), self)
        return out


# --------------------------------------------------------------------------------------------
# Wan 2.2: residual-of-residual blocks with parameter-free shortcuts
# --------------------------------------------------------------------------------------------
def avg_down(x: torch.Tensor, cout: int, factor_t: int, factor_s: int) -> torch.Tensor:
    """Space/time-to-channel then group mean; a chunk of odd length is front-padded with zero frames
    (the stream always starts with 1+2k frames, so frame 0 is paired with a zero frame)."""
    b, c, t, h, w = x.shape
    pad_t = (factor_t - t % factor_t) % factor_t
    if pad_t:
        x = F.pad(x, (0, 0, 0, 0, pad_t, 0))
        t += pad_t
    x = x.reshape(b, c, t // factor_t, factor_t, h // factor_s, factor_s, w // factor_s, factor_s)
    x = x.permute(0, 1, 3, 5, 7, 2, 4, 6).reshape(b, c * factor_t * factor_s * factor_s, t // factor_t,
                                                 h // factor_s, w // factor_s)
    group = x.shape[1] // cout
    return x.reshape(b, cout, group, *x.shape[2:]).mean(dim=2)


def dup_up(x: torch.Tensor, cout: int, factor_t: int, factor_s: int, first: bool) -> torch.Tensor:
    """Channel-to-space/time duplication (inverse layout of avg_down); the stream's first step drops the
    first factor_t - 1 frames so that latent frame 0 maps to one frame."""
    b, c, t, h, w = x.shape
    factor = factor_t * factor_s * factor_s
    x = x.repeat_interleave(cout * factor // c, dim=1)
    x = x.reshape(b, cout, factor_t, factor_s, factor_s, t, h, w).permute(0, 1, 5, 2, 6, 3, 7, 4)
    x = x.reshape(b, cout, t * factor_t, h * factor_s, w * factor_s)
    return x[:, :, factor_t - 1:] if first and factor_t > 1 else x


class DownResidualBlock(nn.Module):
    def __init__(self, cin: int, cout: int, num_res: int, temporal: bool, down: bool):
        super().__init__()
        self.cout = cout
        self.factor_t = 2 if temporal else 1
        self.factor_s = 2 if down else 1
        self.resnets = nn.ModuleList([ResidualBlock(cin if i == 0 else cout, cout) for i in range(num_res)])
        self.downsampler = Resample(cout, "downsample3d" if temporal else "downsample2d") if down else None

    def shortcut(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim == 4:
            return avg_down(x.unsqueeze(2), self.cout, self.factor_t, self.factor_s).squeeze(2)
        return avg_down(x, self.cout, self.factor_t, self.factor_s)

    def forward(self, x: torch.Tensor, ctx: WanPassContext) -> torch.Tensor:
        h = x
        for r in self.resnets:
            h = r(h, ctx)
        if self.downsampler is not None:
            h = self.downsampler(h, ctx)
        return ctx.pieces.add_residual(h, self.shortcut(x))


class UpResidualBlock(nn.Module):
    def __init__(self, cin: int, cout: int, num_res: int, temporal: bool, up: bool):
        super().__init__()
        self.cout = cout
        self.factor_t = 2 if temporal else 1
        self.up = up
        self.resnets = nn.ModuleList([ResidualBlock(cin if i == 0 else cout, cout) for i in range(num_res + 1)])
        self.upsampler = Resample(cout, "upsample3d" if temporal else "upsample2d", up_out=cout) if up else None

    def shortcut(self, x: torch.Tensor, ctx: WanPassContext) -> torch.Tensor:
        if x.ndim == 4:
            return dup_up(x.unsqueeze(2), self.cout, self.factor_t, 2, True).squeeze(2)
        return dup_up(x, self.cout, self.factor_t, 2, ctx.first)

    def forward(self, x: torch.Tensor, ctx: WanPassContext) -> torch.Tensor:
        h = x
        for r in self.resnets:
            h = r(h, ctx)
        if not self.up:
            return h
        h = self.upsampler(h, ctx)
        return ctx.pieces.add_residual(h, self.shortcut(x, ctx))


class UpBlock(nn.Module):
    """Wan 2.1 decoder stage: ResBlocks then an optional Resample (kept in a list for the key layout)."""

    def __init__(self, cin: int, cout: int, num_res: int, mode: Optional[str]):
        super().__init__()
        self.resnets = nn.ModuleList([ResidualBlock(cin if i == 0 else cout, cout) for i in range(num_res + 1)])
        self.upsamplers = nn.ModuleList([Resample(cout, mode)]) if mode else None

    def forward(self, x: torch.Tensor, ctx: WanPassContext) -> torch.Tensor:
        for r in self.resnets:
            x = r(x, ctx)
        if self.upsamplers is not None:
            x = self.upsamplers[0](x, ctx)
        return x
