"""Tiling engine on the real architectures (tiny widths): fast ≡ untiled with one tile, exact ≡ untiled
for many grids, auto sizing, OOM retry, progress and cancel."""

import logging

import pytest
import torch

import turbovae
from turbovae import TurboVAE, decode_tiled, encode_tiled
from turbovae.vae.memory.budget import MemoryBudget
from turbovae.vae.seedvr2.config import SeedVR2Config
from turbovae.vae.seedvr2.model import SeedVR2VAE
from turbovae.vae.planning import execute as tiling_api  # the executor the tiled passes run
from turbovae.vae.wan.config import TINY_WAN21, TINY_WAN22, WAN21
from turbovae.vae.wan.model import WanVAE


def _build(kind: str) -> TurboVAE:
    torch.manual_seed(0)
    if kind == "seedvr2":
        return TurboVAE(SeedVR2VAE(SeedVR2Config.tiny()))
    if kind == "wan2.2":
        return TurboVAE(WanVAE(TINY_WAN22))
    return TurboVAE(WanVAE(TINY_WAN21))


@pytest.fixture(scope="module", params=["seedvr2", "wan2.1"])
def vae(request):
    return _build(request.param)


def _latents(vae, t, h, w, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, vae.latent_channels, t, h, w, generator=g)


def _pixels(t, h, w, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(1, 3, t, h, w, generator=g) * 2 - 1


@pytest.mark.parametrize("t", [1, 3])
def test_fast_single_tile_equals_untiled(vae, t):
    z = _latents(vae, t, 6, 9)
    ref = vae.decode(z)
    out = decode_tiled(vae, z, tile_px=1024, overlap_px=64, mode="fast", temporal_slice=1)
    assert out.shape == ref.shape
    assert (out - ref).abs().max().item() <= 1e-5
    x = _pixels(4 * t - 3, 48, 72)
    ref_e = vae.encode(x)
    out_e = encode_tiled(vae, x, tile_px=1024, overlap_px=64, mode="fast", temporal_slice=1)
    assert (out_e - ref_e).abs().max().item() <= 1e-5


def test_fast_multi_tile_shape_and_range(vae):
    z = _latents(vae, 1, 10, 13)
    out = decode_tiled(vae, z, tile_px=64, overlap_px=24, mode="fast")
    assert out.shape == (1, 3, 1, 80, 104)
    assert torch.isfinite(out).all() and out.abs().max() <= 1.0


@pytest.mark.parametrize("t,h,w,tile,ts", [
    (1, 13, 9, 64, None),      # odd latent sizes, 2x2 cores
    (1, 24, 8, 64, None),      # one-tile-wide strip
    (2, 11, 9, 64, 1),         # video T = 5 frames, one slice of 1 + 1 latents
    (4, 9, 7, 64, 1),          # video T = 13 frames, three slices: causal cache crosses slices
    (3, 9, 7, 64, None),       # video T = 9 frames
])
@pytest.mark.slow
def test_exact_decode_equals_untiled(vae, t, h, w, tile, ts):
    z = _latents(vae, t, h, w, seed=t + h)
    ref = vae.decode(z)
    out = decode_tiled(vae, z, tile_px=tile, overlap_px=16, mode="exact", temporal_slice=ts)
    assert out.shape == ref.shape
    assert (out - ref).abs().max().item() <= 1e-4


@pytest.mark.parametrize("t,h,w,tile,ts", [
    (1, 104, 72, 64, None),
    (1, 64, 136, 64, None),    # one-tile-high strip
    (5, 80, 72, 64, 1),        # one slice of 1 + 4 frames
    (9, 48, 40, 64, 1),        # two slices: causal cache crosses slices
    (9, 72, 48, 64, None),
])
def test_exact_encode_equals_untiled(vae, t, h, w, tile, ts):
    x = _pixels(t, h, w, seed=h)
    ref = vae.encode(x)
    out = encode_tiled(vae, x, tile_px=tile, overlap_px=16, mode="exact", temporal_slice=ts)
    assert out.shape == ref.shape
    assert (out - ref).abs().max().item() <= 1e-4


def test_exact_wan22_decode_and_encode():
    vae = _build("wan2.2")  # 16x spatial, patchify, residual-of-residual shortcuts
    z = _latents(vae, 2, 11, 5)
    assert (decode_tiled(vae, z, tile_px=128, overlap_px=32, mode="exact") - vae.decode(z)).abs().max() <= 1e-4
    x = _pixels(5, 176, 80)
    assert (encode_tiled(vae, x, tile_px=128, overlap_px=32, mode="exact") - vae.encode(x)).abs().max() <= 1e-4


def test_exact_real_qwen_config_image():
    torch.manual_seed(0)
    vae = TurboVAE(WanVAE(WAN21))
    z = _latents(vae, 1, 14, 18)
    ref = vae.decode(z)
    assert (decode_tiled(vae, z, tile_px=64, mode="exact") - ref).abs().max() <= 1e-4


def test_auto_uses_untiled_when_it_fits_and_tiles_when_not(vae, monkeypatch):
    z = _latents(vae, 1, 16, 16)
    ref = vae.decode(z)
    calls, seen = [], []
    monkeypatch.setattr(tiling_api, "run_exact", _spy(tiling_api.run_exact, calls))
    monkeypatch.setattr(vae, "budget", MemoryBudget(64 * 2**30))
    out = decode_tiled(vae, z, mode="auto", progress=lambda d, t: seen.append((d, t)))
    assert torch.equal(out, ref)  # untiled: the plain pass itself
    assert calls == [] and seen == [(1, 1)]
    whole = vae.predict_peak(tuple(z.shape), decode=True).pass_bytes  # what the untiled pass is predicted to need
    monkeypatch.setattr(vae, "budget", MemoryBudget(whole - 1))
    out = decode_tiled(vae, z, mode="auto")
    assert (out - ref).abs().max() <= 1e-4
    assert calls[-1] > 1  # several tiles under a small budget


def _spy(fn, calls):
    def wrapped(model, x, grid, **kw):
        calls.append(len(grid))
        return fn(model, x, grid, **kw)
    return wrapped


class _OOMAbove:
    """Wraps a model's whole-clip decode of checked latents (what single-frame tiles run): out-of-memory for crops wider
    than `limit` latent px."""

    def __init__(self, model, limit):
        self.orig, self.limit, self.seen = model.decode_slices, limit, []

    def __call__(self, z, **kw):
        self.seen.append(z.shape[-1])
        if z.shape[-1] > self.limit:
            raise torch.OutOfMemoryError("simulated")
        return self.orig(z, **kw)


def test_oom_shrinks_tile_then_succeeds(vae, monkeypatch, caplog):
    z = _latents(vae, 1, 20, 20)
    guard = _OOMAbove(vae.model, limit=16)
    monkeypatch.setattr(vae.model, "decode_slices", guard)
    with caplog.at_level(logging.WARNING):
        out = decode_tiled(vae, z, tile_px=256, overlap_px=32, mode="fast")
    assert out.shape[-1] == 160
    assert max(guard.seen) > 16 and guard.seen[-1] <= 16
    assert "retrying with 128 px" in caplog.text


@pytest.mark.slow
def test_oom_at_floor_gives_clear_error(vae, monkeypatch):
    z = _latents(vae, 1, 20, 20)
    monkeypatch.setattr(vae.model, "decode_slices", _OOMAbove(vae.model, limit=0))
    with pytest.raises(MemoryError, match=r"even with 64 px tiles .*started at 256 px.*GiB free"):
        decode_tiled(vae, z, tile_px=256, overlap_px=32, mode="fast")


class Cancelled(Exception):
    pass


@pytest.mark.parametrize("mode", ["fast", "exact"])
def test_progress_counts_and_cancel_leaves_model_usable(vae, mode):
    z = _latents(vae, 2, 12, 10)
    seen = []
    out = decode_tiled(vae, z, tile_px=64, overlap_px=16, mode=mode, temporal_slice=1, progress=lambda d, t: seen.append((d, t)))
    total = seen[-1][1]
    assert [d for d, _ in seen] == list(range(1, total + 1)) and total >= 4

    def cancel(done, total):
        if done == 2:
            raise Cancelled()

    with pytest.raises(Cancelled):
        decode_tiled(vae, z, tile_px=64, overlap_px=16, mode=mode, temporal_slice=1, progress=cancel)
    again = decode_tiled(vae, z, tile_px=64, overlap_px=16, mode=mode, temporal_slice=1)
    assert torch.equal(again, out)


def test_bad_arguments_are_value_errors(vae):
    z = _latents(vae, 1, 8, 8)
    with pytest.raises(ValueError, match="mode must be one of"):
        decode_tiled(vae, z, mode="exactly")
    with pytest.raises(ValueError, match="too small"):
        decode_tiled(vae, z, tile_px=16)
    with pytest.raises(ValueError, match="overlap"):
        decode_tiled(vae, z, tile_px=64, overlap_px=-8)
    with pytest.raises(ValueError, match="less than half the tile"):
        decode_tiled(vae, z, tile_px=64, overlap_px=32)
    with pytest.raises(ValueError, match="temporal_slice=-1 must be"):
        decode_tiled(vae, z, temporal_slice=-1)
    with pytest.raises(ValueError, match="tile_px must be an integer"):
        decode_tiled(vae, z, tile_px=64.5)
    with pytest.raises(ValueError, match="channels"):
        decode_tiled(vae, torch.randn(1, vae.latent_channels + 1, 1, 8, 8))


def test_public_api_exports():
    assert turbovae.decode_tiled is decode_tiled and turbovae.encode_tiled is encode_tiled


def test_default_tile_is_512_px_in_fast_and_exact(vae, monkeypatch):
    z = _latents(vae, 1, 72, 8)  # 576 px high: more than one default tile
    tiles = []
    monkeypatch.setattr(tiling_api, "run_exact", _spy_grid(tiling_api.run_exact, tiles))
    decode_tiled(vae, z, mode="exact")
    assert tiles[-1] == 512 // vae.spatial_factor
    monkeypatch.setattr(vae, "budget", MemoryBudget(64 * 2**30))
    decode_tiled(vae, z, mode="exact", tile_px=0)  # 0 = from the memory budget: plenty here, one tile
    assert tiles[-1] == 72


def _spy_grid(fn, tiles):
    def wrapped(model, x, grid, **kw):
        tiles.append(grid.rows.tile)
        return fn(model, x, grid, **kw)
    return wrapped


def test_auto_tile_is_the_largest_whose_predicted_peak_fits_the_budget(vae):
    """`auto` takes the untiled pass when its predicted peak fits the budget it is handed, else the fastest plan
    whose own prediction fits: tiles, each plan predicted by running its executor on meta tensors."""
    from turbovae.vae.tiled import plan_tiling

    c = vae.latent_channels
    whole = plan_tiling(vae, (1, c, 1, 24, 24), tile_px=None, overlap_px=None, mode="auto", decode=True,
                        budget_bytes=2**40)
    assert whole.mode == "untiled" and whole.fits
    plan = plan_tiling(vae, (1, c, 1, 24, 24), tile_px=None, overlap_px=None, mode="auto", decode=True,
                       budget_bytes=whole.predicted.pass_bytes - 1)
    assert plan.mode != "untiled" and plan.tile_latent < 24
    assert plan.predicted.pass_bytes <= whole.predicted.pass_bytes - 1 and plan.fits
