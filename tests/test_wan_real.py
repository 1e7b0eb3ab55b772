"""Qwen-Image / Wan 2.1 VAE at the REAL config vs diffusers `AutoencoderKLQwenImage` (fp32, seeded weights).

One diffusers pass per direction at T = 9 (3 latent frames) serves as the reference for T = 1, 5
and 9: diffusers runs chunk by chunk, so its outputs for the first 1 / 5 frames (1 / 2 latents) are
bitwise the same computation as a shorter clip. Ours runs each length separately, sliced and whole.
Wan 2.2 at the real config is checked on the meta device (keys, shapes, parameter count) in
test_wan.py; its numerics are compared there at a reduced width (the real one is ~6x larger).
"""

from __future__ import annotations

import gc

import pytest
import torch

from turbovae.vae.wan import WAN21, build
from turbovae.vae.wan.config import diffusers_kwargs

diffusers = pytest.importorskip("diffusers")

H, W = 64, 80
TOL = 1e-4


@pytest.fixture(scope="module")
def real():
    torch.manual_seed(0)
    ref = diffusers.AutoencoderKLQwenImage(**diffusers_kwargs(WAN21)).eval()
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if name.endswith("gamma"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
    ours = build(ref.state_dict())  # strict against the real config
    g = torch.Generator().manual_seed(1)
    x = torch.rand(1, 3, 9, H, W, generator=g) * 2 - 1
    z = torch.randn(1, 16, 3, H // 8, W // 8, generator=g)
    with torch.inference_mode():
        moments_ref = ref.encode(x).latent_dist.parameters
        pixels_ref = ref.decode(z).sample
    del ref
    gc.collect()
    yield ours, x, z, moments_ref, pixels_ref
    del ours
    gc.collect()


def err(a, b):
    return (a - b).abs().max().item()


@pytest.mark.slow
@pytest.mark.parametrize("frames,temporal_slice", [(1, None), (5, None), (9, 1)])
def test_real_encode_equals_diffusers(real, frames, temporal_slice):
    ours, x, _, moments_ref, _ = real
    lat = (frames - 1) // 4 + 1
    with torch.inference_mode():
        moments = ours.encode_moments(x[:, :, :frames], temporal_slice=temporal_slice)
    assert moments.shape == (1, 32, lat, H // 8, W // 8)
    assert err(moments, moments_ref[:, :, :lat]) <= TOL


@pytest.mark.slow
@pytest.mark.parametrize("latents,temporal_slice", [(1, None), (2, None), (3, 1)])
def test_real_decode_equals_diffusers(real, latents, temporal_slice):
    ours, _, z, _, pixels_ref = real
    frames = 4 * (latents - 1) + 1
    with torch.inference_mode():
        pixels = ours.decode_latents(z[:, :, :latents], temporal_slice=temporal_slice)
    assert pixels.shape == (1, 3, frames, H, W)
    want = pixels_ref[:, :, :frames]
    assert (want.abs() < 0.999).float().mean() > 0.5  # mostly unclamped: the comparison is not vacuous
    assert err(pixels, want) <= TOL
