"""Qwen-Image / Wan 2.1 (RGB and the RGBA Qwen-Image-Layered) and Wan 2.2 VAEs: detection, strict
loading, and the model.

`kind` rule (Qwen-Image and Wan 2.1 share architecture and weights format, only the values differ):
Wan 2.2 layout -> "wan2.2"; 4 image channels (read off the pixel convs) -> "qwen_image_layered";
otherwise "wan2.1" when the source file/folder name contains "wan" or a diffusers config names
`AutoencoderKLWan`, else "qwen_image". The channel part is the table `RELEASED_IMAGE_CHANNELS`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Optional, Union

import torch

from ..checkpoint import Architecture, CheckpointError, check_strict
from .config import (QWEN_IMAGE_LAYERED, RELEASED_IMAGE_CHANNELS, TINY_WAN21, TINY_WAN22, WAN21, WAN22, WanConfig,
                     config_from_diffusers, kind_from_channels)
from .keys import diffusers_to_original, is_wan22, key_format, original_to_diffusers, pixel_conv_channels
from ..accel.switches import FastPaths
from .layers import WAN_FAST
from .model import WanVAE

__all__ = ["WanVAE", "WanConfig", "WAN_FAST", "WAN21", "WAN22", "QWEN_IMAGE_LAYERED", "TINY_WAN21", "TINY_WAN22",
           "build", "expected_shapes", "original_to_diffusers", "diffusers_to_original"]

WAN21_NAME = "Qwen-Image / Wan 2.1 VAE"
WAN22_NAME = "Wan 2.2 VAE"


def expected_shapes(cfg: WanConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter name (diffusers layout) and shape of `cfg`, built on the meta device (no memory)."""
    with torch.device("meta"):
        model = WanVAE(cfg)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def _detect_wan21(sd: Mapping[str, torch.Tensor]) -> bool:
    return key_format(sd) != "unknown" and not is_wan22(sd)


def _detect_wan22(sd: Mapping[str, torch.Tensor]) -> bool:
    return key_format(sd) != "unknown" and is_wan22(sd)


def _kind(family: str, source: Optional[str], config: Optional[Mapping[str, Any]], image_channels: int = 3) -> str:
    named = kind_from_channels(family, image_channels)
    if named:
        return named
    if config is not None and config.get("_class_name"):
        return "wan2.1" if config["_class_name"] == "AutoencoderKLWan" else "qwen_image"
    if not source:
        return "qwen_image"
    path = Path(str(source))
    name = path.name
    if name.startswith("diffusion_pytorch_model"):  # diffusers file: the model folder names the model
        parent = path.parent.parent if path.parent.name == "vae" else path.parent
        name = parent.name
    return "wan2.1" if "wan" in name.lower() else "qwen_image"


def _image_channels(sd: Mapping[str, torch.Tensor], base: WanConfig, name: str, source: str) -> int:
    """Image channels read off the pixel convs (RGB 3, RGBA 4); the base config's where neither conv
    is readable (the strict check then names the missing keys)."""
    reads, writes = pixel_conv_channels(sd)
    if reads is not None and writes is not None and reads != writes:
        raise CheckpointError(f"{source}: the encoder reads {reads} channels but the decoder writes {writes}; "
                              f"every released {name} reads and writes the same image channels")
    io = reads if reads is not None else writes
    p2 = base.patch_size ** 2
    if io is None or io % p2:
        return base.image_channels
    return io // p2


def build(sd: Mapping[str, torch.Tensor], config: Union[None, WanConfig, Mapping[str, Any]] = None,
          source: Optional[str] = None, fast: FastPaths = WAN_FAST) -> WanVAE:
    """A loaded WanVAE from a state dict in original/ComfyUI or diffusers key format.

    Strict: every key and shape must match the config (the real Wan 2.1/Qwen-Image or Wan 2.2 one
    unless a diffusers config or a WanConfig is given); otherwise CheckpointError names the differences.
    """
    source = source or "state dict"
    fmt = key_format(sd)
    family = "wan2.2" if is_wan22(sd) else "wan2.1"
    name = WAN22_NAME if family == "wan2.2" else WAN21_NAME
    diffusers_cfg = config if isinstance(config, Mapping) else None
    if isinstance(config, WanConfig):
        cfg = config
    elif diffusers_cfg is not None:
        try:
            cfg = config_from_diffusers(diffusers_cfg)
        except ValueError as e:
            raise CheckpointError(f"{source}: unsupported diffusers config ({e})") from e
    else:
        base = WAN22 if family == "wan2.2" else WAN21
        cfg = replace(base, image_channels=_image_channels(sd, base, name, source))
    if cfg.family != family:
        raise CheckpointError(f"{source}: the weights are a {name} but the config describes a {cfg.family} VAE; "
                              "pass the matching config.json (or none)")
    released = RELEASED_IMAGE_CHANNELS[family]
    if cfg.image_channels not in released:
        raise CheckpointError(f"{source}: a {name} with {cfg.image_channels} image channels was never released "
                              f"(known: {', '.join(map(str, released))}); check the file or its config.json")
    if fmt == "original":
        sd = original_to_diffusers(sd, cfg)
    check_strict(sd, expected_shapes(cfg), name, source)
    with torch.device("meta"):
        model = WanVAE(cfg, kind=_kind(family, source, diffusers_cfg, cfg.image_channels), fast=fast)
    dtypes = {v.dtype for v in sd.values()}
    dtype = dtypes.pop() if len(dtypes) == 1 else torch.float32  # mixed files: widen; load_vae casts afterwards
    sd = {k: v.to(dtype) for k, v in sd.items()}
    model.load_state_dict(sd, strict=True, assign=True)
    # An inference model, as SeedVR2's build and TurboVAE give: parameters that require grad would put every
    # pass outside inference mode into autograd (and the weight scratch and in-place adds step aside there).
    return model.eval().requires_grad_(False)


ARCHITECTURES = (Architecture(WAN22_NAME, _detect_wan22, build, priority=6),
                 Architecture(WAN21_NAME, _detect_wan21, build, priority=5))
