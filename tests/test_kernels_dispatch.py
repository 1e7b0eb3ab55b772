"""How the fused kernels are selected: lazily, never at import, never on CPU, switchable off."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from turbovae.vae.accel import kernels
from turbovae.vae import norms


def test_import_turbovae_installs_nothing_and_imports_no_triton():
    code = ("import sys, turbovae, turbovae.vae.norms as ops; "
            "print(ops._FUSED_DISPATCH is ops._AUTO, 'triton' in sys.modules, "
            "'turbovae.vae.accel.kernels.triton_norms' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "False", "False"]


def test_cpu_tensors_never_reach_the_dispatcher(seeded):
    class Exploding:
        def group_norm_silu(self, *a):
            raise AssertionError("dispatcher called for a CPU tensor")

        rms_norm_silu = group_norm_silu

    x = torch.randn(1, 4, 2, 3, 3, generator=seeded)
    norms.set_fused_dispatch(Exploding())
    try:
        y = norms.group_norm_silu(x, 2, None, None, 1e-6)
        z = norms.rms_norm_silu(x, torch.ones(4, 1, 1, 1))
    finally:
        norms.reset_fused_dispatch()
    assert torch.equal(y, norms.group_norm_silu_reference(x, 2, None, None, 1e-6))
    assert torch.equal(z, norms.rms_norm_silu_reference(x, torch.ones(4, 1, 1, 1)))


def test_default_dispatch_off_without_cuda_or_when_disabled(monkeypatch):
    monkeypatch.setenv(kernels.ENV_DISABLE, "0")
    assert kernels.default_dispatch() is None
    monkeypatch.setenv(kernels.ENV_DISABLE, "1")
    if not torch.cuda.is_available():
        assert kernels.default_dispatch() is None


def test_fused_norms_context_restores_previous_choice():
    sentinel = object()
    norms.set_fused_dispatch(sentinel)
    try:
        with norms.fused_norms(False):
            assert norms.fused_dispatch() is None
        assert norms._FUSED_DISPATCH is sentinel
    finally:
        norms.reset_fused_dispatch()
    assert norms._FUSED_DISPATCH is norms._AUTO


@pytest.mark.gpu
def test_cuda_calls_resolve_to_triton_and_match_reference(seeded):
    pytest.importorskip("triton")
    norms.reset_fused_dispatch()
    x = torch.randn(1, 64, 3, 24, 40, generator=seeded).cuda().bfloat16()
    w = torch.randn(64, generator=seeded).cuda().bfloat16()
    with torch.inference_mode():
        y = norms.group_norm_silu(x, 32, w, w, 1e-6)
        z = norms.rms_norm_silu(x, w.view(64, 1, 1, 1))
    assert isinstance(norms._FUSED_DISPATCH, kernels.TritonNormDispatch)
    ref_y = norms.group_norm_silu_reference(x, 32, w, w, 1e-6)
    ref_z = norms.rms_norm_silu_reference(x, w.view(64, 1, 1, 1))
    for out, ref in ((y, ref_y), (z, ref_z)):
        assert ((out.float() - ref.float()).norm() / ref.float().norm()).item() <= 1e-2
