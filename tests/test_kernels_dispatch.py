"""How the fused kernels are selected: lazily, never at import, never on CPU, switchable off."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from turbovae.vae import kernels, ops


def test_import_turbovae_installs_nothing_and_imports_no_triton():
    code = ("import sys, turbovae, turbovae.vae.ops as ops; "
            "print(ops._FUSED_DISPATCH is ops._AUTO, 'triton' in sys.modules, "
            "'turbovae.vae.kernels.triton_norms' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "False", "False"]


def test_cpu_tensors_never_reach_the_dispatcher(seeded):
    class Exploding:
        def group_norm_silu(self, *a):
            raise AssertionError("dispatcher called for a CPU tensor")

        rms_norm_silu = group_norm_silu

    x = torch.randn(1, 4, 2, 3, 3, generator=seeded)
    ops.set_fused_dispatch(Exploding())
    try:
        y = ops.group_norm_silu(x, 2, None, None, 1e-6)
        z = ops.rms_norm_silu(x, torch.ones(4, 1, 1, 1))
    finally:
        ops.reset_fused_dispatch()
    assert torch.equal(y, ops.group_norm_silu_reference(x, 2, None, None, 1e-6))
    assert torch.equal(z, ops.rms_norm_silu_reference(x, torch.ones(4, 1, 1, 1)))


def test_default_dispatch_off_without_cuda_or_when_disabled(monkeypatch):
    monkeypatch.setenv(kernels.ENV_DISABLE, "0")
    assert kernels.default_dispatch() is None
    monkeypatch.setenv(kernels.ENV_DISABLE, "1")
    if not torch.cuda.is_available():
        assert kernels.default_dispatch() is None


def test_fused_norms_context_restores_previous_choice():
    sentinel = object()
    ops.set_fused_dispatch(sentinel)
    try:
        with ops.fused_norms(False):
            assert ops.fused_dispatch() is None
        assert ops._FUSED_DISPATCH is sentinel
    finally:
        ops.reset_fused_dispatch()
    assert ops._FUSED_DISPATCH is ops._AUTO


@pytest.mark.gpu
def test_cuda_calls_resolve_to_triton_and_match_reference(seeded):
    pytest.importorskip("triton")
    ops.reset_fused_dispatch()
    x = torch.randn(1, 64, 3, 24, 40, generator=seeded).cuda().bfloat16()
    w = torch.randn(64, generator=seeded).cuda().bfloat16()
    with torch.inference_mode():
        y = ops.group_norm_silu(x, 32, w, w, 1e-6)
        z = ops.rms_norm_silu(x, w.view(64, 1, 1, 1))
    assert isinstance(ops._FUSED_DISPATCH, kernels.TritonNormDispatch)
    ref_y = ops.group_norm_silu_reference(x, 32, w, w, 1e-6)
    ref_z = ops.rms_norm_silu_reference(x, w.view(64, 1, 1, 1))
    for out, ref in ((y, ref_y), (z, ref_z)):
        assert ((out.float() - ref.float()).norm() / ref.float().norm()).item() <= 1e-2
