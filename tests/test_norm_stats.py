"""Every norm op against float64 on shifted activations, in every layout a pass hands it.

Why: a group whose mean is large against its spread is where one-pass statistics (E[x²] − E[x]² in fp32)
lose the variance. PyTorch's CPU GroupNorm does exactly that for channels-last input (it sums x and x²
per channel), so the channels-last SeedVR2 path was 18x off float64 on a real decode while every test at
zero-mean activations passed. Inputs here have |mean| = 20·std. Each op's error must stay within a few
times what PyTorch's contiguous fp32 kernel (stable statistics) reaches on the same input, and within
1e-4 of the output range.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from turbovae.vae import norms
from turbovae.vae.seedvr2.layerwise import SplitPolicy, norm_silu_pre

MEAN, STD = 20.0, 1.0


def _shifted(shape, g: torch.Generator, *, mean: float = MEAN) -> torch.Tensor:
    # per-channel offsets around `mean`, so groups differ too
    offsets = mean + torch.randn(shape[1], generator=g) * STD
    view = (1, -1) + (1,) * (len(shape) - 2)
    return torch.randn(shape, generator=g) * STD + offsets.view(view)


def _layouts(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """The layouts a pass hands a norm: contiguous, channels-last (4-D) / channels-last-3d (5-D), and views
    of a channels-last tensor (a crop of rows; for 5-D, one frame as a 4-D view)."""
    out = {"contiguous": x.contiguous()}
    if x.ndim == 4:
        cl = x.contiguous(memory_format=torch.channels_last)
        out["channels_last"] = cl
        out["channels_last row crop"] = cl[:, :, 1:-2]
    else:
        cl = x.contiguous(memory_format=torch.channels_last_3d)
        out["channels_last_3d"] = cl
        out["channels_last_3d row crop"] = cl[:, :, :, 1:-2]
        out["channels_last_3d frame view"] = cl[:, :, x.shape[2] // 2]
    return out


def _err(out: torch.Tensor, truth: torch.Tensor) -> float:
    return (out.double() - truth).abs().max().item()


def _range(t: torch.Tensor) -> float:
    return (t.max() - t.min()).item()


GN_SHAPES = [((2, 64, 40, 56), 32), ((1, 128, 3, 24, 40), 32), ((1, 512, 1, 20, 28), 32), ((1, 32, 5, 9, 7), 8)]


@pytest.mark.parametrize("shape,groups", GN_SHAPES)
@pytest.mark.parametrize("silu", [False, True])
def test_group_norm_is_stable_in_every_layout(shape, groups, silu, seeded):
    x = _shifted(shape, seeded)
    w = torch.randn(shape[1], generator=seeded)
    b = torch.randn(shape[1], generator=seeded)
    for name, xl in _layouts(x).items():
        truth = norms.group_norm_silu_reference(xl.double().contiguous(), groups, w.double(), b.double(), 1e-6, silu=silu)
        stable = _err(norms.group_norm_silu_reference(xl.contiguous(), groups, w, b, 1e-6, silu=silu), truth)
        for op in (norms.group_norm_silu_reference, norms.group_norm_silu):
            out = op(xl, groups, w, b, 1e-6, silu=silu)
            assert out.shape == xl.shape
            err = _err(out, truth)
            assert err <= 4 * stable + 1e-6, f"{op.__name__} {name}: {err:.2e} vs the contiguous kernel's {stable:.2e}"
            assert err <= 1e-4 * _range(truth), f"{op.__name__} {name}: {err:.2e}"


@pytest.mark.parametrize("shape", [(2, 64, 40, 56), (1, 96, 3, 24, 40)])
def test_group_norm_keeps_the_input_layout(shape, seeded):
    x = _shifted(shape, seeded)
    for name, xl in _layouts(x).items():
        if xl.ndim != x.ndim or not xl.is_contiguous(memory_format=torch.channels_last_3d if xl.ndim == 5
                                                     else torch.channels_last):
            continue
        out = norms.group_norm_silu_reference(xl, 32, None, None, 1e-6)
        assert out.stride() == xl.stride(), name


def test_stable_group_norm_merges_many_chunks(seeded, monkeypatch):
    """Chunks of one row (a sum of squared deviations per row) give what one chunk gives."""
    x = _shifted((2, 64, 23, 17), seeded, mean=50.0).contiguous(memory_format=torch.channels_last)
    truth = F.group_norm(x.double().contiguous(), 16, None, None, 1e-6)
    whole = norms.group_norm_channels_last(x, 16, None, None, 1e-6)
    monkeypatch.setattr(norms, "_STATS_CHUNK_ELEMS", 1)
    rows = norms.group_norm_channels_last(x, 16, None, None, 1e-6)
    assert _err(whole, truth) <= 2e-5 and _err(rows, truth) <= 2e-5
    with pytest.raises(ValueError, match="divisible"):
        norms.group_norm_channels_last(x, 5, None, None, 1e-6)


@pytest.mark.parametrize("shape", [(2, 64, 12, 20), (1, 64, 1, 12, 20), (1, 64, 3, 12, 20)])
def test_group_norm_in_place_writes_into_its_input_and_equals_the_new_tensor(shape, seeded):
    """`inplace=True` on the CPU channels-last path: the result is in x's storage and equals, bit for bit, what a
    new tensor gets; on a contiguous input (PyTorch's kernel) x is left as it was."""
    fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
    x = _shifted(shape, seeded).contiguous(memory_format=fmt)
    w, b = torch.randn(shape[1], generator=seeded), torch.randn(shape[1], generator=seeded)
    fresh = norms.group_norm_silu(x, 16, w, b, 1e-6)
    target = x.clone()
    out = norms.group_norm_silu(target, 16, w, b, 1e-6, inplace=True)
    assert out.data_ptr() == target.data_ptr() and torch.equal(out, fresh) and torch.equal(target, fresh)
    contiguous = x.contiguous()
    before = contiguous.clone()
    out = norms.group_norm_silu(contiguous, 16, w, b, 1e-6, inplace=True)
    assert torch.equal(contiguous, before) and torch.allclose(out, fresh, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last_3d])
def test_rms_norm_into_a_slot_equals_the_new_tensor(dtype, fmt, seeded):
    """`rms_norm_silu(out=)` (a causal conv's padded input, frames 2..): the slot gets what a new tensor gets (to
    the last bit or two: a strided output takes PyTorch's unvectorised SiLU loop) and the history is untouched."""
    x = _shifted((1, 24, 3, 6, 7), seeded).to(dtype).contiguous(memory_format=fmt)
    g = (torch.rand(24, 1, 1, 1, generator=seeded) + 0.5).to(dtype)
    padded = torch.full((1, 24, 5, 6, 7), 3.0, dtype=dtype).contiguous(memory_format=fmt)
    out = norms.rms_norm_silu(x, g, out=padded[:, :, 2:])
    assert out.data_ptr() == padded[:, :, 2:].data_ptr()
    fresh = norms.rms_norm_silu(x, g).float()
    assert (padded[:, :, 2:].float() - fresh).abs().max() <= 2 * torch.finfo(dtype).eps * fresh.abs().max()
    assert torch.equal(padded[:, :, :2], torch.full_like(padded[:, :, :2], 3.0))
    with pytest.raises(ValueError, match="out is"):
        norms.rms_norm_silu(x, g, out=padded)


def test_stable_group_norm_when_the_channel_means_carry_the_variance(seeded):
    """Channels of one group far apart (means ±30 around 100) with little spread each (std 0.05): the group's
    variance is almost all the spread of its channel means, the term the stable path adds to the channels' own
    sums of squared deviations."""
    c = 64
    offsets = 100.0 + 30.0 * torch.tensor([(-1.0) ** i for i in range(c)]) + torch.randn(c, generator=seeded)
    x = (torch.randn(2, c, 17, 29, generator=seeded) * 0.05 + offsets.view(1, c, 1, 1))
    x = x.contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(c, generator=seeded), torch.randn(c, generator=seeded)
    truth = F.group_norm(x.double().contiguous(), 16, w.double(), b.double(), 1e-6)
    stable = _err(F.group_norm(x.contiguous(), 16, w, b, 1e-6), truth)
    err = _err(norms.group_norm_channels_last(x, 16, w, b, 1e-6), truth)
    assert err <= 4 * stable + 1e-6 and err <= 1e-5 * _range(truth), (err, stable)


def test_pytorch_channels_last_cpu_group_norm_still_cancels(seeded):
    """Why the stable path exists: if PyTorch's CPU kernel stops cancelling, this fails and the stable path
    (and its cost) can go; until then the stable path is what keeps the tests above passing."""
    x = _shifted((1, 128, 40, 56), seeded, mean=100.0)
    truth = F.group_norm(x.double(), 32, None, None, 1e-6)
    native = _err(F.group_norm(x.contiguous(memory_format=torch.channels_last), 32, None, None, 1e-6), truth)
    assert native > 100 * _err(F.group_norm(x, 32, None, None, 1e-6), truth)


@pytest.mark.parametrize("shape", [(2, 96, 40, 56), (1, 384, 3, 24, 40), (1, 16, 1, 9, 7)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_rms_norm_is_stable_in_every_layout(shape, with_bias, seeded):
    """Wan's RMS norm sums squares of one pixel's channels (no mean subtracted, nothing to cancel): fp32
    accuracy in every layout, on shifted inputs too."""
    x = _shifted(shape, seeded)
    gamma = (1 + 0.1 * torch.randn(shape[1], generator=seeded)).view((-1,) + (1,) * (len(shape) - 2))
    bias = torch.randn(shape[1], generator=seeded).view(gamma.shape) if with_bias else None
    for name, xl in _layouts(x).items():
        g = gamma if xl.ndim == gamma.ndim + 1 else gamma.view((-1,) + (1,) * (xl.ndim - 2))
        bb = None if bias is None else bias.view(g.shape)
        truth = norms.rms_norm_silu_reference(xl.double(), g.double(), None if bb is None else bb.double())
        for op in (norms.rms_norm_silu_reference, norms.rms_norm_silu):
            err = _err(op(xl, g, bb), truth)
            assert err <= 2e-6 * truth.abs().max().item(), f"{op.__name__} {name}: {err:.2e}"


@pytest.mark.parametrize("layout", ["contiguous", "channels_last_3d"])
def test_exact_tiling_norm_statistics_are_stable(layout, seeded):
    """SeedVR2's exact-tiling norm (whole-frame statistics summed in fp64 over row chunks) on shifted input."""
    x = _shifted((1, 64, 3, 24, 40), seeded)
    if layout != "contiguous":
        x = x.contiguous(memory_format=torch.channels_last_3d)
    norm = nn.GroupNorm(32, 64, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(64, generator=seeded))
        norm.bias.copy_(torch.randn(64, generator=seeded))
    apply = norm_silu_pre(norm, x, SplitPolicy(budget_elems=64 * 3 * 40 * 5))  # five rows a chunk
    truth = norms.group_norm_silu_reference(x.double().contiguous(), 32, norm.weight.double(), norm.bias.double(),
                                          1e-6)
    with torch.no_grad():
        out = apply(x)
    assert _err(out, truth) <= 1e-4 * _range(truth)
    assert _err(out, truth) <= 4 * _err(norms.group_norm_silu_reference(x.contiguous(), 32, norm.weight,
                                                                       norm.bias, 1e-6), truth) + 1e-6


@pytest.mark.gpu
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("fused", [False, True])
def test_cuda_group_norm_is_stable_on_shifted_input(channels_last, fused, seeded):
    """CUDA's native GroupNorm (makes the input contiguous, Welford statistics) and the Triton kernels, on
    shifted real-size input in both layouts, against float64 — fp32, so the bar is fp32's."""
    x = _shifted((1, 128, 5, 90, 160), seeded).cuda()
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last_3d)
    w = torch.randn(128, generator=seeded).cuda()
    truth = norms.group_norm_silu_reference(x.double().contiguous(), 32, w.double(), w.double(), 1e-6)
    with norms.fused_norms(fused):
        out = norms.group_norm_silu(x, 32, w, w, 1e-6)
    assert _err(out, truth) <= 1e-4 * _range(truth)


@pytest.mark.gpu
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("fused", [False, True])
def test_cuda_rms_norm_is_stable_on_shifted_input(channels_last, fused, seeded):
    x = _shifted((1, 384, 3, 90, 160), seeded).cuda()
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last_3d)
    gamma = torch.rand(384, 1, 1, 1, generator=seeded).cuda()
    truth = norms.rms_norm_silu_reference(x.double(), gamma.double())
    with norms.fused_norms(fused):
        out = norms.rms_norm_silu(x, gamma)
    assert _err(out, truth) <= 2e-6 * truth.abs().max().item()
