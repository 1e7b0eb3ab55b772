"""The models the bench sections measure: an architecture in fp32 on CPU, from the user's checkpoint or with
seeded random weights. Shared by the sections (gpu, engines, slices, parallel), so none imports another
section for it."""

from __future__ import annotations

import torch
from torch import nn

from .common import BenchOptions


def seeded_init(model: nn.Module, seed: int = 0) -> nn.Module:
    """Fan-in-scaled random weights so activations stay O(1) through the whole network."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(0.02 * torch.randn(p.shape, generator=g))
            elif p.ndim == 1 or name.endswith("gamma"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                t = torch.randn(p.shape, generator=g)
                p.copy_(t / t[0].numel() ** 0.5)
    return model


def build_model(arch: str, opts: BenchOptions, quick: bool) -> nn.Module:
    """The architecture in fp32 on CPU, from the user's checkpoint or seeded random weights."""
    if arch == "qwen":
        from ..vae.wan import TINY_WAN21, WAN21, WanVAE

        ckpt = opts.checkpoint.get("qwen")
        if ckpt:
            from ..vae.api import load_checkpoint

            return load_checkpoint(ckpt, device="cpu", dtype=torch.float32).model
        return seeded_init(WanVAE(TINY_WAN21 if quick else WAN21)).eval()
    from ..vae.seedvr2 import SeedVR2Config, SeedVR2VAE

    ckpt = opts.checkpoint.get("seedvr2")
    if ckpt:
        from ..vae.api import load_checkpoint

        return load_checkpoint(ckpt, device="cpu", dtype=torch.float32).model
    return seeded_init(SeedVR2VAE(SeedVR2Config.tiny() if quick else SeedVR2Config())).eval()
