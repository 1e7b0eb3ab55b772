"""Where core's VAE contract differs by kind, as our VAE follows it so it is interchangeable with core's for core's
nodes (docs/nodes.md, "Core versions checked"): what a LATENT holds, the SeedVR2 decode option, tiled overlaps.

Core's native SeedVR2 VAE (comfy/ldm/seedvr, PR #14424) scales inside the VAE: its LATENT is the encoder's mean
times the scaling factor, and decode divides by it; its SeedVR2 nodes and DiT expect that. Core's Wan/Qwen-Image VAEs
return raw latents (the model applies the statistics).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ..vae.registry import core_scales_latents

# Defaults core's SeedVR2 VAE gives a `seedvr2_tiling` option that leaves out tile_size / tile_overlap (px)
CORE_SEEDVR2_TILE_PX = (512, 512)
CORE_SEEDVR2_OVERLAP_PX = (64, 64)


@dataclass(frozen=True)
class CoreLatents:
    """Raw latents <-> the LATENT samples core's VAE of this kind gives: (raw - shift) * scale."""

    scale: float = 1.0
    shift: float = 0.0

    @classmethod
    def for_kind(cls, kind: str, scaling_factor: float, shift_factor: float) -> "CoreLatents":
        """Scaled for the kinds whose family says core scales its latents (`Family.core_scales_latents`,
        vae/registry.py), raw otherwise."""
        return cls(scaling_factor, shift_factor) if core_scales_latents(kind) else cls()

    @property
    def is_raw(self) -> bool:
        return self.scale == 1.0 and self.shift == 0.0

    def from_raw(self, raw: torch.Tensor) -> torch.Tensor:
        return raw if self.is_raw else (raw - self.shift) * self.scale

    def to_raw(self, samples: torch.Tensor) -> torch.Tensor:
        """Unchecked samples are fine: anything but a float tensor is returned as it is, for the pass to refuse."""
        if self.is_raw or not (isinstance(samples, torch.Tensor) and samples.is_floating_point()):
            return samples
        return samples / self.scale + self.shift


def core_overlap(tile_px: Optional[int], overlap_px: int) -> int:
    """Core's tiled nodes shrink an overlap that does not fit the tile to a quarter of it; so do we (our
    tiler refuses overlap >= tile / 2, which callers of these core-contract methods never chose). Pixels."""
    return tile_px // 4 if tile_px and 2 * overlap_px >= tile_px else overlap_px


def seedvr2_tiling_request(vae_options: Optional[dict], min_tile_px: int) -> Optional[tuple[int, int]]:
    """(tile, overlap) in pixels when `vae_options` carries core's SeedVR2 `seedvr2_tiling` with tiling on, else
    None. Our tiles are exact, so a tile below our minimum only changes memory: it is rounded up."""
    tiling = (vae_options or {}).get("seedvr2_tiling") or {}
    if not tiling.get("enable_tiling"):
        return None
    tile = max(max(tiling.get("tile_size", CORE_SEEDVR2_TILE_PX)), min_tile_px)
    return tile, core_overlap(tile, min(tiling.get("tile_overlap", CORE_SEEDVR2_OVERLAP_PX)))


def image_frames(pixels: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """An IMAGE [N, H, W, C] (one clip, core's convention for video VAEs) or a video IMAGE [B, T, H, W, C] (B clips:
    what core's Pre-Process SeedVR2 Input gives VAE Encode) as its frames [B*T, H, W, C], B and T."""
    if not isinstance(pixels, torch.Tensor) or pixels.ndim not in (4, 5):
        raise ValueError(f"expected an IMAGE tensor [frames, height, width, channels] or a video IMAGE "
                         f"[clips, frames, height, width, channels]; got "
                         f"{tuple(pixels.shape) if isinstance(pixels, torch.Tensor) else type(pixels).__name__}")
    b, t = pixels.shape[:2] if pixels.ndim == 5 else (1, pixels.shape[0])
    return pixels.reshape(b * t, *pixels.shape[-3:]), b, t


def frames_to_clips(frames: torch.Tensor, b: int, t: int) -> torch.Tensor:
    """Frames [B*T, H, W, C] -> clips [B, C, T, H, W]. One clip keeps the view it always had: oneDNN convolutions
    round differently on other strides."""
    channels_first = frames.movedim(-1, 0)  # [C, B*T, H, W]
    return channels_first.unsqueeze(0) if b == 1 else channels_first.unflatten(1, (b, t)).movedim(1, 0)
