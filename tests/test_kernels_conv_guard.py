"""conv3d regression guard: the policy on fake versions, and the exact fallbacks on CPU."""

from __future__ import annotations

import logging
from contextlib import nullcontext

import pytest
import torch
import torch.nn.functional as F

from turbovae.vae.accel.kernels import conv_guard as G
from turbovae.vae.memory import cpu_conv
from turbovae.vae.memory.cpu_conv import pytorch_kernels

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32


@pytest.mark.parametrize("torch_version,cudnn,dtype,route", [
    ("2.8.0+cu128", 91002, BF16, "native"),    # before the regression
    ("2.9.0+cu128", 91002, BF16, "conv2d"),    # 2.9.0 bypasses cuDNN; 9.10 has the correctness bug
    ("2.9.0+cu130", 91300, FP16, "cudnn"),     # 2.9.0 bypass, cuDNN new enough to call directly
    ("2.9.0+cu130", 91500, BF16, "cudnn"),     # 2.9.0 bypasses cuDNN unconditionally
    ("2.9.1+cu128", 91002, BF16, "conv2d"),    # 2.9.1 needs cuDNN >= 9.15
    ("2.9.1+cu128", 91400, BF16, "cudnn"),
    ("2.9.1+cu128", 91500, BF16, "native"),    # the documented fix
    ("2.10.0+cu128", 91501, FP16, "native"),
    ("2.13.0+cu130", 92100, BF16, "native"),
    ("2.9.0+cu128", 91002, FP32, "native"),    # fp32 never affected
    ("2.9.1", None, BF16, "fp32"),             # no cuDNN at all
])
def test_route_policy(torch_version, cudnn, dtype, route):
    chosen = G.choose_conv3d_route(torch_version, cudnn, dtype)
    assert chosen.route == route
    assert chosen.affected == (route != "native")
    assert torch_version.split("+")[0] in chosen.reason or "not affected" in chosen.reason


def test_route_policy_is_native_off_cuda_and_rejects_garbage():
    assert G.choose_conv3d_route("2.9.0", 91002, BF16, "cpu").route == "native"
    with pytest.raises(ValueError, match="cannot parse torch version"):
        G.choose_conv3d_route("nightly", 91002, BF16)


@pytest.mark.parametrize("frames,kt,stride,padding", [
    (3, 3, 1, (0, 1, 1)),   # causal conv on an image after its 2-frame front pad
    (1, 1, 1, (0, 1, 1)),   # 1x3x3 conv
    (5, 3, 2, (0, 1, 0)),   # strided temporal conv with several output frames
    (2, 3, 1, (1, 0, 1)),   # symmetric temporal padding
])
def test_conv3d_as_conv2d_is_exact_in_fp32(frames, kt, stride, padding, seeded):
    x = torch.randn(2, 6, frames, 7, 9, generator=seeded)
    w = torch.randn(5, 6, kt, 3, 3, generator=seeded)
    b = torch.randn(5, generator=seeded)
    ref = F.conv3d(x, w, b, stride, padding)
    out = G.conv3d_as_conv2d(x, w, b, stride, padding)
    assert out.shape == ref.shape
    assert (out - ref).abs().max().item() <= 1e-5 * ref.abs().max().item()


def test_guarded_conv3d_routes_and_logs_once(seeded, caplog):
    x = torch.randn(1, 4, 3, 6, 6, generator=seeded)
    w = torch.randn(4, 4, 3, 3, 3, generator=seeded)
    b = torch.randn(4, generator=seeded)
    ref = F.conv3d(x, w, b, 1, (0, 1, 1))
    route = G.choose_conv3d_route("2.9.0", 91002, BF16)
    G._LOGGED.clear()
    with caplog.at_level(logging.INFO, logger="turbovae"):
        single = G.conv3d(x, w, b, 1, (0, 1, 1), route=route)          # one output frame: conv2d sum
        multi = G.conv3d(torch.cat([x, x], 2), w, b, 1, (0, 1, 1), route=route)  # several frames: fp32 path
    assert (single - ref).abs().max().item() <= 1e-5 * ref.abs().max().item()
    assert torch.allclose(multi, F.conv3d(torch.cat([x, x], 2), w, b, 1, (0, 1, 1)), rtol=0, atol=1e-4)
    assert [r.message for r in caplog.records].count(f"turbovae conv3d guard: {route.reason}") == 1
    # Unaffected installs are a plain F.conv3d (on the CPU, on PyTorch's kernel choice; see below).
    with pytorch_kernels():
        assert torch.equal(G.conv3d(x, w, b, 1, (0, 1, 1)), ref)


@pytest.mark.parametrize("shape,cout,channels_last", [((1, 4, 3, 6, 6), 4, False), ((1, 128, 5, 6, 40), 128, False),
                                                       ((1, 128, 5, 6, 40), 128, True), ((2, 8, 3, 6, 6), 8, False)])
def test_a_cpu_conv3d_below_pytorchs_onednn_threshold_runs_on_onednn(seeded, shape, cout, channels_last):
    """A band or tile of an exact pass (few rows, or few channels) is below the size at which PyTorch sends a
    conv3d to oneDNN; the package's conv3d calls oneDNN itself there (`cpu_conv.onednn_instead`): the output is
    oneDNN's (equal to calling it), within fp32 rounding of PyTorch's im2col result, laid out as the prediction
    says. Where PyTorch already picks oneDNN (a batch of 2), nothing changes; under `pytorch_kernels`, and with
    autograd recording, the output is PyTorch's, and oneDNN's gradients are the im2col kernel's."""
    x = torch.randn(*shape, generator=seeded)
    x = x.contiguous(memory_format=torch.channels_last_3d) if channels_last else x
    w = torch.randn(cout, shape[1], 3, 3, 3, generator=seeded) / (shape[1] * 27) ** 0.5
    b = torch.randn(cout, generator=seeded)
    args = (b, 1, (0, 1, 1))
    pytorchs = cpu_conv.pytorch_backend(x, w, [1, 1, 1], [0, 1, 1], [1, 1, 1], 1)
    with torch.inference_mode():
        out = G.conv3d(x, w, *args)
        im2col = F.conv3d(x, w, *args)
        onednn = torch.ops.aten.mkldnn_convolution(x, w, b, [0, 1, 1], [1, 1, 1], [1, 1, 1], 1)
        with pytorch_kernels():
            assert torch.equal(G.conv3d(x, w, *args), im2col)
    assert torch.equal(out, onednn)
    assert (out - im2col).abs().max().item() <= 1e-5 * max(1.0, im2col.abs().max().item())
    p = cpu_conv.conv_params(torch.ops.aten.conv3d.default, (x, w, b, [1, 1, 1], [0, 1, 1]), {})
    assert cpu_conv.cpu_backend(p) == torch._C._ConvBackend.Mkldnn
    with pytorch_kernels():
        assert cpu_conv.cpu_backend(p) == pytorchs
    assert out.stride() == cpu_conv.real_output(p, torch.empty(out.shape)).stride()
    assert (pytorchs == torch._C._ConvBackend.Slow3d) == (shape[0] == 1)
    # with autograd recording: the same output, and gradients as PyTorch's kernel gives them
    grads = []
    for kernels in (nullcontext, pytorch_kernels):
        xg, wg = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        with kernels():
            y = G.conv3d(xg, wg, *args)
        y.square().sum().backward()
        grads.append((y.detach(), xg.grad, wg.grad))
    assert torch.equal(grads[0][0], out)
    for ours, theirs in zip(grads[0][1:], grads[1][1:]):
        assert (ours - theirs).abs().max().item() <= 1e-5 * max(1.0, theirs.abs().max().item())


def test_an_exported_conv3d_keeps_pytorchs_op():
    """While tracing, the package's conv3d leaves `aten.conv3d` in the graph (the engines' programs run where they
    are loaded, on that machine's kernels), though eager runs oneDNN on the same shape."""
    class Conv(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4, 4, 3, 3, 3))

        def forward(self, x):
            return G.conv3d(x, self.w, None, 1, (0, 1, 1))

    x = torch.randn(1, 4, 3, 6, 6)
    targets = {str(n.target) for n in torch.export.export(Conv(), (x,)).graph.nodes if n.op == "call_function"}
    assert "aten.conv3d.default" in targets and not any("mkldnn" in t for t in targets)


@pytest.mark.gpu
def test_cudnn_route_matches_native_on_gpu(seeded):
    x = torch.randn(1, 8, 5, 16, 16, generator=seeded).cuda().bfloat16()
    w = torch.randn(8, 8, 3, 3, 3, generator=seeded).cuda().bfloat16()
    b = torch.randn(8, generator=seeded).cuda().bfloat16()
    ref = F.conv3d(x.float(), w.float(), b.float(), 1, 1)
    for route in ("cudnn", "conv2d", "fp32"):
        out = G.conv3d(x, w, b, 1, 1, route=G.Conv3dRoute(route, f"test {route}"))
        assert ((out.float() - ref).norm() / ref.norm()).item() <= 1e-2


@pytest.mark.parametrize("arch", ["seedvr2", "wan2.1"])
def test_both_vaes_route_every_conv3d_through_the_guard(arch, monkeypatch, seeded):
    """With an affected install simulated (the conv2d route), every conv3d of both architectures, in image
    and clip passes, goes through the guard, and the result equals the native conv3d path."""
    from turbovae import TurboVAE
    from turbovae.vae.seedvr2 import SeedVR2Config, SeedVR2VAE
    from turbovae.vae.wan import TINY_WAN21, WanVAE

    torch.manual_seed(0)
    vae = TurboVAE(SeedVR2VAE(SeedVR2Config.tiny()) if arch == "seedvr2" else WanVAE(TINY_WAN21))
    c = vae.latent_format.channels
    z = torch.randn(1, c, 3, 3, 4, generator=seeded)
    x = torch.rand(1, 3, 5, 24, 32, generator=seeded) * 2 - 1
    passes = lambda: (vae.decode(z), vae.decode(z[:, :, :1]), vae.encode(x), vae.encode(x[:, :, :1]))  # noqa: E731
    native = passes()

    affected = G.choose_conv3d_route("2.9.0+cu128", 91002, BF16)
    calls = {"guarded": 0, "folded": 0, "F.conv3d": 0}
    real_as_conv2d, real_conv3d = G.conv3d_as_conv2d, F.conv3d

    def route(dtype, device_type="cuda"):
        calls["guarded"] += 1
        return affected

    def as_conv2d(*a, **k):
        calls["folded"] += 1
        return real_as_conv2d(*a, **k)

    def conv3d(*a, **k):
        calls["F.conv3d"] += 1
        return real_conv3d(*a, **k)

    monkeypatch.setenv("TURBOVAE_SELF_CHECK", "0")  # counted calls: no self-check probes in between
    monkeypatch.setattr(G, "current_route", route)
    monkeypatch.setattr(G, "conv3d_as_conv2d", as_conv2d)
    monkeypatch.setattr(F, "conv3d", conv3d)
    routed = passes()
    # Guarded calls either fold to conv2d or run F.conv3d in fp32: any other F.conv3d bypassed the guard.
    assert calls["folded"] > 0
    assert calls["F.conv3d"] == calls["guarded"] - calls["folded"]
    for got, want in zip(routed, native):
        assert (got - want).abs().max().item() <= 1e-5 * max(1.0, want.abs().max().item())
