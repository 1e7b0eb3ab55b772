"""SeedVR2 VAE hyper-parameters and the switchable fast paths.

The shipped model is fully described by `SeedVR2Config()`; `SeedVR2Config.tiny()` keeps the exact
topology (same blocks, strides, causal padding, attention) with few channels so tests run in
milliseconds. `FastPaths` lets the benchmark run the plain path and every optimisation in one process.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace


@dataclass(frozen=True)
class SeedVR2Config:
    """`s8_c16_t4_inflation_sd3.yaml` as shipped (ByteDance-Seed/SeedVR, models/video_vae_v3)."""

    in_channels: int = 3
    out_channels: int = 3
    latent_channels: int = 16
    block_out_channels: tuple[int, ...] = (128, 256, 512, 512)
    layers_per_block: int = 2  # encoder resnets per block; decoder blocks hold one more
    norm_groups: int = 32
    eps: float = 1e-6
    temporal_down_num: int = 2  # the last stride-2 stages of the encoder also halve time
    temporal_up_num: int = 2  # the first up blocks of the decoder also double time
    scaling_factor: float = 0.9152

    @classmethod
    def tiny(cls) -> "SeedVR2Config":
        """Same topology, 16x fewer channels: for behaviour tests only."""
        return cls(block_out_channels=(8, 16, 32, 32), norm_groups=4)

    @property
    def num_blocks(self) -> int:
        return len(self.block_out_channels)

    def encoder_temporal_down(self, block: int) -> bool:
        return self.num_blocks - self.temporal_down_num - 1 <= block < self.num_blocks - 1

    def decoder_temporal_up(self, block: int) -> bool:
        return block < self.temporal_up_num

    @property
    def spatial_factor(self) -> int:
        return 2 ** (self.num_blocks - 1)

    @property
    def temporal_factor(self) -> int:
        return 2 ** self.temporal_down_num


@dataclass(frozen=True)
class FastPaths:
    """Optimisations, each exact in fp32; `FastPaths.plain()` turns all of them off.

    - native_shuffle: view/permute pixel shuffle written straight into the output (no einops, no
      remove-head copy).
    - single_buffer: causal conv writes its temporally padded input once; caches are compact copies.
    - sdpa: mid-block attention through `scaled_dot_product_attention` instead of explicit softmax.
    - inplace_residual: residual adds and SiLU in place when autograd is off (inference mode).
    - image_path: T=1 first slice as conv2d with summed temporal taps, computing only the kept
      half of the temporal upsampler.
    - head_taps: on the first slice of a clip, the two head outputs of each 3x3x3 causal conv use
      summed taps (3 frame-taps instead of 6) and the body is a valid conv3d without a padded copy.
    - subpixel_conv: an upsampler's 1×1 conv, shuffle and 3×3×3 causal conv run as composed convs with 2×2
      spatial taps at low resolution (vae/seedvr2/subpixel.py), where the layer is large enough to pay for it.
    - channels_last: run convs in channels_last_3d (useful on GPUs; off by default).
    """

    native_shuffle: bool = True
    single_buffer: bool = True
    sdpa: bool = True
    inplace_residual: bool = True
    image_path: bool = True
    head_taps: bool = True
    subpixel_conv: bool = True
    channels_last: bool = False

    @classmethod
    def plain(cls) -> "FastPaths":
        return cls(**{f.name: False for f in fields(cls)})

    def without(self, name: str) -> "FastPaths":
        return replace(self, **{name: False})
