"""Seeded weights that follow the original code's own initialisation: each family's real-config model as its
constructors leave it, before any checkpoint is loaded.

Why a second kind of seeded weights: `vae.seeded_weights.fan_in_weights` (normals scaled by fan-in, small
biases, norm scales near 1) keeps activations O(1), and bench/fidelity.py shifts its biases to stress the
norms. A reviewer measuring on weights built the way the reference code builds them saw a fast path (CPU
channels-last) cost three times the plain path's error where the fan-in weights showed under twice: the
spread of the weights and of the activations they make decides how much a kernel's summation order costs,
so the fidelity bench and its test run both.

The rules: PyTorch's default module init (convolutions and linears uniform in ±1/√fan_in for weights and
biases, GroupNorm scale 1 and shift 0, Wan's RMS-norm gamma 1), which our modules share with the reference
ones, then what each reference constructor adds on top (shared/specs):

- SeedVR2: every upsampler's `upscale_conv` is a repeated identity with zero bias (seedvr2_vae.md §9);
- Wan 2.1 / Qwen-Image and Wan 2.2: the mid-block attention's output projection weight is zero
  (wan_qwen_vae.md, "AttentionBlock"); its bias keeps the default init.

The values are not the reference's draw (its modules are built in another order); their distributions are.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..vae.registry import family
from ..vae.seedvr2 import SeedVR2VAE
from ..vae.wan import WanVAE

StateDict = dict[str, torch.Tensor]


def _seedvr2_own_init(sd: StateDict) -> None:
    """Each `upscale_conv` [C·r, C, 1, 1, 1]: r stacked C×C identities (output channel k·C + c reads channel c),
    bias zero."""
    for key in sd:
        if key.endswith("upscale_conv.weight"):
            out_ch, in_ch = sd[key].shape[:2]
            sd[key] = torch.eye(in_ch).repeat(out_ch // in_ch, 1).reshape(sd[key].shape)
        elif key.endswith("upscale_conv.bias"):
            sd[key] = torch.zeros_like(sd[key])


def _wan_own_init(sd: StateDict) -> None:
    """The attention blocks' `proj` weight zero (Wan's AttentionBlock zeroes it in its constructor)."""
    for key in sd:
        if key.endswith("attentions.0.proj.weight"):
            sd[key] = torch.zeros_like(sd[key])


# What each reference constructor adds, by the architecture that follows that reference (the Qwen-Image / Wan 2.1
# and Wan 2.2 families share Wan's).
_OWN_INIT: dict[type, Callable[[StateDict], None]] = {
    SeedVR2VAE: _seedvr2_own_init,
    WanVAE: _wan_own_init,
}


def reference_init_weights(family_name: str, seed: int = 0) -> StateDict:
    """The state dict of `family_name`'s real-config model with the reference code's initialisation (module
    docstring), drawn from a generator seeded with `seed` (the global RNG is left as it was)."""
    fam = family(family_name)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = fam.build_model(fam.config(real=True))
    own_init = _OWN_INIT.get(type(model))
    if own_init is None:
        raise ValueError(f"no reference initialisation is known for {fam.key!r} ({type(model).__name__}); known: "
                         f"{', '.join(cls.__name__ for cls in _OWN_INIT)}")
    sd = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    del model
    own_init(sd)
    return sd
