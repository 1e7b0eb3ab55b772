"""The composed space-only upsampler (vae/seedvr2/subpixel.py) against the plain 1×1 conv + shuffle + causal conv.

Weights are seeded at the shipped model's scale; the layer runs at a channel count where the composition
applies, first slices (image, clip), later slices with causal cache, and the memory it hands on.
"""

import pytest
import torch

from turbovae.vae.seedvr2 import FastPaths, SeedVR2Config, SeedVR2VAE
from turbovae.vae.seedvr2 import subpixel
from turbovae.vae.seedvr2.layers import SeedVR2PassContext, Upsample3D

TOL = 1e-5
COMPOSED = FastPaths()
PLAIN_LAYER = FastPaths().without("subpixel_conv")


def seeded_upsampler(channels: int, seed: int = 0, temporal: bool = False) -> Upsample3D:
    g = torch.Generator().manual_seed(seed)
    up = Upsample3D(channels, temporal=temporal).eval().requires_grad_(False)
    for p in up.parameters():
        fan_in = p[0].numel() if p.ndim > 1 else 1
        p.copy_(torch.randn(p.shape, generator=g) * (fan_in ** -0.5 if p.ndim > 1 else 0.1))
    return up


def run_slices(up: Upsample3D, x: torch.Tensor, bounds, composed: bool):
    """Outputs and memories of consecutive slices, as decode steps chain them: through the composition
    (whatever the size rule says), or through the plain layer."""
    outs, memories, state = [], [], None
    with torch.inference_mode():
        for a, b in bounds:
            ctx = SeedVR2PassContext(COMPOSED if composed else PLAIN_LAYER, state, collect=True)
            layer = (lambda v, c: subpixel.upsample_conv(up, v, c)) if composed else up
            outs.append(layer(x[:, :, a:b], ctx))
            state = ctx.finish()
            memories.append(state)
    return outs, memories


SLICINGS = [[(0, 1)], [(0, 2)], [(0, 3)], [(0, 5)], [(0, 1), (1, 2), (2, 6)], [(0, 2), (2, 3), (3, 7)],
            [(0, 3), (3, 7)]]


@pytest.mark.parametrize("temporal", [False, True], ids=["space", "space-time"])
@pytest.mark.parametrize("bounds", SLICINGS)
def test_composed_upsampler_equals_plain_layer(bounds, temporal):
    up = seeded_upsampler(16, temporal=temporal)
    x = torch.randn(1, 16, bounds[-1][1], 5, 4, generator=torch.Generator().manual_seed(1))
    fast, fast_mem = run_slices(up, x, bounds, composed=True)
    plain, plain_mem = run_slices(up, x, bounds, composed=False)
    for f, p in zip(fast, plain):
        assert f.shape == p.shape
        assert (f - p).abs().max().item() <= TOL
    for fm, pm in zip(fast_mem, plain_mem):
        assert [t.shape for t in fm] == [t.shape for t in pm]
        assert all((a - b).abs().max().item() <= TOL for a, b in zip(fm, pm))


@pytest.mark.parametrize("temporal", [False, True], ids=["space", "space-time"])
def test_memory_from_one_path_continues_on_the_other(temporal):
    """A slice on the composed path hands memory the plain path continues from, and the other way round."""
    up = seeded_upsampler(24, seed=2, temporal=temporal)
    x = torch.randn(1, 24, 6, 7, 8, generator=torch.Generator().manual_seed(3))
    ref, _ = run_slices(up, x, [(0, 6)], composed=False)
    for first_composed in (True, False):
        with torch.inference_mode():
            ctx = SeedVR2PassContext(PLAIN_LAYER, None, collect=True)
            a = subpixel.upsample_conv(up, x[:, :, :2], ctx) if first_composed else up(x[:, :, :2], ctx)
            ctx2 = SeedVR2PassContext(PLAIN_LAYER, ctx.finish(), collect=False)
            b = up(x[:, :, 2:], ctx2) if first_composed else subpixel.upsample_conv(up, x[:, :, 2:], ctx2)
        assert (torch.cat([a, b], dim=2) - ref[0]).abs().max().item() <= TOL


def test_composed_kernels_and_bias_reproduce_a_frame_at_every_border():
    """One frame of 2×2 low-resolution pixels: every output pixel is a border pixel of some kind."""
    up = seeded_upsampler(32, seed=4)
    x = torch.randn(1, 32, 1, 2, 2, generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        fast = subpixel.upsample_conv(up, x, SeedVR2PassContext(FastPaths(), None))
        plain = up.conv(up.upscale(x, SeedVR2PassContext(PLAIN_LAYER, None)), SeedVR2PassContext(PLAIN_LAYER, None))
    assert (fast - plain).abs().max().item() <= TOL


def test_small_layers_keep_the_plain_path():
    assert not subpixel.worth_composing(512, 4 * 8 * 8)
    assert subpixel.worth_composing(256, 4 * 5 * 32 * 32)
    # the temporal stage composes twice the rows: it needs a larger output for the same channels
    assert subpixel.worth_composing(512, 4 * 9 * 64 * 64, zr=2)
    assert not subpixel.worth_composing(512, 4 * 5 * 16 * 16, zr=2)


@pytest.mark.parametrize("zr", [1, 2])
@pytest.mark.parametrize("frames", [1, 2, 3, 6])
@pytest.mark.parametrize("first_slice", [True, False])
def test_output_classes_cover_every_frame_once(zr, frames, first_slice):
    frames_out = subpixel.output_frames(zr, frames, first_slice)
    assert frames_out == zr * frames - int(zr == 2 and first_slice)
    assert subpixel.classes_cover(subpixel.output_classes(zr, 3, frames, first_slice), frames_out)


def test_decoder_with_composed_upsampler_equals_plain_decoder():
    """Tiny topology, clip and image, whole and sliced: the composed path changes no output beyond rounding."""
    cfg = SeedVR2Config.tiny()
    model = SeedVR2VAE(cfg).eval().requires_grad_(False)
    g = torch.Generator().manual_seed(6)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (p[0].numel() ** -0.5 if p.ndim > 1 else 0.05))
    z = torch.randn(1, cfg.latent_channels, 3, 4, 4, generator=g)
    spatial_up = model.decoder.up_blocks[2].upsamplers[0]
    assert spatial_up.zr == 1
    assert subpixel.worth_composing(spatial_up.conv.in_channels, 4 * 16 * 16)  # its input is 16×16 here: composed
    with torch.inference_mode():
        outs = {}
        for name, fast in [("composed", COMPOSED), ("plain", PLAIN_LAYER)]:
            model.fast = fast
            outs[name] = [model.decode_latents(z), model.decode_latents(z, temporal_slice=1),
                          model.decode_latents(z[:, :, :1])]
    for f, p in zip(outs["composed"], outs["plain"]):
        assert (f - p).abs().max().item() <= TOL


@pytest.mark.parametrize("transposed", [False, True])
def test_matmul_through_a_1x1_conv_equals_mm(transposed):
    """`norms.matmul` (the composition's GEMM) runs as a 1×1 conv on CPU: same product as `torch.mm`, any input
    strides, a contiguous result; on the meta device (the FLOP counter) it stays `mm`."""
    from turbovae.vae.norms import matmul

    g = torch.Generator().manual_seed(3)
    a = torch.randn(90, 330, generator=g).t() if transposed else torch.randn(330, 90, generator=g)
    b = torch.randn(90, 70, generator=g)
    out = matmul(a, b)
    assert out.shape == (330, 70) and out.is_contiguous()
    assert (out - a @ b).abs().max().item() <= 1e-4 * (a.abs().max() * b.abs().max() * 90).item() ** 0.5
    assert matmul(a.to("meta"), b.to("meta")).shape == (330, 70)
    assert torch.equal(matmul(a.double(), b.double()), a.double() @ b.double())  # other dtypes: torch.mm itself
