"""The causal-step contract every architecture implements (vae/base.py `VAEModel`): `encode_step` /
`decode_step(x, state) -> (y, state)` chained over any legal slicing equal the whole clip, `cache_layout`
names the state's tensors and their shapes, and a wrong state is a typed error naming the fix."""

from dataclasses import replace

import pytest
import torch

from turbovae.vae.base import VAEModel
from turbovae.vae.seedvr2 import SeedVR2Config, SeedVR2VAE
from turbovae.vae.wan import TINY_WAN21, TINY_WAN22, WanVAE

ARCHITECTURES = {
    "wan2.1": lambda: WanVAE(TINY_WAN21),
    "wan2.2": lambda: WanVAE(TINY_WAN22),
    "qwen_image_layered": lambda: WanVAE(replace(TINY_WAN21, image_channels=4)),
    "seedvr2": lambda: SeedVR2VAE(SeedVR2Config.tiny()),
}


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def model(request) -> VAEModel:
    torch.manual_seed(0)
    m = ARCHITECTURES[request.param]().eval()
    with torch.no_grad():  # seeded random weights at a scale that keeps activations away from the clamp
        for p in m.parameters():
            p.copy_(torch.randn_like(p) * (0.3 / max(1, p[0].numel()) ** 0.5) if p.ndim > 1 else p)
    return m


def _latents(m: VAEModel, frames: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, m.latent_format.channels, frames, 3, 4, generator=g)


def _pixels(m: VAEModel, frames: int, seed: int = 2) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    f = m.latent_format.spatial_factor
    return torch.rand(1, m.latent_format.image_channels, frames, 2 * f, 3 * f, generator=g) * 2 - 1


def _chain(step, x: torch.Tensor, bounds, **kwargs):
    state, outs, states = None, [], []
    for a, b in bounds:
        out, state = step(x[:, :, a:b], state, collect=True, **kwargs)
        outs.append(out)
        states.append(state)
    return torch.cat(outs, dim=2), states


def _assert_chain_is_whole(step, whole_pass, x: torch.Tensor, bounds) -> None:
    with torch.inference_mode():
        whole = whole_pass(x)
        chained, _ = _chain(step, x, bounds)
    assert chained.shape == whole.shape
    assert max_err(chained, whole) <= 1e-5


@pytest.mark.parametrize("bounds", [[(0, 2), (2, 3), (3, 4), (4, 5)], [(0, 3), (3, 5)], [(0, 1), (1, 5)],
                                    [(0, 5)]], ids=["1", "2", "first1", "whole"])
def test_decode_step_chain_equals_whole_clip(model, bounds):
    _assert_chain_is_whole(model.decode_step, model.decode_latents, _latents(model, 5), bounds)


@pytest.mark.parametrize("bounds", [[(0, 5), (5, 9)], [(0, 1), (1, 5), (5, 9)], [(0, 9)]],
                         ids=["1", "first1", "whole"])
def test_encode_step_chain_equals_whole_clip(model, bounds):
    _assert_chain_is_whole(model.encode_step, model.encode_moments, _pixels(model, 9), bounds)


@pytest.mark.parametrize("temporal_slice", [1, 2])
def test_whole_clip_passes_slice_exactly_and_report_progress(model, temporal_slice):
    z, x = _latents(model, 5), _pixels(model, 9)
    seen = []
    with torch.inference_mode():
        assert max_err(model.decode_latents(z, temporal_slice=temporal_slice,
                                            progress=lambda d, t: seen.append((d, t))), model.decode_latents(z)) <= 1e-5
        assert max_err(model.encode_moments(x, temporal_slice=temporal_slice), model.encode_moments(x)) <= 1e-5
    n = len(model.slice_bounds(5, temporal_slice, decode=True))
    assert seen == [(i + 1, n) for i in range(n)]


def test_memory_layout_names_the_state_and_fixes_its_shapes(model):
    """The layout equals the state a first slice returns, and (decode, first slice ≥ 2 latents) every later
    one-latent step returns memory of the same shapes: what static slice engines need."""
    z = _latents(model, 5)
    h, w = z.shape[-2:]
    layout = model.cache_layout(decode=True, batch=1, height=h, width=w, first_frames=2)
    assert len({name for name, _ in layout}) == len(layout)
    modules = dict(model.named_modules())
    assert all(name in modules for name, _ in layout)
    with torch.inference_mode():
        _, states = _chain(model.decode_step, z, [(0, 2), (2, 3), (3, 4)])
    for state in states:
        assert [tuple(t.shape) for t in state] == [shape for _, shape in layout]
    x = _pixels(model, 9)
    enc_layout = model.cache_layout(decode=False, batch=1, height=x.shape[-2], width=x.shape[-1], first_frames=5)
    with torch.inference_mode():
        _, enc_states = _chain(model.encode_step, x, [(0, 5), (5, 9)])
    for state in enc_states:
        assert [tuple(t.shape) for t in state] == [shape for _, shape in enc_layout]


def test_last_slice_collects_no_memory(model):
    z = _latents(model, 3)
    with torch.inference_mode():
        _, state = model.decode_step(z[:, :, :2])
        _, last = model.decode_step(z[:, :, 2:], state, collect=False)
    assert state and last == ()


@pytest.mark.parametrize("change", ["short", "long"])
def test_wrong_state_is_a_value_error_naming_the_fix(model, change):
    z = _latents(model, 3)
    with torch.inference_mode():
        _, state = model.decode_step(z[:, :, :2])
        bad = state[:-1] if change == "short" else (*state, state[-1])
        with pytest.raises(ValueError, match="pass the state returned by the previous step"):
            model.decode_step(z[:, :, 2:], bad)


def test_streams_check_slice_lengths_with_one_message(model):
    tf = model.latent_format.temporal_factor
    x = _pixels(model, 9)
    with torch.inference_mode():
        with pytest.raises(ValueError, match=f"1\\+{tf}k first, then {tf}k"):
            model.encode_stream().step(x[:, :, :2])
        with model.encode_stream() as s:
            s.step(x[:, :, :5])
            with pytest.raises(ValueError, match="later slice"):
                s.step(x[:, :, 5:8])
        with pytest.raises(ValueError, match="at least 1"):
            model.decode_stream().step(_latents(model, 1)[:, :, :0])


def test_one_fast_paths_type_and_each_architecture_names_its_fields(model):
    from turbovae.vae.accel.switches import FastPaths, ablations

    assert isinstance(model.fast, FastPaths)
    assert model.fast_fields and set(model.fast_fields) <= set(FastPaths.names())
    names = [name for name, _ in ablations(FastPaths(), model.fast_fields)]
    assert names == [n for n in model.fast_fields if getattr(FastPaths(), n)]
    with pytest.raises(ValueError, match="image_path"):
        model.fast.without("fold_image")


def test_handed_over_memory_is_dropped_as_read_unless_a_region_may_rerun():
    """`run_slices` hands each step its input memory (`CacheHandoff`): every tensor is dropped once read, so a later
    slice does not hold old and new memory together; a caller's tuple is only read; after a snapshot (a compiled
    region that may be re-run) nothing more is dropped, so `restore` reads the same tensors again."""
    from turbovae.vae.causal_cache import CausalCache, CacheHandoff

    a, b, c = torch.zeros(1), torch.ones(1), torch.full((1,), 2.0)
    handed = CacheHandoff([a, b, c])
    mem = CausalCache(handed)
    assert mem.take() is a and handed[0] is None
    saved = mem.snapshot()
    assert mem.take() is b and handed[1] is b  # kept: the region may restore to here
    mem.restore(saved)
    assert mem.take() is b and mem.take() is c and mem.finish() == ()
    owned = (a, b)
    mem = CausalCache(owned)
    assert mem.take() is a and mem.take() is b and owned == (a, b)


def test_sliced_passes_hand_their_memory_over(monkeypatch):
    """Each later slice of a sliced decode receives a `CacheHandoff` (and the result is the whole clip's)."""
    from turbovae.vae import causal_cache

    seen = []
    start = causal_cache.CausalCache.start
    monkeypatch.setattr(causal_cache.CausalCache, "start",
                        lambda self, cache_in, collect: seen.append(type(cache_in)) or start(self, cache_in, collect))
    model = WanVAE(TINY_WAN21).eval()
    z = torch.randn(1, TINY_WAN21.z_dim, 4, 3, 4, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        sliced = model.decode_latents(z, temporal_slice=1)
        whole = model.decode_latents(z)
    assert seen[:3] == [type(None), causal_cache.CacheHandoff, causal_cache.CacheHandoff]
    assert (sliced - whole).abs().max().item() <= 1e-5
