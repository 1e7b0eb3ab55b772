"""Configurations of the Wan-family VAEs (Qwen-Image ≡ Wan 2.1, and Wan 2.2) as small frozen dataclasses.

Only the fields that change the weights or the computation are kept; the real configs are the ones
shipped checkpoints are strict-checked against (see `build` in vae/wan/__init__.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping, Optional

WAN21_LATENTS_MEAN = (
    -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
    0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
)
WAN21_LATENTS_STD = (
    2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
    3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160,
)
WAN22_LATENTS_MEAN = (
    -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557,
    -0.1382, 0.0542, 0.2813, 0.0891, 0.1570, -0.0098, 0.0375, -0.1825,
    -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108, -0.2158, 0.2502,
    -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230,
    -0.0313, -0.1649, 0.0117, 0.0723, -0.2839, -0.2083, -0.0520, 0.3748,
    0.0152, 0.1957, 0.1433, -0.2944, 0.3573, -0.0548, -0.1681, -0.0667,
)
WAN22_LATENTS_STD = (
    0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013,
    0.8158, 1.0344, 0.5894, 1.0901, 0.6885, 0.6165, 0.8454, 0.4978,
    0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
    0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093,
    0.5709, 0.6065, 0.6415, 0.4944, 0.5726, 1.2042, 0.5458, 1.6887,
    0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744,
)


@dataclass(frozen=True)
class WanConfig:
    """Architecture of one Wan-family VAE.

    `is_residual` selects the Wan 2.2 block layout (residual-of-residual blocks with the
    parameter-free AvgDown3D / DupUp3D shortcuts, upsample convs that keep the width, patchify).
    """

    family: str  # "wan2.1" (also Qwen-Image) or "wan2.2"
    base_dim: int = 96
    decoder_base_dim: int = 96
    z_dim: int = 16
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    temporal_downsample: tuple[bool, ...] = (False, True, True)
    is_residual: bool = False
    patch_size: int = 1
    image_channels: int = 3
    latents_mean: Optional[tuple[float, ...]] = WAN21_LATENTS_MEAN
    latents_std: Optional[tuple[float, ...]] = WAN21_LATENTS_STD

    def __post_init__(self) -> None:
        if len(self.temporal_downsample) != len(self.dim_mult) - 1:
            raise ValueError(f"temporal_downsample needs {len(self.dim_mult) - 1} entries (one per downsample), "
                             f"got {self.temporal_downsample}")
        if self.family not in ("wan2.1", "wan2.2"):
            raise ValueError(f"family must be 'wan2.1' or 'wan2.2', got {self.family!r}")

    @property
    def temporal_upsample(self) -> tuple[bool, ...]:
        return tuple(reversed(self.temporal_downsample))

    @property
    def io_channels(self) -> int:
        """Channels entering the encoder / leaving the decoder (after patchify)."""
        return self.image_channels * self.patch_size ** 2

    @property
    def spatial_factor(self) -> int:
        return 2 ** (len(self.dim_mult) - 1) * self.patch_size

    @property
    def temporal_factor(self) -> int:
        return 2 ** sum(self.temporal_downsample)

    @classmethod
    def real(cls, family: str = "wan2.1") -> "WanConfig":
        """The released layout of `family` ("wan2.1": Qwen-Image / Wan 2.1, `WAN21`; "wan2.2": `WAN22`), the
        config idiom every family shares (`SeedVR2Config.real()`)."""
        return _by_family(family, WAN21, WAN22)

    @classmethod
    def tiny(cls, family: str = "wan2.1") -> "WanConfig":
        """The same topology as `real(family)` with few channels, for behaviour tests (`TINY_WAN21`, `TINY_WAN22`)."""
        return _by_family(family, TINY_WAN21, TINY_WAN22)

    def encoder_dims(self) -> list[int]:
        return [self.base_dim * m for m in (1, *self.dim_mult)]

    def decoder_dims(self) -> list[int]:
        return [self.decoder_base_dim * m for m in (self.dim_mult[-1], *reversed(self.dim_mult))]


WAN21 = WanConfig(family="wan2.1")
"""Qwen-Image and Wan 2.1 VAE (`qwen_image_vae.safetensors`, `wan_2.1_vae.safetensors`): 126,892,531 params."""

QWEN_IMAGE_LAYERED = replace(WAN21, image_channels=4)
"""Qwen-Image-Layered RGBA VAE (diffusers `AutoencoderKLQwenImage(input_channels=4)`): the Wan 2.1 layout
reading and writing 4 channels, same latent statistics; 126,897,716 params."""

WAN22 = WanConfig(family="wan2.2", base_dim=160, decoder_base_dim=256, z_dim=48, is_residual=True, patch_size=2,
                  latents_mean=WAN22_LATENTS_MEAN, latents_std=WAN22_LATENTS_STD)
"""Wan 2.2 TI2V-5B VAE (`wan2.2_vae.safetensors`): 704,688,668 params, 16x spatial, 48 latent channels."""

# Tiny configs with the same topology, for fast behavioural tests (not loadable from real files).
TINY_WAN21 = replace(WAN21, base_dim=8, decoder_base_dim=8, z_dim=4, latents_mean=None, latents_std=None)
TINY_WAN22 = replace(WAN22, base_dim=8, decoder_base_dim=12, z_dim=6, latents_mean=None, latents_std=None)


def _by_family(family: str, wan21: "WanConfig", wan22: "WanConfig") -> "WanConfig":
    if family not in ("wan2.1", "wan2.2"):
        raise ValueError(f"family must be 'wan2.1' or 'wan2.2', got {family!r}")
    return wan22 if family == "wan2.2" else wan21


# The image channel counts each layout was released with, and the kind a count names when it names
# one. None: RGB files of the Wan 2.1 layout are Qwen-Image or Wan 2.1, told apart by name (vae/wan `_kind`).
RELEASED_IMAGE_CHANNELS: dict[str, dict[int, Optional[str]]] = {
    "wan2.1": {3: None, 4: "qwen_image_layered"},
    "wan2.2": {3: "wan2.2"},
}


def kind_from_channels(family: str, image_channels: int) -> Optional[str]:
    """The kind a layout and image channel count name on their own (None: the file name decides)."""
    return RELEASED_IMAGE_CHANNELS[family].get(image_channels)


def config_from_diffusers(cfg: Mapping[str, Any]) -> WanConfig:
    """A WanConfig from a diffusers `config.json` (AutoencoderKLQwenImage or AutoencoderKLWan)."""
    if cfg.get("attn_scales"):
        raise ValueError(f"attn_scales={cfg['attn_scales']} is not supported (no released Wan VAE uses it)")
    is_residual = bool(cfg.get("is_residual", False))
    patch = cfg.get("patch_size") or 1
    image_channels = cfg.get("input_channels", cfg.get("in_channels", 3 * patch * patch)) // (patch * patch)
    base = WAN22 if is_residual else WAN21
    mean, std = cfg.get("latents_mean"), cfg.get("latents_std")
    return replace(
        base,
        base_dim=int(cfg.get("base_dim", base.base_dim)),
        decoder_base_dim=int(cfg.get("decoder_base_dim") or cfg.get("base_dim", base.base_dim)),
        z_dim=int(cfg.get("z_dim", base.z_dim)),
        dim_mult=tuple(cfg.get("dim_mult", base.dim_mult)),
        num_res_blocks=int(cfg.get("num_res_blocks", base.num_res_blocks)),
        temporal_downsample=tuple(bool(v) for v in cfg.get("temperal_downsample", base.temporal_downsample)),
        patch_size=int(patch),
        image_channels=int(image_channels),
        latents_mean=tuple(mean) if mean else None,
        latents_std=tuple(std) if std else None,
    )


def diffusers_kwargs(cfg: WanConfig) -> dict:
    """Constructor kwargs of the matching diffusers class (used by tests and the benchmark)."""
    kw = dict(base_dim=cfg.base_dim, z_dim=cfg.z_dim, dim_mult=list(cfg.dim_mult), num_res_blocks=cfg.num_res_blocks,
              attn_scales=[], temperal_downsample=list(cfg.temporal_downsample))
    if cfg.image_channels != 3 and not cfg.is_residual:  # AutoencoderKLQwenImage's name (AutoencoderKLWan's below)
        kw.update(input_channels=cfg.image_channels)
    if cfg.is_residual or cfg.patch_size != 1 or cfg.decoder_base_dim != cfg.base_dim:
        kw.update(decoder_base_dim=cfg.decoder_base_dim, is_residual=cfg.is_residual, in_channels=cfg.io_channels,
                  out_channels=cfg.io_channels, patch_size=cfg.patch_size if cfg.patch_size > 1 else None,
                  scale_factor_spatial=cfg.spatial_factor)
    return kw
