"""Qwen-Image / Wan 2.1 and Wan 2.2 VAEs: detection, strict loading, and the model.

`kind` rule (Qwen-Image and Wan 2.1 share architecture and weights format, only the values differ):
Wan 2.2 layout -> "wan2.2"; otherwise "wan2.1" when the source file/folder name contains "wan" or a
diffusers config names `AutoencoderKLWan`, else "qwen_image".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional, Union

import torch

from ..checkpoint import Architecture, CheckpointError, check_strict
from .config import TINY_WAN21, TINY_WAN22, WAN21, WAN22, WanConfig, config_from_diffusers
from .keys import diffusers_to_original, is_wan22, key_format, original_to_diffusers
from .layers import WanFlags
from .model import WanVAE

__all__ = ["WanVAE", "WanConfig", "WanFlags", "WAN21", "WAN22", "TINY_WAN21", "TINY_WAN22", "build",
           "expected_shapes", "original_to_diffusers", "diffusers_to_original"]

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


def _kind(family: str, source: Optional[str], config: Optional[Mapping[str, Any]]) -> str:
    if family == "wan2.2":
        return "wan2.2"
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


def build(sd: Mapping[str, torch.Tensor], config: Union[None, WanConfig, Mapping[str, Any]] = None,
          source: Optional[str] = None, flags: WanFlags = WanFlags()) -> WanVAE:
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
        cfg = WAN22 if family == "wan2.2" else WAN21
    if cfg.family != family:
        raise CheckpointError(f"{source}: the weights are a {name} but the config describes a {cfg.family} VAE; "
                              "pass the matching config.json (or none)")
    if fmt == "original":
        sd = original_to_diffusers(sd, cfg)
    check_strict(sd, expected_shapes(cfg), name, source)
    with torch.device("meta"):
        model = WanVAE(cfg, kind=_kind(family, source, diffusers_cfg), flags=flags)
    dtypes = {v.dtype for v in sd.values()}
    dtype = dtypes.pop() if len(dtypes) == 1 else torch.float32  # mixed files: widen; load_vae casts afterwards
    sd = {k: v.to(dtype) for k, v in sd.items()}
    model.load_state_dict(sd, strict=True, assign=True)
    return model


ARCHITECTURES = (Architecture(WAN22_NAME, _detect_wan22, build, priority=6),
                 Architecture(WAN21_NAME, _detect_wan21, build, priority=5))
