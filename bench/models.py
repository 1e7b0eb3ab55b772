"""The models the bench sections measure: an architecture in fp32 on CPU, from the user's checkpoint or with
seeded random weights. Shared by the sections (gpu, engines, slices, parallel), so none imports another
section for it."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..vae.registry import family
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


def family_model(name: str, *, real: bool) -> nn.Module:
    """A registered family's model (vae/registry.py: key or alias) of its real or tiny config, default init."""
    fam = family(name)
    return fam.build_model(fam.config(real=real))


def checkpoint_for(name: str, opts: BenchOptions) -> Optional[str]:
    """The checkpoint the options name for this family (under its key or an alias), if any."""
    return next((opts.checkpoint[n] for n in family(name).names if opts.checkpoint.get(n)), None)


def build_model(arch: str, opts: BenchOptions, quick: bool) -> nn.Module:
    """The architecture in fp32 on CPU, from the user's checkpoint or seeded random weights."""
    ckpt = checkpoint_for(arch, opts)
    if ckpt:
        from ..vae.loader import load_checkpoint

        return load_checkpoint(ckpt, device="cpu", dtype=torch.float32).model
    return seeded_init(family_model(arch, real=not quick)).eval()
