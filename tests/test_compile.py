"""Per-region compile recipes (vae/accel/compile.py) on CPU with tiny modules."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from turbovae.vae.accel import compile as C
from turbovae.vae.memory.cpu_conv import pytorch_kernels


class Block(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)
        self.norm = nn.GroupNorm(2, c)

    def forward(self, x):
        return x + self.conv(torch.nn.functional.silu(self.norm(x)))


class TinyVAE(nn.Module):
    """Shaped like the real ones: a stem, a ModuleList of blocks per side, a mid block with a list."""

    def __init__(self, c: int = 4):
        super().__init__()
        self.encoder = nn.Module()
        self.encoder.conv_in = nn.Conv2d(3, c, 3, padding=1)
        self.encoder.down_blocks = nn.ModuleList([Block(c), Block(c)])
        self.mid = nn.Module()
        self.mid.resnets = nn.ModuleList([Block(c)])
        self.conv_out = nn.Conv2d(c, 3, 1)

    def forward(self, x):
        x = self.encoder.conv_in(x)
        for blk in self.encoder.down_blocks:
            x = blk(x)
        for blk in self.mid.resnets:
            x = blk(x)
        return self.conv_out(x)


def test_settings_validation_names_the_fix():
    assert C.CompileSettings().torch_compile_kwargs() == {"backend": "inductor", "dynamic": None, "fullgraph": False}
    assert C.CompileSettings(mode="max-autotune-no-cudagraphs", dynamic="true").torch_compile_kwargs()["mode"] == \
        "max-autotune-no-cudagraphs"
    assert "mode" not in C.CompileSettings(backend="eager", mode="max-autotune-no-cudagraphs").torch_compile_kwargs()
    for bad, match in [(dict(backend="tensorrtx"), "unknown torch.compile backend"),
                       (dict(mode="fast"), "unknown compile mode"),
                       (dict(dynamic="maybe"), "dynamic must be one of"),
                       (dict(fullgraph="yes"), "fullgraph must be"),
                       (dict(cache_size_limit=0), "cache_size_limit must be"),
                       (dict(mode="reduce-overhead"), "captures CUDA graphs around each region"),
                       (dict(mode="max-autotune"), "captures CUDA graphs around each region"),
                       (dict(backend="cudagraphs"), "captures CUDA graphs around each region"),
                       (dict(cuda_graphs=True, mode="reduce-overhead"), "use mode default"),
                       (dict(cuda_graphs="on"), "cuda_graphs must be")]:
        with pytest.raises(ValueError, match=match):
            C.CompileSettings(**bad)
    assert hash(C.CompileSettings()) == hash(C.CompileSettings())


def test_regions_are_list_members_found_without_class_names():
    names = [n for n, _ in C.find_regions(TinyVAE())]
    assert names == ["encoder.down_blocks.0", "encoder.down_blocks.1", "mid.resnets.0"]
    assert C.find_regions(nn.Conv2d(1, 1, 1))[0][0] == ""


def test_apply_compile_in_place_matches_eager_and_is_cached(seeded):
    model = TinyVAE().eval()
    x = torch.randn(1, 3, 8, 8, generator=seeded)
    ref = model(x)
    keys = list(model.state_dict())
    settings = C.CompileSettings(backend="aot_eager", cache_size_limit=32)
    assert C.apply_compile(model, settings) is model
    calls = [model.get_submodule(n)._compiled_call_impl for n, _ in C.find_regions(model)]
    assert all(isinstance(c, C._RegionCall) for c in calls)
    with torch.no_grad():
        out = model(x)
    assert torch.allclose(out, ref, atol=1e-5, rtol=0)
    assert list(model.state_dict()) == keys  # no _orig_mod. prefixes
    assert not C.compile_failed(model)
    C.apply_compile(model, C.CompileSettings(backend="aot_eager", cache_size_limit=32))  # equal settings: reused
    assert [model.get_submodule(n)._compiled_call_impl for n, _ in C.find_regions(model)] == calls
    import torch._dynamo.config as cfg
    assert cfg.recompile_limit >= 32
    C.remove_compile(model)
    assert all(model.get_submodule(n)._compiled_call_impl is None for n, _ in C.find_regions(model))


def test_inductor_compile_on_cpu_matches_eager(seeded):
    torch._dynamo.reset()
    model = nn.Sequential(Block(4)).eval()  # one region: the compile itself takes seconds on 2 cores
    x = torch.randn(1, 4, 8, 8, generator=seeded)
    ref = model(x)
    C.apply_compile(model, C.CompileSettings())
    with torch.no_grad():
        out = model(x)
    assert not C.compile_failed(model), "inductor on CPU needs a C compiler (gcc is installed here)"
    assert (out - ref).abs().max().item() <= 1e-4


def test_compile_failure_falls_back_to_eager_with_one_warning(seeded, caplog):
    import torch._dynamo
    from torch._dynamo.backends.registry import register_backend

    def broken_backend(gm, example_inputs):
        raise RuntimeError("simulated: no C compiler")

    register_backend(compiler_fn=broken_backend, name="turbovae_test_broken")
    torch._dynamo.reset()
    model = TinyVAE().eval()
    x = torch.randn(1, 3, 8, 8, generator=seeded)
    ref = model(x)
    with caplog.at_level(logging.WARNING, logger="turbovae"):
        C.apply_compile(model, C.CompileSettings(backend="turbovae_test_broken"))
        with torch.no_grad():
            out1 = model(x)
            out2 = model(x)
    assert torch.equal(out1, ref) and torch.equal(out2, ref)
    assert C.compile_failed(model)
    warnings = [r for r in caplog.records if "torch.compile" in r.message and "eagerly" in r.message]
    assert len(warnings) == 1 and "simulated: no C compiler" in warnings[0].message


def test_genuine_errors_are_not_swallowed(seeded):
    model = TinyVAE().eval()
    C.apply_compile(model, C.CompileSettings(backend="eager"))
    with pytest.raises(RuntimeError):
        model(torch.randn(1, 5, 8, 8, generator=seeded))  # wrong channel count fails eagerly too
    assert not C.compile_failed(model)


# -- the fallback on a real causal model: a region that fails part-way must not corrupt the clip -----------
def _tiny_wan():
    from turbovae.vae.wan import TINY_WAN21, WanVAE

    torch.manual_seed(0)
    return WanVAE(TINY_WAN21).eval()


class _FailsAfterRunning:
    """Stands in for a region's compiled callable: on call `fail_on`, runs the region eagerly (advancing the
    causal cache, and, with `mutate`, writing into its input as an in-place residual add would) and then
    fails, as a graph break followed by a sub-graph that does not compile does. Other calls run eagerly."""

    def __init__(self, region: nn.Module, fail_on: int, mutate: bool = False, error=None):
        self.region, self.fail_on, self.mutate, self.calls = region, fail_on, mutate, 0
        self.error = error or (lambda: RuntimeError("simulated: sub-graph after a graph break failed to compile"))

    def __call__(self, *args, **kwargs):
        self.calls += 1
        out = self.region._call_impl(*args, **kwargs)
        if self.calls == self.fail_on:
            if self.mutate:
                args[0].add_(1.0)
            raise self.error()
        return out


@pytest.mark.parametrize("name,fail_on,mutate", [("decoder.up_blocks.1", 2, False),  # 2nd slice: cache advanced
                                                 ("decoder.mid_block.resnets.0", 1, True)])  # input written
@pytest.mark.slow
def test_region_failing_part_way_falls_back_to_the_eager_clip(name, fail_on, mutate, caplog):
    """The eager pass and the compiled regions run PyTorch's conv kernels (a traced region holds `aten.conv3d`; eager
    CPU passes run oneDNN on small convs otherwise, vae/memory/cpu_conv.py), so the fallback compares bit for bit."""
    model = _tiny_wan()
    g = torch.Generator().manual_seed(1)
    z = torch.randn(1, model.latent_format.channels, 3, 4, 4, generator=g)
    with torch.inference_mode(), pytorch_kernels():
        ref = model.decode_latents(z, temporal_slice=1)
    C.apply_compile(model, C.CompileSettings(backend="eager"))
    region = model.get_submodule(name)
    region._compiled_call_impl.compiled = _FailsAfterRunning(region, fail_on, mutate)
    with caplog.at_level(logging.WARNING, logger="turbovae"), torch.inference_mode(), pytorch_kernels():
        out = model.decode_latents(z, temporal_slice=1)
    assert C.compile_failed(model)
    assert torch.equal(out, ref)
    assert sum("the VAE runs eagerly" in r.message for r in caplog.records) == 1


def test_out_of_memory_in_a_compiled_region_is_not_a_compile_failure():
    model = _tiny_wan()
    z = torch.randn(1, model.latent_format.channels, 1, 4, 4)
    C.apply_compile(model, C.CompileSettings(backend="eager"))
    region = model.get_submodule("decoder.up_blocks.0")
    oom = _FailsAfterRunning(region, 1, error=lambda: RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED"))
    region._compiled_call_impl.compiled = oom
    with pytest.raises(RuntimeError, match="CUBLAS_STATUS_ALLOC_FAILED"), torch.inference_mode():
        model.decode_latents(z)  # the pass's own retry (smaller tiles) handles it
    assert not C.compile_failed(model)
    with torch.inference_mode():
        model.decode_latents(z)  # and the compiled region is used again
    assert oom.calls == 2
