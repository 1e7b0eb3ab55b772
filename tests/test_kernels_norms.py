"""Fused Triton norm kernels ≡ the PyTorch reference ops in vae/norms.

Without CUDA the kernels run in Triton's interpreter (TRITON_INTERPRET=1) on CPU tensors, so the
same numerics are checked in CI; shapes are deliberately odd (not multiples of any block size) and
small enough for the interpreter. Errors are relative to the reference's largest magnitude.
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch

from turbovae.vae import norms

_ON_GPU = torch.cuda.is_available()


def _load_kernels():
    """Import the kernel module; without a GPU, in Triton's interpreter mode.

    The interpreter is chosen when Triton *itself* is imported (its standard library is decorated
    then), so the variable is set around the first import of triton and restored afterwards.
    """
    if _ON_GPU:
        pytest.importorskip("triton")
        return importlib.import_module("turbovae.vae.accel.kernels.triton_norms")
    if "triton" in sys.modules and not _interpreting():
        pytest.skip("triton was imported before this module without TRITON_INTERPRET=1; run "
                    "`TRITON_INTERPRET=1 python -m pytest tests/test_kernels_norms.py`", allow_module_level=True)
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        pytest.importorskip("triton")
        return importlib.import_module("turbovae.vae.accel.kernels.triton_norms")
    finally:
        if previous is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = previous


def _interpreting() -> bool:
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(sys.modules["triton"].language.zeros, InterpretedFunction)


K = _load_kernels()


@pytest.fixture(autouse=True)
def _interpreter_env(monkeypatch):
    # Triton also reads the variable lazily at launch time (e.g. when it first imports gluon).
    if not _ON_GPU:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
DEVICE = "cuda" if _ON_GPU else "cpu"


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest element error relative to the reference's largest magnitude."""
    return ((out.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


def normwise_rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def assert_matches(out: torch.Tensor, ref: torch.Tensor, truth: torch.Tensor) -> None:
    """fp32: ≤ 1e-5 vs the PyTorch op. bf16/fp16: ≤ 1e-2 (norm-wise) vs the PyTorch op, and a single
    rounding of the fp32 truth, which the op itself (rounding after the norm, the bias add and the
    SiLU) does not always reach, so element-wise it can sit 1-2 ulps from the kernel."""
    if out.dtype == torch.float32:
        assert rel_err(out, ref) <= 1e-5
        return
    assert normwise_rel_err(out, ref) <= 1e-2
    # eps = ulp of 1.0. On the GPU fp32 -> bf16/fp16 rounds to nearest (half an ulp); Triton's
    # interpreter truncates (triton/runtime/interpreter.py, cast_impl), which is up to one ulp.
    ulps = 0.5 if _ON_GPU else 1.0
    assert rel_err(out, truth) <= torch.finfo(out.dtype).eps * ulps * 1.01


def _layout(x: torch.Tensor, channels_last: bool) -> torch.Tensor:
    if not channels_last:
        return x.contiguous()
    return x.to(memory_format=torch.channels_last_3d if x.ndim == 5 else torch.channels_last)


GN_CASES = [  # shape, groups
    ((2, 8, 3, 7, 5), 4),     # video, several frames, tiny groups
    ((1, 12, 1, 9, 11), 4),   # single-frame video tensor (T = 1 path), C/G = 3 (not a power of two)
    ((1, 6, 13, 17), 3),      # image [N, C, H, W]
    ((1, 4, 2, 70, 67), 2),   # enough pixels for several statistics chunks per group
]


@pytest.mark.parametrize("shape,groups", GN_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
def test_group_norm_silu_matches_reference(shape, groups, dtype, channels_last, seeded):
    x = _layout((torch.randn(shape, generator=seeded) * 2.5 + 0.7).to(DEVICE, dtype), channels_last)
    w = torch.randn(shape[1], generator=seeded).to(DEVICE, dtype)
    b = torch.randn(shape[1], generator=seeded).to(DEVICE, dtype)
    out = K.group_norm_silu(x, groups, w, b, 1e-6, True)
    ref = norms.group_norm_silu_reference(x, groups, w, b, 1e-6, silu=True)
    assert out.shape == ref.shape and out.dtype == dtype
    assert out.stride() == x.stride(), "output must keep the input's memory format"
    assert_matches(out, ref, norms.group_norm_silu_reference(x.float(), groups, w.float(), b.float(), 1e-6))


def test_group_norm_large_mean_keeps_fp32_accuracy(seeded):
    # A large common offset is where E[x²] − E[x]² in fp32 loses the variance; the chunked, pivoted
    # Welford merge must stay at fp32 accuracy against an fp64 computation of the same input.
    x = (torch.randn(1, 4, 2, 40, 33, generator=seeded) + 300.0).to(DEVICE)
    out = K.group_norm_silu(x, 2, None, None, 1e-6, False)
    truth = norms.group_norm_silu_reference(x.double(), 2, None, None, 1e-6, silu=False)
    assert rel_err(out, truth) <= 1e-5
    frames = x.double().transpose(1, 2).reshape(2, 2, -1).float()  # (frame, group, elements)
    naive_var = frames.pow(2).mean(-1) - frames.mean(-1).pow(2)
    assert (naive_var.double() - frames.double().var(-1, unbiased=False)).abs().max() > 1e-3  # the trap is real


def test_group_norm_residual_prologue(seeded):
    x = torch.randn(1, 8, 2, 6, 5, generator=seeded).to(DEVICE)
    r = torch.randn(1, 8, 2, 6, 5, generator=seeded).to(DEVICE)
    w, b = torch.randn(8, generator=seeded).to(DEVICE), torch.randn(8, generator=seeded).to(DEVICE)
    out, summed = K.group_norm_silu(x, 4, w, b, 1e-6, True, residual=r, return_sum=True)
    assert torch.equal(summed, x + r)
    assert rel_err(out, norms.group_norm_silu_reference(x + r, 4, w, b, 1e-6)) <= 1e-5


RMS_CASES = [  # shape, gamma shape
    ((2, 12, 3, 5, 7), (12, 1, 1, 1)),  # ResBlock / head norm (images=False)
    ((3, 24, 9, 6), (24, 1, 1)),        # attention norm on frames folded into the batch (images=True)
    ((1, 96, 1, 4, 5), (96, 1, 1, 1)),  # Wan decoder head width, T = 1
    ((1, 20, 2, 1, 9), (20, 1, 1, 1)),  # a unit spatial dim must not break pixel flattening
]


@pytest.mark.parametrize("shape,gshape", RMS_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_rms_norm_silu_matches_reference(shape, gshape, dtype, channels_last, with_bias, seeded):
    x = _layout((torch.randn(shape, generator=seeded) * 3).to(DEVICE, dtype), channels_last)
    gamma = (torch.rand(gshape, generator=seeded) + 0.5).to(DEVICE, dtype)
    bias = torch.randn(gshape, generator=seeded).to(DEVICE, dtype) if with_bias else None
    out = K.rms_norm_silu(x, gamma, bias, True, 1e-12)
    ref = norms.rms_norm_silu_reference(x, gamma, bias, silu=True)
    assert out.stride() == x.stride()
    truth = norms.rms_norm_silu_reference(x.float(), gamma.float(), bias.float() if with_bias else None)
    assert_matches(out, ref, truth)


def test_rms_norm_zero_pixels_use_eps_clamp_like_reference():
    x = torch.zeros(1, 8, 1, 3, 3, device=DEVICE)
    x[..., 0, 0] = 1.0
    gamma = torch.ones(8, 1, 1, 1, device=DEVICE)
    out = K.rms_norm_silu(x, gamma, None, False, 1e-12)
    ref = norms.rms_norm_silu_reference(x, gamma, None, silu=False)
    assert torch.isfinite(out).all() and rel_err(out, ref) <= 1e-5


@pytest.mark.parametrize("channels_last", [False, True])
def test_rms_norm_writes_into_the_frames_slot_of_a_padded_buffer(channels_last, seeded):
    """`out=`: the kernel fills a strided view (frames 2.. of a causal conv's padded input) and nothing else."""
    x = _layout(torch.randn(1, 16, 3, 5, 6, generator=seeded).to(DEVICE), channels_last)
    gamma = (torch.rand(16, 1, 1, 1, generator=seeded) + 0.5).to(DEVICE)
    padded = _layout(torch.full((1, 16, 5, 5, 6), 7.0, device=DEVICE), channels_last)
    out = K.rms_norm_silu(x, gamma, None, True, 1e-12, out=padded[:, :, 2:])
    assert out.data_ptr() == padded[:, :, 2:].data_ptr()
    assert rel_err(padded[:, :, 2:], norms.rms_norm_silu_reference(x, gamma)) <= 1e-5
    assert torch.equal(padded[:, :, :2], torch.full_like(padded[:, :, :2], 7.0))


def test_rms_norm_residual_prologue(seeded):
    x, r = (torch.randn(2, 16, 2, 3, 4, generator=seeded).to(DEVICE) for _ in range(2))
    gamma = torch.rand(16, 1, 1, 1, generator=seeded).to(DEVICE)
    out, summed = K.rms_norm_silu(x, gamma, None, True, residual=r, return_sum=True)
    assert torch.equal(summed, x + r)
    assert rel_err(out, norms.rms_norm_silu_reference(x + r, gamma)) <= 1e-5


def test_unsupported_layouts_return_none_for_the_reference_path(seeded):
    x = torch.randn(1, 8, 2, 6, 10, generator=seeded).to(DEVICE)[..., ::2]  # W stride 2, H stride 10: not flattenable
    gamma = torch.ones(8, 1, 1, 1, device=DEVICE)
    assert K.group_norm_silu(x, 4, None, None, 1e-6) is not None  # a plain stride-2 pixel axis is still one stride
    odd = torch.randn(1, 8, 2, 6, 10, generator=seeded).to(DEVICE).transpose(3, 4)  # W outer, H inner
    assert K.group_norm_silu(odd, 4, None, None, 1e-6) is None
    assert K.rms_norm_silu(odd, gamma, None) is None
    with pytest.raises(ValueError, match="residual must match"):
        K.group_norm_silu(x.contiguous(), 4, None, None, 1e-6, residual=x.contiguous().transpose(3, 4).contiguous()
                          .transpose(3, 4))


@pytest.mark.gpu
@pytest.mark.parametrize("shape,groups", [((1, 512, 1, 135, 240), 32), ((1, 128, 5, 180, 320), 32)])
@pytest.mark.parametrize("channels_last", [False, True])
def test_group_norm_real_sizes_on_gpu(shape, groups, channels_last, seeded):
    x = _layout(torch.randn(shape, generator=seeded).to("cuda", torch.bfloat16), channels_last)
    w = torch.randn(shape[1], generator=seeded).to("cuda", torch.bfloat16)
    out = K.group_norm_silu(x, groups, w, w, 1e-6, True)
    ref = norms.group_norm_silu_reference(x, groups, w, w, 1e-6)
    assert_matches(out, ref, norms.group_norm_silu_reference(x.float(), groups, w.float(), w.float(), 1e-6))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 384, 1, 128, 128), (1, 96, 1, 1024, 1024), (1, 384, 3, 90, 160)])
@pytest.mark.parametrize("channels_last", [False, True])
def test_rms_norm_real_sizes_on_gpu(shape, channels_last, seeded):
    x = _layout(torch.randn(shape, generator=seeded).to("cuda", torch.bfloat16), channels_last)
    gamma = torch.rand(shape[1], 1, 1, 1, generator=seeded).to("cuda", torch.bfloat16)
    out = K.rms_norm_silu(x, gamma, None, True)
    assert_matches(out, norms.rms_norm_silu_reference(x, gamma), norms.rms_norm_silu_reference(x.float(), gamma.float()))


def test_every_launch_runs_under_the_guard_of_the_tensors_device(monkeypatch):
    """Triton launches on the current CUDA device, not the tensor's: each launch site enters
    `device_guard.on_device(x.device)` (a recording fake here), and leaves it before returning."""
    from contextlib import contextmanager

    from turbovae.vae import device_guard

    entered, open_guards = [], []

    @contextmanager
    def recording_on_device(device):
        entered.append(torch.device(device))
        open_guards.append(device)
        yield
        open_guards.pop()

    monkeypatch.setattr(device_guard, "on_device", recording_on_device)
    x = torch.randn(1, 8, 2, 5, 7)
    assert K.group_norm_silu(x, 4, torch.ones(8), torch.zeros(8), 1e-6) is not None
    assert K.rms_norm_silu(x, torch.ones(8)) is not None
    assert entered == [x.device, x.device] and open_guards == []
