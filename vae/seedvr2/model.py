"""`SeedVR2VAE`: the SeedVR2 3-D causal VAE with functional temporal steps.

Whole-clip passes, temporal slicing and streams all run through `encode_step` / `decode_step`,
pure functions of (slice, causal cache) -> (output, new memory). Nothing is cached on the modules
between calls: weights derived for the T=1 image path are made per call (`layers.tap_sum`).

Memory layout (`cache_layout()` lists it): one tensor per causal conv whose temporal kernel
exceeds its stride, in execution order; each holds the last `k_t - s_t` frames of that conv's
padded input, [B, C_in, k_t - s_t, H(+1), W(+1)] (the encoder's downsamplers store their
right/bottom zero pad too). The first slice is a step with `state=None`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Optional, Sequence

import torch
from torch import nn

from ..base import LatentFormat, VAEModel, run_slices
from ..causal_cache import State
from ..tiling.exact import LayerwisePlan
from ..base import FrameStage, FrameStages
from ..tiling.frame_stages import run_frame_stages
from ..memory.placement import Placement
from ..accel.switches import FastPaths
from ..gpu_defaults import MEASURED_SEEDVR2, GpuDefaults
from .config import SeedVR2Config
from .layers import (CausalConv3d, Downsample3D, MidBlock3D, ResnetBlock3D, SeedVR2PassContext, Upsample3D,
                     norm_silu_conv)
from .layerwise import SplitPolicy, join_frames, normalised_convs

class DownBlock3D(nn.Module):
    def __init__(self, cin: int, cout: int, layers: int, cfg: SeedVR2Config, downsample: Optional[bool]):
        super().__init__()
        self.resnets = nn.ModuleList([ResnetBlock3D(cin if i == 0 else cout, cout, cfg.norm_groups, cfg.eps)
                                      for i in range(layers)])
        self.downsamplers = nn.ModuleList([Downsample3D(cout, downsample)]) if downsample is not None else None

    def forward(self, x: torch.Tensor, ctx: SeedVR2PassContext) -> torch.Tensor:
        for resnet in self.resnets:
            x = resnet(x, ctx)
        if self.downsamplers is not None:
            x = self.downsamplers[0](x, ctx)
        return x


class UpBlock3D(nn.Module):
    def __init__(self, cin: int, cout: int, layers: int, cfg: SeedVR2Config, upsample: Optional[bool]):
        super().__init__()
        self.resnets = nn.ModuleList([ResnetBlock3D(cin if i == 0 else cout, cout, cfg.norm_groups, cfg.eps)
                                      for i in range(layers)])
        self.upsamplers = nn.ModuleList([Upsample3D(cout, upsample)]) if upsample is not None else None

    def forward(self, x: torch.Tensor, ctx: SeedVR2PassContext) -> torch.Tensor:
        for resnet in self.resnets:
            x = resnet(x, ctx)
        if self.upsamplers is not None:
            x = self.upsamplers[0](x, ctx)
        return x


class Encoder3D(nn.Module):
    def __init__(self, cfg: SeedVR2Config):
        super().__init__()
        ch = cfg.block_out_channels
        self.conv_in = CausalConv3d(cfg.in_channels, ch[0], (3, 3, 3))
        self.down_blocks = nn.ModuleList([
            DownBlock3D(ch[max(i - 1, 0)], c, cfg.layers_per_block, cfg,
                        cfg.encoder_temporal_down(i) if i < cfg.num_blocks - 1 else None)
            for i, c in enumerate(ch)])
        self.mid_block = MidBlock3D(ch[-1], cfg.norm_groups, cfg.eps)
        self.conv_norm_out = nn.GroupNorm(cfg.norm_groups, ch[-1], eps=cfg.eps)
        self.conv_out = CausalConv3d(ch[-1], 2 * cfg.latent_channels, (3, 3, 3))

    def forward(self, x: torch.Tensor, ctx: SeedVR2PassContext) -> torch.Tensor:
        x = self.conv_in(x, ctx)
        for block in self.down_blocks:
            x = block(x, ctx)
        x = self.mid_block(x, ctx)
        return norm_silu_conv(self.conv_norm_out, self.conv_out, x, ctx, last_use=True)


class Decoder3D(nn.Module):
    def __init__(self, cfg: SeedVR2Config):
        super().__init__()
        rev = tuple(reversed(cfg.block_out_channels))
        self.conv_in = CausalConv3d(cfg.latent_channels, rev[0], (3, 3, 3))
        self.mid_block = MidBlock3D(rev[0], cfg.norm_groups, cfg.eps)
        self.up_blocks = nn.ModuleList([
            UpBlock3D(rev[max(i - 1, 0)], c, cfg.layers_per_block + 1, cfg,
                      cfg.decoder_temporal_up(i) if i < cfg.num_blocks - 1 else None)
            for i, c in enumerate(rev)])
        self.conv_norm_out = nn.GroupNorm(cfg.norm_groups, rev[-1], eps=cfg.eps)
        self.conv_out = CausalConv3d(rev[-1], cfg.out_channels, (3, 3, 3))

    def forward(self, z: torch.Tensor, ctx: SeedVR2PassContext) -> torch.Tensor:
        x = self.mid_block(self.conv_in(z, ctx), ctx)
        for block in self.up_blocks:
            x = block(x, ctx)
        return self.head(x, ctx)

    def head(self, x: torch.Tensor, ctx: SeedVR2PassContext) -> torch.Tensor:
        """GroupNorm + SiLU + conv_out, then what the pass applies to the pixels (`ctx.finish_output`: the clamp)."""
        return norm_silu_conv(self.conv_norm_out, self.conv_out, x, ctx, last_use=True, finish=ctx.finish_output)


class SeedVR2VAE(VAEModel):
    """SeedVR2 ("video_vae_v3") VAE: 16 latent channels, 8x space, 4x time, replicate-causal convs."""

    kind = "seedvr2"
    fast_fields = FastPaths.names()  # every path

    def __init__(self, config: SeedVR2Config = SeedVR2Config(), fast: FastPaths = FastPaths()):
        super().__init__()
        self.config = config
        self.fast = fast
        self.encoder = Encoder3D(config)
        self.decoder = Decoder3D(config)
        self.latent_format = LatentFormat(config.latent_channels, config.spatial_factor, config.temporal_factor,
                                          scaling_factor=config.scaling_factor)
        self.hold_weights_after_loads()  # the layout the convs read; tap sums are made per call

    def context(self, state: Optional[Sequence[torch.Tensor]], collect: bool,
                split: Optional[SplitPolicy]) -> SeedVR2PassContext:
        """A pass context of this model's own paths. One that starts a pass (no causal state in) lays the weights
        out for them first (`VAEModel.start_pass`); a later slice's only reads them (`active_fast`)."""
        fast = self.start_pass() if state is None else self.active_fast()
        return SeedVR2PassContext(fast, state, collect, split)

    # -- functional steps ----------------------------------------------------------------------
    def encode_step(self, pixels: torch.Tensor, state: Optional[Sequence[torch.Tensor]] = None, *,
                    collect: bool = True, split: Optional[SplitPolicy] = None,
                    tick: Optional[Callable[[], None]] = None) -> tuple[torch.Tensor, State]:
        """One causal encode slice: [B,3,T,H,W] -> (moments [B,2C,T',h,w], memory for the next slice).

        First slice (`state=None`): T = 1+4k frames; later slices: 4k frames. `collect=False` skips
        building the memory (last slice / whole clip). `split` runs layer by layer with tile-bounded
        working memory (exact tiling; same result); `tick` is called after each of its layers.
        """
        ctx = self.context(state, collect, split)
        ctx.tick = tick
        out = self.encoder(pixels, ctx)
        return _settled(out, split), ctx.finish()

    def decode_step(self, latents: torch.Tensor, state: Optional[Sequence[torch.Tensor]] = None, *,
                    collect: bool = True, clamp: bool = True,
                    split: Optional[SplitPolicy] = None,
                    tick: Optional[Callable[[], None]] = None) -> tuple[torch.Tensor, State]:
        """One causal decode slice: [B,C,n,h,w] -> (pixels, memory). First slice gives 1+4(n-1)
        frames, later slices 4n. `clamp` limits pixels to [-1, 1] (the pipelines' final clamp)."""
        ctx = self.context(state, collect, split)
        ctx.tick = tick
        if clamp:
            ctx.clamp_output()
        out = self.decoder(latents, ctx)
        return _settled(out, split), ctx.finish()

    def gpu_defaults(self) -> GpuDefaults:
        """Measured on the first H100 run (docs/gpu.md, "Defaults per architecture"): compile and channels-last
        without the fused norms both made the 1080p decode slower."""
        return MEASURED_SEEDVR2

    def meta_copy(self) -> "SeedVR2VAE":
        with torch.device("meta"):
            return SeedVR2VAE(self.config, self.fast)

    # -- frame streaming -----------------------------------------------------------------------------
    def frame_stages(self, *, decode: bool) -> FrameStages:
        """Decode: conv_in → mid → up blocks → head, a new stage after every temporally upsampling block (each
        stage steps one frame at a time); encode: a new stage at every temporal downsampler (its steps take one
        frame first, then two: its stride). Every layer sees the frames and history of the whole-clip pass."""
        part = self.decoder if decode else self.encoder
        stages = _decoder_stages(part, self.config) if decode else _encoder_stages(part, self.config)

        def open_context(split: Optional[SplitPolicy]) -> SeedVR2PassContext:
            ctx = self.context(None, True, split)
            if decode:
                ctx.clamp_output()  # read by the last stage's head only
            return ctx

        return FrameStages(stages, open_context, join_frames)

    # -- exact tiling ------------------------------------------------------------------------------
    def exact_plan(self, *, decode: bool) -> LayerwisePlan:
        """Exact tiles run the whole forward layer by layer with tile-bounded working memory
        (GroupNorm statistics span the frame, so no tile of the network is independent)."""
        def run(x: torch.Tensor, tile_latent: int, temporal_slice: Optional[int], progress,
                shard=None, *, stages: bool = False, canvas: Optional[Placement] = None,
                sample: bool = False, frames: Optional[Placement] = None) -> torch.Tensor:
            f = self.latent_format.spatial_factor
            policy = SplitPolicy(budget_elems=(tile_latent * f) ** 2 * self.config.block_out_channels[0],
                                 shard=shard, frames=frames)
            fmt = self.latent_format
            frames = fmt.pixel_frames(x.shape[2]) if decode else fmt.latent_frames(x.shape[2])
            if stages:  # progress per input frame step (vae/tiling/frame_stages.py)
                return run_frame_stages(self.frame_stages(decode=decode), x, out_frames=frames, canvas=canvas,
                                        split=policy, progress=progress, sample=sample)
            bounds = self.slice_bounds(x.shape[2], temporal_slice, decode=decode)
            total = len(bounds) * normalised_convs(self.decoder if decode else self.encoder)
            done = 0

            def tick() -> None:
                nonlocal done
                done += 1
                if progress is not None:
                    progress(done, total)

            kwargs = {"split": policy, "tick": tick}
            return run_slices(self.decode_step if decode else self.encode_step, x, bounds, kwargs,
                              out_frames=frames, canvas=canvas, sample=sample)

        return LayerwisePlan(run)

    # -- export ----------------------------------------------------------------------------------
    def image_encoder(self) -> nn.Module:
        return _ImageEncoder(self)

    def image_decoder(self) -> nn.Module:
        return _ImageDecoder(self)


def _decoder_stages(dec: Decoder3D, cfg: SeedVR2Config) -> list[FrameStage]:
    groups: list[list[Callable]] = [[lambda x, ctx: dec.mid_block(dec.conv_in(x, ctx), ctx)]]
    for i, block in enumerate(dec.up_blocks):
        groups[-1].append(block)
        if i < cfg.num_blocks - 1 and cfg.decoder_temporal_up(i):
            groups.append([])  # the next block takes the frames this one doubled, one at a time
    groups[-1].append(lambda x, ctx: _settled(dec.head(x, ctx), ctx.split))
    return [FrameStage(f"decoder stage {n}", _chain(g), 1, 1) for n, g in enumerate(groups)]


def _encoder_stages(enc: Encoder3D, cfg: SeedVR2Config) -> list[FrameStage]:
    groups: list[tuple[int, list[Callable]]] = [(1, [enc.conv_in])]
    for i, block in enumerate(enc.down_blocks):
        groups[-1][1].extend(block.resnets)
        if block.downsamplers is None:
            continue
        if cfg.encoder_temporal_down(i):  # a stride-2 causal conv: a new stage stepping two frames at a time
            groups.append((2, [block.downsamplers[0]]))
        else:
            groups[-1][1].append(block.downsamplers[0])
    groups[-1][1].append(enc.mid_block)
    groups[-1][1].append(lambda x, ctx: _settled(norm_silu_conv(enc.conv_norm_out, enc.conv_out, x, ctx,
                                                                last_use=True), ctx.split))
    return [FrameStage(f"encoder stage {n}", _chain(g), 1, rest) for n, (rest, g) in enumerate(groups)]


def _settled(out: torch.Tensor, split: Optional[SplitPolicy]) -> torch.Tensor:
    """A step's output as its caller may read it: a streamed pass's output is held in host memory, written band by
    band on the stream, and is handed over once those writes have landed."""
    return split.frames.settled(out) if split is not None and split.holds(out) else out


def _chain(layers: list[Callable]) -> Callable[[torch.Tensor, SeedVR2PassContext], torch.Tensor]:
    def run(x: torch.Tensor, ctx: SeedVR2PassContext) -> torch.Tensor:
        for layer in layers:
            x = layer(x, ctx)
        return x

    return run


class _ImageEncoder(nn.Module):
    """[B,3,H,W] -> moments [B,32,H/8,W/8] through the T=1 conv2d path."""

    def __init__(self, vae: SeedVR2VAE):
        super().__init__()
        self.vae = vae

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        ctx = SeedVR2PassContext(replace(self.vae.fast, image_path=True))
        return self.vae.encoder(pixels.unsqueeze(2), ctx).squeeze(2)


class _ImageDecoder(nn.Module):
    """[B,16,h,w] -> pixels [B,3,8h,8w] in [-1,1] through the T=1 conv2d path."""

    def __init__(self, vae: SeedVR2VAE):
        super().__init__()
        self.vae = vae

    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        ctx = SeedVR2PassContext(replace(self.vae.fast, image_path=True))
        return self.vae.decoder(latents.unsqueeze(2), ctx).squeeze(2).clamp(-1.0, 1.0)
