"""SeedVR2 building blocks: causal 3-D conv with an explicit cache, resnet, mid attention, resamplers.

Every layer takes `(x, ctx)`; `ctx` (a `SeedVR2PassContext`) carries the switchable fast paths and the
causal cache of the previous temporal slice as a flat list of tensors (read in execution order,
the new cache appended in the same order), so a whole encode/decode step is a pure function of
(input slice, previous cache) that can be traced for export. Module attribute names reproduce the
released checkpoint's keys exactly.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..base import PassContext
from ..accel.tensor_layout import memory_format_of
from ..norms import group_norm_silu
from ..accel.kernels.conv_guard import conv3d as guarded_conv3d
from . import layerwise, subpixel
from .layerwise import SplitPolicy
from .pieces import SeedVR2Pieces
from .shuffle import pixel_shuffle_3d
from ..accel.switches import FastPaths


class SeedVR2PassContext(PassContext):
    """The base pass context (vae/base.py) plus SeedVR2's layer-wise split: `split` runs every layer with
    tile-bounded working memory (exact tiling; its `shard` is the context's), `pieces` how its fast paths run
    (vae/seedvr2/pieces.py, chosen here once from `fast`, the model's active paths, and the inference mode).
    `collect` defaults to False here (a whole clip in one step), as SeedVR2's callers have always relied on.

    On the first slice (`cache_in` None) causal convs replicate the first frame as head padding and
    temporal upsamplers drop the duplicated first frame, as the reference does outside its ACTIVE
    state. Otherwise `cache_in` must be exactly the tuple a previous step returned (see `cache_layout`).
    """

    def __init__(self, fast: FastPaths, cache_in: Optional[Sequence[torch.Tensor]] = None, collect: bool = False,
                 split: Optional["SplitPolicy"] = None):
        super().__init__(fast, cache_in, collect, shard=split.shard if split is not None else None)
        self.split = split  # exact tiling: run layer by layer with tile-bounded working memory
        self.pieces = SeedVR2Pieces.of(fast, torch.is_inference_mode_enabled())
        # what the decoder's last conv applies to its output (the clamp of a decode step), band by band under `split`
        self.finish_output: Optional[Callable[[torch.Tensor], torch.Tensor]] = None

    def clamp_output(self) -> None:
        """The decoder's last conv clamps its output to [-1, 1] (the pipelines' final clamp)."""
        self.finish_output = _clamp_in_place if self.pieces.in_place else _clamp

    @property
    def memory_format(self) -> torch.memory_format:
        """The layout of this pass's 5-D activations (its convs' inputs and outputs)."""
        return self.pieces.memory_format

    def image(self, x: torch.Tensor) -> bool:
        """True when the T=1 conv2d path applies (first slice, one frame)."""
        return self.image_frames(x.shape[2])

    def image_frames(self, frames: int) -> bool:
        """`image` for an input of `frames` frames."""
        return self.pieces.fold_images and self.first and frames == 1


def _clamp(y: torch.Tensor) -> torch.Tensor:
    return y.clamp(-1.0, 1.0)


def _clamp_in_place(y: torch.Tensor) -> torch.Tensor:
    return y.clamp_(-1.0, 1.0)


class CausalConv3d(nn.Conv3d):
    """Conv3d, causal in time: the head is padded with copies of frame 0 (first slice) or with the
    previous slice's last `kernel_t - stride_t` padded input frames; nothing is added at the tail.

    `pad_right_bottom` zero-pads one extra row/column (the encoder's stride-2 downsamplers); the
    pad is written into the same buffer as the temporal head.
    """

    def __init__(self, cin: int, cout: int, kernel: tuple[int, int, int], stride: tuple[int, int, int] = (1, 1, 1),
                 padding: tuple[int, int, int] = (1, 1, 1), pad_right_bottom: bool = False):
        super().__init__(cin, cout, kernel, stride=stride, padding=(0, padding[1], padding[2]))
        self.head_frames = 2 * padding[0]
        self.cache_frames = max(kernel[0] - stride[0], 0)
        self.pad_right_bottom = pad_right_bottom

    def folded_weight(self) -> torch.Tensor:
        """Sum of the temporal taps (in fp32): at T=1 every window sees [f0]*k_t, so conv3d == conv2d(Σ taps).

        Made for this call and freed after it (a third of this layer's weight): the parameters are the
        only resident copy of the weights (`vae/accel/weight_layout.py` says why)."""
        return tap_sum(self.weight)

    def forward(self, x: torch.Tensor, ctx: SeedVR2PassContext) -> torch.Tensor:
        if ctx.split is not None:
            return layerwise.causal_conv(self, x, ctx, ctx.split)
        # The pass's layout for every conv: the step's input arrives contiguous (the first conv lays it out), and a
        # conv that took ATen's reference kernel (small shapes) returns contiguous memory. Exact tiling and the
        # multi-device pass (`split`, above) keep the input's layout, so both run the same kernels.
        x = x.contiguous(memory_format=ctx.memory_format)
        if ctx.first:  # the pass's shortcuts that skip the replicate padding's taps, if one applies
            shortcut = next((s for s in ctx.pieces.first_slice_convs if s.applies(self, x)), None)
            if shortcut is not None:
                return shortcut.run(self, x, ctx)
        prev = ctx.take() if self.cache_frames else None
        padded = ctx.pieces.padding.pad(self, x, prev, ctx.memory_format)
        if self.cache_frames and ctx.collect:
            ctx.put(ctx.pieces.padding.keep(padded[:, :, -self.cache_frames:]), self)
        return guarded_conv3d(padded, self.weight, self.bias, self.stride, self.padding)

    def head_taps_apply(self, x: torch.Tensor) -> bool:
        return (self.kernel_size[0] == 3 and self.stride[0] == 1 and self.head_frames == 2
                and not self.pad_right_bottom and x.shape[2] >= 2)

    def head_taps_forward(self, x: torch.Tensor, ctx: SeedVR2PassContext) -> torch.Tensor:
        """First slice, T >= 2: the head windows are [f0,f0,f0] and [f0,f0,f1], so output 0 is
        conv2d(f0, w0+w1+w2) and output 1 is conv2d(f0, w0+w1) + conv2d(f1, w2); the rest is a plain
        valid conv3d over the input. 3 instead of 6 frame-taps for the head, and no padded copy."""
        cout, t = self.out_channels, x.shape[2]
        sp_stride, sp_pad = self.stride[1:], self.padding[1:]
        # The pair's weights and the last tap are made for this call only (see `folded_weight`).
        w = self.weight
        first_two = w[:, :, 0].float() + w[:, :, 1].float()  # = w[:, :, :2].float().sum(2), at memory speed
        pair_w = torch.cat([first_two + w[:, :, 2].float(), first_two]).to(w.dtype)
        del first_two
        pair_b = torch.cat([self.bias, torch.zeros_like(self.bias)])
        heads = F.conv2d(x[:, :, 0], pair_w, pair_b, sp_stride, sp_pad)
        del pair_w
        fmt = ctx.memory_format
        last = w[:, :, 2].contiguous(memory_format=ctx.pieces.frame_format)
        second = F.conv2d(x[:, :, 1], last, self.bias, sp_stride, sp_pad).add_(heads[:, cout:])
        del last
        out = torch.empty((x.shape[0], cout, t, *heads.shape[-2:]), dtype=heads.dtype, device=heads.device,
                          memory_format=fmt)
        out[:, :, 0] = heads[:, :cout]
        out[:, :, 1] = second
        if t > 2:
            out[:, :, 2:] = guarded_conv3d(x, self.weight, self.bias, self.stride, self.padding)
        if self.cache_frames and ctx.collect:
            ctx.put(x[:, :, -self.cache_frames:].clone(memory_format=fmt), self)  # one compact copy
        return out

    def _head(self, prev: Optional[torch.Tensor]) -> int:
        return prev.shape[2] if prev is not None else self.head_frames

    def write_padded(self, x: torch.Tensor, prev: Optional[torch.Tensor], fmt: torch.memory_format) -> torch.Tensor:
        """The padded input in one buffer of layout `fmt`: head (previous frames, or frame 0 replicated), `x`,
        and the right/bottom zero pad, each written once."""
        head = self._head(prev)
        if head == 0 and not self.pad_right_bottom:
            return x.contiguous(memory_format=fmt) if fmt == torch.channels_last_3d else x
        b, c, t, h, w = x.shape
        e = 1 if self.pad_right_bottom else 0
        buf = torch.empty((b, c, head + t, h + e, w + e), dtype=x.dtype, device=x.device, memory_format=fmt)
        if e:
            buf[:, :, head:, h:, :].zero_()
            buf[:, :, head:, :h, w:].zero_()
        buf[:, :, head:, :h, :w].copy_(x)
        if prev is not None:
            buf[:, :, :head].copy_(prev)
        elif head:
            buf[:, :, :head].copy_(buf[:, :, head:head + 1].expand(-1, -1, head, -1, -1))
        return buf

    def cat_padded(self, x: torch.Tensor, prev: Optional[torch.Tensor]) -> torch.Tensor:
        """The reference's order of copies: pad, then concatenate the head."""
        if self.pad_right_bottom:
            x = F.pad(x, (0, 1, 0, 1))
        if prev is not None:
            return torch.cat([prev, x], dim=2)
        if self.head_frames:
            return torch.cat([x[:, :, :1].repeat(1, 1, self.head_frames, 1, 1), x], dim=2)
        return x

    # -- the first slice's shortcuts (vae/pieces.py `FirstSliceKernels`) ------------------------------
    def fold_applies(self, x: torch.Tensor) -> bool:
        """T = 1 with replicate padding of k_t - 1 frames: every window is [f0] * k_t."""
        return x.shape[2] == 1 and self.head_frames == self.kernel_size[0] - 1

    def fold_forward(self, x: torch.Tensor, ctx: SeedVR2PassContext) -> torch.Tensor:
        """A lone first frame: conv2d with the summed taps (`folded_weight`)."""
        x2 = x[:, :, 0]
        if self.pad_right_bottom:
            x2 = F.pad(x2, (0, 1, 0, 1))
        if ctx.pieces.frame_format == torch.channels_last:
            x2 = x2.contiguous(memory_format=torch.channels_last)
        if self.cache_frames and ctx.collect:  # the padded input was [f0] * k_t; its tail is the memory
            ctx.put(x2.unsqueeze(2).expand(-1, -1, self.cache_frames, -1, -1).contiguous(), self)
        y = F.conv2d(x2, self.folded_weight(), self.bias, self.stride[1:], self.padding[1:])
        return y.unsqueeze(2)


def tap_sum(weight: torch.Tensor) -> torch.Tensor:
    """Σ of the temporal taps of a 5-D weight, accumulated in fp32 in tap order, as a contiguous 4-D weight.
    Elementwise adds of the tap views: the same values as `weight.float().sum(2)`, read at memory speed
    (a strided reduction over the tap axis took several times longer)."""
    if weight.shape[2] == 1:
        return weight[:, :, 0]  # one tap: a view of the parameter (packed already), no copy
    total = weight[:, :, 0].float() + weight[:, :, 1].float()
    for t in range(2, weight.shape[2]):
        total.add_(weight[:, :, t].float())
    return total.to(weight.dtype)


def norm_silu(norm: nn.GroupNorm, x: torch.Tensor, silu: bool = True, inplace: bool = False) -> torch.Tensor:
    return group_norm_silu(x, norm.num_groups, norm.weight, norm.bias, norm.eps, silu=silu, inplace=inplace)


def norm_silu_conv(norm: nn.GroupNorm, conv: "CausalConv3d", x: torch.Tensor, ctx: SeedVR2PassContext, *,
                   last_use: bool = False,
                   finish: Optional[Callable[[torch.Tensor], torch.Tensor]] = None) -> torch.Tensor:
    """finish(conv(SiLU(GroupNorm(x)))); under exact tiling the normalisation is fused into the conv's input bands
    (and `finish` applied band by band). `last_use`: the caller drops `x` after this, so with in-place ops on
    (`ctx.pieces.in_place`) the norm may write its result into `x`."""
    if ctx.split is not None:
        return layerwise.norm_silu_conv(norm, conv, x, ctx, ctx.split, finish=finish)
    y = conv(norm_silu(norm, x, inplace=last_use and ctx.pieces.in_place), ctx)
    return finish(y) if finish is not None else y


class ResnetBlock3D(nn.Module):
    """GN → SiLU → conv1 (3x3x3) → GN → SiLU → conv2 (3x3x3), plus a 1x1x1 shortcut when channels change."""

    def __init__(self, cin: int, cout: int, groups: int, eps: float):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, cin, eps=eps)
        self.conv1 = CausalConv3d(cin, cout, (3, 3, 3))
        self.norm2 = nn.GroupNorm(groups, cout, eps=eps)
        self.conv2 = CausalConv3d(cout, cout, (3, 3, 3))
        self.conv_shortcut = CausalConv3d(cin, cout, (1, 1, 1), padding=(0, 0, 0)) if cin != cout else None

    def forward(self, x: torch.Tensor, ctx: SeedVR2PassContext) -> torch.Tensor:
        if ctx.split is not None:
            return layerwise.resnet(self, x, ctx, ctx.split)
        h = norm_silu_conv(self.norm1, self.conv1, x, ctx)
        h = norm_silu_conv(self.norm2, self.conv2, h, ctx, last_use=True)
        skip = self.conv_shortcut(x, ctx) if self.conv_shortcut is not None else x
        return ctx.pieces.add_residual(h, skip)


class MidAttention(nn.Module):
    """Single-head self-attention over the H×W tokens of each frame (diffusers' deprecated VAE attention block)."""

    def __init__(self, channels: int, groups: int, eps: float):
        super().__init__()
        self.group_norm = nn.GroupNorm(groups, channels, eps=eps)
        self.to_q = nn.Linear(channels, channels)
        self.to_k = nn.Linear(channels, channels)
        self.to_v = nn.Linear(channels, channels)
        self.to_out = nn.ModuleList([nn.Linear(channels, channels), nn.Dropout(0.0)])

    def forward(self, x: torch.Tensor, ctx: SeedVR2PassContext) -> torch.Tensor:
        if ctx.split is not None and ctx.shard is None:  # band by band, keys and values of the whole frame
            return layerwise.attention(self, x, ctx, ctx.split)
        b, c, t, h, w = x.shape
        frames = x[:, :, 0] if t == 1 else x.transpose(1, 2).reshape(b * t, c, h, w)
        shard = ctx.shard
        if shard is None:
            tokens = norm_silu(self.group_norm, frames, silu=False).flatten(2).transpose(1, 2)
            queries = tokens
        else:  # a band of a split frame: keys/values from the gathered frame, queries from the band's rows
            lo, hi, _ = shard.rows(x)
            whole = shard.gather_rows(x)
            whole = whole[:, :, 0] if t == 1 else whole.transpose(1, 2).reshape(b * t, c, -1, w)
            tokens = norm_silu(self.group_norm, whole, silu=False).flatten(2).transpose(1, 2)
            del whole
            queries = tokens[:, lo * w:hi * w]
        q, k, v = self.to_q(queries), self.to_k(tokens), self.to_v(tokens)
        o = ctx.pieces.attend(q, k, v)
        o = ctx.pieces.add_residual(self.to_out[0](o).transpose(1, 2).reshape(b * t, c, h, w), frames)
        return o.unsqueeze(2) if t == 1 else o.view(b, t, c, h, w).transpose(1, 2)


class MidBlock3D(nn.Module):
    def __init__(self, channels: int, groups: int, eps: float):
        super().__init__()
        self.resnets = nn.ModuleList([ResnetBlock3D(channels, channels, groups, eps) for _ in range(2)])
        self.attentions = nn.ModuleList([MidAttention(channels, groups, eps)])

    def forward(self, x: torch.Tensor, ctx: SeedVR2PassContext) -> torch.Tensor:
        x = self.resnets[0](x, ctx)
        x = self.attentions[0](x, ctx)
        return self.resnets[1](x, ctx)


class Downsample3D(nn.Module):
    """Zero-pad right/bottom by one, then a stride-2 conv: k(3,3,3) s2 when time halves, else k(1,3,3) s(1,2,2)."""

    def __init__(self, channels: int, temporal: bool):
        super().__init__()
        kt, st = (3, 2) if temporal else (1, 1)
        self.conv = CausalConv3d(channels, channels, (kt, 3, 3), stride=(st, 2, 2),
                                 padding=(1 if temporal else 0, 0, 0), pad_right_bottom=True)

    def forward(self, x: torch.Tensor, ctx: SeedVR2PassContext) -> torch.Tensor:
        return self.conv(x, ctx)


class Upsample3D(nn.Module):
    """1x1x1 `upscale_conv` to C·s²·z channels, sub-pixel shuffle in space (and time), causal 3x3x3 conv.

    On the first slice of a temporal stage the reference drops output frame 1 (the z=1 copy of
    latent frame 0); the fast paths never compute or store it.
    """

    def __init__(self, channels: int, temporal: bool):
        super().__init__()
        self.zr = 2 if temporal else 1
        self.upscale_conv = nn.Conv3d(channels, channels * 4 * self.zr, kernel_size=1)
        self.conv = CausalConv3d(channels, channels, (3, 3, 3))

    def kept_half(self) -> tuple[torch.Tensor, torch.Tensor]:
        """upscale_conv rows for sub-frame z=0 only (channel index ((x·2+y)·z_r+z)·C+c), as a 2-D conv: a
        view of the weight when z_r = 1, else a copy for this call only (a 1x1 conv's rows, freed after it)."""
        w, bias = self.upscale_conv.weight, self.upscale_conv.bias
        c = w.shape[1]
        wk = w.view(4, self.zr, c, c)[:, 0].reshape(4 * c, c, 1, 1)
        bk = bias.view(4, self.zr, c)[:, 0].reshape(4 * c)
        return wk, bk

    def forward(self, x: torch.Tensor, ctx: SeedVR2PassContext) -> torch.Tensor:
        if ctx.split is not None:  # the conv's bands read the upscaled rows as they need them
            return layerwise.upsample(self, x, ctx, ctx.split)
        if self.composed_applies(x, ctx):
            return subpixel.upsample_conv(self, x, ctx)
        return self.conv(self.upscale(x, ctx), ctx)

    def composed_applies(self, x: torch.Tensor, ctx: SeedVR2PassContext) -> bool:
        """The composed low-resolution convs (vae/seedvr2/subpixel.py), where the pass runs them: whole-frame
        passes, and only where the output is large enough to pay for composing the weights."""
        if not (ctx.pieces.composed_upsampler and ctx.split is None and self.conv.kernel_size == (3, 3, 3)
                and self.conv.head_frames == 2):
            return False
        image = ctx.image(x)
        frames_out = subpixel.output_frames(self.zr, x.shape[2], first_slice=ctx.first, image=image)
        return subpixel.worth_composing(x.shape[1], 4 * frames_out * x.shape[3] * x.shape[4], 1 if image else self.zr)

    def upscale(self, x: torch.Tensor, ctx: SeedVR2PassContext) -> torch.Tensor:
        """upscale_conv + sub-pixel shuffle (pixel-local, so exact tiling runs it per tile)."""
        drop_head = self.zr == 2 and ctx.first
        if ctx.image(x):
            wk, bk = self.kept_half()
            u = F.conv2d(x[:, :, 0], wk, bk)
            b, _, h, w = u.shape
            c = u.shape[1] // 4
            y = u.view(b, 2, 2, c, h, w).permute(0, 3, 4, 1, 5, 2).reshape(b, c, 1, h * 2, w * 2)
        else:
            y = ctx.pieces.shuffle(self, guarded_conv3d(x, self.upscale_conv.weight, self.upscale_conv.bias), drop_head)
        return y

    def shuffle_reference(self, u: torch.Tensor, drop_head: bool) -> torch.Tensor:
        """The reference's sub-pixel rearrange of `upscale_conv`'s output, then the dropped head cut out."""
        y = pixel_shuffle_3d(u, 2, self.zr)
        return torch.cat([y[:, :, :1], y[:, :, 2:]], dim=2) if drop_head else y

    def shuffle_into_output(self, u: torch.Tensor, drop_head: bool) -> torch.Tensor:
        """The same shuffle as views copied straight into the output, the dropped head never written."""
        b, ch, f, h, w = u.shape
        zr, c = self.zr, ch // (4 * self.zr)
        uv = u.view(b, 2, 2, zr, c, f, h, w)
        out = torch.empty((b, c, f * zr - int(drop_head), 2 * h, 2 * w), dtype=u.dtype, device=u.device,
                          memory_format=memory_format_of(u))

        def frames_view(t: torch.Tensor, n: int) -> torch.Tensor:  # [b, c, n*zr, 2h, 2w] -> [b, c, n, zr, h, 2, w, 2]
            return t.unflatten(2, (n, zr)).unflatten(4, (h, 2)).unflatten(6, (w, 2))

        if drop_head:
            out[:, :, 0].unflatten(2, (h, 2)).unflatten(4, (w, 2)).copy_(uv[:, :, :, 0, :, 0].permute(0, 3, 4, 1, 5, 2))
            if f > 1:
                frames_view(out[:, :, 1:], f - 1).copy_(uv[:, :, :, :, :, 1:].permute(0, 4, 5, 3, 6, 1, 7, 2))
        else:
            frames_view(out, f).copy_(uv.permute(0, 4, 5, 3, 6, 1, 7, 2))
        return out
