"""SeedVR2 VAE hyper-parameters.

The shipped model is fully described by `SeedVR2Config()`; `SeedVR2Config.tiny()` keeps the exact
topology (same blocks, strides, causal padding, attention) with few channels so tests run in
milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass


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
    def real(cls) -> "SeedVR2Config":
        """The shipped model (the same as `SeedVR2Config()`): every family's config has `real()` and `tiny()`."""
        return cls()

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
