"""The Wan-family VAE (Qwen-Image ≡ Wan 2.1, its RGBA Qwen-Image-Layered variant, and Wan 2.2) behind
the `VAEModel` contract. Pixels have `cfg.image_channels` channels (3, or 4 for the RGBA VAE); nothing
below depends on the count except the two pixel convs.

Module and parameter names follow the diffusers layout (`encoder.down_blocks.*`), so a diffusers
state dict loads as is and original/ComfyUI files go through vae/wan/keys.py.

Exactness: clips run through `encode_step` / `decode_step` with explicit causal cache (the contract in
vae/base.py; encode: 1+4k frames, then 4k per step; decode: any number of latent frames per step) and equal
diffusers' frame-by-frame pass for every slicing; images (T = 1) run the exact 2-D fold.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
from torch import nn

from ..base import LatentFormat, VAEModel
from ..causal_cache import State
from ..accel.switches import FastPaths
from ..gpu_defaults import MEASURED_ALL_ON, UNMEASURED, GpuDefaults
from ..tiling.exact import ExactPlan
from .config import WanConfig, kind_from_channels
from .exact_plan import wan_exact_plan
from .layers import (CausalConv3d, DownResidualBlock, MidBlock, Resample, ResidualBlock, RMSNorm, UpBlock,
                     UpResidualBlock, WAN_FAST, WAN_FAST_FIELDS, norm_conv)
from .pieces import WanPassContext
from .patching import footprint, patchify, spatial_ops, unpatchify


class _CausalStack(nn.Module):
    """What the encoder and decoder share: the patch size, `conv_in` (in_channels -> the first stage's width), the
    stages between the widths `dims` and the head (`norm_out`, `conv_out`). Each side builds its own stage blocks and
    places its mid block; the parameter names are the checkpoint's (registration order: conv_in first, head last)."""

    def __init__(self, cfg: WanConfig, in_channels: int, dims: Sequence[int]):
        super().__init__()
        self.patch_size = cfg.patch_size
        self.conv_in = CausalConv3d(in_channels, dims[0], 3, padding=1)

    @staticmethod
    def stages(cfg: WanConfig, dims: Sequence[int], temporal: Sequence[bool]):
        """(stage input width, output width, temporal resampling, last stage) per stage; the last stage
        resamples nothing."""
        last = len(cfg.dim_mult) - 1
        for i, (cin, cout) in enumerate(zip(dims[:-1], dims[1:])):
            yield cin, cout, (temporal[i] if i < last else False), i == last

    def add_head(self, width: int, out_channels: int) -> None:
        self.norm_out = RMSNorm(width)
        self.conv_out = CausalConv3d(width, out_channels, 3, padding=1)


class Encoder(_CausalStack):
    """conv_in -> down blocks (local) | mid block (global attention) -> head -> quant_conv."""

    def __init__(self, cfg: WanConfig):
        dims = cfg.encoder_dims()
        super().__init__(cfg, cfg.io_channels, dims)
        blocks: list[nn.Module] = []
        for cin, cout, temporal, last in self.stages(cfg, dims, cfg.temporal_downsample):
            if cfg.is_residual:
                blocks.append(DownResidualBlock(cin, cout, cfg.num_res_blocks, temporal, down=not last))
                continue
            blocks += [ResidualBlock(cin if j == 0 else cout, cout) for j in range(cfg.num_res_blocks)]
            if not last:
                blocks.append(Resample(cout, "downsample3d" if temporal else "downsample2d"))
        self.down_blocks = nn.ModuleList(blocks)
        self.mid_block = MidBlock(dims[-1])
        self.add_head(dims[-1], cfg.z_dim * 2)
        self._quant = None  # (quant_conv,), attached by WanVAE; a tuple so it is not registered twice
        self.receptive_radius = self._down_radius(cfg)

    def _down_radius(self, cfg: WanConfig) -> int:
        """Latent pixels of context `forward_down` needs around a tile (from the layer list)."""
        _scale, r = footprint(spatial_ops([self.conv_in, *[m for b in self.down_blocks for m in b.modules()]]))
        if self.patch_size > 1:
            r = self.patch_size * r + self.patch_size - 1
        return math.ceil(r / cfg.spatial_factor)

    def forward_down(self, x: torch.Tensor, ctx: WanPassContext) -> torch.Tensor:
        """Pixels -> features at 1/8 (1/16 for Wan 2.2 in pixels); purely local."""
        x = self.conv_in(patchify(x, self.patch_size), ctx)
        for block in self.down_blocks:
            x = block(x, ctx)
        return x

    def forward_mid(self, h: torch.Tensor, ctx: WanPassContext) -> torch.Tensor:
        """Features -> moments (mean ‖ logvar): mid block (the only global op), head, quant_conv."""
        h = self.mid_block(h, ctx)
        h = norm_conv(self.norm_out, self.conv_out, h, ctx)
        return self._quant[0](h, ctx)

    def forward(self, x: torch.Tensor, ctx: WanPassContext) -> torch.Tensor:
        return self.forward_mid(self.forward_down(x, ctx), ctx)


class Decoder(_CausalStack):
    """post_quant_conv -> conv_in -> mid block (global attention) | up blocks -> head (local)."""

    def __init__(self, cfg: WanConfig):
        dims = cfg.decoder_dims()
        super().__init__(cfg, cfg.z_dim, dims)
        self.mid_block = MidBlock(dims[0])
        blocks: list[nn.Module] = []
        for i, (cin, cout, temporal, last) in enumerate(self.stages(cfg, dims, cfg.temporal_upsample)):
            if cfg.is_residual:
                blocks.append(UpResidualBlock(cin, cout, cfg.num_res_blocks, temporal, up=not last))
            else:
                mode = None if last else ("upsample3d" if temporal else "upsample2d")
                blocks.append(UpBlock(cin if i == 0 else cin // 2, cout, cfg.num_res_blocks, mode))
        self.up_blocks = nn.ModuleList(blocks)
        self.add_head(dims[-1], cfg.io_channels)
        self._post_quant = None  # (post_quant_conv,), attached by WanVAE
        self.receptive_radius = self._up_radius()

    def _up_radius(self) -> int:
        """Latent pixels of context `forward_up` needs around a tile (unpatchify maps each pixel to one patch
        pixel, so it adds nothing)."""
        return footprint(spatial_ops([m for b in self.up_blocks for m in b.modules()] + [self.conv_out]))[1]

    def forward_mid(self, z: torch.Tensor, ctx: WanPassContext) -> torch.Tensor:
        """Raw latents -> mid-block features: post_quant_conv, conv_in, mid block (the only global op)."""
        x = self.conv_in(self._post_quant[0](z, ctx), ctx)
        return self.mid_block(x, ctx)

    def forward_up(self, h: torch.Tensor, ctx: WanPassContext) -> torch.Tensor:
        """Mid-block features -> unclamped pixels; purely local (the RMS norm is per pixel)."""
        for block in self.up_blocks:
            h = block(h, ctx)
        h = norm_conv(self.norm_out, self.conv_out, h, ctx)
        return unpatchify(h, self.patch_size)

    def forward(self, z: torch.Tensor, ctx: WanPassContext) -> torch.Tensor:
        return self.forward_up(self.forward_mid(z, ctx), ctx)


class _ImageEncoder(nn.Module):
    """[B, I, H, W] (I image channels) -> moments [B, 2C, h, w] with no cache logic (export graph)."""

    def __init__(self, vae: "WanVAE"):
        super().__init__()
        self.vae = vae

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.vae.encoder(x, self.vae.context())


class _ImageDecoder(nn.Module):
    """[B, C, h, w] -> pixels [B, I, H, W] clamped to [-1, 1] (export graph)."""

    def __init__(self, vae: "WanVAE"):
        super().__init__()
        self.vae = vae

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.vae.decoder(z, self.vae.context()).clamp(-1.0, 1.0)


class WanVAE(VAEModel):
    """Qwen-Image / Wan 2.1 (16 ch, 8x; RGB, or RGBA for Qwen-Image-Layered) or Wan 2.2 (48 ch, 16x) causal
    video VAE; raw latents in and out."""

    fast_fields = WAN_FAST_FIELDS

    def __init__(self, cfg: WanConfig, kind: Optional[str] = None, fast: FastPaths = WAN_FAST):
        super().__init__()
        self.config = cfg
        self.kind = kind or kind_from_channels(cfg.family, cfg.image_channels) or ("wan2.2" if cfg.family == "wan2.2" else "qwen_image")
        self.fast = fast
        self.encoder = Encoder(cfg)
        self.quant_conv = CausalConv3d(cfg.z_dim * 2, cfg.z_dim * 2, 1)
        self.post_quant_conv = CausalConv3d(cfg.z_dim, cfg.z_dim, 1)
        self.decoder = Decoder(cfg)
        self.encoder._quant = (self.quant_conv,)
        self.decoder._post_quant = (self.post_quant_conv,)
        self.latent_format = LatentFormat(cfg.z_dim, cfg.spatial_factor, cfg.temporal_factor,
                                          mean=cfg.latents_mean, std=cfg.latents_std,
                                          image_channels=cfg.image_channels)
        self.hold_weights_after_loads()  # the clip kernels read the parameters; the folded last tap is a view

    def context(self, state: Optional[Sequence[torch.Tensor]] = None, collect: bool = True) -> WanPassContext:
        """A pass context of this model's own paths. One that starts a pass (no causal state in) lays the weights
        out for them first (`VAEModel.start_pass`); a later slice's only reads them (`active_fast`)."""
        return WanPassContext(self.start_pass() if state is None else self.active_fast(), state, collect)

    # -- the causal steps --------------------------------------------------------------------
    def _fold(self, x: torch.Tensor, ctx: WanPassContext) -> bool:
        """A lone first frame whose memory is not wanted runs the exact 2-D fold (a third of the MACs)."""
        return ctx.first and not ctx.collect and x.shape[2] == 1 and ctx.pieces.fold_images

    def encode_step(self, pixels: torch.Tensor, state: Optional[Sequence[torch.Tensor]] = None, *,
                    collect: bool = True) -> tuple[torch.Tensor, State]:
        ctx = self.context(state, collect)
        if self._fold(pixels, ctx):
            out = self.encoder(ctx.pieces.lay_out(pixels[:, :, 0]), ctx).unsqueeze(2)
        else:
            out = self.encoder(ctx.pieces.lay_out(pixels), ctx)
        return out, ctx.finish()

    def decode_step(self, latents: torch.Tensor, state: Optional[Sequence[torch.Tensor]] = None, *,
                    collect: bool = True, clamp: bool = True) -> tuple[torch.Tensor, State]:
        ctx = self.context(state, collect)
        if self._fold(latents, ctx):
            out = self.decoder(ctx.pieces.lay_out(latents[:, :, 0]), ctx).unsqueeze(2)
        else:
            out = self.decoder(ctx.pieces.lay_out(latents), ctx)
        if clamp:
            out = out.clamp_(-1.0, 1.0)
        return out, ctx.finish()

    def gpu_defaults(self) -> GpuDefaults:
        """The Wan 2.1 architecture (Qwen-Image, Wan 2.1) was measured on the first H100 run with every path
        helping (docs/gpu.md, "Defaults per architecture"); Wan 2.2 (the residual variant) not yet."""
        return UNMEASURED if self.config.is_residual else MEASURED_ALL_ON

    def meta_copy(self) -> "WanVAE":
        with torch.device("meta"):
            return WanVAE(self.config, self.kind, self.fast)

    # -- export ------------------------------------------------------------------------------
    def image_encoder(self) -> nn.Module:
        return _ImageEncoder(self)

    def image_decoder(self) -> nn.Module:
        return _ImageDecoder(self)

    # -- exact tiling ------------------------------------------------------------------------
    def exact_plan(self, *, decode: bool) -> ExactPlan:
        """The split used by exact tiles: local blocks per tile, the mid block on the whole frame."""
        part = self.decoder if decode else self.encoder
        return wan_exact_plan(part, decode=decode, patch_size=self.config.patch_size, open_context=self.context)
