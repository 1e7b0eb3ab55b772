"""The per-architecture GPU defaults (vae/gpu_defaults.py): the table, the compile choice, the channels-last
rule a pass follows on a GPU without fused norms (driven on CPU tensors inside gpu_paths_on_cpu), and the text
the Compile Settings node shows."""

from __future__ import annotations

import pytest
import torch

from turbovae.vae.accel import self_checks
from turbovae.vae.accel.channels_last import channels_last_in_cpu_fp32
from turbovae.vae import gpu_defaults as gd, norms
from turbovae.vae.accel.compile import CompileSettings
from turbovae.vae.accel.switches import FastPaths
from turbovae.vae.seedvr2 import SeedVR2Config, SeedVR2VAE
from turbovae.vae.wan import TINY_WAN21, WanVAE


def test_each_architecture_declares_its_measured_choices():
    from turbovae.vae.registry import family

    assert family("seedvr2").meta_model().gpu_defaults() == gd.GpuDefaults(compile=False,
                                                                           channels_last_without_fused_norms=False)
    for name in ("qwen", "wan2.1"):
        assert family(name).meta_model().gpu_defaults() == gd.GpuDefaults()
    assert family("wan2.2").meta_model().gpu_defaults() is gd.UNMEASURED and not gd.UNMEASURED.measured
    assert gd.UNMEASURED.compile and gd.UNMEASURED.channels_last_without_fused_norms


def test_compile_applies_where_measured_faster_on_cuda_only():
    seedvr2, wan21, wan22 = gd.MEASURED_SEEDVR2, gd.MEASURED_ALL_ON, gd.UNMEASURED
    assert not gd.compile_applies(seedvr2, "cuda")
    assert gd.compile_applies(seedvr2, "cuda", gd.COMPILE_ALL)
    assert gd.compile_applies(seedvr2, "cpu")
    assert gd.compile_applies(wan21, "cuda") and gd.compile_applies(wan22, "cuda:1")
    with pytest.raises(ValueError, match="where measured faster"):
        gd.compile_applies(seedvr2, "cuda", "some")
    with pytest.raises(ValueError, match="architectures must be one of"):
        CompileSettings(architectures="some")


def test_compile_settings_key_ignores_the_architecture_choice():
    from turbovae.vae.accel import compile as C

    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    C.apply_compile(model, CompileSettings(backend="eager"))
    C.apply_compile(model, CompileSettings(backend="eager", architectures=gd.COMPILE_ALL))
    assert len(C._CACHE[model]) == 1  # the same regions: one compiled variant
    C.remove_compile(model)


def test_node_text_names_each_architecture_from_the_table():
    from turbovae.vae.registry import gpu_defaults_by_title

    text = gd.describe_compile(gpu_defaults_by_title())
    assert "faster for Qwen-Image / Wan 2.1" in text and "slower for SeedVR2" in text and "Wan 2.2 compile" in text
    assert gd.COMPILE_MEASURED in text and "docs/gpu.md" in text


@pytest.mark.parametrize("kind_model, keeps", [("seedvr2", False), ("wan", True)])
def test_channels_last_on_a_gpu_without_fused_norms_follows_the_table(kind_model, keeps):
    model = SeedVR2VAE(SeedVR2Config.tiny(), FastPaths()) if kind_model == "seedvr2" else WanVAE(TINY_WAN21)
    assert model.fast.channels_last
    try:
        with self_checks.gpu_paths_on_cpu():
            norms.set_fused_dispatch(None)  # no Triton: the unfused norms run
            assert not norms.fused_norms_run("cpu")
            assert model.active_fast().channels_last is keeps
            model.follow_gpu_defaults = False  # the ablation: exactly the paths asked for
            assert model.active_fast().channels_last
            model.follow_gpu_defaults = True
            norms.set_fused_dispatch(object())  # a dispatcher installed: fused norms run, channels-last stays
            assert norms.fused_norms_run("cpu") and model.active_fast().channels_last
        assert not model.active_fast().channels_last  # off the GPU paths: the CPU's own rule, fp32 runs contiguous
        with channels_last_in_cpu_fp32():
            assert model.active_fast().channels_last  # and no GPU default reaches a CPU pass
    finally:
        norms.reset_fused_dispatch()
        model.hold_weights()


def test_seedvr2_contiguous_fallback_is_exact():
    """The rule only changes the layout: the decode it leads to equals the channels-last one in fp32."""
    torch.manual_seed(0)
    model = SeedVR2VAE(SeedVR2Config.tiny(), FastPaths()).eval()
    z = torch.randn(1, SeedVR2Config.tiny().latent_channels, 2, 4, 4)
    with channels_last_in_cpu_fp32(), torch.inference_mode():
        assert model.active_fast().channels_last
        cl = model.decode_latents(z)
    try:
        with self_checks.gpu_paths_on_cpu():
            norms.set_fused_dispatch(None)
            assert not model.active_fast().channels_last
            with torch.inference_mode():
                contiguous = model.decode_latents(z)
    finally:
        norms.reset_fused_dispatch()
        model.hold_weights()
    torch.testing.assert_close(contiguous, cl, atol=1e-5, rtol=0)
