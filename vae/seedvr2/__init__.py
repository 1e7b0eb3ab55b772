"""SeedVR2 3-D causal VAE: detection, strict loading, and the model (registered by vae/registry.py)."""

from __future__ import annotations

from typing import Mapping, Optional

import torch

from ..checkpoint import Architecture, CheckpointError, architecture_error, check_strict, compare_keys
from ..accel.switches import FastPaths
from .config import SeedVR2Config
from .keys import SIGNATURE_KEYS, expected_shapes
from .model import SeedVR2VAE

__all__ = ["SeedVR2VAE", "SeedVR2Config", "FastPaths", "expected_shapes", "build", "detect"]

ARCHITECTURE_NAME = "SeedVR2"


def detect(sd: Mapping[str, torch.Tensor]) -> bool:
    return any(k in sd for k in SIGNATURE_KEYS)


def _reject_2d_convs(sd: Mapping[str, torch.Tensor], expected: Mapping[str, tuple[int, ...]], source: str) -> None:
    flat = sorted(k for k, shape in expected.items() if len(shape) == 5 and k in sd and sd[k].ndim == 4)
    if flat:
        shown = ", ".join(flat[:5]) + (f", … (+{len(flat) - 5} more)" if len(flat) > 5 else "")
        raise CheckpointError(
            f"{source}: {len(flat)} conv weight(s) are 2-D (4-D tensors) where SeedVR2 needs 3-D (5-D) weights: "
            f"{shown}. This is an image-VAE or converted file; use the original SeedVR2 VAE "
            "(ema_vae.pth / ema_vae_fp16.safetensors). 2-D weights are never inflated silently.")


def build(sd: Mapping[str, torch.Tensor], config: Optional[object] = None, source: str = "state dict",
          fast: FastPaths = FastPaths()) -> SeedVR2VAE:
    """Strictly check every key and shape, then load (weights keep the file's dtype until `.to`)."""
    cfg = config if isinstance(config, SeedVR2Config) else SeedVR2Config()
    expected = expected_shapes(cfg)
    if not detect(sd):  # another family: say what it looks like before listing 250 differences
        raise architecture_error(sd, ARCHITECTURE_NAME, compare_keys(sd, expected), source)
    _reject_2d_convs(sd, expected, source)
    check_strict(sd, expected, ARCHITECTURE_NAME, source)
    with torch.device("meta"):
        model = SeedVR2VAE(cfg, fast)
    model.load_state_dict(dict(sd), strict=True, assign=True)
    return model.eval().requires_grad_(False)


ARCHITECTURES = (Architecture(ARCHITECTURE_NAME, detect, build, priority=20),)
